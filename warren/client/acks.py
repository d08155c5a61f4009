"""Acknowledgements in batches: one basic.ack(multiple=True) per `batch` settled messages
(the RabbitMQ guide's advice: about half the prefetch), or once the oldest pending one has
waited `delay` seconds, so a slow trickle is not held unacknowledged."""

import time
from collections.abc import Callable

from aio_pika.abc import AbstractIncomingMessage


class AckBatch:
    def __init__(self, batch: int, delay: float, before_ack: Callable[[], None]) -> None:
        self.batch = max(1, batch)
        self.delay = delay
        self._since = 0.0
        # Makes the idempotency store durable before the broker forgets the messages.
        self._before_ack = before_ack
        self._last: AbstractIncomingMessage | None = None
        self.pending = 0

    async def add(self, delivery: AbstractIncomingMessage) -> None:
        # Deliveries are handled in order, so acking the last tag with multiple=True
        # covers exactly those added here (rejected tags in between are settled already).
        if self._last is None:
            self._since = time.monotonic()
        self._last = delivery
        self.pending += 1
        if self.pending >= self.batch:
            await self.flush()

    def due_in(self) -> float | None:
        """Seconds until the pending acks must go out; None if there are none."""
        if self._last is None:
            return None
        return max(0.0, self._since + self.delay - time.monotonic())

    async def flush(self) -> None:
        if self._last is None:
            return
        self._before_ack()
        last, self._last, self.pending = self._last, None, 0
        await last.ack(multiple=True)

    def forget(self) -> None:
        """The channel is gone: the broker requeues these messages itself."""
        self._last, self.pending = None, 0
