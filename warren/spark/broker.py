"""What the Spark source and sink ask of the broker, over AMQP 0-9-1 (aiormq): a stream's
offsets, an exact range of a stream, publishing with confirms.

Against Warren a stream's offsets come from `amq.warren.stream-offsets` (no message is read).
Against RabbitMQ, which has no such request, they are found by reading: the first offset from
a consumer at `first`, the next from the last chunk (a consumer at `last` read until idle), so
each micro-batch costs a read of the stream's last chunk and RECENT_IDLE seconds of waiting,
and RabbitMQ's offsets have gaps (one at every segment roll), so a range may hold fewer
entries than its size."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import uuid
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import aiormq
import numpy as np
from pamqp import commands as spec

from .connection import Endpoint
from .offsets import StreamRange
from .records import FORMAT as RECORD_FORMAT, RECORD_BATCH, Entries, Records
from .wire import ProtocolError, Wire

log = logging.getLogger("warren.spark")

OFFSETS_REQUEST = "amq.warren.stream-offsets"
PREFETCH = 2000        # a range reader's credit (a stream consumer needs one)
ACK_EVERY = 500
# A record batch from Warren (warren.spark.records), and how many in flight: enough that the
# reader rarely waits for the broker (measured 2026-11-28, one reader alone, 500,000 × 1 KiB:
# 3 × 256 KiB 1.2-1.6 µs of wall time an entry for ~1.0 of CPU, 8 × 512 KiB 1.1, 8 × 1 MiB 1.0).
# Up to BATCH_PREFETCH × BATCH_BYTES is read past a range's end.
BATCH_BYTES = 512 << 10
BATCH_PREFETCH = 8
CHUNK_BYTES = 64 << 20   # record batches decoded at once: at least `every` entries, or this many bytes
STALL = 30.0           # a range read that gets nothing for this long fails (its task is retried)
RECENT_IDLE = 0.3      # RabbitMQ: how long to wait for the rest of a stream's last chunk
RECENT_MOST = 1.2      # ... and at most, while publishers keep appending (the tail is then what came by then)

T = TypeVar("T")


class DataLoss(Exception):
    """Retention removed entries that a range still wanted."""


def run(coroutine: Awaitable[T]) -> T:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


async def connect(ep: Endpoint) -> aiormq.abc.AbstractConnection:
    return await aiormq.connect(ep.url, client_properties={"connection_name": "warren.spark"},
                                context=ep.ssl_context())


# --------------------------------------------------------------------- offsets
async def stream_offsets(ep: Endpoint, streams: list[str]) -> dict[str, tuple[int, int]]:
    """{stream: (first offset, next offset)}, committed offsets."""
    conn = await connect(ep)
    try:
        warren = await _is_warren(conn)
        out = {}
        for name in streams:
            out[name] = await (_ask_warren(conn, name) if warren else _read_rabbitmq_offsets(conn, name))
        return out
    finally:
        await conn.close()


async def stream_sizes(ep: Endpoint, streams: list[str]) -> dict[str, tuple[int, int]]:
    """{stream: (bytes, entries)} (Warren only: RabbitMQ has no way to tell without reading)."""
    conn = await connect(ep)
    try:
        if not await _is_warren(conn):
            raise ValueError("maxBytesPerTrigger needs Warren's offsets request: use maxRecordsPerTrigger")
        out = {}
        for name in streams:
            headers = await _offsets_request(conn, name)
            out[name] = int(headers["x-stream-bytes"]), int(headers["x-stream-messages"])
        return out
    finally:
        await conn.close()


async def _ask_warren(conn: Any, stream: str) -> tuple[int, int]:
    headers = await _offsets_request(conn, stream)
    return int(headers["x-stream-first-offset"]), int(headers["x-stream-next-offset"])


async def _offsets_request(conn: Any, stream: str) -> dict:
    """The headers of Warren's answer to an offsets request for `stream`."""
    ch = await conn.channel()
    try:
        reply = (await ch.queue_declare("", exclusive=True, auto_delete=True)).queue
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_reply(message: Any) -> None:
            if not got.done():
                got.set_result(message.header.properties.headers or {})
        await ch.basic_consume(reply, on_reply, no_ack=True)
        correlation = uuid.uuid4().hex
        await ch.basic_publish(b"", exchange=OFFSETS_REQUEST, routing_key=stream,
                               properties=spec.Basic.Properties(reply_to=reply, correlation_id=correlation))
        headers = await asyncio.wait_for(got, 30)
    finally:
        if not ch.is_closed:
            await ch.close()
    if "x-error" in headers:
        raise LookupError(f"stream {stream!r}: {headers['x-error']}")
    return headers


async def _read_rabbitmq_offsets(conn: Any, stream: str) -> tuple[int, int]:
    first = await _edge(conn, stream, "first")
    last = await _edge(conn, stream, "last")
    if first is None or last is None:
        return 0, 0  # (an empty stream: RabbitMQ gives no way to know more)
    return first, last + 1


async def _edge(conn: Any, stream: str, spec_: str) -> int | None:
    """`first`: the lowest offset a consumer at `first` gets; `last`: the highest a consumer
    at `last` gets before RECENT_IDLE of silence (RabbitMQ hands out whole chunks, beyond the
    consumer's credit), or by RECENT_MOST while it keeps growing."""
    ch = await conn.channel()
    seen: list[int] = []
    try:
        await ch.basic_qos(prefetch_count=1 if spec_ == "first" else PREFETCH)
        await ch.basic_consume(stream, lambda m: _note(seen, m), arguments={"x-stream-offset": spec_})
        count, waited = -1, 0.0
        while count != len(seen) and (spec_ == "last" or not seen):
            if spec_ == "last" and seen and waited >= RECENT_MOST:
                break  # (every offset delivered is committed: the highest seen is a tail the stream had)
            count = len(seen)
            await asyncio.sleep(RECENT_IDLE)
            waited += RECENT_IDLE
    finally:
        if not ch.is_closed:
            await ch.close()
    if not seen:
        return None
    return min(seen) if spec_ == "first" else max(seen)


async def _note(seen: list[int], message: Any) -> None:
    seen.append(int((message.header.properties.headers or {})["x-stream-offset"]))


# --------------------------------------------------------------------- reading a range
def read_range(ep: Endpoint, r: StreamRange, fail_on_data_loss: bool,
               on_message: Callable[[bytes, str, str, str, int, bool, Any], None]) -> int:
    """range_reader() to the end: how many entries it read."""
    taken = 0
    for taken in range_reader(ep, r, fail_on_data_loss, on_message):
        pass
    return taken


def range_reader(ep: Endpoint, r: StreamRange, fail_on_data_loss: bool,
                 on_message: Callable[[bytes, str, str, str, int, bool, Any], None],
                 every: int = 0, on_entries: Callable[[Entries, str], None] | None = None) -> Iterator[int]:
    """Read the entries of [r.start, r.end) of stream r.stream in offset order, calling
    on_message(body, exchange, routing_key, stream, offset, redelivered, properties) for each,
    and yielding how many so far after each `every` of them (0: never) and at the end.
    With `on_entries`, entries that come in record batches go to on_entries(entries, stream)
    instead, at least `every` at a time (or CHUNK_BYTES of batches), a yield after each call.
    Entries of the range that retention removed, at its start or in its middle (retention
    overtaking the read), raise DataLoss once the range is read (failOnDataLoss), or are
    skipped with a warning; a gap that is not retention (RabbitMQ's offsets skip one at each
    segment roll) is no loss. A read that gets nothing for STALL seconds fails, so Spark runs
    the task again: a range never ends short without saying so. From Warren the entries come
    in record batches (warren.spark.records), from RabbitMQ one a delivery.
    (warren.spark.wire: the libraries read 3-9 times slower.)"""
    if r.count <= 0:
        yield 0
        return
    wire = Wire(ep, timeout=STALL)
    range_ = _Range(r, on_message, every, on_entries)
    warren = wire.server_properties.get("product") == "Warren"
    try:
        yield from (_read_batches if _has_record_batches(wire) else _read_entries)(wire, range_)
    except socket.timeout:
        raise TimeoutError(f"stream {r.stream!r}: the read of {r.start}-{r.end} got nothing for {STALL:.0f} s "
                           f"after {range_.taken} entries") from None
    finally:
        wire.close()
    if range_.gaps:
        run(_check_loss(ep, r, range_.gaps, fail_on_data_loss, warren))
    yield range_.taken


def _has_record_batches(wire: Wire) -> bool:
    """Whether the broker says it has record batches (Warren since 2026-11-27: an older Warren,
    or RabbitMQ, is read entry by entry)."""
    return (wire.server_properties.get("capabilities") or {}).get(RECORD_BATCH) is True


class _Range:
    """What a range read has taken: take() each entry delivered, in order, or take_entries()
    many at once."""

    def __init__(self, r: StreamRange, on_message: Callable[[bytes, str, str, str, int, bool, Any], None],
                 every: int, on_entries: Callable[[Entries, str], None] | None = None):
        self.r, self.on_message, self.every, self.on_entries = r, on_message, every, on_entries
        self.taken = self.skipped = 0
        self.last = r.start - 1  # the offset taken last
        self.seen = -1  # (take_entries) the last offset of the entries before
        self.gaps: list[tuple[int, int]] = []  # [first missing, next present) in the range
        self.done = False

    def take(self, offset: int | None, exchange: str, routing_key: str, properties: Any, body: bytes,
             redelivered: bool = False) -> bool:
        """Whether to pause (`every` entries taken since the last pause, or the range done)."""
        r = self.r
        if offset is None:
            raise ProtocolError(f"a delivery of stream {r.stream!r} without x-stream-offset")
        if offset < r.start:
            self.skipped += 1  # (RabbitMQ starts at the chunk that holds r.start)
            return False
        if offset > self.last + 1 and self.last + 1 < r.end:
            self.gaps.append((self.last + 1, min(offset, r.end)))  # checked against retention at the end
        if offset >= r.end:
            self.done = True
            return True
        self.on_message(body, exchange, routing_key, r.stream, offset, redelivered, properties)
        self.taken += 1
        self.last = offset
        if offset == r.end - 1:
            self.done = True
            return True
        return bool(self.every) and self.taken % self.every == 0

    def take_entries(self, entries: Entries) -> None:
        """take() of each entry, a column at a time: those of the range to on_entries."""
        r, offsets = self.r, entries.offset
        if len(offsets):
            if offsets[0] <= self.seen or bool((offsets[1:] <= offsets[:-1]).any()):
                raise ProtocolError(f"stream {r.stream!r}: record batches with offsets out of order")
            self.seen = int(offsets[-1])
        low, high = (int(i) for i in np.searchsorted(offsets, (r.start, r.end)))
        self.skipped += low
        if high > low:
            kept = offsets[low:high]
            before = np.concatenate(((self.last,), kept[:-1]))
            jumps = kept > before + 1
            self.gaps.extend((int(b) + 1, int(o)) for b, o in zip(before[jumps], kept[jumps]))
            assert self.on_entries is not None
            self.on_entries(entries.slice(low, high), r.stream)
            self.taken += high - low
            self.last = int(kept[-1])
        if high < len(offsets) or self.last == r.end - 1:
            if self.last + 1 < r.end:
                self.gaps.append((self.last + 1, r.end))
            self.done = True


def _read_entries(wire: Wire, range_: _Range) -> Iterator[int]:
    """One entry a delivery (RabbitMQ). The consumer never holds more credit than the range
    still needs, so the broker sends no entry past it: acks give back credit until the
    deliveries the range needs are all granted, no further."""
    r = range_.r
    prefetch = min(PREFETCH, r.count)
    wire.consume(r.stream, prefetch, {"x-stream-offset": r.start})
    acked = 0

    def on_delivery(tag: int, redelivered: bool, exchange: str, routing_key: str, props: Any,
                    offset: int | None, body: bytes) -> bool:
        nonlocal acked
        pause = range_.take(offset, exchange, routing_key, props, body, redelivered)
        if range_.done:
            return False
        # Credit back in steps of ACK_EVERY, up to what the range needs granted: every
        # delivery of it (its entries and those before its start) less the prefetch.
        target = r.count + range_.skipped - prefetch
        if acked < target and (tag - acked >= ACK_EVERY or tag >= target):
            acked = min(tag, target)
            wire.ack(acked)
        return not pause

    while not range_.done:
        wire.deliveries(on_delivery)  # (resumes where it paused)
        if not range_.done:
            yield range_.taken


def _read_batches(wire: Wire, range_: _Range) -> Iterator[int]:
    """Record batches (Warren): each acked as it arrives, so the broker reads the next while
    this one is taken apart; at most BATCH_PREFETCH batches go past the range's end."""
    r = range_.r
    wire.consume(r.stream, BATCH_PREFETCH, {"x-stream-offset": r.start, RECORD_BATCH: BATCH_BYTES})
    records = Records()
    got: list[tuple[int, bytes, int, int]] = []  # (delivery tag, batch, its entries, its last offset)

    def on_delivery(tag: int, _redelivered: bool, _exchange: str, _routing_key: str, props: Any,
                    _offset: int | None, body: bytes) -> bool:
        headers = props.headers or {}
        first, count = headers.get("x-stream-offset"), headers.get("x-warren-records")
        if headers.get("x-warren-record-format") != RECORD_FORMAT or not isinstance(first, int) \
                or not isinstance(count, int):
            raise ProtocolError(f"stream {r.stream!r}: a record batch of another layout: {props.headers!r}")
        got.append((tag, body, count, first + count - 1))
        return False

    pending: list[bytes] = []  # (with on_entries) batches not yet decoded, their entries and bytes
    pending_entries = size = 0
    while not range_.done:
        wire.deliveries(on_delivery)
        tag, batch, count, last = got.pop()
        wire.ack(tag)
        if range_.on_entries is None:
            for offset, exchange, routing_key, properties, body in records.decode([batch]).rows():
                if range_.take(offset, exchange, routing_key, properties, body):
                    if range_.done:
                        break
                    yield range_.taken
            continue
        pending.append(batch)
        pending_entries, size = pending_entries + count, size + len(batch)
        if pending_entries >= range_.every or size >= CHUNK_BYTES or last >= r.end - 1:
            range_.take_entries(records.decode(pending))
            pending, pending_entries, size = [], 0, 0
            yield range_.taken


async def _check_loss(ep: Endpoint, r: StreamRange, gaps: list[tuple[int, int]], fail_on_data_loss: bool,
                      warren: bool) -> None:
    """DataLoss, or a warning, for what retention removed of a range's gaps (lost_to_retention:
    RabbitMQ's offsets skip one at each segment roll, so there a segment of one entry removed
    mid-range goes unnoticed)."""
    conn = await connect(ep)
    try:
        first: int | None = (await _ask_warren(conn, r.stream))[0] if warren else await _edge(conn, r.stream, "first")
    finally:
        await conn.close()
    lost = lost_to_retention(gaps, first, r.start, warren)
    if not lost:
        return
    count = sum(b - a for a, b in lost)
    spans = ", ".join(f"{a} to {b - 1}" for a, b in lost[:5]) + (" …" if len(lost) > 5 else "")
    gap = f"stream {r.stream!r}: offsets {spans} of the range {r.start}-{r.end} are gone (retention, {count} entries)"
    if fail_on_data_loss:
        raise DataLoss(gap + "; failOnDataLoss=false skips them")
    log.warning("%s: skipped (failOnDataLoss=false)", gap)


def lost_to_retention(gaps: list[tuple[int, int]], first: int | None, start: int,
                      contiguous: bool) -> list[tuple[int, int]]:
    """The parts of a range's gaps that retention removed, given the stream's first offset now:
    all of a gap's offsets below it, if the gap is at the range's start, or the broker's
    offsets are contiguous (Warren), or it is more than one offset wide."""
    if first is None:
        return []
    return [(a, min(b, first)) for a, b in gaps if a < first and (contiguous or a == start or b - a > 1)]


async def _is_warren(conn: Any) -> bool:
    """Whether the broker is Warren (it answers offset requests), from connection.start."""
    return conn.server_properties.get("product") == "Warren"


async def offset_at(ep: Endpoint, stream: str, when: datetime.datetime) -> int | None:
    """The first offset of the first chunk appended at or after `when` (a consumer's
    timestamp offset spec, on either broker), or None if there is none yet."""
    conn = await connect(ep)
    try:
        ch = await conn.channel()
        seen: list[int] = []
        await ch.basic_qos(prefetch_count=1)
        await ch.basic_consume(stream, lambda m: _note(seen, m), arguments={"x-stream-offset": when})
        deadline = asyncio.get_running_loop().time() + RECENT_IDLE * 3
        while not seen and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return seen[0] if seen else None
    finally:
        await conn.close()
