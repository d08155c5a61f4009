"""The Spark source's range reads (warren.spark.broker.read_range) are exact on both brokers:
every entry of [start, end) once, in order, nothing past the end, for ranges much bigger than
the reader's credit (its acks must grant exactly what the range needs), and starting inside a
chunk of many entries (RabbitMQ then delivers the chunk's earlier entries too)."""

import time

import pika
import pytest

aiormq = pytest.importorskip("aiormq")

from warren.spark import broker as wb  # noqa: E402
from warren.spark.connection import endpoint  # noqa: E402
from warren.spark.offsets import StreamRange  # noqa: E402


def test_big_ranges_are_read_exactly(broker, names):
    s = names("sr-big")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream"})
    total = 2 * wb.PREFETCH + 3 * wb.ACK_EVERY + 123
    for i in range(total):  # no confirms: published in bursts, many entries per chunk
        ch.basic_publish("", s, b"%d" % i)
    conn.close()
    ep = endpoint({"uri": f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"})
    deadline = time.monotonic() + 30
    while wb.run(wb.stream_offsets(ep, [s]))[s] != (0, total):
        assert time.monotonic() < deadline, wb.run(wb.stream_offsets(ep, [s]))
        time.sleep(0.2)
    for start, end in ((0, total), (777, total - 5), (wb.PREFETCH + 1, wb.PREFETCH + 2)):
        got: list[tuple[int, bytes]] = []
        count = wb.read_range(ep, StreamRange(s, start, end), True, lambda b, *rest: got.append((rest[3], b)))
        assert count == end - start
        assert got == [(o, b"%d" % o) for o in range(start, end)]
