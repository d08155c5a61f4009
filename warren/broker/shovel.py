"""Dynamic shovels within this broker: RabbitMQ's shovel plugin (runtime parameters of
component "shovel", rabbit_shovel_parameters / rabbit_shovel_worker / rabbit_amqp091_shovel),
for sources and destinations on this same broker only.

A shovel consumes from a queue (src-queue, or a server-named exclusive queue bound to
src-exchange with src-exchange-key) as an internal consumer, with prefetch
(src-prefetch-count) bounding what is in flight, and republishes each message through the
operations layer (ops.route + ops.enqueue: routing, alternate exchanges, property checks,
queue limits, durable writes), to dest-queue (through the default exchange), dest-exchange
(+ dest-exchange-key) or, with neither, the exchange and routing key it was published with.
No socket, no channel: the shovel is its own DeliverySink, Gate and SyncWaiter.

ack-mode on-confirm (the default) acks the source only once the destination has the
message as a publisher confirm would say so: for a persistent message in a durable queue,
once its store batch is fsynced. A kill -9 at any instant therefore loses nothing (the
source's copy is settled after the destination's is on disk; a message may be there twice,
as in RabbitMQ). on-publish acks the source as soon as the message is enqueued; no-ack
consumes without acks.

src-delete-after: "never" (the default); "queue-length": move as many messages as the
source queue held when the shovel started, then delete the shovel's own parameter; an
integer N: move N messages, then delete it. Deliveries are taken from the queue only up to
that count, so messages published meanwhile stay in the source queue.

Deliveries are not forwarded from inside the queue's delivery loop: they are collected and
forwarded on the next loop tick (the destination may be the source itself, or route back to
it). Each tick ends with durability.flush(), as a connection's flush does.

URIs: "amqp://" (vhost "/"), "amqp:///VHOST" (percent-encoded). A URI with a host (even
localhost), user, port, query or another scheme is refused: Warren's shovels work within
this broker only. AMQP 1.0 (src-protocol / dest-protocol amqp10) is refused.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..amqp import reencode as rt
from ..amqp.codec import shortstr
from ..amqp.erlang import erl_json, erl_list, erl_string, erl_tuple
from ..amqp.properties import FLAG_HEADERS
from . import ops
from .auth import User
from .consumer import Consumer
from .credit import Credit
from .errors import AMQPError
from .metadata.commands import ClearShovel, SetShovel
from .names import server_named
from .links import ConnectionLink, ExclusiveOwner
from .shovel_config import DEFAULT_PREFETCH, DEFAULT_RECONNECT_DELAY, Config
from ..store.settlement import Settlement

if TYPE_CHECKING:
    from ..store.queued_message import QueuedMessage
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
LOCAL_ONLY = "Warren's shovels work within this broker only: use amqp:// or amqp:///VHOST"


class _CannotConnect(Exception):
    """The shovel's "connection" to a vhost fails (the vhost does not exist)."""


class ShovelError(ValueError):
    """A shovel definition refused: RabbitMQ's validation errors (and Warren's own), in order."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


# ================================================================== validation
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(key, value):
    return None if _is_number(value) else f"{key} should be a number, actually was {erl_json(value)}"


def _binary(key, value):
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erl_json(value)}"


def _boolean(key, value):
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erl_json(value)}"


def _enum(options):
    def check(key, value):
        if not isinstance(value, str):
            return f"{key} should be binary, actually was {erl_json(value)}"
        if value not in options:
            return (f"{key} should be one of {erl_list([erl_json(o) for o in options])}, "
                    f"actually was {erl_json(value)}")
        return None
    return check


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
    error = _binary(key, value)
    if error is None and len(value.encode("utf-8", "surrogatepass")) > 255:
        return f"{key} should be at most 255 bytes, actually was {len(value.encode('utf-8', 'surrogatepass'))}"
    return error


def _prefetch(key, value):
    """A number in RabbitMQ; Warren also wants what basic.qos can carry (RabbitMQ takes 1.5
    or -1 and its shovel then fails to start)."""
    error = _number(key, value)
    if error is None and not (_is_int(value) and 0 <= value <= 65535):
        return f"{key} should be an integer from 0 to 65535, actually was {erl_json(value)}"
    return error


def _delete_after(key, value):
    if value in ("never", "queue-length") or (_is_int(value) and value >= 0):
        return None
    return (f'{key} should be a number greater than or equal to 0, "never" or "queue-length", '
            f"actually was {erl_json(value)}")


def _terms(items) -> str:
    return erl_list([("{" + erl_json(k) + "," + erl_json(v) + "}") if isinstance(k, str) else erl_json(k)
                     for k, v in items])


def _proplist(name: str, constraints: list, value) -> list[str]:
    """rabbit_parameter_validation:proplist: the errors in RabbitMQ's order (unrecognised keys
    first, then each constraint's, last constraint first). A JSON object or an empty list is
    a proplist; anything else is "not a list" (RabbitMQ crashes, 500, on most of those)."""
    if isinstance(value, list) and not value:
        value = {}
    if not isinstance(value, dict):
        return [f"{name} not a list {erl_json(value)}"]
    known = {c[0] for c in constraints}
    results: list[str] = []
    for key, check, mandatory in constraints:
        if key in value:
            error = check(key, value[key])
            if error:
                results[:0] = error if isinstance(error, list) else [error]
        elif mandatory:
            results.insert(0, f'Key "{key}" not found in {name}')
    rest = sorted((k, v) for k, v in value.items() if k not in known)
    if rest:
        results.insert(0, f"Unrecognised terms {_terms(rest)} in {name}")
    return results


def _args(allowed):
    def check(key, value):
        return _proplist(key, [(k, lambda _k, _v: None, False) for k in allowed], value) or None
    return check


def _properties(key, value):
    def prop(kind):
        def check(k, v):
            if kind == "str":
                error = _binary(k, v)
                if error is None and len(v.encode("utf-8", "surrogatepass")) > 255:
                    return f"{k} should be at most 255 bytes, actually was {len(v.encode('utf-8', 'surrogatepass'))}"
                return error
            error = _number(k, v)
            limit = 255 if kind == "octet" else (1 << 64) - 1
            if error is None and not (_is_int(v) and 0 <= v <= limit):
                return f"{k} should be an integer from 0 to {limit}, actually was {erl_json(v)}"
            return error
        return check
    return _proplist(key, [(k, prop(kind), False) for k, kind in PUBLISH_PROPERTIES], value) or None


def parse_uri(key: str, uri: str) -> tuple[str | None, str | None]:
    """(vhost, None) for a URI of this broker, else (None, the error): RabbitMQ's text where
    amqp_uri refuses it, Warren's where it names something else than this broker."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        if ":" not in uri:
            reason = "{unable_to_parse_uri,no_scheme}"
        else:
            return None, f'"{uri}" not a valid URI: {LOCAL_ONLY}'
        return None, _not_valid(uri, reason)
    if scheme.lower() not in ("amqp", "amqps"):
        return None, _not_valid(uri, "{unexpected_uri_scheme," + erl_string(scheme) + "}")
    cut = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            cut = min(cut, at)
    authority, tail = rest[:cut], rest[cut:]
    if authority:
        return None, f'{key} "{uri}" names a host, user or port: {LOCAL_ONLY}'
    if scheme.lower() == "amqps":
        return None, f'{key} "{uri}": amqps is for connections to other brokers: {LOCAL_ONLY}'
    if "?" in tail or "#" in tail:
        return None, f'{key} "{uri}" has a query: {LOCAL_ONLY}, without parameters'
    if not tail:
        return "/", None
    path = tail[1:]
    if "/" in path:
        return None, _not_valid(uri, "{invalid_vhost," + erl_string(path) + "}")
    return unquote(path), None


def _not_valid(uri: str, reason: str) -> str:
    prefix = f'"{uri}" not a valid URI: '
    return prefix + erl_tuple([reason, erl_string(uri)], len(prefix))


def _uri_check(broker: Node, user: User | None):
    def check(key, value):
        if isinstance(value, list):
            uris = value
            if not uris:
                return f"{key} should name a URI, actually was []"
        elif isinstance(value, str):
            uris = [value]
        else:
            return f"{key} should be list, actually was {erl_json(value)}"
        vhosts = []
        for uri in uris:
            if not isinstance(uri, str):
                return f"{key} should be binary, actually was {erl_json(uri)}"
            vhost, error = parse_uri(key, uri)
            if error:
                return error
            if user is not None and (vhost not in broker.vhosts or (user.name, vhost) not in broker.permissions):
                return f'user "{user.name}" may not connect to vhost "{vhost}"'
            vhosts.append(vhost)
        if len(set(vhosts)) > 1:
            return f"{key} names several vhosts ({', '.join(vhosts)}): a shovel of this broker needs one"
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
        if _is_int(delete_after) and value.get("ack-mode") == "no-ack":
            errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
        if "dest-exchange" in value and "dest-queue" in value:
            errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    uri = _uri_check(broker, user)
    constraints = [
        ("reconnect-delay", _number, False),
        ("ack-mode", _enum(ACK_MODES), False),
        ("src-protocol", _enum(PROTOCOLS), False),
        ("dest-protocol", _enum(PROTOCOLS), False),
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
        ("add-forward-headers", _boolean, False),
        ("add-timestamp-header", _boolean, False),
        ("dest-add-forward-headers", _boolean, False),
        ("dest-add-timestamp-header", _boolean, False),
        ("publish-properties", _properties, False),
        ("dest-publish-properties", _properties, False),
    ]
    errors.extend(_proplist(name, constraints, value))
    if errors:
        raise ShovelError(errors)
    return _parse(value)


def _first(uri) -> str:
    return uri[0] if isinstance(uri, list) else uri


def _parse(v: dict) -> Config:
    src_uri, dest_uri = _first(v["src-uri"]), _first(v["dest-uri"])
    src_vhost, _ = parse_uri("src-uri", src_uri)
    dest_vhost, _ = parse_uri("dest-uri", dest_uri)
    assert src_vhost is not None and dest_vhost is not None
    return Config(
        src_uri=src_uri, src_vhost=src_vhost, dest_uri=dest_uri, dest_vhost=dest_vhost,
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
def set_shovel(broker: Node, vhost: VHost, name: str, value: Any, user: User | None) -> bool:
    """PUT /api/parameters/shovel/VHOST/NAME: validate, then (re)start it through the metadata
    store; True if it is new."""
    config = validate(broker, name, value, user)
    return broker.metadata.apply(SetShovel(vhost.name, name, value, config))


def clear_shovel(broker: Node, vhost: VHost, name: str) -> bool:
    """DELETE of the parameter: the shovel stops (the metadata store's ClearShovel)."""
    return broker.metadata.apply(ClearShovel(vhost.name, name))


def parameters(vhost: VHost) -> list[dict]:
    return [{"value": s.value, "vhost": vhost.name, "component": COMPONENT, "name": s.name}
            for s in vhost.shovels.values()]


def start_all(broker: Node) -> None:
    """The broker's loop runs (Broker.set_scheduler): start the shovels its definitions
    brought back, once every queue is recovered."""
    for vhost in list(broker.vhosts.values()):
        for shovel in list(vhost.shovels.values()):
            shovel.start_soon()


def vhost_deleted(broker: Node, vhost: VHost) -> None:
    """A vhost goes: its shovels stop (their parameters go with it); shovels elsewhere that
    move from or to it end as RabbitMQ's do when their connection to it is closed, and retry
    after reconnect-delay (failing while the vhost does not exist)."""
    for shovel in list(vhost.shovels.values()):
        shovel.stop()
    vhost.shovels.clear()
    for other in statuses(broker):
        if other.active and vhost.name in (other.config.src_vhost, other.config.dest_vhost):
            if other.config.src_vhost == vhost.name:
                other.queue = None  # (its source went with the vhost: nothing to give back to)
            other._terminate("needed a restart", restart=True)


def statuses(broker: Node) -> list[Shovel]:
    return [s for v in broker.vhosts.values() for s in v.shovels.values()]


def restart(broker: Node, vhost: VHost, name: str) -> bool:
    """DELETE /api/shovels/vhost/VHOST/NAME/restart: stop the worker and start it again."""
    shovel = vhost.shovels.get(name)
    if shovel is None:
        return False
    shovel.stop()
    fresh = vhost.shovels[name] = Shovel(broker, vhost.name, name, shovel.value, shovel.config)
    fresh.start_soon()
    return True


def _local_time(t: time.struct_time | None = None) -> str:
    """A status timestamp as RabbitMQ's shovel management formats it (format_ts: the hour
    unpadded, "2026-11-28 0:52:35")."""
    t = t or time.localtime()
    return f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour}:{t.tm_min:02d}:{t.tm_sec:02d}"


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
        self.src_actor: ops.Actor | None = None
        self.dest_actor: ops.Actor | None = None
        self.pending: list[QueuedMessage] = []  # delivered, to forward on the next tick
        # on-confirm: (its settlement handle, message, its queue, its consumer) published, not yet acked.
        self.inflight: deque[tuple[Settlement, QueuedMessage, Any, Consumer | None]] = deque()
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
        return f"'{self.name}' in virtual host '{self.vhost}'"

    # -------------------------------------------------------------- lifecycle
    def start_soon(self) -> None:
        """Start on the next loop tick (or when the loop starts): an import declares its
        queues after its parameters."""
        scheduler = self.broker.scheduler
        if scheduler is not None and not self.stopped:
            self._cancel_timer()
            self._timer = scheduler.call_later(0, self._start)

    def _start(self) -> None:
        self._timer = None
        if self.stopped or self.active:
            return
        try:
            self._init()
        except _CannotConnect as err:
            # RabbitMQ's worker cannot connect: it stops before reporting anything and is
            # started again, so the shovel stays "starting" (until the vhost exists).
            log.error("Shovel %s could not connect: %s", self.describe(), err)
            self._halt()
            self.state, self.reason, self.timestamp = "starting", None, _local_time()
            self._retry()
        except AMQPError as err:
            # A declaration or the consume refused: RabbitMQ's channel is closed by the
            # broker and its worker ends ("needed a restart"), to start again after the delay.
            log.error("Shovel %s could not start: %s %s", self.describe(), err.code, err.text)
            self._terminate("needed a restart", restart=True)
        self.broker.durability.flush()

    def _init(self) -> None:
        c = self.config
        broker = self.broker
        src_vhost, dest_vhost = broker.vhosts.get(c.src_vhost), broker.vhosts.get(c.dest_vhost)
        if src_vhost is None or dest_vhost is None:
            missing = c.src_vhost if src_vhost is None else c.dest_vhost
            raise _CannotConnect(f"access to target virtual host '{missing}' was refused (it does not exist)")
        # Its own connection, as RabbitMQ's shovel has one (the owner of its exclusive queue).
        owner = ExclusiveOwner.new(ConnectionLink(f"Shovel {self.name}", "undefined", "undefined"))
        self.dest_actor = ops.Actor(broker, SHOVEL_USER, dest_vhost, owner, trusted=True)
        src = self.src_actor = ops.Actor(broker, SHOVEL_USER, src_vhost, owner, trusted=True)
        # init_dest, then init_source (rabbit_shovel_worker's order).
        if c.dest_queue is not None:
            self._ensure_queue(self.dest_actor, c.dest_queue, c.dest_queue_args)
        if c.src_queue is not None:
            self._ensure_queue(src, c.src_queue, c.src_queue_args)
            queue = ops.readable_queue(src, c.src_queue)
        else:
            assert c.src_exchange is not None
            queue, _ = ops.declare_queue(src, "", exclusive=True)
            self.exclusive_queue = queue
            ops.bind(src, c.src_exchange, "queue", queue.name, c.src_exchange_key, {})
        queue_name = queue.name
        if c.delete_after == "queue-length":
            # What a passive declare says now, as RabbitMQ asks (the exchange's new queue: 0).
            self.remaining = queue.declare_ok_counts()[0]
        elif _is_int(c.delete_after):
            self.remaining = c.delete_after
        self.remaining_unacked = self.remaining
        if self.remaining == 0:
            self._autodelete()
            return
        no_ack = c.ack_mode == "no-ack"
        prefetch = 0 if no_ack else self.window
        consumer = ops.consume(src, queue_name, server_named("amq.ctag-"), no_ack, False, c.src_consumer_args,
                               prefetch, Credit(), self, self)  # (no channel-wide prefetch)
        self.queue, self.consumer = consumer.queue, consumer
        self.active = True
        self.state, self.reason, self.timestamp = "running", None, _local_time()
        log.info("Shovel %s is running: from %s to %s", self.describe(), self._source_text(), self._dest_text())
        queue.deliver_ready()

    def _ensure_queue(self, actor: ops.Actor, name: str, arguments: dict) -> None:
        """rabbit_shovel_parameters:ensure_queue: a passive declare, else a durable queue
        with the given arguments."""
        try:
            ops.declare_queue(actor, name, passive=True)
        except AMQPError as err:
            if err.code != 404:
                raise
            ops.declare_queue(actor, name, durable=True, arguments=arguments)

    def _source_text(self) -> str:
        c = self.config
        if c.src_queue is not None:
            return f"queue '{c.src_queue}' in vhost '{c.src_vhost}'"
        return f"exchange '{c.src_exchange}' (key '{c.src_exchange_key}') in vhost '{c.src_vhost}'"

    def _dest_text(self) -> str:
        c = self.config
        if c.dest_queue is not None:
            return f"queue '{c.dest_queue}' in vhost '{c.dest_vhost}'"
        if c.dest_exchange is not None:
            return f"exchange '{c.dest_exchange}' in vhost '{c.dest_vhost}'"
        return f"the exchanges messages were published to, in vhost '{c.dest_vhost}'"

    def stop(self) -> None:
        """Stop for good: no more deliveries; what was delivered and not forwarded goes back
        to the source; what is in flight is still acked (or given back) when its write is
        settled."""
        self.stopped = True
        self._cancel_timer()
        self._halt()

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

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _terminate(self, reason: str, restart: bool) -> None:
        """The worker ends abnormally: shown as terminated with the reason (~p of it), and
        started again after reconnect-delay seconds when RabbitMQ's supervisor would."""
        self._halt()
        self.state, self.reason, self.timestamp = "terminated", erl_string(reason), _local_time()
        if restart:
            self._retry()

    def _retry(self) -> None:
        delay = self.config.reconnect_delay
        scheduler = self.broker.scheduler
        if not self.stopped and _is_int(delay) and delay > 0 and scheduler is not None:
            self._cancel_timer()
            self._timer = scheduler.call_later(delay, self._restart)

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
        log.info("Shovel %s is stopping (it was configured to autodelete and transfer is completed)",
                 self.describe())
        self.stop()
        vhost = self.broker.vhosts.get(self.vhost)
        if vhost is not None and vhost.shovels.get(self.name) is self:
            self.broker.metadata.apply(ClearShovel(self.vhost, self.name))
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
        log.warning("Shovel %s: its source queue was deleted", self.describe())
        self._terminate("needed a restart", restart=self.config.delete_after == "never")

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
        if self.pending and self.broker.alarms:
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
            log.error("Shovel %s is stopping: publishing failed with %s %s", self.describe(), err.code, err.text)
            self.pending = pending[n:] + self.pending
            self._terminate("needed a restart", restart=True)
        else:
            for qm in pending[n:]:  # (the shovel stopped meanwhile: back to the source)
                self._settle(qm, queue, consumer, ack=False)
        if self.inflight:
            self._check_inflight()
        elif self.active:
            self._reopen()
        self.broker.durability.flush()

    def _forward(self, qm: QueuedMessage) -> Settlement:
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
                ("src-uri", c.src_uri), ("dest-uri", c.dest_uri)]
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
        existing = rt.lookup(fields, b"x-shovelled")
        prior = rt.array_items(existing) if existing is not None and existing[:1] == b"A" else []
        fields = rt.set_table_value(fields, b"x-shovelled", rt.array_value([table, *prior]))
        if existing is not None and existing[:1] != b"A":
            # rabbit_basic:set_invalid_header: the value that was there is kept under
            # x-invalid-headers.
            invalid = rt.lookup(fields, b"x-invalid-headers")
            inner = rt.table_fields(invalid[1:]) if invalid is not None and invalid[:1] == b"F" else []
            earlier = rt.lookup(inner, b"x-shovelled")
            values = [existing, *(rt.array_items(earlier) if earlier is not None and earlier[:1] == b"A" else [])]
            inner = rt.set_table_value(inner, b"x-shovelled", rt.array_value(values))
            fields = rt.set_table_value(fields, b"x-invalid-headers", rt.table_value(inner))
        return fields

    # ------------------------------------------------------------ settling
    def _settle(self, qm: QueuedMessage, queue: Any, consumer: Consumer | None, ack: bool) -> None:
        """Ack the source's copy, or give it back (requeue). No-ack deliveries are settled."""
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
        self.delivering = taking and len(self.pending) < self.window
        if self.delivering and self.queue is not None:
            self.queue.deliver_ready()

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
        if self.broker.alarms:
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
            out.update({"src_uri": c.src_uri, "src_protocol": "amqp091", "dest_protocol": "amqp091",
                        "dest_uri": c.dest_uri})
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
