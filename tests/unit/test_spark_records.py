"""warren.spark.records reads the records of warren.store.segments (Warren's record batches):
the two layouts must agree, flags with an i64 slot included."""

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.store import segments as sg

records = pytest.importorskip("warren.spark.records")


def record(offset: int, body: bytes, flags: int = 0, stamp: int | None = None, exchange: str = "x",
           routing_key: str = "k", **props) -> bytes:
    header = encode_header(len(body), props)
    return sg.encode_record(flags, offset, shortstr(exchange) + shortstr(routing_key), header, body, stamp)


def test_entries_with_and_without_a_chunk_time():
    batch = (record(5, b"first", sg.FLAG_CHUNK | sg.FLAG_DURABLE, 1_700_000_000_000, content_type="text/plain")
             + record(6, b"", exchange="", routing_key="r\u00e9", headers={"a": 1})
             + record(7, b"x" * 70_000, sg.FLAG_EXPIRY, 123, message_id="m"))
    got = list(records.Records().entries(batch))
    assert [(o, x, rk, body) for o, x, rk, _p, body in got] == [
        (5, "x", "k", b"first"), (6, "", "r\u00e9", b""), (7, "x", "k", b"x" * 70_000)]
    assert got[0][3].content_type == "text/plain" and got[1][3].headers == {"a": 1}
    assert got[2][3].message_id == "m"


def test_properties_are_decoded_once_per_content_header_whatever_the_body_size():
    reader = records.Records()
    batch = record(0, b"a", delivery_mode=2) + record(1, b"bbbb", delivery_mode=2) + record(2, b"c", priority=1)
    props = [p for _o, _x, _rk, p, _b in reader.entries(batch)]
    assert props[0] is props[1] and props[2] is not props[0] and props[2].priority == 1
    again = [p for _o, _x, _rk, p, _b in reader.entries(record(3, b"dd", delivery_mode=2))]
    assert again[0] is props[0]


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_a_batch_cut_short_is_refused(cut):
    whole = record(0, b"abc") + record(1, b"def")
    with pytest.raises(ValueError, match="cut short"):
        list(records.Records().entries(whole[:-cut]))


def test_a_header_longer_than_its_record_is_refused():
    bad = bytearray(record(0, b"abc"))
    at = sg.HEAD_SIZE + 2 + 1  # the header length, after the route's two shortstrs ("x", "k")
    bad[at:at + 4] = (10_000).to_bytes(4, "big")
    with pytest.raises(ValueError, match="past its end"):
        list(records.Records().entries(bytes(bad)))
