"""Which class a declared queue gets: x-queue-type picks the queue type (classic by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import rs
from .queue_arguments import check_durable_only, check_segment_size
from .queues.classic import ClassicQueue
from .queues.quorum import QuorumQueue
from .queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..store import QueueStore
    from .vhost import VHost

# x-queue-type -> class. queue_arguments.validate_arguments refuses any other type first,
# with RabbitMQ's error, so a lookup here does not fail.
QUEUE_TYPES: dict[str, type[ClassicQueue]] = {ClassicQueue.queue_type: ClassicQueue,
                                              QuorumQueue.queue_type: QuorumQueue,
                                              StreamQueue.queue_type: StreamQueue}
DEFAULT_QUEUE_TYPE = ClassicQueue.queue_type


def make_queue(vhost: VHost, name: str, durable: bool, exclusive_owner: object | None, auto_delete: bool,
               arguments: dict[str, Any] | None, store: QueueStore | None) -> ClassicQueue:
    """A new queue of the type its (validated) x-queue-type argument names, classic if none.
    A quorum or stream queue's declare properties are checked here, after its arguments, as
    RabbitMQ does."""
    queue_type = (arguments or {}).get("x-queue-type", DEFAULT_QUEUE_TYPE)
    if queue_type != ClassicQueue.queue_type:
        check_durable_only(rs("queue", name, vhost.name), durable, exclusive_owner is not None, auto_delete)
    if queue_type == StreamQueue.queue_type:
        check_segment_size(arguments or {})
    return QUEUE_TYPES[queue_type](vhost, name, durable, exclusive_owner, auto_delete, arguments, store)
