"""/api/topic-permissions: a user's write and read regular expressions for the routing keys of
a topic exchange in a vhost (rabbit_mgmt_wm_topic_permission*), administrators only.

As in RabbitMQ 3.10: /api/topic-permissions/{vhost}/{user} lists, sets (the exchange named in
the body, also when the path names one) and clears all of the user's topic permissions in
the vhost; with /{exchange} the GET still lists them all and DELETE clears that exchange's.
There is no /api/topic-permissions/{vhost} (404, as RabbitMQ)."""

from aiohttp import web

from .. import changes
from ...broker.metadata.commands import ClearTopicPermissions, SetTopicPermissions
from ...broker.auth import invalid_regexp
from ...broker.definitions import topic_permission_json
from ..access import ADMIN, access
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import flush, list_response, read_body, require

routes = web.RouteTableDef()

_SORT = ("vhost", "user")


def _items(broker, user: str | None = None, vhost: str | None = None) -> list:
    return [topic_permission_json(key, p) for key, p in broker.topic_permissions.items()
            if (user is None or key[0] == user) and (vhost is None or key[1] == vhost)]


@routes.get("/api/topic-permissions")
@access(ADMIN)
async def list_topic_permissions(request):
    return list_response(request, _items(request.app["broker"]), default_sort=_SORT)


def _of_user_in_vhost(request) -> list | None:
    """The user's topic permissions in the vhost of the path; None if the user or the vhost
    does not exist (an empty list: it has none)."""
    broker = request.app["broker"]
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    if user not in broker.users or vhost not in broker.vhosts:
        return None
    return _items(broker, user, vhost)


@routes.get("/api/topic-permissions/{vhost}/{user}")
@routes.get("/api/topic-permissions/{vhost}/{user}/{exchange}")
@access(ADMIN)
async def get_topic_permissions(request):
    items = _of_user_in_vhost(request)
    if not items:
        raise not_found()
    return json_response(items)


def _validated(body: dict) -> tuple[str, str, str]:
    require(body, "exchange", "write", "read")
    exchange, write, read = body["exchange"], body["write"], body["read"]
    if not isinstance(exchange, str):
        # RabbitMQ stores whatever JSON value it is given; such a permission never applies.
        raise bad_request("exchange must be a string")
    for value in (write, read):
        problem = invalid_regexp(value)
        if problem is not None:
            raise ApiError(400, "bad_request", ["invalid_regexp", value, problem])
    return exchange, write, read


@routes.put("/api/topic-permissions/{vhost}/{user}")
@routes.put("/api/topic-permissions/{vhost}/{user}/{exchange}")
@access(ADMIN)
async def put_topic_permission(request):
    existing = _of_user_in_vhost(request)
    if existing is None:
        raise bad_request("vhost_or_user_not_found")
    exchange, write, read = _validated(await read_body(request))
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    await changes.apply(request, SetTopicPermissions(user, vhost, exchange, write, read))
    flush(request)
    # Created: the user had no topic permission in the vhost before (the resource RabbitMQ's
    # handler answers for is that list).
    return web.Response(status=204 if existing else 201)


@routes.delete("/api/topic-permissions/{vhost}/{user}")
@routes.delete("/api/topic-permissions/{vhost}/{user}/{exchange}")
@access(ADMIN)
async def delete_topic_permissions(request):
    if not _of_user_in_vhost(request):
        raise not_found()
    await changes.apply(request, ClearTopicPermissions(request.match_info["user"], request.match_info["vhost"],
                                                       request.match_info.get("exchange")))
    flush(request)
    return web.Response(status=204)


@routes.get("/api/users/{user}/topic-permissions")
@access(ADMIN)
async def user_topic_permissions(request):
    broker = request.app["broker"]
    user = request.match_info["user"]
    if user not in broker.users:
        raise not_found()
    return list_response(request, _items(broker, user=user), default_sort=_SORT)


@routes.get("/api/vhosts/{vhost}/topic-permissions")
@access(ADMIN)
async def vhost_topic_permissions(request):
    broker = request.app["broker"]
    vhost = request.match_info["vhost"]
    if vhost not in broker.vhosts:
        raise not_found()
    # RabbitMQ puts the vhost first in these objects.
    items = [{"vhost": item["vhost"], "user": item["user"], "exchange": item["exchange"], "write": item["write"],
              "read": item["read"]} for item in _items(broker, vhost=vhost)]
    return list_response(request, items, default_sort=_SORT)
