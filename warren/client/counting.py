"""CountingPublisher: seed 002's scenario 1, an upstream that resends what we do not
acknowledge. Nothing is kept or resent here; the publisher numbers what it sends and
reports, in order, which numbers the broker confirmed (ack) or did not (nack, return,
timeout, lost connection), so the upstream can be answered. Between reports it needs two
numbers, last_sent and last_settled, plus the few outcomes that arrive out of order."""

import asyncio
import enum
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import aio_pika
import aiormq
import aiormq.exceptions

from .link import Link

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    ACK = "ack"            # the broker took responsibility for the message
    NACK = "nack"          # basic.nack (e.g. a full queue with x-overflow=reject-publish)
    RETURNED = "returned"  # mandatory and unroutable (basic.return)
    TIMEOUT = "timeout"    # no confirm within confirm_timeout: the broker may still have it
    LOST = "lost"          # the channel or connection closed first (e.g. 404 no exchange)


# on_settled(first, last, outcome): messages first..last (inclusive) all ended so.
Settled = Callable[[int, int, Outcome], None]

_PERSISTENT = aio_pika.Message(b"", delivery_mode=aio_pika.DeliveryMode.PERSISTENT).properties


class CountingPublisher:
    """`await send(...)` returns the message's number (1, 2, ... for the publisher's
    lifetime, across reconnects) once a slot among max_in_flight is free; on_settled is
    called, in number order, as the outcomes arrive. No message is resent: that is the
    upstream's job in this scenario."""

    def __init__(self, url: str, on_settled: Settled, *, confirm_timeout: float = 30.0,
                 mandatory: bool = True, max_in_flight: int = 1000) -> None:
        self.on_settled = on_settled
        self.confirm_timeout = confirm_timeout
        self.last_sent = 0
        self.last_settled = 0
        self._link = Link(url, mandatory=mandatory, nack_attempts=1)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._early: dict[int, Outcome] = {}  # settled after a still unsettled number
        self._tasks: set[asyncio.Task[None]] = set()
        self._settled = asyncio.Event()
        self._report_due = False
        self._open = False

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def open(self) -> None:
        await self._link.open(wait=True)
        self._open = True

    async def close(self) -> None:
        """Messages still unsettled are reported LOST (call flush() first to wait)."""
        self._open = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._report()
        await self._link.close()

    @property
    def unsettled(self) -> int:
        return self.last_sent - self.last_settled

    async def send(self, body: bytes, exchange: str = "", routing_key: str = "",
                   properties: dict[str, Any] | None = None) -> int:
        if not self._open:
            raise RuntimeError("CountingPublisher is not open (use `async with`)")
        # Persistent unless told otherwise; aio_pika.Message converts headers, datetimes...
        props = (aio_pika.Message(b"", **{"delivery_mode": aio_pika.DeliveryMode.PERSISTENT,
                                          **properties}).properties
                 if properties else _PERSISTENT)
        await self._slots.acquire()
        self.last_sent += 1
        number = self.last_sent
        self._settled.clear()
        task = asyncio.create_task(self._publish(bytes(body), exchange, routing_key, props))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, number))
        return number

    async def _publish(self, body: bytes, exchange: str, routing_key: str,
                       props: aiormq.spec.Basic.Properties) -> None:
        async with asyncio.timeout(self.confirm_timeout):
            while True:
                channel = await self._link.channel()
                try:
                    await channel.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                                properties=props, mandatory=self._link.mandatory)
                    return
                except aiormq.exceptions.ChannelInvalidStateError:
                    # Closed before this message was written (another message's 404, a
                    # lost connection): nothing reached the broker, so sending it on the
                    # reopened channel is not a resend.
                    await asyncio.sleep(0.05)

    def _done(self, task: asyncio.Task[None], number: int) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if task.cancelled():
            outcome = Outcome.LOST
        else:
            error = task.exception()
            outcome = (Outcome.ACK if error is None
                       # PublishError before DeliveryError: it is a subclass.
                       else Outcome.RETURNED if isinstance(error, aiormq.exceptions.PublishError)
                       else Outcome.NACK if isinstance(error, aiormq.exceptions.DeliveryError)
                       else Outcome.TIMEOUT if isinstance(error, TimeoutError)
                       else Outcome.LOST)
            if outcome is Outcome.LOST:
                log.debug("message %d lost: %s: %s", number, type(error).__name__, error)
        self._early[number] = outcome
        if not self._report_due:
            # One report per loop turn: a `multiple` confirm settles many tasks in the same
            # turn, and the upstream hears one run instead of one call per message.
            self._report_due = True
            asyncio.get_running_loop().call_soon(self._report)

    def _report(self) -> None:
        """Hand on_settled every run of equal outcomes that is now contiguous."""
        self._report_due = False
        while (first := self.last_settled + 1) in self._early:
            outcome = self._early.pop(first)
            last = first
            while self._early.get(last + 1) is outcome:
                last += 1
                del self._early[last]
            self.last_settled = last
            try:
                self.on_settled(first, last, outcome)
            except Exception:
                log.exception("on_settled(%d, %d, %s) raised", first, last, outcome.name)
        if self.last_settled == self.last_sent:
            self._settled.set()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is settled; TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout):
            while self.last_settled < self.last_sent:
                await self._settled.wait()
