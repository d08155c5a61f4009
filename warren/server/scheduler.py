"""The model's timers on the asyncio loop (the Scheduler port of warren.broker.ports)."""

import asyncio
from typing import Callable


class LoopScheduler:
    """`after`, if set, runs after every timer's callback: what a timer changed in the store
    (a held record written at its deadline, a requeue or a dead letter of an expiry) is
    written out as a connection's flush would at the end of its read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, after: Callable[[], None] | None = None):
        self.loop = loop
        self.after = after

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, self._fire, callback)

    def _fire(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        finally:
            if self.after is not None:
                self.after()

    def now(self) -> float:
        return self.loop.time()
