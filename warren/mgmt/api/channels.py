"""/api/channels: AMQP channels, as RabbitMQ's management API shows them
(named "<connection name> (<channel number>)"), every running cluster member's
(warren.mgmt.peers)."""

from aiohttp import web

from ...broker.records import ChannelHandle
from .. import peers
from ..access import ANY, VHOST, access, own, owner
from ..resources import item_response, list_response
from ..app import not_found
from ..shapes import channel_json
from .connections import check_owner, open_connections, vhost_or_404

routes = web.RouteTableDef()


def _channels(broker) -> list[ChannelHandle]:
    return [ch for conn in open_connections(broker) for ch in list(conn.channels.values())]


def _lookup(broker, name: str) -> ChannelHandle | None:
    for ch in _channels(broker):
        if ch.channel_link().name == name:
            return ch
    return None


def channel_owner(request) -> str | None:
    """The user of the channel named in the path (for access.owner)."""
    ch = _lookup(request.app["broker"], request.match_info["name"])
    return ch.channel_link().user if ch is not None else None


@routes.get("/api/channels")
@access(ANY, lists=own())
async def list_channels(request):
    return list_response(request, await peers.listing(request, peers.CHANNELS))


@routes.get("/api/vhosts/{vhost}/channels")
@access(VHOST, lists=own())
async def list_vhost_channels(request):
    vhost = vhost_or_404(request.app["broker"], request.match_info["vhost"])
    return list_response(request, await peers.listing(request, peers.CHANNELS, {"vhost": vhost.name}))


@routes.get("/api/channels/{name}")
@access(owner(channel_owner))
async def get_channel(request):
    broker = request.app["broker"]
    name = request.match_info["name"]
    ch = _lookup(broker, name)
    if ch is not None:  # (the route's rule checked its owner)
        return item_response(request, channel_json(broker, ch, details=True))
    found = await peers.listing(request, peers.CHANNELS, {"name": name, "details": True}, here=False)
    if not found:
        raise not_found()
    check_owner(request, found[0].get("user"))
    return item_response(request, found[0])
