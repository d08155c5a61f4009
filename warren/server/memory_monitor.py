"""The memory alarm (RabbitMQ's vm_memory_monitor): the process's resident memory against the
high watermark.

Total memory is read from the OS (/proc/meminfo, else sysconf) and lowered to the memory
limit of the process's cgroup (v2 memory.max, v1 memory.limit_in_bytes, the tightest of its
own and its ancestors'), so a broker in a container sizes itself by the container. Where
none of that answers, RabbitMQ's warning is logged and 1024 MiB assumed.

Memory used is the resident set size (RSS) from /proc/self/statm, read every INTERVAL
through a file descriptor kept open (one pread, a few microseconds): a publisher flood
cannot run far past the watermark between two samples. The alarm is on while RSS is above
the limit and off as soon as it is not (no hysteresis, as RabbitMQ).

Paging starts when RSS passes vm_memory_high_watermark_paging_ratio of the limit (above 1.0:
never) and stops below PAGING_HYSTERESIS of that: while it is on, every queue's store sends
new arrivals to disk and, a bounded slice per sample, evicts the bodies already in its
window (warren.store.disk); the freed memory is handed back to the OS (malloc_trim), so RSS
really falls and the alarm need not go off. The disk alarm is passed on to the stores: no
transient message is written to disk for paging while it is on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
import sys
import ctypes
import ctypes.util
from typing import Callable, Iterator

from ..broker.alarms import DISK, MEMORY
from ..store.disk import DiskQueueStore
from ..store.priority import PriorityQueueStore

log = logging.getLogger("warren.server")

# ("relative", fraction of total memory) or ("absolute", bytes), as warren.cli.config gives it.
Watermark = tuple[str, float]

DEFAULT_WATERMARK: Watermark = ("relative", 0.4)
UNKNOWN_TOTAL = 1024 * 1024 * 1024  # RabbitMQ's MEMORY_SIZE_FOR_UNKNOWN_OS
INTERVAL = 0.1  # seconds between RSS samples (RabbitMQ: 1 s)
MiB = 1024 * 1024
DEFAULT_PAGING_RATIO = 0.5
PAGING_HYSTERESIS = 0.9   # paging stops below this fraction of its threshold
# Evicted per sample (INTERVAL), across all queues: a slice that keeps the loop responsive
# (writing a transient body costs a few microseconds) yet frees memory faster than four
# flooding publishers fill it.
PAGE_OUT_MESSAGES = 8192
PAGE_OUT_BYTES = 64 * MiB
# malloc_trim costs 10-30 ms on a big fragmented heap: after this much evicted, or a second.
TRIM_AFTER_BYTES = 32 * MiB
TRIM_EVERY = 1.0
# While paging, the queues holding bodies in memory are looked for this often, not every
# sample: walking 100,000 queues costs about 40 ms.
RESCAN_EVERY = 1.0


# --- total memory ---------------------------------------------------------------------------

def os_total_memory(proc: str = "/proc") -> int | None:
    """Physical memory as the OS reports it, or None."""
    try:
        with open(os.path.join(proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and size > 0:
            return pages * size
    except (ValueError, OSError, AttributeError):
        pass
    return None


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        value = int(text)
    except (OSError, ValueError):  # absent, or "max" (v2: no limit)
        return None
    # cgroup v1 says "no limit" with a huge page-rounded number.
    return value if 0 < value < (1 << 62) else None


def _limits_along(base: str, path: str, name: str) -> list[int]:
    """The limits set on the cgroup at `path` and on each of its ancestors (a parent's limit
    binds its children too). Inside a container the process's own cgroup is often mounted as
    the root, so the path may not exist below `base`: the root is read as well."""
    limits, rel = [], path.strip("/")
    while True:
        limit = _read_limit(os.path.join(base, rel, name) if rel else os.path.join(base, name))
        if limit is not None:
            limits.append(limit)
        if not rel:
            return limits
        rel = os.path.dirname(rel)


def cgroup_memory_limit(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The tightest memory limit of this process's cgroups (v1 or v2), or None."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # the v2 unified hierarchy (in hybrid mode under unified/)
            base = cgroup_root if os.path.exists(os.path.join(cgroup_root, "cgroup.controllers")) \
                else os.path.join(cgroup_root, "unified")
            limits += _limits_along(base, path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits_along(os.path.join(cgroup_root, "memory"), path, "memory.limit_in_bytes")
    return min(limits) if limits else None


def detect_total_memory(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """Memory this process may use: the OS's total, lowered to a cgroup limit; None if unknown."""
    known = [m for m in (os_total_memory(proc), cgroup_memory_limit(proc, cgroup_root)) if m]
    return min(known) if known else None


# --- memory used ----------------------------------------------------------------------------

class ResidentMemory:
    """The process's RSS in bytes, from /proc/self/statm kept open (re-read with pread)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 256, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                pass
        # No /proc (not Linux): the peak, the best the standard library offers.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0): freed heap memory back to the OS (Python's allocator and glibc
    keep it otherwise, and RSS would not fall after paging); a no-op elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]

    def release() -> None:
        trim(0)
    return release


# --- the monitor ----------------------------------------------------------------------------

class MemoryMonitor:
    """A server Service: sets broker.config.mem_limit from the watermark and raises or clears the
    memory alarm from the RSS, every INTERVAL seconds and at once when the watermark changes
    (set_vm_memory_high_watermark); pages queues out past the paging ratio."""

    def __init__(self, broker, watermark: Watermark = DEFAULT_WATERMARK, interval: float = INTERVAL,
                 total_memory: Callable[[], int | None] = detect_total_memory,
                 memory_used: Callable[[], int] | None = None, paging_ratio: float = DEFAULT_PAGING_RATIO):
        self.broker = broker
        self.watermark = watermark
        self.interval = interval
        self.paging_ratio = paging_ratio
        self.paging = False
        self._disk_alarm = False  # as last told to the stores
        self._candidates: list[DiskQueueStore] = []  # stores with bodies in memory, at the last scan
        self._scanned_at = 0.0
        self._trim = _malloc_trim()
        self._untrimmed = 0          # bytes evicted since the last trim
        self._trimmed_at = 0.0
        self.total = UNKNOWN_TOTAL  # bytes, as detected by the last set_watermark()
        self.limit = 0
        self.used = 0  # RSS at the last sample
        self.alarmed = False
        self._detect = total_memory
        self._rss = memory_used or ResidentMemory()
        self._warned = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def total_memory(self) -> int:
        """Total memory, read again (RabbitMQ re-reads it on every watermark change: memory may
        have been hot-plugged); the assumed 1024 MiB, with RabbitMQ's warning, if unknown."""
        total = self._detect()
        if total is None:
            if not self._warned:
                os_name = "{unix,%s}" % sys.platform if os.name == "posix" else "{%s}" % sys.platform
                log.warning("Unknown total memory size for your OS %s. Assuming memory size is %dMB.",
                            os_name, UNKNOWN_TOTAL // MiB)
                self._warned = True
            total = UNKNOWN_TOTAL
        return total

    async def start(self, server) -> None:
        self._loop = asyncio.get_running_loop()
        self.set_watermark(self.watermark)
        self._timer = self._loop.call_later(self.interval, self._tick)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        close = getattr(self._rss, "close", None)
        if close is not None:
            close()

    def set_watermark(self, watermark: Watermark) -> None:
        """Apply a watermark (until restart) and check the memory at once."""
        kind, value = watermark
        self.watermark = watermark
        self.total = total = self.total_memory()
        # An absolute limit above the memory there is means all of it, as in RabbitMQ.
        limit = min(int(value), total) if kind == "absolute" else int(value * total)
        self.limit = self.broker.config.mem_limit = limit
        log.info("Memory high watermark set to %d MiB (%d bytes) of %d MiB (%d bytes) total",
                 limit // MiB, limit, total // MiB, total)
        log.info("Memory limit set to %dMB.", limit // MiB)  # the older RabbitMQ's line
        self.check()
        self.check_paging()

    def check(self) -> None:
        used = self.used = self._rss()
        alarmed = used > self.limit
        if alarmed == self.alarmed:
            return
        self.alarmed = alarmed
        node = self.broker.config.node_name
        if alarmed:
            log.info("vm_memory_high_watermark set. Memory used:%d allowed:%d", used, self.limit)
            log.warning("memory resource limit alarm set on node '%s'.\n"
                        "*** Publishers will be blocked until this alarm clears ***", node)
        else:
            log.info("vm_memory_high_watermark clear. Memory used:%d allowed:%d", used, self.limit)
            log.warning("memory resource limit alarm cleared on node '%s'", node)
        self.broker.alarms.set(MEMORY, alarmed)

    # paging -------------------------------------------------------------------------------
    def paging_threshold(self) -> int | None:
        """RSS past which queues page to disk (None: a ratio above 1.0 turns paging off)."""
        return None if self.paging_ratio > 1.0 else int(self.paging_ratio * self.limit)

    def check_paging(self) -> None:
        """Start or stop paging from the last sample; while on, evict a slice of bodies."""
        if self.broker.persister is None:
            return  # no data directory: nowhere to page to (the alarm still bounds memory)
        threshold = self.paging_threshold()
        used = self.used
        if threshold is None:
            paging = False
        elif self.paging:
            paging = used >= threshold * PAGING_HYSTERESIS
        else:
            paging = used > threshold
        disk_alarm = DISK in self.broker.alarms
        changed = paging != self.paging or disk_alarm != self._disk_alarm
        if paging != self.paging:
            self.paging = paging
            log.info("Memory paging to disk %s. Memory used:%d paging threshold:%s", "started" if paging else
                     "stopped", used, threshold)
        if not changed and not paging:
            return
        now = time.monotonic()
        if changed or now - self._scanned_at >= RESCAN_EVERY:
            self._disk_alarm = disk_alarm
            persister = self.broker.persister
            persister.paging, persister.disk_alarm = paging, disk_alarm  # for stores created later
            stores = list(self._stores())
            if changed:
                for store in stores:
                    store.set_paging(paging, disk_alarm)
            self._candidates = [store for store in stores if store.resident]
            self._scanned_at = now
        if paging:
            self.page_out(self._candidates)

    def page_out(self, stores: list[DiskQueueStore]) -> int:
        """Evict up to a slice of window bodies, from the queues holding most in memory;
        returns the bytes freed."""
        messages, freed = PAGE_OUT_MESSAGES, 0
        for store in sorted((s for s in stores if s.resident), key=lambda s: s.fresh_bytes, reverse=True):
            count, size = store.page_out(messages, PAGE_OUT_BYTES - freed)
            messages -= count
            freed += size
            if messages <= 0 or freed >= PAGE_OUT_BYTES:
                break
        if freed:
            persister = self.broker.persister
            if persister is not None:
                persister.flush()  # the copies of small bodies in the segments' buffers go too
            self._untrimmed += freed
            now = time.monotonic()
            if self._untrimmed >= TRIM_AFTER_BYTES or now - self._trimmed_at >= TRIM_EVERY:
                self._trim()
                self._untrimmed, self._trimmed_at = 0, now
        return freed

    def _stores(self) -> Iterator[DiskQueueStore]:
        for vhost in list(self.broker.vhosts.values()):
            for queue in list(vhost.queues.values()):
                store = getattr(queue, "store", None)
                if isinstance(store, DiskQueueStore):
                    yield store
                elif isinstance(store, PriorityQueueStore):  # one store per priority level
                    yield from (s for s in store.levels() if isinstance(s, DiskQueueStore))

    def _tick(self) -> None:
        try:
            self.check()
            self.check_paging()
        finally:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.interval, self._tick)
