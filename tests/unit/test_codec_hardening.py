"""The codec against hostile input: content-header validation (properties_error and
table_error agree with the decoders), nesting up to MAX_NESTING without recursion, every
walk of a table that deep, names that are not UTF-8, and how decode_method orders its
errors as RabbitMQ does."""

import copy
import json
import math
import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.amqp import codec, spec
from warren.amqp.codec import (MAX_NESTING, DecodeError, MalformedUTF8, TooDeep, decode_table, encode_table,
                               read_shortstr, shortstr, table_error)
from warren.amqp.erlang import erl_ctl, erl_json, erl_term
from warren.amqp import properties
from warren.amqp.properties import decode_properties, encode_header


def properties_error(payload):
    """properties.properties_error with the flags word read from the payload, as the channel does."""
    return properties.properties_error(payload, int.from_bytes(payload[12:14], "big") if len(payload) >= 14 else 0)


def nested(depth: int, kind: bytes = b"F") -> bytes:
    """The content of a table nested `depth` levels (itself level 1), with tables (F) or,
    below the first level, arrays (A)."""
    inner = b"I\x00\x00\x00\x01"
    for _ in range(depth - 1):
        if kind == b"F":
            inner = b"F" + struct.pack(">I", len(inner) + 2) + b"\x01a" + inner
        else:
            inner = b"A" + struct.pack(">I", len(inner)) + inner
    return b"\x01a" + inner


def depth_of(value) -> int:
    depth = 0
    while isinstance(value, (dict, list)):
        depth += 1
        value = value["a"] if isinstance(value, dict) else value[0]
    return depth


@pytest.fixture
def deep_walks():
    """The recursion limit the server and warrenctl run with (codec.allow_nesting)."""
    before = sys.getrecursionlimit()
    codec.allow_nesting()
    yield
    sys.setrecursionlimit(before)


# ------------------------------------------------------------------------ nesting

@pytest.fixture
def default_recursion_limit():
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, below what a recursive decoder would need
    yield
    sys.setrecursionlimit(before)


@pytest.mark.parametrize("kind", [b"F", b"A"])
def test_decoding_to_the_cap_needs_no_recursion(default_recursion_limit, kind):
    # The decoder and the validator keep their own stack.
    raw = nested(MAX_NESTING, kind)
    assert depth_of(decode_table(raw)) == MAX_NESTING
    assert depth_of(decode_table(raw, strict=True)) == MAX_NESTING
    assert table_error(raw, 0, len(raw)) is None
    too_deep = nested(MAX_NESTING + 1, kind)
    for strict in (False, True):
        with pytest.raises(TooDeep):
            decode_table(too_deep, strict)
    assert table_error(too_deep, 0, len(too_deep)) == f"field table nested deeper than {MAX_NESTING} levels"


def test_every_walk_of_a_table_at_the_cap_runs(deep_walks):
    """What the broker and warrenctl do with a decoded table: encode it again, print it as
    Erlang terms, copy and compare it, JSON both ways."""
    raw = nested(MAX_NESTING)
    table = decode_table(raw)
    assert encode_table(table)[4:] == raw
    assert erl_term(table).count("[") == MAX_NESTING
    assert erl_ctl(table).count("[") == MAX_NESTING
    assert copy.deepcopy(table) == table
    text = json.dumps(table)
    assert json.loads(text) == table
    assert erl_json(json.loads(text)).count("#{") == MAX_NESTING


# ----------------------------------------------------------- content-header checks

def hdr(flags: int, props: bytes = b"") -> bytes:
    return struct.pack(">HHQH", 60, 0, 5, flags) + props


@pytest.mark.parametrize("payload,reason", [
    (hdr(0x0080), "truncated properties"),
    (hdr(0x0080, b"\x05abc"), "truncated properties"),
    (hdr(0, b"x"), "1 bytes after the properties"),
    (hdr(0x1000), "truncated properties"),
    (hdr(0x1000, b"\x02\x00"), "1 bytes after the properties"),
    (hdr(0x0001, b"\x00\x00"), "2 bytes after the properties"),
    (hdr(0)[:13], "no property flags"),
    (hdr(0x0040, b"\x00" * 7), "truncated properties"),
    (hdr(0x2000, b"\x00\x00"), "truncated headers table"),
    (hdr(0x2000, b"\x00\x00\x00\x09\x01aV"), "truncated headers table"),
    (hdr(0x2000, b"\x00\x00\x00\x03\x01aZ"), "headers: unknown field type 'Z'"),
    (hdr(0x2000, b"\x00\x00\x00\x0b\x01ad" + struct.pack(">d", math.nan)), "headers: a float that is not a finite number"),
])
def test_malformed_properties_are_named(payload, reason):
    assert properties_error(payload) == reason
    if "truncated" in reason or "unknown" in reason:  # the decoder fails there too
        with pytest.raises(DecodeError):
            decode_properties(payload)


@pytest.mark.parametrize("payload", [
    hdr(0), hdr(0x1000, b"\x02"), hdr(0x1800, b"\x02\x09"), hdr(0x9000, b"\x10application/json\x02"),
    hdr(0x0001), hdr(0x0002), hdr(0x8001, b"\x02ab"),          # the two low bits are ignored, as RabbitMQ
    hdr(0x8000, b"\x02\xff\xfe"),                               # any bytes in a shortstr
    hdr(0x2000, b"\x00\x00\x00\x04\x02\xff\xfeV"),              # any bytes in a key
    hdr(0x2000, b"\x00\x00\x00\x00"), hdr(0x0040, b"\x00" * 8),
])
def test_well_formed_properties(payload):
    assert properties_error(payload) is None
    decode_properties(payload)


PROPS = st.fixed_dictionaries({}, optional={
    "content_type": st.text(max_size=20), "content_encoding": st.text(max_size=5),
    "headers": st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-2**31, 2**31 - 1), st.text(max_size=5),
                                                               st.booleans(), st.none()), max_size=3),
    "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255), "correlation_id": st.text(max_size=20),
    "reply_to": st.text(max_size=20), "expiration": st.text(max_size=5), "message_id": st.text(max_size=36),
    "timestamp": st.integers(0, 2**64 - 1), "type": st.text(max_size=5), "user_id": st.text(max_size=5),
    "app_id": st.text(max_size=5), "cluster_id": st.text(max_size=5)})


@settings(max_examples=300, deadline=None)
@given(PROPS, st.data())
def test_every_header_is_checked_exactly(props, data):
    """A header Warren makes is well formed and decodes to what went in; every shorter prefix
    of it (past the flags) and every longer one is refused."""
    payload = encode_header(5, props)
    assert properties_error(payload) is None
    assert decode_properties(payload) == {k: v for k, v in props.items()}
    cut = data.draw(st.integers(14, len(payload)))
    if cut < len(payload):
        assert properties_error(payload[:cut]) is not None
    assert properties_error(payload + data.draw(st.binary(min_size=1, max_size=3))) is not None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_the_validator_agrees_with_the_decoder(raw):
    """table_error says None exactly when decode_table reads the bytes (with finite floats)."""
    try:
        table = decode_table(raw)
    except DecodeError:
        table = None
    accepted = table is not None and _finite(table)
    assert (table_error(raw, 0, len(raw)) is None) == accepted


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _VALUES, max_size=6), st.data())
def test_the_validator_agrees_with_the_decoder_on_tables_cut_and_damaged(table, data):
    """Real tables (nested tables and arrays, every kind of value), cut short or with one octet
    changed, and inside a longer buffer (the check must stop at its end, not the buffer's)."""
    raw = encode_table(table)[4:]
    assert table_error(raw, 0, len(raw)) is None
    damaged = bytearray(raw[:data.draw(st.integers(0, len(raw)))])
    if damaged and data.draw(st.booleans()):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(damaged)
    try:
        accepted = _finite(decode_table(damaged))
    except DecodeError:
        accepted = False
    assert (table_error(damaged, 0, len(damaged)) is None) == accepted
    inside = b"\x01" + damaged + b"\xff\xff\xff\xffS\x00"
    assert table_error(inside, 1, 1 + len(damaged)) == table_error(damaged, 0, len(damaged))


def _finite(value) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def test_a_peer_may_not_send_infinity_in_a_method_but_stored_values_still_decode():
    raw = b"\x01af" + struct.pack(">f", math.inf)
    with pytest.raises(DecodeError):
        decode_table(raw, strict=True)
    assert decode_table(raw) == {"a": math.inf}


# ------------------------------------------------------------- names not UTF-8

def test_shortstrs_that_are_not_utf8_round_trip():
    name, end = read_shortstr(b"\x03a\xff\xfe", 0)
    assert end == 4 and shortstr(name) == b"\x03a\xff\xfe"


def test_method_shortstrs_must_be_utf8():
    with pytest.raises(MalformedUTF8):
        spec.decode_method(b"\x00\x32\x00\x0a\x00\x00\x01\xff\x00\x00\x00\x00\x00")


# ---------------------------------------------------------- decode_method's order

def declare(name: bytes, table_content: bytes, tail: bytes = b"") -> bytes:
    return (b"\x00\x32\x00\x0a\x00\x00" + bytes((len(name),)) + name + b"\x00"
            + struct.pack(">I", len(table_content)) + table_content + tail)


def test_decode_method_checks_the_layout_first_then_the_fields_in_order():
    bad_table = b"\x01aZ"
    with pytest.raises(DecodeError) as err:  # trailing bytes: the layout fails, whatever the table
        spec.decode_method(declare(b"q", bad_table, b"zz"))
    assert type(err.value) is DecodeError
    with pytest.raises(spec.BadTable) as bad:
        spec.decode_method(declare(b"q", bad_table))
    assert (bad.value.method_name, bad.value.reason) == ("queue.declare", "unknown field type 'Z'")
    with pytest.raises(MalformedUTF8):  # the queue name comes before the table
        spec.decode_method(declare(b"\xff", bad_table))
    with pytest.raises(spec.UnknownMethod):
        spec.decode_method(b"\x00\x32\x00\x63")


def test_names_that_are_not_utf8_print_as_erlang_terms():
    name, _ = read_shortstr(b"\x02a\xff", 0)
    assert erl_term(name).startswith("<<") and erl_term({name: name}).startswith("[{<<")
    assert erl_json("\ud800") == "<<237,160,128>>"  # a lone surrogate escaped in JSON
