"""The node link's frames (warren.cluster.node_link): every kind of meta comes back as sent,
blobs exactly, and a damaged frame is refused; an idle link stays up on its ticks, and one
whose peer went silent ends."""

from __future__ import annotations

import asyncio

import pytest

from warren.cluster import node_link
from warren.cluster.node_link import Link, decode_meta, encode_meta, frame, parse, proof

METAS = [
    {"op": "deliver", "cid": 7, "did": 2 ** 40, "redelivered": True},
    {"op": "credit", "cid": 1, "n": 256},
    {"op": "settle", "ack": False, "requeue": True, "dids": [1, 2, 2 ** 50]},
    {"op": "settled", "seqs": [3, 4], "oks": [True, False]},
    {"op": "publish", "seq": 9, "vhost": "/", "queues": ["q", "ünïcode"]},
    {"op": "publish", "seq": 9, "vhost": "v", "queues": ["q"], "ttl": 0},
    {"op": "publish", "seq": 9, "vhost": "v", "queues": ["qq"], "from": "warren-b@h/0a1b", "n": 2 ** 40, "low": 7},
    {"op": "publish", "seq": 9, "vhost": "v", "queues": ["q"], "cc": ["k1"]},  # (JSON: rare)
    {"op": "settled", "seqs": [3, 4], "oks": [True, False], "moved": [4]},  # (JSON: rare)
    {"op": "consume", "rid": 3, "vhost": "/", "queue": "q", "arguments": {"x-priority": 5}},
]


@pytest.mark.parametrize("meta", METAS, ids=lambda m: m["op"] + next((f"-{k}" for k in ("ttl", "cc", "from", "moved") if k in m), ""))
def test_every_meta_comes_back_as_sent(meta):
    assert decode_meta(encode_meta(meta)) == meta


def test_the_frequent_frames_are_packed_not_json():
    for meta in METAS[:7]:
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


# ------------------------------------------------------------------ ticks and silence
async def _server(monkeypatch, frames: list) -> tuple[asyncio.AbstractServer, list[Link], int]:
    monkeypatch.setattr(node_link, "TICK", 0.1)
    monkeypatch.setattr(node_link, "SILENCE", 0.5)
    accepted: list[Link] = []

    def made() -> Link:
        link = Link(SECRET, "home@localhost", False)
        link.on_frame = lambda meta, blobs: frames.append(meta)
        accepted.append(link)
        return link
    server = await asyncio.get_running_loop().create_server(made, "127.0.0.1", 0)
    return server, accepted, server.sockets[0].getsockname()[1]


SECRET = b"cluster secret"


@pytest.mark.asyncio
async def test_an_idle_link_stays_up_on_ticks_alone(monkeypatch):
    frames: list = []
    server, accepted, port = await _server(monkeypatch, frames)
    loop = asyncio.get_running_loop()
    _, dialled = await loop.create_connection(lambda: Link(SECRET, "entry@localhost", True), "127.0.0.1", port)
    assert await asyncio.wait_for(dialled.ready, 5) == "home@localhost"
    lost: list[str] = []
    dialled.on_lost = lambda: lost.append("dialled")
    accepted[0].on_lost = lambda: lost.append("accepted")
    await asyncio.sleep(1.5)  # (three times the silence: nothing but ticks went either way)
    assert not lost and not dialled.closed and not accepted[0].closed
    assert frames == []  # (a tick is not a frame for the link's user)
    dialled.close()
    server.close()


@pytest.mark.asyncio
async def test_a_link_whose_peer_goes_silent_ends(monkeypatch):
    """A peer that answered the handshake and then sends nothing (stopped, or cut off: no
    FIN, no RST) is dropped after SILENCE seconds, and what waits on the link is told."""
    frames: list = []
    server, accepted, port = await _server(monkeypatch, frames)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    size = int.from_bytes(await reader.readexactly(4), "big")
    hello, _ = parse(await reader.readexactly(size))
    started = asyncio.get_running_loop().time()  # (before the last octets it hears from us)
    writer.writelines(frame({"op": "proof", "node": "entry@localhost",
                             "mac": proof(SECRET, hello["nonce"], "entry@localhost")}))
    await asyncio.wait_for(accepted[0].ready, 5)
    lost = asyncio.get_running_loop().create_future()
    accepted[0].on_lost = lambda: lost.set_result(None)
    await asyncio.wait_for(lost, 5)  # (its ticks kept coming meanwhile: the socket is read, not answered)
    assert 0.5 <= asyncio.get_running_loop().time() - started < 2
    writer.close()
    server.close()
