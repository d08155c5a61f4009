"""A queue is a buffer for consumers that are slow, and a publisher its consumers keep up
with is held to their pace (warren.broker.queue_flow, issue 17).

- Consumers that hold their prefetch full, or that stopped reading their socket, never hold
  a publisher back for long: its confirms all come, as on RabbitMQ (both brokers).
- A publisher flooding a queue whose consumer takes everything it can gets no further ahead
  than a small backlog: the broker's memory stays flat and the publisher's connection shows
  `flow` (Warren only: it reads the broker's RSS).
"""

import socket
import threading
import time

import pika
import pytest
import requests
from pamqp import commands

import rawamqp
from conftest import EXTERNAL

from .test_memory_bounds import rss_mb

BODY = b"b" * (64 << 10)
COUNT = 768  # 48 MiB: three times the backlog at which Warren holds a publisher


def _publish_confirmed(broker, queue: str, count: int, body: bytes, seconds: float) -> float:
    """Publish `count` bodies to `queue` with confirms (pika waits for each); the time taken."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        started = time.monotonic()
        for _ in range(count):
            ch.basic_publish("", queue, body)  # raises if nacked or returned
            assert time.monotonic() - started < seconds, "the publisher was held back"
        return time.monotonic() - started
    finally:
        conn.close()


def test_a_consumer_with_its_prefetch_full_does_not_hold_a_publisher(broker, channel, names):
    q = names("qf-prefetch")
    channel.queue_declare(q)
    cons = pika.BlockingConnection(broker.pika_params())
    try:
        cch = cons.channel()
        cch.basic_qos(prefetch_count=1)
        got = []
        cch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))  # never acks
        cons.process_data_events(time_limit=0.2)
        _publish_confirmed(broker, q, COUNT, BODY, seconds=60)
        cons.process_data_events(time_limit=0.2)
        assert got == [1]
        assert channel.queue_declare(q, passive=True).method.message_count == COUNT - 1
    finally:
        cons.close()


def test_a_consumer_that_stopped_reading_does_not_hold_a_publisher(broker, channel, names):
    """An auto-ack consumer that never reads: it has credit, but takes nothing once the
    broker's buffer for it is full."""
    q = names("qf-unread")
    channel.queue_declare(q)
    raw = rawamqp.RawClient(broker.host, broker.port)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.handshake()
    raw.open_channel(1)
    raw.call(1, commands.Basic.Consume(queue=q, consumer_tag="unread", no_ack=True))
    try:
        _publish_confirmed(broker, q, COUNT, BODY, seconds=60)
    finally:
        raw.sock.close()


@pytest.mark.skipif(bool(EXTERNAL), reason="reads the broker's RSS and Warren's connection state")
def test_a_flood_into_a_consumed_queue_stays_a_small_backlog(make_broker, uid):
    b = make_broker()
    q = f"qf-flood-{uid}"
    body = b"f" * (1 << 20)
    total = 600  # 600 MiB through the queue
    setup = pika.BlockingConnection(b.pika_params())
    setup.channel().queue_declare(q)
    setup.close()
    consumed = []
    ready = threading.Event()

    def consume() -> None:
        conn = pika.BlockingConnection(b.pika_params())
        ch = conn.channel()
        ch.basic_consume(q, lambda c, m, p, body_: consumed.append(len(body_)), auto_ack=True)
        ready.set()
        deadline = time.monotonic() + 120
        while len(consumed) < total and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        conn.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert ready.wait(10)
    base = rss_mb(b.proc.pid)
    peak, states = base, set()
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(b.proc.pid))
            r = requests.get(f"{b.api}/connections", auth=("guest", "guest"), timeout=10)
            states.update(c["state"] for c in r.json())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    pub = pika.BlockingConnection(b.pika_params())
    ch = pub.channel()
    for _ in range(total):
        ch.basic_publish("", q, body)  # no confirms: as fast as the broker reads
    pub.close()
    consumer.join(150)
    done.set()
    watcher.join(10)
    assert len(consumed) == total and set(consumed) == {len(body)}
    assert "flow" in states
    # Without the hold the backlog grew to hundreds of MB (the consumer is slower than the
    # publisher); with it, a few times the 16 MiB mark, whatever is in flight.
    assert peak - base < 150, (base, peak)
