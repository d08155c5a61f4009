"""A closed connection leaves nothing for the cyclic GC: once the server has let it go, its
objects are freed by reference counting at once, whichever way it ended.

The broker's GC thresholds (warren.server.memory) make full collections rare, so a closed
connection caught in a reference cycle stayed in memory until one came: a broker whose
clients connect per request grew from 46 to 265 MB over 80,000 connections (see
tests/integration/test_connection_churn.py, which measures RSS; this checks the cause).
Here an in-process server on loopback sockets runs with the cyclic GC off, and weak
references to each connection's Connection, AMQPProtocol, channels and (over TLS) its TLS
layer must be dead once the server has dropped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import struct
import weakref
from collections.abc import Awaitable, Callable

import pytest
from pamqp import body, commands, frame, header
from pamqp.heartbeat import Heartbeat

from tls_certs import TestCerts
from warren.broker.broker import Broker
from warren.broker.node_config import Limits, NodeConfig
from warren.server.listener import Listen, Server
from warren.server.tls import server_context

from .fake_transport import FRAME_MAX, PROTOCOL_HEADER

uvloop = pytest.importorskip("uvloop")  # the broker's loop (warren.cli.main)


class Recorder(set):
    """The server's set of live protocols, remembering a weak reference to every object of
    each connection the server made (a test's stand-in, not a hook in the server)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, weakref.ref]] = []

    def add(self, proto) -> None:
        super().add(proto)
        self.made += [("AMQPProtocol", weakref.ref(proto)), ("Connection", weakref.ref(proto.conn))]
        tls = getattr(proto.transport, "_tls", None)  # warren.server.tls's TLSTransport
        if tls is not None:
            self.made += [("TLSServerProtocol", weakref.ref(tls)), ("TLSTransport", weakref.ref(proto.transport))]

    def channels_of_open(self) -> None:
        """Remember the channels of the connections open now."""
        for proto in self:
            self.made += [(f"Channel {ch.id}", weakref.ref(ch)) for ch in proto.conn.channels.values()]


Scenario = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Server], Awaitable[None]]


def leftovers(scenario: Scenario, tls: bool = False, limits: Limits | None = None, tmp_path=None) -> list[str]:
    """Run `scenario` against a fresh in-process server (the cyclic GC off); the objects of
    its connection still alive once the server has let it go, and who refers to them."""
    async def run() -> list[str]:
        broker = Broker.with_defaults(config=NodeConfig(limits=limits or Limits()))
        context = None
        if tls:
            certs = TestCerts.make(str(tmp_path))
            context = server_context({"certfile": certs.server_cert, "keyfile": certs.server_key})
        listen = [Listen("127.0.0.1", 0)] + ([Listen("127.0.0.1", 0, tls=context)] if tls else [])
        server = Server(broker, listen=listen)
        recorder = server.protocols = Recorder()
        await server.start()
        try:
            client = None
            if tls:
                client = ssl.create_default_context(cafile=certs.ca)
            host, port = (server.tls_addresses if tls else server.addresses)[0]
            reader, writer = await asyncio.open_connection(host, port, ssl=client)
            try:
                await asyncio.wait_for(scenario(reader, writer, server), 10)
            finally:
                writer.close()
                with contextlib.suppress(OSError, ssl.SSLError):
                    await writer.wait_closed()
            for _ in range(200):  # until the server has let it go (a few loop turns)
                if not server.protocols and recorder.made:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # callbacks already scheduled run (a flush, a close)
            assert recorder.made, "the server never made the connection"
            alive = [(name, ref()) for name, ref in recorder.made if ref() is not None]
            return [f"{name} still referred to by {[type(r).__name__ for r in gc.get_referrers(obj)]}"
                    for name, obj in alive]
        finally:
            await server.stop()

    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run())
    finally:
        gc.enable()


# ------------------------------------------------------------------ the client side
async def read_method(reader: asyncio.StreamReader):
    """The next method from the server (heartbeats and content skipped), decoded with pamqp."""
    while True:
        head = await reader.readexactly(7)
        size = struct.unpack_from(">I", head, 3)[0]
        _, _, value = frame.unmarshal(head + await reader.readexactly(size + 1))
        if not isinstance(value, (Heartbeat, header.ContentHeader, body.ContentBody)):
            return value


def send(writer: asyncio.StreamWriter, channel: int, *methods) -> None:
    writer.write(b"".join(frame.marshal(m, channel) for m in methods))


async def expect(reader, cls):
    value = await read_method(reader)
    assert isinstance(value, cls), value
    return value


async def login(reader, writer, password: str = "guest", heartbeat: int = 0) -> None:
    writer.write(PROTOCOL_HEADER)
    await expect(reader, commands.Connection.Start)
    send(writer, 0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response=f"\0guest\0{password}"))
    await expect(reader, commands.Connection.Tune)
    send(writer, 0, commands.Connection.TuneOk(2047, FRAME_MAX, heartbeat), commands.Connection.Open("/"))
    await expect(reader, commands.Connection.OpenOk)


async def with_channel(reader, writer, server, heartbeat: int = 0) -> None:
    await login(reader, writer, heartbeat=heartbeat)
    send(writer, 1, commands.Channel.Open())
    await expect(reader, commands.Channel.OpenOk)
    server.protocols.channels_of_open()


async def close(reader, writer) -> None:
    send(writer, 0, commands.Connection.Close(200, "bye", 0, 0))
    await expect(reader, commands.Connection.CloseOk)


# ------------------------------------------------------------------ the ways a connection ends
async def handshake_channel_close(reader, writer, server):
    """A client connecting per request: handshake, channel.open, connection.close."""
    await with_channel(reader, writer, server)
    await close(reader, writer)


async def dropped_with_a_channel_open(reader, writer, server):
    await with_channel(reader, writer, server)


async def consumer_on_an_exclusive_queue(reader, writer, server):
    await with_channel(reader, writer, server)
    send(writer, 1, commands.Queue.Declare(queue="", exclusive=True))
    ok = await expect(reader, commands.Queue.DeclareOk)
    send(writer, 1, commands.Confirm.Select(), commands.Basic.Qos(prefetch_count=10),
         commands.Basic.Consume(queue=ok.queue, consumer_tag="c"))
    await expect(reader, commands.Confirm.SelectOk)
    await expect(reader, commands.Basic.QosOk)
    await expect(reader, commands.Basic.ConsumeOk)
    send(writer, 2, commands.Channel.Open())
    await expect(reader, commands.Channel.OpenOk)
    server.protocols.channels_of_open()
    await close(reader, writer)


async def publisher_and_consumer_of_a_shared_queue(reader, writer, server):
    """Confirmed publishes, a consumer and a basic.get holding unacked messages (requeued at the
    close), an uncommitted transaction: the queue outlives the connection."""
    await with_channel(reader, writer, server)
    send(writer, 1, commands.Queue.Declare(queue="shared", durable=True), commands.Confirm.Select())
    await expect(reader, commands.Queue.DeclareOk)
    await expect(reader, commands.Confirm.SelectOk)
    for n in range(3):
        send(writer, 1, commands.Basic.Publish(routing_key="shared"))
        writer.write(frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties(delivery_mode=2)), 1)
                     + frame.marshal(body.ContentBody(b"%d" % n), 1))
        await expect(reader, commands.Basic.Ack)
    send(writer, 1, commands.Basic.Qos(prefetch_count=1), commands.Basic.Consume(queue="shared", consumer_tag="c"))
    await expect(reader, commands.Basic.QosOk)
    await expect(reader, commands.Basic.ConsumeOk)
    await expect(reader, commands.Basic.Deliver)
    send(writer, 2, commands.Channel.Open(), commands.Basic.Get(queue="shared"), commands.Tx.Select(),
         commands.Basic.Publish(routing_key="shared"))
    writer.write(frame.marshal(header.ContentHeader(0, 0, commands.Basic.Properties()), 2))
    for reply in (commands.Channel.OpenOk, commands.Basic.GetOk, commands.Tx.SelectOk):
        await expect(reader, reply)
    server.protocols.channels_of_open()
    await close(reader, writer)


async def with_heartbeats(reader, writer, server):
    await with_channel(reader, writer, server, heartbeat=10)
    await close(reader, writer)


async def nothing_sent(reader, writer, server):
    await asyncio.sleep(0.05)


async def not_amqp(reader, writer, server):
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    assert await reader.read() == PROTOCOL_HEADER


async def login_refused(reader, writer, server):
    """Refused: the server closes 3 s later (RabbitMQ's silent close); the client goes first."""
    writer.write(PROTOCOL_HEADER)
    await expect(reader, commands.Connection.Start)
    send(writer, 0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                response="\0guest\0wrong"))
    await asyncio.sleep(0.05)


async def closed_by_the_server(reader, writer, server):
    await with_channel(reader, writer, server)
    (proto,) = server.protocols
    proto.conn.close()
    await expect(reader, commands.Connection.Close)
    send(writer, 0, commands.Connection.CloseOk())
    assert await reader.read() == b""


async def handshake_timed_out(reader, writer, server):
    writer.write(PROTOCOL_HEADER)
    await expect(reader, commands.Connection.Start)
    assert await reader.read() == b""  # the server closes it (limits.handshake_timeout)


@pytest.mark.parametrize("scenario", [
    handshake_channel_close, dropped_with_a_channel_open, consumer_on_an_exclusive_queue,
    publisher_and_consumer_of_a_shared_queue, with_heartbeats,
    nothing_sent, not_amqp, login_refused, closed_by_the_server,
], ids=lambda f: f.__name__)
def test_a_closed_connection_is_freed_without_the_cyclic_gc(scenario):
    assert leftovers(scenario) == []


def test_a_connection_closed_by_the_handshake_timeout_is_freed_without_the_cyclic_gc():
    assert leftovers(handshake_timed_out, limits=Limits(handshake_timeout=0.2)) == []


def test_a_tls_connection_is_freed_without_the_cyclic_gc(tmp_path):
    assert leftovers(handshake_channel_close, tls=True, tmp_path=tmp_path) == []


def test_a_tls_connection_dropped_with_a_channel_open_is_freed_without_the_cyclic_gc(tmp_path):
    assert leftovers(dropped_with_a_channel_open, tls=True, tmp_path=tmp_path) == []
