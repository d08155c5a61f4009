"""Other real client libraries, unchanged: aio-pika, kombu (py-amqp transport), py-amqp."""

import asyncio
import socket

import amqp
import kombu
import kombu.simple
import pytest


# ------------------------------------------------------------------ aio-pika


@pytest.mark.asyncio
async def test_aio_pika_confirms_manual_acks_and_topic(broker, uid):
    import aio_pika
    import aiormq

    connection = await aio_pika.connect_robust(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(f"aio-topic-{uid}", aio_pika.ExchangeType.TOPIC,
                                                  auto_delete=True)
        queue = await channel.declare_queue(f"aio-q-{uid}", exclusive=True)
        await queue.bind(exchange, routing_key="orders.*.created")

        # publish with confirms: each await returns the broker's basic.ack (the last two match
        # no binding; not mandatory, they are simply confirmed)
        for i, key in enumerate(["orders.eu.created", "orders.us.created", "orders.eu.deleted",
                                 "orders.eu.x.created"]):
            confirmation = await exchange.publish(
                aio_pika.Message(f"m{i}".encode(), headers={"n": i}, message_id=str(i)), routing_key=key,
                mandatory=False)
            assert isinstance(confirmation, aiormq.spec.Basic.Ack)

        # an unroutable mandatory publish comes back as basic.return (before its ack)
        returned = await exchange.publish(aio_pika.Message(b"lost"), routing_key="nothing.here", mandatory=True)
        assert isinstance(returned.delivery, aiormq.spec.Basic.Return)
        assert (returned.delivery.reply_code, returned.delivery.reply_text) == (312, "NO_ROUTE")
        assert returned.body == b"lost"

        # consume with manual acks and a prefetch of 1
        await channel.set_qos(prefetch_count=1)
        got = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage):
            got.append((message.body, message.routing_key, message.headers["n"], message.redelivered))
            if len(got) == 1:
                await message.reject(requeue=True)  # comes back first, redelivered
            else:
                await message.ack()
            if len(got) == 3:
                done.set()

        tag = await queue.consume(on_message)
        await asyncio.wait_for(done.wait(), 5)
        await queue.cancel(tag)
        assert got == [(b"m0", "orders.eu.created", 0, False), (b"m0", "orders.eu.created", 0, True),
                       (b"m1", "orders.us.created", 1, False)]
        assert (await queue.declare()).message_count == 0


@pytest.mark.asyncio
async def test_aio_pika_get_and_queue_iterator(broker, uid):
    import aio_pika

    connection = await aio_pika.connect(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"aio-it-{uid}", exclusive=True)
        for i in range(3):
            await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=queue.name)
        message = await queue.get(timeout=5)
        assert message.body == b"0"
        await message.ack()
        bodies = []
        async with queue.iterator() as it:
            async for message in it:
                async with message.process():
                    bodies.append(message.body)
                if len(bodies) == 2:
                    break
        assert bodies == [b"1", b"2"]
        assert await queue.get(fail=False) is None


# --------------------------------------------------------------------- kombu


def kombu_url(broker):
    return f"pyamqp://guest:guest@{broker.host}:{broker.port}//"


def test_kombu_producer_consumer_round_trip(broker, uid):
    exchange = kombu.Exchange(f"kombu-x-{uid}", type="direct", auto_delete=True)
    queue = kombu.Queue(f"kombu-q-{uid}", exchange, routing_key="work", auto_delete=True)
    with kombu.Connection(kombu_url(broker), connect_timeout=5) as conn:
        with conn.Producer() as producer:
            for i in range(3):
                producer.publish({"n": i, "text": "héllo"}, exchange=exchange, routing_key="work",
                                 declare=[queue], serializer="json", headers={"h": i})
        got = []

        def on_message(body, message):
            got.append((body, message.headers["h"], message.content_type))
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
            while len(got) < 3:
                conn.drain_events(timeout=5)
        assert got == [({"n": i, "text": "héllo"}, i, "application/json") for i in range(3)]
        # nothing left
        with pytest.raises(socket.timeout):
            with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
                conn.drain_events(timeout=0.3)


def test_kombu_simple_queue(broker, uid):
    with kombu.Connection(kombu_url(broker), connect_timeout=5) as conn:
        q = conn.SimpleQueue(f"kombu-simple-{uid}", queue_opts={"auto_delete": True})
        try:
            q.put({"hello": "world"})
            q.put("plain text")
            assert isinstance(q, kombu.simple.SimpleQueue)
            m = q.get(timeout=5)
            assert m.payload == {"hello": "world"}
            m.ack()
            m = q.get(block=True, timeout=5)
            assert m.payload == "plain text"
            m.requeue()
            m = q.get(timeout=5)
            assert m.payload == "plain text" and m.delivery_info["redelivered"]
            m.ack()
            with pytest.raises(q.Empty):
                q.get(timeout=0.3)
            q.put([1, 2])
            m = q.get(timeout=5)
            assert m.payload == [1, 2] and m.content_type == "application/json"
            m.ack()
        finally:
            q.close()


# ------------------------------------------------------------------- py-amqp


def test_py_amqp_directly(broker, uid):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest",
                           connect_timeout=5)
    conn.connect()
    try:
        assert conn.server_capabilities.get("publisher_confirms") is True
        ch = conn.channel()
        qname, count, consumers = ch.queue_declare(f"pyamqp-{uid}", exclusive=True, auto_delete=False)
        assert (qname, count, consumers) == (f"pyamqp-{uid}", 0, 0)
        ch.queue_bind(qname, "amq.topic", routing_key="a.#")
        ch.confirm_select()
        ch.basic_publish(amqp.Message("one", content_type="text/plain", application_headers={"k": 1}),
                         exchange="amq.topic", routing_key="a.b.c", mandatory=True)
        ch.basic_publish(amqp.Message(b"\x00\x01 two", delivery_mode=2), exchange="amq.topic",
                         routing_key="a")
        msg = ch.basic_get(qname)
        assert msg.body == "one" and msg.content_type == "text/plain"
        assert msg.headers == {"k": 1} and msg.delivery_info["routing_key"] == "a.b.c"
        assert msg.delivery_info["message_count"] == 1
        ch.basic_ack(msg.delivery_tag)

        got = []
        tag = ch.basic_consume(qname, callback=lambda m: got.append(m))
        conn.drain_events(timeout=5)
        assert got[0].body == b"\x00\x01 two" and got[0].properties["delivery_mode"] == 2
        ch.basic_reject(got[0].delivery_tag, requeue=True)
        conn.drain_events(timeout=5)
        assert got[1].body == b"\x00\x01 two" and got[1].delivery_info["redelivered"] is True
        ch.basic_ack(got[1].delivery_tag)
        ch.basic_cancel(tag)

        # a channel error surfaces as py-amqp's exception class for the code
        with pytest.raises(amqp.exceptions.NotFound) as err:
            ch.queue_declare(f"missing-{uid}", passive=True)
        assert err.value.reply_text == f"NOT_FOUND - no queue 'missing-{uid}' in vhost '/'"
        ch2 = conn.channel()
        ch2.tx_select()
        ch2.basic_publish(amqp.Message("tx"), exchange="", routing_key=qname)
        ch2.tx_rollback()
        ch2.tx_commit()
        assert ch2.basic_get(qname) is None
    finally:
        conn.close()
