"""The ports between the broker model and the layers above it.

The model (queues, vhosts, the store's persister) never imports the session or the server:
it talks to them through these Protocols, as RabbitMQ's queues return actions to the channel
instead of calling into it. The session layer implements the delivery sink (a channel) and
the store's sync waiter (warren.store.settlement.SyncWaiter); the server implements the
transport and the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from ..store.queued_message import QueuedMessage

# The consumer type a sink is handed (warren.broker.consumer.Consumer): a type parameter, so
# that the ports need not import the consumer module, which refers to its sink.
C = TypeVar("C", contravariant=True)


@dataclass(frozen=True)
class TLSInfo:
    """What a connection over TLS knows of its TLS session (set once the handshake is done)."""

    protocol: str                  # as OpenSSL names it: "TLSv1.3"
    cipher: str                    # OpenSSL's name of the suite: "TLS_AES_256_GCM_SHA384"
    peer_cert: bytes | None = None  # the client's certificate (DER), verified; None if it sent none


class Transport(Protocol):
    """The byte pipe under one AMQP connection (the server's asyncio protocol)."""

    peer: tuple[str, int]   # the client's address
    local: tuple[str, int]  # the address the client connected to
    tls: TLSInfo | None     # None: not over TLS

    def write(self, data: bytes) -> None: ...

    def writelines(self, chunks: list) -> None:
        """Write the chunks in order, keeping references rather than copies where it can."""

    def close(self) -> None: ...

    def close_later(self, seconds: float) -> None:
        """Close after a delay unless the peer closes first (RabbitMQ's silent close)."""

    def schedule_flush(self, flush: Callable[[], None]) -> None:
        """Call `flush` once the current batch of events has been handled (once per tick)."""

    def heartbeat_negotiated(self, seconds: int) -> None:
        """The handshake finished tuning: start heartbeats (0: none)."""

    def handshake_done(self) -> None:
        """connection.open succeeded: stop the handshake timeout, which covers the whole
        handshake (a client that stops after tune-ok is closed too, as in RabbitMQ)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class DeliverySink(Protocol[C]):
    """Where a consumer's messages go: the channel that consumes. A queue only calls it:
    whether a message may go is the consumer's to say (Consumer.ready: its own prefetch and
    its channel's Credit, warren.broker.credit)."""

    def deliver(self, consumer: C, qm: QueuedMessage) -> None:
        """Send one message to `consumer` (the queue has taken it off its ready list)."""

    def consumer_cancelled(self, consumer: C) -> None:
        """The queue went away: forget the consumer and tell the client if it asked to be told."""


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Timers for the model (TTL expiry, x-expires, consumer timeouts), injected by the server
    so the model stays testable without an event loop."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...

    def now(self) -> float:
        """Monotonic seconds."""
