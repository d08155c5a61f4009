"""Changing a content header the way RabbitMQ does, on its wire bytes.

When RabbitMQ changes a message's headers (it strips BCC at publish, writes x-death when it
dead-letters) it decodes the properties into Erlang terms, edits the headers as a list of
{Key, Type, Value} triples and encodes everything again. Decoding into Python dicts would
lose what that keeps: duplicate keys, field order, the exact wire type of every value. So a
table is handled here as that list, each field a (key, typed value) pair of bytes: the type
octet and the value exactly as on the wire. Only what RabbitMQ's round trip changes is
changed (normalized()). The header was checked when it was published (properties_error),
so the walks below trust its structure.
"""

import struct
from typing import Hashable

Field = tuple[bytes, bytes]  # (key, type octet + value bytes)

_I = struct.Struct(">I")
_Q = struct.Struct(">Q")

# Bytes after the type octet of the fixed-size field types (t b B s u I i f l L d T D V).
_FIXED = {0x74: 1, 0x62: 1, 0x42: 1, 0x73: 2, 0x75: 2, 0x49: 4, 0x69: 4, 0x66: 4,
          0x6C: 8, 0x4C: 8, 0x64: 8, 0x54: 8, 0x44: 5, 0x56: 0}
# RabbitMQ's names of the field types (rabbit_binary_parser), for its error texts.
_TYPE_NAMES = {0x53: "longstr", 0x54: "timestamp", 0x62: "byte", 0x42: "unsignedbyte", 0x73: "short",
               0x75: "unsignedshort", 0x49: "signedint", 0x69: "unsignedint", 0x64: "double",
               0x66: "float", 0x6C: "long", 0x4C: "long", 0x74: "bool", 0x44: "decimal",
               0x46: "table", 0x41: "array", 0x78: "binary", 0x56: "void"}
# Integer types: struct format of their value, as RabbitMQ reads it ('L' as signed, like 'l').
_INTS = {0x62: ">b", 0x42: ">B", 0x73: ">h", 0x75: ">H", 0x49: ">i", 0x69: ">I",
         0x6C: ">q", 0x4C: ">q", 0x54: ">Q"}
_TABLE, _ARRAY, _LONGSTR, _BYTES = 0x46, 0x41, 0x53, 0x78

FLAG_HEADERS = 1 << 13
_SHORTSTR_BITS = (1 << 15, 1 << 14, 1 << 10, 1 << 9, 1 << 8, 1 << 7, 1 << 5, 1 << 4, 1 << 3, 1 << 2)
_OCTET_BITS = (1 << 12, 1 << 11)
_TIMESTAMP_BIT = 1 << 6
_BITS = tuple(1 << n for n in range(15, 1, -1))  # the 14 basic properties, in wire order


# ---------------------------------------------------------------- properties
def split_header(header: bytes) -> dict[int, bytes]:
    """The properties present in a content header: flag bit -> the property's bytes as on
    the wire (a shortstr with its length octet, the headers table with its length)."""
    flags = header[12] << 8 | header[13]
    pos = 14
    props: dict[int, bytes] = {}
    for bit in _BITS:
        if not flags & bit:
            continue
        if bit in _SHORTSTR_BITS:
            end = pos + 1 + header[pos]
        elif bit == FLAG_HEADERS:
            end = pos + 4 + _I.unpack_from(header, pos)[0]
        elif bit in _OCTET_BITS:
            end = pos + 1
        else:  # timestamp
            end = pos + 8
        props[bit] = header[pos:end]
        pos = end
    return props


def join_header(header: bytes, props: dict[int, bytes]) -> bytes:
    """The content header of `header` (class, weight, body size) with these properties, as
    RabbitMQ encodes a property record: the flags say which are present, nothing else (the
    two low bits a publisher may have set are not kept)."""
    flags = 0
    parts = []
    for bit in _BITS:
        value = props.get(bit)
        if value is not None:
            flags |= bit
            parts.append(value)
    return header[:12] + bytes((flags >> 8, flags & 0xFF)) + b"".join(parts)


# ---------------------------------------------------------------- tables
def _value_end(buf: bytes, pos: int) -> int:
    """Where the typed value starting at buf[pos] (its type octet) ends."""
    size = _FIXED.get(buf[pos])
    if size is not None:
        return pos + 1 + size
    return pos + 5 + _I.unpack_from(buf, pos + 1)[0]


def table_fields(table: bytes) -> list[Field]:
    """The fields of a table given with its 4-octet length, in wire order."""
    fields = []
    pos, end = 4, len(table)
    while pos < end:
        key_end = pos + 1 + table[pos]
        value_end = _value_end(table, key_end)
        fields.append((table[pos + 1:key_end], table[key_end:value_end]))
        pos = value_end
    return fields


def array_items(value: bytes) -> list[bytes]:
    """The typed values of an array value ('A', length, values)."""
    items = []
    pos, end = 5, len(value)
    while pos < end:
        item_end = _value_end(value, pos)
        items.append(value[pos:item_end])
        pos = item_end
    return items


def encode_fields(fields: list[Field]) -> bytes:
    """A table (with its 4-octet length) holding these fields in this order."""
    body = b"".join(bytes((len(key),)) + key + value for key, value in fields)
    return _I.pack(len(body)) + body


def table_value(fields: list[Field]) -> bytes:
    return b"F" + encode_fields(fields)


def array_value(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return b"A" + _I.pack(len(body)) + body


def longstr_value(value: bytes) -> bytes:
    return b"S" + _I.pack(len(value)) + value


def long_value(n: int) -> bytes:
    """A long ('l'); Erlang's <<N:64/signed>> keeps the low 64 bits of a larger number."""
    return b"l" + _Q.pack(n & 0xFFFFFFFFFFFFFFFF)


def timestamp_value(seconds: int) -> bytes:
    return b"T" + _Q.pack(seconds)


def lookup(fields: list[Field], key: bytes) -> bytes | None:
    """The typed value of the first field named `key` (rabbit_misc:table_lookup)."""
    for k, value in fields:
        if k == key:
            return value
    return None


def set_table_value(fields: list[Field], key: bytes, value: bytes) -> list[Field]:
    """rabbit_misc:set_table_value: replace the first field named `key` (or append one), then
    sort the table by key, stably."""
    out = list(fields)
    for n, (k, _) in enumerate(out):
        if k == key:
            out[n] = (key, value)
            break
    else:
        out.append((key, value))
    return sort_fields(out)


def prepend_table_header(fields: list[Field], key: bytes, table: bytes) -> list[Field]:
    """rabbit_basic:prepend_table_header: the table (a typed 'F' value) put first in the
    array header `key`; a `key` that is not an array is replaced, its value kept under
    x-invalid-headers (set_invalid_header)."""
    existing = lookup(fields, key)
    prior = array_items(existing) if existing is not None and existing[:1] == b"A" else []
    fields = set_table_value(fields, key, array_value([table, *prior]))
    if existing is not None and existing[:1] != b"A":
        invalid = lookup(fields, b"x-invalid-headers")
        inner = table_fields(invalid[1:]) if invalid is not None and invalid[:1] == b"F" else []
        earlier = lookup(inner, key)
        values = [existing, *(array_items(earlier) if earlier is not None and earlier[:1] == b"A" else [])]
        inner = set_table_value(inner, key, array_value(values))
        fields = set_table_value(fields, b"x-invalid-headers", table_value(inner))
    return fields


def sort_fields(fields: list[Field]) -> list[Field]:
    """rabbit_misc:sort_field_table: a stable sort by key (bytes, as Erlang compares binaries)."""
    return sorted(fields, key=lambda f: f[0])


def delete_field(fields: list[Field], key: bytes) -> list[Field]:
    """The table without the first field named `key` (lists:keydelete)."""
    for n, (k, _) in enumerate(fields):
        if k == key:
            return fields[:n] + fields[n + 1:]
    return fields


# ---------------------------------------------------------------- values as Erlang sees them
def normalized(value: bytes) -> bytes:
    """A typed value as RabbitMQ encodes it again after decoding it: 'L' comes back as 'l'
    (both decode to a signed long) and a boolean octet as 0 or 1; tables and arrays are
    normalized inside. Every other type comes back byte for byte."""
    kind = value[0]
    if kind == 0x4C:
        return b"l" + value[1:]
    if kind == 0x74:
        return b"t\x01" if value[1] else b"t\x00"
    if kind == _TABLE:
        if b"L" not in value and b"t" not in value:
            return value
        return table_value([(k, normalized(v)) for k, v in table_fields(value[1:])])
    if kind == _ARRAY:
        if b"L" not in value and b"t" not in value:
            return value
        return array_value([normalized(v) for v in array_items(value)])
    return value


def type_name(value: bytes) -> str:
    """RabbitMQ's name of a typed value's type (as in its error texts)."""
    return _TYPE_NAMES[value[0]]


def erlang_term(value: bytes | None) -> Hashable:
    """A key equal for two values exactly when RabbitMQ's decoded values are equal (=:=),
    whatever their wire types: a longstr equals the same binary, a signedint the same long.
    A missing value and a void one are both `undefined`: None."""
    if value is None:
        return None
    kind = value[0]
    if kind == _LONGSTR or kind == _BYTES:
        return ("binary", value[5:])
    fmt = _INTS.get(kind)
    if fmt is not None:
        return ("integer", struct.unpack_from(fmt, value, 1)[0])
    if kind == 0x64:
        return ("float", struct.unpack_from(">d", value, 1)[0])
    if kind == 0x66:
        return ("float", struct.unpack_from(">f", value, 1)[0])
    if kind == 0x74:
        return ("bool", value[1] != 0)
    if kind == 0x44:
        return ("decimal", value[1], _I.unpack_from(value, 2)[0])
    if kind == 0x56:
        return None
    return (kind, normalized(value))  # a table or array: its fields, their types included


def integer(value: bytes | None) -> int | None:
    """The value of an integer field of any integer type (None for other types)."""
    if value is None:
        return None
    fmt = _INTS.get(value[0])
    return None if fmt is None else struct.unpack_from(fmt, value, 1)[0]


def longstr(value: bytes | None) -> bytes | None:
    """The bytes of a longstr value ('S' only, as RabbitMQ's {longstr, _} patterns)."""
    if value is None or value[0] != _LONGSTR:
        return None
    return value[5:]


# ---------------------------------------------------------------- a long filled in per delivery
def long_slot(header: bytes, key: bytes) -> tuple[bytes, bytes]:
    """(before, after): the content header with `key` set to a long in its headers table (as
    RabbitMQ's add_header: replaced or added, the table sorted by key, its values as RabbitMQ
    encodes them again), cut where the long's 8 value octets go. A stream delivery's header
    is then before + the offset's 8 octets + after: one concatenation per delivery, the
    re-encoding once per distinct stored header."""
    props = split_header(header)
    table = props.get(FLAG_HEADERS)
    fields = [(k, normalized(v)) for k, v in table_fields(table)] if table is not None else []
    fields = set_table_value(fields, key, long_value(0))
    props[FLAG_HEADERS] = encode_fields(fields)
    whole = join_header(header, props)
    # Only content-type and content-encoding come before the headers table.
    at = 14 + sum(len(v) for bit, v in props.items() if bit > FLAG_HEADERS) + 4
    for k, v in fields:
        if k == key:
            at += 1 + len(k) + 1
            break
        at += 1 + len(k) + len(v)
    return whole[:at], whole[at + 8:]
