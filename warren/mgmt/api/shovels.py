"""/api/shovels: the shovel management plugin's status resource (rabbit_shovel_mgmt, RabbitMQ
3.10.8) for this broker's dynamic shovels (warren.broker.shovel; they are created and
deleted as runtime parameters of component "shovel", /api/parameters/shovel/...) and its
static ones (the config file's, warren.broker.static_shovel: type "static", no vhost).

- GET /api/shovels, /api/shovels/{vhost}: the shovels' status (name, vhost, type "dynamic",
  state starting/running/terminated, src_uri, src_queue or src_exchange(+_key), dest_uri,
  dest_queue / dest_exchange(+_key), reason when terminated, node, timestamp).
- GET /api/shovels/vhost/{vhost}/{name}[/restart]: as RabbitMQ, the list of the vhost's
  shovels (404 unless that one exists).
- DELETE /api/shovels/vhost/{vhost}/{name}: deletes the shovel (its parameter); DELETE
  .../restart stops it and starts it again.

Access as rabbit_shovel_mgmt: monitoring and administrator users ("Not monitor user"), who
see (and may delete) the shovels of the vhosts they have permissions in - administrators
too, as RabbitMQ's filter_vhost_user; static shovels (no vhost) only administrators see.
They are in no vhost's list, and the paths naming a vhost and a name never find one (404:
static shovels are neither deleted nor restarted through the API).
"""

from aiohttp import web

from .. import changes, peers
from ...broker import shovel
from ..access import MONITOR, ListFilter, access, is_admin, login_vhosts, visible
from ..app import CONTROL_USER, not_found
from ..resources import flush, list_response, vhost_or_404

routes = web.RouteTableDef()


def _own_vhosts(request, user) -> set:
    """rabbit_shovel_mgmt_util:filter_vhost_user: the vhosts the user may log in to, whatever
    its tags, and no vhost (static shovels) for administrators."""
    allowed: set = login_vhosts(request, user)
    if is_admin(user):
        allowed.add(None)
    return allowed


# (warrenctl on the control socket sees all)
IN_OWN_VHOSTS = ListFilter(("vhost",), lambda user: user is CONTROL_USER, _own_vhosts)


async def _statuses(request, vhost=None) -> list:
    """The shovels' statuses, of every running member on a cluster (each runs some)."""
    statuses = await peers.listing(request, peers.SHOVELS)
    # (rabbit_shovel_mgmt:filter_vhost_req, on the JSON: a static shovel has no vhost)
    return [s for s in statuses if vhost is None or s.get("vhost") == vhost.name]


async def _found(request, vhost) -> list:
    """The vhost's shovels; 404 unless the named shovel is one the user sees."""
    name = request.match_info["name"]
    statuses = await _statuses(request, vhost)
    if not any(s["name"] == name for s in visible(request, statuses)):
        raise not_found()
    return statuses


@routes.get("/api/shovels")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_all(request):
    return list_response(request, await _statuses(request))


@routes.get("/api/shovels/{vhost}")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_vhost(request):
    return list_response(request, await _statuses(request, vhost_or_404(request)))


@routes.get("/api/shovels/vhost/{vhost}/{name}")
@routes.get("/api/shovels/vhost/{vhost}/{name}/restart")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def get_one(request):
    return list_response(request, await _found(request, vhost_or_404(request)))


@routes.delete("/api/shovels/vhost/{vhost}/{name}")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def delete_one(request):
    vhost = vhost_or_404(request)
    await _found(request, vhost)
    name = request.match_info["name"]
    await changes.perform(request, lambda: shovel.clear_shovel.change(request.app["broker"], vhost, name))
    flush(request)
    return web.Response(status=204)


@routes.delete("/api/shovels/vhost/{vhost}/{name}/restart")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def restart_one(request):
    vhost = vhost_or_404(request)
    await _found(request, vhost)
    name = request.match_info["name"]
    if not shovel.restart(request.app["broker"], vhost, name):
        await peers.restart_elsewhere(request, "shovel", vhost.name, name)
    return web.Response(status=204)
