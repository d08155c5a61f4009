"""Erlang's ways of printing terms (~p, ~s, ~w), for the texts Warren copies from RabbitMQ.

RabbitMQ builds its error and validation texts with io_lib:format, so a value appears the
way Erlang prints RabbitMQ's form of it: a binary as <<"text">> or <<1,2,3>>, a field table
as [{<<"k">>,longstr,<<"v">>}], a JSON object as #{<<"k">> => 1}. Every such printer lives
here, so that a fix to one rule reaches every text. Where callers differ (the bytes a text is
made of, which bytes count as printable, the column a term starts at) that is a parameter.

Only the standard library and warren.amqp.codec are imported: warrenctl uses this module and
must run without the broker's dependencies.
"""

import json
import re
from typing import Literal

from .codec import table_type_name

# io_lib_pretty's line width: ~p breaks a term that does not fit.
LINE_WIDTH = 80

# The escapes ~p uses inside a printable binary.
_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x0B: b"\\v",
            0x08: b"\\b", 0x0C: b"\\f", 0x1B: b"\\e"}
# io_lib's rule for an atom written bare: a lower-case letter (Latin-1's too), then letters,
# digits, _ and @; and not a reserved word.
_BARE_ATOM = re.compile("[a-z\u00df-\u00f6\u00f8-\u00ff][A-Za-z0-9_@\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff]*")
_RESERVED = frozenset("after and andalso band begin bnot bor bsl bsr bxor case catch cond div end fun if let not of "
                      "or orelse receive rem try when xor".split())

# Which binaries print as text: "latin1" is Erlang's ~p rule (bytes 32..126 and 160..255, and
# the escapes); "ascii" (32..126) and "unicode" (printable UTF-8) are the narrower rules of
# policy validation and of the config reader, which also print an empty binary as <<"">>.
Printable = Literal["latin1", "ascii", "unicode"]


def _is_printable(raw: bytes, printable: Printable) -> bool:
    if printable == "latin1":
        return all(32 <= b < 127 or b >= 160 or b in _ESCAPES for b in raw)
    if printable == "ascii":
        return all(32 <= b < 127 for b in raw)
    try:
        return raw.decode().isprintable()
    except UnicodeDecodeError:
        return False


def erl_binary(raw: bytes, col: int | None = None, printable: Printable = "latin1") -> bytes:
    """~p of a binary, as the bytes io_lib produces (one per character): <<"text">> or
    <<1,2,3>>. Given the column (0-based) the term starts at, a byte list fills its lines to
    LINE_WIDTH as ~p does; without it, it stays on one line.

    Bytes, because callers differ in how they turn them into text: connection.close texts
    take them as Latin-1 characters, error texts decode them as UTF-8."""
    if not raw and printable == "latin1":
        return b"<<>>"
    if _is_printable(raw, printable):
        return b'<<"' + b"".join(_ESCAPES.get(b) or bytes((b,)) for b in raw) + b'">>'
    items = [str(b) for b in raw]
    if col is None:
        return ("<<" + ",".join(items) + ">>").encode()
    out = ["<<", items[0]]
    end = col + 2 + len(items[0])
    indent = " " * (col + 2)
    for item in items[1:]:
        if end + 1 + len(item) <= LINE_WIDTH - 2:
            out.append("," + item)
            end += 1 + len(item)
        else:
            out.append(",\n" + indent + item)
            end = col + 2 + len(item)
    out.append(">>")
    return "".join(out).encode()


def erl_binary_w(raw: bytes) -> str:
    """~w of a binary: always the byte values, on one line."""
    return "<<" + ",".join(str(b) for b in raw) + ">>"


def erl_float(value: float) -> str:
    """~p of a float: Python's shortest repr, with Erlang's mantissa (1.0e20, not 1e+20)."""
    text = repr(value)
    if "e" in text:
        mantissa, exp = text.split("e")
        text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exp)}"
    return text


def erl_atom(name: str) -> str:
    """~p of an atom: bare when it may be, else quoted ('Q a', 'end', '\\n'), control
    characters escaped as io_lib writes them."""
    if _BARE_ATOM.fullmatch(name) and name not in _RESERVED:
        return name
    return "'" + "".join(_atom_char(c) for c in name) + "'"


def _atom_char(c: str) -> str:
    code = ord(c)
    if c in "'\\":
        return "\\" + c
    if code in _ESCAPES and c != '"':
        return _ESCAPES[code].decode()
    if code == 0x7F:
        return "\\d"
    if code < 32 or 127 < code < 160:
        return "\\" + format(code, "03o")
    return c


def erl_string(text: str) -> str:
    """~p of a string (a list of characters): "text"."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def erl_list(items: list[str]) -> str:
    """~p of a list of already printed terms: one line if it fits in LINE_WIDTH, else one
    term per line."""
    one_line = "[" + ",".join(items) + "]"
    if len(one_line) < LINE_WIDTH:
        return one_line
    return "[" + ",\n ".join(items) + "]"


def erl_tuple(items: list[str], col: int) -> str:
    """~p of a tuple of already printed terms starting at column `col` (0-based): one line
    if it fits, else each element after the first on its own line under the first."""
    one_line = "{" + ",".join(items) + "}"
    if col + len(one_line) <= LINE_WIDTH - 2:
        return one_line
    return "{" + (",\n" + " " * (col + 1)).join(items) + "}"


def erl_term(value: object) -> str:
    """A decoded field value the way Erlang's ~p prints RabbitMQ's form of it in error texts:
    <<"text">>, true, undefined, [{<<"key">>,longstr,<<"v">>}] for a table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, (str, bytes)):
        # A name read off the wire keeps bytes that are not UTF-8 as lone surrogates.
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        return erl_binary(raw).decode(errors="replace")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return erl_float(value)
    if isinstance(value, dict):
        return "[" + ",".join(f"{{{erl_term(k)},{table_type_name(v)},{erl_term(v)}}}"
                              for k, v in value.items()) + "]"
    if isinstance(value, list):
        return "[" + ",".join(f"{{{table_type_name(v)},{erl_term(v)}}}" for v in value) + "]"
    if hasattr(value, "timestamp"):  # datetime: a timestamp is an integer in RabbitMQ
        return str(int(value.timestamp()))
    if hasattr(value, "as_tuple"):  # Decimal: {Scale, Unscaled}
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1) * 10 ** max(0, exponent)
        return f"{{{max(0, -exponent)},{unscaled}}}"
    return repr(value)


def erl_s(value: object) -> str:
    """Erlang's ~s for a binary (the raw text), ~p for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return erl_term(value)


def erl_json(value: object) -> str:
    """A JSON value the way Erlang's ~p prints RabbitMQ's decoded form of it: null, binaries,
    lists, and maps (#{<<"k">> => 1}, keys in order)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return erl_binary(value.encode("utf-8", "surrogatepass"), printable="ascii").decode()  # JSON may escape a lone surrogate
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return erl_float(value)
    if isinstance(value, list):
        return "[" + ",".join(erl_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{erl_json(k)} => {erl_json(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value)


def erl_ctl(value: object) -> str:
    """A value as rabbitmqctl shows it in a table cell: a string as itself, nothing as an
    empty cell, tables as [{"k",v}] (keys in order) and lists as [a,b]."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "[" + ",".join(f"{{{_erl_ctl_inner(k)},{_erl_ctl_inner(v)}}}"
                              for k, v in sorted(value.items())) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_erl_ctl_inner(v) for v in value) + "]"
    return str(value)


def _erl_ctl_inner(value: object) -> str:
    """A term inside a table or list of a cell: strings quoted, nothing as undefined."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return erl_ctl(value) if value is not None else "undefined"


# ---------------------------------------------------------------- ~p across lines
# io_lib_pretty (OTP 25), for the terms RabbitMQ's texts print: binaries, numbers, atoms,
# strings (lists of printable characters), lists, tuples and maps. ~p prints a term on one
# line when it fits in LINE_WIDTH from its column, else breaks it as io_lib_pretty:pp does;
# a tuple whose first element is an atom is "tagged", and how its elements are indented
# depends on which of io_lib_pretty's tag indentations (-1, 4, else 1) lets the term fit.

class Atom(str):
    """An Erlang atom among the terms erl_pretty prints (a JSON null is the atom null)."""


# The characters ~p prints as text in a list or binary (io_lib's latin1 printable range).
_PRINTABLE = frozenset(range(32, 127)) | frozenset(range(160, 256)) | frozenset(_ESCAPES)


def _quoted(chars: list[int]) -> str:
    """A printable string between double quotes, escaped as io_lib writes it."""
    return '"' + "".join(_ESCAPES[c].decode() if c in _ESCAPES else chr(c) for c in chars) + '"'


class _Node:
    """A term laid out (io_lib_pretty's intermediate format): its kind, what it is made of
    and the length it has on one line. Kinds: "s" (text written as it is: numbers, atoms,
    strings and printable binaries), "bin" (a binary of numbers, which may break between
    them), "list", "tuple" (parts: the elements; tagged: the first is an atom), "map"
    (parts: its "pair"s) and "pair" (parts: key and value)."""

    __slots__ = ("kind", "text", "parts", "length", "tagged")

    def __init__(self, kind: str, text: str = "", parts: list["_Node"] | None = None, length: int = 0,
                 tagged: bool = False):
        self.kind, self.text, self.parts, self.tagged = kind, text, parts or [], tagged
        self.length = length if parts else len(text)

    @property
    def atomic(self) -> bool:
        """io_lib_pretty's test is_list(element(1, If)): text, written and never laid out
        (a pair is atomic when its key and value are)."""
        if self.kind == "pair":
            return self.parts[0].atomic and self.parts[1].atomic
        return self.kind == "s"

    def write(self) -> str:
        if self.kind == "list":
            return "[" + ",".join(p.write() for p in self.parts) + "]"
        if self.kind == "tuple":
            return "{" + ",".join(p.write() for p in self.parts) + "}"
        if self.kind == "map":
            return "#{" + ",".join(p.write() for p in self.parts) + "}"
        if self.kind == "pair":
            return self.parts[0].write() + " => " + self.parts[1].write()
        return self.text


def _sequence(kind: str, parts: list[_Node], brackets: int, tagged: bool = False) -> _Node:
    """A list, tuple or map: its brackets, its parts and the commas between them."""
    return _Node(kind, parts=parts, length=brackets + sum(p.length for p in parts) + len(parts) - 1, tagged=tagged)


def _is_atom(term: object) -> bool:
    return isinstance(term, (Atom, bool)) or term is None


def _layout(term: object) -> _Node:
    if isinstance(term, bool):
        return _Node("s", "true" if term else "false")
    if term is None:
        return _Node("s", "null")
    if isinstance(term, Atom):
        return _Node("s", erl_atom(term))
    if isinstance(term, int):
        return _Node("s", str(term))
    if isinstance(term, float):
        return _Node("s", erl_float(term))
    if isinstance(term, (str, bytes)):
        raw = term.encode("utf-8", "surrogatepass") if isinstance(term, str) else term
        if not raw:
            return _Node("s", "<<>>")
        if all(b in _PRINTABLE for b in raw):
            return _Node("s", "<<" + _quoted(list(raw)) + ">>")
        return _Node("bin", "<<" + ",".join(str(b) for b in raw) + ">>")
    if isinstance(term, list):
        if not term:
            return _Node("s", "[]")
        if all(isinstance(c, int) and not isinstance(c, bool) and c in _PRINTABLE for c in term):
            return _Node("s", _quoted(term))
        return _sequence("list", [_layout(t) for t in term], 2)
    if isinstance(term, tuple):
        if not term:
            return _Node("s", "{}")
        return _sequence("tuple", [_layout(t) for t in term], 2, tagged=_is_atom(term[0]) and len(term) > 1)
    if isinstance(term, dict):
        if not term:
            return _Node("s", "#{}")
        pairs = []
        for key in sorted(term, key=_term_order):
            k, v = _layout(key), _layout(term[key])
            pairs.append(_Node("pair", parts=[k, v], length=k.length + 4 + v.length))
        return _sequence("map", pairs, 3)
    return _Node("s", repr(term))


def _term_order(term: object) -> tuple:
    """A sort key in Erlang's term order (number < atom < tuple < map < list < binary): the
    order ~p prints a small map's keys in."""
    if _is_atom(term):
        return (1, "true" if term is True else "false" if term is False else "null" if term is None else str(term))
    if isinstance(term, (int, float)):
        return (0, term)
    if isinstance(term, tuple):
        return (6, len(term), [_term_order(t) for t in term])
    if isinstance(term, dict):
        return (7, len(term), sorted(_term_order(k) for k in term))
    if isinstance(term, list):
        return (8, [_term_order(t) for t in term])
    if isinstance(term, str):
        return (10, term.encode("utf-8", "surrogatepass"))
    return (10, bytes(term))  # type: ignore[call-overload]


class _NoGood(Exception):
    """io_lib_pretty's throw(no_good): the term does not fit with this tag indentation."""


class _Pretty:
    """io_lib_pretty:pp and cind and their helpers, for a term of `width` characters (its M)
    on lines of LINE_WIDTH, with the tag indentation `tind` (TInd). Columns are 1-based, as
    io_lib_pretty counts them; `ind` is the text that indents a new line."""

    def __init__(self, width: int, tind: int):
        self.m, self.ll, self.tind = width, LINE_WIDTH, tind

    def fits(self, node: _Node, col: int, ld: int, w: int) -> bool:
        return node.length < self.ll - col - ld and node.length + w + ld <= self.m

    def fits_after(self, node: _Node, col: int, ld: int, w: int) -> bool:
        """Whether an atomic element goes on the line after the one before it (pp_tail)."""
        elen = 1 + node.length
        if ld == 0:
            return node.atomic and elen + 1 < self.ll - col and w + elen + 1 <= self.m
        return node.atomic and elen < self.ll - col - ld and w + elen + ld <= self.m

    @staticmethod
    def last_depth(rest: list, ld: int) -> int:
        return 0 if rest else ld + 1

    # -- pp: the text
    def pp(self, node: _Node, col: int, ind: str, ld: int, w: int) -> str:
        if self.fits(node, col, ld, w):
            return node.write()
        if node.kind == "list":
            return "[" + self.pp_list(node.parts, col + 1, ind + " ", ld, w + 1) + "]"
        if node.kind == "tuple" and node.tagged:
            return "{" + self.pp_tag_tuple(node.parts, col, ind, ld, w + 1) + "}"
        if node.kind == "tuple":
            return "{" + self.pp_list(node.parts, col + 1, ind + " ", ld, w + 1) + "}"
        if node.kind == "map":
            return "#{" + self.pp_map(node.parts, col + 2, ind + "  ", ld, w + 1) + "}"
        if node.kind == "bin":
            return self.pp_binary(node.text, col + 2, ind + "  ", ld, w)
        return node.write()

    def pp_tag_tuple(self, parts: list[_Node], col: int, ind: str, ld: int, w: int) -> str:
        tag, rest = parts[0], parts[1:]
        tag_ind = tag.length + 2
        tcol = col + tag_ind
        if self.tind > 0 and tag_ind > self.tind:
            return tag.text + self.pp_tail(rest, col + self.tind, tcol, ind + " " * self.tind, ld, w + tag.length)
        return tag.text + "," + self.pp_list(rest, tcol, ind + " " * tag_ind, ld, w + tag.length + 1)

    def pp_list(self, parts: list[_Node], col0: int, ind: str, ld: int, w: int) -> str:
        text, width = self.pp_element(parts[0], col0, ind, self.last_depth(parts[1:], ld), w)
        return text + self.pp_tail(parts[1:], col0, col0 + width, ind, ld, w + width)

    def pp_tail(self, parts: list[_Node], col0: int, col: int, ind: str, ld: int, w: int) -> str:
        out = []
        for i, node in enumerate(parts):
            ld1 = self.last_depth(parts[i + 1:], ld)
            if self.fits_after(node, col, ld1, w):
                out.append("," + node.write())
                col, w = col + 1 + node.length, w + 1 + node.length
            else:
                text, width = self.pp_element(node, col0, ind, ld1, 0)
                out.append(",\n" + ind + text)
                col, w = col0 + width, width
        return "".join(out)

    def pp_element(self, node: _Node, col: int, ind: str, ld: int, w: int) -> tuple[str, int]:
        if node.atomic and self.fits(node, col, ld, w):
            return node.write(), node.length
        return self.pp(node, col, ind, ld, w), self.ll  # (a new line follows)

    def pp_map(self, pairs: list[_Node], col: int, ind: str, ld: int, w: int) -> str:
        text, width = self.pp_pair(pairs[0], col, ind, self.last_depth(pairs[1:], ld), w)
        out = [text]
        col0, col, w = col, col + width, width
        for i, pair in enumerate(pairs[1:], 1):
            ld1 = self.last_depth(pairs[i + 1:], ld)
            if self.fits_after(pair, col, ld1, w):
                out.append("," + pair.write())
                col, w = col + 1 + pair.length, w + 1 + pair.length
            else:
                text, width = self.pp_pair(pair, col0, ind, ld1, 0)
                out.append(",\n" + ind + text)
                col, w = col0 + width, width
        return "".join(out)

    def pp_pair(self, pair: _Node, col: int, ind: str, ld: int, w: int) -> tuple[str, int]:
        if self.fits(pair, col, ld, w):
            return pair.write(), (pair.length if pair.atomic else self.ll)
        key, value = pair.parts
        value_ind = ind + " " * self.map_value_indent()
        return (self.pp(key, col, ind, ld, w) + " =>\n" + value_ind
                + self.pp(value, col + self.map_value_indent(), value_ind, ld, 0), self.ll)

    def map_value_indent(self) -> int:
        return self.tind if self.tind > 0 else 4

    def pp_binary(self, text: str, col: int, ind: str, ld: int, w: int) -> str:
        n0 = max(8, min(self.ll - col, self.m - 4 - w) - ld)
        parts = text[2:-2].split(",")
        out, n = [], n0
        for part in parts[:-1]:
            size = len(part) + 1
            if n - size < 0:
                out.append("\n" + ind + part + ",")
                n = n0 - size
            else:
                out.append(part + ",")
                n -= size
        last = parts[-1]
        out.append("\n" + ind + last if len(last) > n else last)
        return "<<" + "".join(out) + ">>"

    # -- cind: whether the term fits with this tag indentation (else _NoGood)
    def cind(self, node: _Node, col: int, ld: int, w: int) -> None:
        if self.fits(node, col, ld, w):
            return
        if node.kind == "list" or (node.kind == "tuple" and not node.tagged):
            self.cind_list(node.parts, col + 1, ld, w + 1)
        elif node.kind == "tuple":
            self.cind_tag_tuple(node.parts, col, ld, w + 1)
        elif node.kind == "map":
            self.cind_map(node.parts, col + 2, ld, w + 2)

    def cind_tag_tuple(self, parts: list[_Node], col: int, ld: int, w: int) -> None:
        tag, rest = parts[0], parts[1:]
        tag_ind = tag.length + 2
        tcol = col + tag_ind
        if self.tind > 0 and tag_ind > self.tind:
            col1 = col + self.tind
            if not (self.m + col1 <= self.ll or col1 <= self.ll // 2):
                raise _NoGood
            self.cind_tail(rest, col1, tcol, ld, w + tag.length)
        elif self.m + tcol < self.ll or tcol < self.ll // 2:
            self.cind_list(rest, tcol, ld, w + tag.length + 1)
        else:
            raise _NoGood

    def cind_list(self, parts: list[_Node], col0: int, ld: int, w: int) -> None:
        width = self.cind_element(parts[0], col0, self.last_depth(parts[1:], ld), w)
        self.cind_tail(parts[1:], col0, col0 + width, ld, w + width)

    def cind_tail(self, parts: list[_Node], col0: int, col: int, ld: int, w: int) -> None:
        for i, node in enumerate(parts):
            ld1 = self.last_depth(parts[i + 1:], ld)
            if self.fits_after(node, col, ld1, w):
                col, w = col + 1 + node.length, w + 1 + node.length
            else:
                width = self.cind_element(node, col0, ld1, 0)
                col, w = col0 + width, width

    def cind_element(self, node: _Node, col: int, ld: int, w: int) -> int:
        if node.atomic and self.fits(node, col, ld, w):
            return node.length
        self.cind(node, col, ld, w)
        return self.ll

    def cind_map(self, pairs: list[_Node], col: int, ld: int, w: int) -> None:
        width = self.cind_pair(pairs[0], col, self.last_depth(pairs[1:], ld), w)
        col0, col, w = col, col + width, w + width
        for i, pair in enumerate(pairs[1:], 1):
            ld1 = self.last_depth(pairs[i + 1:], ld)
            if self.fits_after(pair, col, ld1, w):
                col, w = col + 1 + pair.length, w + 1 + pair.length
            else:
                width = self.cind_pair(pair, col0, ld1, 0)
                col, w = col0 + width, width

    def cind_pair(self, pair: _Node, col: int, ld: int, w: int) -> int:
        if self.fits(pair, col, ld, w):
            return pair.length if pair.atomic else self.ll
        key, value = pair.parts
        self.cind(key, col, ld, w)
        self.cind(value, col + self.map_value_indent(), ld, 0)
        return self.ll


def erl_pretty(term: object, col: int = 0) -> str:
    """~p of a term starting at column `col` (0-based) of its line, as io_lib:format lays it
    out: one line if it fits, else broken and indented. Text and binaries come out as Erlang's
    characters (one per byte of a binary); erl_text turns them into the text a reply shows.
    An Erlang string (a list of characters) is a list of ints."""
    node = _layout(term)
    if node.length < LINE_WIDTH - (col + 1):
        return node.write()
    tind = 1  # (io_lib_pretty's while_fail([-1, 4], ..., 1))
    for candidate in (-1, 4):
        try:
            _Pretty(node.length, candidate).cind(node, col + 1, 0, 0)
        except _NoGood:
            continue
        tind = candidate
        break
    return _Pretty(node.length, tind).pp(node, col + 1, " " * col, 0, 0)


def erl_column(text: str) -> int:
    """The column (0-based) io_lib:format reaches after `text`: a newline starts a line, a
    tab goes to the next multiple of 8 (io_lib_format's indentation)."""
    col = 0
    for c in text:
        col = 0 if c == "\n" else ((col + 8) // 8) * 8 if c == "\t" else col + 1
    return col


def erl_format(fmt: str, *args: object) -> str:
    """io_lib:format with ~p directives only: each term laid out from the column it starts
    at (erl_pretty)."""
    pieces = fmt.split("~p")
    assert len(pieces) == len(args) + 1, fmt
    out = pieces[0]
    for arg, piece in zip(args, pieces[1:]):
        out += erl_pretty(arg, erl_column(out)) + piece
    return out


def erl_text(chars: str) -> str:
    """Erlang characters (each one byte) as RabbitMQ's HTTP replies show them: the bytes read
    as UTF-8."""
    return chars.encode("latin-1").decode("utf-8", "replace")
