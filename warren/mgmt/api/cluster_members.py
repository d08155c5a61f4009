"""DELETE /api/cluster-members/{node}: warrenctl forget_cluster_node, on the control socket
only (access.CONTROL_SOCKET). RabbitMQ's management API has no route for it (rabbitmqctl
does it over Erlang distribution), so this is Warren's: 204 once the member is gone from etcd.

Refusals carry rabbitmqctl's texts: a node that runs (this one too) is 409 with error
"node_running"; a name that is no member 404 with error "not_a_cluster_node"; etcd out of
reach 503. A node alone has no other member: only its own name is refused as running.
"""

import logging

from aiohttp import web

from ...cluster import queue_members
from ...cluster.etcd import EtcdError
from ...cluster.membership import Forget
from .. import stats
from ..access import CONTROL_SOCKET, access
from ..app import ApiError

routes = web.RouteTableDef()
log = logging.getLogger("warren.mgmt")

NOT_A_CLUSTER_NODE = "The node selected is not in the cluster."


def must_stop(node: str) -> str:
    return f"RabbitMQ on node {node} must be stopped with 'rabbitmqctl -n {node} stop_app' before it can be removed"


@routes.delete("/api/cluster-members/{name}")
@access(CONTROL_SOCKET)
async def forget_member(request):
    node = request.match_info["name"]
    membership = request.app["membership"]
    if membership is None:
        outcome = Forget.RUNNING if node == stats.node_name(request.app["broker"]) else Forget.NOT_MEMBER
    else:
        try:
            outcome = await membership.forget(node)
        except EtcdError as err:
            raise ApiError(503, "service_unavailable", f"etcd: {err}") from None
    if outcome is Forget.RUNNING:
        raise ApiError(409, "node_running", must_stop(node))
    if outcome is Forget.NOT_MEMBER:
        raise ApiError(404, "not_a_cluster_node", NOT_A_CLUSTER_NODE)
    # As RabbitMQ's forget_cluster_node: the node leaves every quorum queue's members too (a
    # queue it led is led by another in-sync member; one it alone held keeps it).
    for kept in await queue_members.shrink(request.app["broker"], node):
        if kept.error is not None:
            log.warning("forgetting %s: queue '%s' in vhost '%s' keeps it as a member: %s", node, kept.name,
                        kept.vhost, kept.error)
    return web.Response(status=204)
