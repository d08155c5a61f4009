"""A client's connection.close while it still has channels open: what comes back and when.

aiormq 7.2.4's upstream test `test_connection_close_during_publish_drain` closes a
connection (with its own ConnectionClosed) while a publish waits for its frames to drain,
and expects that publish to fail with that same error. aiormq has a race there: if the
close-ok arrives while its writer is still finishing the write of connection.close (before
it starts waiting for the reader to see the close-ok), the reader's done-callback can close
the connection a second time with no error, and the pending futures get a bare Exception.
RabbitMQ answers close-ok only after its channel processes have exited (0.2 to 0.7 ms after
the close); Warren answered in about 0.1 ms, inside that window, and the test failed 3 of 20
runs under uvloop and nearly always under asyncio's own loop. Warren now sends the close-ok
of a connection with open channels 1 to 2 ms after the close (CLOSE_OK_DELAY).
"""

import asyncio
import socket
import time

import pytest
from pamqp import commands

from conftest import EXTERNAL
from rawamqp import ConnectionEOF, connect

CLOSE = commands.Connection.Close(reply_code=320, reply_text="CONNECTION_FORCED", class_id=0, method_id=0)


def test_close_ok_is_the_last_frame_and_the_socket_waits_for_the_client(broker):
    """Both brokers: close-ok is the only answer, the socket stays open until the client
    closes its side, then the broker closes (RabbitMQ resets it: linger 0). Warren: the
    close-ok of a connection with open channels comes at least a millisecond after the
    close, as RabbitMQ's comes once its channel processes have exited."""
    for _ in range(5):
        with connect(broker, heartbeat=60) as client:
            client.open_channel(1)
            client.call(1, commands.Confirm.Select())
            client.open_channel(2)
            sent = time.monotonic()
            client.send_method(0, CLOSE)
            client.expect(commands.Connection.CloseOk, 0)
            waited = time.monotonic() - sent
            if not EXTERNAL:
                assert waited >= 0.001, f"close-ok {waited * 1e6:.0f} us after connection.close"
            with pytest.raises(TimeoutError):  # nothing after close-ok, and no close
                client.read_frame(0.2, skip_heartbeats=False)
            client.sock.shutdown(socket.SHUT_WR)
            with pytest.raises(ConnectionEOF):  # a reset counts as the close too
                client.read_frame(5)


@pytest.mark.asyncio
async def test_aiormq_close_during_publish_drain(broker):
    """aiormq's upstream test, five times over, on asyncio's own event loop (where its
    window is widest): the publish waiting for its drain fails with the error the
    connection was closed with, never with the bare Exception of a second, error-less close."""
    if EXTERNAL:
        pytest.skip("RabbitMQ's close-ok lands in aiormq's race window on asyncio's own loop "
                    "too (32 of 50 runs fail against 3.10.8); Warren's is later")
    aiormq = pytest.importorskip("aiormq")
    from aiormq.exceptions import ConnectionClosed

    for attempt in range(5):
        connection = aiormq.Connection(f"amqp://guest:guest@{broker.host}:{broker.port}//")
        await connection.connect()
        try:
            channel = await connection.channel()
            entered = asyncio.Event()

            class HeldQueue:
                """The channel's write queue, holding the publish frames: the publish then
                waits for a drain that only the close ends."""

                async def put(self, frame):
                    entered.set()

            channel.write_queue = HeldQueue()
            publish = asyncio.create_task(channel.basic_publish(b"test"))
            await asyncio.wait_for(entered.wait(), 2)
            error = ConnectionClosed(320, "CONNECTION_FORCED")
            await connection.close(error)
            with pytest.raises(ConnectionClosed) as raised:
                await publish
            assert raised.value is error, f"attempt {attempt}: {raised.value!r}"
        finally:
            await connection.close()
