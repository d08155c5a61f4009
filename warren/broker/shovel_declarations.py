"""A static shovel's declarations (rabbit_amqp091_shovel's resource_decl): AMQP methods an end
runs in order, as a channel of the shovel's own connection, before the shovel consumes or
publishes there. An end on another broker sends them over its link and waits for each reply
(REPLIES; warren.server.remote_ends); an end on this broker runs them through the operations
layer as the shovel's actor (declare_local), with a channel's rules for an empty queue name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..amqp import spec
from . import ops
from .errors import not_found

if TYPE_CHECKING:
    from .queues.base import Queue

# The methods a declaration may be, each with the reply it waits for.
REPLIES: dict[type[spec.Method], type[spec.Method]] = {
    spec.ExchangeDeclare: spec.ExchangeDeclareOk,
    spec.ExchangeDelete: spec.ExchangeDeleteOk,
    spec.ExchangeBind: spec.ExchangeBindOk,
    spec.ExchangeUnbind: spec.ExchangeUnbindOk,
    spec.QueueDeclare: spec.QueueDeclareOk,
    spec.QueueBind: spec.QueueBindOk,
    spec.QueueUnbind: spec.QueueUnbindOk,
    spec.QueuePurge: spec.QueuePurgeOk,
    spec.QueueDelete: spec.QueueDeleteOk,
}


def queue_name(name: str, last: str) -> str:
    """A queue name as a channel reads it: "" is the last queue declared on it."""
    if name == "":
        if last == "":
            raise not_found("no previously declared queue")
        return last
    return name


def declare_local(actor: ops.Actor, methods: tuple[spec.Method, ...], exclusive: list[Queue]) -> str:
    """Run the declarations on this broker (an AMQPError as the channel would be closed
    with); the name of the last queue they declared ("" if none). The exclusive queues they
    create are appended to `exclusive`: they go when the shovel stops, as with its connection."""
    end = _LocalEnd(actor, exclusive)
    for method in methods:
        _LOCAL[type(method)](end, method)
    return end.last


class _LocalEnd:
    """The declarations' channel: a channel's handlers of these methods."""

    def __init__(self, actor: ops.Actor, exclusive: list[Queue]):
        self.actor = actor
        self.exclusive = exclusive
        self.last = ""  # the last queue declared

    def queue_declare(self, m: Any) -> None:
        # (no empty-name shortcut for a passive declare, as on a channel)
        q, created = ops.declare_queue(self.actor, m.queue, m.passive, m.durable, m.exclusive, m.auto_delete,
                                       m.arguments)
        if created and q.owner is not None:
            self.exclusive.append(q)
        self.last = q.name

    def _binding(self, m: Any) -> tuple[str, str]:
        name = queue_name(m.queue, self.last)
        # An empty key on the last queue is its name, as on a channel.
        return name, (name if m.queue == "" and m.routing_key == "" else m.routing_key)

    def queue_bind(self, m: Any) -> None:
        name, key = self._binding(m)
        ops.bind(self.actor, m.exchange, "queue", name, key, m.arguments)

    def queue_unbind(self, m: Any) -> None:
        name, key = self._binding(m)
        ops.unbind(self.actor, m.exchange, "queue", name, key, m.arguments)

    def queue_purge(self, m: Any) -> None:
        ops.purge_queue(self.actor, queue_name(m.queue, self.last))

    def queue_delete(self, m: Any) -> None:
        ops.delete_queue(self.actor, queue_name(m.queue, self.last), m.if_unused, m.if_empty)

    def exchange_declare(self, m: Any) -> None:
        ops.declare_exchange(self.actor, m.exchange, m.type, m.passive, m.durable, m.auto_delete, m.internal,
                             m.arguments)

    def exchange_delete(self, m: Any) -> None:
        ops.delete_exchange(self.actor, m.exchange, m.if_unused)

    def exchange_bind(self, m: Any) -> None:
        ops.bind(self.actor, m.source, "exchange", m.destination, m.routing_key, m.arguments)

    def exchange_unbind(self, m: Any) -> None:
        ops.unbind(self.actor, m.source, "exchange", m.destination, m.routing_key, m.arguments)


_LOCAL: dict[type[spec.Method], Callable[[_LocalEnd, Any], None]] = {
    spec.ExchangeDeclare: _LocalEnd.exchange_declare,
    spec.ExchangeDelete: _LocalEnd.exchange_delete,
    spec.ExchangeBind: _LocalEnd.exchange_bind,
    spec.ExchangeUnbind: _LocalEnd.exchange_unbind,
    spec.QueueDeclare: _LocalEnd.queue_declare,
    spec.QueueBind: _LocalEnd.queue_bind,
    spec.QueueUnbind: _LocalEnd.queue_unbind,
    spec.QueuePurge: _LocalEnd.queue_purge,
    spec.QueueDelete: _LocalEnd.queue_delete,
}
