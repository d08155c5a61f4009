"""A consumer that settles every message exactly once and never loops on a bad one.

Handled messages are acked in batches; a poison message (an exception type the caller
names) is rejected without requeue, to the queue's DLQ; any other failure sends the
message to a retry queue with a growing delay (topology.py) and, after max_attempts, to
the parking queue. Redelivered messages whose id an idempotency store holds are dropped.
A consumer cancelled by the broker (queue deleted) re-declares the queue if it knows how
and consumes again; a lost channel or connection is reopened with a back-off.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import aio_pika
import aiormq
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from .acks import AckBatch
from .dedup import IdempotencyStore, make_store
from .incoming import ATTEMPT_HEADER, ConsumedMessage, from_delivery, republishable
from .topology import WorkQueue, declare_work_queue

log = logging.getLogger(__name__)

Handler = Callable[[ConsumedMessage], Awaitable[None]]

# Errors after which a new connection may work: the broker closed the channel or the
# connection, or the network went away.
_TRANSIENT = (ConnectionError, OSError, aiormq.exceptions.AMQPError,
              aiormq.exceptions.ChannelInvalidStateError, RuntimeError, TimeoutError)


class _Lost(ConnectionError):
    """The channel or connection closed under the consumer."""


class ReliableConsumer:
    def __init__(self, url: str, queue: "str | WorkQueue", handler: Handler, *,
                 prefetch: int = 100, ack_batch: int | None = None, ack_idle: float = 0.5,
                 poison: tuple[type[BaseException], ...] = (),
                 declare: Callable[[AbstractChannel], Awaitable[Any]] | None = None,
                 queue_arguments: dict[str, Any] | None = None,
                 dedup: bool = True, store: "str | IdempotencyStore | None" = None,
                 store_size: int = 10_000, reconnect_delay: float = 0.5,
                 concurrency: int = 1) -> None:
        """queue: a name, or declare_work_queue()'s result to retry failed messages
        (without it a failed message is rejected to the DLQ). ack_batch: acks per
        basic.ack(multiple) (default prefetch // 2); ack_idle: the longest a handled
        message waits for its ack. poison: exception types after which the message is
        rejected without requeue (to the DLQ), never retried. declare / queue_arguments:
        how to re-declare the queue after the broker cancelled the consumer. store: None
        for an in-memory LRU of store_size ids, a path for SQLite, or an IdempotencyStore.
        concurrency: how many messages the handler may work on at once (1: in order)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.url = url
        self.topology = queue if isinstance(queue, WorkQueue) else None
        self.queue = queue.name if isinstance(queue, WorkQueue) else queue
        self.handler = handler
        self.prefetch = prefetch
        self.ack_batch = ack_batch if ack_batch is not None else max(1, prefetch // 2)
        self.ack_idle = ack_idle
        self.poison = poison
        self.declare = declare
        self.queue_arguments = queue_arguments
        self.store: IdempotencyStore | None = make_store(store, store_size) if dedup else None
        # A store given as an object is the caller's to close.
        self._owns_store = dedup and (store is None or isinstance(store, str))
        self.reconnect_delay = reconnect_delay
        self.concurrency = concurrency
        # Counters, for logs and tests.
        self.handled = self.duplicates = self.rejected = self.retried = self.parked = 0
        self.cancellations = 0
        self._stopping = asyncio.Event()
        self._consuming = asyncio.Event()
        self._inbox: asyncio.Queue[AbstractIncomingMessage | None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
        if self._owns_store and self.store is not None:
            self.store.close()

    async def start(self, timeout: float = 10.0) -> None:
        """Run in the background; return once the first basic.consume succeeded."""
        self._stopping.clear()
        self._task = asyncio.create_task(self.run())
        consuming = asyncio.create_task(self._consuming.wait())
        done, _ = await asyncio.wait({self._task, consuming}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        consuming.cancel()
        if self._task in done:
            self._task.result()  # raises what run() raised
        if not done:
            await self.stop()
            raise TimeoutError(f"not consuming from {self.queue!r} after {timeout}s")

    async def stop(self) -> None:
        """Ack what was handled, cancel the consumer and close the connection; messages
        received but not handled go back to the queue."""
        self._stopping.set()
        if self._inbox is not None:
            self._inbox.put_nowait(None)
        if self._task is not None:
            task, self._task = self._task, None
            await task

    async def wait(self) -> None:
        """Return when the consumer started by start() ended (stop(), or an error that is
        raised here)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def run(self) -> None:
        """Consume until stop(), reconnecting after failures."""
        delay = self.reconnect_delay
        try:
            while not self._stopping.is_set():
                try:
                    await self._session()
                    delay = self.reconnect_delay
                except _TRANSIENT as e:
                    log.warning("consumer of %r: %s: %s; reconnecting in %.1fs",
                                self.queue, type(e).__name__, e, delay)
                self._consuming.clear()
                if self._stopping.is_set():
                    break
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, 5.0)
        finally:
            if self.store is not None:
                self.store.flush()

    async def _session(self) -> None:
        connection = await aio_pika.connect(self.url)
        try:
            # Confirms and returns for the republish to a retry or parking queue, which
            # must be safe in the broker before the original is acked.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.set_qos(prefetch_count=self.prefetch)
            while not self._stopping.is_set():
                await self._declare(channel)
                queue = await channel.declare_queue(self.queue, passive=True)
                if not await self._consume(connection, channel, queue):
                    return
                self.cancellations += 1
                log.warning("consumer of %r cancelled by the broker; consuming again",
                            self.queue)
        finally:
            try:
                await connection.close()
            except _TRANSIENT:
                pass

    async def _declare(self, channel: AbstractChannel) -> None:
        if self.declare is not None:
            await self.declare(channel)
        elif self.topology is not None:
            t = self.topology
            await declare_work_queue(channel, t.name, retry_delays=t.retry_delays,
                                     max_attempts=t.max_attempts, arguments={
                                         k: v for k, v in t.arguments.items()
                                         if not k.startswith("x-dead-letter-")})
        elif self.queue_arguments is not None:
            await channel.declare_queue(self.queue, durable=True,
                                        arguments=self.queue_arguments)

    async def _consume(self, connection: aio_pika.abc.AbstractConnection,
                       channel: AbstractChannel, queue: AbstractQueue) -> bool:
        """Handle deliveries until stop() (False) or a broker's basic.cancel (True)."""
        inbox: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        self._inbox = inbox
        cancelled = False
        tag = ""

        async def on_message(delivery: AbstractIncomingMessage) -> None:
            inbox.put_nowait(delivery)

        def on_cancel(frame: aiormq.spec.Basic.Cancel) -> None:
            nonlocal cancelled
            if frame.consumer_tag == tag:
                cancelled = True
                inbox.put_nowait(None)

        def on_close(*_: Any) -> None:
            inbox.put_nowait(None)

        underlay = await channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(on_cancel)
        channel.close_callbacks.add(on_close)
        connection.close_callbacks.add(on_close)
        acks = AckBatch(self.ack_batch, self.ack_idle,
                        self.store.flush if self.store else lambda: None)
        handlers = _Handlers(self.concurrency, wake=lambda: inbox.put_nowait(None))
        try:
            tag = await queue.consume(on_message)
            self._consuming.set()
            while True:
                handlers.raise_failure()
                if self._stopping.is_set():
                    await handlers.finish()
                    await acks.flush()
                    await queue.cancel(tag)
                    return False
                due = acks.due_in()
                if due == 0.0:
                    await acks.flush()
                    continue
                try:
                    item = await asyncio.wait_for(inbox.get(), due)
                except TimeoutError:
                    await acks.flush()
                    continue
                if item is not None:
                    acks.received(item)
                    await handlers.run(self._handle(channel, item, acks))
                elif cancelled:
                    await handlers.finish()
                    await acks.flush()
                    return True
                elif channel.is_closed:
                    raise _Lost("channel closed")
        except BaseException:
            await handlers.cancel()
            acks.forget()
            raise
        finally:
            self._inbox = None
            underlay.on_consumer_cancel_callbacks.discard(on_cancel)
            channel.close_callbacks.discard(on_close)
            connection.close_callbacks.discard(on_close)

    async def _handle(self, channel: AbstractChannel, delivery: AbstractIncomingMessage,
                      acks: AckBatch) -> None:
        message = from_delivery(delivery)
        mid = message.message_id
        # Only a redelivered message may have been handled before (RabbitMQ's guide).
        if self.store is not None and message.redelivered and mid and self.store.seen(mid):
            log.info("dropping redelivered duplicate %s from %r", mid, self.queue)
            self.duplicates += 1
            await acks.add(delivery)
            return
        try:
            await self.handler(message)
        except self.poison as e:
            log.warning("poison message %s from %r (%s: %s): rejected to the DLQ",
                        mid, self.queue, type(e).__name__, e)
            self.rejected += 1
            await delivery.reject(requeue=False)
            acks.rejected(delivery)
            return
        except Exception as e:
            await self._failed(channel, message, delivery, e, acks)
            return
        if self.store is not None and mid:
            self.store.add(mid)
        self.handled += 1
        await acks.add(delivery)

    async def _failed(self, channel: AbstractChannel, message: ConsumedMessage,
                      delivery: AbstractIncomingMessage, error: Exception,
                      acks: AckBatch) -> None:
        why = f"{type(error).__name__}: {error}"
        if self.topology is None:
            # No retry queues: requeue=True would hand the message straight back (a loop).
            log.warning("handler failed on %s from %r (%s); no retry topology: rejected "
                        "to the DLQ", message.message_id, self.queue, why)
            self.rejected += 1
            await delivery.reject(requeue=False)
            acks.rejected(delivery)
            return
        failures = message.attempt + 1
        if failures >= self.topology.max_attempts:
            target = self.topology.parking
            self.parked += 1
            log.warning("handler failed %d times on %s (%s): parked in %r", failures,
                        message.message_id, why, target)
        else:
            target = self.topology.retry_queue(failures)
            self.retried += 1
            log.info("handler failed on %s (%s), attempt %d: retry via %r",
                     message.message_id, why, failures, target)
        await channel.default_exchange.publish(
            aio_pika.Message(**republishable(message, **{ATTEMPT_HEADER: failures,
                                                         "x-warren-error": why[:500]})),
            routing_key=target, mandatory=True)
        # Confirmed: the copy is safe, the original can go.
        await acks.add(delivery)


class _Handlers:
    """Runs handlers one at a time (awaited in place: in delivery order) or, with
    concurrency > 1, as up to that many tasks; the first unexpected error of a task (a
    lost channel while settling) is raised by the consume loop, which wake() prompts."""

    def __init__(self, concurrency: int, wake: Callable[[], None]) -> None:
        self._slots = asyncio.Semaphore(concurrency) if concurrency > 1 else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._wake = wake

    async def run(self, handling: Awaitable[None]) -> None:
        if self._slots is None:
            await handling
            return
        await self._slots.acquire()
        task = asyncio.ensure_future(handling)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        assert self._slots is not None
        self._slots.release()
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()
            self._wake()

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def finish(self) -> None:
        """Let the running handlers end (stop(), a cancel by the broker)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.raise_failure()

    async def cancel(self) -> None:
        """The channel is gone: their messages go back to the queue anyway."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
