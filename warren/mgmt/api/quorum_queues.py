"""/api/quorum-queues/...: warrenctl's `rabbitmq-queues` verbs (quorum_status, add_member,
delete_member, grow, shrink, rebalance), on the control socket only (access.CONTROL_SOCKET): RabbitMQ's
management API has no routes for them (its CLI calls rabbit_quorum_queue over Erlang
distribution), so these are Warren's. The work is warren.cluster.queue_members'.

- GET /api/quorum-queues/{vhost}/{name}/status: the rows, RabbitMQ's columns.
- PUT and DELETE /api/quorum-queues/{vhost}/{name}/members/{node}: 204.
- POST /api/quorum-queues/grow {"node", "strategy", "vhost_pattern", "queue_pattern"} and
  POST /api/quorum-queues/shrink {"node"}: one {"vhost", "name", "size", "result"} per queue
  touched ("ok", or the error's name).
- POST /api/quorum-queues/rebalance {"type", "vhost_pattern", "queue_pattern"}: one row per
  node leading a queue rebalanced, RabbitMQ's columns ("Node name", "Number of quorum queues",
  "Number of replicated classic queues"), in its order.

A refusal is {"error": name, "reason": the CLI's text} (warrenctl prints the reason).
"""

from aiohttp import web

from ...broker.errors import AMQPError
from ...cluster import queue_members
from ...cluster.queue_members import MembersError, Outcome
from ..access import CONTROL_SOCKET, access
from ..app import ApiError, json_response
from ..resources import read_body, require

routes = web.RouteTableDef()

_STATUS = {"not_found": 404, "node_not_running": 409, "last_node": 409, "last_stream_member": 409,
           "no_in_sync_member": 409,
           "rebalance_in_progress": 409, "timeout": 503}


def refused(err: MembersError | AMQPError) -> ApiError:
    if isinstance(err, AMQPError):  # (etcd or the leader out of reach, a queue gone meanwhile)
        return ApiError(404 if err.code == 404 else 503, "not_found" if err.code == 404 else "internal_error",
                        err.text)
    return ApiError(_STATUS.get(err.error, 400), err.error, err.reason)


def queue_of(request) -> tuple[str, str]:
    return request.match_info["vhost"], request.match_info["name"]


@routes.get("/api/quorum-queues/{vhost}/{name}/status")
@access(CONTROL_SOCKET)
async def quorum_status(request):
    try:
        return json_response(await queue_members.status(request.app["broker"], *queue_of(request)))
    except (MembersError, AMQPError) as err:
        raise refused(err) from None


@routes.put("/api/quorum-queues/{vhost}/{name}/members/{node}")
@access(CONTROL_SOCKET)
async def add_member(request):
    try:
        await queue_members.add_member(request.app["broker"], *queue_of(request), request.match_info["node"])
    except (MembersError, AMQPError) as err:
        raise refused(err) from None
    return web.Response(status=204)


@routes.delete("/api/quorum-queues/{vhost}/{name}/members/{node}")
@access(CONTROL_SOCKET)
async def delete_member(request):
    try:
        await queue_members.delete_member(request.app["broker"], *queue_of(request), request.match_info["node"])
    except (MembersError, AMQPError) as err:
        raise refused(err) from None
    return web.Response(status=204)


def _outcomes(outcomes: list[Outcome]) -> web.Response:
    return json_response([{"vhost": o.vhost, "name": o.name, "size": o.size, "result": o.error or "ok"}
                          for o in outcomes])


def _text(body: dict, key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise ApiError(400, "bad_request", f"{key} must be a string")
    return value


@routes.post("/api/quorum-queues/grow")
@access(CONTROL_SOCKET)
async def grow(request):
    body = await read_body(request)
    require(body, "node", "strategy")
    try:
        return _outcomes(await queue_members.grow(request.app["broker"], _text(body, "node"),
                                                  _text(body, "strategy"), _text(body, "vhost_pattern", ".*"),
                                                  _text(body, "queue_pattern", ".*")))
    except (MembersError, AMQPError) as err:
        raise refused(err) from None


@routes.post("/api/quorum-queues/shrink")
@access(CONTROL_SOCKET)
async def shrink(request):
    body = await read_body(request)
    require(body, "node")
    try:
        return _outcomes(await queue_members.shrink(request.app["broker"], _text(body, "node")))
    except (MembersError, AMQPError) as err:
        raise refused(err) from None


@routes.post("/api/quorum-queues/rebalance")
@access(CONTROL_SOCKET)
async def rebalance(request):
    body = await read_body(request)
    require(body, "type")
    try:
        leaders = await queue_members.rebalance(request.app["broker"], _text(body, "type"),
                                                _text(body, "vhost_pattern", ".*"), _text(body, "queue_pattern", ".*"))
    except (MembersError, AMQPError) as err:
        raise refused(err) from None
    return json_response([{"Node name": n.node, "Number of quorum queues": n.quorum,
                           "Number of replicated classic queues": n.classic} for n in leaders])
