"""Queue length limits, as RabbitMQ 3.10's classic queues enforce them
(rabbit_amqqueue_process: maybe_drop_head/1, will_overflow/2): x-max-length and
x-max-length-bytes (message bodies only), with x-overflow drop-head (the default: the head is
dropped or dead-lettered as maxlen), reject-publish (the publisher gets basic.nack with
confirms on; without, the message is dropped) and reject-publish-dlx (nacked and
dead-lettered). Only ready messages count, not unacked ones.

Every expectation was checked on a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py).
"""

import asyncio

import kombu
import pika
import pytest
from pamqp import commands as c

from conftest import drain
from rawamqp import connect
from .dlx_helpers import (DLRK, DLX, MAX_BYTES, MAX_LENGTH, OVERFLOW, bodies, confirmed, deaths, get_n, get_one,
                          message_count, wait_count, wait_until)


def limited(ch, names, dlq=False, **args):
    """A queue with the given x-arguments (and, with dlq=True, a DLQ through the default
    exchange); returns (queue, dlq or None)."""
    q = names("limited")
    d = None
    if dlq:
        d = names("dlq")
        ch.queue_declare(d)
        args = {DLX: "", DLRK: d, **args}
    ch.queue_declare(q, arguments=args)
    return q, d


def publish(ch, q, items) -> None:
    for i in items:
        ch.basic_publish("", q, str(i).encode() if isinstance(i, int) else i)


# ------------------------------------------------------------------------------ drop-head

def test_drop_head_keeps_the_newest(channel, names):
    q, _ = limited(channel, names, **{MAX_LENGTH: 2})
    publish(channel, q, range(1, 6))
    assert drain(channel, q) == [b"4", b"5"]


def test_drop_head_dead_letters_as_maxlen(channel, names):
    q, dlq = limited(channel, names, dlq=True, **{MAX_LENGTH: 2, OVERFLOW: "drop-head"})
    channel.basic_publish("amq.direct", "nowhere", b"x")
    publish(channel, q, range(1, 6))
    got = get_n(channel, dlq, 3)
    assert bodies(got) == [b"1", b"2", b"3"]
    for method, props, _ in got:
        assert (method.exchange, method.routing_key) == ("", dlq)
        assert deaths(props) == [{"count": 1, "reason": "maxlen", "queue": q, "exchange": "", "routing-keys": [q]}]
        assert props.headers["x-first-death-reason"] == "maxlen"
    assert drain(channel, q) == [b"4", b"5"]


def test_max_length_bytes_counts_bodies_only(channel, names):
    q, dlq = limited(channel, names, dlq=True, **{MAX_BYTES: 10})
    big_headers = pika.BasicProperties(headers={"pad": "x" * 500}, content_type="text/plain")
    for body in (b"aaaa", b"bbbb", b"cc"):  # 10 bytes: all fit, whatever the headers
        channel.basic_publish("", q, body, big_headers)
    wait_count(channel, q, 3)
    channel.basic_publish("", q, b"d")  # 11 bytes: the head goes
    assert bodies(get_n(channel, dlq, 1)) == [b"aaaa"]
    channel.basic_publish("", q, b"e" * 10)  # needs all 10 bytes: everything before it goes
    assert bodies(get_n(channel, dlq, 3)) == [b"bbbb", b"cc", b"d"]
    channel.basic_publish("", q, b"f" * 11)  # bigger than the limit: it goes too
    assert bodies(get_n(channel, dlq, 2)) == [b"e" * 10, b"f" * 11]
    assert message_count(channel, q) == 0


def test_length_and_bytes_together(channel, names):
    q, _ = limited(channel, names, **{MAX_LENGTH: 3, MAX_BYTES: 5})
    publish(channel, q, [b"aa", b"bb", b"cc"])  # 6 bytes: a goes
    publish(channel, q, [b"d", b"e"])           # 4 messages: b goes
    assert drain(channel, q) == [b"cc", b"d", b"e"]


def test_unacked_messages_do_not_count(channel, names):
    q, dlq = limited(channel, names, dlq=True, **{MAX_LENGTH: 1})
    publish(channel, q, [b"a"])
    tag = get_one(channel, q, auto_ack=False)[0].delivery_tag
    publish(channel, q, [b"b"])
    wait_count(channel, q, 1)
    assert message_count(channel, dlq) == 0
    # Requeued, "a" is back at the head of a queue now over its limit: it is dropped.
    channel.basic_reject(tag, requeue=True)
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"a", "maxlen")
    assert drain(channel, q) == [b"b"]


def test_max_length_zero_drop_head(connection, channel, names):
    q, dlq = limited(channel, names, dlq=True, **{MAX_LENGTH: 0})
    publish(channel, q, [b"gone"])
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"gone", "maxlen")
    got = []
    channel.basic_consume(q, lambda ch, m, p, b: got.append(b), auto_ack=True)
    publish(channel, q, [b"to the consumer"])  # a consumer ready for it: delivered, never queued
    wait_until(lambda: connection.process_data_events(0.01) or got)
    assert got == [b"to the consumer"]
    assert message_count(channel, dlq) == 0


# ------------------------------------------------------------------------------ reject-publish

def test_reject_publish_nacks_with_confirms(connection, names):
    ch = connection.channel()
    q, dlq = limited(ch, names, dlq=True, **{MAX_LENGTH: 2, OVERFLOW: "reject-publish"})
    ch.confirm_delivery()
    assert [confirmed(ch, q, str(i).encode()) for i in range(1, 5)] == [True, True, False, False]
    assert drain(ch, q) == [b"1", b"2"]  # what was queued stays; nothing is dead-lettered
    assert message_count(ch, dlq) == 0
    assert confirmed(ch, q, b"room again")


def test_reject_publish_nack_on_the_wire(broker, uid):
    q = f"rp-raw-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True, arguments={MAX_LENGTH: 1, OVERFLOW: "reject-publish"}))
        raw.call(1, c.Confirm.Select())
        for body in (b"a", b"b", b"c"):
            raw.publish(1, "", q, body)
        # RabbitMQ may nack with multiple=True (all unconfirmed tags up to this one).
        outcome, pending = {}, {1, 2, 3}
        while pending:
            f = raw.read_frame().value
            assert isinstance(f, (c.Basic.Ack, c.Basic.Nack)), f
            covered = {t for t in pending if t <= f.delivery_tag} if f.multiple else {f.delivery_tag}
            for tag in covered:
                outcome[tag] = type(f).__name__
            pending -= covered
            if isinstance(f, c.Basic.Nack):
                assert f.requeue is True  # RabbitMQ leaves the record's default (requeue bit set)
        assert outcome == {1: "Ack", 2: "Nack", 3: "Nack"}
        assert raw.call(1, c.Queue.Declare(queue=q, passive=True)).message_count == 1


def test_reject_publish_without_confirms_drops(channel, names):
    q, _ = limited(channel, names, **{MAX_LENGTH: 2, OVERFLOW: "reject-publish"})
    publish(channel, q, range(1, 6))
    assert drain(channel, q) == [b"1", b"2"]


def test_reject_publish_counts_bytes(connection, names):
    ch = connection.channel()
    q, _ = limited(ch, names, **{MAX_BYTES: 5, OVERFLOW: "reject-publish"})
    ch.confirm_delivery()
    assert [confirmed(ch, q, b) for b in (b"abc", b"def", b"de", b"123456")] == [True, False, True, False]
    assert drain(ch, q) == [b"abc", b"de"]


def test_reject_publish_unacked_do_not_count(connection, names):
    ch = connection.channel()
    q, _ = limited(ch, names, **{MAX_LENGTH: 1, OVERFLOW: "reject-publish"})
    ch.confirm_delivery()
    assert confirmed(ch, q, b"a")
    tag = get_one(ch, q, auto_ack=False)[0].delivery_tag
    assert confirmed(ch, q, b"b")
    assert not confirmed(ch, q, b"c")
    # Requeued over the limit: kept (reject-publish never drops what is queued).
    ch.basic_reject(tag, requeue=True)
    wait_count(ch, q, 2)
    assert not confirmed(ch, q, b"d")
    assert drain(ch, q) == [b"a", b"b"]


def test_reject_publish_max_length_zero_refuses_even_with_a_consumer(connection, names):
    ch = connection.channel()
    q, _ = limited(ch, names, **{MAX_LENGTH: 0, OVERFLOW: "reject-publish"})
    got = []
    consumer = connection.channel()
    consumer.basic_consume(q, lambda c_, m, p, b: got.append(b), auto_ack=True)
    ch.confirm_delivery()
    assert not confirmed(ch, q, b"m")
    connection.process_data_events(0.1)
    assert got == []


def test_reject_publish_one_full_queue_of_two_nacks_but_the_other_gets_it(connection, names):
    ch = connection.channel()
    x = names("fan")
    ch.exchange_declare(x, "fanout")
    full, _ = limited(ch, names, **{MAX_LENGTH: 1, OVERFLOW: "reject-publish"})
    other = names("other")
    ch.queue_declare(other)
    for q in (full, other):
        ch.queue_bind(q, x)
    ch.confirm_delivery()
    ch.basic_publish(x, "", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(x, "", b"2")
    assert (drain(ch, full), drain(ch, other)) == ([b"1"], [b"1", b"2"])


def test_reject_publish_mandatory_is_not_returned(connection, names):
    ch = connection.channel()
    q, _ = limited(ch, names, **{MAX_LENGTH: 0, OVERFLOW: "reject-publish"})
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):  # not UnroutableError: it was routed
        ch.basic_publish("", q, b"m", mandatory=True)


def test_reject_publish_dlx_nacks_and_dead_letters(connection, names):
    ch = connection.channel()
    q, dlq = limited(ch, names, dlq=True, **{MAX_LENGTH: 1, OVERFLOW: "reject-publish-dlx"})
    x = names("in")
    ch.exchange_declare(x, "direct")
    ch.queue_bind(q, x, "k")
    ch.confirm_delivery()
    ch.basic_publish(x, "k", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(x, "k", b"2", pika.BasicProperties(expiration="60000", headers={"h": "v"}))
    method, props, body = get_one(ch, dlq)
    assert (body, method.exchange, method.routing_key, props.expiration) == (b"2", "", dlq, None)
    assert deaths(props) == [{"count": 1, "reason": "maxlen", "queue": q, "exchange": x, "routing-keys": ["k"],
                              "original-expiration": "60000"}]
    assert (props.headers["x-first-death-exchange"], props.headers["h"]) == (x, "v")
    assert drain(ch, q) == [b"1"]


def test_reject_publish_dlx_without_confirms(channel, names):
    q, dlq = limited(channel, names, dlq=True, **{MAX_LENGTH: 1, OVERFLOW: "reject-publish-dlx"})
    publish(channel, q, range(1, 4))
    assert bodies(get_n(channel, dlq, 2)) == [b"2", b"3"]
    assert drain(channel, q) == [b"1"]


# ------------------------------------------------------------------------------ other clients

@pytest.mark.asyncio
async def test_aio_pika_reject_publish_raises_delivery_error(broker, uid):
    import aio_pika
    import aiormq

    connection = await aio_pika.connect(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        q = await channel.declare_queue(f"aio-rp-{uid}", exclusive=True, arguments={
            MAX_LENGTH: 1, OVERFLOW: "reject-publish"})
        await channel.default_exchange.publish(aio_pika.Message(b"1"), routing_key=q.name)
        with pytest.raises(aiormq.exceptions.DeliveryError) as err:
            await channel.default_exchange.publish(aio_pika.Message(b"2"), routing_key=q.name)
        assert isinstance(err.value.frame, aiormq.spec.Basic.Nack)
        message = await q.get(timeout=5)
        assert message.body == b"1"
        await message.ack()
        await asyncio.wait_for(channel.default_exchange.publish(aio_pika.Message(b"3"), routing_key=q.name), 5)


def test_kombu_max_length_drop_head(broker, uid):
    url = f"pyamqp://guest:guest@{broker.host}:{broker.port}//"
    with kombu.Connection(url, connect_timeout=5) as conn:
        q = kombu.Queue(f"kombu-ml-{uid}", routing_key=f"kombu-ml-{uid}", max_length=2, auto_delete=True)
        bound = q(conn.default_channel)
        bound.declare()
        with conn.Producer() as producer:
            for i in range(4):
                producer.publish({"n": i}, routing_key=q.name, serializer="json")
        # The producer and the queue share the connection's default channel: in order.
        assert [bound.get(accept=["json"]).payload for _ in range(2)] == [{"n": 2}, {"n": 3}]
        assert bound.get() is None
