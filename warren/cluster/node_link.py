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

log = logging.getLogger("warren.cluster.link")

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 31        # a message body may be as large as AMQP allows (frames are not split here)
WRITE_HIGH = 4 << 20       # above this many buffered octets the link says it is busy (credit waits)
HANDSHAKE_TIMEOUT = 5.0

Meta = dict[str, Any]


def frame(meta: Meta, *blobs: bytes | memoryview) -> list[bytes | memoryview]:
    """The chunks of one frame (written with writelines: blobs are not copied)."""
    encoded = json.dumps(meta, separators=(",", ":")).encode()
    size = 4 + len(encoded) + sum(4 + len(b) for b in blobs)
    chunks: list[bytes | memoryview] = [_LEN.pack(size) + _LEN.pack(len(encoded)) + encoded]
    for blob in blobs:
        chunks.append(_LEN.pack(len(blob)))
        chunks.append(blob)
    return chunks


def parse(payload: bytes) -> tuple[Meta, list[bytes]]:
    (meta_len,) = _LEN.unpack_from(payload, 0)
    meta = json.loads(payload[4:4 + meta_len])
    blobs = []
    pos = 4 + meta_len
    while pos < len(payload):
        (n,) = _LEN.unpack_from(payload, pos)
        blobs.append(payload[pos + 4:pos + 4 + n])
        pos += 4 + n
    if not isinstance(meta, dict):
        raise ValueError("a frame's meta is not an object")
    return meta, blobs


def proof(secret: bytes, nonce: str, node: str) -> str:
    return hmac.new(secret, f"{nonce}|{node}".encode(), "sha256").hexdigest()


def new_nonce() -> str:
    return os.urandom(16).hex()


class Link(asyncio.Protocol):
    """The frames of one connection, either end. `on_frame(meta, blobs)` handles each frame once
    the handshake is done; `on_lost()` runs once when the connection ends."""

    def __init__(self, secret: bytes, node_name: str, dialled: bool):
        self.secret = secret
        self.node_name = node_name
        self.dialled = dialled
        self.peer: str | None = None      # the other node's name, once authenticated
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.on_frame: Callable[[Meta, list[bytes]], None] = lambda meta, blobs: None
        self.on_lost: Callable[[], None] = lambda: None
        self.on_drained: Callable[[], None] = lambda: None
        self.closed = False
        self.delivering = True  # False while its write buffer is full (a consumers' Gate)
        self._buffer = bytearray()
        self._nonce = ""
        self._pending: list[tuple[Meta, tuple[bytes | memoryview, ...]]] = []

    # asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH, WRITE_HIGH // 4)
        if not self.dialled:
            self._nonce = new_nonce()
            self.send({"op": "hello", "nonce": self._nonce, "node": self.node_name})
            asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4 and not self.closed:
            (size,) = _LEN.unpack_from(buffer, 0)
            if size > MAX_FRAME:
                self.abort(f"frame of {size} octets")
                return
            if len(buffer) < 4 + size:
                return
            payload = bytes(buffer[4:4 + size])
            del buffer[:4 + size]
            try:
                meta, blobs = parse(payload)
            except (ValueError, struct.error) as err:
                self.abort(f"unreadable frame: {err}")
                return
            if self.peer is None:
                self._handshake(meta)
            else:
                self.on_frame(meta, blobs)

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
            peer = str(meta.get("node"))
            self.send({"op": "proof", "node": self.node_name, "mac": proof(self.secret, str(meta.get("nonce")),
                                                                          self.node_name)})
            self.peer = peer
            if not self.ready.done():
                self.ready.set_result(peer)
        elif not self.dialled and op == "proof":
            node = str(meta.get("node"))
            if not hmac.compare_digest(str(meta.get("mac")), proof(self.secret, self._nonce, node)):
                self.abort(f"node {node!r} did not prove it knows the cluster's secret")
                return
            self.peer = node
            if not self.ready.done():
                self.ready.set_result(node)
        else:
            self.abort(f"unexpected {op!r} before the handshake ended")

    def _handshake_timeout(self) -> None:
        if self.peer is None and not self.closed:
            self.abort("no handshake in time")
