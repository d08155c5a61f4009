"""Encoding and decoding of AMQP 0-9-1 field values, with RabbitMQ's table types.

Tables decode to dicts of plain Python values; long strings become str when they are
valid UTF-8 and bytes otherwise, so binary headers survive a round trip.
"""

import datetime
import decimal
import math
import struct
import sys

from .constants import SYNTAX_ERROR


# How deep field tables and arrays may nest. Every walk of a decoded table (encoding it again,
# printing it for rabbitmqctl, the management API's JSON, the definitions file) recurses, so
# the depth the wire accepts is bounded here, once, below what those walks can take (the
# server raises the interpreter's recursion limit to match). RabbitMQ has no such bound.
MAX_NESTING = 1000
# Those walks take at most a few Python frames per level (deepcopy three, the printers two);
# the entry points (warren server, warrenctl) raise the interpreter's limit to this.
RECURSION_LIMIT = 10 * MAX_NESTING


def allow_nesting() -> None:
    """Let every walk of a table nested MAX_NESTING deep run (see RECURSION_LIMIT)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


class DecodeError(Exception):
    """A malformed field: the peer gets 502 SYNTAX_ERROR (or 501 for framing)."""

    code = SYNTAX_ERROR


class MalformedUTF8(DecodeError):
    """A shortstr that is not UTF-8 (RabbitMQ: 501 "Malformed UTF-8 in shortstr")."""


class TooDeep(DecodeError):
    """A field table or array nested deeper than MAX_NESTING."""


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


def typed_int(type_name: str, value: int) -> int:
    """An integer that goes on the wire as the given AMQP type ("long": 'l', "short": 's'...),
    where RabbitMQ checks a value's type (x-max-hops must be a long); "timestamp" is a 'T' too
    large for a datetime, as decode_table gives one."""
    cls = {"byte": _byte, "unsignedbyte": _unsignedbyte, "short": _short, "unsignedshort": _unsignedshort,
           "signedint": _signedint, "unsignedint": _unsignedint, "long": _long,
           "unsignedlong": _unsignedlong, "timestamp": _timestamp}[type_name]
    return cls(value)


def typed_float(type_name: str, value: float) -> float:
    """A number that goes on the wire as "double" ('d') or "float" ('f')."""
    return (_double if type_name == "double" else _float)(value)


class _LongstrBytes(bytes):
    """A longstr ('S') that is not valid UTF-8: bytes like a byte array ('x'), but encoded
    back as a longstr."""

    __slots__ = ()


def longstr_bytes(raw: bytes) -> bytes:
    """A longstr of bytes that are not UTF-8, as decode_table gives one (a byte array is
    plain bytes)."""
    return _LongstrBytes(raw)


def shortstr(value) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")  # names read by read_shortstr
    if len(value) > 255:
        raise ValueError("shortstr longer than 255 bytes")
    return bytes((len(value),)) + value


def longstr(value) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return _I.pack(len(value)) + value


def _shortstr_bytes(buf, pos: int):
    try:
        n = buf[pos]
    except IndexError:
        raise DecodeError("truncated shortstr") from None
    end = pos + 1 + n
    if end > len(buf):
        raise DecodeError("truncated shortstr")
    return bytes(buf[pos + 1:end]), end


def read_shortstr(buf, pos: int):
    """A shortstr where RabbitMQ takes any bytes (basic.publish's exchange and routing key,
    content properties, field-table keys in content): bytes that are not UTF-8 become lone
    surrogates ('surrogateescape'), which shortstr() turns back into the same bytes."""
    raw, end = _shortstr_bytes(buf, pos)
    return raw.decode("utf-8", "surrogateescape"), end


def read_shortstr_utf8(buf, pos: int):
    """A shortstr of a method argument: RabbitMQ refuses one that is not UTF-8."""
    raw, end = _shortstr_bytes(buf, pos)
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


def read_table(buf, pos: int, strict: bool = False):
    raw, end = read_longstr_raw(buf, pos)
    return decode_table(raw, strict), end


# Field types and the bytes of their values, as RabbitMQ's rabbit_binary_parser reads them.
_FIXED_SIZE = {0x74: 1, 0x62: 1, 0x42: 1, 0x73: 2, 0x75: 2, 0x49: 4, 0x69: 4, 0x66: 4,  # t b B s u I i f
               0x6C: 8, 0x4C: 8, 0x64: 8, 0x54: 8, 0x44: 5, 0x56: 0}                   # l L d T D V
_TABLE, _ARRAY, _LONGSTR, _BYTES, _FLOAT, _DOUBLE = 0x46, 0x41, 0x53, 0x78, 0x66, 0x64


def _finite(value: float) -> float:
    # Erlang has no NaN or infinity: RabbitMQ's parser does not match them (its reader
    # crashes), so a table a peer sends holding one is malformed.
    if value != value or value in (math.inf, -math.inf):
        raise DecodeError("a float that is not a finite number")
    return value


def _timestamp_value(ts: int):
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (OverflowError, ValueError, OSError):  # past year 9999 (e.g. milliseconds)
        return _timestamp(ts)


def _decimal(buf, pos):
    return decimal.Decimal(_i.unpack_from(buf, pos + 1)[0]).scaleb(-buf[pos])


# Readers of the fixed-size values: (buf, pos) -> value.
_SCALAR = {
    0x49: lambda b, p: _signedint(_i.unpack_from(b, p)[0]),
    0x6C: lambda b, p: _long(_q.unpack_from(b, p)[0]),
    0x74: lambda b, p: bool(b[p]),
    0x62: lambda b, p: _byte(_b.unpack_from(b, p)[0]),
    0x42: lambda b, p: _unsignedbyte(b[p]),
    0x73: lambda b, p: _short(_h.unpack_from(b, p)[0]),
    0x75: lambda b, p: _unsignedshort(_H.unpack_from(b, p)[0]),
    0x69: lambda b, p: _unsignedint(_I.unpack_from(b, p)[0]),
    0x4C: lambda b, p: _unsignedlong(_Q.unpack_from(b, p)[0]),  # L (unsigned 64, rarely sent)
    0x66: lambda b, p: _float(_f.unpack_from(b, p)[0]),
    0x64: lambda b, p: _double(_d.unpack_from(b, p)[0]),
    0x44: _decimal,
    0x54: lambda b, p: _timestamp_value(_Q.unpack_from(b, p)[0]),
    0x56: lambda b, p: None,
}
_SCALAR_STRICT = {**_SCALAR,
                  0x66: lambda b, p: _float(_finite(_f.unpack_from(b, p)[0])),
                  0x64: lambda b, p: _double(_finite(_d.unpack_from(b, p)[0]))}


def decode_table(raw, strict: bool = False) -> dict:
    """A field table's content (without its length prefix) as a dict.

    Without recursion, so no depth a peer sends reaches Python's recursion limit; nesting
    beyond MAX_NESTING (the table itself is level 1) is refused. `strict` is for the tables
    of methods: their floats must be finite, as RabbitMQ's parser requires, and their keys
    UTF-8 (RabbitMQ takes any bytes, but these keys become names in the definitions file
    and the management API). Otherwise keys are read as read_shortstr reads them."""
    read_key = read_shortstr_utf8 if strict else read_shortstr
    scalar = _SCALAR_STRICT if strict else _SCALAR
    buf = raw if isinstance(raw, memoryview) else memoryview(raw)
    table: dict = {}
    items: dict | list = table   # the table or array being filled
    pos, end = 0, len(buf)
    outer: list = []             # (items, buf, pos after it) of the enclosing containers
    try:
        while True:
            if pos >= end:
                if pos > end:
                    raise DecodeError("truncated field value")
                if not outer:
                    return table
                items, buf, pos = outer.pop()
                end = len(buf)
                continue
            key = None
            if items.__class__ is dict:
                key, pos = read_key(buf, pos)
            kind = buf[pos]
            pos += 1
            size = _FIXED_SIZE.get(kind)
            if size is not None:
                if pos + size > end:
                    raise DecodeError("truncated field value")
                value = scalar[kind](buf, pos)
                pos += size
            elif kind in (_LONGSTR, _BYTES, _TABLE, _ARRAY):
                if pos + 4 > end:
                    raise DecodeError("truncated field value")
                (n,) = _I.unpack_from(buf, pos)
                start, stop = pos + 4, pos + 4 + n
                if stop > end:
                    raise DecodeError("truncated field value")
                if kind == _LONGSTR:
                    value = _text(bytes(buf[start:stop]))
                elif kind == _BYTES:
                    value = bytes(buf[start:stop])
                else:
                    if len(outer) + 2 > MAX_NESTING:
                        raise TooDeep(f"field table nested deeper than {MAX_NESTING} levels")
                    value = {} if kind == _TABLE else []
                    _store(items, key, value)
                    outer.append((items, buf, stop))
                    items, buf, pos, end = value, buf[start:stop], 0, n
                    continue
                pos = stop
            else:
                raise DecodeError(f"unknown field type {chr(kind)!r}")
            _store(items, key, value)
    except (struct.error, IndexError):
        raise DecodeError("truncated field value") from None


def _store(items, key, value) -> None:
    if key is None:
        items.append(value)
    else:
        items[key] = value


# What follows a field's type octet, by the octet (table_error): the size of a fixed-size
# value, or one of these.
_STRING, _CONTAINER, _REAL, _UNKNOWN = -1, -2, -3, -4
_STEP = tuple(_STRING if k in (_LONGSTR, _BYTES) else _CONTAINER if k in (_TABLE, _ARRAY)
              else _REAL if k in (_FLOAT, _DOUBLE) else _FIXED_SIZE.get(k, _UNKNOWN) for k in range(256))


def table_error(buf, pos: int, end: int) -> str | None:
    """Why the field table in buf[pos:end] (its content, after the length) is malformed, or
    None: the checks of decode_table (RabbitMQ's parser: known types, every value inside
    its table, finite floats, and MAX_NESTING), without building anything. Keys may be any
    bytes, as in RabbitMQ.

    This runs for every published headers table not seen just before (a Celery task's 19
    headers: 2.2 µs, 3.0 with a dict lookup and float test per field), so a field's type
    octet indexes a tuple of steps, and a value that runs past its container's end is caught
    when the next field starts."""
    in_array = False
    outer: list = []  # (end, in_array) of the enclosing containers
    step_of = _STEP
    length = _I.unpack_from
    try:
        while True:
            if pos >= end:
                if pos > end:
                    return "truncated field value"
                if not outer:
                    return None
                end, in_array = outer.pop()
                continue
            if not in_array:
                pos += 1 + buf[pos]  # the key
                if pos >= end:
                    return "truncated field table"
            kind = buf[pos]
            step = step_of[kind]
            pos += 1
            if step >= 0:
                pos += step
            elif step == _STRING:
                pos += 4 + length(buf, pos)[0]
            elif step == _CONTAINER:
                if pos + 4 > end:
                    return "truncated field value"
                stop = pos + 4 + length(buf, pos)[0]
                if stop > end:
                    return "truncated field value"
                if len(outer) + 2 > MAX_NESTING:
                    return f"field table nested deeper than {MAX_NESTING} levels"
                outer.append((end, in_array))
                pos, end, in_array = pos + 4, stop, kind == _ARRAY
            elif step == _REAL:
                size = 8 if kind == _DOUBLE else 4
                if pos + size > end:
                    return "truncated field value"
                value = (_d if kind == _DOUBLE else _f).unpack_from(buf, pos)[0]
                if value != value or value in (math.inf, -math.inf):
                    return "a float that is not a finite number"
                pos += size
            else:
                return f"unknown field type {chr(kind)!r}"
    except (struct.error, IndexError):
        return "truncated field value"


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
