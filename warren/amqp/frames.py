"""Frame encoding, and the hand-written codecs of the hot path.

pamqp-style generic codecs cost several microseconds a method; publish, deliver and ack
are done here with precompiled structs, and a delivered message reuses the publisher's
content header bytes unchanged.
"""

import struct

from .body import Body, SplitBody
from .constants import FRAME_BODY, FRAME_END_BYTE, FRAME_HEADER, FRAME_METHOD
from .spec import Method, encode_method

FRAME_HEAD = struct.Struct(">BHI")
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_QB = struct.Struct(">QB")
_Q = struct.Struct(">Q")
_QBB = struct.Struct(">QB")
_I = struct.Struct(">I")
_pack_head = FRAME_HEAD.pack
_DELIVER_ID = b"\x00\x3c\x00\x3c"  # basic.deliver
_GET_OK_ID = b"\x00\x3c\x00\x47"   # basic.get-ok
_ACK_ID = b"\x00\x3c\x00\x50"      # basic.ack
_NACK_ID = b"\x00\x3c\x00\x78"     # basic.nack


def method_frame(channel: int, method: Method) -> bytes:
    payload = encode_method(method)
    return _pack_head(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def content_frames(out: list, channel: int, header: bytes, body: Body, frame_max: int) -> None:
    """Append the header frame and body frames of a message to `out`: the body's own bytes
    (views of it), never a copy."""
    out.append(_pack_head(FRAME_HEADER, channel, len(header)))
    out.append(header)
    out.append(FRAME_END_BYTE)
    size = len(body)
    if not size:
        return
    limit = frame_max - 8
    if isinstance(body, SplitBody):
        _split_body_frames(out, channel, body.parts, size, limit)
        return
    if size <= limit:
        out.append(_pack_head(FRAME_BODY, channel, size))
        out.append(body)
        out.append(FRAME_END_BYTE)
        return
    view = memoryview(body)
    for start in range(0, size, limit):
        chunk = view[start:start + limit]
        out.append(_pack_head(FRAME_BODY, channel, len(chunk)))
        out.append(chunk)
        out.append(FRAME_END_BYTE)


def _split_body_frames(out: list, channel: int, parts: list, size: int, limit: int) -> None:
    """Body frames of at most `limit` octets over a body kept in parts (a frame may take the
    end of one part and the start of the next)."""
    index = 0
    part = memoryview(parts[0])
    pos = 0
    while size:
        n = limit if size > limit else size
        size -= n
        out.append(_pack_head(FRAME_BODY, channel, n))
        while n:
            avail = len(part) - pos
            if not avail:
                index += 1
                part = memoryview(parts[index])
                pos = 0
                continue
            take = avail if avail < n else n
            out.append(part[pos:pos + take])
            pos += take
            n -= take
        out.append(FRAME_END_BYTE)


def deliver_prefix(consumer_tag: str) -> bytes:
    """The constant start of a consumer's basic.deliver payload (ids + consumer tag)."""
    tag = consumer_tag.encode()
    return _DELIVER_ID + bytes((len(tag),)) + tag


def deliver_frame(channel: int, prefix: bytes, delivery_tag: int, redelivered: bool,
                  route: bytes) -> bytes:
    """basic.deliver: `route` is the exchange and routing key shortstrs as published."""
    size = len(prefix) + 9 + len(route)
    return b"".join((_pack_head(FRAME_METHOD, channel, size), prefix,
                     _QB.pack(delivery_tag, redelivered), route, FRAME_END_BYTE))


def get_ok_frame(channel: int, delivery_tag: int, redelivered: bool, route: bytes,
                 message_count: int) -> bytes:
    size = 4 + 9 + len(route) + 4
    return b"".join((_pack_head(FRAME_METHOD, channel, size), _GET_OK_ID,
                     _QB.pack(delivery_tag, redelivered), route, _I.pack(message_count),
                     FRAME_END_BYTE))


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _pack_head(FRAME_METHOD, channel, 13) + _ACK_ID + _QB.pack(delivery_tag, multiple) + FRAME_END_BYTE


def nack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    # bits: multiple (bit 0), requeue (bit 1): set, as RabbitMQ's basic.nack record default
    # (rabbit_channel sends #'basic.nack'{} with only the tag and multiple filled in).
    return (_pack_head(FRAME_METHOD, channel, 13) + _NACK_ID + _QB.pack(delivery_tag, 2 | multiple)
            + FRAME_END_BYTE)
