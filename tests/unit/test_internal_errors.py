"""A bug reached from the network costs one connection and a bounded amount of log.

The server's AMQPProtocol (warren/server/transport.py) is driven here without sockets: a
stand-in asyncio transport records the bytes and the close. The bug is simulated by replacing
one channel handler in-process (no hook in the broker): queue.declare recurses until Python
raises RecursionError, whose traceback is the ~1000-frame kind a deep field table produced.
"""

from __future__ import annotations

import asyncio
import io
import logging
import types

import pytest
from pamqp import commands, frame

from warren.amqp import spec
from warren.broker.broker import Broker
from warren.server import transport as transport_module
from warren.server.error_log import ErrorLog
from warren.server.transport import AMQPProtocol
from warren.session import channel as channel_module

from .fake_transport import FRAME_MAX, PROTOCOL_HEADER


class SocketStandIn:
    """What asyncio hands a Protocol: the bytes written, and whether it was closed."""

    def __init__(self, port: int):
        self.port = port
        self.data = bytearray()
        self.closed = False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", self.port), "sockname": ("127.0.0.1", 5672)}.get(name, default)

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        assert not self.closed
        self.data += data

    def writelines(self, chunks):
        for chunk in chunks:
            self.write(chunk)

    def close(self):
        self.closed = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def frames(self) -> list:
        out = []
        while self.data:
            used, ch, value = frame.unmarshal(bytes(self.data))
            del self.data[:used]
            out.append((ch, value))
        return out


@pytest.fixture
def server():
    loop = asyncio.new_event_loop()
    yield types.SimpleNamespace(loop=loop, broker=Broker.with_defaults(), protocols=set())
    loop.close()


@pytest.fixture
def log_text(monkeypatch):
    """Everything the server logs during the test (a fresh rate limiter, so tests don't share one)."""
    monkeypatch.setattr(transport_module, "internal_errors", ErrorLog(transport_module.log))
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    yield out.getvalue
    root.removeHandler(handler)
    root.setLevel(old_level)


def connect(server, port, upto="open"):
    """An AMQPProtocol on a stand-in socket, through the handshake up to `upto`."""
    sock = SocketStandIn(port)
    proto = AMQPProtocol(server)
    proto.connection_made(sock)
    proto.data_received(PROTOCOL_HEADER)
    proto.data_received(frame.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest"), 0))
    if upto == "start-ok":
        return proto, sock
    proto.data_received(frame.marshal(commands.Connection.TuneOk(2047, FRAME_MAX, 0), 0))
    if upto == "tune-ok":
        return proto, sock
    proto.data_received(frame.marshal(commands.Connection.Open("/"), 0))
    names = [v.name for _, v in sock.frames()]
    assert names == ["Connection.Start", "Connection.Tune", "Connection.OpenOk"], names
    return proto, sock


def recurse(n=0):
    return recurse(n + 1)


def test_internal_error_closes_with_541_and_the_log_stays_bounded(server, log_text, monkeypatch):
    monkeypatch.setitem(channel_module._HANDLERS, spec.QueueDeclare, lambda ch, m: recurse())
    for i in range(300):
        proto, sock = connect(server, 40000 + i)
        proto.data_received(frame.marshal(commands.Channel.Open(), 1)
                            + frame.marshal(commands.Queue.Declare(queue="q"), 1))
        got = sock.frames()
        assert [(ch, v.name) for ch, v in got] == [(1, "Channel.OpenOk"), (0, "Connection.Close")], got
        close = got[1][1]
        # As RabbitMQ when a channel crashes on a running connection (rabbit_binary_generator:
        # a non-AMQP exit reason maps to internal_error, no method).
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (541, "INTERNAL_ERROR", 0, 0)
        assert not sock.closed  # waiting for close-ok, as after any connection.close
        assert proto.conn not in server.broker.connections
        proto.data_received(frame.marshal(commands.Connection.CloseOk(), 0))
        assert sock.closed
        proto.connection_lost(None)
    text = log_text()
    assert text.count("Traceback") == 1, text[:3000]
    assert text.count("RecursionError") == 300 + 1  # a line each, and the traceback's last line
    # (with RabbitMQ's lines of each connection, ~700 bytes: accepted, granted, error, closing)
    assert len(text) < 340_000, f"{len(text)} bytes of log for 300 connections"
    assert "frames not shown" in text  # the recursion's middle is cut
    assert not server.protocols and not server.broker.connections


def test_internal_error_in_the_handshake_drops_the_socket(server, log_text, monkeypatch):
    def broken_authenticate(*args):
        raise KeyError("x" * 10_000)
    monkeypatch.setattr(server.broker, "authenticate", broken_authenticate)
    proto, sock = connect(server, 40000, upto="start-ok")
    # Before the connection is open RabbitMQ's reader dies on an internal error: no close.
    assert [v.name for _, v in sock.frames()] == ["Connection.Start"]
    assert sock.closed
    proto.connection_lost(None)
    text = log_text()
    assert text.count("Traceback") == 1 and len(text) < 5000, text


def test_internal_error_in_a_scheduled_flush_closes_the_connection(server, log_text, monkeypatch):
    proto, sock = connect(server, 40000)
    proto.data_received(frame.marshal(commands.Channel.Open(), 1))
    sock.frames()

    def broken_flush():
        raise struct_error()
    proto.schedule_flush(broken_flush)
    server.loop.run_until_complete(asyncio.sleep(0))  # one loop turn runs the flush
    got = sock.frames()
    assert [(ch, v.name, v.reply_code) for ch, v in got] == [(0, "Connection.Close", 541)]
    assert "Traceback" in log_text()


def struct_error():
    import struct
    try:
        struct.unpack_from(">H", b"")
    except struct.error as err:
        return err


def test_the_handshake_timer_runs_until_open(server):
    proto, sock = connect(server, 40000, upto="tune-ok")
    assert proto.handshake_timer is not None  # tune-ok (heartbeat 0) does not stop it
    proto._handshake_timeout()  # as the loop would, handshake_timeout seconds after accept
    assert sock.closed
    proto.connection_lost(None)
    proto, sock = connect(server, 40001)
    assert proto.handshake_timer is None


def test_tracebacks_are_rate_limited_per_location():
    out = io.StringIO()
    logger = logging.getLogger("test.error_log")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(out))
    now = [0.0]
    errors = ErrorLog(logger, clock=lambda: now[0])

    def fail(where):
        try:
            if where == "a":
                raise ValueError("at a")
            raise ValueError("at b")
        except ValueError as err:
            return err
    for _ in range(5):
        errors.report("conn", fail("a"))
    errors.report("conn", fail("b"))  # another line of code: its own traceback
    assert out.getvalue().count("Traceback") == 2
    now[0] = 61.0
    errors.report("conn", fail("a"))
    text = out.getvalue()
    assert text.count("Traceback") == 3
    assert "(4 more from here since its last traceback)" in text
    assert len(text.splitlines()) < 40
