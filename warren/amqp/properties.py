"""Content header properties (basic class).

The broker keeps a message's content header payload exactly as the publisher sent it; these
helpers read the few properties routing needs without decoding the rest.
"""

import struct

from .codec import DecodeError, encode_table, read_shortstr, read_table, shortstr

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
    """All properties present in a content header payload, by name."""
    _, _, flags = parse_header(payload)
    pos = HEADER_PREFIX
    word = flags
    while word & 1:  # continuation flag words (never used by basic, but legal)
        (word,) = struct.unpack_from(">H", payload, pos)
        pos += 2
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


def delivery_mode(payload) -> int:
    """The delivery mode (2 = persistent) without decoding other properties."""
    flags = (payload[12] << 8) | payload[13]
    if not flags & FLAG_DELIVERY_MODE:
        return 1
    pos = HEADER_PREFIX
    if flags & 0x8000:
        pos += 1 + payload[pos]
    if flags & 0x4000:
        pos += 1 + payload[pos]
    if flags & FLAG_HEADERS:
        pos += 4 + _I.unpack_from(payload, pos)[0]
    return payload[pos]


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
