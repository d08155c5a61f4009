"""Group commit: concurrent callers' SQLite writes share one transaction (one fsync)."""

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batcher(Generic[T]):
    def __init__(self, write: Callable[[list[T]], None]) -> None:
        self._write = write
        self._items: list[tuple[T, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> None:
        """Return once `item` is written (durably, for the outbox)."""
        future = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        await future

    async def _run(self) -> None:
        # Whatever arrives while one batch is in the thread becomes the next batch.
        while self._items:
            batch, self._items = self._items, []
            try:
                await asyncio.to_thread(self._write, [item for item, _ in batch])
            except Exception as e:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def drain(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
