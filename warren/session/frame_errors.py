"""The connection errors of malformed input, with RabbitMQ 3.10's codes and exact texts.

RabbitMQ builds these texts with Erlang's io_lib:format, so a frame payload appears the
way `~p` prints a binary (`<<"text">>` or `<<1,2,3>>`, wrapped at 80 columns) and method
arguments the way `~w` does (`<<0,0,5>>`). Only the error paths come here.
"""

from ..broker.errors import AMQPError

_LINE = 80
# Escapes Erlang uses inside a printable binary; other printable bytes are 32..126, 160..255.
_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v",
            0x08: "\\b", 0x0C: "\\f", 0x1B: "\\e"}


def _printable(raw: bytes) -> bool:
    return all(32 <= b < 127 or b >= 160 or b in _ESCAPES for b in raw)


def erl_p_binary(raw: bytes, col: int) -> str:
    """Erlang's ~p of a binary printed at column `col` (0-based), with its line filling."""
    if not raw:
        return "<<>>"
    if _printable(raw):
        return '<<"' + "".join(_ESCAPES.get(b) or chr(b) for b in raw) + '">>'
    items = [str(b) for b in raw]
    out = ["<<", items[0]]
    end = col + 2 + len(items[0])
    indent = " " * (col + 2)
    for item in items[1:]:
        if end + 1 + len(item) <= _LINE - 2:
            out.append("," + item)
            end += 1 + len(item)
        else:
            out.append(",\n" + indent + item)
            end = col + 2 + len(item)
    out.append(">>")
    return "".join(out)


def erl_w_binary(raw: bytes) -> str:
    """Erlang's ~w of a binary: always the byte values."""
    return "<<" + ",".join(str(b) for b in raw) + ">>"


def _column(text: str) -> int:
    return len(text) - text.rfind("\n") - 1


def _snippet(ftype: int, payload) -> str:
    """RabbitMQ's "type T, all octets = <<...>>" (at most the first 16 octets)."""
    raw = bytes(payload)
    if len(raw) <= 16:
        prefix = f"type {ftype}, all octets = "
    else:
        prefix = f"type {ftype}, first 16 octets = "
        raw = raw[:16]
    return prefix + erl_p_binary(raw, len(prefix))


def _error(code: int, text: str) -> AMQPError:
    err = AMQPError(code, text)
    err.method_ids = (0, 0)
    return err


def unknown_frame(ftype: int, payload) -> AMQPError:
    """501: a frame of an unknown type, or too short for its type."""
    return _error(501, _snippet(ftype, payload) + ": unknown_frame")


def unexpected_frame(ftype: int, payload) -> AMQPError:
    """505: a frame that is well formed but not allowed here (content on channel 0, ...)."""
    return _error(505, _snippet(ftype, payload))


def bad_frame_end(ftype: int, payload, end_byte: int) -> AMQPError:
    text = _snippet(ftype, payload) + ": "
    term = f"{{invalid_frame_end_marker,{end_byte}}}"
    col = _column(text)
    if col + len(term) > _LINE - 2:
        term = "{invalid_frame_end_marker,\n" + " " * (col + 1) + f"{end_byte}}}"
    return _error(501, text + term)


def frame_too_large(ftype: int, size: int, frame_max: int) -> AMQPError:
    """501 for a frame header announcing more than frame_max octets. RabbitMQ tolerates a
    payload of up to frame_max (its FRAME_SIZE_FUDGE) but names frame_max - 8 as the limit."""
    return _error(501, f"type {ftype}, all octets = <<>>: {{frame_too_large,{size},{frame_max - 8}}}")


def cannot_decode(payload, class_id: int, method_id: int) -> AMQPError:
    """501 for method arguments that do not parse (truncated, or with bytes left over)."""
    err = AMQPError(501, f"cannot decode {erl_w_binary(bytes(payload[4:]))}")
    err.method_ids = (class_id, method_id)
    return err


def malformed_utf8() -> AMQPError:
    return _error(501, "Malformed UTF-8 in shortstr")
