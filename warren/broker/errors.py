"""AMQP errors raised by the model, carrying RabbitMQ's codes and reply texts."""

from ..amqp.constants import CONNECTION_ERRORS, REPLY_NAMES


class AMQPError(Exception):
    """An error the peer is told about with channel.close or connection.close.

    `text` is the detail; `reply_text` is what goes on the wire, prefixed with the code's
    name the way RabbitMQ does ("NOT_FOUND - no queue 'q' in vhost '/'").
    """

    def __init__(self, code: int, text: str, method_ids: tuple[int, int] | None = None,
                 handshake_reply: bool = False):
        super().__init__(text)
        self.code = code
        self.text = text
        # The (class, method) the close names; None: the method being handled.
        self.method_ids = method_ids
        # During the handshake most errors close silently; these are answered with a close.
        self.handshake_reply = handshake_reply

    @property
    def reply_text(self) -> str:
        return shortstr_text(f"{REPLY_NAMES.get(self.code, 'ERROR')} - {self.text}")

    @property
    def closes_connection(self) -> bool:
        return self.code in CONNECTION_ERRORS


def shortstr_text(text: str) -> str:
    """`text` fitted in the 255 bytes a shortstr holds, as RabbitMQ cuts its reply texts
    (rabbit_binary_generator:amqp_exception_explanation/2): a longer one keeps its first 252
    bytes, mid-character if need be, and ends in "..." (names keep bytes that are not UTF-8
    as surrogates)."""
    raw = text.encode("utf-8", "surrogateescape")
    return text if len(raw) <= 255 else (raw[:252] + b"...").decode("utf-8", "surrogateescape")


def rs(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's way of naming a resource in messages: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def inequivalent(resource: str, arg: str, received, current) -> AMQPError:
    """RabbitMQ's 406 for a redeclare whose flag differs ("received 'true' but current is 'false'")."""
    def show(v):
        return str(v).lower() if isinstance(v, bool) else v
    return precondition_failed(f"inequivalent arg '{arg}' for {resource}: "
                               f"received '{show(received)}' but current is '{show(current)}'")


def not_found(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(404, text, method_ids)


def access_refused(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(403, text, method_ids)


def resource_locked(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(405, text, method_ids)


def precondition_failed(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(406, text, method_ids)


def not_allowed(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(530, text, method_ids)


def not_implemented(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(540, text, method_ids)


def internal_error(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(541, text, method_ids)


def command_invalid(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(503, text, method_ids)


def channel_error(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(504, text, method_ids)


def syntax_error(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(502, text, method_ids)


def unexpected_frame(text: str, method_ids: tuple[int, int] | None = None) -> AMQPError:
    return AMQPError(505, text, method_ids)

