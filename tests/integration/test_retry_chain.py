"""The seeds' dead-lettering patterns end to end, as an application builds them on RabbitMQ:
the back-off retry chain (work queue -> reject -> retry queue with a TTL -> back to the work
queue, x-death counting the attempts, a parking-lot queue after N attempts), a DLQ per work
queue, and draining a DLQ back to where its messages came from.

Every expectation was checked on a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py).
"""

import asyncio

import pika
import pytest

from conftest import drain
from .dlx_helpers import DLRK, DLX, TTL, bodies, deaths, get_n, message_count, wait_count, wait_until

MAX_ATTEMPTS = 3


def attempts(props) -> int:
    """How many times the work queue has rejected this message (0 on the first delivery)."""
    for death in (props.headers or {}).get("x-death", []):
        if death["reason"] == "rejected":
            return death["count"]
    return 0


def retry_topology(ch, names, retry_ttl=50):
    """work exchange -> work queue (DLX: retry exchange) ; retry exchange -> retry queue (TTL,
    DLX: work exchange, the original routing key kept) ; a parking-lot queue."""
    work_x, retry_x = names("work-x"), names("retry-x")
    work, retry, parking = names("work"), names("retry"), names("parking")
    ch.exchange_declare(work_x, "direct")
    ch.exchange_declare(retry_x, "fanout")
    ch.queue_declare(work, durable=True, arguments={DLX: retry_x})
    ch.queue_declare(retry, durable=True, arguments={DLX: work_x, TTL: retry_ttl})
    ch.queue_declare(parking, durable=True)
    ch.queue_bind(work, work_x, "task")
    ch.queue_bind(retry, retry_x)
    return work_x, work, retry, parking


def test_retry_chain_with_a_parking_lot(connection, channel, names):
    work_x, work, retry, parking = retry_topology(channel, names)
    seen = []

    def handle(ch, method, props, body):
        n = attempts(props)
        seen.append((body, n, method.exchange, method.routing_key,
                     [(d["queue"], d["reason"], d["count"]) for d in (props.headers or {}).get("x-death", [])]))
        if n + 1 >= MAX_ATTEMPTS:
            ch.basic_publish("", parking, body, props)  # give up: park it, history included
            ch.basic_ack(method.delivery_tag)
        else:
            ch.basic_reject(method.delivery_tag, requeue=False)  # retry later

    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(work, handle)
    channel.basic_publish(work_x, "task", b"job-1", pika.BasicProperties(delivery_mode=2, message_id="1"))
    wait_until(lambda: connection.process_data_events(0.01) or len(seen) == MAX_ATTEMPTS, timeout=10)
    assert seen == [
        (b"job-1", 0, work_x, "task", []),
        (b"job-1", 1, work_x, "task", [(retry, "expired", 1), (work, "rejected", 1)]),
        (b"job-1", 2, work_x, "task", [(retry, "expired", 2), (work, "rejected", 2)]),
    ]
    ((_, props, body),) = get_n(channel, parking, 1)
    assert (body, props.message_id, props.delivery_mode) == (b"job-1", "1", 2)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [
        (retry, "expired", 2), (work, "rejected", 2)]
    assert props.headers["x-first-death-queue"] == work
    assert props.headers["x-first-death-reason"] == "rejected"
    assert (message_count(channel, work), message_count(channel, retry)) == (0, 0)


def test_retry_chain_success_on_a_later_attempt(connection, channel, names):
    work_x, work, retry, parking = retry_topology(channel, names)
    done = []

    def handle(ch, method, props, body):
        if attempts(props) < 1:
            ch.basic_nack(method.delivery_tag, requeue=False)  # first try fails
        else:
            done.append((body, attempts(props)))
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(work, handle)
    for i in range(5):
        channel.basic_publish(work_x, "task", f"job-{i}".encode())
    wait_until(lambda: connection.process_data_events(0.01) or len(done) == 5, timeout=10)
    assert sorted(done) == [(f"job-{i}".encode(), 1) for i in range(5)]
    assert message_count(channel, parking) == 0


def test_a_dead_letter_queue_per_work_queue(channel, names):
    dlx = names("dlx")
    channel.exchange_declare(dlx, "direct")
    pairs = []
    for label in ("orders", "emails"):
        work, dlq = names(label), names(f"{label}-dlq")
        channel.queue_declare(dlq)
        channel.queue_bind(dlq, dlx, work)  # the DLX keeps the original routing key: the work queue's name
        channel.queue_declare(work, arguments={DLX: dlx})
        pairs.append((work, dlq))
    for work, _ in pairs:
        for i in range(2):
            channel.basic_publish("", work, f"{work}:{i}".encode())
    for work, _ in pairs:
        for _ in range(2):
            method, _, _ = wait_until(lambda: _get(channel, work))
            channel.basic_reject(method.delivery_tag, requeue=False)
    for work, dlq in pairs:
        got = get_n(channel, dlq, 2)
        assert bodies(got) == [f"{work}:{i}".encode() for i in range(2)]
        assert {deaths(p)[0]["queue"] for _, p, _ in got} == {work}
        wait_count(channel, dlq, 0)


def _get(ch, q):
    method, props, body = ch.basic_get(q)
    return (method, props, body) if method else None


def test_draining_a_dead_letter_queue_back_to_its_source(channel, names):
    """An operator's drain: take each dead letter, republish it to the exchange and routing
    key it was first published with (x-first-death-exchange and the x-death routing-keys),
    and ack it; the DLQ ends empty, the work queue has them back, in order."""
    work_x, dlx = names("work-x"), names("dlx")
    work, dlq = names("work"), names("dlq")
    channel.exchange_declare(work_x, "topic")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx)
    channel.queue_declare(work, arguments={DLX: dlx, DLRK: "dead"})
    channel.queue_bind(work, work_x, "jobs.#")
    for i in range(3):
        channel.basic_publish(work_x, f"jobs.{i}", str(i).encode(), pika.BasicProperties(headers={"n": i}))
    for _ in range(3):
        method, _, _ = wait_until(lambda: _get(channel, work))
        channel.basic_reject(method.delivery_tag, requeue=False)
    wait_count(channel, dlq, 3)
    drained = 0
    while True:
        method, props, body = channel.basic_get(dlq)
        if method is None:
            break
        first = props.headers["x-death"][-1]  # the oldest entry: where the message started
        assert first["queue"] == props.headers["x-first-death-queue"] == work
        channel.basic_publish(props.headers["x-first-death-exchange"], first["routing-keys"][0], body, props)
        channel.basic_ack(method.delivery_tag)
        drained += 1
    assert drained == 3
    assert message_count(channel, dlq) == 0
    got = get_n(channel, work, 3)
    assert [(b, m.routing_key, p.headers["n"]) for m, p, b in got] == [(str(i).encode(), f"jobs.{i}", i)
                                                                       for i in range(3)]
    # The history travels with them (a new rejection from work would make the count 2).
    method, props, body = got[0]
    assert [(d["queue"], d["count"]) for d in deaths(props)] == [(work, 1)]
    assert drain(channel, work) == []


@pytest.mark.asyncio
async def test_aio_pika_retry_chain(broker, uid):
    import aio_pika

    connection = await aio_pika.connect(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        work_x = await channel.declare_exchange(f"aio-work-x-{uid}", aio_pika.ExchangeType.DIRECT, auto_delete=True)
        retry_x = await channel.declare_exchange(f"aio-retry-x-{uid}", aio_pika.ExchangeType.FANOUT, auto_delete=True)
        work = await channel.declare_queue(f"aio-work-{uid}", auto_delete=True, arguments={DLX: retry_x.name})
        retry = await channel.declare_queue(f"aio-retry-{uid}", auto_delete=True, arguments={
            DLX: work_x.name, TTL: 50})
        parking = await channel.declare_queue(f"aio-parking-{uid}", auto_delete=True)
        await work.bind(work_x, "task")
        await retry.bind(retry_x)
        await work_x.publish(aio_pika.Message(b"job"), routing_key="task")
        counts = []
        async with work.iterator() as it:
            async for message in it:
                n = 0
                for death in (message.headers or {}).get("x-death", []):
                    if death["reason"] == "rejected":
                        n = death["count"]
                counts.append(n)
                if n + 1 >= MAX_ATTEMPTS:
                    await channel.default_exchange.publish(
                        aio_pika.Message(message.body, headers=message.headers), routing_key=parking.name)
                    await message.ack()
                    break
                await message.reject(requeue=False)
        assert counts == [0, 1, 2]
        parked = None
        for _ in range(250):
            parked = await parking.get(fail=False, no_ack=True)
            if parked is not None:
                break
            await asyncio.sleep(0.02)
        assert parked is not None and parked.body == b"job"
        assert [(d["queue"], d["reason"], d["count"]) for d in parked.headers["x-death"]] == [
            (retry.name, "expired", 2), (work.name, "rejected", 2)]
