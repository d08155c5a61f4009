"""A quorum queue on a single node: a classic queue with RabbitMQ 3.10's quorum semantics
where they differ (rabbit_quorum_queue.erl, rabbit_fifo.erl, rabbit_fifo_client.erl).

- Durable, never exclusive or auto-delete (queue_arguments.check_durable_only), and every
  message is written to disk, transient ones too: the Raft log keeps whatever it is given.
- The delivery count: each time a message comes back (a client's requeue, or its channel
  closing) its count goes up. Past `x-delivery-limit` it is dead-lettered with reason
  delivery_limit (dropped without a DLX), instead of going back. Deliveries of a message
  that came back carry its count in the `x-delivery-count` header (added to its headers,
  which are then sorted by key, as rabbit_basic:add_header does); basic.get always adds it,
  0 for a first delivery. The stored message is never changed: a delivery gets a copy of
  the header (the body is shared), and a dead-lettered message has no x-delivery-count.
- Where a returned message goes: with a delivery limit set, or when its channel closed,
  ahead of the ready messages, in the order they came back (rabbit_fifo's returns queue);
  a client's requeue (reject, nack, recover) without a delivery limit puts it at the tail,
  as a new entry (rabbit_fifo's #requeue{}).
- reject-publish lets a publish in while the queue is not yet over its limit, so a queue
  reaches max-length + 1; it then refuses until it is down to 80 % of the limit
  (rabbit_fifo is_over_limit / is_below_soft_limit). reject-publish-dlx is taken as
  drop-head, with RabbitMQ's warning.
- x-expires and x-overflow by policy win over the arguments (policyHasPrecedence), where a
  classic queue takes the lower expires and the argument's overflow.
- No global qos (540 at basic.consume), no basic.get with single active consumer (405),
  no queue.delete if-unused / if-empty (540, check_delete).
- dead-letter-strategy at-least-once (with overflow reject-publish): a dead letter that goes
  nowhere is held and retried (Queue.dead_letter, base.py); single active consumer's successor
  is the earliest registered consumer (rabbit_fifo), whatever the priorities.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, cast

from ...amqp import reencode as rt
from ...amqp.message import Message
from ...amqp.properties import FLAG_HEADERS
from ...store.queued_message import QueuedMessage
from ...store.settlement import MOVED, REJECTED, SETTLED
from ..errors import not_implemented, resource_locked
from ..queue_arguments import NOT_QUORUM_ARGS, QUORUM_CHECKS, QUORUM_EQUIVALENCE_ARGS
from ..queue_settings import QueueSettings
from .base import Queue
from .capabilities import Capabilities
from .quorum_publisher import QuorumPublisher

if TYPE_CHECKING:
    from ...store.replicated import ReplicatedQueueStore
    from ...store.settlement import Settlement, Ticket

log = logging.getLogger("warren.queue")

X_DELIVERY_COUNT = b"x-delivery-count"
LOW_LIMIT = 0.8  # rabbit_fifo ?LOW_LIMIT: reject-publish stops below this share of the limit


class CountedMessage(Message):
    """A delivery's copy of a message with its x-delivery-count header; `original` is the
    message as the queue holds it."""

    __slots__ = ("original",)
    original: Message


def with_delivery_count(message: Message, count: int) -> Message:
    """The message as delivered with this delivery count (rabbit_basic:add_header: set, then
    the headers sorted by key, and the whole property record encoded again)."""
    original = message.original if isinstance(message, CountedMessage) else message
    props = rt.split_header(original.header)
    table = props.get(FLAG_HEADERS)
    fields = rt.table_fields(table) if table is not None else []
    fields = rt.set_table_value(fields, X_DELIVERY_COUNT, rt.long_value(count))
    props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in fields])
    counted = CountedMessage(original.exchange, original.routing_key, original.route,
                             rt.join_header(original.header, props), original.body)
    counted.ttl = original.ttl
    counted.cc_keys = original.cc_keys
    counted.original = original
    return counted


def _original(message: Message) -> Message:
    return message.original if isinstance(message, CountedMessage) else message


def _limit_exceeded(count: int, limit: Any) -> bool:
    """rabbit_fifo's `DeliveryCount > DeliveryLimit`: any value is accepted as a limit, but in
    Erlang's term order a number is below every atom and binary, so only a number limits."""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return False
    return count > limit


class QuorumQueue(Queue):
    """RabbitMQ's quorum queue, on this node only (leader and only member)."""

    CAPABILITIES = Capabilities(
        name="quorum", module="rabbit_quorum_queue",
        argument_checks=QUORUM_CHECKS, refused_arguments=NOT_QUORUM_ARGS,
        equivalence_arguments=QUORUM_EQUIVALENCE_ARGS,
        consumer_arguments=frozenset({"x-priority", "x-credit"}),
        # rabbit_quorum_queue:ra_machine_config: a policy's expires and overflow beat the arguments.
        policy_wins=frozenset({"expires", "overflow"}),
        server_named=False, durable_only=True, members=True, leader=True,
        sac_successor_by_priority=False,  # rabbit_fifo activates the earliest registered waiting consumer
        nacked_when_out_of_reach=True)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if hasattr(self.store, "keep_all"):
            self.store.keep_all = True  # a DiskQueueStore: transient messages are written too
        self.gated = hasattr(self.store, "delivery_gate")  # a replicated queue's leader
        # A replicated queue's leader: this node's publishes are kept until committed, and sent
        # to the next leader if this one stops leading first (RemoteQuorumQueue.inherit).
        self.publisher = QuorumPublisher(self) if self.gated else None
        self._rejecting = False  # reject-publish: over the limit, refusing until below 80 %
        self._warned: set[str] = set()

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        if if_unused or if_empty:
            flag = "if-unused" if if_unused else "if-empty"
            raise not_implemented(f"cannot delete {self.describe()}. queue.delete operations with {flag} flag "
                                  "set are not supported by quorum queues")

    # settings ----------------------------------------------------------------
    def adjust_settings(self, s: QueueSettings) -> QueueSettings:
        """rabbit_quorum_queue's dead_letter_handler: reject-publish-dlx is taken as drop-head,
        at-least-once falls back to at-most-once unless overflow is reject-publish."""
        changes: dict[str, Any] = {}
        overflow = s.overflow
        if overflow == "reject-publish-dlx":
            self._warn_once("overflow", "Invalid overflow strategy <<\"reject-publish-dlx\">> for quorum queue: %s",
                            self.describe())
            changes["overflow"] = overflow = "drop-head"
        if s.dead_letter_strategy == "at-least-once" and s.dlx is None:
            changes["dead_letter_strategy"] = "at-most-once"  # no dead-lettering at all (dlh/5)
        elif s.dead_letter_strategy == "at-least-once" and overflow != "reject-publish":
            self._warn_once("strategy", "Falling back to dead-letter-strategy at-most-once for %s because configured "
                            "dead-letter-strategy at-least-once is incompatible with effective overflow strategy "
                            "drop-head. To enable dead-letter-strategy at-least-once, set overflow strategy to "
                            "reject-publish.", self.describe())
            changes["dead_letter_strategy"] = "at-most-once"
        return replace(s, **changes) if changes else s

    def _warn_once(self, key: str, text: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text, *args)

    # enqueue -----------------------------------------------------------------
    def _would_overflow(self, size: int) -> bool:
        """reject-publish (classic's _publish_checked asks): refuse while the queue is over its
        limit, from the publish that took it over until it is down to 80 % of it."""
        s = self.settings
        store = self.store
        if self._rejecting:
            if ((s.max_length is None or len(store) <= int(s.max_length * LOW_LIMIT))
                    and (s.max_length_bytes is None or store.ready_bytes <= int(s.max_length_bytes * LOW_LIMIT))):
                self._rejecting = False
            else:
                return True
        if ((s.max_length is not None and len(store) + 1 > s.max_length)
                or (s.max_length_bytes is not None and store.ready_bytes + size > s.max_length_bytes)):
            self._rejecting = True  # this one is in; the next ones are refused
        return False

    def publish(self, message: Message, ticket: Ticket | None = None) -> Settlement:
        publisher = self.publisher
        if publisher is None:
            return Queue.publish(self, message, ticket)
        return publisher.publish(message)

    def leader_in_reach(self) -> str | None:
        """(PublishRoute: its publisher's, while this node leads the queue.)"""
        return "here"

    def send(self, message: Message, origin: tuple[str, int], low: int) -> Settlement:
        """(PublishRoute)"""
        return self.publish_from(message, origin, low)

    def stop_timers(self) -> None:
        """(Deleted, or given up to a stand-in, which took its publisher then: inherit.) Its
        publishes waiting to be sent again are nacked."""
        super().stop_timers()
        if self.publisher is not None and self.publisher.route is self:
            self.publisher.resend()

    # deliver -----------------------------------------------------------------
    LABELS_REDELIVERIES = True

    def label_redelivery(self, qm: QueuedMessage) -> None:
        """A message that came back is delivered with its count in x-delivery-count."""
        qm.message = with_delivery_count(qm.message, qm.deliveries)

    def delivery_gate(self):
        return cast("ReplicatedQueueStore", self.store).delivery_gate()

    def publish_from(self, message: Message, origin: tuple[str, int], low: int) -> Settlement:
        """(A replicated queue's leader) a publish another node sends, named by `origin`
        (its publisher and number; `low`, that publisher's lowest unanswered number): one it
        sends again because the leader it went to died is taken only if that leader's log did
        not keep it, and is confirmed once what this log holds is committed. A publisher's
        publishes are taken in order only (one that would leave a gap is MOVED: sent again,
        after the one missing), so that the log holds each publisher's up to a number."""
        store = cast("ReplicatedQueueStore", self.store)
        last = max(store.enqueuers.get(origin[0], 0), low - 1)
        if origin[1] <= last:
            return store.delivery_gate() or SETTLED
        if origin[1] > last + 1:
            return MOVED
        store.origin = origin  # (for the entry accept writes: cleared there)
        try:
            settlement = Queue.publish(self, message)
        finally:
            store.origin = None
        if settlement is REJECTED:  # (refused, not in the log: the publisher's next one is in order)
            store.enqueuers[origin[0]] = origin[1]
        return settlement

    def get(self):
        """basic.get: refused with single active consumer; the message always carries its
        x-delivery-count, 0 the first time (rabbit_fifo_client:dequeue)."""
        if self.settings.single_active_consumer:
            raise resource_locked(f"cannot obtain access to locked {self.describe()}. basic.get operations "
                                  "are not supported by quorum queues with single active consumer")
        qm = super().get()
        if qm is not None:
            qm.message = with_delivery_count(qm.message, qm.deliveries)
        return qm

    def add_consumer(self, consumer) -> None:
        if consumer.credit.limit:
            raise not_implemented(f"{self.describe()} does not support global qos")
        super().add_consumer(consumer)

    # settlement --------------------------------------------------------------
    def claim(self, holder: str, ids: Iterable[int] = ()) -> dict[int, QueuedMessage]:
        """(A replicated queue's new leader) what a consumer re-attaching as `holder` held when
        this replica took over, and those of `ids` (what it says it holds or acked) that are
        ready here because the old leader died before their DELIVERED entry reached it."""
        store = cast("ReplicatedQueueStore", self.store)
        claimed = store.claim(holder) if holder else {}
        late = store.take_back(holder, [ident for ident in ids if ident not in claimed])
        self.unacked_count += len(late)
        return {**claimed, **late}

    def reject(self, qm, requeue: bool, closed: bool = False) -> None:
        """A message that comes back from its closing channel goes ahead of the ready ones
        (rabbit_fifo return_all); a client's requeue without a delivery limit to the tail."""
        qm.message = _original(qm.message)
        if not requeue or self.deleted:
            super().reject(qm, requeue, closed)
            return
        self.unacked_count -= 1
        limit = self.settings.delivery_limit
        if _limit_exceeded(qm.deliveries, limit):
            self.dead_letter([qm], "delivery_limit")
            return
        qm.redelivered = True
        store = self.store
        self.next_seq += 1
        if closed or limit is not None:
            # rabbit_fifo's returns queue: served before the ready messages, first come back
            # first out (the requeued heap orders by sequence number, so it gets a new one).
            qm.seq = self.next_seq
            store.requeue(qm)
        else:
            # A #requeue{}: a new entry at the tail, written before the old one goes.
            again = QueuedMessage(self.next_seq, qm.message, True)
            again.deliveries = qm.deliveries
            again.expiry = qm.expiry
            copy = store.accept(again)
            store.carry_deliveries(again)  # its count survives a restart, as the old entry's marks did
            if copy is not SETTLED and qm.seg is not None:
                self.settle_when_safe(copy, qm, requeue_on_failure=False)  # old record until the new one is on disk
            else:
                store.settle(qm)
            store.push(again)
        if self.settings.limited and self.settings.overflow == "drop-head":
            self._drop_over_limit()
        if self.expiring:
            self.drop_expired()

    def dead_letter(self, qms: list[QueuedMessage], reason: str) -> None:
        for qm in qms:
            qm.message = _original(qm.message)  # without the delivery's x-delivery-count
        super().dead_letter(qms, reason)
