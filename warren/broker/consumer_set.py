"""The consumers of one queue and the choice of which one gets the next message.

RabbitMQ 3.10's rabbit_queue_consumers and the single-active-consumer parts of
rabbit_amqqueue_process:

- consumer priorities (`x-priority`, 0 by default, negative allowed): a message goes to a
  consumer of the highest priority that has credit, round robin among equals; a lower one
  gets messages only while every higher one is blocked (no credit);
- single active consumer (the queue's `x-single-active-consumer`): only the active consumer
  gets messages. The first consumer registered becomes active (whatever its priority); when it
  goes, the successor is the consumer of the highest priority, the earliest registered among
  equals, as RabbitMQ's priority queue of consumers gives it (a quorum queue, as rabbit_fifo:
  the earliest registered). A successor gets messages once the consumer it replaces has no
  unacknowledged deliveries left (acked, rejected, or requeued when its channel closes): the
  requeued ones come first, in order, as with RabbitMQ 3.10.8 when a channel closes (pika's
  close cancels the consumers first). A client that cancels the active consumer and never
  settles its deliveries holds the queue until consumer_timeout closes its channel.

A queue asks `next_ready()` for every message it hands out; a consumer that gets one, or is
passed over for want of credit, goes to the back of its priority's ring.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .consumer import Consumer


class ConsumerSet:
    __slots__ = ("_levels", "ring", "count", "single_active", "active", "_by_priority", "_order", "_outgoing")

    def __init__(self, single_active: bool = False, successor_by_priority: bool = True) -> None:
        # One ring per priority present, highest priority first.
        self._levels: list[tuple[int, deque[Consumer]]] = []
        # The only ring when there is one priority and no single active consumer (the common
        # case), else None: a queue inlines next_ready()'s round robin over it, as that runs
        # for every message handed out (a method call there cost 10 % of a fanout publish).
        self.ring: deque[Consumer] | None = None
        self.count = 0  # (tested by queues per message: an attribute, not a __len__ call)
        self.single_active = single_active
        self.active: Consumer | None = None  # the single active consumer, if single_active
        self._by_priority = successor_by_priority
        # Single active consumer by registration order (rabbit_fifo): every consumer, oldest first.
        self._order: list[Consumer] = []
        # Former active consumers whose deliveries are not all settled yet: the active one
        # waits for them.
        self._outgoing: list[Consumer] = []

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Consumer]:
        """Every consumer, highest priority first (management views, cancelling them all)."""
        return iter([c for _, ring in self._levels for c in ring])

    def add(self, consumer: Consumer) -> None:
        priority = consumer.priority
        levels = self._levels
        for i, (p, ring) in enumerate(levels):
            if p == priority:
                ring.append(consumer)
                break
            if p < priority:
                levels.insert(i, (priority, deque((consumer,))))
                break
        else:
            levels.append((priority, deque((consumer,))))
        self.count += 1
        if self.single_active:
            if not self._by_priority:
                self._order.append(consumer)
            if self.active is None:
                self.active = consumer
        self._update_ring()

    def remove(self, consumer: Consumer) -> bool:
        """Forget a consumer; False if it was not there. If it was the single active
        consumer, its successor becomes active (see `active`)."""
        levels = self._levels
        for i, (p, ring) in enumerate(levels):
            if p == consumer.priority:
                try:
                    ring.remove(consumer)
                except ValueError:
                    return False
                if not ring:
                    del levels[i]
                break
        else:
            return False
        self.count -= 1
        if self.single_active:
            if not self._by_priority:
                self._order.remove(consumer)
            if consumer is self.active:
                if not self._by_priority:
                    self.active = self._order[0] if self._order else None
                else:
                    # Rings are never rotated while a single consumer is active, so each
                    # one's head is its earliest registered consumer.
                    self.active = levels[0][1][0] if levels else None
                self._outgoing = [c for c in self._outgoing if c.unacked]
                if consumer.unacked:
                    self._outgoing.append(consumer)
        self._update_ring()
        return True

    def clear(self) -> None:
        self._levels.clear()
        self.count = 0
        self.active = None
        self._order.clear()
        self._outgoing.clear()
        self.ring = None

    def _update_ring(self) -> None:
        levels = self._levels
        self.ring = levels[0][1] if len(levels) == 1 and not self.single_active else None

    def exclusive_refused(self, exclusive: bool) -> bool:
        """Whether a basic.consume must be refused (403 "in exclusive use"): an exclusive
        consumer holds the queue, or an exclusive one asks while others consume, or asks at
        all on a single-active-consumer queue (RabbitMQ 3.10 refuses that even when idle)."""
        if exclusive and (self.count or self.single_active):
            return True
        return any(c.exclusive for _, ring in self._levels for c in ring)

    def activity(self, consumer: Consumer) -> tuple[bool, str]:
        """(active, activity_status) as RabbitMQ's management API shows a consumer."""
        if not self.single_active:
            return True, "up"
        if consumer is self.active:
            return True, "single_active"
        return False, "waiting"

    def next_ready(self) -> Consumer | None:
        """The consumer to get the next message (moved to the back of its ring), or None if
        none may take one now."""
        ring = self.ring
        if ring is not None:
            # One priority, no single active consumer (the common case): this loop inlined, as
            # the one below, because next_ready() runs for every message handed out.
            for _ in range(len(ring)):
                consumer = ring[0]
                ring.rotate(-1)
                if consumer.ready():
                    return consumer
            return None
        if self.single_active:
            outgoing = self._outgoing
            if outgoing:
                outgoing[:] = [c for c in outgoing if c.unacked]
                if outgoing:
                    return None
            active = self.active
            return active if active is not None and active.ready() else None
        for _, ring in self._levels:
            for _ in range(len(ring)):
                consumer = ring[0]
                ring.rotate(-1)
                if consumer.ready():
                    return consumer
        return None
