"""warren.spark.rows' x-death decoding: the entries RabbitMQ writes (rabbit_dead_letter at
v3.10.8: an array of tables, newest first, each with count a long, reason, queue and exchange
longstrs, time a timestamp, routing-keys an array of longstrs, and original-expiration when the
message had a per-message TTL) read exactly; whatever a client put there otherwise reads as
nothing, field by field, and never fails the batch (no Spark needed)."""

import datetime

import pytest

from warren.amqp.codec import _LongstrBytes
from warren.amqp.properties import encode_header

rows = pytest.importorskip("warren.spark.rows")
ContentHeader = pytest.importorskip("pamqp.header").ContentHeader

T1 = datetime.datetime(2026, 11, 30, 8, 0, 1, tzinfo=datetime.timezone.utc)
T2 = datetime.datetime(2026, 11, 30, 8, 0, 5, tzinfo=datetime.timezone.utc)
NOTHING = {"queue": None, "reason": None, "exchange": None, "routing_keys": None, "count": None, "time": None}


def decoded(headers: dict | None):
    """Basic properties with these headers as a client's reader gets them: encoded as Warren
    sends them, decoded by pamqp (as the Spark source reads them)."""
    header = ContentHeader()
    header.unmarshal(encode_header(0, {"headers": headers} if headers is not None else {}))
    return header.properties


def test_rabbitmqs_entries_read_exactly():
    x_death = [{"count": 2, "exchange": "", "queue": "work", "reason": "expired", "routing-keys": ["work"],
                "time": T2, "original-expiration": "50"},
               {"count": 1, "exchange": "jobs", "queue": "intake", "reason": "rejected",
                "routing-keys": ["intake", "copy"], "time": T1}]
    assert rows.deaths(decoded({"x-death": x_death}).headers) == [
        {"queue": "work", "reason": "expired", "exchange": "", "routing_keys": ["work"], "count": 2, "time": T2},
        {"queue": "intake", "reason": "rejected", "exchange": "jobs", "routing_keys": ["intake", "copy"],
         "count": 1, "time": T1}]


@pytest.mark.parametrize("x_death", ["rejected", 5, 1 << 40, True, 1.5, None, b"\x01[]", T1,
                                     {"reason": "rejected", "queue": "work"}, [], ["rejected", 7, ["x"]]],
                         ids=repr)
def test_an_x_death_of_no_tables_gives_no_deaths(x_death):
    assert rows.deaths(decoded({"x-death": x_death, "kind": "job"}).headers) == []


def test_no_headers_or_no_x_death_gives_no_deaths():
    assert rows.deaths(decoded(None).headers) == [] and rows.deaths(decoded({"kind": "job"}).headers) == []


def test_fields_missing_or_of_another_type_are_null():
    x_death = ["garbage",  # (left out: not a table)
               {},
               {"queue": 5, "reason": ["rejected"], "exchange": {"name": "jobs"}, "routing-keys": "work",
                "count": "3", "time": "2026-11-30"},
               {"queue": bytearray(b"work"), "reason": None, "count": True, "routing-keys": ["work", 1],
                "time": 1764489601},
               {"queue": "work", "reason": "rejected", "routing-keys": []}]
    assert rows.deaths(decoded({"x-death": x_death}).headers) == [
        NOTHING, NOTHING, NOTHING, {**NOTHING, "queue": "work", "reason": "rejected", "routing_keys": []}]


def test_a_longstr_that_is_not_utf8_is_read_with_replacement_characters():
    x_death = [{"queue": _LongstrBytes(b"w\xffrk"), "reason": "rejected", "routing-keys": [_LongstrBytes(b"k\xfe")]}]
    (entry,) = rows.deaths(decoded({"x-death": x_death}).headers)
    assert (entry["queue"], entry["routing_keys"]) == ("w\ufffdrk", ["k\ufffd"])


def test_a_batch_of_every_kind_of_x_death_makes_its_death_column():
    batch = rows.Batch()
    kinds = [None, {"x-death": 5}, {"x-death": "rejected"}, {"x-death": [{"count": "x", "time": "y"}]},
             {"x-death": [{"count": 3, "queue": "work", "reason": "expired", "exchange": "", "routing-keys": ["w"],
                           "time": T1}]}]
    for i, headers in enumerate(kinds):
        batch.add(b"m%d" % i, "", "dlq", "dlq", i, False, decoded(headers))
    death = batch.record_batch().column("death").to_pylist()
    assert death == [[], [], [], [NOTHING],
                     [{"queue": "work", "reason": "expired", "exchange": "", "routing_keys": ["w"], "count": 3,
                       "time": T1}]]
