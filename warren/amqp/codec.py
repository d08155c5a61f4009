"""Encoding and decoding of AMQP 0-9-1 field values, with RabbitMQ's table types.

Tables decode to dicts of plain Python values; long strings become str when they are
valid UTF-8 and bytes otherwise, so binary headers survive a round trip.
"""

import datetime
import decimal
import struct

from .constants import SYNTAX_ERROR


class DecodeError(Exception):
    """A malformed field: the peer gets 502 SYNTAX_ERROR (or 501 for framing)."""

    code = SYNTAX_ERROR


class MalformedUTF8(DecodeError):
    """A shortstr that is not UTF-8 (RabbitMQ: 501 "Malformed UTF-8 in shortstr")."""


_B = struct.Struct(">B")
_b = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")


class _TypedInt(int):
    """An integer field value that remembers its wire type, for RabbitMQ's error texts."""

    __slots__ = ()
    type_name = "long"


class _TypedFloat(float):
    __slots__ = ()
    type_name = "double"


def _typed(base, name):
    # Named after the module attribute it is bound to, so that pickle can find it.
    return type(name, (base,), {"__slots__": (), "type_name": name, "__qualname__": "_" + name})


_byte, _unsignedbyte, _short, _unsignedshort = (_typed(_TypedInt, n) for n in
                                                 ("byte", "unsignedbyte", "short", "unsignedshort"))
_signedint, _unsignedint, _long, _unsignedlong = (_typed(_TypedInt, n) for n in
                                                  ("signedint", "unsignedint", "long", "unsignedlong"))
_float, _double = _typed(_TypedFloat, "float"), _typed(_TypedFloat, "double")
_timestamp = _typed(_TypedInt, "timestamp")  # a 'T' too large for a datetime

# How a decoded typed number goes back on the wire: in the type it came in.
_WIRE = {"byte": (b"b", _b), "unsignedbyte": (b"B", _B), "short": (b"s", _h), "unsignedshort": (b"u", _H),
         "signedint": (b"I", _i), "unsignedint": (b"i", _I), "long": (b"l", _q), "unsignedlong": (b"L", _Q),
         "float": (b"f", _f), "double": (b"d", _d), "timestamp": (b"T", _Q)}


class _LongstrBytes(bytes):
    """A longstr ('S') that is not valid UTF-8: bytes like a byte array ('x'), but encoded
    back as a longstr."""

    __slots__ = ()


def shortstr(value) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    if len(value) > 255:
        raise ValueError("shortstr longer than 255 bytes")
    return bytes((len(value),)) + value


def longstr(value) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    return _I.pack(len(value)) + value


def read_shortstr(buf, pos: int):
    try:
        n = buf[pos]
    except IndexError:
        raise DecodeError("truncated shortstr") from None
    end = pos + 1 + n
    if end > len(buf):
        raise DecodeError("truncated shortstr")
    raw = bytes(buf[pos + 1:end])
    try:
        return raw.decode(), end
    except UnicodeDecodeError:
        raise MalformedUTF8("shortstr is not valid UTF-8") from None


def read_longstr_raw(buf, pos: int):
    if pos + 4 > len(buf):
        raise DecodeError("truncated longstr")
    (n,) = _I.unpack_from(buf, pos)
    end = pos + 4 + n
    if end > len(buf):
        raise DecodeError("truncated longstr")
    return bytes(buf[pos + 4:end]), end


def _text(raw: bytes):
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return _LongstrBytes(raw)


def read_table(buf, pos: int):
    raw, end = read_longstr_raw(buf, pos)
    return decode_table(raw), end


def decode_table(raw) -> dict:
    table = {}
    pos, n = 0, len(raw)
    while pos < n:
        key, pos = read_shortstr(raw, pos)
        value, pos = _read_value(raw, pos)
        table[key] = value
    return table


def _read_array(buf, pos):
    raw, end = read_longstr_raw(buf, pos)
    items, p = [], 0
    while p < len(raw):
        value, p = _read_value(raw, p)
        items.append(value)
    return items, end


def _read_value(buf, pos):
    try:
        kind = buf[pos]
        pos += 1
        if kind == 0x53:  # S
            raw, pos = read_longstr_raw(buf, pos)
            return _text(raw), pos
        if kind == 0x49:  # I
            return _signedint(_i.unpack_from(buf, pos)[0]), pos + 4
        if kind == 0x6C:  # l
            return _long(_q.unpack_from(buf, pos)[0]), pos + 8
        if kind == 0x74:  # t
            return bool(buf[pos]), pos + 1
        if kind == 0x46:  # F
            return read_table(buf, pos)
        if kind == 0x41:  # A
            return _read_array(buf, pos)
        if kind == 0x62:  # b
            return _byte(_b.unpack_from(buf, pos)[0]), pos + 1
        if kind == 0x42:  # B
            return _unsignedbyte(buf[pos]), pos + 1
        if kind == 0x73:  # s
            return _short(_h.unpack_from(buf, pos)[0]), pos + 2
        if kind == 0x75:  # u
            return _unsignedshort(_H.unpack_from(buf, pos)[0]), pos + 2
        if kind == 0x69:  # i
            return _unsignedint(_I.unpack_from(buf, pos)[0]), pos + 4
        if kind == 0x4C:  # L (unsigned 64, rarely sent)
            return _unsignedlong(_Q.unpack_from(buf, pos)[0]), pos + 8
        if kind == 0x66:  # f
            return _float(_f.unpack_from(buf, pos)[0]), pos + 4
        if kind == 0x64:  # d
            return _double(_d.unpack_from(buf, pos)[0]), pos + 8
        if kind == 0x44:  # D
            scale = buf[pos]
            (value,) = _i.unpack_from(buf, pos + 1)
            return decimal.Decimal(value).scaleb(-scale), pos + 5
        if kind == 0x54:  # T
            (ts,) = _Q.unpack_from(buf, pos)
            try:
                return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc), pos + 8
            except (OverflowError, ValueError, OSError):  # past year 9999 (e.g. milliseconds)
                return _timestamp(ts), pos + 8
        if kind == 0x78:  # x
            raw, pos = read_longstr_raw(buf, pos)
            return raw, pos
        if kind == 0x56:  # V
            return None, pos
    except (struct.error, IndexError):
        raise DecodeError("truncated field value") from None
    raise DecodeError(f"unknown field type {chr(kind)!r}")


def encode_table(table) -> bytes:
    if not table:
        return b"\x00\x00\x00\x00"
    parts = []
    for key, value in table.items():
        parts.append(shortstr(key))
        parts.append(_encode_value(value))
    body = b"".join(parts)
    return _I.pack(len(body)) + body


def _encode_value(value) -> bytes:
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, (_TypedInt, _TypedFloat)):  # decoded: back in its wire type
        letter, packer = _WIRE[value.type_name]
        return letter + packer.pack(value)
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + _i.pack(value)
        return b"l" + _q.pack(value)
    if isinstance(value, str):
        return b"S" + longstr(value)
    if isinstance(value, _LongstrBytes):
        return b"S" + longstr(bytes(value))
    if isinstance(value, (bytes, bytearray)):  # a byte array, as RabbitMQ and pika use 'x'
        return b"x" + longstr(bytes(value))
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, (list, tuple)):
        body = b"".join(_encode_value(v) for v in value)
        return b"A" + _I.pack(len(body)) + body
    if isinstance(value, float):
        return b"d" + _d.pack(value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):  # "n", "N", "F": NaN and infinities have no AMQP decimal
            raise TypeError(f"cannot encode decimal {value} in a field table")
        scale = max(0, -exponent)
        unscaled = int(value.scaleb(scale))
        return b"D" + bytes((scale,)) + _i.pack(unscaled)
    if isinstance(value, datetime.datetime):
        return b"T" + _Q.pack(int(value.timestamp()))
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in a field table")


def table_type_name(value) -> str:
    """RabbitMQ's name for a decoded value's type, as used in its error texts."""
    # Plain (not decoded) ints: clients (pika, py-amqp, the Java client) send 'I'
    # (signedint) when the value fits and 'l' (long) otherwise. bytes come from 'x'.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (_TypedInt, _TypedFloat)):  # decoded: the type it had on the wire
        return value.type_name
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, (str, _LongstrBytes)):
        return "longstr"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if value is None:
        return "void"
    return type(value).__name__


def table_type_class(value) -> str:
    """RabbitMQ's type class (every integer width alike, both float widths alike), which it
    compares when checking arguments for equivalence."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return table_type_name(value)
