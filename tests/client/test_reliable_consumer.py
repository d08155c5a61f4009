"""warren.client.ReliableConsumer and the topology helpers against a real `warren server`:
batched acks (and the idle flush of a trickle), poison messages to the DLQ, retries with
growing delays then parking, deduplication of redeliveries, the broker's basic.cancel after
a queue deletion, and drain_dlq."""

import asyncio
import signal
import threading
import time

import pika
import pytest

from tests.conftest import get_all
from warren.client import (MemoryStore, ReliableConsumer, SqliteStore, declare_work_queue,
                           drain_dlq)
from warren.client import blocking

pytestmark = pytest.mark.timeout(60)


def pika_channel(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    return conn, conn.channel()


def publish(broker, queue, *bodies, message_id=None):
    conn, ch = pika_channel(broker)
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(
            message_id=message_id or body.decode(), delivery_mode=2))
    conn.close()


def ready(broker, queue) -> int:
    conn, ch = pika_channel(broker)
    count = ch.queue_declare(queue, passive=True).method.message_count
    conn.close()
    return count


def take(broker, queue) -> list:
    """(body, headers) of every ready message of `queue`."""
    conn, ch = pika_channel(broker)
    got = [(body, props.headers or {}) for _, props, body in get_all(ch, queue)]
    conn.close()
    return got


def delete(broker, *queues):
    conn, ch = pika_channel(broker)
    for q in queues:
        ch.queue_delete(q)
    conn.close()


def text(value) -> str:
    """pika gives AMQP long strings as bytes."""
    return value.decode() if isinstance(value, bytes) else value


async def until(condition, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def ready_becomes(broker, queue, expected, timeout=3.0):
    deadline = time.monotonic() + timeout
    while (count := await asyncio.to_thread(ready, broker, queue)) != expected:
        assert time.monotonic() < deadline, f"{queue}: {count} ready, expected {expected}"
        await asyncio.sleep(0.05)


async def crash(task):
    """End a consumer without its final ack flush (its connection closes, so the broker
    requeues whatever was not acked)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.asyncio
async def test_acks_in_batches(broker, uid):
    q = f"rc-{uid}"
    await declare_work_queue(broker.url, q, retry_delays=(1.0,))
    publish(broker, q, *(str(i).encode() for i in range(10)))
    handled = []
    gate = asyncio.Event()

    async def handler(message):
        if len(handled) == 6:
            await gate.wait()  # holds the 7th: 6 handled, one batch of 4 acked
        handled.append(message.body)

    consumer = ReliableConsumer(broker.url, q, handler, prefetch=10, ack_batch=4, ack_idle=30)
    task = asyncio.create_task(consumer.run())
    await until(lambda: len(handled) == 6, what="6 handled")
    await asyncio.sleep(0.2)
    await crash(task)
    # 4 acked in one basic.ack(multiple); the 2 handled after it were pending: redelivered.
    await ready_becomes(broker, q, 6)
    assert handled == [str(i).encode() for i in range(6)]

    # The rest, acked in batches of 4 and the last 2 by the idle flush; the 2 redelivered
    # ones (redelivered, id already handled) are dropped as duplicates.
    consumer = ReliableConsumer(broker.url, q, handler, prefetch=10, ack_batch=4,
                                ack_idle=0.3, store=consumer.store)
    gate.set()
    handled.clear()
    async with consumer:
        await until(lambda: consumer.handled + consumer.duplicates == 6, what="6 settled")
        assert handled == [str(i).encode() for i in range(6, 10)] and consumer.duplicates == 2
        await ready_becomes(broker, q, 0)

    # A trickle: one message, far below the batch, is acked after ack_idle.
    for idle, left in ((0.2, 0), (30.0, 1)):
        publish(broker, q, b"trickle")
        consumer = ReliableConsumer(broker.url, q, handler, ack_batch=50, ack_idle=idle,
                                    dedup=False)
        handled.clear()
        task = asyncio.create_task(consumer.run())
        await until(lambda: handled == [b"trickle"], what="the trickle")
        await asyncio.sleep(0.6)
        await crash(task)
        await ready_becomes(broker, q, left)

    # A steady trickle, faster than ack_idle: still acked at most ack_idle after handling.
    conn, ch = pika_channel(broker)
    ch.queue_purge(q)  # the unacked "trickle" above
    conn.close()
    times = []

    async def timed(message):
        times.append(time.monotonic())

    consumer = ReliableConsumer(broker.url, q, timed, ack_batch=50, ack_idle=0.3, dedup=False)
    task = asyncio.create_task(consumer.run())
    for i in range(6):
        await asyncio.to_thread(publish, broker, q, b"drip-%d" % i)
        await asyncio.sleep(0.12)
    await until(lambda: len(times) == 6, what="the drips")
    crashed = time.monotonic()
    await crash(task)
    # Handled more than ack_idle (plus a margin for a loaded machine) before the crash: acked.
    recent = sum(1 for t in times if t > crashed - 0.3 - 0.2)
    left = await asyncio.to_thread(ready, broker, q)
    assert left <= recent < 6, (left, recent)
    delete(broker, q, f"{q}.dlq", f"{q}.parking", f"{q}.retry.0")


@pytest.mark.asyncio
async def test_poison_message_goes_to_the_dlq_once(broker, uid):
    q = f"rc-{uid}"
    topology = await declare_work_queue(broker.url, q, retry_delays=(0.2,))
    publish(broker, q, b"good-1", b"bad", b"good-2")
    calls = []

    async def handler(message):
        calls.append(message.body)
        if message.body == b"bad":
            raise ValueError("cannot parse")

    async with ReliableConsumer(broker.url, topology, handler, poison=(ValueError,)) as c:
        await until(lambda: c.handled == 2 and c.rejected == 1)
        await asyncio.sleep(0.5)  # no redelivery, no retry
    assert calls == [b"good-1", b"bad", b"good-2"]
    dead = take(broker, topology.dlq)
    assert [body for body, _ in dead] == [b"bad"]
    assert text(dead[0][1]["x-death"][0]["reason"]) == "rejected"
    assert ready(broker, topology.parking) == 0 and ready(broker, q) == 0
    delete(broker, q, topology.dlq, topology.parking, *topology.retry_queues)


@pytest.mark.asyncio
async def test_failures_are_retried_with_growing_delays_then_parked(broker, uid):
    q = f"rc-{uid}"
    topology = await declare_work_queue(broker.url, q, retry_delays=(0.2, 0.4))
    assert topology.max_attempts == 3
    assert topology.retry_queues == (f"{q}.retry.0", f"{q}.retry.1")
    publish(broker, q, b"always", b"once")
    seen: dict[bytes, list[tuple[float, int]]] = {b"always": [], b"once": []}

    async def handler(message):
        seen[message.body].append((time.monotonic(), message.attempt))
        if message.body == b"always" or len(seen[b"once"]) == 1:
            raise RuntimeError("downstream unavailable")

    async with ReliableConsumer(broker.url, topology, handler) as c:
        await until(lambda: c.parked == 1 and c.handled == 1, timeout=8)
    always = seen[b"always"]
    assert [attempt for _, attempt in always] == [0, 1, 2]
    first, second = always[1][0] - always[0][0], always[2][0] - always[1][0]
    print(f"retry delays observed: {first:.3f}s {second:.3f}s")
    assert 0.18 <= first < 1.5 and 0.38 <= second < 2.0, (first, second)
    assert [attempt for _, attempt in seen[b"once"]] == [0, 1]
    parked = take(broker, topology.parking)
    assert [body for body, _ in parked] == [b"always"]
    headers = parked[0][1]
    assert headers["x-warren-attempt"] == 3
    assert text(headers["x-warren-error"]) == "RuntimeError: downstream unavailable"
    assert ready(broker, topology.dlq) == 0 and ready(broker, q) == 0
    # drain_dlq moves parked (or dead) messages back, attempt count reset.
    publish(broker, topology.dlq, b"dead")
    moved = await drain_dlq(broker.url, topology.dlq, target_queue=topology.parking)
    assert moved == 1 and ready(broker, topology.dlq) == 0
    got = []

    async def collect(message):
        got.append((message.body, message.attempt))

    assert await drain_dlq(broker.url, topology.parking, handler=collect, limit=10) == 1
    assert got == [(b"dead", 0)] and ready(broker, topology.parking) == 0
    delete(broker, q, topology.dlq, topology.parking, *topology.retry_queues)


@pytest.mark.asyncio
async def test_without_retry_topology_a_failure_is_rejected_not_requeued(broker, uid):
    q = f"rc-{uid}"
    topology = await declare_work_queue(broker.url, q, retry_delays=(0.2,))
    publish(broker, q, b"fails")
    calls = []

    async def handler(message):
        calls.append(message.body)
        raise RuntimeError("boom")

    async with ReliableConsumer(broker.url, q, handler) as c:  # a name: no retries
        await until(lambda: c.rejected == 1)
        await asyncio.sleep(0.3)
    assert calls == [b"fails"]
    assert [body for body, _ in take(broker, topology.dlq)] == [b"fails"]
    delete(broker, q, topology.dlq, topology.parking, *topology.retry_queues)


@pytest.mark.asyncio
async def test_redelivered_duplicates_are_dropped_new_messages_are_not(broker, uid, tmp_path):
    q = f"rc-{uid}"
    conn, ch = pika_channel(broker)
    ch.queue_declare(q, durable=True)
    conn.close()
    store = str(tmp_path / "handled.db")
    publish(broker, q, b"first", message_id="id-1")
    handled = []

    async def handler(message):
        handled.append((message.body, message.redelivered))

    async with ReliableConsumer(broker.url, q, handler, ack_batch=1, store=store) as c:
        await until(lambda: c.handled == 1)
    # The same id again, delivered to pika and not acked: the broker redelivers it.
    publish(broker, q, b"again", message_id="id-1")
    conn, ch = pika_channel(broker)
    method, _, body = ch.basic_get(q)
    assert body == b"again" and not method.redelivered
    ch.close()
    conn.close()
    publish(broker, q, b"new", message_id="id-1")
    async with ReliableConsumer(broker.url, q, handler, ack_batch=1, store=store) as c:
        await until(lambda: c.handled == 1 and c.duplicates == 1)
    assert handled == [(b"first", False), (b"new", False)]
    assert ready(broker, q) == 0
    delete(broker, q)


def test_idempotency_stores_are_bounded(tmp_path):
    memory = MemoryStore(size=3)
    for i in range(5):
        memory.add(f"m{i}")
    assert [memory.seen(f"m{i}") for i in range(5)] == [False, False, True, True, True]
    path = str(tmp_path / "ids.db")
    sqlite = SqliteStore(path, size=3)
    for i in range(5):
        sqlite.add(f"m{i}")
    sqlite.add("m2")  # handled again: now the newest
    sqlite.flush()
    sqlite.close()
    sqlite = SqliteStore(path, size=3)
    assert [sqlite.seen(f"m{i}") for i in range(5)] == [False, False, True, True, True]
    sqlite.add("m5")
    sqlite.flush()
    assert not sqlite.seen("m3") and sqlite.seen("m2") and sqlite.seen("m5")
    sqlite.close()


@pytest.mark.asyncio
async def test_queue_deleted_consumer_redeclares_and_consumes_again(broker, uid):
    q = f"rc-{uid}"
    publish_conn, ch = pika_channel(broker)
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 1000})
    publish_conn.close()
    handled = []

    async def handler(message):
        handled.append(message.body)

    async with ReliableConsumer(broker.url, q, handler, ack_batch=1,
                                queue_arguments={"x-max-length": 1000}) as c:
        publish(broker, q, b"before")
        await until(lambda: handled == [b"before"])
        delete(broker, q)
        await until(lambda: c.cancellations == 1, what="basic.cancel")

        def consumers() -> int:
            conn, ch = pika_channel(broker)
            try:
                return ch.queue_declare(q, passive=True).method.consumer_count
            except pika.exceptions.ChannelClosedByBroker:
                return 0
            finally:
                if conn.is_open:
                    conn.close()

        deadline = time.monotonic() + 5
        while await asyncio.to_thread(consumers) != 1:
            assert time.monotonic() < deadline, "not consuming again"
            await asyncio.sleep(0.05)
        publish(broker, q, b"after")
        await until(lambda: handled == [b"before", b"after"])
    delete(broker, q)


@pytest.mark.asyncio
async def test_reconnects_after_broker_restart(make_broker, uid):
    own = make_broker()
    q = f"rc-{uid}"
    conn = pika.BlockingConnection(own.pika_params())
    conn.channel().queue_declare(q, durable=True)
    conn.close()
    handled = []

    async def handler(message):
        handled.append((message.body, message.redelivered))

    # ack_idle=30: "before" is handled but its ack still pending when the broker dies.
    consumer = ReliableConsumer(own.url, q, handler, ack_batch=10, ack_idle=30,
                                reconnect_delay=0.1)
    async with consumer:
        publish(own, q, b"before")
        await until(lambda: len(handled) == 1)
        own.stop(signal.SIGKILL)
        again = make_broker(data_dir=own.data_dir, port=own.port)
        await until(lambda: consumer.handled + consumer.duplicates == 2, timeout=15,
                    what="the unacked message again")
        publish(again, q, b"after")
        await until(lambda: (b"after", False) in handled, timeout=10)
    # "before" came back redelivered (durable, never acked) and was dropped as handled.
    assert handled == [(b"before", False), (b"after", False)] and consumer.duplicates == 1


def test_blocking_consumer(broker, uid):
    q = f"rc-{uid}"
    topology = blocking.declare_work_queue(broker.url, q, retry_delays=(0.2,))
    handled = []
    done = threading.Event()

    def handler(message):
        if message.body == b"flaky" and message.attempt == 0:
            raise RuntimeError("first time")
        time.sleep(0.01)  # a blocking handler runs in a worker thread
        handled.append((message.body, message.attempt))
        if len(handled) == 2:
            done.set()

    with blocking.ReliableConsumer(broker.url, topology, handler, ack_idle=0.1) as consumer:
        publish(broker, q, b"flaky", b"fine")
        assert done.wait(5)
        threading.Timer(0.1, consumer.stop).start()
        consumer.run()  # returns once stop() ran
        assert consumer.consumer.retried == 1
    assert handled == [(b"fine", 0), (b"flaky", 1)]
    assert ready(broker, q) == 0 and ready(broker, topology.dlq) == 0
    delete(broker, q, topology.dlq, topology.parking, *topology.retry_queues)


@pytest.mark.asyncio
async def test_concurrent_handlers_ack_only_the_settled_prefix(broker, uid):
    q = f"rc-{uid}"
    await declare_work_queue(broker.url, q, retry_delays=(1.0,))
    publish(broker, q, *(str(i).encode() for i in range(10)))
    gate = asyncio.Event()
    handled = []

    async def slow_first(message):
        if message.body == b"0":
            await gate.wait()
        handled.append(message.body)

    # Message 0 is held while 1-9 finish: a multiple ack would cover 0, so none goes out.
    consumer = ReliableConsumer(broker.url, q, slow_first, prefetch=10, ack_batch=2,
                                ack_idle=0.1, concurrency=4)
    task = asyncio.create_task(consumer.run())
    await until(lambda: len(handled) == 9, what="9 handled around a slow one")
    await asyncio.sleep(0.3)
    await crash(task)
    await ready_becomes(broker, q, 10)

    # Four at a time, everything acked in the end; the 9 redelivered ones already handled
    # are dropped as duplicates.
    running = peak = 0
    handled.clear()
    gate.set()

    async def busy(message):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05 if int(message.body) % 3 else 0.15)
        running -= 1
        handled.append(message.body)

    publish(broker, q, *(str(i).encode() for i in range(10, 40)))
    consumer = ReliableConsumer(broker.url, q, busy, prefetch=20, ack_batch=5, ack_idle=0.1,
                                concurrency=4, store=consumer.store)
    async with consumer:
        await until(lambda: consumer.handled + consumer.duplicates == 40, what="40 settled")
        await ready_becomes(broker, q, 0)
    assert peak == 4 and consumer.duplicates == 9
    assert sorted(handled, key=int) == [b"0"] + [str(i).encode() for i in range(10, 40)]
    assert len(handled) == 31
    # Nothing left unacked: a new consumer finds the queue empty.
    conn, ch = pika_channel(broker)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    conn.close()
    with pytest.raises(ValueError):
        ReliableConsumer(broker.url, q, busy, concurrency=0)
    delete(broker, q, f"{q}.dlq", f"{q}.parking", f"{q}.retry.0")
