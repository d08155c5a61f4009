"""/api/federation-links: the federation management plugin's status resource
(rabbit_federation_mgmt, RabbitMQ 3.10.8) for this broker's federation links
(warren.broker.federation; they follow the policies and the "federation-upstream" runtime
parameters).

- GET /api/federation-links, /api/federation-links/{vhost}: every link's status.
- GET /api/federation-links/state/down, /api/federation-links/{vhost}/state/down: the links
  neither running nor starting.
- DELETE /api/federation-links/vhost/{vhost}/{id}/{node}/restart: the link starts again.

Access as rabbit_federation_mgmt: monitoring and administrator users (is_authorized_monitor),
who see the links of the vhosts they may log in to.
"""

from aiohttp import web

from ...broker import federation
from .. import peers
from ..access import MONITOR, access
from ..app import not_found
from ..resources import list_response, vhost_or_404
from .shovels import IN_OWN_VHOSTS

routes = web.RouteTableDef()


async def _links(request, vhost=None, down: bool = False) -> list:
    """The links' statuses, of every running member on a cluster (each runs some)."""
    out = [s for s in await peers.listing(request, peers.FEDERATION_LINKS) if vhost is None or s["vhost"] == vhost.name]
    return [s for s in out if s["status"] not in ("running", "starting")] if down else out


@routes.get("/api/federation-links")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_all(request):
    return list_response(request, await _links(request))


@routes.get("/api/federation-links/state/down")
@routes.get("/api/federation-links/state/down/")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_down(request):
    return list_response(request, await _links(request, down=True))


@routes.get("/api/federation-links/{vhost}")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_vhost(request):
    return list_response(request, await _links(request, vhost_or_404(request)))


@routes.get("/api/federation-links/{vhost}/state/down")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_vhost_down(request):
    return list_response(request, await _links(request, vhost_or_404(request), down=True))


@routes.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def restart(request):
    vhost = vhost_or_404(request)
    link = request.match_info["id"]
    if not (federation.restart(request.app["broker"], vhost, link)
            or await peers.restart_elsewhere(request, "federation", vhost.name, link)):
        raise not_found()
    return web.Response(status=204)
