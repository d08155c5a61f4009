"""/api/connections: AMQP connections, as RabbitMQ's management API shows them.

Also the helpers channels.py and consumers.py share: which connections are listed (the open
ones) and the vhost named in a path. The JSON shapes are warren.mgmt.shapes'.
"""

from aiohttp import web

from ...amqp.constants import CONNECTION_FORCED
from ...session.connection import OPEN
from ..access import ANY, VHOST, access, own, owner
from ..resources import item_response, list_response
from ..shapes import channel_json, connection_json, connection_name
from ..app import not_found

routes = web.RouteTableDef()

DEFAULT_REASON = "Closed via management plugin"


def open_connections(broker) -> list:
    """The connections past the handshake (RabbitMQ lists a connection once it is open)."""
    return [c for c in list(broker.connections) if c.vhost is not None and c.state == OPEN]


def lookup_connection(broker, name: str):
    for conn in open_connections(broker):
        if connection_name(conn) == name:
            return conn
    return None


def find_connection(broker, name: str):
    conn = lookup_connection(broker, name)
    if conn is None:
        raise not_found()
    return conn


def connection_owner(request) -> str | None:
    """The user of the connection named in the path (for access.owner)."""
    conn = lookup_connection(request.app["broker"], request.match_info["name"])
    return conn.user.name if conn is not None and conn.user is not None else None


def vhost_or_404(broker, name: str):
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise not_found()
    return vhost


# ------------------------------------------------------------------ handlers
@routes.get("/api/connections")
@access(ANY, lists=own())
async def list_connections(request):
    broker = request.app["broker"]
    return list_response(request, [connection_json(c) for c in open_connections(broker)])


@routes.get("/api/vhosts/{vhost}/connections")
@access(VHOST, lists=own())
async def list_vhost_connections(request):
    broker = request.app["broker"]
    vhost = vhost_or_404(broker, request.match_info["vhost"])
    return list_response(request, [connection_json(c) for c in open_connections(broker)
                                         if c.vhost is vhost])


@routes.get("/api/connections/{name}")
@access(owner(connection_owner))
async def get_connection(request):
    conn = find_connection(request.app["broker"], request.match_info["name"])
    return item_response(request, connection_json(conn))


@routes.delete("/api/connections/{name}")
@access(owner(connection_owner))
async def delete_connection(request):
    """Close the connection with 320 CONNECTION_FORCED and the X-Reason header's text, as RabbitMQ."""
    conn = find_connection(request.app["broker"], request.match_info["name"])
    reason = request.headers.get("X-Reason") or DEFAULT_REASON
    conn.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
@access(owner(connection_owner), lists=own())
async def connection_channels(request):
    conn = find_connection(request.app["broker"], request.match_info["name"])
    return list_response(request, [channel_json(ch) for ch in list(conn.channels.values())])
