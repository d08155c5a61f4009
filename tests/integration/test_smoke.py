"""The first things a user does: connect, declare, publish, consume."""

import pika
import pytest


def test_publish_get_consume(channel, uid):
    q = f"smoke-{uid}"
    channel.queue_declare(q)
    channel.basic_publish("", q, b"one", pika.BasicProperties(content_type="text/plain"))
    method, props, body = channel.basic_get(q, auto_ack=True)
    assert body == b"one" and props.content_type == "text/plain"
    assert method.routing_key == q and method.exchange == ""
    channel.basic_publish("", q, b"two")
    got = []

    def on_message(ch, m, p, b):
        got.append(b)
        ch.basic_ack(m.delivery_tag)
        ch.stop_consuming()

    channel.basic_consume(q, on_message)
    channel.start_consuming()
    assert got == [b"two"]


def test_unknown_exchange_is_404(channel):
    channel.basic_publish("no-such-exchange", "k", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        channel.queue_declare("", exclusive=True)
    assert err.value.reply_code == 404
    assert err.value.reply_text == "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
