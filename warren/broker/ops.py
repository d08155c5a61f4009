"""The operations layer: declare, bind, delete, purge, publish, consume, cancel, get and
settle for every way in.

The AMQP channel, the management HTTP API, shovels, the health checks and internal
publishers (dead-lettering) all call these functions, so the rules - permissions, the `amq.`
prefix, the default-exchange rule, AE and DLX argument checks, exclusivity, the consume
arguments, routing, auto-delete on the last consumer's departure - exist once, in RabbitMQ's
order (as its management API declares through the channel's code path,
rabbit_mgmt_wm_queue.erl). Each function raises an AMQPError with RabbitMQ's code and text,
or returns a result that the caller turns into its own reply (a method frame, an HTTP status).
"""

from __future__ import annotations

import uuid

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Container

from ..amqp.body import Body
from ..amqp.codec import table_type_name
from ..amqp.message import Message
from ..amqp.properties import FLAG_EXPIRATION, FLAG_HEADERS, FLAG_USER_ID
from .consumer import Consumer, check_consume_arguments
from .enqueue import enqueue  # (ops.enqueue too: a channel's publish at tx.commit, after route())
from .errors import access_refused, command_invalid, not_allowed, not_found, precondition_failed, rs
from .exchanges import TYPES
from .limits import check_queue as check_queue_limit
from .metadata.change import Change, Operation
from .metadata.commands import Bind, DeclareExchange, DeclareQueue, DeleteExchange, DeleteQueue, Unbind
from . import missing_exchange
from .publish_checks import check_properties
from . import queues
from .queues import CONSUMER_ARGUMENTS, check_server_named
from .queues.quorum import QuorumQueue
from .queues.stream import StreamQueue
from .names import server_named
from .policy import best
from . import stream_offsets_request
from .sender_selected import route_sender_selected
from ..store.settlement import SETTLED, Settlement

if TYPE_CHECKING:
    from .auth import User
    from ..store.queued_message import QueuedMessage
    from .consumer import Gate
    from .credit import Credit
    from .exchanges.base import Exchange
    from .ports import DeliverySink
    from .queues.base import Queue
    from .links import ExclusiveOwner
    from .node import Node
    from .vhost import VHost

# Properties a publish is refused for when they are wrong (checked only if present).
_CHECKED_PROPS = FLAG_USER_ID | FLAG_EXPIRATION


@dataclass(eq=False)
class Actor:
    """Who performs an operation: a user in a vhost, and the connection that owns the
    exclusive queues it may use (None over HTTP: exclusive queues are never its own)."""

    broker: Node
    user: User
    vhost: VHost
    owner: ExclusiveOwner | None = None
    # Exchanges this actor has been allowed to write to (RabbitMQ caches this per channel).
    writable: set[str] = field(default_factory=set)
    # Node-local authority (warrenctl on the control socket, as rabbitmqctl on its node):
    # every permission and topic permission in every vhost.
    trusted: bool = False

    def check(self, what: str, kind: str, name: str) -> None:
        """403 unless the user may configure/write/read the named resource."""
        if not self.trusted:
            self.broker.check(self.user.name, self.vhost.name, what, kind, name)

    def check_topic(self, what: str, x: Exchange, routing_key: str) -> None:
        """403 unless a topic permission of the user lets it write (publish) or read (bind)
        `routing_key` on `x`; other exchange types have no topic permissions."""
        if self.broker.topic_permissions and x.type_name == "topic" and not self.trusted:
            self.broker.check_topic(self.user.name, self.vhost.name, what, x.name, routing_key)


def _check_exclusive(actor: Actor, queue: Queue) -> None:
    actor.vhost.check_exclusive(queue, actor.owner)


def _check_queue_use(actor: Actor, queue: Queue, reading: bool = False) -> None:
    """A queue named by an operation: reachable (a queue of another node: its home is up;
    a replicated queue's consume or get waits for its next leader instead: `reading`), and
    not another connection's exclusive queue, in RabbitMQ's order."""
    if not queue.reachable and not (reading and queue.waits_for_leader):
        raise queue.down()
    actor.vhost.check_exclusive(queue, actor.owner)


# ------------------------------------------------------------------ exchanges
@Operation
def declare_exchange(actor: Actor, name: str, type_name: str, passive: bool = False, durable: bool = False,
                     auto_delete: bool = False, internal: bool = False,
                     arguments: dict | None = None) -> Change[tuple[Exchange, bool]]:
    """exchange.declare: (exchange, created)."""
    vhost = actor.vhost
    if not passive and type_name not in TYPES:
        # RabbitMQ checks the type first (before the name); "" is a known Erlang atom but no
        # exchange type, hence its different text.
        raise command_invalid(f"{'invalid' if type_name == '' else 'unknown'} exchange type '{type_name}'")
    if name == "":
        raise access_refused("operation not permitted on the default exchange")
    if passive:
        return vhost.exchange(name), False
    actor.check("configure", "exchange", name)
    ae = (arguments or {}).get("alternate-exchange")
    if name not in vhost.exchanges and isinstance(ae, str) and not name.startswith("amq."):
        # An AE needs read on the exchange and write on the AE (checked after the amq.* name
        # rule, which the vhost applies).
        actor.check("read", "exchange", name)
        actor.check("write", "exchange", ae)
    return (yield DeclareExchange(vhost.name, name, type_name, durable, auto_delete, internal, arguments))


@Operation
def delete_exchange(actor: Actor, name: str, if_unused: bool = False) -> Change[bool]:
    """exchange.delete: whether it existed (deleting a missing exchange is no error)."""
    if name == "":
        raise access_refused("operation not permitted on the default exchange")
    if name.startswith("amq."):  # refused even for a missing amq.* name, as RabbitMQ
        raise access_refused(f"deletion of system {rs('exchange', name, actor.vhost.name)} not allowed")
    actor.check("configure", "exchange", name)
    return (yield DeleteExchange(actor.vhost.name, name, if_unused))


# ------------------------------------------------------------------- bindings
def _check_binding(actor: Actor, source: str, dest_kind: str, destination: str, routing_key: str) -> None:
    # RabbitMQ's order: write on the destination, the default-exchange rule, read on the source,
    # then (if the source exists) the topic permission to read the binding key.
    actor.check("write", dest_kind, destination)
    if source == "" or (dest_kind == "exchange" and destination == ""):
        raise access_refused("operation not permitted on the default exchange")
    actor.check("read", "exchange", source)
    x = actor.vhost.exchanges.get(source)
    if x is not None:
        actor.check_topic("read", x, routing_key)


@Operation
def bind(actor: Actor, source: str, dest_kind: str, destination: str, routing_key: str,
         arguments: dict | None) -> Change[None]:
    """queue.bind (dest_kind "queue") or exchange.bind ("exchange")."""
    vhost = actor.vhost
    _check_binding(actor, source, dest_kind, destination, routing_key)
    vhost.exchange(source)  # a missing source is reported first
    if dest_kind == "queue":
        _check_queue_use(actor, vhost.queue(destination))
    else:
        vhost.exchange(destination)
    yield Bind(vhost.name, source, dest_kind, destination, routing_key, arguments)


@Operation
def unbind(actor: Actor, source: str, dest_kind: str, destination: str, routing_key: str,
           arguments: dict | None) -> Change[None]:
    """queue.unbind / exchange.unbind: idempotent, even when either end is missing (3.10)."""
    vhost = actor.vhost
    _check_binding(actor, source, dest_kind, destination, routing_key)
    x = vhost.exchanges.get(source)
    dest = (vhost.queues if dest_kind == "queue" else vhost.exchanges).get(destination)
    if x is None or dest is None:
        return
    if dest_kind == "queue":
        _check_queue_use(actor, dest)
    yield Unbind(vhost.name, source, dest_kind, destination, routing_key, arguments)


# --------------------------------------------------------------------- queues
@Operation
def declare_queue(actor: Actor, name: str, passive: bool = False, durable: bool = False, exclusive: bool = False,
                  auto_delete: bool = False, arguments: dict | None = None) -> Change[tuple[Queue, bool]]:
    """queue.declare: (queue, created). An empty name gets a server-named queue."""
    vhost = actor.vhost
    existing = vhost.queues.get(name)
    if existing is not None and not existing.reachable and not existing.waits_for_leader:
        raise existing.down()  # (before any other check, as RabbitMQ; a quorum queue's counts wait)
    if passive:
        q = vhost.queue(name)
        _check_exclusive(actor, q)
        q.touch()  # a declare, even passive, restarts x-expires (RabbitMQ's stat)
        return q, False
    args = arguments or {}
    default_type = vhost.default_queue_type
    if default_type is not None and "x-queue-type" not in args and (
            not queues.TYPES[default_type].CAPABILITIES.durable_only or (durable and not exclusive and not auto_delete)):
        # RabbitMQ's augment_declare_args: the vhost's default type, where it is compatible.
        args = {**args, "x-queue-type": default_type}
    if name == "":
        check_server_named(args)  # a quorum queue needs a name
        name = server_named("amq.gen-")
    elif name.startswith("amq."):
        raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
    actor.check("configure", "queue", name)
    if name not in vhost.queues:  # only a new queue counts against max-queues (after configure)
        check_queue_limit(vhost, name)
    dlx = args.get("x-dead-letter-exchange")
    if name not in vhost.queues and dlx is not None:
        if not isinstance(dlx, (str, bytes)):
            raise precondition_failed(f"invalid type '{table_type_name(dlx)}' for arg "
                                      f"'x-dead-letter-exchange' in {rs('queue', name, vhost.name)}")
        actor.check("read", "queue", name)
        actor.check("write", "exchange", dlx if isinstance(dlx, str) else dlx.decode(errors="replace"))
    owner = actor.owner if exclusive else None
    counters = actor.broker.stats.node_counters
    counters["queues_declared"] += 1  # as RabbitMQ: every non-passive declare allowed to configure
    # On a cluster a queue lives on the node of the connection that declares it, and a
    # replicated one (quorum) is led from there first, with its replicas on other members.
    home = actor.broker.config.node_name if actor.broker.metadata.log is not None else None
    members, incarnation = replicas_of_new(actor.broker, vhost, name, args) if name not in vhost.queues else (None, None)
    if members:
        home = members[0]  # (its leader)
    q, created = yield DeclareQueue(vhost.name, name, durable and not exclusive, owner, auto_delete, args, home,
                                    members, incarnation)
    if created:
        counters["queues_created"] += 1
    else:
        q.touch()
    return q, created


def replicas_of_new(broker: Node, vhost: VHost, name: str, args: dict) -> tuple[tuple[str, ...] | None, str | None]:
    """A new quorum queue or stream declared through this cluster member: its members
    (placement: its leader first, this node unless its locator is balanced) and its
    incarnation; (None, None) for other queues, and on a node alone. A quorum queue has
    x-quorum-initial-group-size members (3 by default), a stream its initial-cluster-size
    (the policy's, else x-initial-cluster-size; every member of the cluster by default, as
    rabbit_stream_queue). The locator is the policy's `queue-leader-locator`, else the
    x-queue-leader-locator argument; random and least-leaders mean balanced, any other value
    client-local (rabbit_queue_location)."""
    links = broker.node_links
    queue_type = args.get("x-queue-type")
    if broker.metadata.log is None or links is None or queue_type not in ("quorum", "stream"):
        return None, None
    caps = (QuorumQueue if queue_type == "quorum" else StreamQueue).CAPABILITIES
    policy = best(vhost.policies, "queue", name, caps.policy_keys) if vhost.policies else None
    definition = policy.definition if policy is not None else {}
    default: int | None = 3
    if queue_type == "quorum":
        size = args.get("x-quorum-initial-group-size", 3)
    else:
        default = None  # (every member)
        size = definition.get("initial-cluster-size", args.get("x-initial-cluster-size"))
    locator = definition.get("queue-leader-locator", args.get("x-queue-leader-locator"))
    if isinstance(locator, bytes):
        locator = locator.decode(errors="replace")
    members = links.placement(size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else default,
                              locator in ("balanced", "random", "least-leaders"))
    return members, uuid.uuid4().hex


@Operation
def delete_queue(actor: Actor, name: str, if_unused: bool = False, if_empty: bool = False) -> Change[int]:
    """queue.delete: the number of ready messages it had (0 for a missing queue)."""
    q = queue_to_delete(actor, name)
    if q is None:
        return 0
    q.check_delete(if_unused, if_empty)
    return (yield DeleteQueue(actor.vhost.name, name))


def queue_to_delete(actor: Actor, name: str) -> Queue | None:
    """queue.delete's checks before the queue's own (configure permission, the queue, its
    reachability and exclusivity): the queue, or None when there is none (deleted already).
    A queue of another node is then deleted by its home (Channel._queue_delete)."""
    actor.check("configure", "queue", name)
    q = actor.vhost.queues.get(name)
    if q is not None:
        _check_queue_use(actor, q)
    return q


def readable_queue(actor: Actor, name: str) -> Queue:
    """The queue for basic.consume, basic.get and purge: read permission first (a missing
    queue is a 403 too), then the lookup, then exclusivity."""
    actor.check("read", "queue", name)
    q = actor.vhost.queue(name)
    _check_queue_use(actor, q, reading=True)
    return q


def purge_queue(actor: Actor, name: str) -> int:
    """queue.purge: the number of ready messages dropped."""
    return readable_queue(actor, name).purge()


# ------------------------------------------------------------------ consumers
def consume(actor: Actor, queue_name: str, tag: str, no_ack: bool, exclusive: bool, arguments: dict | None,
            prefetch: int, credit: Credit, sink: DeliverySink[Consumer], gate: Gate, prefix: bytes = b"",
            tags_in_use: Container[str] = ()) -> Consumer:
    """basic.consume: a new consumer of the queue, in RabbitMQ's order of checks (read
    permission, the queue, exclusivity; the tag; the arguments; what the queue type
    refuses; an exclusive consumer). The caller answers consume-ok, then lets the queue
    deliver (consumer.queue.deliver_ready()). `prefetch` is the consumer's own limit,
    `credit` its channel's (basic.qos global, shared by the channel's consumers), `sink`
    where its messages go and `gate` whether its connection may be sent to now."""
    q = readable_queue(actor, queue_name)
    if tag in tags_in_use:
        raise not_allowed(f"attempt to reuse consumer tag '{tag}'")
    caps = q.CAPABILITIES
    check_consume_arguments(arguments, q.describe(), caps.consumer_arguments, CONSUMER_ARGUMENTS, caps.module)
    q.check_consume(no_ack, prefetch, credit.limit, arguments)
    if q.consumers.exclusive_refused(exclusive):
        raise access_refused(f"{q.describe()} in exclusive use")
    consumer = Consumer(tag, sink, q, no_ack, exclusive, arguments, prefetch, credit, prefix, gate)
    q.add_consumer(consumer)
    return consumer


def cancel(consumer: Consumer) -> None:
    """basic.cancel, or its consumer's channel closing: the queue forgets it, and an
    auto-delete queue whose last consumer this was is deleted (RabbitMQ's rule, for every
    way in). The caller lets the queue deliver again once what the consumer held is back
    (a single active consumer's successor takes over)."""
    q = consumer.queue
    q.remove_consumer(consumer)
    if q.unused_auto_delete:
        q.vhost.delete_queue(q)  # (through the metadata store, unless it is gone already)


def get(actor: Actor, queue_name: str, no_ack: bool) -> tuple[Queue, QueuedMessage | None]:
    """basic.get: the queue and its next ready message (None: empty), handed out (settled
    at once with `no_ack`, else waiting for settle())."""
    q = readable_queue(actor, queue_name)
    qm = q.get()
    if qm is not None:
        q.delivered(qm, no_ack, True)
    return q, qm


def settle(qm: QueuedMessage, queue: Queue, consumer: Consumer | None, ack: bool, requeue: bool = False,
           closed: bool = False) -> None:
    """basic.ack, or basic.reject/nack (`requeue`; `closed`: given back by its closing channel),
    of one delivery (`consumer` None: a basic.get). The caller then lets the queues that got
    something back deliver again (queue.deliver_ready(), once per queue)."""
    if consumer is not None:
        consumer.unacked -= 1
    if ack:
        queue.ack(qm)
    else:
        queue.reject(qm, requeue, closed)


# -------------------------------------------------------------------- publish
def check_message_size(broker: Node, size: int) -> None:
    max_size = broker.config.limits.max_message_size
    if max_size and size > max_size:
        raise precondition_failed(f"message size {size} is larger than configured max size {max_size}")


def route(actor: Actor, exchange_name: str, routing_key: str, route_bytes: bytes, header: bytes,
          body: Body) -> tuple[Message, list]:
    """The checks and routing of one publish: (message, queues it goes to). The caller then
    enqueues (now, or at tx.commit) and answers an unroutable mandatory message.

    `route_bytes` are the exchange and routing-key shortstrs as basic.publish carried them,
    reused verbatim in deliveries; `header` is the content header payload as received."""
    vhost = actor.vhost
    x = vhost.exchanges.get(exchange_name)
    captured = False
    # The cache is by name: an exchange redeclared internal under that name must still refuse.
    if x is None or exchange_name not in actor.writable or x.internal:
        actor.check("write", "exchange", exchange_name)  # before the lookup, as RabbitMQ
        if x is None:
            if exchange_name == stream_offsets_request.NAME:  # Warren's request, not an exchange
                request = Message(exchange_name, routing_key, route_bytes, header, body)
                return stream_offsets_request.answer(actor, vhost, routing_key, request, readable_queue)
            # Warren's opt-in capture (warren.broker.missing_exchange), else RabbitMQ's 404: the
            # message, with its x-warren-missing-exchange header, is published to the capture
            # exchange as if the publisher had named it (the same property checks and routing).
            # No permission is needed there (the operator's configuration, which may be
            # internal), and topic permissions are not checked.
            captured_to = (missing_exchange.capture(vhost, exchange_name, route_bytes, header)
                           if vhost.missing_exchange is not None else None)
            if captured_to is None:
                raise not_found(f"no {rs('exchange', exchange_name, vhost.name)}")
            x, route_bytes, header = captured_to
            exchange_name, captured = x.name, True
        elif x.internal:
            raise access_refused(f"cannot publish to internal {x.describe()}")
        else:
            actor.writable.add(exchange_name)
    if actor.broker.topic_permissions and not captured:  # (tested here: a call per publish costs)
        actor.check_topic("write", x, routing_key)
    message = Message(exchange_name, routing_key, route_bytes, header, body)
    flags = header[12] << 8 | header[13]
    if flags & _CHECKED_PROPS:
        # user_id and expiration, checked after the exchange as RabbitMQ does.
        message.ttl = check_properties(message.properties, actor.user)
    if flags & FLAG_HEADERS and b"CC" in header:
        # CC / BCC headers (b"CC" is in both) add routing keys; checked after those, as RabbitMQ.
        queues = route_sender_selected(vhost, x, message)
    else:
        queues = vhost.route(x, routing_key, message)
    if vhost.remote_queues:
        # A classic queue whose home is down takes nothing: unroutable (as RabbitMQ). A quorum
        # queue whose leader is out of reach takes it, and its stand-in nacks it (as RabbitMQ's
        # channel nacks a quorum queue's publish it cannot hand to a leader): never a confirm
        # of a message that went nowhere.
        queues = [q for q in queues if q.reachable or q.CAPABILITIES.nacked_when_out_of_reach]
    xstats = x.stats
    xstats["publish_in"] += 1
    xstats["publish_out"] += len(queues)
    return message, queues


def publish(actor: Actor, exchange_name: str, routing_key: str, route_bytes: bytes, header: bytes, body: Body,
            may_hold: bool = False) -> tuple[Message, list, Settlement]:
    """basic.publish: route() and enqueue(): (message, the queues it went to, what a confirm
    of it waits for). With `may_hold` (a channel's publish) queues may hold a big persistent
    body's records back while their consumers may ack it first (warren.store.persister)."""
    message, queues = route(actor, exchange_name, routing_key, route_bytes, header, body)
    if not queues:
        return message, queues, SETTLED
    ticket = actor.broker.durability.ticket(message) if may_hold else None
    return message, queues, enqueue(message, queues, True, ticket)
