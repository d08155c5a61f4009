"""Credit between a queue and its publishers: a publisher is read no faster than the queue's
consumers take what it sends, while they are taking it.

RabbitMQ keeps a publisher and the consumers of its queue at the same rate (its credit flow
between channel and queue process: a queue busy delivering grants credit more slowly). Warren
handles a publisher's whole read at once, so a publisher that outruns the consumers used to
fill its queue with a backlog in memory, where every new body lands in fresh pages and both
rates fall (measured with bench scenario 11, 64 KiB bodies: 344 -> 630 MB/s consumed, peak RSS
1,085 -> 73 MB).

The rule. A queue whose ready bodies pass FLOW_HIGH bytes while it has consumers *presses*:
it adds itself to `QueueFlow.pressed`, and the connection whose read published into it holds
itself back (Reason.QUEUE_FLOW, RabbitMQ's `flow` state, no connection.blocked) with the
queue's `QueueCredit`, unless it consumes from that queue (its acks must be read) or no
consumer of the queue has credit now (they are the bottleneck, not the broker: the queue is
their buffer, as in RabbitMQ). The queue lets its held publishers go when its ready bodies
fall to FLOW_LOW, and, at a check every CHECK_INTERVAL seconds, when none of its consumers
has credit or nothing left the queue since the last check; also when it loses its last
consumer or is deleted. A consumer that stops taking messages therefore holds a publisher
for at most about one CHECK_INTERVAL, and holds none again until it takes one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..store.interface import QueueStore
    from .consumer_set import ConsumerSet
    from .ports import Scheduler, Timer
    from .queues.host import QueueHost

# Ready body bytes at which a queue with consumers presses its publishers, and at which it
# lets them go. Measured with bench scenario 11 (64 KiB and 1 MiB bodies): 16/4 MiB beat
# 64/16 and 32/8 MiB (a bigger backlog is colder in the caches) and 4/1 MiB (the publisher
# waits on the consumer too often).
FLOW_HIGH = 16 << 20
FLOW_LOW = 4 << 20
CHECK_INTERVAL = 0.1


class HeldPublisher(Protocol):
    """A connection held back for queues (warren.session.connection.Connection)."""

    @property
    def throttle(self) -> object:
        """Its consumers' gate: tells whether it consumes from a queue."""

    def queue_released(self, credit: QueueCredit) -> None:
        """The queue lets this publisher go (it may still be held for others)."""


class FlowQueue(Protocol):
    """A queue as its credit and the publishing connection see it (warren.broker.queues.base.Queue,
    which imports this module)."""

    @property
    def deleted(self) -> bool: ...

    @property
    def consumers(self) -> ConsumerSet: ...

    @property
    def store(self) -> QueueStore: ...

    @property
    def stats(self) -> dict[str, int]: ...

    @property
    def vhost(self) -> QueueHost[Any]:
        """Its host: the node's timers."""

    @property
    def credit(self) -> QueueCredit | None:
        """The publishers it holds back (made on its first hold)."""

    def hold_publisher(self, publisher: HeldPublisher) -> bool:
        """`publisher` published into it while it pressed: True if it is held back."""
        ...


class QueueFlow:
    """The broker's queues that pressed during the read being handled (a set: bounded by the
    number of queues, whoever publishes)."""

    __slots__ = ("pressed",)

    def __init__(self) -> None:
        self.pressed: set[FlowQueue] = set()


class QueueCredit:
    """The publishers one queue holds back, and the check that lets them go."""

    __slots__ = ("queue", "held", "_timer", "_taken", "_stalled")

    def __init__(self, queue: FlowQueue):
        self.queue = queue
        self.held: dict[HeldPublisher, None] = {}  # a set, in order
        self._timer: Timer | None = None
        self._taken = 0
        # What the consumers had taken when a check found they took nothing more: no holds
        # until they take again (a stalled consumer must not leave a publisher one read per
        # check interval).
        self._stalled: int | None = None

    def hold(self, publisher: HeldPublisher, scheduler: Scheduler | None) -> bool:
        """Hold `publisher` back for this queue if the rule says so; True if it is held."""
        queue = self.queue
        if queue.deleted or scheduler is None or publisher in self.held:
            return publisher in self.held
        if self._stalled is not None:
            if _taken(queue) == self._stalled:
                return False
            self._stalled = None
        consumers = list(queue.consumers)
        if not any(c.has_credit() for c in consumers) or any(c.gate is publisher.throttle for c in consumers):
            return False
        self.held[publisher] = None
        if self._timer is None:
            self._taken = _taken(queue)
            self._timer = scheduler.call_later(CHECK_INTERVAL, self._check)
        return True

    def forget(self, publisher: HeldPublisher) -> None:
        """The publisher's connection closed."""
        self.held.pop(publisher, None)

    def release(self) -> None:
        """Let every held publisher go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = self.held
        self.held = {}
        for publisher in held:
            publisher.queue_released(self)

    def _check(self) -> None:
        self._timer = None
        queue = self.queue
        taken = _taken(queue)
        if taken == self._taken:
            self._stalled = taken
        if (not self.held or queue.deleted or queue.store.ready_bytes <= FLOW_LOW or taken == self._taken
                or not any(c.has_credit() for c in queue.consumers)):
            self.release()
            return
        self._taken = taken
        scheduler = queue.vhost.scheduler
        if scheduler is not None:
            self._timer = scheduler.call_later(CHECK_INTERVAL, self._check)


def _taken(queue: FlowQueue) -> int:
    """How many messages have left the queue's ready list for consumers or basic.get."""
    stats = queue.stats
    return stats["deliver"] + stats["deliver_no_ack"] + stats["get"] + stats["get_no_ack"]
