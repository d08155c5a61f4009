"""/api/nodes: the node, in the shape of RabbitMQ 3.10's node objects (its memory and disk
figures are warren.mgmt.node_resources'), and in a cluster every other member as etcd knows
it (warren.cluster.membership): whether it runs, and what its running record says."""

import os
import platform
import time

from aiohttp import web

from ... import __version__
from ...broker import auth_mechanisms
from ..access import MONITOR, access
from .. import stats
from ..resources import item_response, list_response
from ..app import not_found
from ..node_resources import data_dir, max_fds, open_fds, resource_figures, sockets_limit
from .overview import contexts, exchange_types

routes = web.RouteTableDef()


def node_info(request) -> dict:
    broker = request.app["broker"]
    server = request.app["server"]
    node = stats.node_name(broker)
    fd_total = max_fds() or 1 << 20
    path = data_dir(broker)
    offered = broker.config.auth_mechanisms
    return {
        **resource_figures(request),
        "applications": applications(__version__, platform.python_version()),
        # As RabbitMQ with rabbitmq_auth_mechanism_ssl: EXTERNAL is listed once auth_mechanisms has it.
        "auth_mechanisms": [{"description": auth_mechanisms.DESCRIPTIONS[m], "enabled": m in offered, "name": m}
                            for m in auth_mechanisms.KNOWN if m != "EXTERNAL" or m in offered],
        "being_drained": False,
        "cluster_links": [],
        "config_files": [],
        "contexts": contexts(request),
        "db_dir": path,
        "enabled_plugins": ["rabbitmq_management"],
        "exchange_types": exchange_types(),
        "fd_total": fd_total,
        "fd_used": open_fds() or 0,
        "log_files": ["<stderr>"],
        "mem_calculation_strategy": "rss",
        "name": node,
        "net_ticktime": 60,
        "os_pid": str(os.getpid()),
        "partitions": [],
        "proc_total": 1048576,
        "proc_used": 1,
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "run_queue": 0,
        "running": True,
        "sockets_total": sockets_limit(fd_total),
        "sockets_used": len(server.protocols) if server is not None else len(broker.connections),
        "type": "disc",
        "uptime": int((time.monotonic() - stats.STARTED) * 1000),
    }


def applications(warren: str | None, python: str | None) -> list[dict]:
    """What a node runs, as RabbitMQ lists its Erlang applications (with the runtime's own:
    kernel, stdlib): Warren's and Python's versions (warrenctl cluster_status shows them)."""
    return [{"description": "Warren AMQP 0-9-1 broker", "name": "warren", "version": warren},
            {"description": "Python", "name": "python", "version": python}]


def member_info(name: str, running: dict | None) -> dict:
    """Another member of the cluster: RabbitMQ's four keys of a node that does not run, and
    what its running record says while it runs, its own resource alarms among it (RabbitMQ
    shows a running node's statistics once its first sample is in; another Warren node's
    others are not here yet)."""
    info: dict = {"cluster_links": [], "name": name, "running": running is not None, "type": "disc"}
    if running is not None:
        alarms = running.get("alarms")
        alarms = alarms if isinstance(alarms, list) else []
        info.update({"applications": applications(running.get("warren_version"), running.get("python_version")),
                     "disk_free_alarm": "disk" in alarms, "mem_alarm": "memory" in alarms,
                     "os_pid": running.get("os_pid"), "processors": running.get("processors"),
                     "uptime": max(0, int(time.time() * 1000) - int(running.get("started", 0)))})
    return info


def nodes(request) -> list[dict]:
    here = node_info(request)
    membership = request.app["membership"]
    if membership is None:
        return [here]
    others = (set(membership.members) | set(membership.running)) - {here["name"]}
    return [here] + [member_info(name, membership.running.get(name)) for name in sorted(others)]


@routes.get("/api/nodes")
@access(MONITOR)
async def list_nodes(request):
    return list_response(request, nodes(request), default_sort=("name",))


@routes.get("/api/nodes/{name}")
@access(MONITOR)
async def get_node(request):
    for node in nodes(request):
        if node["name"] == request.match_info["name"]:
            return item_response(request, node)
    raise not_found()
