"""warren.client: a reliable AMQP publisher and consumer on top of aio-pika (publisher
confirms, resends, an optional durable SQLite outbox; batched acks, retry queues with
growing delays, a DLQ, deduplication of redeliveries). It needs only aio-pika, not the
broker's dependencies.

    async with ReliablePublisher("amqp://guest:guest@localhost/") as pub:
        await pub.publish(b"hello", routing_key="orders")   # returns once confirmed
"""

from .consumer import ReliableConsumer
from .counting import CountingPublisher, Outcome
from .dedup import IdempotencyStore, MemoryStore, SqliteStore
from .errors import ConfirmTimeout, ExchangeNotFound, Nacked, PublishError, Returned
from .incoming import ConsumedMessage
from .message import OutgoingMessage
from .outbox import OutboxLocked
from .publisher import ReliablePublisher
from .topology import ShardSet, WorkQueue, declare_sharded_queues, declare_work_queue, drain_dlq

__all__ = ["ReliablePublisher", "CountingPublisher", "Outcome", "OutgoingMessage", "PublishError", "Nacked", "Returned",
           "ExchangeNotFound", "ConfirmTimeout", "OutboxLocked", "ReliableConsumer",
           "ConsumedMessage", "IdempotencyStore", "MemoryStore", "SqliteStore", "WorkQueue",
           "declare_work_queue", "drain_dlq", "ShardSet", "declare_sharded_queues"]
