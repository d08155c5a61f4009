"""/api/stream-replicas/...: warrenctl's `rabbitmq-streams` verbs add_replica and
delete_replica, on the control socket only (access.CONTROL_SOCKET): RabbitMQ's management API
has no routes for them (its CLI calls rabbit_stream_queue over Erlang distribution), so these
are Warren's. The work is warren.cluster.queue_members' (a stream's replicas are its members).

- PUT and DELETE /api/stream-replicas/{vhost}/{name}/{node}: 204; a refusal as
  /api/quorum-queues' ({"error": name, "reason": the CLI's text}).
"""

from aiohttp import web

from ...broker.errors import AMQPError
from ...cluster import queue_members
from ...cluster.queue_members import MembersError
from ..access import CONTROL_SOCKET, access
from .quorum_queues import queue_of, refused

routes = web.RouteTableDef()


@routes.put("/api/stream-replicas/{vhost}/{name}/{node}")
@access(CONTROL_SOCKET)
async def add_replica(request):
    try:
        await queue_members.add_member(request.app["broker"], *queue_of(request), request.match_info["node"], "stream")
    except (MembersError, AMQPError) as err:
        raise refused(err) from None
    return web.Response(status=204)


@routes.delete("/api/stream-replicas/{vhost}/{name}/{node}")
@access(CONTROL_SOCKET)
async def delete_replica(request):
    try:
        await queue_members.delete_member(request.app["broker"], *queue_of(request), request.match_info["node"],
                                          "stream")
    except (MembersError, AMQPError) as err:
        raise refused(err) from None
    return web.Response(status=204)
