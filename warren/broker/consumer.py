"""A consumer: a subscription of one channel to one queue, with its own prefetch credit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .ports import DeliverySink


class Gate(Protocol):
    """Whether the consumer's connection may be sent to now (its throttle)."""

    delivering: bool


class Consumer:
    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix", "gate")

    def __init__(self, tag: str, channel: DeliverySink, queue, no_ack: bool, exclusive: bool,
                 arguments: dict | None, prefetch: int, prefix: bytes, gate: Gate):
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments or {}
        self.prefetch = prefetch  # per-consumer limit (basic.qos global=false), 0 = none
        self.unacked = 0
        self.prefix = prefix  # the constant start of this consumer's basic.deliver payload
        self.gate = gate

    def ready(self) -> bool:
        """Whether a message may be pushed to this consumer now."""
        if not self.gate.delivering:
            return False
        if self.no_ack:
            return True  # as in RabbitMQ, prefetch limits only apply to acked deliveries
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        ch = self.channel
        return not (ch.global_prefetch and ch.unacked_count >= ch.global_prefetch)
