"""The model's timers on the asyncio loop (the Scheduler port of warren.broker.ports)."""

import asyncio
from typing import Callable


class LoopScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback)

    def now(self) -> float:
        return self.loop.time()
