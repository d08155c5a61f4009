"""Warren-only endpoints for the resource alarms' settings, behind `warrenctl
set_vm_memory_high_watermark` and `warrenctl set_disk_free_limit` (rabbitmqctl reaches the
node directly; RabbitMQ's management API has no such endpoints). Administrators only.

    GET/PUT /api/nodes/{node}/vm-memory-high-watermark   {"relative": 0.4} | {"absolute": bytes}
    GET/PUT /api/nodes/{node}/disk-free-limit            {"absolute": bytes} | {"mem_relative": 1.0}

A PUT changes the setting until restart, as the rabbitmqctl commands do, and answers 204 once
the monitor has checked against it (the alarm is already raised or cleared). A GET gives the
setting and the limit it comes to in bytes ("limit"). Units are the client's business: the
API takes bytes.
"""

from aiohttp import web

from ...server.disk_monitor import DiskMonitor
from ...server.memory_monitor import MemoryMonitor
from ..node_resources import service_of
from .. import stats
from ..access import ADMIN, access
from ..app import bad_request, json_response, not_found
from ..resources import read_body

routes = web.RouteTableDef()


def _monitor(request, kind):
    if request.match_info["name"] != stats.node_name(request.app["broker"]):
        raise not_found()
    service = service_of(request.app["server"], kind)
    if service is None:
        raise not_found("this node has no such monitor")
    return service


def _setting(body: dict, kinds: tuple[str, ...], what: str) -> tuple[str, float]:
    if not isinstance(body, dict) or len(body) != 1 or next(iter(body)) not in kinds:
        raise bad_request(f"{what}: expected an object with one of the keys {', '.join(kinds)}")
    (kind, value), = body.items()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{what}: {kind} must be a number")
    if kind == "absolute" and not isinstance(value, int):
        raise bad_request(f"{what}: absolute must be an integer number of bytes")
    return kind, value


@routes.get("/api/nodes/{name}/vm-memory-high-watermark")
@access(ADMIN)
async def get_watermark(request):
    monitor = _monitor(request, MemoryMonitor)
    kind, value = monitor.watermark
    return json_response({kind: value, "limit": monitor.limit})


@routes.put("/api/nodes/{name}/vm-memory-high-watermark")
@access(ADMIN)
async def set_watermark(request):
    monitor = _monitor(request, MemoryMonitor)
    kind, value = _setting(await read_body(request), ("relative", "absolute"), "vm_memory_high_watermark")
    if value < 0:
        raise bad_request(f"vm_memory_high_watermark: {kind} must not be negative")
    monitor.set_watermark((kind, float(value) if kind == "relative" else value))
    return web.Response(status=204)


@routes.get("/api/nodes/{name}/disk-free-limit")
@access(ADMIN)
async def get_disk_free_limit(request):
    monitor = _monitor(request, DiskMonitor)
    kind, value = monitor.setting
    return json_response({kind: value, "limit": monitor.limit})


@routes.put("/api/nodes/{name}/disk-free-limit")
@access(ADMIN)
async def set_disk_free_limit(request):
    monitor = _monitor(request, DiskMonitor)
    kind, value = _setting(await read_body(request), ("absolute", "mem_relative"), "disk_free_limit")
    if kind == "mem_relative" and value < 0:
        raise bad_request("disk_free_limit: mem_relative must not be negative")
    # A negative absolute limit is taken, as rabbitmqctl takes it: the alarm never goes off.
    monitor.set_limit((kind, float(value) if kind == "mem_relative" else value))
    return web.Response(status=204)
