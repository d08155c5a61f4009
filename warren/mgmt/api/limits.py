"""/api/vhost-limits[/vhost[/name]] (max-connections, max-queues) and
/api/user-limits[/user[/name]] (max-connections, max-channels): read, set one, clear one, as
RabbitMQ 3.10's management API (the limits themselves: warren.broker.limits)."""

from aiohttp import web

from .. import changes
from ...broker import limits
from ..access import ADMIN, ANY, IN_VISIBLE_VHOSTS, VHOST_VISIBLE, access
from ..app import ApiError, bad_request, not_found
from ..resources import flush, list_response, read_value, vhost_for_change, vhost_or_404

routes = web.RouteTableDef()


# ------------------------------------------------------------------ vhost limits
def _vhost_item(vhost) -> list[dict]:
    # A vhost whose limits parameter is empty (its last limit cleared) lists none.
    return [{"vhost": vhost.name, "value": dict(vhost.limits)}] if vhost.limits else []


@routes.get("/api/vhost-limits", allow_head=False)  # RabbitMQ: no HEAD here (405)
@access(VHOST_VISIBLE, lists=IN_VISIBLE_VHOSTS)
async def list_vhost_limits(request):
    items = [item for vhost in request.app["broker"].vhosts.values() for item in _vhost_item(vhost)]
    return list_response(request, items, default_sort=("vhost",))


@routes.get("/api/vhost-limits/{vhost}", allow_head=False)  # RabbitMQ: no HEAD here (405)
@access(VHOST_VISIBLE, lists=IN_VISIBLE_VHOSTS)
async def get_vhost_limits(request):
    return list_response(request, _vhost_item(vhost_or_404(request)), default_sort=("vhost",))


@routes.put("/api/vhost-limits/{vhost}/{name}")
@access(ADMIN)
async def put_vhost_limit(request):
    """204 whether or not the limit was set before, as RabbitMQ."""
    vhost = vhost_for_change(request)
    value = await read_value(request)
    try:
        name = request.match_info["name"]
        await changes.perform(request, lambda: limits.set_vhost_limit.change(request.app["broker"], vhost, name, value))
    except limits.LimitError as err:
        raise bad_request(err.validation_failed()) from None
    flush(request)
    return web.Response(status=204)


@routes.delete("/api/vhost-limits/{vhost}/{name}")
@access(ADMIN)
async def delete_vhost_limit(request):
    """204 even for a limit that is not set (RabbitMQ; its 500 for a missing vhost is a 404
    here)."""
    vhost, name = vhost_or_404(request), request.match_info["name"]
    await changes.perform(request, lambda: limits.clear_vhost_limit.change(request.app["broker"], vhost, name))
    flush(request)
    return web.Response(status=204)


# ------------------------------------------------------------------- user limits
def _user_item(user) -> list[dict]:
    return [{"user": user.name, "value": dict(user.limits)}] if user.limits else []


def _user_or_404(request):
    user = request.app["broker"].users.get(request.match_info["user"])
    if user is None:
        raise not_found()
    return user


@routes.get("/api/user-limits", allow_head=False)  # RabbitMQ: no HEAD here (405)
@access(ANY)
async def list_user_limits(request):
    items = [item for user in request.app["broker"].users.values() for item in _user_item(user)]
    return list_response(request, items, default_sort=("user",))


@routes.get("/api/user-limits/{user}", allow_head=False)  # RabbitMQ: no HEAD here (405)
@access(ANY)
async def get_user_limits(request):
    return list_response(request, _user_item(_user_or_404(request)), default_sort=("user",))


@routes.put("/api/user-limits/{user}/{name}")
@access(ADMIN)
async def put_user_limit(request):
    broker = request.app["broker"]
    name = request.match_info["user"]
    user = broker.users.get(name)
    if user is None:
        raise ApiError(400, "bad_request", ["no_such_user", name])
    value = await read_value(request)
    try:
        limit = request.match_info["name"]
        await changes.perform(request, lambda: limits.set_user_limit.change(broker, user, limit, value))
    except limits.LimitError as err:
        raise bad_request(str(err)) from None
    flush(request)
    return web.Response(status=204)


@routes.delete("/api/user-limits/{user}/{name}")
@access(ADMIN)
async def delete_user_limit(request):
    """204 even for a limit that is not set (RabbitMQ; its 500 for a missing user is a 404
    here)."""
    user, name = _user_or_404(request), request.match_info["name"]
    await changes.perform(request, lambda: limits.clear_user_limit.change(request.app["broker"], user, name))
    flush(request)
    return web.Response(status=204)
