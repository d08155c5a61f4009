"""What a queue asks of the node it lives on: the port between a queue type and the rest of
the broker. A queue holds its host (its vhost, warren.broker.vhost.VHost, on this node) and
reaches nothing else above it: no channel, no broker, no operations layer. A queue of a
clustered or multi-process broker gets a host that forwards these calls where they belong."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from ...amqp.message import Message
    from ...store.settlement import Settlement
    from ..ports import Scheduler

# The queue the host is given back: base.Queue, which holds a QueueHost[Queue]. A parameter
# rather than an import, so that the port stays below the queues that use it.
HostedQueue = TypeVar("HostedQueue", contravariant=True)


class QueueHost(Protocol[HostedQueue]):
    name: str  # the vhost's

    @property
    def scheduler(self) -> Scheduler | None:
        """The node's timers (None before the server's loop runs, and in unit tests)."""

    def dead_letter(self, queue: HostedQueue, message: Message, reason: str) -> Settlement | None:
        """Republish a message leaving `queue` for good to its dead-letter exchange: the
        copies' settlement handle, or None when it goes nowhere."""

    def delete_queue(self, queue: HostedQueue) -> None:
        """Delete the queue (its x-expires ran out, its last consumer of an auto-delete queue
        left): its consumers are cancelled (on a cluster member, once the cluster's log has
        the deletion)."""

    def pressed(self, queue: HostedQueue) -> None:
        """The queue holds more than its consumers take: publishers into it may be held back
        (warren.broker.queue_flow)."""
