"""The listening server: accepts connections and shuts down cleanly on a signal."""

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol, Sequence

from .memory import MemoryReclaimer
from .scheduler import LoopScheduler
from .transport import AMQPProtocol

log = logging.getLogger("warren.server")


class Service(Protocol):
    """Something served beside AMQP (the management API): started before the AMQP listener,
    so once that port answers the service does too, and stopped first."""

    async def start(self, server: "Server") -> None: ...

    async def stop(self) -> None: ...


class Server:
    def __init__(self, broker, host="127.0.0.1", port=5672, services: Sequence[Service] = ()):
        self.broker = broker
        self.host = host
        self.port = port
        self.services = list(services)
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.protocols: set = set()
        self._server = None
        self._stopped = None

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self.broker.scheduler = LoopScheduler(self.loop)
        self.reclaimer = MemoryReclaimer(self.loop)
        self.reclaimer.start()
        if self.broker.persister is not None:
            self._fsync_thread = ThreadPoolExecutor(1, thread_name_prefix="warren-fsync")
            self.broker.persister.run_in_thread = self._run_in_thread
        for service in self.services:
            await service.start(self)
        self._server = await self.loop.create_server(
            lambda: AMQPProtocol(self), self.host, self.port, reuse_address=True, backlog=1024)
        for sock in self._server.sockets:
            self.port = sock.getsockname()[1]
        log.info("Warren listening for AMQP 0-9-1 on %s:%d", self.host, self.port)

    async def serve(self):
        await self.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._stopped.set)
        await self._stopped.wait()
        await self.stop()

    def _run_in_thread(self, job: Callable[[], None], done: Callable[[str | None], None]) -> None:
        """Run a blocking job (fsync) off the loop; `done(error or None)` runs on the loop."""
        def finished(future):
            error = future.exception()
            done(str(error) if error is not None else None)

        loop = self.loop
        assert loop is not None, "the persister runs jobs in threads only once start() set the loop"
        loop.run_in_executor(self._fsync_thread, job).add_done_callback(finished)

    async def stop(self):
        log.info("shutting down: closing %d connections", len(self.protocols))
        self._server.close()
        self.reclaimer.stop()
        for service in self.services:
            await service.stop()
        for proto in list(self.protocols):
            proto.conn.close()
        # Give clients a moment to answer close-ok.
        for _ in range(20):
            if not self.protocols:
                break
            await asyncio.sleep(0.05)
        for proto in list(self.protocols):
            proto.close()
        await self._server.wait_closed()
        persister = self.broker.persister
        if persister is not None:
            while persister.syncing:  # let a running group commit finish first
                await asyncio.sleep(0.01)
            persister.run_in_thread = None
            persister.sync_now()
