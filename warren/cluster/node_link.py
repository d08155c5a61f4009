"""One node link: a TCP connection between two members of a cluster, carrying the requests of
the node that dialled it (the entry node, where clients are connected) for queues that live on
the node that accepted it (their home), and the answers and deliveries back (RabbitMQ's
inter-node traffic; the port is its distribution port).

The wire is frames of `length (4 octets) | meta length (4) | meta (JSON) | blobs`, each blob
`length (4) | octets`: the meta says what the frame is, the blobs carry a message's route,
content header and body exactly as a client sent them (so nothing is encoded twice).

A link is authenticated by the cluster's secret: the accepting node sends a nonce, the dialling
node answers with its name and an HMAC of both under the secret (warren.cluster.node_links
keeps the secret in etcd, as RabbitMQ's nodes share an Erlang cookie)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import struct
from typing import Any, Callable

from ..amqp.message import Message

log = logging.getLogger("warren.cluster.link")

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 31        # a message body may be as large as AMQP allows (frames are not split here)
WRITE_HIGH = 4 << 20       # above this many buffered octets the link says it is busy (credit waits)
HANDSHAKE_TIMEOUT = 5.0
# A partition or a stopped peer ends no connection (no RST, no FIN): each end sends a tick
# when it sent nothing for TICK seconds, and a link that brought nothing for SILENCE seconds
# while it was read is dead: what waits on it fails, and the queues its peer led elect.
# (Erlang's net_ticktime is 60 s; shorter here, as a quorum queue's followers elect once the
# link to its leader is dead, and RabbitMQ's fail over within seconds; longer than a node's
# lease, so that a home that stalls a few seconds keeps its links.)
TICK = 1.0
SILENCE = 10.0
SLICE = 16                 # frames handled in one turn of the loop (see Link._handle_frames; 64: a
#                            consumer on another node fell behind, bench/RESULTS.md)

Meta = dict[str, Any]


# The frames every message makes (a publish, its confirm, a delivery, its ack, credit) have a
# packed meta: JSON cost 32 µs a message over the four of them (bench/RESULTS.md, "Classic
# queues across a cluster's nodes"), struct under 1. Its first octet is the frame's kind; a
# JSON meta starts with "{".
_DELIVER = struct.Struct(">BIq?")        # kind, consumer id, delivery id (a replicated queue's: ~message id), redelivered
_CREDIT = struct.Struct(">BII")          # kind, consumer id, credit
_SETTLE = struct.Struct(">B??I")         # kind, ack, requeue, count; then the delivery ids
_SETTLED = struct.Struct(">BI")          # kind, count; then (sequence number, safe) each
_SEQ_OK = struct.Struct(">Q?")
_PUBLISH = struct.Struct(">BQqH")        # kind, sequence number, TTL (-1: none), queue count; then
#                                          the vhost and the queue names, each a length (2) and UTF-8
_STR_LEN = struct.Struct(">H")
_FROM = struct.Struct(">QQ")  # PUBLISH_FROM's: then the publish's number and its publisher's lowest
#                               unanswered one; after the names, the publisher
DELIVER, CREDIT, SETTLE, SETTLED, PUBLISH, PUBLISH_FROM = 1, 2, 3, 4, 5, 6


def encode_meta(meta: Meta) -> bytes:
    op = meta["op"]
    if op == "deliver":
        return _DELIVER.pack(DELIVER, meta["cid"], meta["did"], meta["redelivered"])
    if op == "credit":
        return _CREDIT.pack(CREDIT, meta["cid"], meta["n"])
    if op == "settle":
        dids = meta["dids"]
        return _SETTLE.pack(SETTLE, meta["ack"], meta["requeue"], len(dids)) + struct.pack(f">{len(dids)}q", *dids)
    if op == "settled" and "moved" not in meta:  # (some not decided there: rare, as JSON)
        return _SETTLED.pack(SETTLED, len(meta["seqs"])) + b"".join(
            _SEQ_OK.pack(seq, ok) for seq, ok in zip(meta["seqs"], meta["oks"]))
    if op == "publish" and "cc" not in meta:
        ttl = meta.get("ttl")
        names = [meta["vhost"], *meta["queues"]]
        kind, origin = PUBLISH, meta.get("from")
        if origin is not None:  # (a quorum queue's publishes are numbered: QuorumPublisher)
            kind = PUBLISH_FROM
            names.append(origin)
        head = _PUBLISH.pack(kind, meta["seq"], -1 if ttl is None else ttl, len(meta["queues"]))
        if origin is not None:
            head += _FROM.pack(meta["n"], meta["low"])
        return head + b"".join(_STR_LEN.pack(len(b)) + b for b in (n.encode() for n in names))
    return json.dumps(meta, separators=(",", ":")).encode()


def decode_meta(data: bytes) -> Meta:
    kind = data[0]
    if kind == DELIVER:
        _, cid, did, redelivered = _DELIVER.unpack(data)
        return {"op": "deliver", "cid": cid, "did": did, "redelivered": redelivered}
    if kind == CREDIT:
        _, cid, n = _CREDIT.unpack(data)
        return {"op": "credit", "cid": cid, "n": n}
    if kind == SETTLE:
        _, ack, requeue, count = _SETTLE.unpack_from(data)
        return {"op": "settle", "ack": ack, "requeue": requeue,
                "dids": list(struct.unpack_from(f">{count}q", data, _SETTLE.size))}
    if kind == SETTLED:
        _, count = _SETTLED.unpack_from(data)
        pairs = [_SEQ_OK.unpack_from(data, _SETTLED.size + i * _SEQ_OK.size) for i in range(count)]
        return {"op": "settled", "seqs": [seq for seq, _ in pairs], "oks": [ok for _, ok in pairs]}
    if kind == PUBLISH or kind == PUBLISH_FROM:
        _, seq, ttl, count = _PUBLISH.unpack_from(data)
        pos, names = _PUBLISH.size, []
        if kind == PUBLISH_FROM:
            number, low = _FROM.unpack_from(data, pos)
            pos += _FROM.size
            count += 1  # (the origin after the queues)
        for _ in range(count + 1):
            (n,) = _STR_LEN.unpack_from(data, pos)
            names.append(data[pos + 2:pos + 2 + n].decode())
            pos += 2 + n
        meta = {"op": "publish", "seq": seq, "vhost": names[0], "queues": names[1:]}
        if kind == PUBLISH_FROM:
            meta["from"], meta["n"], meta["low"] = meta["queues"].pop(), number, low
        if ttl >= 0:
            meta["ttl"] = ttl
        return meta
    meta = json.loads(data)
    if not isinstance(meta, dict):
        raise ValueError("a frame's meta is not an object")
    return meta


def frame(meta: Meta, *blobs: bytes | memoryview) -> list[bytes | memoryview]:
    """The chunks of one frame (written with writelines: blobs are not copied)."""
    encoded = encode_meta(meta)
    size = 4 + len(encoded) + sum(4 + len(b) for b in blobs)
    chunks: list[bytes | memoryview] = [_LEN.pack(size) + _LEN.pack(len(encoded)) + encoded]
    for blob in blobs:
        chunks.append(_LEN.pack(len(blob)))
        chunks.append(blob)
    return chunks


def parse(payload: bytes | memoryview) -> tuple[Meta, list[bytes]]:
    (meta_len,) = _LEN.unpack_from(payload, 0)
    meta = decode_meta(bytes(payload[4:4 + meta_len]))
    blobs = []
    pos = 4 + meta_len
    end = len(payload)
    while pos < end:
        (n,) = _LEN.unpack_from(payload, pos)
        if pos + 4 + n > end:
            raise ValueError("a blob runs past its frame")
        blobs.append(bytes(payload[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return meta, blobs


def message_from(route: bytes, header: bytes, body: bytes) -> Message:
    """A message as a publish or a delivery carries it: its exchange and routing key are the
    shortstrs of `route` (names as the AMQP codec reads them: bytes that are not UTF-8 kept)."""
    n = route[0]
    exchange = route[1:1 + n].decode("utf-8", "surrogateescape")
    key = route[2 + n:2 + n + route[1 + n]].decode("utf-8", "surrogateescape")
    return Message(exchange, key, route, header, body)


def proof(secret: bytes, nonce: str, node: str) -> str:
    return hmac.new(secret, f"{nonce}|{node}".encode(), "sha256").hexdigest()


def new_nonce() -> str:
    return os.urandom(16).hex()


class Link(asyncio.Protocol):
    """The frames of one connection, either end. `on_frame(meta, blobs)` handles each frame once
    the handshake is done; `on_lost()` runs once when the connection ends."""

    def __init__(self, secret: bytes | None, node_name: str, dialled: bool):
        self.secret = secret
        self.node_name = node_name
        self.dialled = dialled
        self.peer: str | None = None      # the other node's name, once authenticated
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.on_frame: Callable[[Meta, list[bytes]], None] = lambda meta, blobs: None
        self.on_lost: Callable[[], None] = lambda: None
        self.on_drained: Callable[[], None] = lambda: None
        self.on_read: Callable[[], None] = lambda: None  # after the frames of one read
        self.closed = False
        self.delivering = True  # False while its write buffer is full (a consumers' Gate)
        self._buffer = bytearray()
        self._nonce = ""
        self._pending: list[tuple[Meta, tuple[bytes | memoryview, ...]]] = []
        self._holds: set[str] = set()  # why the socket is not read now
        self._slicing = False          # the rest of a read waits for the loop's next turn
        self._heard = 0.0              # (loop time) when the last octets came
        self._sent = 0.0               # (loop time) when the last frames went

    # asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH, WRITE_HIGH // 4)
        if not self.dialled:
            self._nonce = new_nonce()
            self.send({"op": "hello", "nonce": self._nonce, "node": self.node_name})
            asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        self._heard = asyncio.get_running_loop().time()
        if self._slicing:  # (read before the pause took effect: behind what waits)
            self._buffer += data
            return
        if self._buffer:  # (the start of a frame was left by the last read)
            data = bytes(self._buffer + data)
        self._handle_frames(data)

    def _handle_frames(self, data: bytes) -> None:
        """Handle the whole frames of `data`, SLICE at a time: past that the rest waits for
        the loop's next turn (and the socket is not read meanwhile), so that a link bringing
        hundreds of publishes in one read does not hold back another link's credit or acks
        for the milliseconds they take (what a consumer on another node gets per round trip
        is its prefetch)."""
        view = memoryview(data)  # (of immutable octets: frames are parsed in place)
        pos, end = 0, len(data)
        handled = 0
        while end - pos >= 4 and not self.closed:
            if handled == SLICE:
                self.hold_reading("slice")
                self._slicing = True
                self._buffer = bytearray(view[pos:])
                asyncio.get_running_loop().call_soon(self._next_slice)
                if self.peer is not None:
                    self.on_read()
                return
            handled += 1
            (size,) = _LEN.unpack_from(view, pos)
            if size > MAX_FRAME:
                self.abort(f"frame of {size} octets")
                return
            if end - pos < 4 + size:
                break
            try:
                meta, blobs = parse(view[pos + 4:pos + 4 + size])
            except (ValueError, KeyError, UnicodeDecodeError, struct.error) as err:
                self.abort(f"unreadable frame: {err}")
                return
            pos += 4 + size
            if self.peer is None:
                self._handshake(meta)
            elif meta.get("op") != "tick":
                self.on_frame(meta, blobs)
        self._buffer = bytearray(view[pos:])
        self.release_reading("slice")
        if self.peer is not None and not self.closed:
            self.on_read()

    def _next_slice(self) -> None:
        self._slicing = False
        data, self._buffer = bytes(self._buffer), bytearray()
        if not self.closed:
            self._handle_frames(data)

    def hold_reading(self, reason: str) -> None:
        """Read nothing more from the socket until release_reading(reason) (and every other
        reason's release)."""
        if not self._holds and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds and self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        was_ready = self.peer is not None and not self.closed
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(str(exc) if exc else "closed during the handshake"))
        if was_ready:
            self.on_lost()

    def pause_writing(self) -> None:
        self.delivering = False

    def resume_writing(self) -> None:
        self.delivering = True
        self.on_drained()

    # sending -----------------------------------------------------------------------
    def send(self, meta: Meta, *blobs: bytes | memoryview) -> None:
        """Queue a frame: what one loop tick sends goes out in one write, after it (so a
        frame's meta may still change until then: see pending)."""
        if self.transport is None or self.closed:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append((meta, blobs))

    def pending(self, meta: Meta) -> bool:
        """Whether `meta` is the last frame queued and not written yet."""
        return bool(self._pending) and self._pending[-1][0] is meta

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and self.transport is not None and not self.closed:
            chunks: list[bytes | memoryview] = []
            for meta, blobs in pending:
                chunks += frame(meta, *blobs)
            self.transport.writelines(chunks)
            self._sent = asyncio.get_running_loop().time()

    def close(self) -> None:
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def abort(self, why: str) -> None:
        log.error("node link %s: %s; closing it", self.peer or "(handshake)", why)
        if self.transport is not None:
            self.transport.abort()

    # handshake ---------------------------------------------------------------------
    def _handshake(self, meta: Meta) -> None:
        op = meta.get("op")
        if self.dialled and op == "hello":  # we dialled: prove we know the secret
            assert self.secret is not None
            self.send({"op": "proof", "node": self.node_name, "mac": proof(self.secret, str(meta.get("nonce")),
                                                                          self.node_name)})
        elif self.dialled and op == "welcome":  # the other node accepted the proof: the link is up
            self._up(str(meta.get("node")))
        elif not self.dialled and op == "proof":
            node = str(meta.get("node"))
            if self.secret is None:  # (this node has not read the cluster's secret yet)
                log.info("node link from %s refused: this node is still starting", node)
                self.close()
                return
            if not hmac.compare_digest(str(meta.get("mac")), proof(self.secret, self._nonce, node)):
                self.abort(f"node {node!r} did not prove it knows the cluster's secret")
                return
            self.send({"op": "welcome", "node": self.node_name})
            self._up(node)
        else:
            self.abort(f"unexpected {op!r} before the handshake ended")

    def _up(self, peer: str) -> None:
        self.peer = peer
        if not self.ready.done():
            self.ready.set_result(peer)
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        loop.call_later(TICK, self._tick)

    def _tick(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._holds:
            self._heard = now  # (not read meanwhile: its silence says nothing)
        elif now - self._heard > SILENCE:
            self.abort(f"nothing came for {SILENCE:.0f} s")
            return
        if now - self._sent >= TICK:
            self.send({"op": "tick"})
        loop.call_later(TICK, self._tick)

    def _handshake_timeout(self) -> None:
        if self.peer is None and not self.closed:
            self.abort("no handshake in time")
