"""/api/vhosts: list, create (the creating user gets full permissions, as in RabbitMQ),
update description and tags (and Warren's missing_exchange, warren.broker.missing_exchange),
delete (closing the vhost's connections), permissions."""

from aiohttp import web

from .. import changes
from ...broker.metadata.commands import KEEP, DeleteVHost, PutVHost, SetPermissions
from ...broker import missing_exchange
from ..access import ADMIN, ANY, VISIBLE_VHOSTS, access
from ..app import bad_request, json_response, not_found, trusted
from ..resources import flush, list_response, read_body
from ..stats import message_totals, node_name
from .connections import close_connections

routes = web.RouteTableDef()


def _tags(value) -> list:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(t).strip() for t in value if str(t).strip()]
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    raise bad_request("tags must be a list or a comma-separated string")


def _missing_exchange(body: dict):
    """Warren's capture exchange from a PUT (top level or in "metadata", as the
    definitions have it): the exchange name, None to turn it off (null or ""), or KEEP
    when the body does not name it (the vhost keeps its own). 400 for an invalid value."""
    metadata = body.get("metadata")
    if missing_exchange.SETTING in body:
        value = body[missing_exchange.SETTING]
    elif isinstance(metadata, dict) and missing_exchange.SETTING in metadata:
        value = metadata[missing_exchange.SETTING]
    else:
        return KEEP
    try:
        return missing_exchange.validate(value)
    except missing_exchange.SettingError as err:
        raise bad_request(str(err)) from None


def vhost_json(broker, vhost) -> dict:
    ready, unacked = message_totals(vhost.queues.values())
    metadata = {"description": vhost.description, "tags": list(vhost.tags)}
    if vhost.default_queue_type is not None:  # set by an import, as RabbitMQ shows it
        metadata["default_queue_type"] = vhost.default_queue_type
    out = {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags),
           "default_queue_type": vhost.default_queue_type or "undefined", "metadata": metadata,
           "tracing": False, "cluster_state": {node_name(broker): "running"},
           "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
    if vhost.missing_exchange is not None:  # Warren's extension: shown only when set
        metadata[missing_exchange.SETTING] = out[missing_exchange.SETTING] = vhost.missing_exchange
    return out


def permission_json(user: str, vhost: str, p) -> dict:
    return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}


@routes.get("/api/vhosts")
@access(ANY, lists=VISIBLE_VHOSTS)
async def list_vhosts(request):
    broker = request.app["broker"]
    return list_response(request, [vhost_json(broker, v) for v in broker.vhosts.values()], default_sort=("name",))


@routes.get("/api/vhosts/{name}")
@access(ADMIN)
async def get_vhost(request):
    vhost = request.app["broker"].vhosts.get(request.match_info["name"])
    if vhost is None:
        raise not_found()
    return json_response(vhost_json(request.app["broker"], vhost))


@routes.put("/api/vhosts/{name}")
@access(ADMIN)
async def put_vhost(request):
    name = request.match_info["name"]
    body = await read_body(request)
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request("description must be a string")
    tags = _tags(body["tags"]) if "tags" in body else None
    capture = _missing_exchange(body)
    created = await changes.apply(request, PutVHost(name, KEEP if description is None else description,
                                                    KEEP if tags is None else tags, capture))
    if created and not trusted(request):
        # RabbitMQ gives whoever creates a vhost over the API full permissions on it
        # (warrenctl on the control socket is no user and, as rabbitmqctl, grants none).
        await changes.apply(request, SetPermissions(request["user"].name, name, ".*", ".*", ".*"))
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/vhosts/{name}")
@access(ADMIN)
async def delete_vhost(request):
    broker = request.app["broker"]
    vhost = broker.vhosts.get(request.match_info["name"])
    if vhost is None:
        raise not_found()
    await close_connections(request, "vhost", vhost.name, f"vhost '{vhost.name}' is deleted")
    await changes.apply(request, DeleteVHost(vhost.name))
    flush(request)
    return web.Response(status=204)


@routes.get("/api/vhosts/{name}/permissions")
@access(ADMIN)
async def vhost_permissions(request):
    broker = request.app["broker"]
    name = request.match_info["name"]
    if name not in broker.vhosts:
        raise not_found()
    items = [permission_json(u, v, p) for (u, v), p in broker.permissions.items() if v == name]
    return list_response(request, items, default_sort=("user",))
