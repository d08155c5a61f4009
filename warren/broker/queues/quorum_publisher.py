"""This node's publishes to one replicated quorum queue, whichever node leads it: each is kept
(`Resent`) until a leader answers, and sent again, in order, to the next leader when the one
it went to died or stopped leading first (rabbit_fifo_client resends its pending enqueues to a
new leader so). A publish is numbered (this publisher's `name` and its number `n`) so that a
leader whose log kept it does not take it twice (rabbit_fifo's enqueuer sequence numbers:
QuorumQueue.publish_from).

One QuorumPublisher per queue and node, whatever stands for the queue there: the queue itself
while this node leads it, a stand-in (warren.cluster.remote_queue.RemoteQuorumQueue) while
another does. It moves from one to the next when the leader changes (its `route`)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Protocol

from ...store.settlement import Decision

if TYPE_CHECKING:
    from ...amqp.message import Message
    from ...store.settlement import Settlement

# Seconds a publish whose leader died unanswered waits for the next leader before it is nacked.
RESEND_FOR = 30.0


class PublishRoute(Protocol):
    """What stands for the queue on this node, as its publisher sends through it."""

    deleted: bool

    def leader_in_reach(self) -> str | None:
        """The node its publishes go to now; None while none can be reached."""
        ...

    def send(self, message: Message, origin: tuple[str, int], low: int) -> Settlement:
        """A publish to the leader, `origin` (publisher, number) and `low`, the publisher's
        lowest unanswered number (every one below it is in the leader's log)."""
        ...


class Resent(Decision):
    """A publish as its publisher's confirm waits on it: safe once a leader says so. If the
    leader it went to dies or stops leading first, its fate is unknown: rather than nack it,
    the publisher sends it again to the leader now. Nacked if it has not reached a leader
    RESEND_FOR seconds after it was published."""

    __slots__ = ("publisher", "message", "n", "attempt", "sent_to", "since")

    def __init__(self, publisher: QuorumPublisher, message: Message, n: int, now: float):
        super().__init__()
        self.publisher = publisher
        self.message = message
        self.n = n
        self.attempt: Settlement | None = None
        self.sent_to = ""  # the node its last attempt went to ("": none, or it was lost there)
        self.since = now

    def decide(self, safe: bool) -> None:
        self.publisher.waiting.pop(self.n, None)
        super().decide(safe)

    def store_synced(self) -> None:
        """(A SyncWaiter of its attempt.)"""
        attempt = self.attempt
        status = None if attempt is None else attempt.status()
        if status is None or self.safe is not None:
            return
        if not status and getattr(attempt, "moved", False) and not self.publisher.route.deleted:
            self.sent_to = ""
            self.publisher.resend_due = True
        else:
            self.decide(status)


class QuorumPublisher:
    def __init__(self, route: PublishRoute):
        self.route = route
        self.name = uuid.uuid4().hex[:16]  # (its publishes' origin in the queue's log)
        self.published = 0  # its publishes so far, numbered in order
        self.waiting: dict[int, Resent] = {}  # its publishes not answered yet, by number
        self.resend_due = False  # one of them lost its leader: they go again, in order

    def publish(self, message: Message) -> Settlement:
        self.published += 1
        resent = self.waiting[self.published] = Resent(self, message, self.published, time.monotonic())
        leader = self.route.leader_in_reach()
        if self.resend_due or leader is None:
            self.resend()  # (behind those that go again: a leader takes a publisher's in order)
        else:
            self._attempt(resent, leader)
        if resent.safe is not None and resent.attempt is not None:
            return resent.attempt  # (answered at once: REJECTED stays REJECTED for its callers)
        return resent

    def _attempt(self, resent: Resent, leader: str) -> None:
        low = next(iter(self.waiting))  # (every publish below it was confirmed: in the log)
        resent.sent_to = leader
        attempt = resent.attempt = self.route.send(resent.message, (self.name, resent.n), low)
        if attempt.status() is None:
            attempt.notify(resent)
        else:  # (decided at once: SETTLED, REJECTED, MOVED, or a link that is down)
            resent.store_synced()

    def resend(self) -> None:
        """Send again, in order, the publishes whose leader is gone or no longer leads, to the
        leader now (none while it cannot be reached); nack those published RESEND_FOR seconds
        ago, or every one once the queue is deleted."""
        route = self.route
        leader = route.leader_in_reach()
        self.resend_due = False
        now = time.monotonic()
        for resent in list(self.waiting.values()):
            if resent.sent_to == leader:
                continue
            if route.deleted or now - resent.since > RESEND_FOR:
                resent.decide(False)
            elif leader is not None:
                self._attempt(resent, leader)
            else:
                self.resend_due = True
