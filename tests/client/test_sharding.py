"""warren.client.declare_sharded_queues (seed 002's scale-out): a consistent-hash exchange
over N queues keeps every key's messages in one queue, in order, and spreads the keys; the
shards can be work queues with their own DLQ and retry chain, consumed by ReliableConsumers."""

from collections import defaultdict

import pika
import pytest

from tests.client.test_reliable_consumer import delete, pika_channel, take, until
from tests.integration.test_consistent_hash import consistent_hash_available  # noqa: F401
from warren.client import ReliableConsumer, ReliablePublisher, declare_sharded_queues
from warren.client import blocking

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _needs_type(consistent_hash_available):
    """Skip on a RabbitMQ without the rabbitmq_consistent_hash_exchange plugin."""


def drop_exchange(broker, name):
    conn, ch = pika_channel(broker)
    ch.exchange_delete(name)
    conn.close()


@pytest.mark.asyncio
async def test_a_key_stays_on_one_shard_in_order(broker, uid):
    ex = f"orders-{uid}"
    shards = await declare_sharded_queues(broker.url, ex, 4)
    assert shards.queues == tuple(f"{ex}.{i}" for i in range(4)) and shards.work_queues == ()
    async with ReliablePublisher(broker.url) as pub:
        for n in range(20):
            for key in range(40):
                await pub.publish(b"%d:%d" % (key, n), exchange=ex, routing_key=f"customer-{key}")
    seen: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
    for queue in shards.queues:
        for body, _ in take(broker, queue):
            key, n = body.split(b":")
            seen[key].append((queue, int(n)))
    assert len(seen) == 40
    for key, places in seen.items():
        assert len({q for q, _ in places}) == 1, f"key {key} on several shards: {places}"
        assert [n for _, n in places] == list(range(20)), f"key {key} out of order"
    used = {places[0][0] for places in seen.values()}
    assert len(used) >= 3, f"40 keys over 4 shards landed on {used}"
    # Declaring again is idempotent.
    assert await declare_sharded_queues(broker.url, ex, 4) == shards
    delete(broker, *shards.queues)
    drop_exchange(broker, ex)


@pytest.mark.asyncio
async def test_shards_as_work_queues_hashed_on_a_property(broker, uid):
    ex = f"jobs-{uid}"
    shards = await declare_sharded_queues(broker.url, ex, 2, hash_property="message_id",
                                          retry_delays=(0.1,), max_attempts=1)
    assert [w.name for w in shards.work_queues] == list(shards.queues)
    async with ReliablePublisher(broker.url) as pub:
        for i in range(30):
            # The routing key is ignored: the message_id is hashed.
            await pub.publish(b"job-%d" % i, exchange=ex, routing_key="same",
                              message_id=f"id-{i}")
    handled: list[bytes] = []

    async def handle(message):
        if message.body == b"job-7":
            raise ValueError("poison")
        handled.append(message.body)

    consumers = [ReliableConsumer(broker.url, work, handle, poison=(ValueError,))
                 for work in shards.work_queues]
    async with consumers[0], consumers[1]:
        await until(lambda: len(handled) == 29, what="29 jobs")
        assert all(c.handled > 0 for c in consumers), "one shard got every message"
    assert sorted(handled) == sorted(b"job-%d" % i for i in range(30) if i != 7)
    # The poison message is in its own shard's DLQ.
    dead = [body for w in shards.work_queues for body, _ in take(broker, w.dlq)]
    assert dead == [b"job-7"]
    for work in shards.work_queues:
        delete(broker, work.name, work.dlq, work.parking, *work.retry_queues)
    drop_exchange(broker, ex)


def test_blocking_declare_and_wrong_arguments(broker, uid):
    ex = f"sync-{uid}"
    shards = blocking.declare_sharded_queues(broker.url, ex, 3)
    conn, ch = pika_channel(broker)
    for queue in shards.queues:
        ch.queue_declare(queue, passive=True)
    ch.basic_publish(ex, "k", b"x", pika.BasicProperties(delivery_mode=2))
    conn.close()
    assert sum(len(take(broker, q)) for q in shards.queues) == 1
    with pytest.raises(ValueError):
        blocking.declare_sharded_queues(broker.url, ex, 0)
    delete(broker, *shards.queues)
    drop_exchange(broker, ex)
