"""The port between a shovel and its ends on other brokers.

A shovel whose source or destination URI names a host (warren.amqp.uri.Network) gets that
end from the node's ShovelLinks (the server's warren.server.remote_ends, over an AMQP
connection of its own); an end on this broker goes through the operations layer instead.
The shovel sees a remote end only through these Protocols: the model does no socket I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ..amqp.body import Body
    from ..amqp.message import Message
    from ..amqp.uri import Network
    from ..store.settlement import Settlement
    from .federation_plan import ExchangePlan, QueuePlan
    from .shovel_config import Config


class RemoteSource(Protocol):
    """A consumer on another broker's queue (src-queue, or a queue bound to src-exchange)."""

    # What the queue held when the consumer started (a passive declare's message count),
    # for src-delete-after queue-length.
    queue_length: int

    def ack(self, delivery_tag: int) -> None: ...

    def reject(self, delivery_tag: int) -> None:
        """Give a delivery back (basic.nack with requeue)."""

    def pause(self) -> None:
        """Stop reading deliveries (no-ack: nothing else bounds them)."""

    def resume(self) -> None: ...

    def close(self) -> None:
        """Close the connection: what is unacked goes back to the queue there."""


class FederationUpstream(RemoteSource, Protocol):
    """An exchange link's end on its upstream: its queue, consumed, bound through the
    internal exchange to the upstream exchange with the downstream's bindings."""

    # The upstream's cluster_name (from its connection.start), None if it did not say.
    cluster_name: str | None

    def bind(self, routing_key: str, arguments: dict) -> None:
        """exchange.bind upstream exchange -> internal exchange (in the background, in order)."""

    def unbind(self, routing_key: str, arguments: dict) -> None: ...

    def cleanup(self) -> None:
        """Delete the queue and the internal exchange upstream, then close."""


class UpstreamQueue(RemoteSource, Protocol):
    """A queue link's end on its upstream: the upstream queue, consumed only when asked."""

    def consume(self, on: bool) -> None:
        """basic.consume (with x-priority -1) or basic.cancel, without waiting."""

    def cleanup(self) -> None:
        """Close (a queue link declares nothing of its own upstream)."""


class RemoteDestination(Protocol):
    """A publisher to another broker (with confirms in ack-mode on-confirm)."""

    @property
    def writable(self) -> bool:
        """False while its socket's buffer is full: take no more deliveries."""

    def publish(self, route: bytes, header: bytes, body: Body) -> Settlement:
        """basic.publish; what its confirm will settle (SETTLED without confirms)."""

    def close(self) -> None: ...


class LinkUser(Protocol):
    """The shovel, as its remote ends report to it."""

    name: str

    @property
    def connection_name(self) -> str:
        """What its connections are named ("Shovel NAME", "Federation link (...)")."""

    def remote_delivery(self, source: RemoteSource, delivery_tag: int, message: Message,
                        redelivered: bool) -> None: ...

    def remote_closed(self, end: RemoteSource | RemoteDestination, reason: str) -> None:
        """An end's connection closed or failed; `reason` as RabbitMQ's status shows it."""

    def remote_cancelled(self, source: RemoteSource) -> None:
        """The broker cancelled the consumer (its queue was deleted)."""

    def remote_writable(self) -> None:
        """The destination's socket drained."""


# What an open reports: the end, or None and why it failed (RabbitMQ's reason).
Opened = Callable[["RemoteSource | RemoteDestination | None", "str | None"], None]


class ShovelLinks(Protocol):
    """Opens a shovel's ends on other brokers (asynchronously: `done` is called once)."""

    def open_source(self, user: LinkUser, endpoint: Network, config: Config, done: Opened) -> None: ...

    def open_destination(self, user: LinkUser, endpoint: Network, config: Config, done: Opened) -> None: ...

    def open_upstream(self, user: LinkUser, endpoint: Network, plan: ExchangePlan, done: Opened) -> None:
        """A federation exchange link's upstream end (a FederationUpstream)."""

    def open_upstream_queue(self, user: LinkUser, endpoint: Network, plan: QueuePlan, done: Opened) -> None:
        """A federation queue link's upstream end (an UpstreamQueue)."""
