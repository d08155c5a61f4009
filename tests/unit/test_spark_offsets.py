"""The Spark source's offset arithmetic and option parsing, without Spark or a broker
(warren.spark.offsets, warren.spark.connection): the checkpoint format, starting offsets,
read limits shared between streams, partition boundaries (every offset in exactly one
partition, none empty) and endpoints that never show a password."""

import json
import pickle

import pytest
from hypothesis import given, strategies as st

from warren.spark import offsets as o
from warren.spark.connection import endpoint


def test_the_checkpoint_format_is_stable_json():
    encoded = o.encode({"b": 5, "a": 7})
    assert json.dumps(encoded) == '{"streams": {"a": 7, "b": 5}}'
    assert o.decode(json.dumps(encoded)) == {"a": 7, "b": 5}
    assert o.decode(encoded) == {"a": 7, "b": 5}


@pytest.mark.parametrize("bad", ['{"a": 1}', '{"streams": {"a": -1}}', '{"streams": {"a": "1"}}',
                                 '{"streams": {"a": true}}', '{"streams": [1]}'])
def test_bad_offsets_are_refused(bad):
    with pytest.raises(ValueError):
        o.decode(bad)


def test_starting_offsets():
    first, next_ = {"a": 3, "b": 0}, {"a": 10, "b": 4}
    assert o.starting("earliest", ["a", "b"], first, next_) == {"a": 3, "b": 0}
    assert o.starting("latest", ["a", "b"], first, next_) == {"a": 10, "b": 4}
    assert o.starting('{"streams": {"a": 5}}', ["a", "b"], first, next_) == {"a": 5, "b": 0}
    with pytest.raises(ValueError, match="does not read"):
        o.starting('{"streams": {"c": 5}}', ["a", "b"], first, next_)


def test_admission_shares_the_limit_in_name_order():
    start = {"b": 0, "a": 10}
    available = {"a": 15, "b": 100}
    assert o.admit(start, available, None) == {"a": 15, "b": 100}
    assert o.admit(start, available, 3) == {"a": 13, "b": 0}
    assert o.admit(start, available, 5) == {"a": 15, "b": 0}
    assert o.admit(start, available, 8) == {"a": 15, "b": 3}
    assert o.admit({"a": 20}, {"a": 15}, None) == {"a": 20}  # never backwards


def test_split_boundaries():
    parts = o.split({"a": 0, "b": 5}, {"a": 10, "b": 5}, min_partitions=1, max_per_partition=4)
    assert [(p.stream, p.start, p.end) for p in parts] == [("a", 0, 4), ("a", 4, 7), ("a", 7, 10)]  # equal pieces
    parts = o.split({"a": 0}, {"a": 3}, min_partitions=8)
    assert [(p.start, p.end) for p in parts] == [(0, 1), (1, 2), (2, 3)]  # never an empty one
    assert o.split({"a": 7}, {"a": 7}) == []


def test_split_gives_every_core_the_same_work():
    # minPartitions = cores: a multiple of it of equal pieces, none above the maximum
    sizes = lambda parts: [p.count for p in parts]
    assert sizes(o.split({"a": 0}, {"a": 250_000}, 2, 100_000)) == [62_500] * 4
    assert sizes(o.split({"a": 0}, {"a": 250_000}, 2, 50_000)) == [41_667] * 4 + [41_666] * 2
    assert sizes(o.split({"a": 0}, {"a": 250_000}, 1, 100_000)) == [83_334, 83_333, 83_333]
    assert sizes(o.split({"a": 0}, {"a": 300}, 3, 70)) == [50] * 6
    assert sizes(o.split({"a": 10}, {"a": 11}, 2, 50_000)) == [1]  # not more pieces than entries
    assert sizes(o.split({"a": 0, "b": 0}, {"a": 100, "b": 10}, 4)) == [34, 33, 33, 10]
    parts = o.split({"a": 5}, {"a": 10}, 2)
    assert [(p.start, p.end) for p in parts] == [(5, 8), (8, 10)]


@given(st.dictionaries(st.sampled_from("abcd"), st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
                       min_size=1),
       st.integers(1, 12), st.one_of(st.none(), st.integers(1, 300)))
def test_split_covers_every_offset_once(ranges, min_partitions, max_per_partition):
    start = {k: min(v) for k, v in ranges.items()}
    end = {k: max(v) for k, v in ranges.items()}
    parts = o.split(start, end, min_partitions, max_per_partition)
    for name in ranges:
        mine = sorted((p.start, p.end) for p in parts if p.stream == name)
        covered = [x for lo, hi in mine for x in range(lo, hi)]
        assert covered == list(range(start[name], end[name]))
    assert all(p.count > 0 for p in parts)
    if max_per_partition:
        assert all(p.count <= max_per_partition for p in parts)
    total = sum(end[k] - start[k] for k in ranges)
    assert len(parts) >= min(min_partitions, total)
    assert len(parts) % min_partitions == 0 or len(parts) == total  # a multiple of it, or one entry a piece
    for name in ranges:  # a stream's pieces are of equal size, within one entry
        mine = [p.count for p in parts if p.stream == name]
        assert not mine or max(mine) - min(mine) <= 1


def test_endpoints_from_options_never_show_the_password():
    ep = endpoint({"URI": "amqp://alice:s%40cret@broker.example:5673/%2Fprod", "Port": "5680"})
    assert (ep.host, ep.port, ep.vhost, ep.user, ep.password) == ("broker.example", 5680, "/prod", "alice", "s@cret")
    assert "s@cret" not in repr(ep) and "cret" not in str(ep) and "cret" not in ep.shown
    assert ep.url == "amqp://alice:s%40cret@broker.example:5680/%2Fprod"
    assert endpoint({"host": "h", "user": "u", "password": "p"}).url == "amqp://u:p@h:5672/%2F"
    with pytest.raises(ValueError):
        endpoint({"uri": "http://x"})


def test_tls_endpoints():
    ep = endpoint({"uri": "amqps://u:p@h/%2F", "CACertFile": "/ca.pem", "verify": "verify_none"})
    assert (ep.tls, ep.port, ep.cacertfile, ep.verify) == (True, 5671, "/ca.pem", False)
    assert endpoint({"uri": "amqps://h"}).verify and endpoint({"uri": "amqp://h"}).ssl_context() is None
    with pytest.raises(ValueError, match="need an amqps:// uri"):
        endpoint({"uri": "amqp://h", "certfile": "/c.pem"})
    with pytest.raises(ValueError, match="verify_peer or verify_none"):
        endpoint({"uri": "amqps://h", "verify": "yes"})


def test_ranges_and_endpoints_pickle():
    """Spark ships partitions and the reader to its Python workers."""
    r = o.StreamRange("a", 1, 5)
    assert pickle.loads(pickle.dumps(r)) == r
    ep = endpoint({"uri": "amqp://u:p@h:1/v"})
    assert pickle.loads(pickle.dumps(ep)) == ep


def test_min_partitions_defaults_to_the_sessions_parallelism(monkeypatch):
    """warren.spark.register puts the session's default parallelism where the source's Python
    workers see it; without it (Spark Connect) the default is 1; the option wins."""
    pytest.importorskip("pyspark")
    from warren.spark.source import PARALLELISM_ENV, SourceOptions

    options = {"stream": "s", "uri": "amqp://localhost"}
    monkeypatch.delenv(PARALLELISM_ENV, raising=False)
    assert SourceOptions.parse(options).min_partitions == 1
    monkeypatch.setenv(PARALLELISM_ENV, "8")
    assert SourceOptions.parse(options).min_partitions == 8
    assert SourceOptions.parse({**options, "MinPartitions": "3"}).min_partitions == 3


def test_what_retention_removed_of_a_ranges_gaps():
    from warren.spark.broker import lost_to_retention

    gaps = [(0, 10), (50, 51), (70, 90)]
    assert lost_to_retention(gaps, None, 0, True) == []
    assert lost_to_retention(gaps, 0, 0, True) == []
    assert lost_to_retention(gaps, 5, 0, True) == [(0, 5)]
    assert lost_to_retention(gaps, 80, 0, True) == [(0, 10), (50, 51), (70, 80)]
    # RabbitMQ: a gap of one offset past the range's start is a segment roll, not retention
    assert lost_to_retention(gaps, 80, 0, False) == [(0, 10), (70, 80)]
    assert lost_to_retention([(3, 4)], 9, 3, False) == [(3, 4)]


def test_a_range_read_notes_its_gaps():
    from warren.spark.broker import _Range

    taken: list[int] = []
    r = _Range(o.StreamRange("s", 10, 20), lambda *a: taken.append(a[4]), 0)
    for offset in (8, 12, 13, 16):  # 8: before the range (RabbitMQ starts at the chunk)
        assert not r.take(offset, "", "s", None, b"")
    assert r.take(25, "", "s", None, b"") and r.done
    assert taken == [12, 13, 16] and r.gaps == [(10, 12), (14, 16), (17, 20)]


def test_the_default_partition_size_gives_a_micro_batch_of_250000_one_task_a_core():
    from warren.spark.source import DEFAULT_MAX_PER_PARTITION

    sizes = lambda parts: [p.count for p in parts]  # noqa: E731
    assert sizes(o.split({"a": 0}, {"a": 250_000}, 2, DEFAULT_MAX_PER_PARTITION)) == [125_000] * 2
    assert sizes(o.split({"a": 0}, {"a": 1_000_000}, 2, DEFAULT_MAX_PER_PARTITION)) == [250_000] * 4
