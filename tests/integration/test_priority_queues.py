"""Priority queues (x-max-priority) as RabbitMQ 3.10's classic priority queues deliver them:
higher priority first, FIFO within a priority, a message without priority counts as 0 and one
above the queue's maximum as the maximum; requeued messages go back to their place; durable
priority queues keep their messages and priorities across restarts (Warren only)."""

import hashlib
import os
import random
import signal

import kombu
import pika
import pytest

from conftest import channel_error, get_all

PERSISTENT = 2


@pytest.fixture
def channel(connection):
    """A channel in confirm mode: each publish returns once the queue has the message, so the
    queue sorts exactly what the test sent before it reads (on RabbitMQ a passive declare or a
    basic.get need not wait for the channel's earlier publishes to reach the queue)."""
    ch = connection.channel()
    ch.confirm_delivery()
    return ch


def props(priority=None, persistent=False) -> pika.BasicProperties:
    return pika.BasicProperties(priority=priority, delivery_mode=PERSISTENT if persistent else None)


def declare(ch, name, max_priority, **kwargs) -> str:
    args = {"x-max-priority": max_priority} if max_priority is not None else {}
    return ch.queue_declare(name, arguments=args, **kwargs).method.queue


def publish(ch, queue, spec, persistent=False) -> None:
    """Publish (body, priority) pairs to the queue through the default exchange."""
    for body, priority in spec:
        ch.basic_publish("", queue, body, props(priority, persistent))


def bodies(got) -> list:
    return [body for _, _, body in got]


def by_priority(spec, max_priority) -> list:
    """The bodies in the order a priority queue delivers them."""
    keyed = [(-min(p or 0, max_priority), i, body) for i, (body, p) in enumerate(spec)]
    return [body for _, _, body in sorted(keyed)]


def test_basic_get_takes_the_highest_priority_first_fifo_within_one(channel, uid):
    q = declare(channel, f"prio-get-{uid}", 10, exclusive=True)
    spec = [(b"a-none", None), (b"b-5", 5), (b"c-0", 0), (b"d-10", 10), (b"e-5", 5), (b"f-1", 1),
            (b"g-none", None), (b"h-10", 10), (b"i-5", 5)]
    publish(channel, q, spec)
    assert channel.queue_declare(q, passive=True).method.message_count == len(spec)
    got = get_all(channel, q)
    assert bodies(got) == [b"d-10", b"h-10", b"b-5", b"e-5", b"i-5", b"f-1", b"a-none", b"c-0", b"g-none"]
    # The delivered message carries its priority property as published.
    assert [p.priority for _, p, _ in got] == [10, 10, 5, 5, 5, 1, None, 0, None]


def test_a_priority_above_the_maximum_counts_as_the_maximum(channel, uid):
    q = declare(channel, f"prio-cap-{uid}", 3, exclusive=True)
    spec = [(b"p1", 1), (b"p200", 200), (b"p3", 3), (b"p255", 255), (b"p2", 2), (b"p4", 4)]
    publish(channel, q, spec)
    got = get_all(channel, q)
    assert bodies(got) == [b"p200", b"p3", b"p255", b"p4", b"p2", b"p1"]
    assert [p.priority for _, p, _ in got] == [200, 3, 255, 4, 2, 1]  # the property is not changed


def test_all_256_levels(channel, uid):
    q = declare(channel, f"prio-256-{uid}", 255, exclusive=True)
    spec = [(b"%d" % p, p) for p in range(256)] * 2
    random.Random(7).shuffle(spec)
    publish(channel, q, spec)
    assert bodies(get_all(channel, q)) == by_priority(spec, 255)


def test_max_priority_zero_is_fifo(channel, uid):
    """x-max-priority 0 is accepted: one level, so every message counts as priority 0."""
    q = declare(channel, f"prio-zero-{uid}", 0, exclusive=True)
    spec = [(b"first", 5), (b"second", None), (b"third", 9), (b"fourth", 0)]
    publish(channel, q, spec)
    assert bodies(get_all(channel, q)) == [b"first", b"second", b"third", b"fourth"]


def test_without_x_max_priority_the_priority_property_is_ignored(channel, uid):
    q = declare(channel, f"prio-none-{uid}", None, exclusive=True)
    publish(channel, q, [(b"low", 1), (b"high", 9)])
    assert bodies(get_all(channel, q)) == [b"low", b"high"]


def test_a_consumer_gets_the_backlog_in_priority_order(connection, channel, uid):
    q = declare(channel, f"prio-consume-{uid}", 9, exclusive=True)
    spec = [(b"m%02d" % i, [2, None, 9, 4, 9, 0, 7][i % 7]) for i in range(35)]
    publish(channel, q, spec)
    channel.basic_qos(prefetch_count=5)
    got = []
    for method, _props, body in channel.consume(q, inactivity_timeout=5):
        assert method is not None, f"only {len(got)} of {len(spec)} messages arrived"
        got.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(got) == len(spec):
            break
    channel.cancel()
    assert got == by_priority(spec, 9)


def test_a_busy_consumer_gets_the_highest_priority_that_arrived_meanwhile(connection, channel, uid):
    q = declare(channel, f"prio-busy-{uid}", 9, exclusive=True)
    publisher = connection.channel()
    publisher.confirm_delivery()  # each publish returns once the queue has the message
    channel.basic_qos(prefetch_count=1)
    deliveries = channel.consume(q, inactivity_timeout=5)
    publisher.basic_publish("", q, b"first", props(1))
    method, _, body = next(deliveries)
    assert body == b"first"  # straight to the waiting consumer
    for body, priority in [(b"low", 1), (b"high", 9), (b"mid", 5), (b"none", None), (b"high-2", 9)]:
        publisher.basic_publish("", q, body, props(priority))
    got = []
    for _ in range(5):
        channel.basic_ack(method.delivery_tag)
        method, _, body = next(deliveries)
        assert method is not None
        got.append(body)
    channel.basic_ack(method.delivery_tag)
    channel.cancel()
    assert got == [b"high", b"high-2", b"mid", b"low", b"none"]


def test_requeued_messages_go_back_to_their_place(channel, uid):
    q = declare(channel, f"prio-requeue-{uid}", 5, exclusive=True)
    spec = [(b"a1", 1), (b"b5", 5), (b"c1", 1), (b"d5", 5), (b"e3", 3), (b"f5", 5)]
    publish(channel, q, spec)
    taken = [channel.basic_get(q) for _ in range(5)]
    assert [body for _, _, body in taken] == [b"b5", b"d5", b"f5", b"e3", b"a1"]
    # back out of order: e3 and b5 (reject), then a1 and d5 (nack)
    channel.basic_reject(taken[3][0].delivery_tag, requeue=True)
    channel.basic_reject(taken[0][0].delivery_tag, requeue=True)
    channel.basic_nack(taken[4][0].delivery_tag, requeue=True)
    channel.basic_nack(taken[1][0].delivery_tag, requeue=True)
    channel.basic_ack(taken[2][0].delivery_tag)  # f5 is done
    got = [(body, method.redelivered) for method, _, body in get_all(channel, q)]
    assert got == [(b"b5", True), (b"d5", True), (b"e3", True), (b"a1", True), (b"c1", False)]


def test_a_requeued_high_priority_message_goes_ahead_of_lower_ones(channel, uid):
    q = declare(channel, f"prio-requeue-high-{uid}", 5, exclusive=True)
    publish(channel, q, [(b"low", 1), (b"high", 4)])
    method, _, body = channel.basic_get(q)
    assert body == b"high"
    publish(channel, q, [(b"mid", 3)])
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert [(body, m.redelivered) for m, _, body in get_all(channel, q)] == [
        (b"high", True), (b"mid", False), (b"low", False)]


def test_unacked_messages_return_when_the_channel_closes(connection, uid):
    ch = connection.channel()
    ch.confirm_delivery()
    q = declare(ch, f"prio-close-{uid}", 5, exclusive=True)
    publish(ch, q, [(b"x1", 1), (b"x4", 4), (b"x2", 2)])
    consumer = connection.channel()
    consumer.basic_get(q)  # x4, unacked
    consumer.basic_get(q)  # x2
    consumer.close()
    assert [(body, m.redelivered) for m, _, body in get_all(ch, q)] == [
        (b"x4", True), (b"x2", True), (b"x1", False)]


def test_purge_counts_every_level(channel, uid):
    q = declare(channel, f"prio-purge-{uid}", 7, exclusive=True)
    publish(channel, q, [(b"%d" % i, i % 8) for i in range(20)])
    assert channel.queue_purge(q).method.message_count == 20
    publish(channel, q, [(b"after", 2)])
    assert bodies(get_all(channel, q)) == [b"after"]


def test_redeclare_with_another_maximum_is_refused(channel, uid):
    q = declare(channel, f"prio-redeclare-{uid}", 5, exclusive=True)
    declare(channel, q, 5, exclusive=True)
    code, text = channel_error(lambda: declare(channel, q, 6, exclusive=True))
    assert (code, text) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue '{q}' in "
                                 "vhost '/': received '6' but current is '5'")


# ----------------------------------------------------------------------------- kombu

def kombu_url(broker):
    return f"pyamqp://guest:guest@{broker.host}:{broker.port}//"


def test_kombu_priority_queue(broker, uid):
    exchange = kombu.Exchange(f"kombu-prio-x-{uid}", type="direct", auto_delete=True)
    queue = kombu.Queue(f"kombu-prio-{uid}", exchange, routing_key="work", max_priority=10, auto_delete=True)
    spec = [("first", 3), ("second", 6), ("third", 3), ("fourth", None), ("fifth", 10), ("sixth", 12)]
    with kombu.Connection(kombu_url(broker), connect_timeout=5) as conn:
        with conn.Producer() as producer:
            for text, priority in spec:
                extra = {"priority": priority} if priority is not None else {}
                producer.publish({"msg": text}, exchange=exchange, routing_key="work", declare=[queue],
                                 serializer="json", retry=True, **extra)
        got = []

        def on_message(body, message):
            got.append((body["msg"], message.properties.get("priority")))
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=["json"], prefetch_count=1):
            while len(got) < len(spec):
                conn.drain_events(timeout=5)
        # (kombu sends priority 0 when none is given)
        assert got == [("fifth", 10), ("sixth", 12), ("second", 6), ("first", 3), ("third", 3), ("fourth", 0)]
        # kombu.simple with a priority queue: get() follows the priorities too
        simple = conn.SimpleQueue(f"kombu-prio-simple-{uid}", queue_opts={"auto_delete": True, "max_priority": 5})
        try:
            for text, priority in [("low", 1), ("high", 5), ("mid", 3)]:
                simple.put(text, priority=priority)
            taken = []
            for _ in range(3):
                m = simple.get(timeout=5)
                taken.append(m.payload)
                m.ack()
            assert taken == ["high", "mid", "low"]
        finally:
            simple.close()  # cancels its consumer: the auto-delete queue goes


# --------------------------------------------------------- durability (Warren only)

SIGNALS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]


@pytest.mark.parametrize("sig", SIGNALS)
def test_durable_priority_queue_survives_a_restart(make_broker, restart_broker, uid, sig):
    b = make_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    q = declare(ch, f"prio-durable-{uid}", 9, durable=True)
    ch.confirm_delivery()  # each publish returns once its message is on disk
    spec = [(b"d%03d" % i, [None, 9, 3, 0, 3, 7, 12][i % 7]) for i in range(70)]
    publish(ch, q, spec, persistent=True)
    publish(ch, q, [(b"transient", 9)])  # lost at the restart
    order = by_priority(spec, 9)
    unacked = conn.channel()
    method, _, first = unacked.basic_get(q)  # delivered, unacked at the restart: redelivered after it
    assert method is not None and first == order[0]
    method, _, second = ch.basic_get(q, auto_ack=True)  # gone for good
    assert second == order[1]
    if sig == signal.SIGKILL:
        b.proc.send_signal(signal.SIGKILL)  # right after the confirms and the get-ok
    else:
        conn.close()
    b = restart_broker(b, sig=sig)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    remaining = [order[0]] + order[2:]
    assert ch.queue_declare(q, durable=True, arguments={"x-max-priority": 9}).method.message_count == len(remaining)
    # New messages are numbered after the recovered ones: each goes behind its own level.
    ch.confirm_delivery()
    publish(ch, q, [(b"after-9", 9), (b"after-0", 0)], persistent=True)
    nines = sum(1 for _, p in spec if min(p or 0, 9) == 9) - 1  # level 9 less the acked one
    got = get_all(ch, q)
    assert bodies(got) == remaining[:nines] + [b"after-9"] + remaining[nines:] + [b"after-0"]
    assert [m.redelivered for m, _, _ in got] == [True] + [False] * (len(got) - 1)
    published = dict(spec) | {b"after-9": 9, b"after-0": 0}
    assert all(p.priority == published[body] for _, p, body in got)  # priorities kept as published
    conn.close()
    # Everything was taken: nothing comes back after one more restart; the queue works on.
    b = restart_broker(b, sig=signal.SIGKILL)
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        publish(ch, q, [(b"x", 1), (b"y", 2)], persistent=True)
        assert bodies(get_all(ch, q)) == [b"y", b"x"]
        # One directory per level, inside the queue's own: deleting the queue removes them all.
        digest = hashlib.sha1(f"/\0{q}".encode()).hexdigest()[:24]
        directory = os.path.join(b.data_dir, "queues", digest)
        assert sorted(os.listdir(directory)) == [f"{digest}-p{level}" for level in (0, 1, 2, 3, 7, 9)]
        ch.queue_delete(q)
        assert not os.path.exists(directory)
