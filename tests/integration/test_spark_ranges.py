"""The Spark source's range reads (warren.spark.broker.read_range) are exact on both brokers:
every entry of [start, end) once, in order, nothing past the end, for ranges much bigger than
the reader's credit (its acks must grant exactly what the range needs), and starting inside a
chunk of many entries (RabbitMQ then delivers the chunk's earlier entries too)."""

import time

import pika
import pytest
from conftest import EXTERNAL, RABBITMQ

aiormq = pytest.importorskip("aiormq")

from warren.spark import broker as wb  # noqa: E402
from warren.spark.connection import endpoint  # noqa: E402
from warren.spark.offsets import StreamRange  # noqa: E402


@pytest.fixture(params=["as-the-broker-offers", "entry-by-entry"])
def reads(request, monkeypatch):
    """Warren offers record batches; the tests also read it entry by entry, as RabbitMQ is read
    (the credit that must grant exactly what a range needs)."""
    if request.param == "entry-by-entry":
        monkeypatch.setattr(wb, "_has_record_batches", lambda wire: False)
    return request.param


def test_big_ranges_are_read_exactly(broker, names, reads):
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


def test_a_range_read_pauses_and_resumes_in_steps(broker, names, reads):
    """range_reader(every=N) hands its rows over every N entries (a partition's Arrow batches)
    and picks up where it paused, also around bodies spanning several frames (frame_max is
    128 KiB) and a content header alone in its frame (an empty body)."""
    s = names("sr-steps")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    bodies = [b"%d:" % i + (b"x" * (300_000 if i % 10 == 3 else 0 if i % 10 == 7 else 100)) for i in range(95)]
    bodies[7] = b""
    for body in bodies:
        ch.basic_publish("", s, body)
    conn.close()
    ep = endpoint({"uri": f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"})
    got: list[tuple[int, bytes]] = []
    steps = [(n, len(got)) for n in wb.range_reader(ep, StreamRange(s, 5, 95), True,
                                                     lambda b, *rest: got.append((rest[3], b)), every=20)]
    assert steps == [(20, 20), (40, 40), (60, 60), (80, 80), (90, 90)]
    assert got == [(o, bodies[o]) for o in range(5, 95)]


def test_a_range_read_in_columns(broker, names, reads):
    """With on_entries, record batches' entries come a column at a time (at least `every` of them
    a call, but the last) and entries read one a delivery still come to on_message: the same
    rows either way, from inside a record batch to the range's end."""
    s = names("sr-columns")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    bodies = [b"%d:" % i + b"y" * (200_000 if i % 50 == 3 else i % 20) for i in range(400)]
    for i, body in enumerate(bodies):
        ch.basic_publish("", s, body, pika.BasicProperties(message_id=f"m{i % 3}"))
    conn.close()
    ep = endpoint({"uri": f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"})
    rows: list[tuple] = []
    calls: list[int] = []

    def on_entries(entries, stream):
        assert stream == s
        calls.append(len(entries))
        rows.extend((o, x, k, p.message_id, b) for o, x, k, p, b in entries.rows())
    steps = list(wb.range_reader(ep, StreamRange(s, 7, 390), True,
                                 lambda b, x, k, stream, o, r, p: rows.append((o, x, k, p.message_id, b)),
                                 every=100, on_entries=on_entries))
    assert rows == [(o, "", s, f"m{o % 3}", bodies[o]) for o in range(7, 390)]
    assert steps[-1] == 383
    if not RABBITMQ and reads == "as-the-broker-offers":  # (RabbitMQ has no record batches)
        assert sum(calls) == 383 and all(n >= 100 for n in calls[:-1]) and len(steps) == len(calls) + 1
    else:
        assert calls == []


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_overtaking_a_read_is_data_loss(broker, names, reads, fail_on_data_loss, caplog):
    """Retention that removes entries of a range while it is being read (after its first
    entries) fails the read, or with failOnDataLoss=false is skipped with a warning: the
    range never ends short without saying so."""
    s = names("sr-overtaken")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream", "x-max-length-bytes": 2_000_000,
                                                 "x-stream-max-segment-size-bytes": 20_000})
    total = 3 * wb.PREFETCH
    body = b"x" * 100
    for _ in range(total):
        ch.basic_publish("", s, body)
    ep = endpoint({"uri": f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"})
    deadline = time.monotonic() + 30
    while wb.run(wb.stream_offsets(ep, [s]))[s][1] < total:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert wb.run(wb.stream_offsets(ep, [s]))[s][0] == 0
    got: list[int] = []
    reader = wb.range_reader(ep, StreamRange(s, 0, total), fail_on_data_loss,
                             lambda b, *rest: got.append(rest[3]), every=5)
    assert next(reader) == 5
    while wb.run(wb.stream_offsets(ep, [s]))[s][0] < total:  # retention removes the whole range
        assert time.monotonic() < deadline
        for _ in range(1000):
            ch.basic_publish("", s, body)
    conn.close()
    if fail_on_data_loss:
        with pytest.raises(wb.DataLoss, match="are gone"):
            list(reader)
    else:
        with caplog.at_level("WARNING", logger="warren.spark"):
            taken = list(reader)[-1]
        assert taken == len(got) < total
        assert [m for m in caplog.messages if "are gone" in m and "skipped" in m]
    assert 5 <= len(got) < total and got == sorted(got) and got[:5] == [0, 1, 2, 3, 4]
