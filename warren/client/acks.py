"""Acknowledgements in batches: one basic.ack(multiple=True) per `batch` settled messages
(the RabbitMQ guide's advice: about half the prefetch), or once the oldest pending one has
waited `delay` seconds, so a slow trickle is not held unacknowledged.

Handlers running concurrently finish out of order, and a multiple ack covers every tag up
to the one acked: so only the settled prefix of the deliveries, in delivery order, is acked;
a message still being handled holds back the acks of the ones after it."""

import asyncio
import time
from collections import deque
from collections.abc import Callable

from aio_pika.abc import AbstractIncomingMessage


class AckBatch:
    def __init__(self, batch: int, delay: float, before_ack: Callable[[], None]) -> None:
        self.batch = max(1, batch)
        self.delay = delay
        self._since = 0.0
        # Makes the idempotency store durable before the broker forgets the messages.
        self._before_ack = before_ack
        # Deliveries received and not yet acked (or passed over), in delivery order.
        self._order: deque[AbstractIncomingMessage] = deque()
        # Tag -> whether it wants an ack (False: rejected already, the broker settled it).
        self._done: dict[int, bool] = {}
        self.pending = 0  # settled, wanting an ack, not acked yet
        self._lock = asyncio.Lock()

    def received(self, delivery: AbstractIncomingMessage) -> None:
        """Call in delivery order, before the message is handled."""
        self._order.append(delivery)

    async def add(self, delivery: AbstractIncomingMessage) -> None:
        """The message was handled (or dropped as a duplicate): ack it with the next batch."""
        if self.pending == 0:
            self._since = time.monotonic()
        self._done[_tag(delivery)] = True
        self.pending += 1
        if self.pending >= self.batch:
            await self.flush()

    def rejected(self, delivery: AbstractIncomingMessage) -> None:
        """The message was settled by basic.reject: a later multiple ack may pass over it."""
        self._done[_tag(delivery)] = False

    def due_in(self) -> float | None:
        """Seconds until the pending acks must go out; None if there are none."""
        if self.pending == 0:
            return None
        return max(0.0, self._since + self.delay - time.monotonic())

    async def flush(self) -> None:
        # Concurrent handlers flush too: acks must reach the wire in tag order (a multiple
        # ack for a tag already covered is a channel error).
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        last = None
        acked = 0
        while self._order and (wants := self._done.pop(_tag(self._order[0]), None)) is not None:
            delivery = self._order.popleft()
            if wants:
                last = delivery
                acked += 1
        # What a running handler holds back is tried again `delay` later at the latest
        # (or when that handler finishes a batch), not in a loop.
        self._since = time.monotonic()
        if last is None:
            return
        self._before_ack()
        self.pending -= acked
        await last.ack(multiple=True)

    def forget(self) -> None:
        """The channel is gone: the broker requeues these messages itself."""
        self._order.clear()
        self._done.clear()
        self.pending = 0


def _tag(delivery: AbstractIncomingMessage) -> int:
    tag = delivery.delivery_tag
    assert tag is not None  # manual-ack deliveries always carry one
    return tag
