"""A virtual host: its exchanges and queues, and message routing between them."""

import logging
from typing import TYPE_CHECKING, Any, Callable

from .errors import access_refused, not_found, precondition_failed, resource_locked, rs
from .exchanges import TYPES, Binding, DefaultExchange, Exchange
from .policy import apply_to_exchange, apply_to_queue
from . import dead_letter
from .queues import checked_type
from .metadata.commands import DeleteQueue

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..store.settlement import Settlement
    from .ports import Scheduler
    from .queues.base import Queue
    from .links import ExclusiveOwner

log = logging.getLogger("warren.routing")

PREDECLARED = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
               ("amq.headers", "headers"), ("amq.match", "headers"))


class VHost:
    def __init__(self, name: str, broker=None):
        self.name = name
        self.broker = broker  # told when durable definitions change (None: nobody to tell)
        self.description = ""
        self.tags: list = []
        # RabbitMQ's default_queue_type metadata (set when an import creates the vhost), given
        # to declares without x-queue-type by ops.declare_queue.
        self.default_queue_type: str | None = None
        # Warren's capture exchange for publishes to missing exchanges (None: off, RabbitMQ's
        # 404): warren.broker.missing_exchange.
        self.missing_exchange: str | None = None
        self.default_exchange = DefaultExchange(self, "", durable=True)
        self.exchanges: dict = {"": self.default_exchange}
        self.queues: dict = {}
        self.remote_queues = 0  # of those, stand-ins for queues of other nodes (warren.cluster)
        # destination (queue or exchange) -> the bindings to it from any source, so deleting a
        # queue or an exchange finds its bindings without a scan: the Binding itself while
        # there is one (most queues have one binding), else {Binding: None}.
        self._bindings_to: dict = {}
        # name -> warren.broker.policy.Policy; each exchange and queue points at its own.
        self.policies: dict = {}
        self.operator_policies: dict = {}
        # The "limits" runtime parameter (max-connections, max-queues): None while there is none
        # (warren.broker.limits).
        self.limits: dict[str, int] | None = None
        # name -> warren.broker.shovel.Shovel: the vhost's "shovel" runtime parameters, running.
        self.shovels: dict = {}
        # (component, name) -> value: the "federation-upstream" and "federation-upstream-set"
        # parameters (warren.broker.federation_upstreams), and (exchange, upstream) ->
        # warren.broker.federation.ExchangeLink: the federation links running here.
        self.federation: dict[tuple[str, str], Any] = {}
        self.federation_links: dict = {}
        for xname, xtype in PREDECLARED:
            self.exchanges[xname] = TYPES[xtype](self, xname, durable=True)
        # RabbitMQ's firehose tracer exchange exists in every vhost (internal: no publishing).
        self.exchanges["amq.rabbitmq.trace"] = TYPES["topic"](self, "amq.rabbitmq.trace", durable=True,
                                                              internal=True)

    # lookups -----------------------------------------------------------------
    def exchange(self, name: str):
        x = self.exchanges.get(name)
        if x is None:
            raise not_found(f"no {rs('exchange', name, self.name)}")
        return x

    def queue(self, name: str):
        q = self.queues.get(name)
        if q is None:
            raise not_found(f"no {rs('queue', name, self.name)}")
        return q

    # exchanges ---------------------------------------------------------------
    def declare_exchange(self, name, type_name, durable=True, auto_delete=False, internal=False,
                         arguments=None):
        """Create an exchange or check an existing one is equivalent. Returns (exchange, created)."""
        existing = self.exchanges.get(name)
        if existing is not None:
            existing.check_equivalent(type_name, durable, auto_delete, internal, arguments)
            return existing, False
        if name.startswith("amq."):
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        ae = (arguments or {}).get("alternate-exchange", "")
        if not isinstance(ae, str):
            from ..amqp.codec import table_type_name
            raise precondition_failed(
                f"invalid type '{table_type_name(ae)}' for arg 'alternate-exchange' in "
                f"{rs('exchange', name, self.name)}")
        x = TYPES[type_name](self, name, durable, auto_delete, internal, arguments)
        self.exchanges[name] = x
        if self.policies:
            apply_to_exchange(self, x)
        if durable or self._member:
            self._definitions_changed("exchange", (self.name, name))
        return x, True

    def delete_exchange(self, name: str, if_unused=False) -> bool:
        x = self.exchanges.get(name)
        if x is None:
            return False
        if if_unused and x.bindings:
            raise precondition_failed(f"{x.describe()} in use")
        del self.exchanges[name]
        if self.broker is not None:
            self.broker.stats.retired.exchange_deleted(x)
        if x.durable or self._member:
            self._definitions_changed("exchange", (self.name, name))
        for binding in x.clear_bindings():
            self._forget(binding)
            if x.durable and binding.destination.durable or self._member:
                self._definitions_changed("binding", (self.name, name, binding.key), binding)
        # bindings where it is the destination
        for binding in self.bindings_to(x):
            self._remove_binding(binding.source, binding.key)
        return True

    # queues ------------------------------------------------------------------
    def declare_queue(self, name, durable=False, exclusive_owner=None, auto_delete=False, arguments=None,
                      store=None, kind=None):
        """(queue, created); `store`: a new queue's, made elsewhere (a replicated queue's leader),
        and `kind` its class if not its type's (a stream's replica on a cluster member)."""
        existing = self.queues.get(name)
        if existing is not None:
            self.check_exclusive(existing, exclusive_owner, strict=True)
            existing.check_equivalent(durable, auto_delete, arguments)
            return existing, False
        queue_type = checked_type(self.name, name, durable, exclusive_owner is not None, auto_delete, arguments)
        if store is None:
            persister = self.broker.persister if self.broker is not None else None
            store = queue_type.make_store(persister, self.name, name, durable, arguments or {})
        q = (kind or queue_type)(self, name, durable, exclusive_owner, auto_delete, arguments, store)
        self.queues[name] = q
        if self.policies or self.operator_policies:
            apply_to_queue(self, q)
        q.apply_settings()
        if durable and exclusive_owner is None or self._member:
            self._definitions_changed("queue", (self.name, name))
        return q, True

    @property
    def _member(self) -> bool:
        """On a cluster member every queue, exchange and binding is in the journal (its tables are
        the cluster log's: warren.broker.definitions)."""
        return self.broker is not None and self.broker.metadata.member

    def add_queue(self, q: "Queue") -> None:
        """A queue made elsewhere (a stand-in for a queue of another node)."""
        self.queues[q.name] = q
        self.remote_queues += 1
        if self.policies or self.operator_policies:
            apply_to_queue(self, q)
        self._definitions_changed("queue", (self.name, q.name))

    def check_exclusive(self, queue, owner: "ExclusiveOwner | None", strict=False) -> None:
        """405 if the queue is exclusive to another connection (or, strictly, if the
        exclusive flag of a redeclare does not match)."""
        if queue.owner is None and (not strict or owner is None):
            return
        if queue.owner == owner:
            return
        raise resource_locked(
            f"cannot obtain exclusive access to locked {queue.describe()}. It could be originally "
            "declared on another connection or the exclusive property value does not match that "
            "of the original declaration.")

    def remove_queue(self, queue: "Queue") -> int:
        """Remove a queue; its consumers are cancelled. Returns the ready count it had (the
        metadata store's DeleteQueue)."""
        if self.queues.get(queue.name) is not queue:
            return 0
        del self.queues[queue.name]
        queue.deleted = True
        if self.broker is not None:
            self.broker.stats.node_counters["queues_deleted"] += 1
            self.broker.stats.retired.queue_deleted(queue)
        queue.stop_timers()
        if queue.durable or self._member:
            self._definitions_changed("queue", (self.name, queue.name))
        if queue.remote:
            self.remote_queues -= 1
        count = queue.delete_ok_count
        queue.store.destroy()
        for binding in self.bindings_to(queue):
            self._remove_binding(binding.source, binding.key)
        for consumer in list(queue.consumers):
            consumer.channel.consumer_cancelled(consumer)
        queue.consumers.clear()
        return count

    def replace_queue(self, old: "Queue", new: "Queue") -> None:
        """On a cluster member, a replicated queue changes hands here (its leader moved to this
        node or away from it): `new` takes `old`'s place and bindings; old's consumers are
        cancelled (the metadata store's replace_queue)."""
        for binding in list(self.bindings_to(old)):
            source = binding.source
            source.remove_binding(binding.key)
            self._forget(binding)
            self.bind(source, new, binding.routing_key, binding.arguments)
        self.queues[new.name] = new
        self.remote_queues += int(bool(new.remote)) - int(bool(old.remote))
        old.deleted = True
        old.stop_timers()
        for consumer in list(old.consumers):
            consumer.channel.consumer_cancelled(consumer)
        old.consumers.clear()
        if self.policies or self.operator_policies:
            apply_to_queue(self, new)
        new.apply_settings()
        self._definitions_changed("queue", (self.name, new.name))

    # the queues' host (warren.broker.queues.host.QueueHost) ----------------------
    @property
    def scheduler(self) -> "Scheduler | None":
        return self.broker.scheduler if self.broker is not None else None

    def delete_queue(self, queue: "Queue") -> None:
        if queue.deleted:
            return
        if self.broker is None:  # a vhost alone (unit tests of routing): no store to go through
            self.remove_queue(queue)
        else:
            self.broker.metadata.submit(DeleteQueue(self.name, queue.name))

    def dead_letter(self, queue: "Queue", message: "Message", reason: str) -> "Settlement | None":
        return dead_letter.publish(self, queue, message, reason)

    def pressed(self, queue: "Queue") -> None:
        if self.broker is not None:
            self.broker.queue_flow.pressed.add(queue)

    def _definitions_changed(self, kind=None, key=None, binding=None) -> None:
        if self.broker is not None:  # (the store's own tables: it applies the command doing this)
            self.broker.metadata.record(kind, key, binding)

    # bindings ----------------------------------------------------------------
    def bind(self, source, destination, routing_key: str, arguments: dict) -> None:
        source.validate_binding(routing_key, arguments)
        binding = Binding(source, destination, routing_key, arguments)
        if not source.add_binding(binding):
            return
        held = self._bindings_to.get(destination)
        if held is None:
            self._bindings_to[destination] = binding
        elif type(held) is dict:
            held[binding] = None
        else:
            self._bindings_to[destination] = {held: None, binding: None}
        if source.durable and destination.durable or self._member:
            self._definitions_changed("binding", (self.name, source.name, binding.key), binding)

    def unbind(self, source, destination, routing_key: str, arguments: dict) -> None:
        key = Binding(source, destination, routing_key, arguments).key
        if key in source.bindings:
            self._remove_binding(source, key)

    def _remove_binding(self, source: Exchange, key) -> None:
        binding = source.remove_binding(key)
        if binding is not None:
            self._forget(binding)
            if source.durable and binding.destination.durable or self._member:
                self._definitions_changed("binding", (self.name, source.name, key), binding)
        if source.auto_delete and not source.bindings and self.exchanges.get(source.name) is source:
            self.delete_exchange(source.name)

    def _forget(self, binding: Binding) -> None:
        """Drop a binding its source no longer has from the index by destination."""
        held = self._bindings_to.get(binding.destination)
        if held is binding:
            del self._bindings_to[binding.destination]
        elif type(held) is dict:
            held.pop(binding, None)
            if not held:
                del self._bindings_to[binding.destination]

    def bindings_to(self, destination) -> list:
        """The bindings whose destination is this queue or exchange, oldest first."""
        held = self._bindings_to.get(destination)
        if held is None:
            return []
        return list(held) if type(held) is dict else [held]

    # routing -----------------------------------------------------------------
    def route(self, exchange, routing_key: str, message) -> list:
        """The queues a message goes to, following exchange-to-exchange bindings and alternate
        exchanges exactly as RabbitMQ does: an exchange's AE is tried when that exchange's own
        bindings select nothing, and no exchange is visited twice."""
        if exchange.is_default:
            q = self.queues.get(routing_key)
            return [q] if q is not None else []
        dests = exchange.match(routing_key, message)
        if exchange.alternate_exchange is None:
            # Fast path: no AE and only queues bound.
            for d in dests:
                if d.kind != "queue":
                    break
            else:
                return list(dests)
        return self.follow(exchange, dests, lambda x: x.match(routing_key, message))

    def follow(self, exchange, dests: list, match: Callable[[Exchange], list]) -> list:
        """The queues reached from `dests`, what `exchange` selected, following
        exchange-to-exchange bindings and alternate exchanges (`match(x)`: what exchange x
        selects): an exchange's AE is tried when that exchange's own bindings select
        nothing, no exchange is visited twice, each queue is routed to once."""
        queues: dict = {}
        seen = {exchange}
        work = [(exchange, dests)]
        while work:
            x, dests = work.pop()
            if not dests:
                ae_name = x.alternate_exchange
                if ae_name is not None:
                    ae = self.exchanges.get(ae_name)
                    if ae is None:
                        log.warning("alternate exchange '%s' of %s does not exist; message dropped",
                                    ae_name, x.describe())
                    elif ae not in seen:
                        seen.add(ae)
                        work.append((ae, match(ae)))
                continue
            for d in dests:
                if d.kind == "queue":
                    queues[d] = None
                elif d not in seen:
                    seen.add(d)
                    work.append((d, match(d)))
        return list(queues)
