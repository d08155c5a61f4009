"""kill -9 while persistent messages are dead-lettered from a durable queue to a durable queue
(rejected by a consumer, or expired by a TTL): no confirmed message is ever lost. Warren holds
a dead-lettered message in its source until the copy in the target is fsynced, so at any
instant a confirmed message is in one queue or the other (or, after a crash at the wrong
moment, in both: at least once). RabbitMQ's classic queues do not promise this."""

import random
import threading
import time

import pika
import pytest

from .publishing import confirmed_publisher, kill_while_running

ROUNDS = 6


def _rejecter(params, stop: threading.Event, rejected: list) -> None:
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)
        for method, _props, body in ch.consume("work", inactivity_timeout=0.05):
            if stop.is_set():
                break
            if method is not None:
                ch.basic_reject(method.delivery_tag, requeue=False)
                rejected.append(int(body))
    except (pika.exceptions.AMQPError, OSError):
        pass


def _drain(ch, queue) -> list[int]:
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(int(body))


@pytest.mark.parametrize("reason", ["rejected", "expired"])
def test_dead_lettered_persistent_messages_survive_kill9(make_broker, restart_broker, reason):
    rng = random.Random()
    b = make_broker()
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
        if reason == "expired":
            args["x-message-ttl"] = 2
        ch.queue_declare("work", durable=True, arguments=args)
        ch.queue_declare("dlq", durable=True)
    confirmed: list[int] = []
    rejected: list[int] = []
    for r in range(ROUNDS):
        stop = threading.Event()
        targets = [(confirmed_publisher, (b.pika_params(), "work", stop, confirmed, r * 10_000_000))]
        if reason == "rejected":
            targets.append((_rejecter, (b.pika_params(), stop, rejected)))
        # (killed while messages are being dead-lettered)
        b = kill_while_running(b, restart_broker, stop, targets, rng.uniform(0.3, 0.9))
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        if reason == "expired":
            time.sleep(0.05)  # whatever the restart recovered expires too
        work, dlq = _drain(ch, "work"), _drain(ch, "dlq")
    assert len(confirmed) > 500, "the publisher barely ran"
    assert len(dlq) > len(confirmed) // 4, "little was dead-lettered: the test did not exercise it"
    lost = set(confirmed) - set(work) - set(dlq)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
    if reason == "rejected":
        assert rejected
    assert "Traceback" not in b.log()
