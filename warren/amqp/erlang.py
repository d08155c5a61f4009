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
