"""Queue types, one module each, and their registry: x-queue-type names one, and every other
part of the broker asks its Capabilities record (capabilities.py). A new type is a module
with a Queue subclass (base.py) and its line in TYPES."""

from __future__ import annotations

from typing import Any

from ..errors import precondition_failed, rs
from ..queue_arguments import check_durable_only, check_queue_type, validate_arguments
from .base import Queue
from .capabilities import Capabilities
from .classic import ClassicQueue
from .quorum import QuorumQueue
from .stream import StreamQueue

# x-queue-type -> its class, in RabbitMQ's order of types (rabbit_queue_type:discover).
TYPES: dict[str, type[Queue]] = {t.CAPABILITIES.name: t for t in (ClassicQueue, QuorumQueue, StreamQueue)}
DEFAULT = ClassicQueue.CAPABILITIES.name
# Every type's consumer arguments: one a queue's type does not take is refused.
CONSUMER_ARGUMENTS = frozenset().union(*(t.CAPABILITIES.consumer_arguments for t in TYPES.values()))


def type_of(arguments: dict[str, Any] | None) -> type[Queue]:
    """The type x-queue-type names (already checked by checked_type), the default without one."""
    return TYPES[(arguments or {}).get("x-queue-type", DEFAULT)]


def checked_type(vhost: str, name: str, durable: bool, exclusive: bool, auto_delete: bool,
                 arguments: dict[str, Any] | None) -> type[Queue]:
    """A new queue's type, once its declare passes RabbitMQ's checks in RabbitMQ's order:
    x-queue-type, the type's arguments, then the declare properties a durable-only type
    refuses."""
    what = rs("queue", name, vhost)
    args = arguments or {}
    check_queue_type(args, what, TYPES)
    queue_type = type_of(args)
    caps = queue_type.CAPABILITIES
    validate_arguments(args, what, caps.argument_checks, caps.refused_arguments, caps.module)
    if caps.durable_only:
        check_durable_only(what, durable, exclusive, auto_delete)
    return queue_type


def check_server_named(arguments: dict[str, Any] | None) -> None:
    """queue.declare with an empty name: only types that allow it (classic)."""
    args = arguments or {}
    if args.get("x-queue-type") in TYPES:
        caps = type_of(args).CAPABILITIES
        if not caps.server_named:
            raise precondition_failed(f"Cannot declare a server-named queue for type {caps.module}")


__all__ = ["CONSUMER_ARGUMENTS", "Capabilities", "ClassicQueue", "DEFAULT", "Queue", "QuorumQueue", "StreamQueue",
           "TYPES", "check_server_named", "checked_type", "type_of"]
