"""Stopping a service's background tasks."""

from __future__ import annotations

import asyncio


async def cancelled(*tasks: asyncio.Task | None) -> None:
    """Cancel the tasks and wait until each has ended (None: a task never started)."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
