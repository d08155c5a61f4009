"""Dead-lettering in the model, without sockets: what a queue counts, and what it does with a
dead letter that cannot go anywhere."""

import logging

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.broker import Broker


def setup():
    broker = Broker.with_defaults()
    return broker, ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])


def publish(a, queue, body=b"x"):
    message, queues = ops.route(a, "", queue, shortstr("") + shortstr(queue), encode_header(len(body), {}), body)
    return ops.enqueue(message, queues)


def reject_head(q):
    qm = q.get()
    q.delivered(qm, False, True)
    q.reject(qm, False)


def test_counts_by_reason_and_fate():
    broker, a = setup()
    ops.declare_queue(a, "dlq")
    work, _ = ops.declare_queue(a, "work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq",
                                                      "x-max-length": 1})
    plain, _ = ops.declare_queue(a, "plain", arguments={"x-max-length": 1})
    for q in ("work", "plain"):
        publish(a, q, b"1")
        publish(a, q, b"2")  # drops the head
        reject_head(broker.vhosts["/"].queues[q])
    assert (work.stats["dead_lettered_maxlen"], work.stats["dead_lettered_rejected"]) == (1, 1)
    assert (plain.stats["dropped_maxlen"], plain.stats["dropped_rejected"]) == (1, 1)
    assert [qm.message.body for qm in broker.vhosts["/"].queues["dlq"].store.peek_all()] == [b"1", b"2"]


def test_missing_dlx_drops_and_warns_once(caplog):
    broker, a = setup()
    q, _ = ops.declare_queue(a, "w", arguments={"x-dead-letter-exchange": "nowhere"})
    with caplog.at_level(logging.WARNING, logger="warren.dead_letter"):
        for _ in range(3):
            publish(a, "w")
            reject_head(q)
    assert q.stats["dropped_rejected"] == 3 and q.message_count == 0
    assert [r.getMessage() for r in caplog.records].count(
        "dead-letter exchange 'nowhere' of queue 'w' in vhost '/' does not exist; dead-lettered messages are dropped") == 1
    publish(a, "w", b"still works")
    assert q.get().message.body == b"still works"


def test_dead_letter_routing_key_too_long_for_a_delivery(caplog):
    """RabbitMQ accepts such a key at declare and fails later; Warren drops the dead letter
    with a warning, and the queue keeps working."""
    broker, a = setup()
    ops.declare_queue(a, "dlq")
    q, _ = ops.declare_queue(a, "w", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k" * 300})
    with caplog.at_level(logging.WARNING, logger="warren.dead_letter"):
        publish(a, "w")
        reject_head(q)
    assert q.stats["dropped_rejected"] == 1
    assert "longer than 255 bytes" in caplog.text
    publish(a, "w", b"next")
    assert q.get().message.body == b"next"
