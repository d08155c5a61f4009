"""A blocking facade: the same asynchronous ReliablePublisher and ReliableConsumer, run on
a private event loop in a background thread, so threaded code gets the same guarantees
without a second implementation.

    with ReliablePublisher(url) as pub:
        pub.publish(b"hello", routing_key="orders")

    with ReliableConsumer(url, "orders", handle) as consumer:   # handle(message) in a thread
        consumer.run()                                          # until stop() or Ctrl-C
"""

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Self, TypeVar

from . import consumer as _consumer
from . import counting as _counting
from . import publisher as _async
from . import topology as _topology
from .counting import Outcome
from .errors import ConfirmTimeout, ExchangeNotFound, Nacked, PublishError, Returned
from .incoming import ConsumedMessage
from .message import OutgoingMessage

T = TypeVar("T")


class _PrivateLoop:
    """An event loop of its own, running in a daemon thread, that blocking calls wait on."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class _OpenClose(_PrivateLoop):
    """A publisher made, opened and closed on the private loop: its asyncio primitives
    must belong to that loop."""

    def __init__(self, make: Callable[[], Any]) -> None:
        super().__init__("warren-client")
        try:
            self._inner = self._call(self._on_loop(make))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _on_loop(make: Callable[[], T]) -> T:
        return make()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        try:
            self._call(self._inner.open())
        except BaseException:
            self._stop_loop()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._inner.close())
        finally:
            self._stop_loop()


class ReliablePublisher(_OpenClose):
    """Takes the asynchronous ReliablePublisher's arguments; every method blocks until
    the asynchronous one returns and raises what it raises. Safe to call from several
    threads (the calls run concurrently on the loop)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(lambda: _async.ReliablePublisher(url, **kwargs))
        self._publisher: _async.ReliablePublisher = self._inner

    def publish(self, body: bytes, exchange: str = "", routing_key: str = "",
                message_id: str | None = None, properties: dict[str, Any] | None = None) -> str:
        return self._call(self._publisher.publish(body, exchange, routing_key, message_id,
                                                  properties))

    def flush(self, timeout: float | None = None) -> None:
        self._call(self._publisher.flush(timeout))

    def unconfirmed(self, older_than: float | None = None) -> list[OutgoingMessage]:
        return self._call(self._publisher.unconfirmed(older_than))

    def unpark(self) -> int:
        return self._call(self._publisher.unpark())

    @classmethod
    def recover(cls, url: str, *, outbox: str, **kwargs: Any) -> list[OutgoingMessage]:
        with cls(url, outbox=outbox, **kwargs) as publisher:
            publisher.flush()
            return publisher.unconfirmed()


class CountingPublisher(_OpenClose):
    """Takes the asynchronous CountingPublisher's arguments; on_settled is called on the
    facade's own thread (keep it short, or hand the outcome to your thread)."""

    def __init__(self, url: str, on_settled: _counting.Settled, **kwargs: Any) -> None:
        super().__init__(lambda: _counting.CountingPublisher(url, on_settled, **kwargs))
        self._publisher: _counting.CountingPublisher = self._inner

    @property
    def last_sent(self) -> int:
        return self._publisher.last_sent

    @property
    def last_settled(self) -> int:
        return self._publisher.last_settled

    def send(self, body: bytes, exchange: str = "", routing_key: str = "",
             properties: dict[str, Any] | None = None) -> int:
        return self._call(self._publisher.send(body, exchange, routing_key, properties))

    def flush(self, timeout: float | None = None) -> None:
        self._call(self._publisher.flush(timeout))


class ReliableConsumer(_PrivateLoop):
    """Takes the asynchronous ReliableConsumer's arguments, but `handler` is a plain
    function; it runs in a worker thread (asyncio.to_thread), one message at a time, so
    it may block without stalling the connection's heartbeats."""

    def __init__(self, url: str, queue: "str | _topology.WorkQueue",
                 handler: Callable[[ConsumedMessage], None], **kwargs: Any) -> None:
        super().__init__("warren-consumer")

        async def in_thread(message: ConsumedMessage) -> None:
            await asyncio.to_thread(handler, message)

        async def make() -> _consumer.ReliableConsumer:
            return _consumer.ReliableConsumer(url, queue, in_thread, **kwargs)

        self._consumer: _consumer.ReliableConsumer = self._call(make())

    @property
    def consumer(self) -> _consumer.ReliableConsumer:
        """The asynchronous consumer (its counters: handled, duplicates, ...)."""
        return self._consumer

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, timeout: float = 10.0) -> None:
        """Consume in the background; return once consuming."""
        self._call(self._consumer.start(timeout))

    def run(self) -> None:
        """Block until stop() (from another thread) or Ctrl-C; raise what ended the
        consumer otherwise."""
        try:
            self._call(self._consumer.wait())
        except KeyboardInterrupt:
            self.stop()

    def stop(self) -> None:
        if not self._loop.is_closed():
            self._call(self._consumer.stop())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._consumer.__aexit__(None, None, None))
        finally:
            self._stop_loop()


def declare_work_queue(url: str, name: str, *, retry_delays: Sequence[float] = (1.0, 5.0, 30.0),
                       max_attempts: int | None = None,
                       arguments: dict[str, Any] | None = None) -> _topology.WorkQueue:
    return asyncio.run(_topology.declare_work_queue(
        url, name, retry_delays=retry_delays, max_attempts=max_attempts, arguments=arguments))


def declare_sharded_queues(url: str, exchange: str, shards: int,
                           **kwargs: Any) -> _topology.ShardSet:
    return asyncio.run(_topology.declare_sharded_queues(url, exchange, shards, **kwargs))


__all__ = ["ReliablePublisher", "CountingPublisher", "Outcome", "ReliableConsumer",
           "ConsumedMessage", "declare_work_queue", "declare_sharded_queues", "OutgoingMessage", "PublishError", "Nacked",
           "Returned", "ExchangeNotFound", "ConfirmTimeout"]
