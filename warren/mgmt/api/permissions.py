"""/api/permissions: a user's configure/write/read regular expressions in a vhost."""

from aiohttp import web

from .. import changes
from ...broker.metadata.commands import ClearPermissions, SetPermissions
from ...broker.auth import invalid_regexp
from ..access import ADMIN, access
from ..app import ApiError, json_response, not_found
from ..resources import flush, list_response, read_body, require
from .vhosts import permission_json

routes = web.RouteTableDef()


@routes.get("/api/permissions")
@access(ADMIN)
async def list_permissions(request):
    broker = request.app["broker"]
    items = [permission_json(u, v, p) for (u, v), p in broker.permissions.items()]
    return list_response(request, items, default_sort=("user", "vhost"))


@routes.get("/api/permissions/{vhost}/{user}")
@access(ADMIN)
async def get_permission(request):
    broker = request.app["broker"]
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    p = broker.permissions.get((user, vhost))
    if p is None:
        raise not_found()
    return json_response(permission_json(user, vhost, p))


@routes.put("/api/permissions/{vhost}/{user}")
@access(ADMIN)
async def put_permission(request):
    broker = request.app["broker"]
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    body = await read_body(request)
    require(body, "configure", "write", "read")
    for key in ("configure", "write", "read"):
        problem = invalid_regexp(body[key])
        if problem is not None:
            raise ApiError(400, "bad_request", ["invalid_regexp", body[key], problem])
    if vhost not in broker.vhosts or user not in broker.users:
        raise ApiError(400, "bad_request", "vhost_or_user_not_found")
    created = (user, vhost) not in broker.permissions
    await changes.apply(request, SetPermissions(user, vhost, body["configure"], body["write"], body["read"]))
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/permissions/{vhost}/{user}")
@access(ADMIN)
async def delete_permission(request):
    if not await changes.apply(request, ClearPermissions(request.match_info["user"], request.match_info["vhost"])):
        raise not_found()
    flush(request)
    return web.Response(status=204)
