"""Classic queues across a cluster's nodes, the basics: a queue declared through one node is
published to through a second and consumed through a third, with confirms and acks."""

from __future__ import annotations

import pika

AUTH = pika.PlainCredentials("guest", "guest")


def connect(node) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, "/", AUTH)).channel()


def test_publish_through_one_node_consume_through_another(make_node):
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    c = make_node("warren-c@localhost")
    ca, cb, cc = connect(a), connect(b), connect(c)
    ca.queue_declare("q", durable=True)
    cb.queue_bind("q", "amq.direct", "k")
    cb.confirm_delivery()
    for i in range(20):
        cb.basic_publish("amq.direct", "k", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    assert cc.queue_declare("q", passive=True).method.message_count == 20
    got = []
    for _ in range(20):
        method, props, body = next(cc.consume("q", inactivity_timeout=5))
        assert method is not None
        assert (method.exchange, method.routing_key) == ("amq.direct", "k")
        got.append(body.decode())
        cc.basic_ack(method.delivery_tag)
    cc.cancel()
    assert got == [f"m{i}" for i in range(20)]
    assert ca.queue_declare("q", passive=True).method.message_count == 0
    # get, purge and delete through other nodes
    cb.basic_publish("", "q", b"x", pika.BasicProperties(delivery_mode=2))
    method, _, body = cc.basic_get("q")
    assert body == b"x" and method.message_count == 0
    cc.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = cb.basic_get("q", auto_ack=True)
    assert body == b"x" and method.redelivered
    cb.basic_publish("", "q", b"y")
    assert cc.queue_purge("q").method.message_count == 1
    cb.basic_publish("", "q", b"z")
    assert cb.queue_delete("q").method.message_count == 1
    for ch in (ca, cb, cc):
        try:
            ch.queue_declare("q", passive=True)
            raise AssertionError("still there")
        except pika.exceptions.ChannelClosedByBroker as err:
            assert err.reply_code == 404

