"""Content header properties (basic class).

The broker keeps a message's content header payload exactly as the publisher sent it; these
helpers read the few properties routing needs without decoding the rest.
"""

import struct

from .codec import DecodeError, encode_table, read_shortstr, read_table, shortstr, table_error

_HHQH = struct.Struct(">HHQH")
_Q = struct.Struct(">Q")
_I = struct.Struct(">I")

# (name, flag bit, type) in wire order.
PROPERTIES = (
    ("content_type", 1 << 15, "shortstr"),
    ("content_encoding", 1 << 14, "shortstr"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "shortstr"),
    ("reply_to", 1 << 9, "shortstr"),
    ("expiration", 1 << 8, "shortstr"),
    ("message_id", 1 << 7, "shortstr"),
    ("timestamp", 1 << 6, "longlong"),
    ("type", 1 << 5, "shortstr"),
    ("user_id", 1 << 4, "shortstr"),
    ("app_id", 1 << 3, "shortstr"),
    ("cluster_id", 1 << 2, "shortstr"),
)
FLAG_HEADERS = 1 << 13
FLAG_DELIVERY_MODE = 1 << 12
FLAG_EXPIRATION = 1 << 8
FLAG_USER_ID = 1 << 4
HEADER_PREFIX = 14  # class id, weight, body size, first flags word


def parse_header(payload):
    """Return (class_id, body_size, flags) of a content header payload."""
    if len(payload) < HEADER_PREFIX:
        raise DecodeError("content header too short")
    class_id, _weight, body_size, flags = _HHQH.unpack_from(payload, 0)
    return class_id, body_size, flags


def decode_properties(payload) -> dict:
    """All properties present in a content header payload, by name. As RabbitMQ, the two
    lowest flag bits (bit 1 is no property of basic; bit 0 would announce another flags
    word, which basic never needs) are ignored: the properties start after the first word."""
    _, _, flags = parse_header(payload)
    pos = HEADER_PREFIX
    props = {}
    try:
        for name, bit, kind in PROPERTIES:
            if not flags & bit:
                continue
            if kind == "shortstr":
                props[name], pos = read_shortstr(payload, pos)
            elif kind == "table":
                props[name], pos = read_table(payload, pos)
            elif kind == "octet":
                props[name] = payload[pos]
                pos += 1
            else:
                (props[name],) = _Q.unpack_from(payload, pos)
                pos += 8
    except (struct.error, IndexError):
        raise DecodeError("truncated content header") from None
    return props


def header_fields(payload):
    """(class_id, weight, body_size, flags) of a content header payload of 14 octets or more."""
    return _HHQH.unpack_from(payload, 0)


# Where a header with only these properties ends: 14 + their fixed sizes (the publishers'
# common cases, checked by length alone).
_FIXED_ONLY = {0: 14, FLAG_DELIVERY_MODE: 15, FLAG_DELIVERY_MODE | (1 << 11): 16}
# Headers tables already found well formed (their bytes): publishers mostly repeat their
# headers while message ids and timestamps change. Bounded; cleared when full.
_GOOD_TABLES: dict[bytes, None] = {}
_GOOD_TABLES_MAX = 256


def properties_error(payload: bytes, flags: int) -> str | None:
    """Why RabbitMQ could not decode the properties of this basic content header (it closes
    the connection with 541 when the publish is handled), or None if it can: every property
    the flags announce is there and whole (the headers table as table_error checks it), and
    nothing follows them. `flags` is the first flags word; its two low bits are ignored, as
    RabbitMQ ignores them. Shortstrs may be any bytes, as RabbitMQ takes them.

    This runs for every published header that differs from its channel's previous one, so
    it walks the bytes without building anything, unrolled for speed."""
    n = len(payload)
    if n < HEADER_PREFIX:
        return "no property flags"
    flags &= 0xFFFC
    end = _FIXED_ONLY.get(flags)
    if end is not None:
        return None if n == end else _leftover(n, end)
    if flags == 0x9000 and n > HEADER_PREFIX and n == HEADER_PREFIX + 2 + payload[HEADER_PREFIX]:
        return None  # content_type and delivery_mode, as pika sends them
    pos = HEADER_PREFIX
    try:
        if flags & 0xC000:
            if flags & 0x8000:  # content_type
                pos += 1 + payload[pos]
            if flags & 0x4000:  # content_encoding
                pos += 1 + payload[pos]
        if flags & 0x2000:  # headers
            if pos + 4 > n:
                return "truncated headers table"
            start = pos + 4
            pos = start + _I.unpack_from(payload, pos)[0]
            if pos > n:
                return "truncated headers table"
            raw = payload[start:pos]
            if raw not in _GOOD_TABLES:
                err = table_error(raw, 0, len(raw))
                if err is not None:
                    return "headers: " + err
                if len(_GOOD_TABLES) >= _GOOD_TABLES_MAX:
                    _GOOD_TABLES.clear()
                _GOOD_TABLES[raw] = None
        if flags & 0x1800:  # delivery_mode, priority: an octet each
            pos += ((flags >> 12) & 1) + ((flags >> 11) & 1)
        if flags & 0x0780:
            if flags & 0x0400:  # correlation_id
                pos += 1 + payload[pos]
            if flags & 0x0200:  # reply_to
                pos += 1 + payload[pos]
            if flags & 0x0100:  # expiration
                pos += 1 + payload[pos]
            if flags & 0x0080:  # message_id
                pos += 1 + payload[pos]
        if flags & 0x0040:  # timestamp
            pos += 8
        if flags & 0x003C:
            if flags & 0x0020:  # type
                pos += 1 + payload[pos]
            if flags & 0x0010:  # user_id
                pos += 1 + payload[pos]
            if flags & 0x0008:  # app_id
                pos += 1 + payload[pos]
            if flags & 0x0004:  # cluster_id
                pos += 1 + payload[pos]
    except IndexError:
        return "truncated properties"
    return None if pos == n else _leftover(n, pos)


def _leftover(n: int, end: int) -> str:
    if n < end:
        return "truncated properties"
    return f"{n - end} bytes after the properties"


def _after_headers(payload, flags: int) -> int:
    """Where the properties after `headers` start (delivery_mode, then priority)."""
    pos = HEADER_PREFIX
    if flags & 0x8000:  # content_type
        pos += 1 + payload[pos]
    if flags & 0x4000:  # content_encoding
        pos += 1 + payload[pos]
    if flags & FLAG_HEADERS:
        pos += 4 + _I.unpack_from(payload, pos)[0]
    return pos


def delivery_mode(payload) -> int:
    """The delivery mode (2 = persistent) without decoding other properties."""
    flags = (payload[12] << 8) | payload[13]
    if not flags & FLAG_DELIVERY_MODE:
        return 1
    return payload[_after_headers(payload, flags)]


def priority(payload) -> int:
    """The priority property (0 when absent, as RabbitMQ counts it) without decoding other
    properties: a priority queue reads it for every message it stores."""
    flags = (payload[12] << 8) | payload[13]
    if not flags & 0x0800:  # priority
        return 0
    return payload[_after_headers(payload, flags) + (1 if flags & FLAG_DELIVERY_MODE else 0)]


def encode_header(body_size: int, props: dict) -> bytes:
    """Build a content header payload from properties (for messages the broker makes)."""
    flags = 0
    parts = []
    for name, bit, kind in PROPERTIES:
        value = props.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "shortstr":
            parts.append(shortstr(value))
        elif kind == "table":
            parts.append(encode_table(value))
        elif kind == "octet":
            parts.append(bytes((value,)))
        else:
            parts.append(_Q.pack(value))
    return _HHQH.pack(60, 0, body_size, flags) + b"".join(parts)
