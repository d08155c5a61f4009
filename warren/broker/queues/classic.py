"""RabbitMQ's classic queue: FIFO, every message stored once in this node's store (in memory,
in segment files when durable and persistent, one store per priority with x-max-priority)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...store.priority import PriorityQueueStore
from ..queue_arguments import CLASSIC_CHECKS, EQUIVALENCE_ARGS, NOT_CLASSIC_ARGS
from ..queue_settings import QueueSettings
from .base import Queue
from .capabilities import Capabilities

if TYPE_CHECKING:
    from ...store import QueueStore
    from ...store.persister import Persister
    from ...store.stream import StreamLog


class ClassicQueue(Queue):
    CAPABILITIES = Capabilities(
        name="classic", module="rabbit_classic_queue",
        argument_checks=CLASSIC_CHECKS, refused_arguments=NOT_CLASSIC_ARGS,
        equivalence_arguments=EQUIVALENCE_ARGS,
        consumer_arguments=frozenset({"x-cancel-on-ha-failover", "x-priority", "x-credit"}))

    @classmethod
    def make_store(cls, persister: Persister | None, vhost: str, name: str, durable: bool,
                   arguments: dict[str, Any]) -> QueueStore | StreamLog | None:
        """x-max-priority above 0 gives one store per priority level (with 0 every message
        has priority 0: a plain store behaves the same)."""
        max_priority = arguments.get("x-max-priority")
        if max_priority:
            if persister is None:
                return PriorityQueueStore.in_memory(max_priority)
            return PriorityQueueStore.on_disk(persister, vhost, name, durable, max_priority)
        return super().make_store(persister, vhost, name, durable, arguments)

    def adjust_settings(self, s: QueueSettings) -> QueueSettings:
        """A classic queue ignores a dead-letter-strategy policy, as RabbitMQ's (the argument
        is refused)."""
        return replace(s, dead_letter_strategy="at-most-once") if s.dead_letter_strategy != "at-most-once" else s
