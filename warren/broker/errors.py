"""AMQP errors raised by the model, carrying RabbitMQ's codes and reply texts."""

from ..amqp.constants import CONNECTION_ERRORS, REPLY_NAMES


class AMQPError(Exception):
    """An error the peer is told about with channel.close or connection.close.

    `text` is the detail; `reply_text` is what goes on the wire, prefixed with the code's
    name the way RabbitMQ does ("NOT_FOUND - no queue 'q' in vhost '/'").
    """

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code
        self.text = text

    @property
    def reply_text(self) -> str:
        return f"{REPLY_NAMES.get(self.code, 'ERROR')} - {self.text}"[:255]

    @property
    def closes_connection(self) -> bool:
        return self.code in CONNECTION_ERRORS


def rs(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's way of naming a resource in messages: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def inequivalent(resource: str, arg: str, received, current) -> AMQPError:
    """RabbitMQ's 406 for a redeclare whose flag differs ("received 'true' but current is 'false'")."""
    def show(v):
        return str(v).lower() if isinstance(v, bool) else v
    return precondition_failed(f"inequivalent arg '{arg}' for {resource}: "
                               f"received '{show(received)}' but current is '{show(current)}'")


def not_found(text):
    return AMQPError(404, text)


def access_refused(text):
    return AMQPError(403, text)


def resource_locked(text):
    return AMQPError(405, text)


def precondition_failed(text):
    return AMQPError(406, text)


def not_allowed(text):
    return AMQPError(530, text)


def not_implemented(text):
    return AMQPError(540, text)


def command_invalid(text):
    return AMQPError(503, text)


def channel_error(text):
    return AMQPError(504, text)


def syntax_error(text):
    return AMQPError(502, text)


def unexpected_frame(text):
    return AMQPError(505, text)


# Erlang's ~p escapes in a printable binary, and the bytes it counts as printable (latin1).
_ERL_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x0B: b"\\v",
                0x08: b"\\b", 0x0C: b"\\f", 0x1B: b"\\e"}


def _erl_bytes(value) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if not raw:
        return b"<<>>"
    if all(32 <= b < 127 or b >= 160 or b in _ERL_ESCAPES for b in raw):
        return b'<<"' + b"".join(_ERL_ESCAPES.get(b) or bytes((b,)) for b in raw) + b'">>'
    return b"<<" + b",".join(str(b).encode() for b in raw) + b">>"


def erl_term(value) -> str:
    """A decoded field value the way Erlang's ~p prints RabbitMQ's form of it in error texts:
    <<"text">>, true, undefined, [{<<"key">>,longstr,<<"v">>}] for a table."""
    from ..amqp.codec import table_type_name

    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, (str, bytes)):
        return _erl_bytes(value).decode(errors="replace")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if "e" in text:
            mantissa, exp = text.split("e")
            text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exp)}"
        return text
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


def erl_s(value) -> str:
    """Erlang's ~s for a binary (the raw text), ~p for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return erl_term(value)
