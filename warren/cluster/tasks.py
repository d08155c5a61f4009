"""Stopping a service's background tasks."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancelled(*tasks: asyncio.Task | None) -> None:
    """Cancel the tasks and wait until each has ended (None: a task never started)."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def first_failure(*aws: Any) -> None:
    """Run the coroutines together until one fails (its exception is raised); the others are
    then cancelled (gather alone would leave them running)."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        await cancelled(*tasks)
