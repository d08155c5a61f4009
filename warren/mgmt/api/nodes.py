"""/api/nodes: the (single) Warren node, in the shape of RabbitMQ 3.10's node objects.

Memory and disk figures are the resource monitors' (warren.server.memory_monitor and
disk_monitor, services of the server): mem_used is the RSS at the last sample (at most 0.1 s
old), mem_limit and disk_free_limit the limits in bytes (broker.mem_limit,
broker.disk_free_limit), disk_free the free space at the last check, and the alarms
broker.alarms.
"""

import os
import resource
import shutil
import time

from aiohttp import web

from ... import __version__
from ...server.disk_monitor import DiskMonitor
from ...server.memory_monitor import MemoryMonitor, ResidentMemory
from ...session.sasl import MECHANISMS
from ..access import MONITOR, access
from .. import stats
from ..resources import item_response, list_response
from ..app import not_found
from .overview import contexts, exchange_types

routes = web.RouteTableDef()

DEFAULT_DISK_FREE_LIMIT = 50_000_000  # what RabbitMQ reports while disk monitoring is disabled


def _service(server, kind):
    return next((s for s in getattr(server, "services", ()) if isinstance(s, kind)), None)


def mem_used(server) -> int:
    monitor = _service(server, MemoryMonitor)
    if monitor is not None and monitor.used:
        return monitor.used
    rss = ResidentMemory()
    try:
        return rss()
    finally:
        rss.close()


def fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def data_dir(broker) -> str:
    store = broker.definitions_store
    return getattr(store, "dir", None) or os.getcwd()


def disk_free(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def node_info(request) -> dict:
    broker = request.app["broker"]
    server = request.app["server"]
    node = stats.node_name(broker)
    in_alarm = stats.alarms(broker)
    disk_limit = broker.disk_free_limit
    if disk_limit is None:
        disk_limit = DEFAULT_DISK_FREE_LIMIT
    disk = _service(server, DiskMonitor)
    fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    path = data_dir(broker)
    return {
        "applications": [{"description": "Warren AMQP 0-9-1 broker", "name": "warren", "version": __version__}],
        "auth_mechanisms": [{"description": "", "enabled": True, "name": m} for m in MECHANISMS.split()],
        "being_drained": False,
        "config_files": [],
        "contexts": contexts(request),
        "db_dir": path,
        "disk_free": disk.free if disk is not None and disk.free is not None else disk_free(path),
        "disk_free_alarm": "disk" in in_alarm,
        "disk_free_limit": disk_limit,
        "enabled_plugins": ["rabbitmq_management"],
        "exchange_types": exchange_types(),
        "fd_total": fd_total if fd_total != resource.RLIM_INFINITY else 1 << 20,
        "fd_used": fd_used(),
        "log_files": ["<stderr>"],
        "mem_alarm": "memory" in in_alarm,
        "mem_calculation_strategy": "rss",
        "mem_limit": broker.mem_limit,
        "mem_used": mem_used(server),
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
        "sockets_total": fd_total if fd_total != resource.RLIM_INFINITY else 1 << 20,
        "sockets_used": len(server.protocols) if server is not None else len(broker.connections),
        "type": "disc",
        "uptime": int((time.monotonic() - stats.STARTED) * 1000),
    }


@routes.get("/api/nodes")
@access(MONITOR)
async def list_nodes(request):
    return list_response(request, [node_info(request)], default_sort=("name",))


@routes.get("/api/nodes/{name}")
@access(MONITOR)
async def get_node(request):
    if request.match_info["name"] != stats.node_name(request.app["broker"]):
        raise not_found()
    return item_response(request, node_info(request))
