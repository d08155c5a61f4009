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
from ..access import MONITOR, access
from ..app import not_found
from ..resources import list_response, vhost_or_404
from ..stats import node_name
from .shovels import IN_OWN_VHOSTS

routes = web.RouteTableDef()


def _links(request, vhost=None, down: bool = False) -> list:
    broker = request.app["broker"]
    node = node_name(broker)
    out = [link.link_status(node) for link in federation.statuses(broker, vhost)]
    return [s for s in out if s["status"] not in ("running", "starting")] if down else out


@routes.get("/api/federation-links")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_all(request):
    return list_response(request, _links(request))


@routes.get("/api/federation-links/state/down")
@routes.get("/api/federation-links/state/down/")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_down(request):
    return list_response(request, _links(request, down=True))


@routes.get("/api/federation-links/{vhost}")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_vhost(request):
    return list_response(request, _links(request, vhost_or_404(request)))


@routes.get("/api/federation-links/{vhost}/state/down")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def list_vhost_down(request):
    return list_response(request, _links(request, vhost_or_404(request), down=True))


@routes.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart")
@access(MONITOR, lists=IN_OWN_VHOSTS)
async def restart(request):
    vhost = vhost_or_404(request)
    if not federation.restart(request.app["broker"], vhost, request.match_info["id"]):
        raise not_found()
    return web.Response(status=204)
