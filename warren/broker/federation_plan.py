"""What a federation link sets up on its upstream: plain data, handed by the link
(warren.broker.federation) to its upstream end (warren.server.remote_ends) through the
ShovelLinks port."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExchangePlan:
    """What an exchange link declares and binds on its upstream (the server's end carries
    it out: warren.server.remote_ends.UpstreamExchangeEnd)."""

    exchange: str            # the upstream exchange, declared like the downstream one if missing
    exchange_type: str
    durable: bool
    auto_delete: bool
    internal: bool
    exchange_arguments: dict
    queue: str               # "federation: X -> CLUSTER..." (durable)
    queue_arguments: dict
    internal_exchange: str   # the queue's name + " A" or " B", of type x-federation-upstream
    old_internal_exchange: str
    internal_arguments: dict
    prefetch: int
    no_ack: bool
    consumer_tag: str
    bindings: list[tuple[str, dict]] = field(default_factory=list)
    bind_nowait: bool = False
    # The bindings as they are with the old internal exchange instead (x-bound-from names it).
    old_bindings: list[tuple[str, dict]] = field(default_factory=list)

    def swap(self) -> None:
        """Set up the old internal exchange and delete the new one: the end does so where the
        new one is the one in use upstream (see UpstreamExchangeEnd.start)."""
        self.internal_exchange, self.old_internal_exchange = self.old_internal_exchange, self.internal_exchange
        self.bindings, self.old_bindings = self.old_bindings, self.bindings


@dataclass
class QueuePlan:
    """What a queue link declares upstream: the upstream queue, like the downstream one if
    it is missing; then it consumes from it while the queue here wants messages."""

    queue: str
    durable: bool
    auto_delete: bool
    arguments: dict
    prefetch: int
    no_ack: bool
    consumer_tag: str
