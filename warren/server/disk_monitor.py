"""The disk alarm (RabbitMQ's rabbit_disk_monitor): free space on the data directory's
filesystem against disk_free_limit.

Free space is what an unprivileged writer may use (statvfs f_bavail, as `df` reports it).
The check interval follows RabbitMQ's formula: assume the disk fills at 250 MB/s and check
again in the time it would take to fill half the headroom, 2 * (free - limit) / 250 MB/s,
kept between 0.1 s and 10 s (so every 10 s far from the limit, 10 times a second next to
it); while the alarm is on, every 10 s. A new limit is checked at once. Where the free space
cannot be read at start, monitoring is disabled with RabbitMQ's log line.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from ..broker.alarms import DISK

log = logging.getLogger("warren.server")

# ("absolute", bytes) or ("mem_relative", multiple of total memory), as warren.cli.config gives it.
DiskLimit = tuple[str, float]

DEFAULT_LIMIT: DiskLimit = ("absolute", 50_000_000)  # RabbitMQ's 50MB
MIN_INTERVAL = 0.1
MAX_INTERVAL = 10.0
FAST_RATE = 250_000_000  # bytes/s: how fast RabbitMQ assumes a disk can fill


def free_space(directory: str) -> int:
    """Bytes free for us on the filesystem of `directory` (OSError if it cannot be read)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_interval(free: int, limit: int, alarmed: bool) -> float:
    """Seconds until the next check (RabbitMQ's rabbit_disk_monitor:interval/1)."""
    if alarmed:
        return MAX_INTERVAL
    return max(MIN_INTERVAL, min(MAX_INTERVAL, 2 * (free - limit) / FAST_RATE))


class DiskMonitor:
    """A server Service: sets broker.config.disk_free_limit and raises or clears the disk alarm."""

    def __init__(self, broker, directory: str, limit: DiskLimit = DEFAULT_LIMIT,
                 total_memory: Callable[[], int] = lambda: 1024 * 1024 * 1024,
                 measure: Callable[[str], int] = free_space):
        self.broker = broker
        self.directory = directory
        self.setting = limit
        self.limit: int | None = None  # bytes; None while monitoring is disabled
        self.free: int | None = None  # at the last check
        self.alarmed = False
        self.enabled = False
        self._total_memory = total_memory
        self._measure = measure
        self._failing = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, server) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._measure(self.directory)
        except OSError as err:
            log.warning("Disabling disk free space monitoring")
            log.info("cannot read the free space of %s: %s", self.directory, err.strerror or err)
            self.broker.config.disk_free_limit = None
            return
        self.enabled = True
        log.info("Enabling free disk space monitoring")
        self.set_limit(self.setting)

    async def stop(self) -> None:
        self._cancel()
        self._loop = None  # no more timers (a set_limit after this still checks once)

    def bytes_for(self, setting: DiskLimit) -> int:
        kind, value = setting
        return round(value * self._total_memory()) if kind == "mem_relative" else int(value)

    def set_limit(self, setting: DiskLimit) -> None:
        """Apply a limit (until restart), check at once and time the next check from there."""
        if not self.enabled:
            log.info("Cannot set disk free limit: disabled disk free space monitoring")
            return
        self.setting = setting
        limit = self.limit = self.broker.config.disk_free_limit = self.bytes_for(setting)
        log.info("Disk free limit set to %dMB", int(limit / 1_000_000))
        self._cancel()
        self._tick()

    def check(self) -> None:
        try:
            free = self._measure(self.directory)
        except OSError as err:
            if not self._failing:  # keep the last state; say so once
                log.error("cannot read the free space of %s: %s", self.directory, err.strerror or err)
                self._failing = True
            return
        self._failing = False
        self.free = free
        assert self.limit is not None
        alarmed = free < self.limit
        if alarmed == self.alarmed:
            return
        self.alarmed = alarmed
        log.info("Free disk space is %s. Free bytes: %d. Limit: %d",
                 "insufficient" if alarmed else "sufficient", free, self.limit)
        node = self.broker.config.node_name
        if alarmed:
            log.warning("disk resource limit alarm set on node '%s'.\n"
                        "*** Publishers will be blocked until this alarm clears ***", node)
        else:
            log.warning("disk resource limit alarm cleared on node '%s'", node)
        self.broker.alarms.set(DISK, alarmed)

    def next_interval(self) -> float:
        if self.free is None or self.limit is None:
            return MAX_INTERVAL
        return check_interval(self.free, self.limit, self.alarmed)

    def _tick(self) -> None:
        try:
            self.check()
        finally:
            if self._loop is not None:
                self._timer = self._loop.call_later(self.next_interval(), self._tick)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
