"""/api/connections: AMQP connections, as RabbitMQ's management API shows them.

Also the helpers channels.py and consumers.py share: which connections are listed (the open
ones) and the vhost named in a path. The JSON shapes are warren.mgmt.shapes'; the
connections are the broker's handles of them (warren.broker.records).
"""

from aiohttp import web

from ...broker.records import ConnectionHandle
from ..access import ANY, VHOST, access, own, owner
from ..resources import item_response, list_response
from ..shapes import channel_json, connection_json
from ..app import not_found

routes = web.RouteTableDef()

DEFAULT_REASON = "Closed via management plugin"


def open_connections(broker) -> list[ConnectionHandle]:
    """The open connections: the broker registers a connection once it is open, as RabbitMQ
    lists it, and forgets it as it closes."""
    return list(broker.connections)


def lookup_connection(broker, name: str) -> ConnectionHandle | None:
    for conn in open_connections(broker):
        if conn.connection_link().name == name:
            return conn
    return None


def find_connection(broker, name: str) -> ConnectionHandle:
    conn = lookup_connection(broker, name)
    if conn is None:
        raise not_found()
    return conn


def connection_owner(request) -> str | None:
    """The user of the connection named in the path (for access.owner)."""
    conn = lookup_connection(request.app["broker"], request.match_info["name"])
    return conn.info().user if conn is not None else None


def vhost_or_404(broker, name: str):
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise not_found()
    return vhost


def close_connections(broker, match, reason: str) -> None:
    """Close, with 320 CONNECTION_FORCED and `reason`, every connection whose record `match`es
    (a deleted user's or vhost's)."""
    for conn in open_connections(broker):
        if match(conn.info()):
            conn.force_close(reason)


# ------------------------------------------------------------------ handlers
@routes.get("/api/connections")
@access(ANY, lists=own())
async def list_connections(request):
    broker = request.app["broker"]
    return list_response(request, [connection_json(broker, c) for c in open_connections(broker)])


@routes.get("/api/vhosts/{vhost}/connections")
@access(VHOST, lists=own())
async def list_vhost_connections(request):
    broker = request.app["broker"]
    vhost = vhost_or_404(broker, request.match_info["vhost"])
    return list_response(request, [connection_json(broker, c, info) for c in open_connections(broker)
                                   for info in (c.info(),) if info.vhost == vhost.name])


@routes.get("/api/connections/{name}")
@access(owner(connection_owner))
async def get_connection(request):
    broker = request.app["broker"]
    conn = find_connection(broker, request.match_info["name"])
    return item_response(request, connection_json(broker, conn))


@routes.delete("/api/connections/{name}")
@access(owner(connection_owner))
async def delete_connection(request):
    """Close the connection with 320 CONNECTION_FORCED and the X-Reason header's text, as RabbitMQ."""
    conn = find_connection(request.app["broker"], request.match_info["name"])
    conn.force_close(request.headers.get("X-Reason") or DEFAULT_REASON)
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
@access(owner(connection_owner), lists=own())
async def connection_channels(request):
    broker = request.app["broker"]
    conn = find_connection(broker, request.match_info["name"])
    return list_response(request, [channel_json(broker, ch) for ch in list(conn.channels.values())])
