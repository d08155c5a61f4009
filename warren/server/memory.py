"""Giving memory back to the operating system once messages are gone.

A message body is freed with free(), and glibc keeps freed heap memory for reuse: after a
flood of messages is drained the process would stay at its peak size. Every few seconds
the reclaimer asks malloc how much it holds free (mallinfo2) and, past a threshold, has it
return free pages to the system (malloc_trim(0), which also releases whole free pages in
the middle of the heap). Both walk malloc's free lists only, so the check is cheap while
nothing was freed. Without glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("warren.server")

INTERVAL = 5.0           # seconds between checks
FREE_THRESHOLD = 32 << 20  # trim once malloc holds this much free memory

# Python's cyclic GC, set for a process that keeps millions of long-lived objects (queues,
# bindings, messages): with the default (700, 10, 10), collections of the older generations
# made bulk topology changes superlinear (100k topic bindings took 21x the time of 10k, 7-10x
# with these; the publish/route/enqueue/ack loop is no slower, ~5% faster).
GC_THRESHOLDS = (50_000, 20, 20)


# glibc's malloc, set for message bodies: by default a block past its mmap threshold (128 KiB,
# raised to the size of the biggest such block freed so far, and a block of that size is
# mapped again) is mapped afresh and unmapped when freed, so the reads of a big body and the
# body itself were zeroed pages faulted in on every message. Measured with the reads and the
# join of a body alone: 4.1 ms of kernel CPU a 16 MiB body, 0.17 ms a 1 MiB one, 0.4 and 0
# with these settings. Blocks of up to 32 MiB (glibc's most) come from the heap and are reused;
# free memory at the heap's top goes back past 64 MiB, the reclaimer below returns the rest.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_memory() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None


class MemoryReclaimer:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.libc = _libc()
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.libc is not None:
            self._timer = self.loop.call_later(INTERVAL, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def free_held(self) -> int:
        """Bytes malloc holds free in its heap (not given back to the system)."""
        return self.libc.mallinfo2().fordblks if self.libc is not None else 0

    def _check(self) -> None:
        if self.free_held() > FREE_THRESHOLD:
            self.libc.malloc_trim(0)
            self.trims += 1
        self._timer = self.loop.call_later(INTERVAL, self._check)
