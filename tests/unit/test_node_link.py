"""The node link's frames (warren.cluster.node_link): every kind of meta comes back as sent,
blobs exactly, and a damaged frame is refused."""

from __future__ import annotations

import pytest

from warren.cluster.node_link import decode_meta, encode_meta, frame, parse

METAS = [
    {"op": "deliver", "cid": 7, "did": 2 ** 40, "redelivered": True},
    {"op": "credit", "cid": 1, "n": 256},
    {"op": "settle", "ack": False, "requeue": True, "dids": [1, 2, 2 ** 50]},
    {"op": "settled", "seqs": [3, 4], "oks": [True, False]},
    {"op": "publish", "seq": 9, "vhost": "/", "queues": ["q", "ünïcode"]},
    {"op": "publish", "seq": 9, "vhost": "v", "queues": ["q"], "ttl": 0},
    {"op": "publish", "seq": 9, "vhost": "v", "queues": ["q"], "cc": ["k1"]},  # (JSON: rare)
    {"op": "consume", "rid": 3, "vhost": "/", "queue": "q", "arguments": {"x-priority": 5}},
]


@pytest.mark.parametrize("meta", METAS, ids=lambda m: m["op"] + ("-ttl" if "ttl" in m else "-cc" if "cc" in m else ""))
def test_every_meta_comes_back_as_sent(meta):
    assert decode_meta(encode_meta(meta)) == meta


def test_the_frequent_frames_are_packed_not_json():
    for meta in METAS[:6]:
        assert not encode_meta(meta).startswith(b"{"), meta["op"]


def test_blobs_come_back_exactly():
    chunks = frame({"op": "deliver", "cid": 1, "did": 2, "redelivered": False}, b"\x00route", b"", b"x" * 70000)
    data = b"".join(bytes(c) for c in chunks)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    meta, blobs = parse(data[4:])
    assert meta["did"] == 2 and blobs == [b"\x00route", b"", b"x" * 70000]


def test_a_damaged_frame_is_refused():
    data = b"".join(bytes(c) for c in frame({"op": "credit", "cid": 1, "n": 2}, b"blob"))
    with pytest.raises(ValueError):
        parse(data[4:-1])  # the blob runs past the frame
    with pytest.raises(ValueError):
        decode_meta(b"[1, 2]")  # JSON, not an object
