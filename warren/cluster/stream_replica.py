"""A stream on a cluster (warren.cluster.replicas replicates it as it does a quorum queue, with
a message per entry: warren.store.replicated_stream). Each member node holds a replica, and the
stream is a ReplicatedStreamQueue there: its consumers read the local replica, as RabbitMQ 3.10
reads a stream from the local member (offsets are the same on every replica), and publishes go
to its leader, over the node link when another node leads. A node without a replica keeps a
RemoteStreamQueue stand-in: publishes go to the leader, and a consume is refused as RabbitMQ
refuses it (rabbit_stream_queue:check_queue_exists_in_local_node)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..broker.errors import precondition_failed
from ..broker.queues.stream import StreamQueue
from ..store.replicated_stream import ReplicatedStream
from .remote_queue import LinkCredit, RemoteQueue

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..broker.vhost import VHost
    from ..store.settlement import Settlement
    from .remote_queue import Peer


class ReplicatedStreamQueue(StreamQueue):
    """A stream whose replica this node holds; `home` is its leader's node."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        assert isinstance(self.store, ReplicatedStream)
        self.replica: ReplicatedStream = self.store
        self._link_credit: LinkCredit | None = None

    @property
    def home(self) -> str:
        return self.replica.leader

    @property
    def writable_here(self) -> bool:
        return self.replica.leading

    @property
    def peer(self) -> Peer:
        links = cast("VHost", self.vhost).broker.node_links  # (a cluster member's vhost)
        assert links is not None, "a replicated stream is a cluster member's"
        return cast("Peer", links.peer(self.home))

    def publish(self, message: Message, ticket: object = None) -> Settlement:
        if self.replica.leading:
            return super().publish(message, ticket)
        self.stats["publish"] += 1
        peer = self.peer
        settlement = peer.publish(cast(RemoteQueue, self), message)  # (nacked if its leader is out of reach)
        if peer.busy:  # the link to the leader buffers more than it may: hold the publisher back
            self.vhost.pressed(self)
        return settlement

    def hold_publisher(self, publisher) -> bool:
        if self.replica.leading:
            return super().hold_publisher(publisher)
        if self._link_credit is None:
            self._link_credit = LinkCredit(self)
        return self._link_credit.hold(publisher, None)


class RemoteStreamQueue(RemoteQueue):
    """The stand-in of a stream this node holds no replica of."""

    CAPABILITIES = StreamQueue.CAPABILITIES
    check_delete = StreamQueue.check_delete
    adjust_settings = StreamQueue.adjust_settings

    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict | None) -> None:
        StreamQueue.check_consume(cast(StreamQueue, self), no_ack, prefetch, global_prefetch, arguments)
        raise precondition_failed(f"queue '{self.describe()}' does not have a replica on the local node")
