"""kill -9 and big persistent bodies held back (warren.store.persister): Warren confirms such a
message once every queue it went to has settled it or fsynced it (RabbitMQ's confirm on ack),
and never writes one acked first. Only an acked message may be missing after a crash: one
delivered but not acked, or requeued, was on disk before its confirm."""

import glob
import os
import random
import signal
import threading

import pika
import pytest

from warren.store import segments as sg

from .publishing import kill_while_running

BODY = 128 << 10  # over the hold threshold (64 KiB)
PERSISTENT = pika.BasicProperties(delivery_mode=2)
ROUNDS = 5


def _body(n: int) -> bytes:
    return b"%d " % n + b"x" * (BODY - 24)


def _number(body: bytes) -> int:
    return int(body.split(b" ", 1)[0])


def _records(data_dir: str) -> int:
    """Records written to the segment files of every queue."""
    count = 0
    for path in glob.glob(os.path.join(data_dir, "queues", "*", "*.seg")):
        with open(path, "rb") as f:
            count += len(sg.scan(f.read())[0])
    return count


def test_delivered_but_unacked_is_on_disk_at_its_confirm(make_broker, restart_broker):
    b = make_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("held", durable=True)
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume("held", lambda c, m, p, body: got.append(body))  # never acked
    pub = pika.BlockingConnection(b.pika_params())
    pch = pub.channel()
    pch.confirm_delivery()
    pch.basic_publish("", "held", _body(1), PERSISTENT)  # returns at its confirm
    conn.process_data_events(0.2)
    assert [_number(x) for x in got] == [1]
    b = restart_broker(b, sig=signal.SIGKILL)
    with pika.BlockingConnection(b.pika_params()) as conn:
        method, _props, body = conn.channel().basic_get("held", auto_ack=True)
        assert method is not None and body == _body(1) and method.redelivered


def test_acked_before_its_write_is_never_written(make_broker):
    b = make_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("held", durable=True)
    ch.basic_consume("held", lambda c, m, p, body: c.basic_ack(m.delivery_tag))
    pub = pika.BlockingConnection(b.pika_params())
    pch = pub.channel()
    pch.confirm_delivery()
    done = threading.Event()

    def publish():
        for n in range(20):
            pch.basic_publish("", "held", _body(n), PERSISTENT)  # each waits for its confirm
        done.set()

    t = threading.Thread(target=publish)
    t.start()
    while not done.is_set():
        conn.process_data_events(0.05)
    t.join()
    pub.close()
    conn.close()
    assert _records(b.data_dir) == 0


def _consumer(params, stop: threading.Event, acked: set, rng: random.Random) -> None:
    """Acks most deliveries, leaves some unacked, gives some back (requeue)."""
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=40)
        kept: list[int] = []
        for method, _props, body in ch.consume("held", inactivity_timeout=0.05):
            if stop.is_set():
                break
            if method is None:
                continue
            roll = rng.random()
            if roll < 0.75:
                ch.basic_ack(method.delivery_tag)
                acked.add(_number(body))
            elif roll < 0.85:
                ch.basic_nack(method.delivery_tag, requeue=True)
            else:
                kept.append(method.delivery_tag)  # delivered, never acked
                if len(kept) > 20:
                    ch.basic_nack(kept.pop(0), requeue=True)
    except (pika.exceptions.AMQPError, OSError):
        pass


def _publisher(params, stop: threading.Event, confirmed: list, first: int) -> None:
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()
        n = first
        while not stop.is_set():
            ch.basic_publish("", "held", _body(n), PERSISTENT)
            confirmed.append(n)
            n += 1
    except (pika.exceptions.AMQPError, OSError):
        pass


@pytest.mark.timeout(300)
def test_confirmed_big_bodies_survive_kill9_unless_acked(make_broker, restart_broker):
    rng = random.Random()
    b = make_broker()
    with pika.BlockingConnection(b.pika_params()) as conn:
        conn.channel().queue_declare("held", durable=True)
    confirmed: list[int] = []
    acked: set[int] = set()
    for r in range(ROUNDS):
        stop = threading.Event()
        b = kill_while_running(b, restart_broker, stop, [(_publisher, (b.pika_params(), stop, confirmed, r * 1_000_000)),
                                                         (_consumer, (b.pika_params(), stop, acked, rng))],
                               rng.uniform(0.5, 1.5))
    recovered = set()
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get("held", auto_ack=True)
            if method is None:
                break
            recovered.add(_number(body))
    assert len(confirmed) > 50, "the publisher barely ran"
    assert len(acked) > 20, "the consumer barely ran"
    lost = set(confirmed) - acked - recovered
    assert not lost, f"{len(lost)} confirmed, unacked messages lost, e.g. {sorted(lost)[:10]}"
