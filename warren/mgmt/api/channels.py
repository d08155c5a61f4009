"""/api/channels: AMQP channels, as RabbitMQ's management API shows them
(named "<connection name> (<channel number>)")."""

from aiohttp import web

from ..resources import item_response, list_response
from ..app import not_found
from ..shapes import channel_json, channel_name
from .connections import open_connections, vhost_or_404

routes = web.RouteTableDef()


def _channels(broker, vhost=None) -> list:
    return [ch for conn in open_connections(broker) if vhost is None or conn.vhost is vhost
            for ch in list(conn.channels.values())]


@routes.get("/api/channels")
async def list_channels(request):
    broker = request.app["broker"]
    return list_response(request, [channel_json(ch) for ch in _channels(broker)])


@routes.get("/api/vhosts/{vhost}/channels")
async def list_vhost_channels(request):
    broker = request.app["broker"]
    vhost = vhost_or_404(broker, request.match_info["vhost"])
    return list_response(request, [channel_json(ch) for ch in _channels(broker, vhost)])


@routes.get("/api/channels/{name}")
async def get_channel(request):
    name = request.match_info["name"]
    for ch in _channels(request.app["broker"]):
        if channel_name(ch) == name:
            return item_response(request, channel_json(ch, details=True))
    raise not_found()
