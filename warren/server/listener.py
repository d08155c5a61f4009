"""The listening server: accepts connections and shuts down cleanly on a signal."""

import asyncio
import functools
import logging
import os
import signal
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Protocol, Sequence

from .memory import MemoryReclaimer, tune_memory
from .remote_ends import RemoteEnds
from .scheduler import LoopScheduler
from .tls import HANDSHAKE_TIMEOUT, TLSServerProtocol
from .transport import AMQPProtocol

log = logging.getLogger("warren.server")


class Service(Protocol):
    """Something served beside AMQP (the management API): started before the AMQP listener,
    so once that port answers the service does too, and stopped first."""

    async def start(self, server: "Server") -> None: ...

    async def stop(self) -> None: ...


class Listen(NamedTuple):
    """One AMQP address to listen on. An optional one (the default ::1) is skipped with a
    log line when the machine cannot bind it (no IPv6), instead of failing the start. With
    `tls` (a server-side context, warren.server.tls), it is an AMQPS listener."""
    host: str
    port: int
    optional: bool = False
    tls: ssl.SSLContext | None = None


# Clients resolve "localhost" to ::1 first (Node >= 17 among them): listen on both loopbacks.
LOOPBACK = (Listen("127.0.0.1", 5672), Listen("::1", 5672, optional=True))


class Server:
    def __init__(self, broker, host="127.0.0.1", port=5672, services: Sequence[Service] = (),
                 listen: Sequence[Listen] = (), tls_handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.broker = broker
        self.listen = list(listen) or [Listen(host, port)]
        plain = [listen for listen in self.listen if listen.tls is None] or self.listen
        self.host = plain[0].host  # the first address bound (what the API shows)
        self.port = plain[0].port
        self.addresses: list[tuple[str, int]] = []  # every (host, port) bound, set by start()
        self.tls_addresses: list[tuple[str, int]] = []  # those of the TLS listeners
        self.tls_options: dict = {}  # the ssl_options of the TLS listeners (what the API shows)
        self.tls_handshake_timeout = tls_handshake_timeout
        self.services = list(services)
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.protocols: set = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._listening: list[tuple[str, str]] = []  # (RabbitMQ's kind of listener, address) bound
        self._stopped = None

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self.broker.links = RemoteEnds()
        self.broker.set_scheduler(LoopScheduler(self.loop, after=self.broker.durability.flush))
        tune_memory()
        self.reclaimer = MemoryReclaimer(self.loop)
        self.reclaimer.start()
        if self.broker.persister is not None:
            self._fsync_thread = ThreadPoolExecutor(1, thread_name_prefix="warren-fsync")
            self.broker.persister.run_in_thread = self._run_in_thread
            self.broker.persister.scheduler = self.broker.scheduler  # (timers for held records)
        for service in self.services:
            await service.start(self)
        await self._bind()
        # RabbitMQ's line once it is ready (what tools wait for); Warren has no plugins.
        log.info("Server startup complete; 0 plugins started.")

    async def _bind(self) -> None:
        """One server per address, bound in order. Port 0 takes the port the first such
        address got, so every address of a listener shares one port (the TLS listeners
        theirs)."""
        assert self.loop is not None
        chosen: dict[tuple[int, bool], int] = {}  # requested port 0 (and TLS?) -> the port the kernel gave
        try:
            for listen in self.listen:
                key = (listen.port, listen.tls is not None)
                port = chosen.get(key, listen.port)
                factory: Callable[[], asyncio.Protocol] = lambda: AMQPProtocol(self)
                if listen.tls is not None:  # the TLS layer in front of it (warren.server.tls)
                    factory = functools.partial(TLSServerProtocol, listen.tls, factory, self.loop,
                                                self.tls_handshake_timeout)
                try:
                    server = await self.loop.create_server(factory, listen.host, port, reuse_address=True,
                                                           backlog=1024)
                except OSError as err:
                    reason = os.strerror(err.errno) if err.errno and err.errno > 0 else str(err)
                    if not listen.optional:
                        raise OSError(err.errno, f"cannot listen on {_show(listen.host, port)}: {reason}") from err
                    log.info("not listening on %s (this machine cannot bind it): %s",
                             _show(listen.host, port), reason)
                    continue
                self._servers.append(server)
                bound = server.sockets[0].getsockname()[1]
                chosen.setdefault(key, bound)
                # RabbitMQ's lines, one per address (and "stopped ..." at shutdown).
                self._listening.append(("TCP listener" if listen.tls is None else "TLS (SSL) listener",
                                        _show(listen.host, bound)))
                log.info("started %s on %s", *self._listening[-1])
                (self.addresses if listen.tls is None else self.tls_addresses).append((listen.host, bound))
        except BaseException:
            for bound_server in self._servers:
                bound_server.close()
            self._servers.clear()
            self._listening.clear()
            raise
        if not self.addresses:
            raise OSError("no AMQP address could be bound")
        self.host, self.port = self.addresses[0]
        log.info("Warren listening for AMQP 0-9-1 on %s",
                 ", ".join(_show(host, port) for host, port in self.addresses))
        if self.tls_addresses:
            log.info("Warren listening for AMQP 0-9-1 over TLS on %s",
                     ", ".join(_show(host, port) for host, port in self.tls_addresses))

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
        for server in self._servers:
            server.close()
        for kind, address in self._listening:
            log.info("stopped %s on %s", kind, address)
        self.reclaimer.stop()
        # The clients first, then the services (as RabbitMQ closes its connections first): what
        # clients did to a replicated queue until they are gone still reaches its followers over
        # the node links, and a follower's consumers are cancelled at their leader.
        for proto in list(self.protocols):
            proto.conn.close()
        # Give clients a moment to answer close-ok.
        for _ in range(20):
            if not self.protocols:
                break
            await asyncio.sleep(0.05)
        for proto in list(self.protocols):
            proto.close()
        for server in self._servers:
            await server.wait_closed()
        await asyncio.sleep(0.01)  # (what their closing appended is shipped at the end of a tick)
        for service in self.services:
            await service.stop()
        persister = self.broker.persister
        if persister is not None:
            while persister.syncing:  # let a running group commit finish first
                await asyncio.sleep(0.01)
            persister.run_in_thread = None
            persister.sync_now(write_held=True)
            if persister.holds:
                log.info("big records held back: %d, never written: %d (%d MiB)", persister.holds,
                         persister.holds_skipped, persister.held_bytes_skipped >> 20)
        self.broker.shutdown()


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
