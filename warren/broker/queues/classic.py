"""A classic queue: ready messages in a store, consumers served round-robin, unacked accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...store import MemoryQueueStore, QueueStore
from ...store.queued_message import QueuedMessage
from ..errors import inequivalent, rs
from ..consumer_set import ConsumerSet
from ..queue_arguments import check_equivalent_arguments
from ..stats import new_queue_counters

if TYPE_CHECKING:
    from ..policy import Policy
    from ..vhost import VHost


class ClassicQueue:
    """RabbitMQ's classic queue: FIFO, every message stored once in this node's store."""

    queue_type = "classic"  # x-queue-type, and the management API's "type"

    def __init__(self, vhost: VHost, name: str, durable: bool = False, exclusive_owner: object | None = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                 store: QueueStore | None = None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.owner = exclusive_owner  # the connection of an exclusive queue
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.store: QueueStore = store if store is not None else MemoryQueueStore()
        self.consumers = ConsumerSet()
        self.unacked_count = 0
        self.next_seq = getattr(self.store, "max_seq", 0)  # continue after recovered messages
        self.deleted = False
        self.had_consumers = False
        # Message counters (warren.mgmt.stats turns them into RabbitMQ's message_stats and rates).
        self.stats = new_queue_counters()
        self.policy: Policy | None = None  # the policy that applies (set by the vhost)
        self.operator_policy: Policy | None = None

    # identity ----------------------------------------------------------------
    @property
    def exclusive(self) -> bool:
        return self.owner is not None

    @property
    def kind(self) -> str:
        return "queue"

    def describe(self) -> str:
        return rs("queue", self.name, self.vhost.name)

    @property
    def message_count(self) -> int:
        return len(self.store)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def check_equivalent(self, durable: bool, auto_delete: bool, arguments: dict[str, Any] | None) -> None:
        if durable != self.durable:
            raise inequivalent(self.describe(), "durable", durable, self.durable)
        if auto_delete != self.auto_delete:
            raise inequivalent(self.describe(), "auto_delete", auto_delete, self.auto_delete)
        check_equivalent_arguments(self.describe(), arguments, self.arguments)

    # enqueue and deliver -----------------------------------------------------
    def publish(self, message) -> int:
        """Accept a routed message: hand it straight to a ready consumer, else store it.
        Returns the store batch a publisher confirm must wait for (0: none)."""
        self.next_seq += 1
        qm = QueuedMessage(self.next_seq, message)
        self.stats["publish"] += 1
        store = self.store
        batch = store.accept(qm)
        if self.consumers and not len(store) and self._dispatch(qm):
            return batch
        store.push(qm)
        return batch

    def _dispatch(self, qm) -> bool:
        consumer = self.consumers.next_ready()
        if consumer is None:
            return False
        consumer.channel.deliver(consumer, qm)
        return True

    def deliver_ready(self) -> None:
        """Push stored messages to consumers while any has credit."""
        store = self.store
        consumers = self.consumers
        while consumers and len(store):
            consumer = consumers.next_ready()
            if consumer is None:
                return
            consumer.channel.deliver(consumer, store.pop())  # type: ignore[arg-type]  # len(store) > 0

    def get(self):
        """basic.get: the next ready message, or None."""
        qm = self.store.pop()
        if qm is None:
            self.stats["get_empty"] += 1
        return qm

    # settlement --------------------------------------------------------------
    def delivered(self, qm, no_ack: bool, get: bool = False) -> None:
        """qm was handed out by a consumer delivery (or basic.get when `get`)."""
        qm.deliveries += 1
        if no_ack:
            self.store.settle(qm)
            self.stats["get_no_ack" if get else "deliver_no_ack"] += 1
        else:
            self.unacked_count += 1
            self.store.delivered(qm)
            self.stats["get" if get else "deliver"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def ack(self, qm) -> None:
        self.unacked_count -= 1
        self.stats["ack"] += 1
        if not self.deleted:
            self.store.settle(qm)

    def reject(self, qm, requeue: bool) -> None:
        self.unacked_count -= 1
        if self.deleted:
            return
        if requeue:
            qm.redelivered = True
            self.store.requeue(qm)
        else:
            self.store.settle(qm)

    def purge(self) -> int:
        return self.store.purge()

    # consumers ---------------------------------------------------------------
    def add_consumer(self, consumer) -> None:
        self.consumers.add(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer) -> None:
        self.consumers.remove(consumer)

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    @property
    def unused_auto_delete(self) -> bool:
        return self.auto_delete and self.had_consumers and not self.consumers
