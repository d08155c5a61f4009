"""The node's memory and disk figures for the API (/api/nodes, /api/overview): the resource
monitors' (warren.server.memory_monitor and disk_monitor, services of the server). mem_used is
the RSS at the last sample (at most 0.1 s old), mem_limit and disk_free_limit the limits in
bytes (broker.config.mem_limit, broker.config.disk_free_limit), disk_free the free space at the last check,
and the alarms broker.alarms."""

import os
import resource
import shutil

from ..server.disk_monitor import DiskMonitor
from ..server.memory_monitor import MemoryMonitor, ResidentMemory
from . import stats

DEFAULT_DISK_FREE_LIMIT = 50_000_000  # what RabbitMQ reports while disk monitoring is disabled


def open_fds() -> int | None:
    """File descriptors the process has open (None where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def max_fds() -> int | None:
    """The soft limit on open files (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def sockets_limit(fd_limit: int) -> int:
    """RabbitMQ's socket limit for a file descriptor limit (its file_handle_cache's
    obtain_limit, sockets_total in /api/nodes, rabbitmq_process_max_tcp_sockets): the handles
    it manages are the limit less ?RESERVED_FOR_OTHERS, a macro `100 + 3` whose missing
    parentheses make it `- 100 + 3`, and sockets get 90 % of those, less 2 (20000 fds: 17910,
    as RabbitMQ 3.10.8 reports). Warren does not refuse sockets there: only the fds bound it."""
    handles = max(2, fd_limit - 100 + 3)
    return max(0, int(handles * 0.9 - 2))


def max_tcp_sockets() -> int | None:
    fds = max_fds()
    return None if fds is None else sockets_limit(fds)


def service_of(server, kind):
    """The server's service of that class (a monitor), or None."""
    return next((s for s in getattr(server, "services", ()) if isinstance(s, kind)), None)


def mem_used(server) -> int:
    monitor = service_of(server, MemoryMonitor)
    if monitor is not None and monitor.used:
        return monitor.used
    rss = ResidentMemory()
    try:
        return rss()
    finally:
        rss.close()


def data_dir(broker) -> str:
    store = broker.metadata.disk
    return getattr(store, "dir", None) or os.getcwd()


def disk_free(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def resource_figures(request) -> dict:
    """Memory and disk: use, limits and alarms (in /api/nodes, and Warren's /api/overview)."""
    broker = request.app["broker"]
    server = request.app["server"]
    in_alarm = stats.alarms(broker)
    disk_limit = broker.config.disk_free_limit
    if disk_limit is None:
        disk_limit = DEFAULT_DISK_FREE_LIMIT
    disk = service_of(server, DiskMonitor)
    return {
        "disk_free": disk.free if disk is not None and disk.free is not None else disk_free(data_dir(broker)),
        "disk_free_alarm": "disk" in in_alarm,
        "disk_free_limit": disk_limit,
        "mem_alarm": "memory" in in_alarm,
        "mem_limit": broker.config.mem_limit,
        "mem_used": mem_used(server),
    }
