"""Which class a declared queue gets: the seam where quorum and stream queues will plug in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .queues.classic import ClassicQueue

if TYPE_CHECKING:
    from ..store import QueueStore
    from .vhost import VHost

# x-queue-type -> class. queue_arguments.validate_arguments refuses any other type first,
# with RabbitMQ's error, so a lookup here does not fail.
QUEUE_TYPES: dict[str, type[ClassicQueue]] = {ClassicQueue.queue_type: ClassicQueue}
DEFAULT_QUEUE_TYPE = ClassicQueue.queue_type


def make_queue(vhost: VHost, name: str, durable: bool, exclusive_owner: object | None, auto_delete: bool,
               arguments: dict[str, Any] | None, store: QueueStore | None) -> ClassicQueue:
    """A new queue of the type its (validated) x-queue-type argument names, classic if none."""
    queue_type = (arguments or {}).get("x-queue-type", DEFAULT_QUEUE_TYPE)
    return QUEUE_TYPES[queue_type](vhost, name, durable, exclusive_owner, auto_delete, arguments, store)
