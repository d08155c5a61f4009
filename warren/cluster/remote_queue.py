"""A queue of another node, as this node's vhost holds it: a classic queue lives on the node
whose connection declared it (its home, as RabbitMQ's), and every other member keeps this
stand-in, so that routing, permissions, exclusivity and equivalence are checked here as for
a queue of this node, and what needs the queue itself goes to its home over the node link
(warren.cluster.node_links.Peer): a publish (confirmed when the home has it safe), a consumer
(fed within the credit this node grants it), its acks, and basic.get, queue.purge,
queue.delete and declare-ok's counts, which a channel waits for (Channel._await).

While the home cannot be reached every use of the queue fails with RabbitMQ's 404, and a
message routed to it goes nowhere (returned when mandatory), as a RabbitMQ cluster does."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Protocol, Self, cast

from ..broker import ops
from ..broker.errors import AMQPError, internal_error, not_found, not_implemented
from ..broker.queue_flow import QueueCredit
from ..broker.queues.classic import ClassicQueue
from ..broker.queues.quorum import QuorumQueue
from ..broker.queues.quorum_publisher import RESEND_FOR, QuorumPublisher
from ..store.queued_message import QueuedMessage

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..broker.metadata.commands import DeclareQueue
    from ..broker.node import Node
    from ..broker.ports import Scheduler
    from ..broker.queue_flow import HeldPublisher
    from ..broker.consumer import Consumer
    from ..broker.queues.base import Queue
    from ..store.settlement import Settlement, Ticket

Done = Callable[[Any, "BaseException | None"], None]

# A consumer's acks remembered for its queue's next leader (Holding.acked): those a leader's
# death may lose are the last few milliseconds' (on the link, or not yet on a follower's log).
RECENT_ACKS = 1_000


class Peer(Protocol):
    """This node's link to a queue's home, as its stand-ins use it (warren.cluster.node_links.Peer)."""

    up: bool
    generation: int              # how many times its link came up (a delivery names the one it came on)
    busy: bool                   # its write buffer is full
    held: set[QueueCredit]       # stand-ins' credits holding publishers until it drains

    def publish(self, queue: RemoteQueue, message: Message, origin: tuple[str, int, int] | None = None
                ) -> Settlement: ...
    def request(self, meta: dict, done: Done, answer: Callable[[dict], Any]) -> None: ...
    def get(self, queue: RemoteQueue, no_ack: bool, done: Done) -> None: ...
    def consume(self, queue: RemoteQueue, consumer: Consumer, done: Done) -> None: ...
    def cancel(self, consumer: Consumer) -> None: ...
    def grant(self, consumer: Consumer) -> None: ...
    def settle(self, qm: RemoteMessage, ack: bool, requeue: bool) -> None: ...


class NodeLinks(Protocol):
    def peer(self, node: str) -> Peer: ...


class RemoteMessage(QueuedMessage):
    """A delivery from a queue's home: `seq` is the home's id of it on the link `link` to
    `home` (an ack after that link ended goes nowhere: the home gave the message back already,
    unless it is held by a consumer of a replicated queue, `holding`: its id is ~seq)."""

    __slots__ = ("link", "home", "holding")

    def __init__(self, did: int, message: Message, redelivered: bool, link: int, home: str,
                 holding: Holding | None = None):
        super().__init__(did, message, redelivered)
        self.link = link
        self.home = home
        self.holding = holding


class Holding:
    """What one consumer of a replicated queue holds, by message id, whichever node leads the
    queue; `holder` names it in the queue's log (unique to this run of this node)."""

    __slots__ = ("holder", "held", "acked")
    _ids = itertools.count(1)
    _run = uuid.uuid4().hex[:12]

    def __init__(self, node: str):
        self.holder = f"{node}/{self._run}/{next(self._ids)}"
        self.held: dict[int, RemoteMessage] = {}
        # Its latest acks: one sent to a leader that died may never have reached its log, and
        # the next leader would deliver the message again (told at a re-attach, it settles it).
        self.acked: deque[int] = deque(maxlen=RECENT_ACKS)


def home_down(home: str, queue: str, vhost: str) -> AMQPError:
    """RabbitMQ's error for every use of a queue whose home node is down."""
    return not_found(f"home node '{home}' of durable queue '{queue}' in vhost '{vhost}' is down or inaccessible")


class LinkCredit(QueueCredit):
    """A stand-in's publishers held back while the link to its home has more to write than it
    buffers (warren.cluster.node_link.WRITE_HIGH): let go when it drains or ends. The home's
    own credit flow then holds the link (its socket is read no faster than its store writes)."""

    __slots__ = ()

    def hold(self, publisher: HeldPublisher, scheduler: Scheduler | None) -> bool:
        peer = cast(RemoteQueue, self.queue).peer
        if not peer.busy:
            return False
        self.held[publisher] = None
        peer.held.add(self)
        return True


class RemoteQueue(ClassicQueue):
    remote = True

    def __init__(self, vhost, name: str, durable: bool, owner, auto_delete: bool, arguments: dict | None,
                 home: str, node: Node):
        super().__init__(vhost, name, durable, owner, auto_delete, arguments)
        self.home = home
        self.node = node  # this node (its node_links, its metadata log)
        self.counts = (0, 0)  # (messages, consumers) as the home last told them
        self.remote_stats = (0, 0, 0, 0)  # (ready, unacked, ready bytes, consumers): the same
        self.remote_active_tag: str | None = None  # (its single active consumer's tag: the same)

    @classmethod
    def stand_in(cls, node: Node, vhost, cmd: DeclareQueue) -> Self:
        """The stand-in of a queue the cluster's log declared on another node (MetadataStore.stand_in)."""
        assert cmd.node is not None
        return cls(vhost, cmd.name, cmd.durable, cmd.owner, cmd.auto_delete, cmd.arguments, cmd.node, node)

    @property
    def links(self) -> NodeLinks:
        links = self.node.node_links
        if links is None:
            raise internal_error(f"{self.describe()} lives on node '{self.home}', and this node has no node links")
        return cast("NodeLinks", links)

    @property
    def peer(self) -> Peer:
        return self.links.peer(self.home)

    @property
    def reachable(self) -> bool:
        links = self.node.node_links
        return links is not None and cast("NodeLinks", links).peer(self.home).up

    def down(self) -> Exception:
        return home_down(self.home, self.name, self.vhost.name)

    # what the home does -----------------------------------------------------------
    def publish(self, message: Message, ticket: Ticket | None = None) -> Settlement:
        self.stats["publish"] += 1
        peer = self.peer
        settlement = peer.publish(self, message)
        if peer.busy:  # the link to its home buffers more than it may: hold the publisher back
            self.vhost.pressed(self)
        return settlement

    def hold_publisher(self, publisher) -> bool:
        if self.credit is None:
            self.credit = LinkCredit(self)
        return self.credit.hold(publisher, None)

    def stats_from_home(self, ready: int, unacked: int, ready_bytes: int, consumers: int,
                        active_tag: str | None = None) -> None:
        """What the home last said of it (warren.cluster.node_links refreshes it for the API)."""
        self.remote_stats = (ready, unacked, ready_bytes, consumers)
        self.remote_active_tag = active_tag
        self.counts = (ready, consumers)

    def message_counts(self) -> tuple[int, int, int]:
        ready, unacked, ready_bytes, _ = self.remote_stats
        return ready, unacked, ready_bytes

    @property
    def consumer_count(self) -> int:
        return self.remote_stats[3]

    @property
    def single_active_consumer_tag(self) -> str | None:
        return self.remote_active_tag

    def counts_async(self, done: Done) -> None:
        self.peer.request({"op": "counts", **self._where()}, done, self._counted)

    def _counted(self, meta: dict) -> tuple[int, int]:
        self.counts = (int(meta["messages"]), int(meta["consumers"]))
        return self.counts

    def get_async(self, no_ack: bool, done: Done) -> None:
        self.peer.get(self, no_ack, done)

    def purge_async(self, done: Done) -> None:
        self.peer.request({"op": "purge", **self._where()}, done, lambda meta: int(meta["count"]))

    def delete_async(self, if_unused: bool, if_empty: bool, done: Done) -> None:
        """Deleted by its home, through the cluster's log: answered once this node has applied
        the deletion too (a passive declare here then finds no queue)."""
        def deleted(result: Any, error: BaseException | None) -> None:
            log = self.node.metadata.log
            if error is not None or log is None:
                done(None, error)
                return
            count, revision = result
            log.when_applied(revision, lambda: done(count, None))
        self.peer.request({"op": "delete", **self._where(), "if_unused": if_unused, "if_empty": if_empty}, deleted,
                          lambda meta: (int(meta["count"]), int(meta["revision"])))

    def consume_async(self, consumer: Consumer, done: Done) -> None:
        self.peer.consume(self, consumer, done)

    def _where(self) -> dict[str, str]:
        return {"vhost": self.vhost.name, "queue": self.name}

    # the queue-type contract, as a stand-in ---------------------------------------------
    @property
    def message_count(self) -> int:
        return self.counts[0]

    def declare_ok_counts(self) -> tuple[int, int]:
        return self.counts

    @property
    def delete_ok_count(self) -> int:
        return 0  # (its messages are the home's: the home answers a delete)

    def get(self):
        raise internal_error("basic.get of a queue of another node goes to its home (get_async)")

    def purge(self) -> int:
        raise internal_error("queue.purge of a queue of another node goes to its home (purge_async)")

    def add_consumer(self, consumer) -> None:
        self.consumers.add(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer) -> None:
        self.consumers.remove(consumer)
        self.peer.cancel(consumer)

    @property
    def unused_auto_delete(self) -> bool:
        return False  # the home's rule: it sees every node's consumers

    def deliver_ready(self) -> None:
        """Credit may have been freed for this node's consumers: grant it to the home."""
        if not self.deleted:
            peer = self.peer
            for consumer in self.consumers:
                peer.grant(consumer)

    def delivered(self, qm, no_ack: bool, get: bool = False, holder: str = "") -> None:
        if no_ack:
            self.stats["get_no_ack" if get else "deliver_no_ack"] += 1
        else:
            self.stats["get" if get else "deliver"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def ack(self, qm) -> None:
        self.stats["ack"] += 1
        self.peer.settle(qm, True, False)

    def reject(self, qm, requeue: bool, closed: bool = False) -> None:
        self.peer.settle(qm, False, requeue)

    def apply_settings(self) -> None:
        """Its TTLs, limits and expiry run at its home; here the settings are only shown."""

    def touch(self) -> None:
        pass

    def start_timers(self) -> None:
        pass


class RemoteQuorumQueue(RemoteQueue):
    """The stand-in of a quorum queue another node leads (warren.cluster.replicas): a quorum
    queue's checks here (its arguments, equivalence, delete flags, no global qos), the rest at
    its leader (its home).

    Its consumers outlive a leader: when the link to it ends they are *orphans* (not
    cancelled: their clients see nothing), keep what they hold, and re-attach to whichever
    node leads next (resume), claiming what they still hold; settlements made meanwhile wait
    (`pending`) and go to that node by message id. When this node is the one that leads next,
    they become consumers of its queue (`adopt`) and settle there (`successor`)."""

    CAPABILITIES = QuorumQueue.CAPABILITIES
    waits_for_leader = True
    check_delete = QuorumQueue.check_delete
    adjust_settings = QuorumQueue.adjust_settings
    _warn_once = QuorumQueue._warn_once

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._warned: set[str] = set()
        self.holdings: dict[Consumer, Holding] = {}
        self.orphans: set[Consumer] = set()
        self.pending: list[tuple[int, bool, bool]] = []  # (message id, ack, requeue)
        self.successor: Queue | None = None  # this node's own queue, once it leads here
        self.adopted: dict[int, QueuedMessage] = {}  # its messages that orphans held, by id
        self.publisher = QuorumPublisher(self)
        self.waiting_calls: list[tuple[float, Callable[[Done], None], Done, Callable[[], None]]] = []

    def publish(self, message: Message, ticket: Ticket | None = None) -> Settlement:
        self.stats["publish"] += 1
        resent = self.publisher.publish(message)
        if self.peer.busy:  # the link to its home buffers more than it may: hold the publisher back
            self.vhost.pressed(self)
        return resent

    def leader_in_reach(self) -> str | None:
        """(PublishRoute, until this node leads the queue: adopt gives its publisher to the queue)"""
        return self.home if self.reachable else None

    def send(self, message: Message, origin: tuple[str, int], low: int) -> Settlement:
        """(PublishRoute)"""
        return self.peer.publish(self, message, (*origin, low))

    # operations that wait for a leader -----------------------------------------------------
    def consume_async(self, consumer: Consumer, done: Done) -> None:
        self._when_led(lambda answered: self.peer.consume(self, consumer, answered), done,
                       lambda: done(None, None))  # (adopt moved the consumer to this node's queue)

    def get_async(self, no_ack: bool, done: Done) -> None:
        def here() -> None:  # (this node leads it now: its own queue answers, as ops.get)
            queue = cast("Queue", self.successor)
            qm = queue.get()
            if qm is not None:
                queue.delivered(qm, no_ack, True)
            done((qm, queue.message_count, queue), None)
        self._when_led(lambda answered: self.peer.get(self, no_ack, answered), done, here)

    def counts_async(self, done: Done) -> None:
        self._when_led(lambda answered: RemoteQueue.counts_async(self, answered), done,
                       lambda: done(cast("Queue", self.successor).declare_ok_counts(), None))

    def _when_led(self, call: Callable[[Done], None], done: Done, here: Callable[[], None],
                  since: float | None = None) -> None:
        """`call` the leader; while none is in reach (the one it had died and the next is not
        elected yet) or the node asked answers that it no longer leads, wait for the next one,
        RESEND_FOR seconds at most, as RabbitMQ's quorum queue client waits for a new leader
        (its channel answers then, where a classic queue's home down is a 404 at once).
        `here` answers instead if this node is the next leader (adopt)."""
        started = time.monotonic() if since is None else since

        def waits() -> bool:
            return not self.deleted and time.monotonic() - started < RESEND_FOR

        if not self.reachable and waits():
            self.waiting_calls.append((started, call, done, here))
            return

        def answered(result: Any, error: BaseException | None) -> None:
            if isinstance(error, AMQPError) and error.code == 404 and waits():
                self.waiting_calls.append((started, call, done, here))  # (tried again at the next resume)
            else:
                done(result, error)
        call(answered)

    def _call_waiting(self) -> None:
        calls, self.waiting_calls = self.waiting_calls, []
        for started, call, done, here in calls:
            if self.successor is not None:
                here()
            else:
                self._when_led(call, done, here, started)

    def stop_timers(self) -> None:
        """(Deleted: nothing resumes it any more.) What waits for a leader is answered now."""
        super().stop_timers()
        self.publisher.resend()
        self._call_waiting()

    def add_consumer(self, consumer) -> None:
        if consumer.credit.limit:
            raise not_implemented(f"{self.describe()} does not support global qos")
        super().add_consumer(consumer)

    def holding(self, consumer: Consumer) -> Holding:
        holding = self.holdings.get(consumer)
        if holding is None:
            holding = self.holdings[consumer] = Holding(self.node.config.node_name)
        return holding

    def remove_consumer(self, consumer) -> None:
        self.orphans.discard(consumer)
        self.holdings.pop(consumer, None)
        super().remove_consumer(consumer)

    # a leader lost, the next one found -------------------------------------------------
    def orphan(self, consumer: Consumer) -> None:
        """The link its leader's deliveries came on ended: it waits for the next leader."""
        self.orphans.add(consumer)

    def inherit(self, queue: Queue) -> None:
        """This node led the queue and no longer does (`queue`, its queue until now, gives its
        place to this stand-in): its consumers here stay, orphans until they re-attach to the
        new leader (what they hold was handed out as the leader's own: it comes back there),
        and its publisher's publishes it did not confirm go to the new leader (resume)."""
        publisher = cast(QuorumQueue, queue).publisher
        if publisher is not None:  # (what it did not confirm goes to the new leader: resume)
            self.publisher, publisher.route = publisher, self
        for consumer in [c for c in queue.consumers if not c.remote]:
            queue.consumers.remove(consumer)
            consumer.queue = self
            self.consumers.add(consumer)
            self.orphans.add(consumer)

    def resume(self) -> None:
        """Re-attach the orphans to the home (the queue's leader now) and send what they
        settled meanwhile, and the publishes it never answered; nothing while the link to it
        is down (tried again later)."""
        self.publisher.resend()
        self._call_waiting()
        if self.deleted or not self.reachable:
            return
        peer = self.peer
        orphans, self.orphans = self.orphans, set()
        for consumer in orphans:
            holding = self.holding(consumer)
            for qm in holding.held.values():  # (settled at this home from now on)
                qm.home, qm.link = self.home, peer.generation

            def resumed(_: Any, error: BaseException | None, consumer: Consumer = consumer) -> None:
                if error is None:
                    self.deliver_ready()
                elif isinstance(error, AMQPError) and error.code == 404 and not self.deleted:
                    self.orphans.add(consumer)  # (its home no longer leads it: the next one will)
                elif consumer in self.consumers:
                    self.consumers.remove(consumer)
                    self.holdings.pop(consumer, None)
                    consumer.channel.consumer_cancelled(consumer)
            peer.consume(self, consumer, resumed)
        self._send_pending()

    def _send_pending(self) -> None:
        if not self.pending:
            return
        if self.successor is not None:
            pending, self.pending = self.pending, []
            for off, ack, requeue in pending:
                qm = self.adopted.pop(off, None)
                if qm is not None:
                    ops.settle(qm, self.successor, None, ack, requeue)
            self.successor.deliver_ready()
        elif self.reachable:
            pending, self.pending = self.pending, []
            offs, acks, requeues = (list(t) for t in zip(*pending))
            self.peer.request({"op": "settle_parked", **self._where(), "offs": offs, "acks": acks,
                               "requeues": requeues}, lambda _, __: None, lambda meta: None)

    def adopt(self, queue: QuorumQueue) -> None:
        """This node leads the queue now (`queue`, which took this stand-in's place): its
        consumers become the queue's, what they still hold is claimed from it (and what they
        no longer hold goes back), and what they settle from now on is settled there."""
        old_home = self.peer
        self.successor = queue
        self.home = self.node.config.node_name
        consumers = list(self.consumers)
        self.consumers.clear()
        self.orphans.clear()
        for consumer in consumers:
            old_home.cancel(consumer)  # (if it was still attached there: a leader deposed, not dead)
            holding = self.holding(consumer)
            acked = set(holding.acked)
            for off, qm in queue.claim(holding.holder, [*holding.held, *acked]).items():
                if off in holding.held:
                    self.adopted[off] = qm
                elif off in acked:
                    queue.ack(qm)
                else:
                    queue.reject(qm, True)
            consumer.queue = queue
            queue.add_consumer(consumer)
        self._send_pending()
        queue.publisher, self.publisher.route = self.publisher, queue  # (its publishes go on in order there)
        self.publisher.resend()
        self._call_waiting()

    # settlement: by the link it came on, or by id once its leader changed ------------------
    def ack(self, qm) -> None:
        self.stats["ack"] += 1
        self._settle(qm, True, False)

    def reject(self, qm, requeue: bool, closed: bool = False) -> None:
        self._settle(qm, False, requeue)

    def _settle(self, qm: RemoteMessage, ack: bool, requeue: bool) -> None:
        holding = qm.holding
        if holding is None:
            self.peer.settle(qm, ack, requeue)
            return
        off = ~qm.seq
        holding.held.pop(off, None)
        if ack:
            holding.acked.append(off)
        if self.successor is None and qm.home == self.home and self.reachable and qm.link == self.peer.generation:
            self.peer.settle(qm, ack, requeue)
        else:
            self.pending.append((off, ack, requeue))
            self._send_pending()
