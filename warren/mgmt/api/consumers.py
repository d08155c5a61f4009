"""/api/consumers: every consumer, or a vhost's, as RabbitMQ's management API shows them."""

from aiohttp import web

from ...broker import shovel

from ..access import ANY, access, own
from ..resources import list_response
from ..shapes import consumer_json
from .connections import open_connections, vhost_or_404

routes = web.RouteTableDef()


def _consumers(broker, vhost=None) -> list:
    return [consumer_json(broker, c) for conn in open_connections(broker)
            for ch in list(conn.channels.values()) for c in list(ch.consumers.values())
            if vhost is None or c.queue.vhost is vhost] + [
        # The shovels' (RabbitMQ: of their direct connections, user "none").
        consumer_json(broker, s.consumer) for s in shovel.statuses(broker)
        if s.consumer is not None and (vhost is None or s.consumer.queue.vhost is vhost)]


@routes.get("/api/consumers")
@access(ANY, lists=own("channel_details", "user"))
async def list_consumers(request):
    return list_response(request, _consumers(request.app["broker"]), default_sort=())


@routes.get("/api/consumers/{vhost}")
@access(ANY, lists=own("channel_details", "user"))
async def list_vhost_consumers(request):
    broker = request.app["broker"]
    vhost = vhost_or_404(broker, request.match_info["vhost"])
    return list_response(request, _consumers(broker, vhost), default_sort=())
