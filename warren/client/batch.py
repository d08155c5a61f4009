"""Group commit for the outbox: new rows and confirmed rows share transactions (one fsync each)."""

import asyncio
from collections.abc import Callable

from .message import OutgoingMessage

# write(new, confirmed): one transaction (Outbox.write), run in a worker thread.
Write = Callable[[list[OutgoingMessage], list[int]], None]
# stored(messages, error) and deleted(seqs, error) run on the loop after each transaction
# (error None once it is committed).
Stored = Callable[[list[OutgoingMessage], BaseException | None], None]
Deleted = Callable[[list[int], BaseException | None], None]


class GroupCommit:
    """Writes the rows given to insert() and delete() in a worker thread, one transaction at a
    time; whatever arrives while one is being written goes in the next. The writer, not
    whoever handed a row over, acts on the outcome (stored, deleted): a row is handled the
    same whether or not its caller still waits (a cancelled caller's row is written all the
    same, and then sent)."""

    def __init__(self, write: Write, stored: Stored, deleted: Deleted,
                 delete_delay: float = 0.02) -> None:
        self._write = write
        self._stored = stored
        self._deleted = deleted
        # Confirms arrive a few at a time, and a transaction per handful of deletes cost
        # more than the inserts did (the rows' pages rewritten each time): deletes alone
        # wait this long for more of them, or for inserts to share a transaction with.
        self.delete_delay = delete_delay
        self._new: list[OutgoingMessage] = []
        self._futures: list[asyncio.Future[None]] = []
        self._confirmed: list[int] = []
        self._task: asyncio.Task[None] | None = None
        self._hurry: asyncio.Future[None] | None = None  # ends a deletes-only wait

    async def insert(self, message: OutgoingMessage) -> None:
        """Return once `message` is committed (its seq set)."""
        future = asyncio.get_running_loop().create_future()
        self._new.append(message)
        self._futures.append(future)
        if self._hurry is not None:
            _resolve(self._hurry)
        self._start()
        await future

    def delete(self, seq: int) -> None:
        """Delete row `seq` in a coming transaction; `deleted` tells when."""
        self._confirmed.append(seq)
        self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._new or self._confirmed:
            if not self._new:
                self._hurry = loop.create_future()
                timer = loop.call_later(self.delete_delay, _resolve, self._hurry)
                try:
                    await self._hurry
                finally:
                    timer.cancel()
                    self._hurry = None
            new, self._new = self._new, []
            futures, self._futures = self._futures, []
            confirmed, self._confirmed = self._confirmed, []
            error: Exception | None = None
            try:
                await asyncio.to_thread(self._write, new, confirmed)
            except Exception as e:
                error = e
            if new:
                self._stored(new, error)
            if confirmed:
                self._deleted(confirmed, error)
            for future in futures:
                if not future.done():
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)

    async def drain(self) -> None:
        """Wait until everything handed over is written (or failed)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
