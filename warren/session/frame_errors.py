"""The connection errors of malformed input, with RabbitMQ 3.10's codes and exact texts.

RabbitMQ builds these texts with Erlang's io_lib:format, so a frame payload appears the
way `~p` prints a binary (`<<"text">>` or `<<1,2,3>>`, wrapped at 80 columns) and method
arguments the way `~w` does (`<<0,0,5>>`). Only the error paths come here.
"""

from ..amqp.erlang import erl_binary, erl_binary_w, erl_tuple
from ..broker.errors import AMQPError


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
    # io_lib gives one byte per character: a connection.close text takes them as Latin-1.
    return prefix + erl_binary(raw, len(prefix)).decode("latin-1")


def _error(code: int, text: str) -> AMQPError:
    return AMQPError(code, text, (0, 0))


def unknown_frame(ftype: int, payload) -> AMQPError:
    """501: a frame of an unknown type, or too short for its type."""
    return _error(501, _snippet(ftype, payload) + ": unknown_frame")


def unexpected_frame(ftype: int, payload) -> AMQPError:
    """505: a frame that is well formed but not allowed here (content on channel 0, ...)."""
    return _error(505, _snippet(ftype, payload))


def bad_frame_end(ftype: int, payload, end_byte: int) -> AMQPError:
    text = _snippet(ftype, payload) + ": "
    return _error(501, text + erl_tuple(["invalid_frame_end_marker", str(end_byte)], _column(text)))


def frame_too_large(ftype: int, size: int, frame_max: int) -> AMQPError:
    """501 for a frame header announcing more than frame_max octets. RabbitMQ tolerates a
    payload of up to frame_max (its FRAME_SIZE_FUDGE) but names frame_max - 8 as the limit."""
    return _error(501, f"type {ftype}, all octets = <<>>: {{frame_too_large,{size},{frame_max - 8}}}")


def cannot_decode(payload, class_id: int, method_id: int) -> AMQPError:
    """501 for method arguments that do not parse (truncated, or with bytes left over)."""
    return AMQPError(501, f"cannot decode {erl_binary_w(bytes(payload[4:]))}", (class_id, method_id))


def malformed_utf8() -> AMQPError:
    return _error(501, "Malformed UTF-8 in shortstr")


class _BareInternalError(AMQPError):
    """541 whose reply text is the bare name, as RabbitMQ's reader sends it when a channel
    process crashed."""

    @property
    def reply_text(self) -> str:
        return "INTERNAL_ERROR"


def malformed_content_header() -> AMQPError:
    """A content header whose properties do not decode: RabbitMQ's channel crashes on it when
    it handles the publish and its reader closes the connection with a bare 541 (Warren says
    why in its log, and refuses the header as it arrives)."""
    return _BareInternalError(541, "", (0, 0))


def malformed_table(method_name: str, reason: str, class_id: int, method_id: int) -> AMQPError:
    """501 for a method whose field table does not decode. RabbitMQ 3.10's reader crashes on
    it and the socket just closes; Warren says what is wrong."""
    return AMQPError(501, f"cannot decode the field table of {method_name}: {reason}", (class_id, method_id))


def unknown_method(class_id: int, method_id: int) -> AMQPError:
    """540 for a method id AMQP 0-9-1 does not have (RabbitMQ 3.10's reader crashes on it
    and the socket just closes)."""
    return AMQPError(540, f"unknown method {class_id}.{method_id}", (class_id, method_id))
