"""The consumers of one queue and the choice of which one gets the next message.

RabbitMQ's rabbit_queue_consumers: round robin among the consumers that have credit. A queue
asks `next_ready()` for every message it hands out; the consumer returned goes to the back.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .consumer import Consumer


class ConsumerSet:
    __slots__ = ("_ring",)

    def __init__(self) -> None:
        self._ring: deque[Consumer] = deque()

    def __len__(self) -> int:
        return len(self._ring)

    def __bool__(self) -> bool:
        return bool(self._ring)

    def __iter__(self) -> Iterator[Consumer]:
        """Every consumer, in no promised order (management views, cancelling them all)."""
        return iter(list(self._ring))

    def add(self, consumer: Consumer) -> None:
        self._ring.append(consumer)

    def remove(self, consumer: Consumer) -> bool:
        """Forget a consumer; False if it was not there."""
        try:
            self._ring.remove(consumer)
        except ValueError:
            return False
        return True

    def clear(self) -> None:
        self._ring.clear()

    def next_ready(self) -> Consumer | None:
        """The consumer to get the next message (moved to the back), or None if none has credit."""
        ring = self._ring
        for _ in range(len(ring)):
            consumer = ring[0]
            ring.rotate(-1)
            if consumer.ready():
                return consumer
        return None
