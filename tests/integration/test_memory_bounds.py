"""Memory a client can make the broker hold: a client that never reads its socket, and a
drained flood (issue 8). The bounds are generous; the defects they catch were hundreds of MB.
"""

import socket
import time

import pika
from pamqp import commands

import rawamqp
from conftest import process_memory

MB = 1 << 20


def rss_mb(pid: int) -> float:
    return process_memory(pid) / (1 << 20)


def settled_rss(pid: int, seconds: float = 1.0) -> float:
    time.sleep(seconds)
    return rss_mb(pid)


def _get_reject(count: int, queue: str) -> bytes:
    """`count` pipelined basic.get (ack mode) + basic.reject(requeue) pairs on channel 1."""
    get = rawamqp.frame(1, 1, rawamqp.method_payload(commands.Basic.Get(queue=queue, no_ack=False)))
    return b"".join(get + rawamqp.frame(1, 1, rawamqp.method_payload(
        commands.Basic.Reject(delivery_tag=tag, requeue=True))) for tag in range(1, count + 1))


def _send_without_reading(raw: rawamqp.RawClient, data: bytes, seconds: float) -> int:
    """Send as much of `data` as the broker takes within `seconds`, never reading."""
    raw.sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += raw.sock.send(data[sent:sent + 65536])
        except BlockingIOError:
            time.sleep(0.01)
    return sent


def _client(broker, small_receive_buffer=True) -> rawamqp.RawClient:
    raw = rawamqp.RawClient(broker.host, broker.port)
    if small_receive_buffer:  # less for the kernel to absorb (but slow to read from)
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.handshake()
    raw.open_channel(1)
    return raw


def test_big_message_fetched_again_and_again_by_a_client_that_never_reads(make_broker, uid):
    """One 4 MiB message, fetched and requeued 64 times in one pipelined burst by a client
    that reads nothing: the broker held a copy per get (+252 MB); RabbitMQ holds +0."""
    b = make_broker()
    queue = f"big-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"y" * (4 * MB))
        ch.queue_declare(queue, passive=True)
    before = settled_rss(b.proc.pid)
    raw = _client(b)
    data = _get_reject(64, queue)
    assert _send_without_reading(raw, data, 5.0) == len(data)
    grown = settled_rss(b.proc.pid, 2.0) - before
    assert grown < 40, f"broker grew by {grown:.0f} MB for a client that does not read"
    raw.sock.close()


def test_pipelined_gets_from_a_client_that_never_reads(make_broker, uid):
    """200,000 pipelined basic.gets from a client that never reads: the broker stops reading
    once its output buffer is full, instead of answering them all into memory (+427 MB)."""
    b = make_broker()
    queue = f"gets-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        for _ in range(100):
            ch.basic_publish("", queue, b"x" * 1000)
        ch.queue_declare(queue, passive=True)
    before = settled_rss(b.proc.pid)
    raw = _client(b)
    data = _get_reject(200_000, queue)
    sent = _send_without_reading(raw, data, 8.0)
    assert sent < len(data), "the broker read every get although nothing was read back"
    grown = settled_rss(b.proc.pid, 2.0) - before
    assert grown < 60, f"broker grew by {grown:.0f} MB for a client that does not read"
    raw.sock.close()


def test_held_back_gets_are_all_answered_once_the_client_reads(broker, uid):
    """Input held back while output drains is processed afterwards, in order, with nothing
    lost (also when the client stops sending: nothing else would wake the connection)."""
    queue = f"held-{uid}"
    count = 24
    with pika.BlockingConnection(broker.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, auto_delete=True)
        ch.basic_publish("", queue, b"z" * (2 * MB))
        ch.queue_declare(queue, passive=True)
        raw = _client(broker, small_receive_buffer=False)
        data = _get_reject(count, queue)
        assert _send_without_reading(raw, data, 5.0) == len(data)
        time.sleep(1.0)
        raw.sock.setblocking(True)
        for tag in range(1, count + 1):
            get_ok = raw.expect(commands.Basic.GetOk, 1, timeout=10)
            assert get_ok.delivery_tag == tag
            assert get_ok.redelivered == (tag > 1)
            _header, body = raw.read_content(timeout=10)
            assert len(body) == 2 * MB
        raw.close()


def test_memory_is_given_back_after_a_flood_is_drained(make_broker, uid):
    """After ~600 MB of messages are published and consumed, RSS returns near where it
    started (it stayed at its peak: 3.3 GB after a 3 GB flood)."""
    b = make_broker()
    queue = f"flood-{uid}"
    before = settled_rss(b.proc.pid)
    body = b"f" * 20_000
    count = 30_000
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        for _ in range(count):
            ch.basic_publish("", queue, body)
        assert ch.queue_declare(queue, passive=True).method.message_count == count
        peak = rss_mb(b.proc.pid)
        assert peak - before > 300, "the flood did not reach memory: the test proves nothing"
        got = 0
        for method, _props, _body in ch.consume(queue, auto_ack=True, inactivity_timeout=3):
            if method is None:
                break
            got += 1
        assert got == count
    deadline = time.monotonic() + 20
    while rss_mb(b.proc.pid) - before > 60 and time.monotonic() < deadline:
        time.sleep(0.5)
    after = rss_mb(b.proc.pid)
    print(f"RSS before {before:.0f} MB, peak {peak:.0f} MB, after drain {after:.0f} MB")
    assert after - before < 60, f"RSS stayed at {after:.0f} MB after draining (started at {before:.0f}, peak {peak:.0f})"
