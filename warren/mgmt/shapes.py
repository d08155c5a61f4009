"""The JSON shapes of the broker's objects, as RabbitMQ's management API shows them:
queues, exchanges, bindings, consumers, connections and channels.

Handlers answer with these and warrenctl reads them, so one function per object keeps every
path that shows an object showing it alike. Request and response handling (parsing, list
options, errors, field tables <-> JSON) is warren.mgmt.resources'; counters and rates are
warren.mgmt.stats'. Connections and channels are shown from their records
(warren.broker.records), read through the broker's handles of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..broker.policy import effective_definition
from .resources import properties_key, table_json
from .stats import (channel_stats, connection_stats, exchange_stats, node_name, queue_stats,
                    unacked_bytes_by_queue)

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.consumer import Consumer
    from ..broker.exchanges.base import Binding, Exchange
    from ..broker.queues.base import Queue
    from ..broker.records import (
        ChannelHandle, ChannelInfo, ConnectionHandle, ConnectionInfo, ConnectionLink, TLSSession,
    )
    from ..broker.vhost import VHost

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


def default_binding(queue: Queue) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange (RabbitMQ lists it)."""
    return binding_json(queue.vhost.name, "", queue.name, "queue", queue.name, {})


def _binding_sort_key(b: dict[str, Any]) -> tuple[str, ...]:
    return (b["vhost"], b["source"], b["destination"], b["destination_type"], b["routing_key"],
            b["properties_key"])


def vhost_bindings(vhost: VHost, source: Exchange | None = None,
                   destination: Queue | Exchange | None = None) -> list[dict[str, Any]]:
    """The bindings of a vhost (optionally from one source / to one destination), the
    default exchange's implicit ones included, in RabbitMQ's order."""
    out = []
    if source is None or source.is_default:
        if destination is not None:
            if destination.kind == "queue":
                out.append(default_binding(cast("Queue", destination)))
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
def queue_json(broker: Broker, q: Queue, unacked_bytes: int | None = None, details: bool = False) -> dict[str, Any]:
    op = q.operator_policy
    d = {"name": q.name, "vhost": q.vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
         "exclusive": q.exclusive, "arguments": table_json(q.arguments), "type": q.queue_type,
         "node": getattr(q, "home", None) or (node_name(broker) if broker is not None else "")}
    if not q.reachable:  # its home is down: RabbitMQ lists what its record says, no more
        return {**{k: d[k] for k in sorted(d)}, "state": "down"}
    d.update({
         "policy": q.policy.name if q.policy is not None else None,
         "operator_policy": op.name if op is not None else None,
         "effective_policy_definition": effective_definition(q.policy, op),
         "single_active_consumer_tag": q.single_active_consumer_tag})
    caps = q.CAPABILITIES
    if caps.members:  # one node: the only member (a stream's JSON has no leader)
        members: list[str] = list(q.members) if q.members else [str(d["node"])]
        links = broker.node_links if broker is not None else None
        d.update({"members": members, "online": links.online(members) if q.members and links is not None else members})
        if caps.leader:
            d["leader"] = d["node"]  # (a replicated queue's node is its leader's, as RabbitMQ's)
    d.update(q.info())  # what the type adds (a stream's offsets)
    ready, unacked, ready_bytes = q.message_counts()
    d.update({"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
              "message_bytes": ready_bytes, "message_bytes_ready": ready_bytes,
              "consumers": q.consumer_count, "state": "running",
              "exclusive_consumer_tag": next((c.tag for c in q.consumers if c.exclusive), None)})
    d.update(queue_stats(broker, q, unacked_bytes))
    if q.owner is not None:
        d["owner_pid_details"] = link_json(q.owner.link)
    if details:
        # (this node's: another member's consumers of it are that member's to show)
        d["consumer_details"] = [consumer_json(broker, c) for c in q.consumers if not c.remote]
        d["incoming"] = []
        d["deliveries"] = []
    return d


def queues_json(broker: Broker, queues: list[Queue]) -> list[dict[str, Any]]:
    unacked = unacked_bytes_by_queue(broker)
    return [queue_json(broker, q, unacked.get(q, 0)) for q in queues]


# ------------------------------------------------------ connections, channels
def link_json(link: ConnectionLink) -> dict[str, Any]:
    """A connection as a channel's connection_details and a queue's owner_pid_details name it."""
    return {"name": link.name, "peer_host": link.peer_host, "peer_port": link.peer_port}


def _blocked_age(age: float | None) -> float | str:
    """Seconds since the connection was last blocked (0 while it is), "infinity" if never."""
    return "infinity" if age is None else round(age, 1)


_NOT_TLS: dict[str, Any] = {"peer_cert_issuer": None, "peer_cert_subject": None, "peer_cert_validity": None,
                            "ssl": False, "ssl_cipher": None, "ssl_hash": None, "ssl_key_exchange": None,
                            "ssl_protocol": None}


def tls_json(tls: TLSSession | None) -> dict[str, Any]:
    """ssl and the TLS session's fields, as RabbitMQ's reader shows them (null when not over
    TLS, the peer_cert_* ones also when the client sent no certificate)."""
    info = dict(_NOT_TLS)
    if tls is None:
        return info
    info["ssl"] = True
    info.update(ssl_protocol=tls.protocol.lower(), ssl_cipher=tls.cipher, ssl_hash=tls.hash,
                ssl_key_exchange=tls.key_exchange)
    cert = tls.peer_certificate
    if cert is not None:
        info.update(peer_cert_issuer=cert.issuer, peer_cert_subject=cert.subject, peer_cert_validity=cert.validity)
    return info


def connection_json(broker: Broker, conn: ConnectionHandle, c: ConnectionInfo | None = None) -> dict[str, Any]:
    """The connection's JSON, from its record `c` (read now if not given)."""
    if c is None:
        c = conn.info()
    info = {
        "auth_mechanism": c.auth_mechanism,
        "channel_max": c.channel_max,
        "channels": c.channel_count,
        "client_properties": c.client_properties,
        "connected_at": c.connected_at,
        "frame_max": c.frame_max,
        "host": c.host,
        "name": c.name,
        "node": node_name(broker),
        "peer_host": c.peer_host,
        "peer_port": c.peer_port,
        "port": c.port,
        "protocol": PROTOCOL,
        **(_NOT_TLS if c.tls is None else tls_json(c.tls)),
        # running, flow (read no faster than the store accepts, now or in the last 5 s),
        # blocking (an alarm is on), blocked (its publishing is held by an alarm).
        # last_blocked_by / last_blocked_age are the seed's (RabbitMQ 3.10's API lacks them).
        "state": c.state,
        "last_blocked_by": c.last_blocked_by,
        "last_blocked_age": _blocked_age(c.blocked_age),
        "timeout": c.heartbeat,
        "type": "network",
        "user": c.user,
        "user_who_performed_action": c.user,
        "vhost": c.vhost,
    }
    if c.provided_name is not None:
        info["user_provided_name"] = c.provided_name
    info.update(connection_stats(broker, conn, c))
    return info


def channel_json(broker: Broker, channel: ChannelHandle, details: bool = False,
                 ch: ChannelInfo | None = None) -> dict[str, Any]:
    """The channel's JSON, from its record `ch` (read now if not given)."""
    if ch is None:
        ch = channel.info()
    info = {
        "acks_uncommitted": ch.acks_uncommitted,
        "confirm": ch.confirm,
        "connection_details": link_json(ch.connection),
        "consumer_count": ch.consumer_count,
        "global_prefetch_count": ch.global_prefetch,
        "messages_unacknowledged": ch.unacked,
        "messages_uncommitted": ch.uncommitted,
        "messages_unconfirmed": ch.unconfirmed,
        "name": ch.name,
        "node": node_name(broker),
        "number": ch.number,
        "pending_raft_commands": 0,
        "prefetch_count": ch.prefetch,
        "state": ch.state,
        "transactional": ch.transactional,
        "user": ch.user,
        "user_who_performed_action": ch.user,
        "vhost": ch.vhost,
    }
    info.update(channel_stats(broker, channel, ch.counters))
    if details:
        info["consumer_details"] = [consumer_json(broker, c) for c in list(channel.consumers.values())]
        info["deliveries"] = []
        info["publishes"] = []
    return info


def consumer_json(broker: Broker, consumer: Consumer) -> dict[str, Any]:
    node = node_name(broker)
    internal = getattr(consumer.channel, "channel_details", None)
    if internal is not None:  # a shovel's (warren.broker.shovel): no AMQP channel
        details = {**internal(), "node": node}
    else:
        link = cast("ChannelHandle", consumer.channel).channel_link()
        details = {
            "connection_name": link.connection.name,
            "name": link.name,
            "node": node,
            "number": link.number,
            "peer_host": link.connection.peer_host,
            "peer_port": link.connection.peer_port,
            "user": link.user,
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
        **consumer.queue.consumer_info(consumer),  # what the type adds (a stream reader's position)
    }
