"""What a reliable publish can fail with: one base class, so callers may catch it all."""


class PublishError(Exception):
    """The broker did not take responsibility for a message."""

    def __init__(self, message_id: str, reason: str) -> None:
        super().__init__(f"message {message_id}: {reason}")
        self.message_id = message_id
        self.reason = reason


class Nacked(PublishError):
    """The broker answered basic.nack on every attempt (e.g. a full queue with
    x-overflow=reject-publish)."""


class Returned(PublishError):
    """A mandatory message could not be routed to any queue (basic.return)."""


class ExchangeNotFound(PublishError):
    """The exchange does not exist: the broker closed the channel with 404 NOT_FOUND."""


class ConfirmTimeout(PublishError):
    """No confirmation arrived in time (broker unreachable, connection lost, ...); the
    broker may still have the message, so a resend can make a duplicate."""
