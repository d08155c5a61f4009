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


def frame_error(text):
    return AMQPError(501, text)


def syntax_error(text):
    return AMQPError(502, text)


def unexpected_frame(text):
    return AMQPError(505, text)
