"""/api/connections: AMQP connections, as RabbitMQ's management API shows them.

Also the helpers channels.py and consumers.py share: which connections are listed (the open
ones) and the vhost named in a path. The JSON shapes are warren.mgmt.shapes'; the
connections are the broker's handles of them (warren.broker.records).
"""

from aiohttp import web

from ...broker.records import ConnectionHandle
from .. import peers
from ..access import ANY, VHOST, access, own, owner, owner_refusal
from ..resources import item_response, list_response
from ..shapes import channel_json, connection_json
from ..app import ApiError, not_found

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


async def close_connections(request, field: str, value: str, reason: str) -> None:
    """Close, with 320 CONNECTION_FORCED and `reason`, every connection of the cluster whose
    record's `field` ("user" or "vhost") is `value` (a deleted user's or vhost's)."""
    for conn in open_connections(request.app["broker"]):
        if getattr(conn.info(), field) == value:
            conn.force_close(reason)
    await peers.close_elsewhere(request, {field: value}, reason)


def check_owner(request, name: str | None) -> None:
    """A 401 unless the request's user may see (or close) an object of user `name` found on
    another cluster member (the route's owner rule saw only this node's)."""
    reason = owner_refusal(request, name)
    if reason is not None:
        raise ApiError(401, "not_authorised", reason)


async def connection_record(request) -> dict:
    """The JSON of the connection named in the path, on this node or another member (404 if
    none has it); its user's or a privileged one's only (access.owner: 401 otherwise)."""
    broker = request.app["broker"]
    name = request.match_info["name"]
    conn = lookup_connection(broker, name)
    if conn is not None:  # (the route's rule checked its owner)
        return connection_json(broker, conn)
    found = await peers.listing(request, peers.CONNECTIONS, {"name": name}, here=False)
    if not found:
        raise not_found()
    check_owner(request, found[0].get("user"))
    return found[0]


# ------------------------------------------------------------------ handlers
@routes.get("/api/connections")
@access(ANY, lists=own())
async def list_connections(request):
    return list_response(request, await peers.listing(request, peers.CONNECTIONS))


@routes.get("/api/vhosts/{vhost}/connections")
@access(VHOST, lists=own())
async def list_vhost_connections(request):
    vhost = vhost_or_404(request.app["broker"], request.match_info["vhost"])
    return list_response(request, await peers.listing(request, peers.CONNECTIONS, {"vhost": vhost.name}))


@routes.get("/api/connections/{name}")
@access(owner(connection_owner))
async def get_connection(request):
    return item_response(request, await connection_record(request))


@routes.delete("/api/connections/{name}")
@access(owner(connection_owner))
async def delete_connection(request):
    """Close the connection with 320 CONNECTION_FORCED and the X-Reason header's text, as
    RabbitMQ; one of another member through it."""
    reason = request.headers.get("X-Reason") or DEFAULT_REASON
    conn = lookup_connection(request.app["broker"], request.match_info["name"])
    if conn is not None:
        conn.force_close(reason)
    else:
        record = await connection_record(request)
        await peers.close_elsewhere(request, {"name": record["name"]}, reason)
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
@access(owner(connection_owner), lists=own())
async def connection_channels(request):
    record = await connection_record(request)
    broker = request.app["broker"]
    conn = lookup_connection(broker, record["name"])
    if conn is not None:
        return list_response(request, [channel_json(broker, ch) for ch in list(conn.channels.values())])
    return list_response(request, await peers.listing(request, peers.CHANNELS, {"connection": record["name"]},
                                                      here=False))
