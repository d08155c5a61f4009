"""What every queue type shares (the queue-type contract's common implementation): ready
messages in a store, consumers served by their ConsumerSet, unacked accounting, and what its
arguments and policies ask for: message TTL, x-expires, length limits and overflow modes,
dead-lettering. Each type (classic.py, quorum.py, stream.py) is a subclass with its
Capabilities record (capabilities.py) and what it does differently."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ...store import MemoryQueueStore, QueueStore
from ...store.queued_message import QueuedMessage
from ...store.settlement import REJECTED, SETTLED, Settlement
from ..consumer_set import ConsumerSet
from ..errors import inequivalent, not_found, precondition_failed, rs
from ..queue_flow import FLOW_HIGH, FLOW_LOW, QueueCredit
from ..queue_arguments import check_equivalent_arguments
from ..queue_settings import PLAIN, QueueSettings, resolve
from ..stats import new_queue_counters
from .capabilities import Capabilities

if TYPE_CHECKING:
    from ...store.persister import Persister
    from ...store.settlement import Ticket
    from ...store.stream import StreamLog
    from ..consumer import Consumer
    from ..policy import Policy
    from ..ports import Scheduler, Timer
    from ..links import ExclusiveOwner
    from .host import QueueHost

log = logging.getLogger("warren.queue")

# Seconds between retries of dead letters held by dead-letter-strategy at-least-once.
DEAD_LETTER_RETRY = 1.0


class Queue:
    """A queue of this node: FIFO, every message stored once in this node's store. The base
    of every queue type; a type says what it is in CAPABILITIES."""

    CAPABILITIES: Capabilities
    # A stand-in for a queue of another node (warren.cluster.remote_queue); a queue of this
    # node is always reachable.
    remote = False
    # Whether a message that comes back is delivered with a label (label_redelivery(): a
    # quorum queue's x-delivery-count).
    LABELS_REDELIVERIES = False
    # Whether a delivery waits for the entry that records it to be committed (a replicated
    # queue's leader: delivery_gate(), warren.session.gated_output).
    gated = False
    # Whether a consume, get or declare waits for a leader out of reach rather than fail (a
    # quorum queue's stand-in: warren.cluster.remote_queue.RemoteQuorumQueue._when_led).
    waits_for_leader = False

    def __init__(self, vhost: QueueHost[Queue], name: str, durable: bool = False,
                 exclusive_owner: ExclusiveOwner | None = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                 store: QueueStore | None = None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.owner = exclusive_owner  # the connection of an exclusive queue (by id)
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.store: QueueStore = store if store is not None else MemoryQueueStore()
        # x-single-active-consumer exists only as an argument in RabbitMQ 3.10 (no policy key).
        self.consumers = ConsumerSet(single_active=self.arguments.get("x-single-active-consumer") is True,
                                     successor_by_priority=self.CAPABILITIES.sac_successor_by_priority)
        self.unacked_count = 0
        self.next_seq = getattr(self.store, "max_seq", 0)  # continue after recovered messages
        self.deleted = False
        self.had_consumers = False
        # Message counters (warren.mgmt.stats turns them into RabbitMQ's message_stats and rates).
        self.stats = new_queue_counters()
        self.policy: Policy | None = None  # the policy that applies (set by the vhost)
        self.operator_policy: Policy | None = None
        # What the arguments and policies make of it (apply_settings(), called by the vhost
        # once the policies are set). `special`: publish() must check TTLs or limits;
        # `expiring`: some message may carry a TTL deadline, so the head is checked.
        self.settings: QueueSettings = PLAIN
        self.special = False
        self.expiring = False
        # Recovered messages: their records may carry TTL deadlines. Nothing of them is
        # dead-lettered before the broker starts (start_timers()): the dead-letter queues may
        # not be recovered yet.
        self.recovered = bool(self.next_seq)
        self.expiring = self.recovered
        self._ttl_timer: Timer | None = None
        self._ttl_timer_at = 0.0
        self._expiry_timer: Timer | None = None
        self._last_used = self._now()
        # Messages whose copies (dead-lettered, or re-appended by a quorum queue) wait for an
        # fsync before they are settled: (the copies' settlement, message, requeue if the
        # write fails).
        self._unsafe: deque[tuple[Settlement, QueuedMessage, bool]] = deque()
        # dead-letter-strategy at-least-once (quorum queues): dead letters that went nowhere,
        # unsettled (a restart finds them again) and retried every DEAD_LETTER_RETRY seconds.
        self._held_dead_letters: list[tuple[QueuedMessage, str]] = []
        self._held_timer: Timer | None = None
        self._waiting_sync = False
        # The publishers held back until the consumers have taken more (queue_flow.py).
        self.credit: QueueCredit | None = None

    # On a cluster, a replicated queue's members (its first leader first) and incarnation
    # (warren.cluster.replicas).
    members: tuple[str, ...] | None = None
    incarnation: str | None = None

    @classmethod
    def make_store(cls, persister: Persister | None, vhost: str, name: str, durable: bool,
                   arguments: dict[str, Any]) -> QueueStore | StreamLog | None:
        """The store of a new queue of this type, from its validated arguments (None: the
        queue's in-memory default)."""
        return persister.queue_store(vhost, name, durable) if persister is not None else None

    @classmethod
    def check_store_arguments(cls, arguments: dict[str, Any]) -> None:
        """What make_store checks of a new queue's arguments, for a store made elsewhere (a
        replica's on a cluster)."""

    # identity ----------------------------------------------------------------
    @property
    def queue_type(self) -> str:
        """x-queue-type, and the management API's "type"."""
        return self.CAPABILITIES.name

    @property
    def exclusive(self) -> bool:
        return self.owner is not None

    @property
    def kind(self) -> str:
        return "queue"

    def describe(self) -> str:
        return rs("queue", self.name, self.vhost.name)

    @property
    def reachable(self) -> bool:
        return True

    @property
    def writable_here(self) -> bool:
        """Whether this node's copy takes publishes itself (on a cluster, a stream replica
        whose leader is another node sends them there: a publish from another node's link is
        never sent on again)."""
        return not self.remote

    def down(self) -> Exception:
        """The error of a use of this queue while it cannot be reached (never, for a queue of
        this node: see warren.cluster.remote_queue)."""
        return not_found(f"{self.describe()} cannot be reached")

    @property
    def message_count(self) -> int:
        return len(self.store)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def single_active_consumer_tag(self) -> str | None:
        """The management API's: the tag of the consumer that is active (x-single-active-consumer)."""
        active = self.consumers.active
        return active.tag if active is not None else None

    def message_counts(self) -> tuple[int, int, int]:
        """(ready, unacknowledged, ready bytes), as the management API shows them."""
        return len(self.store), self.unacked_count, self.store.ready_bytes

    def info(self) -> dict[str, Any]:
        """What the type adds to the management API's view of the queue (none here)."""
        return {}

    def consumer_info(self, consumer: Consumer) -> dict[str, Any]:
        """What the type adds to the management API's view of one of its consumers."""
        return {}

    def declare_ok_counts(self) -> tuple[int, int]:
        """(message_count, consumer_count) of a queue.declare-ok."""
        return self.message_count, self.consumer_count

    def counts_async(self, done: Callable[[Any, BaseException | None], None]) -> None:
        """declare_ok_counts() as the queue's node counts them, to `done(counts, error)` (a
        queue of another node's asks it: warren.cluster.remote_queue)."""
        done(self.declare_ok_counts(), None)

    def consume_async(self, consumer: Consumer, done: Callable[[Any, BaseException | None], None]) -> None:
        """`done(None, error)` once the queue's node has the consumer ops.consume added (at
        once here; a queue of another node's checks it there and may refuse it)."""
        done(None, None)

    @property
    def delete_ok_count(self) -> int:
        """The message_count of a queue.delete-ok."""
        return self.message_count

    def check_equivalent(self, durable: bool, auto_delete: bool, arguments: dict[str, Any] | None) -> None:
        if durable != self.durable:
            raise inequivalent(self.describe(), "durable", durable, self.durable)
        if auto_delete != self.auto_delete:
            raise inequivalent(self.describe(), "auto_delete", auto_delete, self.auto_delete)
        check_equivalent_arguments(self.describe(), arguments, self.arguments,
                                   self.CAPABILITIES.equivalence_arguments)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """queue.delete's if-unused and if-empty conditions (406 when not met)."""
        if if_unused and self.consumers:
            raise precondition_failed(f"{self.describe()} in use")
        if if_empty and self.message_count:
            raise precondition_failed(f"{self.describe()} not empty")

    # settings ----------------------------------------------------------------
    def apply_settings(self) -> None:
        """Resolve the queue's arguments and policies (at creation and after every policy
        change) and apply them at once, as RabbitMQ's process_args_policy: a lower max-length
        drops (dead-letters) the head now, a new x-expires restarts the unused timer."""
        if self.deleted:
            return
        old = self.settings
        s = self.settings = self.adjust_settings(resolve(self.arguments, self.policy, self.operator_policy,
                                                         self.CAPABILITIES.policy_wins))
        self.special = s.message_ttl is not None or s.limited
        if s.message_ttl is not None:
            self.expiring = True
        if self.recovered and self._scheduler() is None:
            return  # recovering at start-up: start_timers() applies them
        if s.expires != old.expires or self._expiry_timer is None:
            self._restart_expiry_timer()
        self._enforce()

    def _enforce(self) -> None:
        """Drop (dead-letter) what the settings no longer allow: over the length limit, expired."""
        s = self.settings
        if s.limited and s.overflow == "drop-head":
            self._drop_over_limit()
        if self.expiring:
            self.drop_expired()

    def adjust_settings(self, s: QueueSettings) -> QueueSettings:
        """What this queue type makes of resolved settings (as they are, here)."""
        return s

    # enqueue and deliver -----------------------------------------------------
    def publish(self, message, ticket: Ticket | None = None) -> Settlement:
        """Accept a routed message: hand it straight to a ready consumer, else store it.
        Returns what a publisher confirm waits for (warren.store.settlement: the store's
        batch, SETTLED, or REJECTED: the queue refused it, a reject-publish overflow). With a
        confirm `ticket` (a big persistent body) the store may hold its record back while
        consumers may ack it first (warren.store.persister): the ticket then tracks it."""
        if self.special or message.ttl is not None:
            return self._publish_checked(message, ticket)
        self.next_seq += 1
        qm = QueuedMessage(self.next_seq, message)
        self.stats["publish"] += 1
        store = self.store
        batch = store.accept(qm, ticket if self.consumers.count else None)  # (no consumer: no ack to wait for)
        if self.consumers.count and not len(store) and self._dispatch(qm):
            return batch
        store.push(qm)
        if self.consumers.count and store.ready_bytes > FLOW_HIGH:
            self.vhost.pressed(self)  # (queue_flow.py)
        return batch

    def _publish_checked(self, message, ticket: Ticket | None = None) -> Settlement:
        """publish() for a queue with a TTL or a length limit, or a message with a TTL."""
        s = self.settings
        store = self.store
        if s.limited and s.overflow != "drop-head" and self._would_overflow(len(message.body)):
            # RabbitMQ's will_overflow: refused before any consumer could take it.
            if s.overflow == "reject-publish-dlx":
                self.next_seq += 1
                self.dead_letter([QueuedMessage(self.next_seq, message)], "maxlen")
            return REJECTED
        self.next_seq += 1
        qm = QueuedMessage(self.next_seq, message)
        ttl = message.ttl
        if s.message_ttl is not None and (ttl is None or s.message_ttl < ttl):
            ttl = s.message_ttl
        if ttl is not None:
            qm.expiry = self._now() + ttl / 1000
            self.expiring = True
        self.stats["publish"] += 1
        batch = store.accept(qm, ticket if self.consumers.count else None)  # (no consumer: no ack to wait for)
        if self.consumers.count and not len(store) and self._dispatch(qm):
            return batch  # even with a TTL of 0, as RabbitMQ: it had not expired yet
        store.push(qm)
        if s.limited and s.overflow == "drop-head":
            self._drop_over_limit()
        if ttl is not None:
            self.drop_expired()  # (a TTL of 0 expires now) and starts the head's timer
        if self.consumers.count and store.ready_bytes > FLOW_HIGH:
            self.vhost.pressed(self)
        return batch

    def _would_overflow(self, size: int) -> bool:
        s = self.settings
        return ((s.max_length is not None and len(self.store) + 1 > s.max_length)
                or (s.max_length_bytes is not None and self.store.ready_bytes + size > s.max_length_bytes))

    def _over_limit(self) -> bool:
        s = self.settings
        return ((s.max_length is not None and len(self.store) > s.max_length)
                or (s.max_length_bytes is not None and self.store.ready_bytes > s.max_length_bytes))

    def _drop_over_limit(self) -> None:
        """drop-head: dead-letter (or drop) messages from the head until within the limits."""
        while self._over_limit():
            dropped = self.store.drop_head(1)
            if not dropped:
                break  # (nothing left to drop: never loop on a count that does not move)
            self.dead_letter(dropped, "maxlen")

    def label_redelivery(self, qm: QueuedMessage) -> None:
        """Change what a redelivery of qm carries (only when LABELS_REDELIVERIES)."""

    def _dispatch(self, qm) -> bool:
        ring = self.consumers.ring
        if ring is not None:  # ConsumerSet.next_ready() inlined for its common case
            for _ in range(len(ring)):
                consumer = ring[0]
                ring.rotate(-1)
                if consumer.ready():
                    consumer.channel.deliver(consumer, qm)
                    return True
            return False
        chosen = self.consumers.next_ready()
        if chosen is None:
            return False
        chosen.channel.deliver(chosen, qm)
        return True

    def deliver_ready(self) -> None:
        """Push stored messages to consumers while any has credit."""
        if self.deleted:
            return  # (a channel's ack or cancel may still name it)
        store = self.store
        consumers = self.consumers
        expiring = self.expiring
        labels = self.LABELS_REDELIVERIES
        if expiring:
            self.drop_expired()
        while consumers.count and len(store):
            consumer = consumers.next_ready()
            if consumer is None:
                return
            qm: QueuedMessage = store.pop()  # type: ignore[assignment]  # len(store) > 0
            if labels and qm.deliveries:
                self.label_redelivery(qm)
            consumer.channel.deliver(consumer, qm)
            if expiring:
                self.drop_expired()  # the new head, at once: as RabbitMQ's fetch
        credit = self.credit
        if credit is not None and credit.held and store.ready_bytes <= FLOW_LOW:
            credit.release()

    def delivery_gate(self) -> Settlement | None:
        """What the delivery just recorded (delivered()) waits for before it leaves this node,
        or None: it may leave now."""
        return None

    def get(self):
        """basic.get: the next ready message, or None."""
        if self.settings.expires is not None:
            self.touch()
        if self.expiring:
            self.drop_expired()
            qm = self.store.pop()
            self.drop_expired()  # the new head, at once: as RabbitMQ's fetch
        else:
            qm = self.store.pop()
        if qm is None:
            self.stats["get_empty"] += 1
        return qm

    def hold_publisher(self, publisher) -> bool:
        """A connection published into this queue while it pressed: hold it back if the rule
        of queue_flow.py says so (True: it waits for queue_released())."""
        if self.credit is None:
            self.credit = QueueCredit(self)
        return self.credit.hold(publisher, self._scheduler())

    def _release_publishers(self) -> None:
        if self.credit is not None and self.credit.held:
            self.credit.release()

    # TTL ---------------------------------------------------------------------
    def _scheduler(self) -> Scheduler | None:
        return self.vhost.scheduler if self.vhost is not None else None

    def _now(self) -> float:
        scheduler = self._scheduler()
        return scheduler.now() if scheduler is not None else time.monotonic()

    def drop_expired(self) -> bool:
        """Dead-letter (or drop) expired messages at the head, as RabbitMQ's classic queues
        (a message behind the head waits for it, whatever its own TTL), and set the timer for
        the next head's expiry. True if any expired."""
        if self.deleted:
            return False
        store = self.store
        now = self._now()
        dropped = False
        if not len(store):
            if not self.unacked_count and self.settings.message_ttl is None:
                self.expiring = False  # no deadline left anywhere: the fast paths again
            return False
        while (qm := store.peek()) is not None:
            expiry = qm.expiry
            if expiry is None:
                return dropped  # no TTL: nothing behind it expires before it goes
            if expiry > now:
                self._arm_ttl_timer(expiry, now)
                return dropped
            expired = store.drop_head(1)
            if not expired:
                return dropped  # (peek and drop_head disagree: never loop on it)
            dropped = True
            self.dead_letter(expired, "expired")
        return dropped

    def _arm_ttl_timer(self, expiry: float, now: float) -> None:
        at = self._ttl_timer_at
        if self._ttl_timer is not None and at <= expiry + 0.001:
            return  # it fires in time; drop_expired() then sets the next one
        scheduler = self._scheduler()
        if scheduler is None:
            return
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
        self._ttl_timer_at = expiry
        self._ttl_timer = scheduler.call_later(max(expiry - now, 0) + 0.001, self._ttl_fired)

    def _ttl_fired(self) -> None:
        self._ttl_timer = None
        if not self.deleted:
            self.drop_expired()
            if self.consumers:
                self.deliver_ready()

    # x-expires ---------------------------------------------------------------
    def touch(self) -> None:
        """The queue was used (declared, basic.get, its last consumer left): x-expires counts
        from now."""
        self._last_used = self._now()
        if self._expiry_timer is None and self.settings.expires is not None:
            self._restart_expiry_timer()

    def _restart_expiry_timer(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        expires = self.settings.expires
        scheduler = self._scheduler()
        if expires is None or scheduler is None or self.deleted:
            return
        self._last_used = self._now()
        self._expiry_timer = scheduler.call_later(expires / 1000, self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry_timer = None
        expires = self.settings.expires
        if self.deleted or expires is None:
            return
        scheduler = self._scheduler()
        assert scheduler is not None  # it set this timer
        left = self._last_used + expires / 1000 - scheduler.now()
        if self.consumers or left > 0.0005:
            # In use since: wait again (a consumer's departure touches the queue).
            self._expiry_timer = scheduler.call_later(max(left, expires / 1000 if self.consumers else 0),
                                                      self._expiry_fired)
            return
        log.info("%s expired: unused for %d ms", self.describe(), expires)
        self.vhost.delete_queue(self)

    def start_timers(self) -> None:
        """The broker's scheduler has just been set (a queue recovered at start-up had none):
        x-expires counts from now, and what the settings no longer allow of its recovered
        messages goes now (every queue is recovered by then), starting the TTL timer."""
        self._restart_expiry_timer()
        self._enforce()

    def shutdown(self) -> None:
        """The broker stops (after its last fsync)."""

    def stop_timers(self) -> None:
        """The queue is deleted: cancel its timers."""
        for timer in (self._ttl_timer, self._expiry_timer, self._held_timer):
            if timer is not None:
                timer.cancel()
        self._ttl_timer = self._expiry_timer = self._held_timer = None
        self._held_dead_letters.clear()
        self._release_publishers()

    # dead-lettering ----------------------------------------------------------
    def dead_letter(self, qms: list[QueuedMessage], reason: str) -> None:
        """Messages of this queue leave it for good (rejected, expired, over the length limit,
        over the delivery limit): republished to its dead-letter exchange if it has one, and
        settled here. A persistent message that went to a durable queue is settled here only
        once the copy's batch is on disk, so a crash between the two never loses it."""
        stats = self.stats
        for qm in qms:
            copies = self.vhost.dead_letter(self, qm.message, reason) if self.settings.dlx is not None else None
            if copies is None:
                if self.settings.dead_letter_strategy == "at-least-once":
                    self._held_dead_letters.append((qm, reason))  # kept until it routes somewhere
                    self._retry_dead_letters_later()
                    continue
                stats["dropped_" + reason] += 1
            else:
                stats["dead_lettered_" + reason] += 1
                if copies is not SETTLED:
                    if qm.hold is not None:
                        self.store.write_held(qm)  # held back: its copy must be on disk before it goes
                    if qm.seg is not None:
                        self.settle_when_safe(copies, qm, requeue_on_failure=True)
                        continue
            self.store.settle(qm)

    def _retry_dead_letters_later(self) -> None:
        scheduler = self._scheduler()
        if self._held_timer is None and scheduler is not None:
            self._held_timer = scheduler.call_later(DEAD_LETTER_RETRY, self._retry_dead_letters)

    def _retry_dead_letters(self) -> None:
        """dead-letter-strategy at-least-once: try the held dead letters again (the DLX or a
        binding may exist now); those that still go nowhere stay held."""
        self._held_timer = None
        if self.deleted:
            return
        held = self._held_dead_letters
        self._held_dead_letters = []
        for qm, reason in held:
            self.dead_letter([qm], reason)

    def settle_when_safe(self, copies: Settlement, qm: QueuedMessage, requeue_on_failure: bool) -> None:
        """Settle qm once its copies elsewhere are safe (`copies`, their settlement handle).
        If their write fails, qm is requeued here (`requeue_on_failure`), or its record is
        left for the next start-up to find (a copy already serves it in memory)."""
        self._unsafe.append((copies, qm, requeue_on_failure))
        if not self._waiting_sync:
            self._waiting_sync = True
            copies.notify(self)

    def store_synced(self) -> None:
        """A SyncWaiter: an fsync finished; let go of the messages whose copies are on disk."""
        self._waiting_sync = False
        pending = self._unsafe
        while pending:
            safe = pending[0][0].status()
            if safe is None:
                break
            _batch, qm, requeue_on_failure = pending.popleft()
            if self.deleted:
                continue
            if safe:
                self.store.settle(qm)
            elif requeue_on_failure:
                qm.redelivered = True
                self.store.requeue(qm)
        if pending and not self.deleted:
            self._waiting_sync = True
            pending[0][0].notify(self)

    # settlement --------------------------------------------------------------
    def delivered(self, qm, no_ack: bool, get: bool = False, holder: str = "") -> None:
        """qm was handed out by a consumer delivery (or basic.get when `get`); `holder`: who
        holds it, for a replicated queue's new leader (warren.store.replicated)."""
        qm.deliveries += 1
        if no_ack:
            self.store.settle(qm)
            self.stats["get_no_ack" if get else "deliver_no_ack"] += 1
        else:
            self.unacked_count += 1
            self.store.delivered(qm, holder)
            self.stats["get" if get else "deliver"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def ack(self, qm) -> None:
        self.unacked_count -= 1
        self.stats["ack"] += 1
        if not self.deleted:
            self.store.settle(qm)

    def check_recover(self) -> None:
        """Refuse a basic.recover of this queue's deliveries (a stream cannot give them back)."""

    def reject(self, qm, requeue: bool, closed: bool = False) -> None:
        """A delivery rejected or nacked, or (requeue, `closed`) given back by its closing
        channel."""
        self.unacked_count -= 1
        if self.deleted:
            return
        if requeue:
            qm.redelivered = True
            self.store.requeue(qm)
            if self.settings.limited and self.settings.overflow == "drop-head":
                self._drop_over_limit()
            if self.expiring:
                self.drop_expired()
        else:
            self.dead_letter([qm], "rejected")  # (or dropped, and counted, without a DLX)

    def give_back(self, qm) -> None:
        """A delivery that reached no client (its consumer on another node had gone): back in
        place, as if it had not been delivered."""
        redelivered = qm.redelivered
        self.reject(qm, True)
        qm.redelivered = redelivered

    def purge(self) -> int:
        count = self.store.purge()
        self._release_publishers()
        return count

    # consumers ---------------------------------------------------------------
    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict | None) -> None:
        """Refuse a basic.consume this queue type cannot serve (before the consumer exists)."""

    def add_consumer(self, consumer) -> None:
        self.consumers.add(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer) -> None:
        """Forget a consumer. A single active consumer's successor is served by the caller's
        next deliver_ready(): after a basic.cancel at once, after a channel closes once its
        unacked messages are back in place (so the successor gets them first, in order)."""
        self.consumers.remove(consumer)
        if not self.consumers:
            self._release_publishers()
            if self.settings.expires is not None:
                self.touch()

    @property
    def unused_auto_delete(self) -> bool:
        return self.auto_delete and self.had_consumers and not self.consumers
