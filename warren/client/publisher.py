"""ReliablePublisher: publish with confirms, resend what is not confirmed, optionally
through a durable outbox (RabbitMQ's reliability guide, "scenario 2")."""

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from .batch import GroupCommit
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
                 nack_attempts: int = 3, resend_delay: float = 1.0,
                 exchanges: Mapping[str, str | Mapping[str, Any]] | None = None) -> None:
        self.url = url
        self.confirm_timeout = confirm_timeout
        self.outbox_path = os.fspath(outbox) if outbox is not None else None
        self.outbox_limit = outbox_limit
        # How long a message that failed (nack, timeout) waits in the outbox before its
        # next round; parked ones (unroutable, no exchange) wait for unpark().
        self.resend_delay = resend_delay
        # exchanges: how to declare an exchange a publish finds missing (name -> type, or
        # {"type", "durable", "auto_delete", "internal", "arguments"}); the others' messages
        # raise ExchangeNotFound, or are parked with an outbox.
        self._link = Link(url, mandatory=mandatory, nack_attempts=nack_attempts,
                          exchanges=exchanges)
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        # Keyed by id(): a caller may publish the same message_id twice.
        self._inflight: dict[int, OutgoingMessage] = {}
        # Counts the messages neither confirmed nor parked; flush() waits for zero.
        self._unsettled = 0
        self._rows = 0  # outbox rows, parked included: the back-pressure bound
        # Set while _unsettled is zero (for flush) and while _rows < outbox_limit (for
        # back-pressure); _change() keeps them in step with the counters. (Events, not a
        # Condition: a confirm then costs no lock and no notify when nobody waits.)
        self._settled = asyncio.Event()
        self._settled.set()
        self._room = asyncio.Event()
        self._room.set()
        self._outbox: Outbox | None = None
        # Outbox rows to send, and the tasks that send them, one row at a time each: at most
        # max_in_flight of them, started as the queue needs them (a task per row would cost
        # four times as much), _idle_senders of them waiting for a row.
        self._queue: asyncio.Queue[OutgoingMessage] = asyncio.Queue()
        self._senders: list[asyncio.Task[None]] = []
        self._idle_senders = 0
        self._writer: GroupCommit | None = None
        self._open = False

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def open(self) -> None:
        left: list[OutgoingMessage] = []
        if self.outbox_path is None:
            await self._link.open(wait=True)
        else:
            outbox = self._outbox = await asyncio.to_thread(Outbox, self.outbox_path)
            self._writer = GroupCommit(outbox.write, self._stored, self._deleted)
            # Rows a previous (perhaps crashed) process left are sent first.
            left = await asyncio.to_thread(outbox.pending)
            rows, _ = await asyncio.to_thread(outbox.count)
            self._change(rows=rows, unsettled=len(left))
            if left:
                log.info("outbox %s: resending %d messages left unconfirmed",
                         self.outbox_path, len(left))
            await self._link.open(wait=False)
        self._open = True
        for message in left:  # queued before any new publish
            self._enqueue(message)

    async def close(self) -> None:
        """Stop sending; outbox rows not yet confirmed stay for the next open()."""
        self._open = False
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []
        if self._writer is not None:
            await self._writer.drain()
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
        self._change(unsettled=1)
        self._inflight[id(message)] = message
        try:
            async with self._slots:
                await self._link.deliver(message, self.confirm_timeout)
        finally:
            self._inflight.pop(id(message), None)
            self._change(unsettled=-1)

    async def _publish_to_outbox(self, message: OutgoingMessage) -> None:
        assert self._writer is not None
        dump_properties(message.properties)  # a TypeError here, not in the writer thread
        # Back-pressure: a full outbox makes the caller wait for confirmations.
        while self._rows >= self.outbox_limit:
            await self._room.wait()
        self._change(rows=1, unsettled=1)
        # A caller cancelled while the row is being committed must not leave a stored row
        # that this process never sends: _stored(), not this caller, queues it for sending.
        await self._writer.insert(message)

    def _stored(self, messages: list[OutgoingMessage], error: BaseException | None) -> None:
        if error is not None:
            self._change(rows=-len(messages), unsettled=-len(messages))
            return
        for message in messages:
            self._enqueue(message)

    def _deleted(self, seqs: list[int], error: BaseException | None) -> None:
        if error is not None:
            # Confirmed all the same; the rows stay, and a later open() sends them again.
            log.error("outbox: could not delete %d confirmed rows: %s", len(seqs), error)
            self._change(unsettled=-len(seqs))
            return
        self._change(rows=-len(seqs), unsettled=-len(seqs))

    def _enqueue(self, message: OutgoingMessage) -> None:
        self._queue.put_nowait(message)
        if (self._open and self._queue.qsize() > self._idle_senders
                and len(self._senders) < self.max_in_flight):
            self._senders.append(asyncio.create_task(self._send_outbox()))

    def _resend_later(self, message: OutgoingMessage) -> None:
        asyncio.get_running_loop().call_later(self.resend_delay, self._enqueue, message)

    async def _send_outbox(self) -> None:
        while True:
            self._idle_senders += 1
            try:
                message = await self._queue.get()
            finally:
                self._idle_senders -= 1
            try:
                await self._send_row(message)
            except Exception:
                # E.g. the outbox file failed while noting a nack: the row stays, try again.
                log.exception("outbox: sending %s failed", message.message_id)
                self._resend_later(message)

    async def _send_row(self, message: OutgoingMessage) -> None:
        assert self._outbox is not None and self._writer is not None and message.seq is not None
        self._inflight[id(message)] = message
        try:
            try:
                await self._link.deliver(message, self.confirm_timeout)
            except (Returned, ExchangeNotFound) as e:
                # Resending will not help until someone adds the binding or exchange: keep
                # the row, visible in unconfirmed(), instead of losing the message.
                log.warning("outbox: parked %s: %s", message.message_id, e.reason)
                message.error, message.parked = e.reason, True
                await asyncio.to_thread(self._outbox.failed, message.seq, message.attempts,
                                        e.reason, True)
                self._change(unsettled=-1)
                return
            except Exception as e:
                # Nacked, ConfirmTimeout, or anything unexpected: the row stays and is sent
                # again after resend_delay, for as long as this publisher runs.
                reason = e.reason if isinstance(e, PublishError) else f"{type(e).__name__}: {e}"
                log.log(logging.INFO if isinstance(e, PublishError) else logging.ERROR,
                        "outbox: will resend %s: %s", message.message_id, reason)
                await asyncio.to_thread(self._outbox.failed, message.seq, message.attempts,
                                        reason, False)
                self._resend_later(message)
                return
            # Settled once the delete is committed (_deleted); the sender goes on meanwhile.
            self._writer.delete(message.seq)
        finally:
            self._inflight.pop(id(message), None)

    def _change(self, rows: int = 0, unsettled: int = 0) -> None:
        self._rows += rows
        self._unsettled += unsettled
        if self._unsettled:
            self._settled.clear()
        else:
            self._settled.set()
        if self._rows < self.outbox_limit:
            self._room.set()
        else:
            self._room.clear()

    # -- inspection ----------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every message is confirmed (or parked, with an outbox); TimeoutError
        after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while self._unsettled:
                await self._settled.wait()

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
        self._change(unsettled=len(messages))
        for message in messages:
            self._enqueue(message)
        return len(messages)


def _older(messages: Iterable[OutgoingMessage], older_than: float | None) -> list[OutgoingMessage]:
    cutoff = time.time() - (older_than or 0.0)
    return [m for m in messages if m.created <= cutoff]
