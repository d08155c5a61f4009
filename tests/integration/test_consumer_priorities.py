"""Consumer priorities (the x-priority argument of basic.consume), as RabbitMQ 3.10 does them
(rabbit_queue_consumers): messages go to the highest-priority consumers that have credit,
round robin among equals; lower ones get messages only while every higher one is blocked."""

import asyncio
import decimal

import pytest

from conftest import channel_error, pump, queue


def _consumer(connection, q, tag, got, priority=None, prefetch=0):
    """A consumer on its own channel of `connection`, recording (tag, body) in `got`."""
    ch = connection.channel()
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    ch.basic_consume(q, lambda c, m, p, body: got.append((tag, body.decode(), m.delivery_tag)), consumer_tag=tag,
                     arguments=None if priority is None else {"x-priority": priority})
    return ch


@pytest.mark.parametrize("arguments, text", [
    ({"x-priority": "high"}, "invalid arg 'x-priority' for {q}: \"expected integer, got longstr\""),
    ({"x-priority": decimal.Decimal("1.5")}, "invalid arg 'x-priority' for {q}: \"expected integer, got decimal\""),
    ({"x-priority": True}, "invalid arg 'x-priority' for {q}: \"expected integer, got bool\""),
    ({"x-cancel-on-ha-failover": "yes"}, "invalid arg 'x-cancel-on-ha-failover' for {q}: {{unacceptable_type,longstr}}"),
    ({"x-stream-offset": "first"}, "invalid arg 'x-stream-offset' for {q} of queue type rabbit_classic_queue"),
    # RabbitMQ's order: x-priority, then x-cancel-on-ha-failover, then other types' arguments.
    ({"x-stream-offset": 1, "x-priority": "a"}, "invalid arg 'x-priority' for {q}: \"expected integer, got longstr\""),
    ({"x-cancel-on-ha-failover": 1, "x-priority": "a"},
     "invalid arg 'x-priority' for {q}: \"expected integer, got longstr\""),
])
def test_bad_consume_arguments(connection, arguments, text):
    ch = connection.channel()
    q = queue(ch)
    channel_error(lambda: ch.basic_consume(q, lambda *a: None, arguments=arguments), 406,
                  "PRECONDITION_FAILED - " + text.format(q=f"queue '{q}' in vhost '/'"))


@pytest.mark.parametrize("arguments", [
    {"x-priority": -5}, {"x-priority": 2 ** 40}, {"x-priority": 0}, {"x-cancel-on-ha-failover": True},
    {"x-unknown": "ignored"},
])
def test_good_consume_arguments(connection, arguments):
    ch = connection.channel()
    q = queue(ch)
    tag = ch.basic_consume(q, lambda *a: None, arguments=arguments)
    ch.basic_cancel(tag)


def test_highest_priority_first_round_robin_among_equals(connection):
    ch = connection.channel()
    q = queue(ch)
    got = []
    # Registered in mixed order: the order of registration must not matter, only priority.
    _consumer(connection, q, "low", got, priority=None)  # 0 by default
    _consumer(connection, q, "a", got, priority=10, prefetch=2)
    _consumer(connection, q, "negative", got, priority=-1)
    _consumer(connection, q, "b", got, priority=10, prefetch=2)
    for i in range(8):
        ch.basic_publish("", q, str(i).encode())
    pump(connection, lambda: len(got) == 8)
    by_tag = {tag: [body for t, body, _ in got if t == tag] for tag in ("a", "b", "low", "negative")}
    # a and b alternate until both are full, then the default priority takes the rest.
    assert by_tag == {"a": ["0", "2"], "b": ["1", "3"], "low": ["4", "5", "6", "7"], "negative": []}


def test_higher_priority_gets_messages_again_once_it_has_credit(connection):
    ch = connection.channel()
    q = queue(ch)
    got = []
    high = _consumer(connection, q, "high", got, priority=5, prefetch=1)
    _consumer(connection, q, "low", got, priority=1, prefetch=100)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    pump(connection, lambda: len(got) == 3)
    assert [(t, b) for t, b, _ in got] == [("high", "0"), ("low", "1"), ("low", "2")]
    got.clear()
    high.basic_ack(1)
    ch.basic_publish("", q, b"3")  # high has credit again: it gets the next one
    ch.basic_publish("", q, b"4")  # high is full again: low
    pump(connection, lambda: len(got) == 2)
    assert sorted((t, b) for t, b, _ in got) == [("high", "3"), ("low", "4")]


def test_ready_messages_go_to_the_higher_priority_consumer_when_it_frees_up(connection):
    """Messages waiting in the queue (every consumer full) go to the higher-priority consumer
    as soon as it acks, not to a lower one that frees up later."""
    ch = connection.channel()
    q = queue(ch)
    got = []
    high = _consumer(connection, q, "high", got, priority=3, prefetch=1)
    low = _consumer(connection, q, "low", got, priority=2, prefetch=1)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    pump(connection, lambda: len(got) == 2)
    high.basic_ack(1)
    pump(connection, lambda: len(got) == 3)
    assert got[-1][:2] == ("high", "2")
    low.basic_ack(1)
    pump(connection, lambda: len(got) == 4)
    assert got[-1][:2] == ("low", "3")


def test_cancelled_high_priority_consumer_hands_over(connection):
    ch = connection.channel()
    q = queue(ch)
    got = []
    high = _consumer(connection, q, "high", got, priority=10)
    _consumer(connection, q, "low", got)
    ch.basic_publish("", q, b"0")
    pump(connection, lambda: len(got) == 1)
    high.basic_cancel("high")
    ch.basic_publish("", q, b"1")
    pump(connection, lambda: len(got) == 2)
    assert [(t, b) for t, b, _ in got] == [("high", "0"), ("low", "1")]


@pytest.mark.asyncio
async def test_aio_pika_priorities_across_connections(broker, uid):
    import aio_pika
    conns = [await aio_pika.connect(broker.url, timeout=10) for _ in range(3)]
    try:
        admin = await conns[0].channel()
        q = await admin.declare_queue(f"prio-{uid}", exclusive=False, auto_delete=True)
        got: list[tuple[str, bytes]] = []

        async def consume(conn, tag, priority):
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            queue_ = await ch.get_queue(q.name)

            async def on_message(message):
                got.append((tag, message.body))  # never acked: one message each at most
            await queue_.consume(on_message, consumer_tag=tag, arguments={"x-priority": priority})
        await consume(conns[1], "p1", 1)
        await consume(conns[2], "p9", 9)
        for body in (b"first", b"second", b"third"):
            await admin.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
        deadline = asyncio.get_running_loop().time() + 5
        while len(got) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert sorted(got) == [("p1", b"second"), ("p9", b"first")]
        assert (await q.declare()).message_count == 1
    finally:
        for conn in conns:
            await conn.close()


def test_no_ack_consumer_priority(connection):
    """A no-ack consumer always has credit: a higher-priority one takes everything."""
    ch = connection.channel()
    q = queue(ch)
    got = []
    connection.channel().basic_consume(q, lambda c, m, p, b: got.append(("low", b)), auto_ack=True)
    high = connection.channel()
    high.basic_consume(q, lambda c, m, p, b: got.append(("high", b)), auto_ack=True, arguments={"x-priority": 1})
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    pump(connection, lambda: len(got) == 5)
    assert {t for t, _ in got} == {"high"}
