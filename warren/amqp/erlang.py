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
_BARE_ATOM = re.compile(r"[a-z][A-Za-z0-9_@]*")

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
    """~p of an atom: bare when it may be, else quoted ('Q a')."""
    if _BARE_ATOM.fullmatch(name):
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
# io_lib_pretty, for the terms RabbitMQ's JSON decoder makes (binaries, numbers, the atoms
# true/false/null, lists and maps) and the tuples and atoms its texts wrap them in: ~p prints
# a term on one line when it fits in LINE_WIDTH from its column, else breaks it as below.

class Atom(str):
    """An Erlang atom among the terms erl_pretty prints (a JSON null is the atom null)."""


# The characters ~p prints as text in a list or binary (io_lib's latin1 printable range).
_PRINTABLE = frozenset(range(32, 127)) | frozenset(range(160, 256)) | frozenset(_ESCAPES)


def _quoted(chars: list[int]) -> str:
    """A printable string between double quotes, escaped as io_lib writes it."""
    return '"' + "".join(_ESCAPES[c].decode() if c in _ESCAPES else chr(c) for c in chars) + '"'


# A term laid out: (kind, text or parts, length). Kinds: "s" (text, one line: numbers, atoms,
# printable strings and binaries), "bin" (a binary of numbers, which may break between them),
# "list", "tuple", "map" and "pair" (a map's key => value).
_Node = tuple


def _layout(term: object) -> _Node:
    if isinstance(term, bool):
        text = "true" if term else "false"
        return ("s", text, len(text))
    if term is None:
        return ("s", "null", 4)
    if isinstance(term, Atom):
        text = erl_atom(term)
        return ("s", text, len(text))
    if isinstance(term, int):
        return ("s", str(term), len(str(term)))
    if isinstance(term, float):
        text = erl_float(term)
        return ("s", text, len(text))
    if isinstance(term, (str, bytes)):
        raw = term.encode("utf-8", "surrogatepass") if isinstance(term, str) else term
        if not raw:
            return ("s", "<<>>", 4)
        if all(b in _PRINTABLE for b in raw):
            text = "<<" + _quoted(list(raw)) + ">>"
            return ("s", text, len(text))
        text = "<<" + ",".join(str(b) for b in raw) + ">>"
        return ("bin", text, len(text))
    if isinstance(term, list):
        if not term:
            return ("s", "[]", 2)
        if all(isinstance(c, int) and not isinstance(c, bool) and c in _PRINTABLE for c in term):
            text = _quoted(term)
            return ("s", text, len(text))
        items = [_layout(t) for t in term]
        return ("list", items, 1 + sum(i[2] + 1 for i in items))
    if isinstance(term, tuple):
        if not term:
            return ("s", "{}", 2)
        items = [_layout(t) for t in term]
        return ("tuple", items, 1 + sum(i[2] + 1 for i in items))
    if isinstance(term, dict):
        if not term:
            return ("s", "#{}", 3)
        pairs = []
        for key in sorted(term):
            k, v = _layout(key), _layout(term[key])
            pairs.append(("pair", (k, v), k[2] + 4 + v[2]))
        return ("map", pairs, 2 + sum(p[2] + 1 for p in pairs))
    text = repr(term)
    return ("s", text, len(text))


def _write(node: _Node) -> str:
    kind, data, _ = node
    if kind == "list":
        return "[" + ",".join(_write(n) for n in data) + "]"
    if kind == "tuple":
        return "{" + ",".join(_write(n) for n in data) + "}"
    if kind == "map":
        return "#{" + ",".join(_write(n) for n in data) + "}"
    if kind == "pair":
        return _write(data[0]) + " => " + _write(data[1])
    return data


def _atomic(node: _Node) -> bool:
    """io_lib_pretty's ?ATM: text that is written, never laid out."""
    if node[0] == "pair":
        return _atomic(node[1][0]) and _atomic(node[1][1])
    return node[0] == "s"


class _Pretty:
    """io_lib_pretty:pp and its helpers, for a term of `width` characters (its M) on lines of
    LINE_WIDTH; no tagged tuples or records among the terms, so no tag indentation (TInd -1:
    map values are indented by 4)."""

    def __init__(self, width: int):
        self.m = width
        self.ll = LINE_WIDTH

    def pp(self, node: _Node, col: int, ind: str, ld: int, w: int) -> str:
        kind, data, length = node
        if length < self.ll - col - ld and length + w + ld <= self.m:
            return _write(node)
        if kind == "list":
            return "[" + self.pp_list(data, col + 1, ind + " ", ld, w + 1) + "]"
        if kind == "tuple":
            return "{" + self.pp_list(data, col + 1, ind + " ", ld, w + 1) + "}"
        if kind == "map":
            return "#{" + self.pp_map(data, col + 2, ind + "  ", ld, w + 1) + "}"
        if kind == "bin":
            return self.pp_binary(data, col + 2, ind + "  ", ld, w)
        return data

    def pp_list(self, items: list, col0: int, ind: str, ld: int, w: int) -> str:
        first, rest = items[0], items[1:]
        text, width = self.pp_element(first, col0, ind, 0 if rest else ld + 1, w)
        return text + self.pp_tail(rest, col0, col0 + width, ind, ld, w + width)

    def pp_tail(self, items: list, col0: int, col: int, ind: str, ld: int, w: int) -> str:
        out = []
        for i, node in enumerate(items):
            ld1 = 0 if i + 1 < len(items) else ld + 1
            elen = 1 + node[2]
            if _atomic(node) and ((ld1 == 0 and elen + 1 < self.ll - col and w + elen + 1 <= self.m)
                                  or (ld1 > 0 and elen < self.ll - col - ld1 and w + elen + ld1 <= self.m)):
                out.append("," + _write(node))
                col, w = col + elen, w + elen
            else:
                text, width = self.pp_element(node, col0, ind, ld1, 0)
                out.append(",\n" + ind + text)
                col, w = col0 + width, width
        return "".join(out)

    def pp_element(self, node: _Node, col: int, ind: str, ld: int, w: int) -> tuple[str, int]:
        length = node[2]
        if length < self.ll - col - ld and length + w + ld <= self.m and _atomic(node):
            return _write(node), length
        return self.pp(node, col, ind, ld, w), self.ll  # (a new line follows)

    def pp_map(self, pairs: list, col: int, ind: str, ld: int, w: int) -> str:
        first, rest = pairs[0], pairs[1:]
        text, width = self.pp_pair(first, col, ind, 0 if rest else ld + 1, w)
        out = [text]
        col0, col, w = col, col + width, width
        for i, pair in enumerate(rest):
            ld1 = 0 if i + 1 < len(rest) else ld + 1
            elen = 1 + pair[2]
            if _atomic(pair) and ((ld1 == 0 and elen + 1 < self.ll - col and w + elen + 1 <= self.m)
                                  or (ld1 > 0 and elen < self.ll - col - ld1 and w + elen + ld1 <= self.m)):
                out.append("," + _write(pair))
                col, w = col + elen, w + elen
            else:
                text, width = self.pp_pair(pair, col0, ind, ld1, 0)
                out.append(",\n" + ind + text)
                col, w = col0 + width, width
        return "".join(out)

    def pp_pair(self, pair: _Node, col: int, ind: str, ld: int, w: int) -> tuple[str, int]:
        length = pair[2]
        if length < self.ll - col - ld and length + w + ld <= self.m:
            return _write(pair), (length if _atomic(pair) else self.ll)
        key, value = pair[1]
        value_ind = ind + "    "
        return (self.pp(key, col, ind, ld, w) + " =>\n" + value_ind + self.pp(value, col + 4, value_ind, ld, 0),
                self.ll)

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


def erl_pretty(term: object, col: int = 0) -> str:
    """~p of a term starting at column `col` (0-based) of its line, as io_lib:format lays it
    out: one line if it fits, else broken and indented. Text and binaries come out as Erlang's
    characters (one per byte of a binary); erl_text turns them into the text a reply shows."""
    node = _layout(term)
    if node[2] < LINE_WIDTH - (col + 1):
        return _write(node)
    return _Pretty(node[2]).pp(node, col + 1, " " * col, 0, 0)


def erl_format(fmt: str, *args: object) -> str:
    """io_lib:format with ~p directives only: each term laid out from the column it starts
    at (erl_pretty)."""
    pieces = fmt.split("~p")
    assert len(pieces) == len(args) + 1, fmt
    out = pieces[0]
    for arg, piece in zip(args, pieces[1:]):
        out += erl_pretty(arg, len(out) - (out.rfind("\n") + 1)) + piece
    return out


def erl_text(chars: str) -> str:
    """Erlang characters (each one byte) as RabbitMQ's HTTP replies show them: the bytes read
    as UTF-8."""
    return chars.encode("latin-1").decode("utf-8", "replace")
