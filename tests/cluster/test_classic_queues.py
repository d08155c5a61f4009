"""Classic queues on a cluster of three nodes a, b, c: a classic queue lives on the node whose
connection declared it (its home) and is used through every node as on one node: publishes,
deliveries, acks, gets, rejects, purges, deletes, declare-ok counts, prefetch, exclusive
queues, the HTTP API. When its home is down, every operation on it through another node is
refused with RabbitMQ's 404, publishes to it are returned (mandatory) or dropped, its
consumers elsewhere are cancelled; when a consumer's node dies, its unacked messages go back.

The same tests run against a RabbitMQ 3.10 cluster with WARREN_TEST_RABBITMQ_CLUSTER=1
(members.py), where the node names are rabbit-a@localhost, ...."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
import requests

from .members import AUTH, RABBITMQ, Member, wait_for

PERSISTENT = 2


def no_queue(name: str) -> tuple[int, str]:
    return 404, f"NOT_FOUND - no queue '{name}' in vhost '/'"


def home_down(home: Member, name: str = "q") -> tuple[int, str]:
    return 404, (f"NOT_FOUND - home node '{home.name}' of durable queue '{name}' in vhost '/' is down or "
                 "inaccessible")


def locked(name: str) -> tuple[int, str]:
    return 405, (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It "
                 "could be originally declared on another connection or the exclusive property value does not "
                 "match that of the original declaration.")


def counts(member: Member, name: str = "q") -> tuple[int, int]:
    """(message_count, consumer_count) of a passive declare through `member`."""
    connection = member.connect()
    try:
        ok = connection.channel().queue_declare(name, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        connection.close()


def refusal(member: Member, operation) -> tuple[int, str] | None:
    """operation(channel) on a fresh connection to `member`: the channel's close, or None."""
    connection = member.connect()
    try:
        operation(connection.channel())
        return None
    except pika.exceptions.ChannelClosedByBroker as closed:
        return closed.reply_code, closed.reply_text
    finally:
        if connection.is_open:
            connection.close()


def api_get(member: Member, path: str) -> requests.Response:
    return requests.get(member.api + path, auth=AUTH, timeout=10)


def publish_confirmed(member: Member, name: str, bodies: list[bytes]) -> None:
    connection = member.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", name, body, pika.BasicProperties(delivery_mode=PERSISTENT))
    connection.close()


def deliveries(connection: pika.BlockingConnection, got: list, n: int, timeout: float = 10) -> None:
    """Process `connection`'s events until `got` holds n entries; then a moment more, and
    there must be no (n + 1)th."""
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert len(got) == n, f"{len(got)} of {n} deliveries"
    connection.process_data_events(time_limit=0.5)
    assert len(got) == n, f"{len(got)} deliveries, not {n}"


def test_published_through_two_nodes_consumed_through_a_third(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    on_b = b.connect()
    via_b = on_b.channel()
    via_b.queue_bind("q", "amq.direct", "orders")
    via_b.confirm_delivery()
    on_c = c.connect()
    via_c = on_c.channel()
    via_c.confirm_delivery()
    sent = []
    for i in range(30):
        exchange, key = ("amq.direct", "orders") if i % 2 else ("", "q")
        props = pika.BasicProperties(delivery_mode=PERSISTENT, content_type="text/plain", priority=3,
                                     correlation_id=f"corr-{i}", message_id=f"b-{i}", app_id="tests",
                                     type="order", timestamp=1700000000 + i, headers={"n": i, "from": "b"})
        via_b.basic_publish(exchange, key, f"b-{i}".encode(), props, mandatory=True)
        sent.append((f"b-{i}", exchange, key, props))
    for i in range(20):
        props = pika.BasicProperties(delivery_mode=PERSISTENT, message_id=f"c-{i}", headers={"n": i, "from": "c"},
                                     expiration="600000")
        via_c.basic_publish("", "q", f"c-{i}".encode(), props, mandatory=True)
        sent.append((f"c-{i}", "", "q", props))
    assert counts(a) == (50, 0)
    got: list = []
    consumer = on_c.channel()
    consumer.basic_consume("q", lambda ch, method, props, body: got.append((method, props, body)))
    deliveries(on_c, got, 50)
    bodies = [body.decode() for _, _, body in got]
    assert sorted(bodies) == sorted(body for body, *_ in sent)  # each once
    assert [body for body in bodies if body.startswith("b-")] == [f"b-{i}" for i in range(30)]
    assert [body for body in bodies if body.startswith("c-")] == [f"c-{i}" for i in range(20)]
    wanted = {body: (exchange, key, props) for body, exchange, key, props in sent}
    for method, props, body in got:
        exchange, key, sent_props = wanted[body.decode()]
        assert (method.exchange, method.routing_key, method.redelivered) == (exchange, key, False)
        for field in ("delivery_mode", "content_type", "priority", "correlation_id", "message_id", "app_id",
                      "type", "timestamp", "headers", "expiration"):
            assert getattr(props, field) == getattr(sent_props, field), (body, field)
    for method, _, _ in got:
        consumer.basic_ack(method.delivery_tag)
    on_c.process_data_events(time_limit=0.1)
    wait_for(lambda: counts(a) == (0, 1), timeout=5, what="the acks to reach the home")
    consumer.close()
    wait_for(lambda: counts(a) == (0, 0), timeout=5, what="the consumer gone")
    for connection in (on_a, on_b, on_c):
        connection.close()


def two_unacked(home: Member, other: Member, count: int):
    """`count` confirmed messages in a durable queue "q" declared through `home`, and a
    consumer through `other` (prefetch 2) holding two of them unacked: the two connections."""
    on_home = home.connect()
    on_home.channel().queue_declare("q", durable=True)
    publish_confirmed(home, "q", [b"m%d" % i for i in range(count)])
    on_other = other.connect()
    consumer = on_other.channel()
    consumer.basic_qos(prefetch_count=2)
    got: list = []
    consumer.basic_consume("q", lambda ch, method, props, body: got.append(body))
    deliveries(on_other, got, 2)
    return on_home, on_other


def test_declare_ok_counts_through_any_node_are_the_homes(members):
    a, b, c = members
    on_a, on_c = two_unacked(a, c, 7)
    for member in (a, b, c):
        assert counts(member) == (5, 1), member.name
        connection = member.connect()
        ok = connection.channel().queue_declare("q", durable=True).method  # an active redeclare
        assert (ok.queue, ok.message_count, ok.consumer_count) == ("q", 5, 1), member.name
        connection.close()
    on_c.close()
    on_a.close()


def test_get_reject_nack_purge_and_delete_through_other_nodes(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    publish_confirmed(a, "q", [b"m%d" % i for i in range(5)])
    on_b = b.connect()
    via_b = on_b.channel()
    method, _, body = via_b.basic_get("q", auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"m0", False, 4)
    method, _, body = via_b.basic_get("q")
    assert (body, method.redelivered) == (b"m1", False)
    via_b.basic_ack(method.delivery_tag)
    method, _, body = via_b.basic_get("q")
    assert (body, method.redelivered) == (b"m2", False)
    via_b.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = via_b.basic_get("q")
    assert (body, method.redelivered) == (b"m2", True)  # back at its place, redelivered
    via_b.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = via_b.basic_get("q")
    assert (body, method.redelivered, method.message_count) == (b"m2", True, 2)
    via_b.basic_ack(method.delivery_tag)
    assert counts(a) == (2, 0)
    on_c = c.connect()
    assert on_c.channel().queue_purge("q").method.message_count == 2
    assert counts(b) == (0, 0)
    # delete if-unused through b while a consumer on c exists.
    consumer = on_c.channel()
    consumer.basic_consume("q", lambda *delivery: None)
    assert refusal(b, lambda ch: ch.queue_delete("q", if_unused=True)) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' in use")
    consumer.close()
    wait_for(lambda: counts(a) == (0, 0), timeout=5, what="the consumer gone")
    publish_confirmed(c, "q", [b"n%d" % i for i in range(3)])
    assert via_b.queue_delete("q").method.message_count == 3
    for member in (a, b, c):
        assert refusal(member, lambda ch: ch.queue_declare("q", passive=True)) == no_queue("q"), member.name
    for connection in (on_a, on_b, on_c):
        connection.close()


def test_inequivalent_redeclare_through_another_node(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True, arguments={"x-max-length": 10})
    assert refusal(b, lambda ch: ch.queue_declare("q", durable=True, arguments={"x-max-length": 20})) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
             "received '20' but current is '10'")
    assert refusal(c, lambda ch: ch.queue_declare("q", durable=True)) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
             "received none but current is the value '10' of type 'signedint'")
    assert refusal(b, lambda ch: ch.queue_declare("q", durable=False, arguments={"x-max-length": 10})) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': "
             "received 'false' but current is 'true'")
    assert counts(c) == (0, 0)  # still there, unchanged
    on_a.close()


def test_an_exclusive_queue_is_locked_from_other_nodes_and_goes_with_its_owner(members):
    a, b, c = members
    owner = a.connect()
    owner.channel().queue_declare("excl", exclusive=True)
    for operation in (lambda ch: ch.queue_declare("excl", passive=True),
                      lambda ch: ch.queue_declare("excl", exclusive=True),
                      lambda ch: ch.basic_consume("excl", lambda *delivery: None),
                      lambda ch: ch.basic_get("excl"),
                      lambda ch: ch.queue_purge("excl"),
                      lambda ch: ch.queue_delete("excl"),
                      lambda ch: ch.queue_bind("excl", "amq.direct", "k")):
        assert refusal(b, operation) == locked("excl")
    assert refusal(c, lambda ch: ch.queue_declare("excl", passive=True)) == locked("excl")
    owner.close()
    for member in (a, b, c):
        wait_for(lambda: refusal(member, lambda ch: ch.queue_declare("excl", passive=True)) == no_queue("excl"),
                 timeout=5, what=f"the exclusive queue gone on {member.name}")


def test_prefetch_limits_a_consumer_on_another_node(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    publish_confirmed(a, "q", [b"m%d" % i for i in range(50)])
    on_c = c.connect()
    consumer = on_c.channel()
    consumer.basic_qos(prefetch_count=5)
    got: list = []
    consumer.basic_consume("q", lambda ch, method, props, body: got.append((method.delivery_tag, body)))
    deliveries(on_c, got, 5)
    consumer.basic_ack(got[0][0])
    deliveries(on_c, got, 6)
    consumer.basic_ack(got[3][0], multiple=True)  # 2..4 too: three more
    deliveries(on_c, got, 9)
    assert [body for _, body in got] == [b"m%d" % i for i in range(9)]
    assert counts(b) == (41, 1)
    on_c.close()
    wait_for(lambda: counts(a) == (46, 0), timeout=5, what="the 5 unacked back")
    on_a.close()


def test_with_its_home_down_a_queue_is_refused_everywhere_and_back_with_it(members):
    a, b, c = members
    on_b = b.connect()
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    via_b = on_b.channel()
    via_b.queue_bind("q", "amq.direct", "orders")
    via_b.confirm_delivery()
    for i in range(3):
        via_b.basic_publish("amq.direct", "orders", b"m%d" % i, pika.BasicProperties(delivery_mode=PERSISTENT))
    via_b.basic_publish("", "q", b"m3", pika.BasicProperties(delivery_mode=PERSISTENT), mandatory=True)  # no return
    on_b.close()
    assert counts(c) == (4, 0)
    a.kill()
    down = home_down(a)
    wait_for(lambda: refusal(b, lambda ch: ch.queue_declare("q", passive=True)) == down, timeout=10,
             what="the queue's home seen down")
    for operation in (lambda ch: ch.queue_declare("q", passive=True),
                      lambda ch: ch.queue_declare("q", durable=True),
                      lambda ch: ch.queue_declare("q", durable=False),  # the home's check comes first
                      lambda ch: ch.basic_consume("q", lambda *delivery: None),
                      lambda ch: ch.basic_get("q"),
                      lambda ch: ch.queue_purge("q"),
                      lambda ch: ch.queue_bind("q", "amq.fanout"),
                      lambda ch: ch.queue_unbind("q", "amq.direct", "orders"),
                      lambda ch: ch.queue_delete("q"),
                      lambda ch: ch.queue_delete("q", if_empty=True)):
        assert refusal(b, operation) == down
    assert refusal(c, lambda ch: ch.queue_declare("q", passive=True)) == down
    on_b = b.connect()
    via_b = on_b.channel()
    via_b.confirm_delivery()
    for exchange, key in (("amq.direct", "orders"), ("", "q")):
        with pytest.raises(pika.exceptions.UnroutableError) as returned:
            via_b.basic_publish(exchange, key, b"lost", pika.BasicProperties(delivery_mode=PERSISTENT),
                                mandatory=True)
        [message] = returned.value.messages
        assert (message.method.reply_code, message.method.reply_text, message.body) == (312, "NO_ROUTE", b"lost")
    via_b.basic_publish("", "q", b"dropped", pika.BasicProperties(delivery_mode=PERSISTENT))  # confirmed
    on_b.close()
    listed = [q for q in api_get(b, "/queues").json() if q["name"] == "q"]
    assert listed == [{"arguments": {}, "auto_delete": False, "durable": True, "exclusive": False, "name": "q",
                       "node": a.name, "state": "down", "type": "classic", "vhost": "/"}]
    one = api_get(b, "/queues/%2F/q")
    assert (one.status_code, one.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    a.restart()
    wait_for(lambda: refusal(b, lambda ch: ch.queue_declare("q", passive=True)) is None, timeout=30,
             what="the queue back with its home")
    assert counts(b) == (4, 0)  # its confirmed messages, none of those published meanwhile
    on_b = b.connect()
    via_b = on_b.channel()
    via_b.basic_publish("amq.direct", "orders", b"m4")  # the binding made through b is still there
    bodies = []
    while len(bodies) < 5:
        method, _, body = via_b.basic_get("q", auto_ack=True)
        assert method is not None, bodies
        bodies.append(body)
    assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    on_b.close()


def test_a_dead_consumers_unacked_messages_go_back_to_the_home(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    publish_confirmed(a, "q", [b"m%d" % i for i in range(10)])
    on_c = c.connect()
    consumer = on_c.channel()
    got: list = []
    consumer.basic_consume("q", lambda ch, method, props, body: got.append(body))
    deliveries(on_c, got, 10)
    assert counts(a) == (0, 1)
    c.kill()
    wait_for(lambda: counts(a) == (10, 0), timeout=15, what="the 10 unacked back on a")
    back: list = []
    channel = on_a.channel()
    channel.basic_consume("q", lambda ch, method, props, body: back.append((body, method.redelivered)),
                          auto_ack=True)
    deliveries(on_a, back, 10)
    assert back == [(b"m%d" % i, True) for i in range(10)]
    on_a.close()


def test_a_consumer_is_cancelled_when_the_queues_home_dies(members):
    a, b, c = members
    on_a = a.connect()
    on_a.channel().queue_declare("q", durable=True)
    publish_confirmed(a, "q", [b"m0"])
    on_b = b.connect()
    consumer = on_b.channel()
    got: list = []
    cancelled: list = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume("q", lambda ch, method, props, body: got.append(body), auto_ack=True)
    deliveries(on_b, got, 1)
    a.kill()
    deadline = time.monotonic() + 15
    while not cancelled and time.monotonic() < deadline:
        on_b.process_data_events(time_limit=0.05)
    assert cancelled == [tag]
    assert consumer.is_open and on_b.is_open  # a cancel, not a close
    on_b.close()


def test_the_http_api_of_every_node_shows_the_queue_on_its_home(members):
    a, b, c = members
    on_a, on_c = two_unacked(a, c, 5)
    wanted = {"name": "q", "vhost": "/", "node": a.name, "type": "classic", "state": "running", "durable": True,
              "messages": 5, "messages_ready": 3, "messages_unacknowledged": 2, "consumers": 1}

    def shown(member: Member) -> list[dict]:
        listed = [{k: q.get(k) for k in wanted} for q in api_get(member, "/queues").json() if q["name"] == "q"]
        one = api_get(member, "/queues/%2F/q")
        return listed + [{k: one.json().get(k) for k in wanted} if one.status_code == 200 else {}]
    for member in (b, c):
        wait_for(lambda: shown(member) == [wanted, wanted], timeout=15, what=f"the queue's stats through {member.name}")
    on_c.close()
    on_a.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_consumer_through_another_node_gets_its_whole_prefetch_before_acking(members, queue_type):
    """A prefetch larger than a link's delivery window (256) is filled without an ack, as on
    the queue's home: a client acking every 500 of a prefetch of 1,000 is not stalled."""
    a, b, c = members
    name = f"q-wide-{queue_type}"
    on_a = a.connect()
    on_a.channel().queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    publish_confirmed(a, name, [b"%d" % i for i in range(1200)])
    on_b = b.connect()
    channel = on_b.channel()
    channel.basic_qos(prefetch_count=1000)
    got = []
    for method, _, body in channel.consume(name, inactivity_timeout=3):
        if method is None:
            break
        got.append(int(body))
    assert got == list(range(1000))
    on_b.close()
    on_a.close()
