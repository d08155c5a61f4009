"""warren.client: a reliable AMQP publisher on top of aio-pika (publisher confirms, resends,
an optional durable SQLite outbox). It needs only aio-pika, not the broker's dependencies.

    async with ReliablePublisher("amqp://guest:guest@localhost/") as pub:
        await pub.publish(b"hello", routing_key="orders")   # returns once confirmed
"""

from .errors import ConfirmTimeout, ExchangeNotFound, Nacked, PublishError, Returned
from .message import OutgoingMessage
from .outbox import OutboxLocked
from .publisher import ReliablePublisher

__all__ = ["ReliablePublisher", "OutgoingMessage", "PublishError", "Nacked", "Returned",
           "ExchangeNotFound", "ConfirmTimeout", "OutboxLocked"]
