"""/api/consumers: every consumer, or a vhost's, as RabbitMQ's management API shows them:
every running cluster member's (warren.mgmt.peers)."""

from aiohttp import web

from .. import peers
from ..access import ANY, access, own
from ..resources import list_response
from .connections import vhost_or_404

routes = web.RouteTableDef()


@routes.get("/api/consumers")
@access(ANY, lists=own("channel_details", "user"))
async def list_consumers(request):
    return list_response(request, await peers.listing(request, peers.CONSUMERS), default_sort=())


@routes.get("/api/consumers/{vhost}")
@access(ANY, lists=own("channel_details", "user"))
async def list_vhost_consumers(request):
    vhost = vhost_or_404(request.app["broker"], request.match_info["vhost"])
    return list_response(request, await peers.listing(request, peers.CONSUMERS, {"vhost": vhost.name}),
                         default_sort=())
