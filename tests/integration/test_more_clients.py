"""More real client libraries, unchanged: amqpstorm, rabbitpy and node's amqplib.

Each test is a realistic round trip written with the library's normal API: declare an
exchange, a queue and a binding; publish with properties under publisher confirms; get
and consume with manual acks; a transaction; and a channel error whose reply code and
RabbitMQ reply text the library surfaces. They run unchanged against RabbitMQ
(WARREN_TEST_BROKER) and must pass there too.
"""

import datetime
import json
import os
import shutil
import subprocess
import time

import pytest

NODE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node")

HEADERS = {"n": 7, "s": "text", "flag": True, "nested": {"k": "v"}}


def _no_queue(name):
    return f"NOT_FOUND - no queue '{name}' in vhost '/'"


# ------------------------------------------------------------------ amqpstorm


def _storm_count(connection, queue):
    """Ready messages of a queue (a passive queue.declare on a fresh channel)."""
    with connection.channel() as ch:
        return ch.queue.declare(queue, passive=True)["message_count"]


def test_amqpstorm_round_trip(broker, uid):
    import amqpstorm
    from amqpstorm import AMQPChannelError, AMQPMessageError, Message

    exchange, queue, missing = f"storm-x-{uid}", f"storm-q-{uid}", f"storm-missing-{uid}"
    with amqpstorm.Connection(broker.host, "guest", "guest", port=broker.port, timeout=10) as connection:
        capabilities = connection.server_properties["capabilities"]
        assert capabilities["publisher_confirms"] is True
        assert capabilities["basic.nack"] is True

        channel = connection.channel()
        assert channel.exchange.declare(exchange, exchange_type="direct", auto_delete=True) == {}
        assert channel.queue.declare(queue, exclusive=True) == {
            "queue": queue, "message_count": 0, "consumer_count": 0}
        assert channel.queue.bind(queue=queue, exchange=exchange, routing_key="jobs") == {}

        # publisher confirms: publish() waits for each basic.ack and returns True
        channel.confirm_deliveries()
        assert channel.confirming_deliveries
        for i in range(3):
            message = Message.create(channel, json.dumps({"i": i}), properties={
                "headers": dict(HEADERS, i=i), "delivery_mode": 2, "content_type": "application/json",
                "message_id": f"id-{i}", "correlation_id": f"c-{i}", "app_id": "storm",
                "timestamp": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)})
            assert message.publish("jobs", exchange=exchange) is True
        # an unroutable mandatory publish: basic.return arrives before its ack, and amqpstorm
        # raises it as an error with RabbitMQ's reply text
        with pytest.raises(AMQPMessageError) as err:
            Message.create(channel, "lost").publish("nowhere", exchange=exchange, mandatory=True)
        assert err.value.error_code == 312
        assert str(err.value) == f"Message not delivered: NO_ROUTE (312) to queue 'nowhere' from exchange '{exchange}'"
        assert _storm_count(connection, queue) == 3

        # basic.get with a manual ack: everything the publisher set comes back
        got = channel.basic.get(queue, no_ack=False)
        assert got.body == '{"i": 0}'
        assert got.method["message_count"] == 2
        assert (got.method["exchange"], got.method["routing_key"], got.redelivered) == (exchange, "jobs", False)
        assert got.properties["headers"] == dict(HEADERS, i=0)
        assert (got.delivery_mode, got.content_type, got.content_encoding) == (2, "application/json", "utf-8")
        assert (got.message_id, got.correlation_id, got.app_id) == ("id-0", "c-0", "storm")
        assert got.timestamp == datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
        assert got.json() == {"i": 0}
        # nack with requeue puts it back at the head, marked redelivered
        got.nack(requeue=True)
        again = channel.basic.get(queue, no_ack=False)
        assert (again.body, again.redelivered, again.method["message_count"]) == ('{"i": 0}', True, 2)
        again.ack()

        # consume with manual acks and a prefetch of 1
        channel.basic.qos(prefetch_count=1)
        consumed = []

        def on_message(message):
            consumed.append((message.body, message.properties["headers"]["i"], message.redelivered,
                             message.method["consumer_tag"]))
            message.ack()

        tag = channel.basic.consume(on_message, queue, consumer_tag=f"storm-{uid}", no_ack=False)
        assert tag == f"storm-{uid}"
        deadline = time.monotonic() + 5
        while len(consumed) < 2 and time.monotonic() < deadline:
            channel.process_data_events()
            time.sleep(0.01)
        assert consumed == [('{"i": 1}', 1, False, tag), ('{"i": 2}', 2, False, tag)]
        assert channel.basic.cancel(tag) == {"consumer_tag": tag}
        assert channel.basic.get(queue) is None  # basic.get-empty
        channel.close()
        assert _storm_count(connection, queue) == 0  # the acks took: nothing came back on close

        # a message taken with basic.get but never acked returns to the queue on channel close
        with connection.channel() as ch:
            ch.basic.publish("unacked", queue)  # through the default exchange
            assert ch.basic.get(queue).body == "unacked"
        assert _storm_count(connection, queue) == 1
        with connection.channel() as ch:
            back = ch.basic.get(queue, no_ack=True)
            assert (back.body, back.redelivered) == ("unacked", True)

        # a transaction: publishes are invisible until commit, discarded by rollback
        with connection.channel() as ch:
            assert ch.tx.select() == {}
            ch.basic.publish("rolled back", "jobs", exchange=exchange)
            assert _storm_count(connection, queue) == 0
            assert ch.tx.rollback() == {}
            assert _storm_count(connection, queue) == 0
            with ch.tx:  # amqpstorm's context manager: select on entry, commit on exit
                ch.basic.publish("committed", "jobs", exchange=exchange, properties={"delivery_mode": 2})
                assert _storm_count(connection, queue) == 0
            assert _storm_count(connection, queue) == 1
            assert ch.basic.get(queue, no_ack=True).body == "committed"

        # channel errors raise AMQPChannelError with the code and RabbitMQ's text; the
        # connection stays usable
        ch = connection.channel()
        with pytest.raises(AMQPChannelError) as err:
            ch.queue.declare(missing, passive=True)
        assert err.value.error_code == 404
        assert err.value.error_type == "NOT-FOUND"
        assert str(err.value) == f"Channel {ch.channel_id} was closed by remote server: {_no_queue(missing)}"
        assert ch.is_closed

        ch = connection.channel()
        with pytest.raises(AMQPChannelError) as err:
            ch.exchange.declare(exchange, exchange_type="fanout", auto_delete=True)
        assert err.value.error_code == 406
        assert str(err.value) == (
            f"Channel {ch.channel_id} was closed by remote server: PRECONDITION_FAILED - inequivalent arg "
            f"'type' for exchange '{exchange}' in vhost '/': received 'fanout' but current is 'direct'")

        with connection.channel() as ch:
            assert ch.queue.delete(queue) == {"message_count": 0}
            assert ch.exchange.delete(exchange) == {}
    assert connection.is_closed


# ------------------------------------------------------------------ rabbitpy


def _rabbitpy_count(connection, queue):
    import rabbitpy
    with connection.channel() as ch:
        return rabbitpy.Queue(ch, queue).declare(passive=True)[0]


def test_rabbitpy_round_trip(broker, uid):
    import rabbitpy
    from rabbitpy import exceptions

    exchange_name, queue_name = f"rpy-x-{uid}", f"rpy-q-{uid}"
    missing = f"rpy-missing-{uid}"
    url = f"amqp://guest:guest@{broker.host}:{broker.port}/%2F?connection_timeout=10"
    with rabbitpy.Connection(url) as connection:
        assert connection.capabilities["publisher_confirms"] is True

        with connection.channel() as channel:
            exchange = rabbitpy.TopicExchange(channel, exchange_name, auto_delete=True)
            exchange.declare()
            queue = rabbitpy.Queue(channel, queue_name, exclusive=True)
            assert queue.declare() == (0, 0)
            assert queue.bind(exchange, "orders.*") is True

            # publisher confirms: publish() waits for each basic.ack and returns True
            channel.enable_publisher_confirms()
            for i in range(3):
                message = rabbitpy.Message(channel, {"i": i}, {  # a dict body: JSON-serialised
                    "headers": dict(HEADERS, i=i), "delivery_mode": 2, "message_type": "order",
                    "message_id": f"id-{i}", "priority": 3, "expiration": "60000"})
                assert message.properties["content_type"] == "application/json"
                assert message.publish(exchange, f"orders.{i}") is True
            assert _rabbitpy_count(connection, queue_name) == 3

            # basic.get with a manual ack
            got = queue.get(acknowledge=True)
            assert got.json() == {"i": 0}
            assert (got.exchange, got.routing_key, got.redelivered) == (exchange_name, "orders.0", False)
            assert got.method.message_count == 2
            props = got.properties
            assert props["headers"] == dict(HEADERS, i=0)
            assert (props["delivery_mode"], props["content_type"], props["message_type"]) == (
                2, "application/json", "order")
            assert (props["message_id"], props["priority"], props["expiration"]) == ("id-0", 3, "60000")
            got.nack(requeue=True)  # back at the head, redelivered
            again = queue.get()
            assert (again.json(), again.redelivered) == ({"i": 0}, True)
            again.ack()

            # consume with manual acks (the generator API); stop after two messages
            consumed = []
            for message in queue.consume(prefetch=1, consumer_tag=f"rpy-{uid}"):
                consumed.append((message.json(), message.routing_key, message.redelivered,
                                 message.method.consumer_tag))
                message.ack()
                if len(consumed) == 2:
                    queue.stop_consuming()
            assert consumed == [({"i": 1}, "orders.1", False, f"rpy-{uid}"),
                                ({"i": 2}, "orders.2", False, f"rpy-{uid}")]
            assert queue.get() is None  # basic.get-empty
        assert _rabbitpy_count(connection, queue_name) == 0  # the acks took

        # a transaction (its own channel: tx and confirms do not mix)
        with connection.channel() as channel:
            queue = rabbitpy.Queue(channel, queue_name)
            tx = rabbitpy.Tx(channel)
            assert tx.select() is True
            rabbitpy.Message(channel, "rolled back").publish(exchange_name, "orders.tx")
            assert _rabbitpy_count(connection, queue_name) == 0
            assert tx.rollback() is True
            assert _rabbitpy_count(connection, queue_name) == 0
            with rabbitpy.Tx(channel):  # select on entry, commit on exit
                rabbitpy.Message(channel, "committed").publish(exchange_name, "orders.tx")
                assert _rabbitpy_count(connection, queue_name) == 0
            assert _rabbitpy_count(connection, queue_name) == 1
            got = queue.get(acknowledge=False)
            assert (got.body, got.routing_key) == (b"committed", "orders.tx")

        # an unroutable mandatory publish: rabbitpy raises the basic.return. (rabbitpy 3.0.2
        # leaves the returned message's content frames in the channel's read queue, where they
        # corrupt the next message it reads, whatever the broker: use a channel just for this.)
        channel = connection.channel()
        channel.enable_publisher_confirms()
        with pytest.raises(exceptions.MessageReturnedException) as err:
            rabbitpy.Message(channel, b"lost").publish(exchange_name, "nowhere", mandatory=True)
        assert err.value.args == (312, "NO_ROUTE", exchange_name, "nowhere")
        channel.close()

        # channel errors raise the reply code's exception, carrying RabbitMQ's channel.close.
        # rabbitpy 3.0.2 never answers a server's channel.close with close-ok and reuses the
        # channel's number for its next channel, whose channel.open RabbitMQ answers with
        # connection.close 504 (see test_channel_open_while_awaiting_close_ok_is_a_connection_error;
        # rabbitpy then needs 30 s to notice the connection is gone): so open every channel
        # before the errors.
        not_found, inequivalent, last = connection.channel(), connection.channel(), connection.channel()
        with pytest.raises(exceptions.AMQPNotFound) as err:
            rabbitpy.Queue(not_found, missing).declare(passive=True)
        close = err.value.args[0]
        assert (close.reply_code, close.reply_text) == (404, _no_queue(missing))
        assert (close.class_id, close.method_id) == (50, 10)  # queue.declare

        with pytest.raises(exceptions.AMQPPreconditionFailed) as err:
            rabbitpy.DirectExchange(inequivalent, exchange_name, auto_delete=True).declare()
        close = err.value.args[0]
        assert (close.reply_code, close.reply_text) == (406, (
            f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{exchange_name}' in vhost '/': "
            "received 'direct' but current is 'topic'"))
        assert (close.class_id, close.method_id) == (40, 10)  # exchange.declare

        rabbitpy.Queue(last, queue_name).delete()
        rabbitpy.TopicExchange(last, exchange_name).delete()
        last.close()


def test_channel_open_while_awaiting_close_ok_is_a_connection_error(broker, uid):
    """What rabbitpy 3.0.2 runs into when it opens a channel after a channel error (it never
    sends close-ok and reuses the number), on raw frames: after the broker's channel.close,
    RabbitMQ drops the client's other methods on that channel until close-ok, but a
    channel.open there is a connection error."""
    from pamqp import commands
    from rawamqp import connect

    missing = f"raw-missing-{uid}"
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=missing, passive=True))
        close = client.expect(commands.Channel.Close, 1)
        assert (close.reply_code, close.reply_text) == (404, _no_queue(missing))
        # dropped: no reply, no error
        client.send_method(1, commands.Queue.Declare(queue=missing, passive=True))
        client.publish(1, "", missing, b"dropped")
        assert client.frames_until_quiet(0.2) == []
        client.send_method(1, commands.Channel.Open())
        client.expect_connection_close(504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


# ------------------------------------------------------------------ node amqplib


def test_node_amqplib_round_trip(broker, uid):
    """tests/node/roundtrip.js (amqplib, installed by `npm ci` in tests/node) against the
    broker. Missing node or amqplib is a failure, not a skip: CI installs both."""
    node = shutil.which("node")
    assert node, "node is not installed (CI installs node 20)"
    assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "amqplib")), (
        "amqplib is not installed: run `npm ci` in tests/node")
    result = subprocess.run([node, os.path.join(NODE_DIR, "roundtrip.js"), str(broker.port), uid],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, AMQP_HOST=broker.host))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert lines == [
        "connected",
        "declared",
        "confirmed 3",
        f"returned 312 NO_ROUTE node-x-{uid} nowhere",
        "get m0 redelivered=false",
        "get m0 redelivered=true",
        "consumed m1,m2",
        "get empty",
        f"error 404 Channel closed by server: 404 (NOT-FOUND) with message \"{_no_queue(f'node-missing-{uid}')}\"",
        "ok",
    ], result.stderr
