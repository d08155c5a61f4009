"""/api/connections: AMQP connections, as RabbitMQ's management API shows them.

Also the helpers channels.py and consumers.py share: a connection's RabbitMQ name
("127.0.0.1:PEERPORT -> 127.0.0.1:PORT"), and the JSON of connections, channels and consumers.
"""

import time

from aiohttp import web

from ...amqp.constants import CONNECTION_FORCED
from ...session.connection import OPEN
from .. import stats
from ..resources import item_response, list_response
from ..app import not_found

routes = web.RouteTableDef()

PROTOCOL = "AMQP 0-9-1"
DEFAULT_REASON = "Closed via management plugin"


def addresses(conn):
    """((peer host, peer port), (local host, local port)) of a connection."""
    peer = conn.peer
    local = None
    transport = getattr(getattr(conn, "transport", None), "transport", None)
    if transport is not None:
        local = transport.get_extra_info("sockname")
    if not local:
        local = ("127.0.0.1", 0)
    return (peer[0], peer[1]), (local[0], local[1])


def connection_name(conn) -> str:
    (peer_host, peer_port), (host, port) = addresses(conn)
    return f"{peer_host}:{peer_port} -> {host}:{port}"


def open_connections(broker) -> list:
    """The connections past the handshake (RabbitMQ lists a connection once it is open)."""
    return [c for c in list(broker.connections) if c.vhost is not None and c.state == OPEN]


def find_connection(broker, name: str):
    for conn in open_connections(broker):
        if connection_name(conn) == name:
            return conn
    raise not_found()


def _blocked_age(conn):
    at = getattr(conn, "last_blocked_at", None)
    return "infinity" if at is None else round(time.monotonic() - at, 1)


def connection_info(conn) -> dict:
    broker = conn.broker
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
        "node": stats.node_name(broker),
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "port": port,
        "protocol": PROTOCOL,
        "ssl": False,
        "ssl_cipher": None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "ssl_protocol": None,
        # running, or flow / blocking / blocked once resource alarms exist (they set these).
        "state": getattr(conn, "blocked_state", None) or "running",
        "last_blocked_by": getattr(conn, "last_blocked_by", None) or "none",
        "last_blocked_age": _blocked_age(conn),
        "timeout": conn.heartbeat,
        "type": "network",
        "user": conn.user.name,
        "user_who_performed_action": conn.user.name,
        "vhost": conn.vhost.name,
    }
    user_name = conn.client_properties.get("connection_name")
    if isinstance(user_name, (str, bytes)):
        info["user_provided_name"] = user_name.decode(errors="replace") if isinstance(user_name, bytes) else user_name
    info.update(stats.connection_stats(conn))
    return info


def channel_name(channel) -> str:
    return f"{connection_name(channel.conn)} ({channel.id})"


def channel_info(channel, details: bool = False) -> dict:
    conn = channel.conn
    (peer_host, peer_port), _ = addresses(conn)
    tx = channel.tx or ()
    info = {
        "acks_uncommitted": sum(len(a[1]) for a in tx if a[0] == "ack"),
        "confirm": channel.confirm,
        "connection_details": {"name": connection_name(conn), "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(channel.consumers),
        "global_prefetch_count": channel.global_prefetch,
        "messages_unacknowledged": len(channel.unacked),
        "messages_uncommitted": sum(1 for a in tx if a[0] == "publish"),
        "messages_unconfirmed": channel.publish_seq - channel.confirmed if channel.confirm else 0,
        "name": channel_name(channel),
        "node": stats.node_name(conn.broker),
        "number": channel.id,
        "pending_raft_commands": 0,
        "prefetch_count": channel.prefetch,
        "state": "running" if channel.state == 0 else "closing",
        "transactional": channel.tx is not None,
        "user": channel.user,
        "user_who_performed_action": channel.user,
        "vhost": channel.vhost.name,
    }
    info.update(stats.channel_stats(channel))
    if details:
        info["consumer_details"] = [consumer_info(c) for c in channel.consumers.values()]
        info["deliveries"] = []
        info["publishes"] = []
    return info


def consumer_info(consumer) -> dict:
    channel = consumer.channel
    conn = channel.conn
    (peer_host, peer_port), _ = addresses(conn)
    return {
        "ack_required": not consumer.no_ack,
        "active": True,
        "activity_status": "up",
        "arguments": consumer.arguments,
        "channel_details": {
            "connection_name": connection_name(conn),
            "name": channel_name(channel),
            "node": stats.node_name(conn.broker),
            "number": channel.id,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": channel.user,
        },
        "consumer_tag": consumer.tag,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
    }


def vhost_or_404(broker, name: str):
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise not_found()
    return vhost


# ------------------------------------------------------------------ handlers
@routes.get("/api/connections")
async def list_connections(request):
    broker = request.app["broker"]
    return list_response(request, [connection_info(c) for c in open_connections(broker)])


@routes.get("/api/vhosts/{vhost}/connections")
async def list_vhost_connections(request):
    broker = request.app["broker"]
    vhost = vhost_or_404(broker, request.match_info["vhost"])
    return list_response(request, [connection_info(c) for c in open_connections(broker)
                                         if c.vhost is vhost])


@routes.get("/api/connections/{name}")
async def get_connection(request):
    conn = find_connection(request.app["broker"], request.match_info["name"])
    return item_response(request, connection_info(conn))


@routes.delete("/api/connections/{name}")
async def delete_connection(request):
    """Close the connection with 320 CONNECTION_FORCED and the X-Reason header's text, as RabbitMQ."""
    conn = find_connection(request.app["broker"], request.match_info["name"])
    reason = request.headers.get("X-Reason") or DEFAULT_REASON
    conn.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
async def connection_channels(request):
    conn = find_connection(request.app["broker"], request.match_info["name"])
    return list_response(request, [channel_info(ch) for ch in list(conn.channels.values())])
