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
body. RabbitMQ has no such argument: against it the source reads entry by entry."""

from __future__ import annotations

import struct
from typing import Any, Iterator

from pamqp.header import ContentHeader

RECORD_BATCH = "x-warren-record-batch"
FORMAT = 1

_HEAD = struct.Struct(">IIBQH")
_U32 = struct.Struct(">I")
_PREFIX = 8        # the length and checksum, not counted in the length
_SLOT = 12         # flags with an i64 after the head
_HEAD_SIZE = _HEAD.size


class Records:
    """Takes record batches apart; what it decodes (routes, properties) is kept between
    batches, so a stream whose entries share a content header decodes it once."""

    def __init__(self) -> None:
        self._routes: dict[bytes, tuple[str, str]] = {}
        self._properties: dict[bytes, Any] = {}  # a content header but for its body size -> properties

    def entries(self, records: bytes) -> Iterator[tuple[int, str, str, Any, bytes]]:
        """(offset, exchange, routing key, properties, body) of each entry of a batch.
        `properties` (pamqp's) may be shared between entries: do not change it."""
        routes, decoded = self._routes, self._properties
        unpack_head, unpack_u32 = _HEAD.unpack_from, _U32.unpack_from
        pos, n = 0, len(records)
        while pos < n:
            if pos + _HEAD_SIZE > n:
                raise ValueError(f"a record batch cut short at {pos} of {n} bytes")
            length, _check, flags, offset, route_len = unpack_head(records, pos)
            end = pos + _PREFIX + length
            p = pos + (_HEAD_SIZE + 8 if flags & _SLOT else _HEAD_SIZE)
            if end > n or p + route_len + 4 > end:
                raise ValueError(f"a record batch cut short at {pos} of {n} bytes")
            route = records[p:p + route_len]
            names = routes.get(route)
            if names is None:
                if len(routes) > 4096:
                    routes.clear()
                names = routes[route] = _route(route)
            p += route_len
            header_end = p + 4 + unpack_u32(records, p)[0]
            if header_end > end:
                raise ValueError(f"a record's content header runs past its end at {pos} of {n} bytes")
            key = records[p + 16:header_end]  # (after class, weight and body size)
            properties = decoded.get(key)
            if properties is None:
                header = ContentHeader()
                header.unmarshal(records[p + 4:header_end])
                if len(decoded) > 4096:
                    decoded.clear()
                properties = decoded[key] = header.properties
            yield offset, names[0], names[1], properties, records[header_end:end]
            pos = end


def _route(route: bytes) -> tuple[str, str]:
    exchange_end = 1 + route[0]
    return (route[1:exchange_end].decode("utf-8", "surrogateescape"),
            route[exchange_end + 1:].decode("utf-8", "surrogateescape"))
