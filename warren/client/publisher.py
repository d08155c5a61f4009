"""ReliablePublisher: publish with confirms, resend what is not confirmed, optionally
through a durable outbox (RabbitMQ's reliability guide, "scenario 2")."""

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from .batch import Batcher
from .errors import ExchangeNotFound, PublishError, Returned
from .link import Link, amqp_properties
from .message import OutgoingMessage, dump_properties, make_message
from .outbox import Outbox

log = logging.getLogger(__name__)


class ReliablePublisher:
    """Without an outbox, publish() returns when the broker confirmed the message and
    raises a PublishError otherwise. With outbox="path.db", publish() returns once the
    message is committed to that SQLite file; a background task publishes it, deletes the
    row when confirmed and resends it otherwise; unconfirmed() lists what is left."""

    def __init__(self, url: str, *, outbox: str | os.PathLike[str] | None = None,
                 confirm_timeout: float = 30.0, mandatory: bool = True,
                 max_in_flight: int = 1000, outbox_limit: int = 100_000,
                 nack_attempts: int = 3, resend_delay: float = 1.0) -> None:
        self.url = url
        self.confirm_timeout = confirm_timeout
        self.outbox_path = os.fspath(outbox) if outbox is not None else None
        self.outbox_limit = outbox_limit
        # How long a message that failed (nack, timeout) waits in the outbox before its
        # next round; parked ones (unroutable, no exchange) wait for unpark().
        self.resend_delay = resend_delay
        self._link = Link(url, mandatory=mandatory, nack_attempts=nack_attempts)
        self._slots = asyncio.Semaphore(max_in_flight)
        # Keyed by id(): a caller may publish the same message_id twice.
        self._inflight: dict[int, OutgoingMessage] = {}
        # Counts the messages neither confirmed nor parked; flush() waits for zero.
        self._unsettled = 0
        self._rows = 0  # outbox rows, parked included: the back-pressure bound
        self._changed = asyncio.Condition()
        self._outbox: Outbox | None = None
        self._queue: asyncio.Queue[OutgoingMessage] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None
        self._inserts: Batcher[OutgoingMessage] | None = None
        self._deletes: Batcher[int] | None = None
        self._open = False

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def open(self) -> None:
        if self.outbox_path is None:
            await self._link.open(wait=True)
        else:
            outbox = self._outbox = await asyncio.to_thread(Outbox, self.outbox_path)
            self._inserts = Batcher(outbox.add_many)
            self._deletes = Batcher(outbox.delete_many)
            # Rows a previous (perhaps crashed) process left are sent first.
            left = await asyncio.to_thread(outbox.pending)
            self._rows, _ = await asyncio.to_thread(outbox.count)
            self._unsettled = len(left)
            for message in left:
                self._queue.put_nowait(message)
            if left:
                log.info("outbox %s: resending %d messages left unconfirmed",
                         self.outbox_path, len(left))
            await self._link.open(wait=False)
            self._sender = asyncio.create_task(self._send_outbox())
        self._open = True

    async def close(self) -> None:
        """Stop sending; outbox rows not yet confirmed stay for the next open()."""
        self._open = False
        tasks = [t for t in (self._sender, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for batcher in (self._inserts, self._deletes):
            if batcher is not None:
                await batcher.drain()
        await self._link.close()
        if self._outbox is not None:
            await asyncio.to_thread(self._outbox.close)
            self._outbox = None

    @classmethod
    async def recover(cls, url: str, *, outbox: str | os.PathLike[str],
                      **kwargs: Any) -> list[OutgoingMessage]:
        """Resend what a crashed process left in `outbox`; return what is still not
        confirmed (parked messages), as unconfirmed() would."""
        async with cls(url, outbox=outbox, **kwargs) as publisher:
            await publisher.flush()
            return await publisher.unconfirmed()

    # -- publishing ----------------------------------------------------------------------

    async def publish(self, body: bytes, exchange: str = "", routing_key: str = "",
                      message_id: str | None = None,
                      properties: dict[str, Any] | None = None) -> str:
        """Publish one message; return its message_id (a uuid4 hex one unless given)."""
        if not self._open:
            raise RuntimeError("ReliablePublisher is not open (use `async with`)")
        message = make_message(body, exchange, routing_key, message_id, properties)
        amqp_properties(message)  # a bad property name fails here, not in the background
        if self._outbox is None:
            await self._publish_now(message)
        else:
            await self._publish_to_outbox(message)
        return message.message_id

    async def _publish_now(self, message: OutgoingMessage) -> None:
        # Counted before waiting for a slot, so that flush() waits for this one too.
        self._unsettled += 1
        self._inflight[id(message)] = message
        try:
            async with self._slots:
                await self._link.deliver(message, self.confirm_timeout)
        finally:
            self._inflight.pop(id(message), None)
            await self._change(unsettled=-1)

    async def _publish_to_outbox(self, message: OutgoingMessage) -> None:
        assert self._inserts is not None
        dump_properties(message.properties)  # a TypeError here, not in the writer thread
        async with self._changed:
            # Back-pressure: a full outbox makes the caller wait for confirmations.
            await self._changed.wait_for(lambda: self._rows < self.outbox_limit)
            self._rows += 1
            self._unsettled += 1
        # Shielded: a caller cancelled while the row is being committed must not leave a
        # stored row that this process never sends.
        await asyncio.shield(asyncio.ensure_future(self._store(message)))

    async def _store(self, message: OutgoingMessage) -> None:
        assert self._inserts is not None
        try:
            await self._inserts.submit(message)
        except BaseException:
            await self._change(rows=-1, unsettled=-1)
            raise
        self._queue.put_nowait(message)

    async def _send_outbox(self) -> None:
        while True:
            message = await self._queue.get()
            await self._slots.acquire()
            task = asyncio.create_task(self._send_row(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_row(self, message: OutgoingMessage) -> None:
        assert self._outbox is not None and self._deletes is not None and message.seq is not None
        try:
            self._inflight[id(message)] = message
            try:
                await self._link.deliver(message, self.confirm_timeout)
            except (Returned, ExchangeNotFound) as e:
                # Resending will not help until someone adds the binding or exchange: keep
                # the row, visible in unconfirmed(), instead of losing the message.
                log.warning("outbox: parked %s: %s", message.message_id, e.reason)
                message.error, message.parked = e.reason, True
                await asyncio.to_thread(self._outbox.failed, message.seq, message.attempts,
                                        e.reason, True)
                await self._change(unsettled=-1)
                return
            except Exception as e:
                # Nacked, ConfirmTimeout, or anything unexpected: the row stays and is sent
                # again after resend_delay, for as long as this publisher runs.
                reason = e.reason if isinstance(e, PublishError) else f"{type(e).__name__}: {e}"
                log.log(logging.INFO if isinstance(e, PublishError) else logging.ERROR,
                        "outbox: will resend %s: %s", message.message_id, reason)
                await asyncio.to_thread(self._outbox.failed, message.seq, message.attempts,
                                        reason, False)
                asyncio.get_running_loop().call_later(
                    self.resend_delay, self._queue.put_nowait, message)
                return
            await self._deletes.submit(message.seq)
            await self._change(rows=-1, unsettled=-1)
        finally:
            self._inflight.pop(id(message), None)
            self._slots.release()

    async def _change(self, rows: int = 0, unsettled: int = 0) -> None:
        async with self._changed:
            self._rows += rows
            self._unsettled += unsettled
            self._changed.notify_all()

    # -- inspection ----------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every message is confirmed (or parked, with an outbox); TimeoutError
        after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: self._unsettled == 0)

    async def unconfirmed(self, older_than: float | None = None) -> list[OutgoingMessage]:
        """Messages published more than `older_than` seconds ago and not confirmed yet (all
        of them when None); with an outbox, parked ones too (`parked` set, `error` says why)."""
        if self._outbox is not None:
            return await asyncio.to_thread(self._outbox.unconfirmed, older_than)
        return _older(self._inflight.values(), older_than)

    async def unpark(self) -> int:
        """Send the parked outbox messages again (e.g. after creating the exchange)."""
        if self._outbox is None:
            return 0
        messages = await asyncio.to_thread(self._outbox.unpark)
        await self._change(unsettled=len(messages))
        for message in messages:
            self._queue.put_nowait(message)
        return len(messages)


def _older(messages: Iterable[OutgoingMessage], older_than: float | None) -> list[OutgoingMessage]:
    cutoff = time.time() - (older_than or 0.0)
    return [m for m in messages if m.created <= cutoff]
