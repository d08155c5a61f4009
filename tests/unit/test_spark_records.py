"""warren.spark.records reads the records of warren.store.segments (Warren's record batches):
the two layouts must agree, flags with an i64 slot included; the column-at-a-time decoding
gives what a plain loop over the entries gives, and refuses what it cannot read."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.store import segments as sg

records = pytest.importorskip("warren.spark.records")
ContentHeader = pytest.importorskip("pamqp.header").ContentHeader


def record(offset: int, body: bytes, flags: int = 0, stamp: int | None = None, exchange: str = "x",
           routing_key: str = "k", **props) -> bytes:
    header = encode_header(len(body), props)
    return sg.encode_record(flags, offset, shortstr(exchange) + shortstr(routing_key), header, body, stamp)


def entries(*batches: bytes, reader=None) -> list:
    return list((reader or records.Records()).decode(list(batches)).rows())


def reference(batch: bytes) -> list:
    """The layout read one entry at a time, plainly (how the reader did it before columns)."""
    out, pos = [], 0
    while pos < len(batch):
        if pos + sg.HEAD_SIZE > len(batch):
            raise ValueError("cut short")
        length, _check, flags, offset, route_len = struct.unpack_from(">IIBQH", batch, pos)
        end = pos + 8 + length
        p = pos + sg.HEAD_SIZE + (8 if flags & 12 else 0)
        if end > len(batch) or p + route_len + 4 > end:
            raise ValueError("cut short")
        route = batch[p:p + route_len]
        p += route_len
        header_end = p + 4 + struct.unpack_from(">I", batch, p)[0]
        if header_end > end:
            raise ValueError("past its end")
        header = ContentHeader()
        header.unmarshal(batch[p + 4:header_end])
        exchange_end = 1 + route[0]
        out.append((offset, route[1:exchange_end].decode(errors="surrogateescape"),
                    route[exchange_end + 1:].decode(errors="surrogateescape"),
                    dict(header.properties), batch[header_end:end]))
        pos = end
    return out


def comparable(rows: list) -> list:
    return [(o, x, k, dict(p), b) for o, x, k, p, b in rows]


def test_entries_with_and_without_a_chunk_time():
    batch = (record(5, b"first", sg.FLAG_CHUNK | sg.FLAG_DURABLE, 1_700_000_000_000, content_type="text/plain")
             + record(6, b"", exchange="", routing_key="r\u00e9", headers={"a": 1})
             + record(7, b"x" * 70_000, sg.FLAG_EXPIRY, 123, message_id="m"))
    got = entries(batch)
    assert [(o, x, rk, body) for o, x, rk, _p, body in got] == [
        (5, "x", "k", b"first"), (6, "", "r\u00e9", b""), (7, "x", "k", b"x" * 70_000)]
    assert got[0][3].content_type == "text/plain" and got[1][3].headers == {"a": 1}
    assert got[2][3].message_id == "m"


def test_properties_are_decoded_once_per_content_header_whatever_the_body_size():
    reader = records.Records()
    batch = record(0, b"a", delivery_mode=2) + record(1, b"bbbb", delivery_mode=2) + record(2, b"c", priority=1)
    props = [p for _o, _x, _rk, p, _b in entries(batch, reader=reader)]
    assert props[0] is props[1] and props[2] is not props[0] and props[2].priority == 1
    again = [p for _o, _x, _rk, p, _b in entries(record(3, b"dd", delivery_mode=2), reader=reader)]
    assert again[0] is props[0]


def test_bodies_of_every_length_around_the_inline_views():
    """Arrow's binary views hold a value of up to 12 octets themselves, a longer one by
    reference: bodies on both sides of that, in batches decoded together."""
    bodies = [bytes(range(n)) for n in (0, 1, 4, 11, 12, 13, 16, 255)]
    batches = [record(i, body) for i, body in enumerate(bodies)]
    assert [b for *_rest, b in entries(*batches)] == bodies
    assert [b for *_rest, b in entries(b"".join(batches))] == bodies


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_a_batch_cut_short_is_refused(cut):
    whole = record(0, b"abc") + record(1, b"def")
    with pytest.raises(ValueError, match="cut short"):
        entries(whole[:-cut])
    with pytest.raises(ValueError, match="cut short"):  # followed by a whole batch
        entries(whole[:-cut], whole)


def test_a_header_longer_than_its_record_is_refused():
    bad = bytearray(record(0, b"abc"))
    at = sg.HEAD_SIZE + 2 + 1  # the header length, after the route's two shortstrs ("x", "k")
    bad[at:at + 4] = (10_000).to_bytes(4, "big")
    with pytest.raises(ValueError, match="past its end"):
        entries(bytes(bad))


def test_a_content_header_shorter_than_its_fixed_fields_is_refused():
    short = sg.encode_record(0, 0, shortstr("x") + shortstr("k"), b"\x00\x3c\x00\x00", b"abc")
    with pytest.raises(ValueError, match="content header is cut short"):
        entries(short)


def test_no_entries():
    assert entries(b"") == [] and entries(b"", b"") == []


def test_a_route_that_is_not_two_shortstrs_is_refused():
    good = record(0, b"abc")
    bad = bytearray(good)
    bad[sg.HEAD_SIZE] = 5  # the exchange's length, past the route's end
    with pytest.raises(ValueError, match="route"):
        entries(bytes(bad))


def test_an_offset_past_int64_is_refused():
    """Spark's and Arrow's offsets are int64: a damaged one at 2**63 or more is refused, not
    read as a negative offset."""
    with pytest.raises(ValueError, match="offset is out of range"):
        entries(record(0, b"a") + record(2 ** 63 + 4, b"b"))


_props = st.sampled_from([{}, {"delivery_mode": 2}, {"content_type": "text/plain", "headers": {"a": 1}},
                          {"message_id": "m", "priority": 3}])
_entry = st.tuples(st.integers(0, 12), st.binary(max_size=40), _props, st.sampled_from(["", "x", "amq.topic"]),
                   st.text(max_size=5))


@settings(max_examples=200, deadline=None)
@given(st.lists(_entry, min_size=1, max_size=30), st.integers(0, 2 ** 40), st.data())
def test_columns_agree_with_a_loop_over_the_entries(spec, first, data):
    """Any entries (flags with and without the i64 slot, empty and short bodies, routes and
    headers that repeat or not), cut into any batches: the same rows as the plain loop."""
    made = [record(first + i, body, flags, 7 if flags & 12 else None, exchange, key, **props)
            for i, (flags, body, props, exchange, key) in enumerate(spec)]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(made) - 1), max_size=len(made) - 1)) if len(made) > 1 else [])
    batches = [b"".join(made[a:b]) for a, b in zip([0, *cuts], [*cuts, len(made)])]
    assert comparable(entries(*batches)) == reference(b"".join(made))


@settings(max_examples=300, deadline=None)
@given(st.lists(_entry, min_size=1, max_size=6), st.data())
def test_damaged_batches_are_refused_or_read_as_the_loop_reads_them(spec, data):
    """An octet changed or the batch cut anywhere: a ValueError, or (where the damage still
    makes a readable batch) the rows the plain loop reads; never a crash or a read outside it."""
    batch = bytearray(b"".join(record(i, body, flags, 7 if flags & 12 else None, exchange, key, **props)
                               for i, (flags, body, props, exchange, key) in enumerate(spec)))
    if data.draw(st.booleans()):
        batch[data.draw(st.integers(0, len(batch) - 1))] = data.draw(st.integers(0, 255))
    else:
        del batch[data.draw(st.integers(1, len(batch))):]
    try:
        got = comparable(entries(bytes(batch)))
    except ValueError:
        return
    assert got == reference(bytes(batch))


def test_a_batch_of_entries_is_the_batch_of_their_rows():
    """Batch.add_entries (the stream source's record batches) makes the Arrow record batch that
    adding the same entries one by one makes: headers, deaths, properties and all."""
    rows = pytest.importorskip("warren.spark.rows")
    death = {"x-death": [{"queue": "q", "reason": "rejected", "count": 2, "exchange": "", "routing-keys": ["q"]}]}
    made = [record(10 + i, b"b%d" % i * (i % 4), exchange=["", "x"][i % 2], routing_key=f"k{i % 3}",
                   **[{}, {"headers": death}, {"message_id": f"m{i}", "delivery_mode": 2}][i % 3])
            for i in range(20)]
    reader = records.Records()
    whole = rows.Batch(annotation="x-stream-offset")
    for part in (made[:7], made[7:]):  # (two calls: the batch joins them)
        whole.add_entries(reader.decode(part), "s")
    one_by_one = rows.Batch(annotation="x-stream-offset")
    for offset, exchange, key, props, body in reader.decode(made).rows():
        one_by_one.add(body, exchange, key, "s", offset, False, props)
    assert len(whole) == len(one_by_one) == 20
    assert whole.record_batch().equals(one_by_one.record_batch())
    whole.add_entries(reader.decode(made[:1]), "s")
    whole.add(b"x", "", "k", "s", 99, False, reader.decode(made[:1]).properties[0])
    with pytest.raises(ValueError, match="not both"):
        whole.record_batch()


def test_names_that_are_not_utf8():
    """Warren and RabbitMQ take any octets in a routing key: the reader keeps them (as
    surrogates, which turn back into the same octets) and the row shows U+FFFD for them, one by
    one or in columns (Arrow's strings must be UTF-8), instead of failing the read."""
    rows = pytest.importorskip("warren.spark.rows")
    route = shortstr("x") + b"\x04k\xff\xfez"
    header = encode_header(1, {})
    batch = sg.encode_record(0, 3, route, header, b"a") + record(4, b"b")
    got = entries(batch)
    assert [(o, x, k) for o, x, k, _p, _b in got] == [(3, "x", "k\udcff\udcfez"), (4, "x", "k")]
    assert got[0][2].encode("utf-8", "surrogateescape") == b"k\xff\xfez"
    in_columns, one_by_one = rows.Batch(), rows.Batch()
    in_columns.add_entries(records.Records().decode([batch]), "s")
    for offset, exchange, key, props, body in got:
        one_by_one.add(body, exchange, key, "s", offset, False, props)
    for made in (in_columns.record_batch(), one_by_one.record_batch()):
        assert made.column("routing_key").to_pylist() == ["k\ufffd\ufffdz", "k"]
