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

from typing import TYPE_CHECKING, Any, Callable, Protocol, Self, cast

from ..broker.errors import AMQPError, internal_error, not_found, not_implemented
from ..broker.queue_flow import QueueCredit
from ..broker.queues.classic import ClassicQueue
from ..broker.queues.quorum import QuorumQueue
from ..store.queued_message import QueuedMessage

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..broker.metadata.commands import DeclareQueue
    from ..broker.node import Node
    from ..broker.ports import Scheduler
    from ..broker.queue_flow import HeldPublisher
    from ..broker.consumer import Consumer
    from ..store.settlement import Settlement, Ticket

Done = Callable[[Any, "BaseException | None"], None]


class Peer(Protocol):
    """This node's link to a queue's home, as its stand-ins use it (warren.cluster.node_links.Peer)."""

    up: bool
    busy: bool                   # its write buffer is full
    held: set[QueueCredit]       # stand-ins' credits holding publishers until it drains

    def publish(self, queue: RemoteQueue, message: Message) -> Settlement: ...
    def request(self, meta: dict, done: Done, answer: Callable[[dict], Any]) -> None: ...
    def get(self, queue: RemoteQueue, no_ack: bool, done: Done) -> None: ...
    def consume(self, queue: RemoteQueue, consumer: Consumer, done: Done) -> None: ...
    def cancel(self, consumer: Consumer) -> None: ...
    def grant(self, consumer: Consumer) -> None: ...
    def settle(self, qm: RemoteMessage, ack: bool, requeue: bool) -> None: ...


class NodeLinks(Protocol):
    def peer(self, node: str) -> Peer: ...


class RemoteMessage(QueuedMessage):
    """A delivery from a queue's home: `seq` is the home's id of it on the link `link`
    (an ack after that link ended goes nowhere: the home gave the message back already)."""

    __slots__ = ("link",)

    def __init__(self, did: int, message: Message, redelivered: bool, link: int):
        super().__init__(did, message, redelivered)
        self.link = link


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

    def stats_from_home(self, ready: int, unacked: int, ready_bytes: int, consumers: int) -> None:
        """What the home last said of it (warren.cluster.node_links refreshes it for the API)."""
        self.remote_stats = (ready, unacked, ready_bytes, consumers)
        self.counts = (ready, consumers)

    def message_counts(self) -> tuple[int, int, int]:
        ready, unacked, ready_bytes, _ = self.remote_stats
        return ready, unacked, ready_bytes

    @property
    def consumer_count(self) -> int:
        return self.remote_stats[3]

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

    def delivered(self, qm, no_ack: bool, get: bool = False) -> None:
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
    its leader (its home)."""

    CAPABILITIES = QuorumQueue.CAPABILITIES
    check_delete = QuorumQueue.check_delete
    adjust_settings = QuorumQueue.adjust_settings
    _warn_once = QuorumQueue._warn_once

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._warned: set[str] = set()

    def add_consumer(self, consumer) -> None:
        if consumer.credit.limit:
            raise not_implemented(f"{self.describe()} does not support global qos")
        super().add_consumer(consumer)
