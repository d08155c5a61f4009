"""Field tables and method frames: encode/decode round trips and malformed input."""

import datetime
import decimal
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.amqp import spec
from warren.amqp.codec import DecodeError, decode_table, encode_table, read_table, table_type_name

UTC = datetime.timezone.utc

# ----------------------------------------------------------- wire-level values
# Each strategy yields (wire bytes of one field value, RabbitMQ's type name, expected Python value).


def _packed(letter, fmt, type_name, values):
    return values.map(lambda v: (letter + struct.pack(fmt, v), type_name, v))


def _longstr(letter, type_name, raw):
    return raw.map(lambda b: (letter + struct.pack(">I", len(b)) + b, type_name, b))


def _decimal(scale_unscaled):
    scale, unscaled = scale_unscaled
    return (b"D" + struct.pack(">Bi", scale, unscaled), "decimal", decimal.Decimal(unscaled).scaleb(-scale))


def _timestamp(ts):
    return (b"T" + struct.pack(">Q", ts), "timestamp",
            datetime.datetime.fromtimestamp(ts, UTC) if ts <= 253402300799 else ts)


SCALARS = st.one_of(
    _packed(b"b", ">b", "byte", st.integers(-128, 127)),
    _packed(b"B", ">B", "unsignedbyte", st.integers(0, 255)),
    _packed(b"s", ">h", "short", st.integers(-2**15, 2**15 - 1)),
    _packed(b"u", ">H", "unsignedshort", st.integers(0, 2**16 - 1)),
    _packed(b"I", ">i", "signedint", st.integers(-2**31, 2**31 - 1)),
    _packed(b"i", ">I", "unsignedint", st.integers(0, 2**32 - 1)),
    _packed(b"l", ">q", "long", st.integers(-2**63, 2**63 - 1)),
    _packed(b"f", ">f", "float", st.floats(width=32, allow_nan=False)),
    _packed(b"d", ">d", "double", st.floats(allow_nan=False)),
    _packed(b"t", ">B", "bool", st.sampled_from([0, 1])).map(lambda t: (t[0], "bool", bool(t[2]))),
    st.tuples(st.integers(0, 20), st.integers(-2**31, 2**31 - 1)).map(_decimal),
    st.integers(0, 2**64 - 1).map(_timestamp),
    _longstr(b"S", "longstr", st.text(max_size=20).map(str.encode)).map(lambda t: (t[0], t[1], t[2].decode())),
    _longstr(b"S", "longstr", st.sampled_from([b"\xff", b"a\xc3", b"\x80abc"])),  # not UTF-8: kept as bytes
    _longstr(b"x", "binary", st.binary(max_size=20)),
    st.just((b"V", "void", None)),
)

KEYS = st.text(max_size=12)


def _table(items):
    body = b"".join(bytes((len(k.encode()),)) + k.encode() + raw for k, (raw, _, _) in items.items())
    return (b"F" + struct.pack(">I", len(body)) + body, "table", {k: v for k, (_, _, v) in items.items()})


def _array(items):
    body = b"".join(raw for raw, _, _ in items)
    return (b"A" + struct.pack(">I", len(body)) + body, "array", [v for _, _, v in items])


WIRE_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.dictionaries(KEYS, inner, max_size=4).map(_table),
                            st.lists(inner, max_size=4).map(_array)),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equality that also tells bool from int, str from bytes, -0.0 from 0.0, 1.5 from 1.50."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return isinstance(b, float) and a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, decimal.Decimal):
        return isinstance(b, decimal.Decimal) and a.as_tuple() == b.as_tuple()
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int):
        return isinstance(b, int) and a == b
    if isinstance(a, bytes):
        return isinstance(b, bytes) and a == b
    return type(a) is type(b) and a == b


@settings(max_examples=250, deadline=None)
@given(st.dictionaries(KEYS, WIRE_VALUES, max_size=6))
def test_wire_tables_decode_and_reencode_byte_exactly(items):
    raw, _, expected = _table(items)
    table_bytes = raw[1:]  # without the 'F'
    decoded, end = read_table(table_bytes, 0)
    assert end == len(table_bytes)
    assert same(expected, decoded)
    for key, (_, type_name, _) in items.items():
        assert table_type_name(decoded[key]) == type_name
    # Every type goes back on the wire as it came: width, signedness, longstr vs byte array.
    assert encode_table(decoded) == table_bytes


PLAIN = st.recursive(
    st.one_of(
        st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20), st.binary(max_size=20),
        st.floats(allow_nan=False, allow_infinity=False), st.none(),  # a peer's infinity: test_codec_hardening
        st.tuples(st.integers(0, 20), st.integers(-2**31, 2**31 - 1)).map(
            lambda t: decimal.Decimal(t[1]).scaleb(-t[0])),
        st.integers(0, 253402300799).map(lambda ts: datetime.datetime.fromtimestamp(ts, UTC)),
    ),
    lambda inner: st.one_of(st.dictionaries(KEYS, inner, max_size=4), st.lists(inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=250, deadline=None)
@given(st.dictionaries(KEYS, PLAIN, max_size=6))
def test_python_values_round_trip(table):
    encoded = encode_table(table)
    assert struct.unpack(">I", encoded[:4])[0] == len(encoded) - 4
    assert same(table, decode_table(encoded[4:]))


def test_python_value_wire_types():
    enc = encode_table({"i": 1, "big": 2**40, "s": "é", "b": b"\x00", "t": True, "f": 1.5, "v": None,
                        "d": decimal.Decimal("1.50"), "ts": datetime.datetime.fromtimestamp(7, UTC)})
    assert enc[4:] == (b"\x01iI\x00\x00\x00\x01" + b"\x03bigl" + struct.pack(">q", 2**40)
                       + b"\x01sS\x00\x00\x00\x02\xc3\xa9" + b"\x01bx\x00\x00\x00\x01\x00" + b"\x01tt\x01"
                       + b"\x01fd" + struct.pack(">d", 1.5) + b"\x01vV" + b"\x01dD\x02\x00\x00\x00\x96"
                       + b"\x02tsT" + struct.pack(">Q", 7))
    assert encode_table({}) == encode_table(None) == b"\x00\x00\x00\x00"


def test_huge_timestamp_decodes():
    """A timestamp past year 9999 (a client sending milliseconds) must not break decoding."""
    raw = b"\x01tT" + struct.pack(">Q", 1_700_000_000_000)
    table = decode_table(raw)
    assert table["t"] == 1_700_000_000_000 and table_type_name(table["t"]) == "timestamp"
    assert encode_table(table)[4:] == raw


# ---------------------------------------------------------------- truncation


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, WIRE_VALUES, min_size=1, max_size=4), st.data())
def test_truncated_tables_raise_decode_error(items, data):
    raw = _table(items)[0][1:]
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        read_table(raw[:cut], 0)


@pytest.mark.parametrize("raw", [
    b"\x01aI\x00\x00",                 # signedint needs 4 bytes
    b"\x01aS\x00\x00\x00\x05ab",       # longstr longer than the table
    b"\x01ax\x00\x00",                 # byte array length cut
    b"\x01aD\x02",                     # decimal cut
    b"\x01aT\x00\x00\x00",             # timestamp cut
    b"\x01aF\x00\x00\x00\x09\x01bV",   # nested table longer than its parent
    b"\x01aA\x00\x00\x00\x02I\x00",    # array element cut inside the array
    b"\x05ab",                         # key cut
    b"\x01a",                          # no value type
    b"\x01aZ\x00",                     # unknown type
])
def test_malformed_tables_raise_decode_error(raw):
    for strict in (False, True):
        with pytest.raises(DecodeError):
            decode_table(raw, strict)


def test_a_key_that_is_not_utf8_is_refused_only_in_method_tables():
    """RabbitMQ takes any bytes as a key; Warren too, except in a method's table (its keys
    become names in the definitions file and the management API)."""
    with pytest.raises(DecodeError):
        decode_table(b"\x02\xff\xfeV", strict=True)
    table = decode_table(b"\x02\xff\xfeV")
    assert encode_table(table)[4:] == b"\x02\xff\xfeV"


# ------------------------------------------------------------------- methods


def field_strategy(kind):
    return {
        "octet": st.integers(0, 255),
        "short": st.integers(0, 2**16 - 1),
        "long": st.integers(0, 2**32 - 1),
        "longlong": st.integers(0, 2**64 - 1),
        "shortstr": st.text(max_size=60),
        "longstr": st.binary(max_size=40),
        "bit": st.booleans(),
        "table": st.dictionaries(KEYS, PLAIN, max_size=3),
    }[kind]


@st.composite
def methods(draw):
    cls = draw(st.sampled_from(sorted(spec.BY_ID.values(), key=lambda c: (c.CLASS_ID, c.METHOD_ID))))
    return cls(**{field: draw(field_strategy(kind)) for field, kind in cls.FIELDS})


@settings(max_examples=600, deadline=None)
@given(methods())
def test_methods_round_trip(method):
    payload = spec.encode_method(method)
    assert struct.unpack(">HH", payload[:4]) == (method.CLASS_ID, method.METHOD_ID)
    decoded = spec.decode_method(payload)
    assert type(decoded) is type(method) and decoded == method
    assert spec.encode_method(decoded) == payload


@settings(max_examples=300, deadline=None)
@given(methods(), st.data())
def test_truncated_methods_raise_decode_error(method, data):
    payload = spec.encode_method(method)
    if len(payload) == 4:  # no fields: nothing to cut but the ids
        cut = data.draw(st.integers(0, 3))
    else:
        cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(DecodeError):
        spec.decode_method(payload[:cut])


def test_bits_pack_into_shared_octets():
    m = spec.QueueDeclare(queue="q", passive=False, durable=True, exclusive=False, auto_delete=True,
                          nowait=True, arguments={})
    assert spec.encode_method(m) == b"\x00\x32\x00\x0a\x00\x00\x01q\x1a\x00\x00\x00\x00"
    nine = spec.BasicPublish(exchange="", routing_key="", mandatory=True, immediate=False)
    assert spec.encode_method(nine) == b"\x00\x3c\x00\x28\x00\x00\x00\x00\x01"


def test_unknown_method_and_bad_shortstr():
    with pytest.raises(DecodeError):
        spec.decode_method(b"\x00\x32\x00\x63")
    with pytest.raises(DecodeError):  # queue name not UTF-8
        spec.decode_method(b"\x00\x32\x00\x0a\x00\x00\x01\xff\x00\x00\x00\x00\x00")
    with pytest.raises(DecodeError):
        spec.decode_method(b"\x00\x32")
