"""A channel's prefetch credit, shared by its consumers: the basic.qos global=true limit and
the channel's count of unacked consumer deliveries (RabbitMQ's rabbit_limiter).

The channel owns the record and keeps its counts; each of its consumers is handed the same
record when it is created, and the queue reads it (Consumer.ready) before every delivery, so
a queue never looks at the channel itself. A per-consumer limit (basic.qos global=false) is
the consumer's own, not here.
"""

from __future__ import annotations


class Credit:
    """Plain attributes: read for every message a queue delivers."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = 0, used: int = 0):
        self.limit = limit  # basic.qos global=true prefetch count (0: no limit)
        self.used = used    # unacked consumer deliveries on the channel (basic.get ones do not count)

    def __repr__(self) -> str:
        return f"Credit(limit={self.limit}, used={self.used})"
