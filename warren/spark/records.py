"""Warren's record batches: a stream read in bulk, many entries to a delivery.

A consumer of a Warren stream with the argument `x-warren-record-batch` (a byte count) gets
deliveries whose body holds consecutive entries as the stream stores them, about that many
bytes at a time; the delivery's headers say the first offset (`x-stream-offset`), how many
(`x-warren-records`) and the layout (`x-warren-record-format`, 1: below). The broker then
does per batch what it does per entry for an ordinary consumer (RabbitMQ's stream protocol
sends whole chunks for the same reason), and the reader takes the entries apart here.

Layout 1, per entry: u32 length of the rest, u32 checksum, u8 flags, u64 offset, u16 route
length, an i64 (a chunk's time or a deadline) when flags & 12, the route (the exchange and
routing key as shortstrs), u32 content header length, the content header as published, the
body. RabbitMQ has no such argument: against it the source reads entry by entry.

The entries are taken apart a column at a time (numpy and Arrow): Python walks only the chain
of lengths; offsets, routes and content headers are gathered by numpy from the batches joined,
and the bodies become an Arrow binary column by one more copy in Arrow (views into the joined
batches, cast). Measured on 2026-11-28 (1 KiB entries, 8,192 at a time): 0.4 µs an entry
against 1.4-1.7 µs for a loop over the entries into the same Arrow columns; a range read alone
into Arrow IPC 0.95-1.0 µs of CPU an entry against 1.6-1.85."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pamqp.header import ContentHeader

RECORD_BATCH = "x-warren-record-batch"
FORMAT = 1

_U32 = struct.Struct(">I")
_PREFIX = 8        # the length and checksum, not counted in the length
_HEAD_SIZE = 19    # the prefix, flags, offset and route length
_SLOT = 12         # flags with an i64 after the head
_HEADER_MIN = 14   # class, weight, body size, property flags
_BASIC = struct.pack(">HHQ", 60, 0, 0)  # a content header's class, weight and body size
_VIEW_INLINE = 12  # a binary view holds values up to this long itself


@dataclass
class Entries:
    """Consecutive entries of a stream, column by column. `routes` holds the (exchange, routing
    key) of each distinct route and `properties` the pamqp properties of each distinct content
    header (shared between calls: do not change them); `route` and `which` index them per entry.
    Names are decoded as the wire reader decodes them (octets that are not UTF-8 kept as
    surrogates, so they turn back into the same octets)."""

    offset: np.ndarray       # int64
    body: pa.Array           # binary
    route: np.ndarray        # int32
    routes: list[tuple[str, str]]
    which: np.ndarray        # int32
    properties: list[Any]

    def __len__(self) -> int:
        return len(self.offset)

    def rows(self) -> Iterator[tuple[int, str, str, Any, bytes]]:
        """(offset, exchange, routing key, properties, body) of each entry."""
        routes, properties = self.routes, self.properties
        return ((offset, *routes[r], properties[w], body) for offset, r, w, body in
                zip(self.offset.tolist(), self.route.tolist(), self.which.tolist(), self.body.to_pylist()))

    def slice(self, start: int, stop: int) -> Entries:
        """Entries [start, stop) of these."""
        return Entries(self.offset[start:stop], self.body[start:stop], self.route[start:stop], self.routes,
                       self.which[start:stop], self.properties)


class Records:
    """Takes record batches apart; what it decodes (routes, properties) is kept between
    batches, so a stream whose entries share a content header decodes it once."""

    def __init__(self) -> None:
        self._routes: dict[bytes, tuple[str, str]] = {}
        self._properties: dict[bytes, Any] = {}  # a content header but for its body size -> properties

    def decode(self, batches: list[bytes]) -> Entries:
        """The entries of consecutive record batches."""
        data = batches[0] if len(batches) == 1 else b"".join(batches)  # (one copy: numpy gathers from one buffer)
        if len(data) >= 1 << 31:  # (a binary view's offsets are int32)
            raise ValueError(f"record batches of {len(data)} bytes at once: at most 2 GiB")
        starts = _starts(data, batches)
        if not starts:
            return Entries(np.zeros(0, np.int64), pa.array([], pa.binary()), np.zeros(0, np.int32), [],
                           np.zeros(0, np.int32), [])
        u8 = np.frombuffer(data, np.uint8)
        at = np.array(starts, np.int64)
        end = np.append(at[1:], len(data))
        if int((end - at).min()) < _HEAD_SIZE:
            _refuse(end - at < _HEAD_SIZE, at, data, "a record batch cut short at {} of {} bytes")
        offset = _big_endian(u8, at + 9, 8)
        if int(offset.max()) >> 63:  # (offsets are int64 in Spark and Arrow)
            _refuse(offset >> np.uint64(63) != 0, at, data, "a record's offset is out of range at {} of {} bytes")
        offset = offset.astype(np.int64)
        route_len = _big_endian(u8, at + 17, 2).astype(np.int64)
        route_at = at + _HEAD_SIZE + np.where(u8[at + 8] & _SLOT, 8, 0)
        header_at = route_at + route_len  # (its length)
        if int((end - header_at).min()) < 4:
            _refuse(end - header_at < 4, at, data, "a record batch cut short at {} of {} bytes")
        header_end = header_at + 4 + _big_endian(u8, header_at, 4).astype(np.int64)
        if int((end - header_end).min()) < 0:
            _refuse(header_end > end, at, data, "a record's content header runs past its end at {} of {} bytes")
        if int((header_end - header_at).min()) < 4 + _HEADER_MIN:
            _refuse(header_end - header_at < 4 + _HEADER_MIN, at, data,
                    "a record's content header is cut short at {} of {} bytes")
        buffer = pa.py_buffer(data)
        routes = _views(u8, route_at, route_len, buffer).dictionary_encode()
        keys = _views(u8, header_at + 16, header_end - header_at - 16, buffer).dictionary_encode()
        return Entries(offset, _views(u8, header_end, end - header_end, buffer).cast(pa.binary()),
                       _indices(routes), [self._route(route) for route in routes.dictionary.to_pylist()],
                       _indices(keys), [self._decoded(key) for key in keys.dictionary.to_pylist()])

    def _route(self, route: bytes) -> tuple[str, str]:
        names = self._routes.get(route)
        if names is None:
            if len(self._routes) > 4096:
                self._routes.clear()
            exchange_end = 1 + route[0] if route else 0
            if not route or exchange_end >= len(route) or exchange_end + 1 + route[exchange_end] != len(route):
                raise ValueError(f"a record's route is not two shortstrs: {route[:64]!r}")
            names = self._routes[route] = (route[1:exchange_end].decode("utf-8", "surrogateescape"),
                                           route[exchange_end + 1:].decode("utf-8", "surrogateescape"))
        return names

    def _decoded(self, key: bytes) -> Any:
        properties = self._properties.get(key)
        if properties is None:
            header = ContentHeader()
            try:
                header.unmarshal(_BASIC + key)
            except Exception as e:  # (pamqp raises what its decoders raise)
                raise ValueError(f"a record's content header cannot be read: {e!r}") from e
            if len(self._properties) > 4096:
                self._properties.clear()
            properties = self._properties[key] = header.properties
        return properties


def _starts(data: bytes, batches: list[bytes]) -> list[int]:
    """Where each entry starts: the chain of lengths, which must end where each batch does."""
    unpack = _U32.unpack_from
    starts: list[int] = []
    add = starts.append
    pos = 0
    for batch in batches:
        base, last = pos, pos + len(batch)
        while pos < last:
            add(pos)
            if pos + 4 > last:
                break
            pos += _PREFIX + unpack(data, pos)[0]
        if pos != last:
            raise ValueError(f"a record batch cut short at {starts[-1] - base} of {len(batch)} bytes")
    return starts


def _big_endian(u8: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
    """The unsigned big-endian integers of `size` octets at each of `at`."""
    octets = u8[at[:, None] + np.arange(size)]
    return octets.view(f">u{size}").ravel()


def _views(u8: np.ndarray, start: np.ndarray, length: np.ndarray, buffer: pa.Buffer) -> pa.Array:
    """A binary_view array of the slices [start, start + length) of `buffer` (u8: its octets):
    per value its length, then the value itself when it fits in 12 octets, else its first 4
    octets, buffer 0 and its offset (Arrow's layout; made from buffers since pyarrow 19)."""
    n = len(start)
    views = np.zeros((n, 16), np.uint8)
    views[:, 0:4] = length.astype("<i4").view(np.uint8).reshape(n, 4)
    span = np.arange(_VIEW_INLINE)
    head = u8[np.minimum(start[:, None] + span, len(u8) - 1)]  # (clamped: masked below)
    head[span >= length[:, None]] = 0
    views[:, 4:16] = head
    long_ = length > _VIEW_INLINE
    views[long_, 8:12] = 0
    views[long_, 12:16] = start[long_].astype("<i4").view(np.uint8).reshape(-1, 4)
    array = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), buffer])
    array.validate(full=True)  # (checks every view lies in the buffer, ~3 ns a value: a wrong one would crash the cast)
    return array


def _indices(encoded: pa.DictionaryArray) -> np.ndarray:
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)


def _refuse(bad: np.ndarray, at: np.ndarray, data: bytes, message: str) -> None:
    raise ValueError(message.format(int(at[int(np.argmax(bad))]), len(data)))
