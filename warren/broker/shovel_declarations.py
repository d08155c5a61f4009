"""A static shovel's declarations (rabbit_amqp091_shovel's resource_decl): AMQP methods an end
runs in order, as a channel of the shovel's own connection, before the shovel consumes or
publishes there. An end on another broker sends them over its link and waits for each reply
(REPLIES; warren.server.remote_ends); an end on this broker runs them through the operations
layer as the shovel's actor (declare_local), with a channel's rules for an empty queue name,
one after the other (on a cluster, each change waits for the cluster's log).
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


def declare_local(actor: ops.Actor, methods: tuple[spec.Method, ...], exclusive: list[Queue], run: Runner,
                  then: Callable[[str], None]) -> None:
    """Run the declarations on this broker, each through `run` (at once, or through a
    cluster's log; an AMQPError as the channel would be closed with), then `then(the name of
    the last queue they declared, "" if none)`. The exclusive queues they create are appended
    to `exclusive`: they go when the shovel stops, as with its connection."""
    end = _LocalEnd(actor, exclusive)

    def step(i: int) -> None:
        if i == len(methods):
            then(end.last)
            return
        method = methods[i]
        operation, args, after = _LOCAL[type(method)](end, method)

        def done(result: Any) -> None:
            after(result)
            step(i + 1)
        run(operation, args, done)
    step(0)


# What carries out one of ops' functions with its arguments and then takes its result (an
# Operation through the cluster's log on a member: warren.broker.shovel.Shovel._run).
Runner = Callable[[Callable[..., Any], tuple, Callable[[Any], None]], None]
# A declaration as a step: the function of ops, its arguments, what takes its result.
Step = tuple[Callable[..., Any], tuple, Callable[[Any], None]]


def _ignore(result: Any) -> None:
    pass


class _LocalEnd:
    """The declarations' channel: a channel's handlers of these methods, as steps."""

    def __init__(self, actor: ops.Actor, exclusive: list[Queue]):
        self.actor = actor
        self.exclusive = exclusive
        self.last = ""  # the last queue declared

    def queue_declare(self, m: Any) -> Step:
        # (no empty-name shortcut for a passive declare, as on a channel)
        def declared(result: tuple[Queue, bool]) -> None:
            q, created = result
            if created and q.owner is not None:
                self.exclusive.append(q)
            self.last = q.name
        return ops.declare_queue, (self.actor, m.queue, m.passive, m.durable, m.exclusive, m.auto_delete,
                                   m.arguments), declared

    def _binding(self, m: Any) -> tuple[str, str]:
        name = queue_name(m.queue, self.last)
        # An empty key on the last queue is its name, as on a channel.
        return name, (name if m.queue == "" and m.routing_key == "" else m.routing_key)

    def queue_bind(self, m: Any) -> Step:
        name, key = self._binding(m)
        return ops.bind, (self.actor, m.exchange, "queue", name, key, m.arguments), _ignore

    def queue_unbind(self, m: Any) -> Step:
        name, key = self._binding(m)
        return ops.unbind, (self.actor, m.exchange, "queue", name, key, m.arguments), _ignore

    def queue_purge(self, m: Any) -> Step:
        return ops.purge_queue, (self.actor, queue_name(m.queue, self.last)), _ignore

    def queue_delete(self, m: Any) -> Step:
        return ops.delete_queue, (self.actor, queue_name(m.queue, self.last), m.if_unused, m.if_empty), _ignore

    def exchange_declare(self, m: Any) -> Step:
        return ops.declare_exchange, (self.actor, m.exchange, m.type, m.passive, m.durable, m.auto_delete,
                                      m.internal, m.arguments), _ignore

    def exchange_delete(self, m: Any) -> Step:
        return ops.delete_exchange, (self.actor, m.exchange, m.if_unused), _ignore

    def exchange_bind(self, m: Any) -> Step:
        return ops.bind, (self.actor, m.source, "exchange", m.destination, m.routing_key, m.arguments), _ignore

    def exchange_unbind(self, m: Any) -> Step:
        return ops.unbind, (self.actor, m.source, "exchange", m.destination, m.routing_key, m.arguments), _ignore


_LOCAL: dict[type[spec.Method], Callable[[_LocalEnd, Any], Step]] = {
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
