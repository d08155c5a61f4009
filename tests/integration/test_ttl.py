"""Message TTL (x-message-ttl and the per-message expiration property) and queue expiry
(x-expires), as RabbitMQ 3.10's classic queues implement them (rabbit_amqqueue_process):
an expired message is never delivered, per-message TTLs are applied at the head of the queue
only, TTL 0 means "now or never", and an unused queue with x-expires is deleted.

Every expectation was checked on a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py). TTLs are
50-300 ms; absence is shown after a positive barrier where one exists (a dead-lettered copy,
a marker message), else after a short bounded wait.
"""

import asyncio
import signal
import time

import kombu
import pika
import pytest

from conftest import Returns, channel_error
from .dlx_helpers import (DLRK, DLX, EXPIRES, TTL, bodies, deaths, get_n, get_one, message_count,
                          queue_exists, wait_count, wait_until)


def with_dlq(ch, names, **args):
    """A source queue with `args` whose dead letters go to a DLQ (through the default
    exchange); returns (source, dlq)."""
    src, dlq = names("src"), names("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(src, arguments={DLX: "", DLRK: dlq, **args})
    return src, dlq


def expiring(ms) -> pika.BasicProperties:
    return pika.BasicProperties(expiration=str(ms))


# ---------------------------------------------------------------------- message TTL

def test_queue_ttl_expires_messages(channel, names):
    src, dlq = with_dlq(channel, names, **{TTL: 150})
    for i in range(3):
        channel.basic_publish("", src, str(i).encode())
    method, props, body = channel.basic_get(src, auto_ack=True)  # well within its TTL
    assert (body, props.expiration) == (b"0", None)
    got = get_n(channel, dlq, 2)
    assert bodies(got) == [b"1", b"2"]
    assert [deaths(p) for _, p, _ in got] == [
        [{"count": 1, "reason": "expired", "queue": src, "exchange": "", "routing-keys": [src]}]] * 2
    assert channel.basic_get(src, auto_ack=True)[0] is None
    assert message_count(channel, src) == 0


def test_per_message_expiration(channel, names):
    src, dlq = with_dlq(channel, names)
    channel.basic_publish("", src, b"short", expiring(50))
    channel.basic_publish("", src, b"long", expiring(60000))
    method, props, body = get_one(channel, dlq)
    assert (body, props.expiration) == (b"short", None)
    assert deaths(props)[0]["original-expiration"] == "50"
    # Delivered normally, the expiration property is left as published.
    method, props, body = get_one(channel, src)
    assert (body, props.expiration) == (b"long", "60000")


@pytest.mark.parametrize("queue_ttl, message_ttl", [(100, 60000), (60000, 100)])
def test_the_lower_of_queue_and_message_ttl_wins(channel, names, queue_ttl, message_ttl):
    src, dlq = with_dlq(channel, names, **{TTL: queue_ttl})
    start = time.monotonic()
    channel.basic_publish("", src, b"m", expiring(message_ttl))
    method, props, body = get_one(channel, dlq)
    assert time.monotonic() - start < 5
    assert (body, deaths(props)[0]["reason"], deaths(props)[0]["original-expiration"]) == (
        b"m", "expired", str(message_ttl))
    assert message_count(channel, src) == 0


def test_ttl_applies_per_queue(channel, names):
    x, short, plain = names("fan"), names("short"), names("plain")
    channel.exchange_declare(x, "fanout")
    channel.queue_declare(short, arguments={TTL: 50})
    channel.queue_declare(plain)
    for q in (short, plain):
        channel.queue_bind(q, x)
    channel.basic_publish(x, "", b"m")
    wait_count(channel, short, 0)
    assert bodies(get_n(channel, plain, 1)) == [b"m"]


def test_expired_message_is_not_given_to_a_consumer_with_a_full_prefetch(connection, channel, names):
    src, dlq = with_dlq(channel, names, **{TTL: 100})
    got = []
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(src, lambda ch, m, p, b: got.append((m.delivery_tag, b)))
    for i in range(4):
        channel.basic_publish("", src, str(i).encode())
    wait_until(lambda: connection.process_data_events(0.01) or got)
    assert [b for _, b in got] == [b"0"]
    # The other three expire while the consumer is full (and go to the DLQ, as expired).
    reader = connection.channel()
    expired = get_n(reader, dlq, 3)
    assert bodies(expired) == [b"1", b"2", b"3"]
    assert {deaths(p)[0]["reason"] for _, p, _ in expired} == {"expired"}
    channel.basic_ack(got[0][0])
    channel.basic_publish("", src, b"fresh")  # the next delivery is this one, not an expired one
    wait_until(lambda: connection.process_data_events(0.01) or len(got) == 2)
    assert [b for _, b in got] == [b"0", b"fresh"]


def test_unacked_message_does_not_expire_but_requeued_it_does(channel, names):
    """A message held unacked past its TTL is not expired; rejected without requeue it is
    dead-lettered as rejected. Requeued, it keeps its original expiry: already past, it is
    dead-lettered as expired at once."""
    src, dlq = with_dlq(channel, names, **{TTL: 100})
    channel.basic_publish("", src, b"held")
    channel.basic_publish("", src, b"requeued")
    channel.basic_publish("", src, b"barrier")
    held = get_one(channel, src, auto_ack=False)[0].delivery_tag
    requeued = get_one(channel, src, auto_ack=False)[0].delivery_tag
    assert bodies(get_n(channel, dlq, 1)) == [b"barrier"]  # past the TTL now
    channel.basic_reject(held, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"held", "rejected")
    channel.basic_reject(requeued, requeue=True)
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"requeued", "expired")
    assert message_count(channel, src) == 0


def test_ttl_zero_is_delivered_only_to_a_ready_consumer(connection, channel, names):
    src, dlq = with_dlq(channel, names, **{TTL: 0})
    channel.basic_publish("", src, b"nobody")  # no consumer: expires at once
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"nobody", "expired")
    assert channel.basic_get(src, auto_ack=True)[0] is None
    got = []
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(src, lambda ch, m, p, b: got.append((m.delivery_tag, b)))
    channel.basic_publish("", src, b"ready")  # a consumer with room: delivered
    wait_until(lambda: connection.process_data_events(0.01) or got)
    channel.basic_publish("", src, b"full")   # the consumer is full now: expires
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"full", "expired")
    consumer.basic_ack(got[0][0])
    channel.basic_publish("", src, b"ready again")
    wait_until(lambda: connection.process_data_events(0.01) or len(got) == 2)
    assert [b for _, b in got] == [b"ready", b"ready again"]
    assert message_count(channel, dlq) == 0


def test_per_message_expiration_zero(connection, channel, names):
    src, dlq = with_dlq(channel, names)
    channel.basic_publish("", src, b"gone", expiring(0))
    method, props, body = get_one(channel, dlq)
    assert deaths(props)[0]["original-expiration"] == "0"
    got = []
    channel.basic_consume(src, lambda ch, m, p, b: got.append((b, p.expiration)), auto_ack=True)
    channel.basic_publish("", src, b"kept", expiring(0))
    wait_until(lambda: connection.process_data_events(0.01) or got)
    assert got == [(b"kept", "0")]


def test_per_message_ttl_is_applied_at_the_head_only(channel, names):
    """RabbitMQ's classic queues expire messages from the head: a short-TTL message behind a
    long-TTL one stays in the queue (counted, not dead-lettered) until it reaches the head,
    and is then expired instead of delivered."""
    src, dlq = with_dlq(channel, names)
    channel.basic_publish("", src, b"long", expiring(60000))
    channel.basic_publish("", src, b"short", expiring(50))
    channel.basic_publish("", src, b"none")
    time.sleep(0.3)  # "short" is long past its expiry, but not at the head
    assert (message_count(channel, src), message_count(channel, dlq)) == (3, 0)
    method, props, body = channel.basic_get(src, auto_ack=True)
    assert body == b"long"
    # Now at the head, "short" is dead-lettered at once (RabbitMQ drops expired messages
    # from the head after every fetch), with no further basic.get needed.
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"short", "expired")
    method, props, body = channel.basic_get(src, auto_ack=True)
    assert body == b"none"


def test_per_message_ttl_behind_a_consumer_is_not_delivered(connection, channel, names):
    src, dlq = with_dlq(channel, names)
    channel.basic_publish("", src, b"long", expiring(60000))
    channel.basic_publish("", src, b"short", expiring(50))
    channel.basic_publish("", src, b"none")
    time.sleep(0.3)
    got = []
    channel.basic_consume(src, lambda ch, m, p, b: got.append(b), auto_ack=True)
    wait_until(lambda: connection.process_data_events(0.01) or len(got) == 2)
    assert got == [b"long", b"none"]
    assert bodies(get_n(channel, dlq, 1)) == [b"short"]


@pytest.mark.parametrize("expiration, detail", [
    ("abc", "no_integer"),
    ("", "no_integer"),
    ("-1", "{value_negative,-1}"),
    ("1.5", '{leftover_string,".5"}'),
    ("5 ", '{leftover_string," "}'),
])
def test_invalid_expiration_closes_the_channel(connection, names, expiration, detail):
    ch = connection.channel()
    q = names("q")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m", pika.BasicProperties(expiration=expiration))
    channel_error(lambda: ch.queue_declare(q, passive=True), 406,
                  f"PRECONDITION_FAILED - invalid expiration '{expiration}': {detail}")


# ---------------------------------------------------------------------- x-expires

# A passive queue.declare resets the expiry timer too (rabbit_amqqueue:stat/1 runs
# ensure_expiry_timer), so existence is polled less often than the queue's x-expires.
def wait_expired(connection, q, every=0.25):
    wait_until(lambda: not queue_exists(connection, q), timeout=5, interval=every, what=f"{q} to expire")


def test_unused_queue_expires_with_its_messages(connection, channel, names):
    q, dlq = names("exp"), names("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(q, arguments={EXPIRES: 100, DLX: "", DLRK: dlq})
    channel.basic_publish("", q, b"lost with the queue")
    wait_expired(connection, q)
    assert message_count(channel, dlq) == 0  # deleting a queue dead-letters nothing


def test_consumer_keeps_a_queue_alive(connection, channel, names):
    q = names("exp")
    channel.queue_declare(q, arguments={EXPIRES: 100})
    tag = channel.basic_consume(q, lambda *a: None)
    time.sleep(0.4)
    connection.process_data_events(0)
    assert queue_exists(connection, q)
    channel.basic_cancel(tag)
    wait_expired(connection, q)


@pytest.mark.parametrize("use", ["basic.get", "declare", "passive declare"])
def test_basic_get_and_declares_keep_a_queue_alive(connection, channel, names, use):
    # (500 ms: a touch every 50 ms stays well inside it on a machine busy with other tests)
    q = names("exp")
    channel.queue_declare(q, arguments={EXPIRES: 500})
    touch = {"basic.get": lambda: channel.basic_get(q, auto_ack=True),
             "declare": lambda: channel.queue_declare(q, arguments={EXPIRES: 500}),
             "passive declare": lambda: channel.queue_declare(q, passive=True)}[use]
    deadline = time.monotonic() + 2.0  # four lifetimes
    while time.monotonic() < deadline:
        touch()
        time.sleep(0.05)
    assert queue_exists(connection, q)
    wait_expired(connection, q, every=0.75)  # (its passive declares are uses too)


def test_publishing_does_not_keep_a_queue_alive(connection, channel, names):
    """Publishing to the queue is not a use: it expires while messages keep arriving (seen as
    the mandatory publishes coming back unroutable)."""
    q = names("exp")
    channel.queue_declare(q, arguments={EXPIRES: 150})
    returns = Returns(connection, channel)

    def returned():
        channel.basic_publish("", q, b"m", mandatory=True)
        return returns.brief(channel)

    assert wait_until(returned, interval=0.03, what="the queue to expire") == [(312, "", q, b"m")]


# ---------------------------------------------------------------------- other clients

@pytest.mark.asyncio
async def test_aio_pika_expiration_dead_letters(broker, uid):
    import aio_pika

    connection = await aio_pika.connect(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        dlq = await channel.declare_queue(f"aio-ttl-dlq-{uid}", auto_delete=True)
        src = await channel.declare_queue(f"aio-ttl-src-{uid}", auto_delete=True, arguments={
            DLX: "", DLRK: dlq.name})
        await channel.default_exchange.publish(aio_pika.Message(b"soon", expiration=0.05), routing_key=src.name)
        dead = None
        for _ in range(250):
            dead = await dlq.get(fail=False, no_ack=True)
            if dead is not None:
                break
            await asyncio.sleep(0.02)
        assert dead is not None and dead.body == b"soon"
        assert dead.expiration is None
        (entry,) = dead.headers["x-death"]
        assert (entry["reason"], entry["queue"], entry["original-expiration"]) == ("expired", src.name, "50")


def test_kombu_message_ttl_and_expires(broker, uid):
    url = f"pyamqp://guest:guest@{broker.host}:{broker.port}//"
    with kombu.Connection(url, connect_timeout=5) as conn:
        dlq = kombu.Queue(f"kombu-ttl-dlq-{uid}", routing_key=f"kombu-ttl-dlq-{uid}", auto_delete=True)
        q = kombu.Queue(f"kombu-ttl-{uid}", routing_key=f"kombu-ttl-{uid}", message_ttl=0.1, expires=0.3,
                        queue_arguments={DLX: "", DLRK: dlq.name})
        bound_dlq = dlq(conn.default_channel)
        bound_dlq.declare()
        q(conn.default_channel).declare()
        with conn.Producer() as producer:
            producer.publish({"n": 1}, routing_key=q.name, serializer="json")
        dead = wait_until(lambda: bound_dlq.get(accept=["json"]), what="the expired message")
        assert dead.payload == {"n": 1}
        assert [(d["reason"], d["queue"]) for d in dead.headers["x-death"]] == [("expired", q.name)]
        dead.ack()

        def gone():
            try:
                conn.channel().queue_declare(q.name, passive=True)
            except conn.channel_errors as e:
                assert e.code == 404
                return True
            return False

        wait_until(gone, what="the queue to expire", interval=0.5)


def test_x_expires_of_a_recovered_queue_counts_from_the_start(make_broker, restart_broker, uid):
    """A durable queue with x-expires that nobody uses after a restart still expires
    (its timer starts when the broker does)."""
    b = make_broker()
    q = f"exp-restart-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        conn.channel().queue_declare(q, durable=True, arguments={"x-expires": 1500})
    b = restart_broker(b, sig=signal.SIGKILL)
    time.sleep(2.5)  # nobody touches it: no declare, no get, no consumer
    with pika.BlockingConnection(b.pika_params()) as conn:
        assert not queue_exists(conn, q)
