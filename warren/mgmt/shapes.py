"""The JSON shapes of the broker's objects, as RabbitMQ's management API shows them:
queues, exchanges, bindings, consumers, connections and channels.

Handlers answer with these and warrenctl reads them, so one function per object keeps every
path that shows an object showing it alike. Request and response handling (parsing, list
options, errors, field tables <-> JSON) is warren.mgmt.resources'; counters and rates are
warren.mgmt.stats'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..broker.policy import effective_definition
from ..broker import x509
from .resources import properties_key, table_json
from .stats import (channel_stats, connection_stats, exchange_stats, node_name, queue_stats,
                    unacked_bytes_by_queue)

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.consumer import Consumer
    from ..broker.exchanges.base import Binding, Exchange
    from ..broker.queues.classic import ClassicQueue
    from ..broker.vhost import VHost
    from ..session.channel import Channel
    from ..session.connection import Connection

PROTOCOL = "AMQP 0-9-1"


# ----------------------------------------------------------------- bindings
def binding_json(vhost_name: str, source: str, destination: str, dest_type: str, routing_key: str,
                 arguments: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "vhost": vhost_name, "destination": destination, "destination_type": dest_type,
            "routing_key": routing_key, "arguments": table_json(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def binding_of(b: Binding) -> dict[str, Any]:
    return binding_json(b.source.vhost.name, b.source.name, b.destination.name, b.destination.kind,
                        b.routing_key, b.arguments)


def default_binding(queue: ClassicQueue) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange (RabbitMQ lists it)."""
    return binding_json(queue.vhost.name, "", queue.name, "queue", queue.name, {})


def _binding_sort_key(b: dict[str, Any]) -> tuple[str, ...]:
    return (b["vhost"], b["source"], b["destination"], b["destination_type"], b["routing_key"],
            b["properties_key"])


def vhost_bindings(vhost: VHost, source: Exchange | None = None,
                   destination: ClassicQueue | Exchange | None = None) -> list[dict[str, Any]]:
    """The bindings of a vhost (optionally from one source / to one destination), the
    default exchange's implicit ones included, in RabbitMQ's order."""
    out = []
    if source is None or source.is_default:
        if destination is not None:
            if destination.kind == "queue":
                out.append(default_binding(cast("ClassicQueue", destination)))
        else:
            out.extend(default_binding(q) for q in sorted(vhost.queues.values(), key=lambda q: q.name))
    if destination is not None:  # through the vhost's index by destination, not a scan
        explicit = [binding_of(b) for b in vhost.bindings_to(destination)
                    if source is None or b.source is source]
    else:
        explicit = [binding_of(b) for x in vhost.exchanges.values()
                    if not x.is_default and (source is None or x is source) for b in x.bindings.values()]
    explicit.sort(key=_binding_sort_key)
    return out + explicit


# ---------------------------------------------------------------- exchanges
def exchange_json(x: Exchange) -> dict[str, Any]:
    d = {"name": x.name, "vhost": x.vhost.name, "type": x.type_name, "durable": x.durable,
         "auto_delete": x.auto_delete, "internal": x.internal, "arguments": table_json(x.arguments)}
    if x.policy is not None:
        d["policy"] = x.policy.name
    d.update(exchange_stats(x))
    return d


# ------------------------------------------------------------------- queues
def _conn_details(conn: Connection) -> dict[str, Any]:
    peer = conn.peer
    return {"name": connection_name(conn), "peer_host": peer[0], "peer_port": peer[1]}


def queue_json(q: ClassicQueue, unacked_bytes: int | None = None, details: bool = False) -> dict[str, Any]:
    broker = q.vhost.broker
    op = q.operator_policy
    d = {"name": q.name, "vhost": q.vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
         "exclusive": q.exclusive, "arguments": table_json(q.arguments), "type": q.queue_type,
         "node": node_name(broker) if broker is not None else "",
         "policy": q.policy.name if q.policy is not None else None,
         "operator_policy": op.name if op is not None else None,
         "effective_policy_definition": effective_definition(q.policy, op),
         "single_active_consumer_tag": q.consumers.active.tag if q.consumers.active is not None else None}
    if q.queue_type != "classic":  # one node: the only member (a stream's JSON has no leader)
        d.update({"members": [d["node"]], "online": [d["node"]]})
        if q.queue_type == "quorum":
            d["leader"] = d["node"]
    if q.queue_type == "stream":
        # Warren's: first/last/next offsets, the oldest chunk's time, and the named consumers'
        # offsets and lag (queues/stream.py).
        d["stream"] = q.offsets()  # type: ignore[attr-defined]
    ready, unacked = len(q.store), q.unacked_count
    d.update({"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
              "message_bytes": q.store.ready_bytes, "message_bytes_ready": q.store.ready_bytes,
              "consumers": q.consumer_count, "state": "running",
              "exclusive_consumer_tag": next((c.tag for c in q.consumers if c.exclusive), None)})
    d.update(queue_stats(q, unacked_bytes))
    if q.owner is not None:
        internal = getattr(q.owner, "channel_details", None)  # a shovel's queue (warren.broker.shovel)
        d["owner_pid_details"] = ({k: v for k, v in internal().items() if k in ("peer_host", "peer_port")}
                                  | {"name": internal()["connection_name"]} if internal is not None
                                  else _conn_details(cast("Connection", q.owner)))
    if details:
        d["consumer_details"] = [consumer_json(c) for c in q.consumers]
        d["incoming"] = []
        d["deliveries"] = []
    return d


def queues_json(broker: Broker, queues: list[ClassicQueue]) -> list[dict[str, Any]]:
    unacked = unacked_bytes_by_queue(broker)
    return [queue_json(q, unacked.get(q, 0)) for q in queues]


# ------------------------------------------------------ connections, channels
def addresses(conn: Connection) -> tuple[tuple[str, int], tuple[str, int]]:
    """((peer host, peer port), (local host, local port)) of a connection."""
    peer, local = conn.peer, conn.transport.local
    return (peer[0], peer[1]), (local[0], local[1])


def connection_name(conn: Connection) -> str:
    """RabbitMQ's name of a connection: "127.0.0.1:PEERPORT -> 127.0.0.1:PORT"."""
    (peer_host, peer_port), (host, port) = addresses(conn)
    return f"{peer_host}:{peer_port} -> {host}:{port}"


def _blocked_age(conn: Connection) -> float | str:
    """Seconds since the connection was last blocked (0 while it is), "infinity" if never."""
    age = conn.blocked_age()
    return "infinity" if age is None else round(age, 1)


def tls_json(conn: Connection) -> dict[str, Any]:
    """ssl and the TLS session's fields, as RabbitMQ's reader shows them (null when not over
    TLS, the peer_cert_* ones also when the client sent no certificate)."""
    tls = conn.tls
    info: dict[str, Any] = {"peer_cert_issuer": None, "peer_cert_subject": None, "peer_cert_validity": None,
                            "ssl": tls is not None, "ssl_cipher": None, "ssl_hash": None,
                            "ssl_key_exchange": None, "ssl_protocol": None}
    if tls is None:
        return info
    key_exchange, cipher, mac = x509.cipher_suite(tls.cipher)
    info.update(ssl_protocol=tls.protocol.lower(), ssl_cipher=cipher, ssl_hash=mac or None,
                ssl_key_exchange=key_exchange)
    if tls.peer_cert is not None:
        try:
            info.update(peer_cert_issuer=x509.issuer(tls.peer_cert), peer_cert_subject=x509.subject(tls.peer_cert),
                        peer_cert_validity=x509.validity(tls.peer_cert))
        except x509.CertificateError:
            pass
    return info


def connection_json(conn: Connection) -> dict[str, Any]:
    broker = conn.broker
    user, vhost = conn.user, conn.vhost
    assert user is not None and vhost is not None  # only open connections are shown
    (peer_host, peer_port), (host, port) = addresses(conn)
    info = {
        "auth_mechanism": getattr(conn, "auth_mechanism", None) or "PLAIN",
        "channel_max": conn.channel_max,
        "channels": len(conn.channels),
        "client_properties": conn.client_properties,
        "connected_at": conn.connected_at,
        "frame_max": conn.frame_max,
        "host": host,
        "name": f"{peer_host}:{peer_port} -> {host}:{port}",
        "node": node_name(broker),
        "peer_host": peer_host,
        "peer_port": peer_port,
        "port": port,
        "protocol": PROTOCOL,
        **tls_json(conn),
        # running, flow (read no faster than the store accepts, now or in the last 5 s),
        # blocking (an alarm is on), blocked (its publishing is held by an alarm).
        # last_blocked_by / last_blocked_age are the seed's (RabbitMQ 3.10's API lacks them).
        "state": conn.throttle_state,
        "last_blocked_by": conn.last_blocked_by,
        "last_blocked_age": _blocked_age(conn),
        "timeout": conn.heartbeat,
        "type": "network",
        "user": user.name,
        "user_who_performed_action": user.name,
        "vhost": vhost.name,
    }
    user_name = conn.client_properties.get("connection_name")
    if isinstance(user_name, (str, bytes)):
        info["user_provided_name"] = user_name.decode(errors="replace") if isinstance(user_name, bytes) else user_name
    info.update(connection_stats(conn))
    return info


def channel_name(channel: Channel) -> str:
    return f"{connection_name(channel.conn)} ({channel.id})"


def channel_json(channel: Channel, details: bool = False) -> dict[str, Any]:
    conn = channel.conn
    vhost = channel.vhost
    assert vhost is not None  # only channels of open connections are shown
    (peer_host, peer_port), _ = addresses(conn)
    tx = channel.tx
    info = {
        "acks_uncommitted": tx.acks_uncommitted if tx is not None else 0,
        "confirm": channel.confirm,
        "connection_details": {"name": connection_name(conn), "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(channel.consumers),
        "global_prefetch_count": channel.global_prefetch,
        "messages_unacknowledged": len(channel.unacked),
        "messages_uncommitted": tx.messages_uncommitted if tx is not None else 0,
        "messages_unconfirmed": channel.publish_seq - channel.confirmed if channel.confirm else 0,
        "name": channel_name(channel),
        "node": node_name(conn.broker),
        "number": channel.id,
        "pending_raft_commands": 0,
        "prefetch_count": channel.prefetch,
        "state": "running" if channel.state == 0 else "closing",
        "transactional": channel.tx is not None,
        "user": channel.user,
        "user_who_performed_action": channel.user,
        "vhost": vhost.name,
    }
    info.update(channel_stats(channel))
    if details:
        info["consumer_details"] = [consumer_json(c) for c in channel.consumers.values()]
        info["deliveries"] = []
        info["publishes"] = []
    return info


def consumer_json(consumer: Consumer) -> dict[str, Any]:
    internal = getattr(consumer.channel, "channel_details", None)
    if internal is not None:  # a shovel's (warren.broker.shovel): no AMQP channel
        details = {**internal(), "node": node_name(consumer.queue.vhost.broker)}
    else:
        channel = cast("Channel", consumer.channel)
        conn = channel.conn
        (peer_host, peer_port), _ = addresses(conn)
        details = {
            "connection_name": connection_name(conn),
            "name": channel_name(channel),
            "node": node_name(conn.broker),
            "number": channel.id,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": channel.user,
        }
    active, activity_status = consumer.queue.consumers.activity(consumer)
    return {
        "ack_required": not consumer.no_ack,
        "active": active,
        "activity_status": activity_status,
        "arguments": consumer.arguments,
        "channel_details": details,
        "consumer_tag": consumer.tag,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
        **_stream_position(consumer),
    }


def _stream_position(consumer: Consumer) -> dict[str, Any]:
    """Warren's: a stream consumer's next offset and how far behind the stream's end it is."""
    queue = consumer.queue
    if queue.queue_type != "stream":
        return {}
    offset = queue.reader_offset(consumer)
    if offset is None:
        return {}
    return {"stream_offset": offset, "stream_lag": max(queue.log.committed - offset, 0)}
