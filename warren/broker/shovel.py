"""Dynamic shovels: RabbitMQ's shovel plugin (runtime parameters of component "shovel",
rabbit_shovel_parameters / rabbit_shovel_worker / rabbit_amqp091_shovel), between queues and
exchanges of this broker or of other brokers.

A shovel consumes from a queue (src-queue, or a server-named exclusive queue bound to
src-exchange with src-exchange-key), with prefetch (src-prefetch-count) bounding what is in
flight, and republishes each message to dest-queue (through the default exchange),
dest-exchange (+ dest-exchange-key) or, with neither, the exchange and routing key it was
published with. An end on this broker ("amqp://", "amqp:///VHOST") is an internal consumer
or publisher of the operations layer (ops.consume, ops.publish: routing, alternate
exchanges, property checks, queue limits, durable writes): no socket, the shovel is its own
DeliverySink, Gate and SyncWaiter. An end whose URI names a host is an AMQP connection of
its own, "Shovel NAME", opened through the node's ShovelLinks (warren.broker.shovel_links;
the server's warren.server.remote_ends). A list of URIs is redundant brokers: one is picked
at random at each (re)connect.

ack-mode on-confirm (the default) acks the source only once the destination has the
message as a publisher confirm says so: here, once its store batch is fsynced; on another
broker, once it confirmed. A kill -9 of either side at any instant therefore loses nothing
(the source's copy is settled after the destination's is safe; a message may arrive twice,
as in RabbitMQ). A destination that is lost with publishes unconfirmed gives their sources'
copies back. on-publish acks the source as soon as the message is published; no-ack
consumes without acks.

src-delete-after: "never" (the default); "queue-length": move as many messages as the
source queue held when the shovel started, then delete the shovel's own parameter; an
integer N: move N messages, then delete it. Deliveries are taken from the queue only up to
that count, so messages published meanwhile stay in the source queue.

Deliveries are not forwarded from inside the queue's delivery loop: they are collected and
forwarded on the next loop tick (the destination may be the source itself, or route back to
it). Each tick ends with durability.flush(), as a connection's flush does.

AMQP 1.0 (src-protocol / dest-protocol amqp10) is refused.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..amqp import reencode as rt
from ..amqp.codec import shortstr
from ..amqp.erlang import erl_json, erl_string
from ..amqp.properties import FLAG_HEADERS
from ..amqp.uri import Direct, Network, UriError, parse as parse_amqp_uri, remove_credentials
from .metadata.change import Change, Operation
from . import ops
from .auth import User
from .consumer import Consumer
from .credit import Credit
from .errors import AMQPError
from .metadata.commands import ClearShovel, SetShovel
from .names import server_named
from .parameter_validation import binary, boolean, enum, invalid_uri, is_int, is_number, number, proplist
from .links import ConnectionLink, ExclusiveOwner, link_key
from .shovel_config import DEFAULT_PREFETCH, DEFAULT_RECONNECT_DELAY, Config
from .shovel_declarations import declare_local, queue_name
from ..store.settlement import Settlement

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..store.queued_message import QueuedMessage
    from .shovel_links import Opened, RemoteDestination, RemoteSource, ShovelLinks
    from .node import Node
    from .ports import Timer
    from .vhost import VHost

log = logging.getLogger("warren.shovel")

COMPONENT = "shovel"
NACK_BACKOFF = 1.0             # seconds without deliveries after the destination refused one
# The user a shovel acts as (RabbitMQ: the direct connection's "none"): trusted, so no
# permission checks, and an impersonator, so messages keep the user_id they were published with.
SHOVEL_USER = User("none", "", tags=("impersonator",))

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp10", "amqp091")
# rabbit_amqqueue:declare_args() and consume_args() of RabbitMQ 3.10.8: the keys the
# *-queue-args and src-consumer-args objects may have.
DECLARE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                "x-dead-letter-strategy", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
                "x-max-in-memory-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
                "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size", "x-max-age",
                "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator")
CONSUME_ARGS = ("x-priority", "x-cancel-on-ha-failover", "x-stream-offset")
# dest-publish-properties: the P_basic fields rabbit_shovel_parameters:validate_properties
# takes (no headers), string or number, with the wire type Warren writes them as.
PUBLISH_PROPERTIES = (("content_type", "str"), ("content_encoding", "str"), ("delivery_mode", "octet"),
                      ("priority", "octet"), ("correlation_id", "str"), ("reply_to", "str"),
                      ("expiration", "str"), ("message_id", "str"), ("timestamp", "timestamp"),
                      ("type", "str"), ("user_id", "str"), ("app_id", "str"), ("cluster_id", "str"))
_PROPERTY_BITS = {"content_type": 1 << 15, "content_encoding": 1 << 14, "delivery_mode": 1 << 12,
                  "priority": 1 << 11, "correlation_id": 1 << 10, "reply_to": 1 << 9, "expiration": 1 << 8,
                  "message_id": 1 << 7, "timestamp": 1 << 6, "type": 1 << 5, "user_id": 1 << 4,
                  "app_id": 1 << 3, "cluster_id": 1 << 2}


class _CannotConnect(Exception):
    """The shovel's "connection" to a vhost fails (the vhost does not exist)."""


class ShovelError(ValueError):
    """A shovel definition refused: RabbitMQ's validation errors (and Warren's own), in order."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


# ================================================================== validation
def _queue_name(key, value):
    """rabbit_parameter_validation:amqp091_queue_name, and Warren: not empty (RabbitMQ takes
    "" and the shovel then fails: a source of "" is no queue, a destination drops everything)."""
    if not isinstance(value, str):
        return f"{key} should be binary, actually was {erl_json(value)}"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > 255:
        return f"{key} should be less than 255 bytes, actually was {size}"
    if not value:
        return f"{key} must not be empty"
    return None


def _short_binary(key, value):
    """A binary that must fit a shortstr (an exchange name or routing key)."""
    error = binary(key, value)
    if error is None and len(value.encode("utf-8", "surrogatepass")) > 255:
        return f"{key} should be at most 255 bytes, actually was {len(value.encode('utf-8', 'surrogatepass'))}"
    return error


def _prefetch(key, value):
    """A number in RabbitMQ; Warren also wants what basic.qos can carry (RabbitMQ takes 1.5
    or -1 and its shovel then fails to start)."""
    error = number(key, value)
    if error is None and not (is_int(value) and 0 <= value <= 65535):
        return f"{key} should be an integer from 0 to 65535, actually was {erl_json(value)}"
    return error


def _delete_after(key, value):
    if value in ("never", "queue-length") or (is_int(value) and value >= 0):
        return None
    return (f'{key} should be a number greater than or equal to 0, "never" or "queue-length", '
            f"actually was {erl_json(value)}")


def _args(allowed):
    def check(key, value):
        return proplist(key, [(k, lambda _k, _v: None, False) for k in allowed], value) or None
    return check


def _properties(key, value):
    def prop(kind):
        def check(k, v):
            if kind == "str":
                error = binary(k, v)
                if error is None and len(v.encode("utf-8", "surrogatepass")) > 255:
                    return f"{k} should be at most 255 bytes, actually was {len(v.encode('utf-8', 'surrogatepass'))}"
                return error
            error = number(k, v)
            limit = 255 if kind == "octet" else (1 << 64) - 1
            if error is None and not (is_int(v) and 0 <= v <= limit):
                return f"{k} should be an integer from 0 to {limit}, actually was {erl_json(v)}"
            return error
        return check
    return proplist(key, [(k, prop(kind), False) for k, kind in PUBLISH_PROPERTIES], value) or None


def parse_uri(uri: str, node: str = "nonode@nohost") -> Direct | Network:
    """amqp_uri:parse; UriError with RabbitMQ's validation text (`node`: this node's name,
    which some of amqp_uri's errors print)."""
    try:
        return parse_amqp_uri(uri, node=node)
    except UriError as err:
        raise UriError(invalid_uri(uri, err.reason)) from None


def _uri_check(broker: Node, user: User | None):
    """rabbit_shovel_parameters:validate_uri: a URI or a non-empty list of them; a URI of
    this broker (no host) needs a vhost that exists and that the user setting it may use."""
    def check(key, value):
        if isinstance(value, list):
            uris = value
            if not uris:
                return f"{key} should name a URI, actually was []"
        elif isinstance(value, str):
            uris = [value]
        else:
            return f"{key} should be list, actually was {erl_json(value)}"
        for uri in uris:
            if not isinstance(uri, str):  # (validate_uri takes a non-binary for a list)
                return f"{key} should be list, actually was {erl_json(uri)}"
            try:
                endpoint = parse_uri(uri, broker.config.node_name)
            except UriError as err:
                return err.reason
            if user is not None and isinstance(endpoint, Direct):
                vhost = endpoint.vhost
                if vhost not in broker.vhosts or (user.name, vhost) not in broker.permissions:
                    return f'user "{user.name}" may not connect to vhost "{vhost}"'
        return None
    return check


def validate(broker: Node, name: str, value: Any, user: User | None) -> Config:
    """rabbit_shovel_parameters:validate, then parse: a Config, or ShovelError with
    RabbitMQ's texts (and Warren's for what it refuses). `user` is who sets it (None: an
    import at start or a trusted caller, unchecked as RabbitMQ's internal user)."""
    if isinstance(value, list) and not value:
        value = {}
    if not isinstance(value, dict):
        raise ShovelError([f"{name} not a list {erl_json(value)}"])
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key) == "amqp10":
            raise ShovelError([f"{key} amqp10: Warren's shovels speak AMQP 0-9-1 only"])
    errors: list[str] = []
    protocols_known = all(value.get(k, "amqp091") in PROTOCOLS for k in ("src-protocol", "dest-protocol"))
    if protocols_known:  # (RabbitMQ crashes, 500, on another protocol: its enum check says why here)
        sx, sq = "src-exchange" in value, "src-queue" in value
        if not sx and not sq:
            errors.append("Must specify 'src-exchange' or 'src-queue'")
        elif sx and sq:
            errors.append("Cannot specify 'src-exchange' and 'src-queue'")
        delete_after = value.get("src-delete-after", value.get("delete-after"))
        if is_int(delete_after) and value.get("ack-mode") == "no-ack":
            errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
        if "dest-exchange" in value and "dest-queue" in value:
            errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    uri = _uri_check(broker, user)
    constraints = [
        ("reconnect-delay", number, False),
        ("ack-mode", enum(ACK_MODES), False),
        ("src-protocol", enum(PROTOCOLS), False),
        ("dest-protocol", enum(PROTOCOLS), False),
        ("src-uri", uri, True),
        ("src-exchange", _short_binary, False),
        ("src-exchange-key", _short_binary, False),
        ("src-queue", _queue_name, False),
        ("src-queue-args", _args(DECLARE_ARGS), False),
        ("src-consumer-args", _args(CONSUME_ARGS), False),
        ("prefetch-count", _prefetch, False),
        ("src-prefetch-count", _prefetch, False),
        ("delete-after", _delete_after, False),
        ("src-delete-after", _delete_after, False),
        ("dest-uri", uri, True),
        ("dest-exchange", _short_binary, False),
        ("dest-exchange-key", _short_binary, False),
        ("dest-queue", _queue_name, False),
        ("dest-queue-args", _args(DECLARE_ARGS), False),
        ("add-forward-headers", boolean, False),
        ("add-timestamp-header", boolean, False),
        ("dest-add-forward-headers", boolean, False),
        ("dest-add-timestamp-header", boolean, False),
        ("publish-properties", _properties, False),
        ("dest-publish-properties", _properties, False),
    ]
    errors.extend(proplist(name, constraints, value))
    if errors:
        raise ShovelError(errors)
    return _parse(value)


def _uris(value) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


def _parse(v: dict) -> Config:
    return Config(
        src_uris=_uris(v["src-uri"]), dest_uris=_uris(v["dest-uri"]),
        src_queue=v.get("src-queue"), src_exchange=v.get("src-exchange"),
        src_exchange_key=v.get("src-exchange-key", ""),
        src_queue_args=dict(v.get("src-queue-args") or {}), src_consumer_args=dict(v.get("src-consumer-args") or {}),
        dest_queue=v.get("dest-queue"), dest_exchange=v.get("dest-exchange"),
        dest_exchange_key=v.get("dest-exchange-key"), dest_queue_args=dict(v.get("dest-queue-args") or {}),
        ack_mode=v.get("ack-mode", "on-confirm"),
        delete_after=v.get("src-delete-after", v.get("delete-after", "never")),
        prefetch=v.get("src-prefetch-count", v.get("prefetch-count", DEFAULT_PREFETCH)),
        add_forward_headers=v.get("dest-add-forward-headers", v.get("add-forward-headers", False)),
        add_timestamp_header=v.get("dest-add-timestamp-header", v.get("add-timestamp-header", False)),
        publish_properties=dict(v.get("dest-publish-properties", v.get("publish-properties")) or {}),
        reconnect_delay=v.get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
    )


# ================================================================== the registry
@Operation
def set_shovel(broker: Node, vhost: VHost, name: str, value: Any, user: User | None) -> Change[bool]:
    """PUT /api/parameters/shovel/VHOST/NAME: validate, then (re)start it through the metadata
    store; True if it is new."""
    config = validate(broker, name, value, user)
    return (yield SetShovel(vhost.name, name, value, config))


@Operation
def clear_shovel(broker: Node, vhost: VHost, name: str) -> Change[bool]:
    """DELETE of the parameter: the shovel stops (the metadata store's ClearShovel)."""
    return (yield ClearShovel(vhost.name, name))


def parameters(vhost: VHost) -> list[dict]:
    return [{"value": s.value, "vhost": vhost.name, "component": COMPONENT, "name": s.name}
            for s in vhost.shovels.values()]


def start_all(broker: Node) -> None:
    """The broker's loop runs (Broker.set_scheduler): start the shovels its definitions
    brought back and the config file's, once every queue is recovered."""
    for shovel in statuses(broker):
        shovel.start_soon()


def vhost_deleted(broker: Node, vhost: VHost) -> None:
    """A vhost goes: its shovels stop (their parameters go with it); shovels elsewhere that
    move from or to it end as RabbitMQ's do when their connection to it is closed, and retry
    after reconnect-delay (failing while the vhost does not exist)."""
    for shovel in list(vhost.shovels.values()):
        shovel.stop()
    vhost.shovels.clear()
    for other in statuses(broker):
        if other.active and vhost.name in (other.src_vhost, other.dest_vhost):
            if other.src_vhost == vhost.name:
                other.queue = None  # (its source went with the vhost: nothing to give back to)
            other._terminate("needed a restart", restart=True)


def statuses(broker: Node) -> list[Shovel]:
    """Every shovel of the node: the config file's (static), then the vhosts' (dynamic)."""
    return [*broker.static_shovels.values(), *(s for v in broker.vhosts.values() for s in v.shovels.values())]


def restart(broker: Node, vhost: VHost, name: str) -> bool:
    """DELETE /api/shovels/vhost/VHOST/NAME/restart: stop the worker and start it again;
    False if this node does not run it (on a cluster, another member may)."""
    shovel = vhost.shovels.get(name)
    if shovel is None or not shovel.runs_here():
        return False
    shovel.stop()
    fresh = vhost.shovels[name] = Shovel(broker, vhost.name, name, shovel.value, shovel.config)
    fresh.start_soon()
    return True


def _raise(error: BaseException) -> None:
    raise error


def _local_time(t: time.struct_time | None = None) -> str:
    """A status timestamp as RabbitMQ's shovel management formats it (format_ts: the hour
    unpadded, "2026-11-28 0:52:35")."""
    t = t or time.localtime()
    return f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour}:{t.tm_min:02d}:{t.tm_sec:02d}"


class RemoteDelivery:
    """A delivery from a source on another broker, until it is settled there."""

    __slots__ = ("source", "tag", "message", "redelivered")

    def __init__(self, source: RemoteSource, tag: int, message: Message, redelivered: bool):
        self.source = source
        self.tag = tag
        self.message = message
        self.redelivered = redelivered


# ================================================================== the worker
class Shovel:
    """One running dynamic shovel (rabbit_shovel_worker with rabbit_amqp091_shovel at both
    ends). It is the DeliverySink of its consumer, that consumer's Gate (`delivering`) and
    the SyncWaiter of its on-confirm acks."""

    def __init__(self, broker: Node, vhost: str, name: str, value: Any, config: Config):
        self.broker = broker
        self.vhost = vhost
        self.name = name
        self.value = value
        self.config = config
        self.state = "starting"
        self.reason: str | None = None
        self.timestamp = _local_time()
        self.active = False       # consuming (started, not stopped)
        self.stopped = False      # stopped for good (parameter cleared, restarted, deleted)
        self.delivering = True    # Gate: the queue may hand this consumer messages now
        self.queue: Any = None    # the source queue
        self.consumer: Consumer | None = None
        self.exclusive_queue: Any = None  # the queue bound to src-exchange
        self.declared_exclusive: list = []  # exclusive queues its declarations made here
        self.src_actor: ops.Actor | None = None
        self.dest_actor: ops.Actor | None = None
        # The URIs of this start, picked from the lists; the vhosts of the ends on this broker.
        self.src_uri, self.dest_uri = config.src_uri, config.dest_uri
        self.src_vhost: str | None = None
        self.dest_vhost: str | None = None
        self.owner: ExclusiveOwner | None = None
        # The ends on other brokers (warren.broker.shovel_links), while connected.
        self.src_end: RemoteSource | None = None
        self.dest_end: RemoteDestination | None = None
        self.connecting = False  # an end on another broker is being opened
        self._untried: dict[str, list[str]] = {"src": [], "dest": []}  # URIs not yet failed (empty: all)
        self._quick_restart_at = -float("inf")  # when it last restarted at once (scheduler time)
        self.attempts = 0        # opens started: an answer to an older one is stale
        self.pending: list[QueuedMessage | RemoteDelivery] = []  # delivered, to forward on the next tick
        # on-confirm: (its settlement handle, message, its queue, its consumer) published, not yet acked.
        self.inflight: deque[tuple[Settlement, QueuedMessage | RemoteDelivery, Any, Consumer | None]] = deque()
        self.remaining: int | None = None          # counts down to the autodelete (None: never)
        self.remaining_unacked: int | None = None  # deliveries still to take
        self.window = config.prefetch or DEFAULT_PREFETCH
        self._tick_timer: Timer | None = None
        self._timer: Timer | None = None           # restart or backoff
        self._waiting_sync = False
        self._waiting_alarm = False
        self._held_back = False                    # after a refusal by the destination
        self.forwarded = 0

    def describe(self) -> str:
        """What its log lines name it."""
        return f"Shovel '{self.name}' in virtual host '{self.vhost}'"

    # -------------------------------------------------------------- lifecycle
    @property
    def link_key(self) -> str:
        """Its name among the links a cluster's members run (warren.cluster.link_owners)."""
        return link_key("shovel", self.vhost, self.name)

    def start_soon(self) -> None:
        """Start on the next loop tick (or when the loop starts): an import declares its
        queues after its parameters. On a cluster, one member runs it: this one once it
        holds it (Node.link_owners)."""
        owners = self.broker.link_owners
        if owners is None:
            self.begin()
        else:
            owners.want(self)

    def runs_here(self) -> bool:
        """Whether this node runs it (a node alone runs all its shovels)."""
        owners = self.broker.link_owners
        return owners is None or owners.runs(self)

    def eligible(self) -> bool:
        """Whether this member may run it (any may run a shovel)."""
        return True

    def begin(self) -> None:
        """Start here, on the next loop tick."""
        scheduler = self.broker.scheduler
        if scheduler is not None and not self.stopped:
            self._cancel_timer()
            self._timer = scheduler.call_later(0, self._start)

    def _start(self) -> None:
        """Connect both ends, the destination first (rabbit_shovel_worker's order), each
        to one of its URIs picked at random."""
        self._timer = None
        if self.stopped or self.active or self.connecting:
            return
        self.delivering = True  # (a failed start halted it)
        c = self.config
        # A URI that failed is not picked again until every one of its list has failed.
        self.src_uri = random.choice(self._untried["src"] or c.src_uris)
        self.dest_uri = random.choice(self._untried["dest"] or c.dest_uris)
        src, dest = self._endpoint(self.src_uri), parse_uri(self.dest_uri)
        self.src_vhost = src.vhost if isinstance(src, Direct) else None
        self.dest_vhost = dest.vhost if isinstance(dest, Direct) else None
        # Its own connection, as RabbitMQ's shovel has one (the owner of its exclusive queue).
        self.owner = ExclusiveOwner.new(self.broker.config.node_name,
                                        ConnectionLink(self.connection_name, "undefined", "undefined"))
        if isinstance(dest, Direct):
            self._attempt(lambda: self._init_local_dest(dest.vhost, lambda: self._dest_ready(src)))
            return

        def dest_up(end: Any) -> None:
            self.dest_end = end
            self._dest_ready(src)
        self._open_remote("dest", dest, lambda links, opened: links.open_destination(self, dest, c, opened), dest_up)

    def _dest_ready(self, src: Direct | Network) -> None:
        if isinstance(src, Direct):
            self._attempt(lambda: self._init_local_source(src.vhost))
            return

        def source_up(end: Any) -> None:
            self.src_end = end
            self._source_started(end.queue_length)
            self.broker.durability.flush()
        self._open_remote("src", src, lambda links, opened: self._open_source(links, src, opened), source_up)

    def _open_remote(self, side: str, endpoint: Network, open_end: Callable[[ShovelLinks, Opened], None],
                     then: Callable[[Any], None]) -> None:
        """Open an end on another broker through the node's ShovelLinks, then `then(end)`,
        unless the shovel stopped or started again meanwhile."""
        links = self.broker.links
        if links is None:
            self._cannot_connect("this node makes no connections to other brokers")
            return
        self.connecting = True
        attempt = self.attempts = self.attempts + 1

        def opened(end, error):
            self.connecting = False
            if attempt != self.attempts or self.stopped:
                if end is not None:
                    end.close()
                return
            if error is not None:
                self._link_failed(side, endpoint, error)
                return
            then(end)
        open_end(links, opened)

    def _open_source(self, links: ShovelLinks, endpoint: Network, opened: Opened) -> None:
        links.open_source(self, endpoint, self.config, opened)

    def _endpoint(self, uri: str) -> Direct | Network:
        """The source URI's endpoint (validated already)."""
        return parse_uri(uri)

    @property
    def connection_name(self) -> str:
        """The name its connections have (RabbitMQ's connection_name client property)."""
        return f"Shovel {self.name}"

    def _attempt(self, step) -> bool:
        """Run a step of the start on this broker; False if it failed (and was handled)."""
        try:
            step()
            return True
        except _CannotConnect as err:
            self._cannot_connect(str(err))
        except AMQPError as err:
            # A declaration or the consume refused: RabbitMQ's channel is closed by the
            # broker and its worker ends ("needed a restart"), to start again after the delay.
            log.error("%s could not start: %s %s", self.describe(), err.code, err.text)
            self._terminate("needed a restart", restart=True)
        finally:
            self.broker.durability.flush()
        return False

    def _cannot_connect(self, why: str) -> None:
        """RabbitMQ's worker cannot connect: it stops before reporting anything and is
        started again, so the shovel stays "starting" (until the vhost exists)."""
        log.error("%s could not connect: %s", self.describe(), why)
        self._halt()
        self.state, self.reason, self.timestamp = "starting", None, _local_time()
        self._retry()

    def _link_failed(self, side: str, endpoint: Network, reason: str) -> None:
        """An end on another broker could not be opened. As RabbitMQ's worker, it reports
        nothing (the shovel stays "starting") and tries another URI of the list at once;
        once every one has failed, it starts again as its supervisor restarts it."""
        uri = self.src_uri if side == "src" else self.dest_uri
        log.error("%s failed to connect (URI: %s): %s", self.describe(), remove_credentials(uri), reason)
        self._halt()
        self.state, self.reason, self.timestamp = "starting", None, _local_time()
        uris = self.config.src_uris if side == "src" else self.config.dest_uris
        left = [u for u in (self._untried[side] or uris) if u != uri]
        self._untried[side] = left
        if left:
            self.begin()
        else:
            log.error("%s has no more URIs to try for connection", self.describe())
            self._retry()
        self.broker.durability.flush()

    def _init_local_dest(self, vhost_name: str, then: Callable[[], None]) -> None:
        c = self.config
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            raise _CannotConnect(f"access to target virtual host '{vhost_name}' was refused (it does not exist)")
        actor = self.dest_actor = ops.Actor(self.broker, SHOVEL_USER, vhost, self.owner, trusted=True)

        def declared(last: str) -> None:
            if c.dest_queue is None:
                then()
            else:
                self._ensure_queue(actor, c.dest_queue, c.dest_queue_args, lambda _: then())
        declare_local(actor, c.dest_declarations, self.declared_exclusive, self._run, declared)

    def _init_local_source(self, vhost_name: str) -> None:
        c = self.config
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            raise _CannotConnect(f"access to target virtual host '{vhost_name}' was refused (it does not exist)")
        src = self.src_actor = ops.Actor(self.broker, SHOVEL_USER, vhost, self.owner, trusted=True)

        def consume(queue: Any) -> None:
            # What a passive declare says now, as RabbitMQ asks (the exchange's new queue: 0); of
            # another member's queue, once its home has counted.
            queue.counts_async(self._answered(lambda counts: self._consume_source(src, queue, counts[0])))

        def declared(last: str) -> None:
            if c.src_queue is not None:
                def ensured(_: Any) -> None:
                    consume(ops.readable_queue(src, queue_name(c.src_queue or "", last)))
                if c.static:  # (a static shovel's declarations alone make its queues)
                    ensured(None)
                else:
                    self._ensure_queue(src, c.src_queue, c.src_queue_args, ensured)
                return

            def made(result: tuple[Any, bool]) -> None:
                queue = self.exclusive_queue = result[0]
                self._run(ops.bind, (src, c.src_exchange, "queue", queue.name, c.src_exchange_key, {}),
                          lambda _: consume(queue))
            self._run(ops.declare_queue, (src, "", False, False, True), made)
        declare_local(src, c.src_declarations, self.declared_exclusive, self._run, declared)

    def _run(self, fn: Callable[..., Any], args: tuple, then: Callable[[Any], None]) -> None:
        """Carry out one of ops' functions, then `then(result)`: at once, or, for an
        Operation on a cluster member, once the cluster's log has its change (_answered)."""
        log = self.broker.metadata.log
        if log is None or not isinstance(fn, Operation):
            then(fn(*args))
        else:
            operation = fn
            log.submit(lambda: operation.change(*args), self._answered(then))

    def _answered(self, then: Callable[[Any], None]) -> Callable[[Any, BaseException | None], None]:
        """What takes an answer (at once, or from the cluster's log or a queue's home on
        another member) and carries on with `then(result)`, unless the start it belongs to
        is over; an error as a failed step of the start. The shovel is not started again
        meanwhile."""
        attempt = self.attempts
        self.connecting = True

        def answered(result: Any, error: BaseException | None) -> None:
            if attempt == self.attempts and not self.stopped:
                self.connecting = False
                self._attempt(lambda: then(result) if error is None else _raise(error))
        return answered

    def _consume_source(self, src: ops.Actor, queue: Any, length: int) -> None:
        if not self._source_started(length):
            return
        c = self.config
        no_ack = c.ack_mode == "no-ack"
        prefetch = 0 if no_ack else self.window
        consumer = ops.consume(src, queue.name, server_named("amq.ctag-"), no_ack, False, c.src_consumer_args,
                               prefetch, Credit(), self, self)  # (no channel-wide prefetch)
        self.queue, self.consumer = consumer.queue, consumer
        queue.consume_async(consumer, self._answered(lambda _: queue.deliver_ready()))

    def _source_started(self, queue_length: int) -> bool:
        """Both ends are up: running (False: nothing to move, the shovel deleted itself)."""
        c = self.config
        if c.delete_after == "queue-length":
            self.remaining = queue_length
        elif is_int(c.delete_after):
            self.remaining = c.delete_after
        self.remaining_unacked = self.remaining
        self.active = True
        if self.remaining == 0:
            self._autodelete()
            return False
        self.state, self.reason, self.timestamp = "running", None, _local_time()
        self._untried = {"src": [], "dest": []}
        log.info("%s is running: from %s to %s", self.describe(), self._source_text(), self._dest_text())
        return True

    def _ensure_queue(self, actor: ops.Actor, name: str, arguments: dict, then: Callable[[Any], None]) -> None:
        """rabbit_shovel_parameters:ensure_queue: a passive declare, else a durable queue
        with the given arguments; then `then`."""
        try:
            ops.declare_queue(actor, name, passive=True)
        except AMQPError as err:
            if err.code != 404:
                raise
            self._run(ops.declare_queue, (actor, name, False, True, False, False, arguments), then)
            return
        then(None)

    def _source_text(self) -> str:
        c = self.config
        where = f"vhost '{self.src_vhost}'" if self.src_vhost is not None else remove_credentials(self.src_uri)
        if c.src_queue is not None:
            return f"queue '{c.src_queue}' in {where}"
        return f"exchange '{c.src_exchange}' (key '{c.src_exchange_key}') in {where}"

    def _dest_text(self) -> str:
        c = self.config
        where = f"vhost '{self.dest_vhost}'" if self.dest_vhost is not None else remove_credentials(self.dest_uri)
        if c.dest_queue is not None:
            return f"queue '{c.dest_queue}' in {where}"
        if c.dest_exchange is not None:
            return f"exchange '{c.dest_exchange}' in {where}"
        return f"the exchanges messages were published to, in {where}"

    def stop(self) -> None:
        """Stop for good: no more deliveries; what was delivered and not forwarded goes back
        to the source; what is in flight is still acked (or given back) when its write is
        settled."""
        self.stopped = True
        self._cancel_timer()
        self._halt()
        owners = self.broker.link_owners
        if owners is not None:
            owners.drop(self)

    def pause(self) -> None:
        """Stop running here, for another member to run it (or this one again, later): as
        stop(), and shown as starting until it runs here again."""
        self._cancel_timer()
        self._halt()
        self.state, self.reason, self.timestamp = "starting", None, _local_time()

    def _halt(self) -> None:
        """Stop consuming (stop() or a failure)."""
        self.active = False
        self.delivering = False
        if self._tick_timer is not None:
            self._tick_timer.cancel()
            self._tick_timer = None
        if self._waiting_alarm:
            self.broker.alarms.unsubscribe(self._alarms_changed)
            self._waiting_alarm = False
        consumer, queue = self.consumer, self.queue
        self.consumer = None
        if consumer is not None and queue is not None:
            if queue is self.exclusive_queue:
                queue.remove_consumer(consumer)  # (deleted below, whatever its auto-delete)
            else:
                ops.cancel(consumer)
        pending, self.pending = self.pending, []
        for qm in pending:
            self._settle(qm, queue, consumer, ack=False)
        if queue is not None and not queue.deleted and queue is not self.exclusive_queue:
            queue.deliver_ready()  # (the messages given back may go to other consumers)
        own = self.exclusive_queue  # (RabbitMQ's goes with the shovel's connection)
        self.exclusive_queue = None
        if own is not None and not own.deleted:
            own.vhost.delete_queue(own)
        declared, self.declared_exclusive = self.declared_exclusive, []
        for queue in declared:
            if not queue.deleted:
                queue.vhost.delete_queue(queue)
        # Ends on other brokers: closing the source's connection gives its unacked deliveries
        # back there; the destination's unconfirmed publishes count as lost (their sources'
        # copies here are given back).
        self.attempts += 1  # (an open still under way is stale now)
        self.connecting = False
        src_end, dest_end = self.src_end, self.dest_end
        self.src_end = self.dest_end = None
        if src_end is not None:
            src_end.close()
        if dest_end is not None:
            dest_end.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _terminate(self, reason: str, restart: bool, as_term: bool = True) -> None:
        """The worker ends abnormally: shown as terminated with the reason (~p of it, or
        the term itself when `as_term` is False: it is one already), and started again after
        reconnect-delay seconds when RabbitMQ's supervisor would."""
        self._halt()
        self.state, self.timestamp = "terminated", _local_time()
        self.reason = erl_string(reason) if as_term else reason
        if restart:
            self._retry()

    def _retry(self) -> None:
        """Start again as RabbitMQ's supervisor restarts the worker (permanent, restart
        intensity 1): at once, unless it restarted at once less than reconnect-delay
        seconds ago; then after reconnect-delay seconds."""
        delay = self.config.reconnect_delay
        scheduler = self.broker.scheduler
        if not self.stopped and is_number(delay) and delay > 0 and scheduler is not None:
            self._cancel_timer()
            now = scheduler.now()
            quick = now - self._quick_restart_at >= delay
            if quick:
                self._quick_restart_at = now
            self._timer = scheduler.call_later(0 if quick else delay, self._restart)

    def _restart(self) -> None:
        self._timer = None
        if self.stopped:
            return
        self.remaining = self.remaining_unacked = None
        self.delivering = True
        self._start()

    def _autodelete(self) -> None:
        """The transfer is complete: the shovel deletes its own parameter (RabbitMQ's
        terminate({shutdown, autodelete}))."""
        log.info("%s is stopping (it was configured to autodelete and transfer is completed)",
                 self.describe())
        self.stop()
        vhost = self.broker.vhosts.get(self.vhost)
        if vhost is not None and vhost.shovels.get(self.name) is self:
            self.broker.metadata.submit(ClearShovel(self.vhost, self.name))
        self.broker.durability.flush()

    # ----------------------------------------------------- DeliverySink, Gate
    def deliver(self, consumer: Consumer, qm: QueuedMessage) -> None:
        """The source hands over a message: forwarded on the next tick."""
        queue = consumer.queue
        if consumer.no_ack:
            queue.delivered(qm, True)
        else:
            consumer.unacked += 1
            queue.delivered(qm, False)
            if self.remaining_unacked is not None and self.remaining_unacked <= 0:
                # All it is to move is taken: what a queue of another member sent before it
                # heard so goes back.
                self._settle(qm, queue, consumer, ack=False)
                return
        self.pending.append(qm)
        if self.remaining_unacked is not None:
            self.remaining_unacked -= 1
            if self.remaining_unacked <= 0:
                self.delivering = False  # all it is to move is taken: the rest stays
        if len(self.pending) >= self.window:
            self.delivering = False
        self._schedule_tick()

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The source queue was deleted: RabbitMQ's shovel stops ({shutdown, restart}); a
        shovel that never deletes itself starts again after reconnect-delay (declaring the
        source queue again), an autodelete one stays terminated."""
        if consumer is not self.consumer:
            return
        self.queue = None  # (deleted: nothing to give back to)
        log.warning("%s: its source queue was deleted", self.describe())
        self._terminate("needed a restart", restart=self.config.delete_after == "never")

    # ------------------------------------------------ LinkUser (remote ends)
    def remote_delivery(self, source: RemoteSource, delivery_tag: int, message: Message, redelivered: bool) -> None:
        """A delivery from the source on another broker: forwarded on the next tick."""
        if source is not self.src_end:
            return  # (a stale link's: that broker gives it back when the link closes)
        if self.remaining_unacked is not None:
            if self.remaining_unacked <= 0:
                # Past what it is to move (the prefetch let more come): back, unmoved.
                if self.config.ack_mode != "no-ack":
                    source.reject(delivery_tag)
                return
            self.remaining_unacked -= 1
        self.pending.append(RemoteDelivery(source, delivery_tag, message, redelivered))
        if self.config.ack_mode == "no-ack" and len(self.pending) >= self.window:
            source.pause()  # (no prefetch bounds a consumer without acks)
        self._schedule_tick()

    def remote_closed(self, end: RemoteSource | RemoteDestination, reason: str) -> None:
        """An end's connection failed: RabbitMQ's worker dies with the reason and is
        restarted after reconnect-delay."""
        if end is not self.src_end and end is not self.dest_end:
            return
        log.error("%s: the connection of its %s closed: %s", self.describe(),
                  "source" if end is self.src_end else "destination", reason)
        if "socket_closed_unexpectedly" in reason:
            # (RabbitMQ's worker reports no status for a dropped socket: "starting" again)
            self._halt()
            self.state, self.reason, self.timestamp = "starting", None, _local_time()
            self._retry()
        else:
            self._terminate(reason, restart=True, as_term=False)
        self.broker.durability.flush()

    def remote_cancelled(self, source: RemoteSource) -> None:
        if source is self.src_end:
            log.warning("%s: its source queue was deleted", self.describe())
            self._terminate("needed a restart", restart=self.config.delete_after == "never")

    def remote_writable(self) -> None:
        self._reopen()

    def channel_details(self) -> dict:
        """What the management API shows as the channel of this consumer (RabbitMQ: the
        shovel's direct connection, user "none")."""
        return {"connection_name": f"Shovel {self.name}", "name": f"Shovel {self.name} (1)", "number": 1,
                "peer_host": "undefined", "peer_port": "undefined", "user": SHOVEL_USER.name}

    # -------------------------------------------------------------- forward
    def _schedule_tick(self) -> None:
        if self._tick_timer is None:
            scheduler = self.broker.scheduler
            if scheduler is not None:
                self._tick_timer = scheduler.call_later(0, self._tick)

    def _tick(self) -> None:
        self._tick_timer = None
        if self.pending and self.dest_end is None and self.broker.alarms.blocking:
            # A resource alarm blocks publishers: this one too, until it clears.
            self.delivering = False
            if not self._waiting_alarm:
                self._waiting_alarm = True
                self.broker.alarms.subscribe(self._alarms_changed)
            return
        pending, self.pending = self.pending, []
        queue, consumer = self.queue, self.consumer
        mode = self.config.ack_mode
        n = 0
        try:
            while n < len(pending) and self.active:
                qm = pending[n]
                settlement = self._forward(qm)
                n += 1
                self.forwarded += 1
                if mode == "on-confirm":
                    self.inflight.append((settlement, qm, queue, consumer))
                else:
                    if mode == "on-publish":
                        self._settle(qm, queue, consumer, ack=True)
                    self._decr_remaining(1)
        except AMQPError as err:
            # RabbitMQ's destination channel is closed by the error and the worker stops
            # ("needed a restart"); what it had not forwarded goes back to the source.
            log.error("%s is stopping: publishing failed with %s %s", self.describe(), err.code, err.text)
            self.pending = pending[n:] + self.pending
            self._terminate("needed a restart", restart=True)
        else:
            for qm in pending[n:]:  # (the shovel stopped meanwhile: back to the source)
                self._settle(qm, queue, consumer, ack=False)
        if self.dest_end is not None and not self.dest_end.writable:
            # Its socket's buffer is full: take nothing more until it drains (remote_writable).
            self.delivering = False
            if self.src_end is not None:
                self.src_end.pause()
        elif self.inflight:
            self._check_inflight()
        elif self.active:
            self._reopen()
        self.broker.durability.flush()

    def _forward(self, qm: QueuedMessage | RemoteDelivery) -> Settlement:
        """Publish one message to the destination through the operations layer; what a
        confirm of it waits for (warren.store.settlement; REJECTED: refused)."""
        c = self.config
        message = qm.message
        exchange = message.exchange if c.dest_exchange is None else c.dest_exchange
        routing_key = message.routing_key
        if c.dest_queue is not None:
            exchange, routing_key = "", c.dest_queue
        elif c.dest_exchange_key is not None:
            routing_key = c.dest_exchange_key
        if exchange == message.exchange and routing_key == message.routing_key:
            route = message.route
        else:
            route = shortstr(exchange) + shortstr(routing_key)
        header = message.header
        if c.publish_properties or c.add_forward_headers or c.add_timestamp_header:
            header = self._header(header)
        if self.dest_end is not None:
            return self.dest_end.publish(route, header, message.body)
        assert self.dest_actor is not None
        ops.check_message_size(self.broker, len(message.body))
        # (unroutable: dropped, and confirmed, as RabbitMQ's publisher confirm says)
        return ops.publish(self.dest_actor, exchange, routing_key, route, header, message.body)[2]

    def _header(self, header: bytes) -> bytes:
        """dest-publish-properties, dest-add-forward-headers and dest-add-timestamp-header
        (rabbit_shovel_parameters' PubPropsFun, in its order)."""
        c = self.config
        props = rt.split_header(header)
        for name, kind in PUBLISH_PROPERTIES:
            if name not in c.publish_properties:
                continue
            value = c.publish_properties[name]
            bit = _PROPERTY_BITS[name]
            if kind == "str":
                props[bit] = shortstr(value)
            elif kind == "octet":
                props[bit] = bytes((value,))
            else:
                props[bit] = value.to_bytes(8, "big")
        if "headers" in c.publish_properties:  # (a static shovel's: an encoded field table)
            props[FLAG_HEADERS] = c.publish_properties["headers"]
        if c.add_forward_headers or c.add_timestamp_header:
            table = props.get(FLAG_HEADERS)
            fields = rt.table_fields(table) if table is not None else []
            if c.add_forward_headers:
                fields = self._forward_headers(fields)
            if c.add_timestamp_header:
                fields = rt.set_table_value(fields, b"x-shovelled-timestamp", rt.long_value(int(time.time())))
            props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in fields])
        return rt.join_header(header, props)

    def _forward_headers(self, fields: list) -> list:
        """rabbit_shovel_util:update_headers: a table prepended to the x-shovelled array."""
        c = self.config
        info = [("shovelled-by", self.broker.cluster_name), ("shovel-type", "dynamic"),
                ("shovel-name", self.name), ("shovel-vhost", self.vhost),
                ("src-uri", remove_credentials(self.src_uri)), ("dest-uri", remove_credentials(self.dest_uri))]
        if c.src_queue is not None:
            info.append(("src-queue", c.src_queue))
        else:
            info += [("src-exchange", c.src_exchange or ""), ("src-exchange-key", c.src_exchange_key)]
        for key, value in (("dest-exchange", c.dest_exchange), ("dest-exchange-key", c.dest_exchange_key),
                           ("dest-queue", c.dest_queue)):
            if value is not None:
                info.append((key, value))
        table = rt.table_value([(k.encode(), rt.longstr_value(v.encode("utf-8", "surrogateescape")))
                                for k, v in info])
        return rt.prepend_table_header(fields, b"x-shovelled", table)

    # ------------------------------------------------------------ settling
    def _settle(self, qm: QueuedMessage | RemoteDelivery, queue: Any, consumer: Consumer | None, ack: bool) -> None:
        """Ack the source's copy, or give it back (requeue). No-ack deliveries are settled."""
        if isinstance(qm, RemoteDelivery):
            if self.config.ack_mode != "no-ack" and qm.source is self.src_end:
                if ack:
                    qm.source.ack(qm.tag)
                else:
                    qm.source.reject(qm.tag)
            return  # (a closed link's: its broker has given it back)
        if consumer is None or consumer.no_ack:
            return
        if queue is None:
            consumer.unacked -= 1
            return  # the queue was deleted
        ops.settle(qm, queue, consumer, ack, requeue=True)

    def store_synced(self) -> None:
        """SyncWaiter: an fsync finished; the confirms it brings ack the sources' copies."""
        self._waiting_sync = False
        self._check_inflight()
        self._schedule_tick()  # (the acks' marks are written by the tick's flush)

    def _check_inflight(self) -> None:
        inflight = self.inflight
        done = 0
        refused = False
        while inflight:
            settlement, qm, queue, consumer = inflight[0]
            safe = settlement.status()
            if safe is None:
                break
            inflight.popleft()
            # basic.nack (a queue refused it, or its write failed): RabbitMQ's shovel nacks
            # the source, which requeues it.
            self._settle(qm, queue, consumer, ack=bool(safe))
            refused |= not safe
            done += 1
        if inflight and not self._waiting_sync:
            self._waiting_sync = True
            inflight[0][0].notify(self)
        if not self.active:
            return
        if done and self._decr_remaining(done):
            return
        if refused:
            self._hold_back()
        self._reopen()

    def _decr_remaining(self, n: int) -> bool:
        """rabbit_shovel_behaviour:decr_remaining; True once the shovel has deleted itself."""
        if self.remaining is None or not self.active:
            return False
        self.remaining -= n
        if self.remaining <= 0:
            self._autodelete()
            return True
        return False

    def _reopen(self) -> None:
        """Take deliveries again if nothing holds them back, and ask the queue for more."""
        if not self.active or self._held_back or self._waiting_alarm:
            return
        taking = self.remaining_unacked is None or self.remaining_unacked > 0
        writable = self.dest_end is None or self.dest_end.writable
        self.delivering = taking and writable and len(self.pending) < self.window
        if self.delivering and self.queue is not None:
            self.queue.deliver_ready()
        if self.delivering and self.src_end is not None:
            self.src_end.resume()

    def _hold_back(self) -> None:
        """The destination refused a message (x-overflow reject-publish): pause a moment
        before the source redelivers it, rather than spin."""
        scheduler = self.broker.scheduler
        if scheduler is None or self._held_back:
            return
        self._held_back = True
        self.delivering = False

        def resume() -> None:
            self._held_back = False
            self._reopen()
        scheduler.call_later(NACK_BACKOFF, resume)

    def _alarms_changed(self) -> None:
        if self.broker.alarms.blocking:
            return
        self.broker.alarms.unsubscribe(self._alarms_changed)
        self._waiting_alarm = False
        if self.active:
            self._schedule_tick()

    # -------------------------------------------------------------- status
    def status(self, node: str) -> dict:
        """The shovel as /api/shovels shows it (rabbit_shovel_mgmt_util:format)."""
        out: dict[str, Any] = {"node": node, "timestamp": self.timestamp, "name": self.name, "vhost": self.vhost,
                               "type": "dynamic", "state": self.state}
        if self.state == "terminated":
            out["reason"] = self.reason
        elif self.state == "running":
            c = self.config
            out.update({"src_uri": remove_credentials(self.src_uri), "src_protocol": "amqp091",
                        "dest_protocol": "amqp091", "dest_uri": remove_credentials(self.dest_uri)})
            if c.src_queue is not None:
                out["src_queue"] = c.src_queue
            else:
                out["src_exchange"] = c.src_exchange
                out["src_exchange_key"] = c.src_exchange_key
            for key, value in (("dest_exchange", c.dest_exchange), ("dest_exchange_key", c.dest_exchange_key),
                               ("dest_queue", c.dest_queue)):
                if value is not None:
                    out[key] = value
        return out
