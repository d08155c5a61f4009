"""Logging the unexpected exceptions a connection's session raises, without flooding the log.

A bug that a client can reach from the network (a decoder that recurses, a handler that
trips over odd input) must not let each connection write a full traceback: a RecursionError
alone is ~135 KB of frames, and a few hundred connections a second would fill the disk.
So every occurrence gets one line, and the traceback of each code location is logged at
most once per interval, cut to its outermost and innermost frames; the next traceback of
that location says how many occurrences were not shown.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Callable

TRACEBACK_INTERVAL = 60.0  # seconds between two tracebacks of the same location
_HEAD_FRAMES, _TAIL_FRAMES = 8, 16  # frames kept of a long traceback
_MESSAGE_MAX = 200  # characters of the exception's message on the one-line report


class ErrorLog:
    """One line per error, and a bounded traceback per code location per interval."""

    def __init__(self, logger: logging.Logger, interval: float = TRACEBACK_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.interval = interval
        self.clock = clock
        # (exception type, file, line of the innermost frame) -> when its traceback was logged;
        # bounded by the number of places in the code that can raise.
        self._logged_at: dict[tuple[str, str, int], float] = {}
        self._suppressed: dict[tuple[str, str, int], int] = {}

    def report(self, what: str, exc: BaseException) -> None:
        """Log `what` (e.g. which connection is closed because of it) and `exc`."""
        key = _location(exc)
        line = f"{what}: {_one_line(exc)}"
        now = self.clock()
        logged_at = self._logged_at.get(key)
        if logged_at is not None and now - logged_at < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.logger.error("%s (at %s:%d; traceback shown at most once a minute)", line, key[1], key[2])
            return
        self._logged_at[key] = now
        suppressed = self._suppressed.pop(key, 0)
        more = f" ({suppressed} more from here since its last traceback)" if suppressed else ""
        self.logger.error("%s%s\n%s", line, more, bounded_traceback(exc))


def _location(exc: BaseException) -> tuple[str, str, int]:
    tb = exc.__traceback__
    if tb is None:
        return (type(exc).__name__, "?", 0)
    while tb.tb_next is not None:
        tb = tb.tb_next
    return (type(exc).__name__, tb.tb_frame.f_code.co_filename, tb.tb_lineno)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > _MESSAGE_MAX:
        text = text[:_MESSAGE_MAX] + "..."
    text = text.replace("\n", "\\n")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def bounded_traceback(exc: BaseException) -> str:
    """The traceback of `exc`, with the middle of a deep stack (recursion) elided, and the
    exceptions it was raised from named on one line each."""
    frames = traceback.extract_tb(exc.__traceback__)
    lines = ["Traceback (most recent call last):\n"]
    if len(frames) > _HEAD_FRAMES + _TAIL_FRAMES:
        lines += traceback.StackSummary.from_list(frames[:_HEAD_FRAMES]).format()
        lines.append(f"  [... {len(frames) - _HEAD_FRAMES - _TAIL_FRAMES} frames not shown ...]\n")
        lines += traceback.StackSummary.from_list(frames[-_TAIL_FRAMES:]).format()
    else:
        lines += frames.format()
    lines.append(_one_line(exc) + "\n")
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    for _ in range(3):  # a few links of the chain are enough to place it
        if cause is None:
            break
        lines.append(f"raised while handling {_one_line(cause)}\n")
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return "".join(lines).rstrip("\n")
