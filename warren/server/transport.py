"""The asyncio protocol that carries one AMQP connection: bytes in, bytes out, timers."""

import asyncio
import logging
import time

from ..amqp.constants import INTERNAL_ERROR
from ..session import connection_log
from ..session.connection import Connection, ConnectionState
from ..broker.ports import TLSInfo
from .error_log import ErrorLog
from .tls import session_info

log = logging.getLogger("warren.server")
# Bugs reached from the network: one line per connection, a traceback per place per minute.
internal_errors = ErrorLog(log)

READ_HIGH_WATER = 4 << 20


class AMQPProtocol(asyncio.Protocol):
    """Moves bytes between a socket and a session Connection, and runs its heartbeats: the
    session's Transport port (warren.broker.ports)."""

    peer: tuple[str, int]
    local: tuple[str, int]
    tls: TLSInfo | None

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.transport = None
        self.conn = None
        self.peer = ("?", 0)
        self.local = ("?", 0)
        self.tls = None  # over TLS: its session, known once the handshake is done
        self.reading = True
        self.last_recv = self.last_send = time.monotonic()
        self.heartbeat_timer = None
        self.close_timer = None
        self.handshake_timer = None
        self.closed = False

    # asyncio callbacks ------------------------------------------------------
    def connection_made(self, transport) -> None:  # typed, so mypy checks this is a Transport port
        self.transport = transport
        transport.set_write_buffer_limits(high=READ_HIGH_WATER)
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.peer, self.local = (peer[0], peer[1]), (local[0], local[1])
        # (On a TLS listener asyncio calls this once the TLS handshake has succeeded.)
        self.tls = session_info(transport)
        self.conn = Connection(self.server.broker, self)
        self.server.protocols.add(self)
        self.handshake_timer = self.loop.call_later(
            self.server.broker.config.limits.handshake_timeout, self._handshake_timeout)

    def data_received(self, data):
        self.last_recv = time.monotonic()
        try:
            self.conn.data_received(data)
        except Exception as exc:  # a bug: it costs this connection, never the log or the broker
            self._internal_error(exc)

    def connection_lost(self, exc):
        self.closed = True
        for timer in (self.heartbeat_timer, self.close_timer, self.handshake_timer):
            if timer is not None:
                timer.cancel()
        try:
            self.conn.connection_lost()
        except Exception as err:
            internal_errors.report(f"releasing connection {self.conn.name}", err)
            self.server.broker.connections.discard(self.conn)
        self.server.protocols.discard(self)
        self.conn.detach()  # no cycle left: both are freed once uvloop lets go of this protocol

    def pause_writing(self):
        self._guarded(self.conn.pause_writing)

    def resume_writing(self):
        # Resuming also handles input held back meanwhile: guarded like data_received.
        self._guarded(self.conn.resume_writing)

    # the transport interface the session Connection uses ----------------------
    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)
            self.last_send = time.monotonic()

    def writelines(self, chunks: list) -> None:
        # uvloop queues the objects themselves and writes them with writev: no copy.
        if not self.closed:
            self.transport.writelines(chunks)
            self.last_send = time.monotonic()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def close_later(self, seconds: float) -> None:
        if self.close_timer is None:
            self.close_timer = self.loop.call_later(seconds, self.close)

    def schedule_flush(self, flush) -> None:
        self.loop.call_soon(self._guarded, flush)

    def pause_reading(self) -> None:
        if not self.closed and self.reading:
            self.reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.closed and not self.reading:
            self.reading = True
            self.last_recv = time.monotonic()  # silence while we did not read is not the peer's
            self.transport.resume_reading()

    def heartbeat_negotiated(self, seconds: int) -> None:
        if seconds > 0:
            self.heartbeat_timer = self.loop.call_later(seconds / 2, self._heartbeat_tick, seconds)

    def handshake_done(self) -> None:
        # The handshake timer runs from accept to connection.open, as RabbitMQ's.
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None

    # internal errors ------------------------------------------------------------
    def _guarded(self, callback, *args) -> None:
        """Run a loop callback into the session, closing the connection if it raises."""
        try:
            callback(*args)
        except Exception as exc:
            self._internal_error(exc)

    def _internal_error(self, exc: Exception) -> None:
        """An exception the session did not expect: close this connection as RabbitMQ does when
        a channel process crashes (connection.close 541 INTERNAL_ERROR once the connection is
        open; before, its reader dies and the socket just closes) and log it boundedly."""
        conn = self.conn
        internal_errors.report(f"closing connection {conn.name} on an internal error", exc)
        if self.closed:
            return
        try:
            if conn.state == ConnectionState.OPEN:
                conn.close(INTERNAL_ERROR, "INTERNAL_ERROR")
                return
            if conn.state not in (ConnectionState.CLOSING, ConnectionState.CLOSED):
                conn.abort()
                return
        except Exception as again:  # its state is broken: drop the socket and what we can
            internal_errors.report(f"closing connection {conn.name} after an internal error", again)
            conn.state = ConnectionState.CLOSED
            self.server.broker.connections.discard(conn)
        self.close()

    # timers -------------------------------------------------------------------
    def _heartbeat_tick(self, seconds):
        try:
            self._heartbeat(seconds)
        except Exception as exc:
            self._internal_error(exc)

    def _heartbeat(self, seconds):
        if self.closed:
            return
        now = time.monotonic()
        # Heartbeat monitoring is suspended while the connection is not read, as RabbitMQ.
        if self.reading and now - self.last_recv > 2 * seconds:
            connection_log.ended(self.conn, f"missed heartbeats from client, timeout: {seconds}s")
            self.conn.connection_lost()
            self.close()
            return
        # Nothing sent since about the last tick: a heartbeat, every seconds/2 like RabbitMQ
        # (the slack keeps a timer that fires a little early from skipping a beat).
        if now - self.last_send >= seconds * 0.45:
            self.conn.send_heartbeat()
        self.heartbeat_timer = self.loop.call_later(seconds / 2, self._heartbeat_tick, seconds)

    def _handshake_timeout(self):
        # RabbitMQ closes the socket without a word in every handshake state, tune-ok included.
        self.handshake_timer = None
        if self.conn.state < ConnectionState.OPEN and not self.closed:
            # RabbitMQ's reason names what its reader was waiting for.
            waiting = "handshake" if self.conn.state == ConnectionState.AWAIT_HEADER else "frame_header"
            connection_log.ended(self.conn, f"{{handshake_timeout,{waiting}}}")
            self.close()
