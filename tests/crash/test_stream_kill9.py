"""kill -9 while a stream is published to (with confirms) and read by consumers, six times in
a row: no confirmed entry is lost, the offsets stay contiguous (no hole, no offset twice),
and an offset a consumer saw before a crash still holds the same message after it (a
consumer re-reading a range, as a Spark job does after a failure, gets the same entries)."""

import random
import threading

import pika

from .publishing import confirmed_publisher, kill_while_running

ROUNDS = 6


def _reader(params, stop: threading.Event, seen: dict) -> None:
    """Read the stream from its start, recording offset -> body."""
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        for method, props, body in ch.consume("log", inactivity_timeout=0.05,
                                              arguments={"x-stream-offset": "first"}):
            if stop.is_set():
                break
            if method is not None:
                seen.setdefault(props.headers["x-stream-offset"], []).append(int(body))
                ch.basic_ack(method.delivery_tag)
    except (pika.exceptions.AMQPError, OSError):
        pass


def _read_all(params) -> list[tuple[int, int]]:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    total = ch.queue_declare("log", durable=True, passive=True, arguments={"x-queue-type": "stream"})
    got: list[tuple[int, int]] = []
    for method, props, body in ch.consume("log", inactivity_timeout=1.0, arguments={"x-stream-offset": "first"}):
        if method is None:
            break
        got.append((props.headers["x-stream-offset"], int(body)))
        ch.basic_ack(method.delivery_tag)
    conn.close()
    assert total.method.message_count == len(got)
    return got


def test_a_stream_survives_kill9_while_written_and_read(make_broker, restart_broker):
    rng = random.Random()
    b = make_broker()
    with pika.BlockingConnection(b.pika_params()) as conn:
        conn.channel().queue_declare("log", durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 200_000})
    confirmed: list[int] = []
    seen: dict[int, list[int]] = {}
    for r in range(ROUNDS):
        stop = threading.Event()
        b = kill_while_running(b, restart_broker, stop,
                               [(confirmed_publisher, (b.pika_params(), "log", stop, confirmed, r * 10_000_000, False)),
                                (_reader, (b.pika_params(), stop, seen))], rng.uniform(0.4, 1.0))
    entries = _read_all(b.pika_params())
    offsets = [o for o, _ in entries]
    bodies = [v for _, v in entries]
    assert len(confirmed) > 1000, "the publisher barely ran"
    assert offsets == list(range(len(entries))), "offsets are not contiguous from 0"
    assert len(set(bodies)) == len(bodies), "a message is in the stream twice"
    lost = set(confirmed) - set(bodies)
    assert not lost, f"{len(lost)} confirmed entries lost, e.g. {sorted(lost)[:10]}"
    by_offset = dict(entries)
    changed = {o: (v, by_offset.get(o)) for o, vs in seen.items() for v in vs if by_offset.get(o) != v}
    assert sum(len(v) for v in seen.values()) > 1000, "the readers barely ran"
    assert not changed, f"offsets seen before a crash hold other entries after it: {list(changed.items())[:5]}"
    assert "Traceback" not in b.log()
