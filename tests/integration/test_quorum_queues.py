"""x-queue-type=quorum, as RabbitMQ 3.10 runs it on one node (rabbit_quorum_queue.erl,
rabbit_fifo.erl): declare rules, the delivery limit and x-delivery-count, where returned
messages go, and what quorum queues refuse. Every case was checked on RabbitMQ 3.10.8.

RabbitMQ applies a quorum queue's commands asynchronously (Raft), so the tests wait for
counts and poll with basic.get where a message moves (dlx_helpers)."""

import time

import pika
import pytest
import requests

from conftest import EXTERNAL, channel_error, connection_error
from .dlx_helpers import deaths, get_one, wait_count, wait_until


QQ = {"x-queue-type": "quorum"}
warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="needs its own Warren broker")


def quorum(ch, name, **args):
    """Declare a quorum queue with these x-arguments (x_delivery_limit=... for x-delivery-limit)."""
    ch.queue_declare(name, durable=True, arguments={**QQ, **{k.replace("_", "-"): v for k, v in args.items()}})
    return name


def with_dlq(ch, names, label, **args):
    """A quorum queue dead-lettering through the default exchange to a classic DLQ."""
    q, dlq = names(label), names(label + "-dlq")
    ch.queue_declare(dlq, durable=True)
    quorum(ch, q, x_dead_letter_exchange="", x_dead_letter_routing_key=dlq, **args)
    return q, dlq


def take(ch, q):
    """basic.get (unacked) the next message, polling: (method, properties, body)."""
    return get_one(ch, q, auto_ack=False)


def drain(ch, q):
    out = []
    while True:
        method, props, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            return out
        out.append(body.decode())


# ------------------------------------------------------------------------- declare
@pytest.mark.parametrize("durable, exclusive, auto_delete, prop", [
    (False, False, False, "non-durable"),
    (True, True, False, "exclusive-owner"),
    (False, True, False, "exclusive-owner"),
    (True, False, True, "auto-delete"),
    (True, True, True, "auto-delete"),  # auto-delete is checked first
])
def test_quorum_queues_are_durable_only(channel, uid, durable, exclusive, auto_delete, prop):
    q = f"qqprop-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                                                arguments=QQ), 406,
                  f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{q}' in vhost '/'")


@pytest.mark.parametrize("key, value", [
    ("x-max-priority", 5), ("x-queue-mode", "lazy"), ("x-queue-version", 2),
    ("x-queue-master-locator", "client-local"), ("x-max-age", "1D"),
    ("x-stream-max-segment-size-bytes", 100), ("x-initial-cluster-size", 1)])
def test_arguments_of_other_queue_types_are_refused(channel, uid, key, value):
    q = f"qqarg-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=True, arguments={**QQ, key: value}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/' "
                  "of queue type rabbit_quorum_queue")


def test_argument_errors_come_before_property_errors(channel, uid):
    q = f"qqorder-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=False, arguments={**QQ, "x-max-priority": 5}), 406,
                  f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{q}' in vhost '/' "
                  "of queue type rabbit_quorum_queue")


@pytest.mark.parametrize("args, detail", [
    ({"x-dead-letter-strategy": "bogus"}, ("x-dead-letter-strategy", "invalid_dlx_strategy")),
    ({"x-dead-letter-strategy": 5}, ("x-dead-letter-strategy", "{unacceptable_type,signedint}")),
    ({"x-quorum-initial-group-size": 0}, ("x-quorum-initial-group-size", "{value_zero,0}")),
    ({"x-quorum-initial-group-size": -1}, ("x-quorum-initial-group-size", "{value_negative,-1}")),
    ({"x-quorum-initial-group-size": "a"}, ("x-quorum-initial-group-size", '"expected integer, got longstr"')),
    ({"x-queue-leader-locator": 5}, ("x-queue-leader-locator", "{unacceptable_type,signedint}")),
    ({"x-queue-leader-locator": "nearest"}, ("x-queue-leader-locator", "invalid_queue_locator_arg")),
    ({"x-max-in-memory-length": -1}, ("x-max-in-memory-length", "{value_negative,-1}")),
    ({"x-overflow": "bogus"}, ("x-overflow", "invalid_overflow")),
    ({"x-dead-letter-routing-key": "rk"}, ("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")),
])
def test_invalid_argument_values(channel, uid, args, detail):
    q = f"qqbad-{uid}"
    key, err = detail
    channel_error(lambda: channel.queue_declare(q, durable=True, arguments={**QQ, **args}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/': {err}")


@pytest.mark.parametrize("args", [
    {"x-delivery-limit": 3}, {"x-delivery-limit": -1}, {"x-delivery-limit": "abc"},
    {"x-dead-letter-strategy": "at-least-once"}, {"x-dead-letter-strategy": "at-most-once"},
    {"x-max-in-memory-length": 10, "x-max-in-memory-bytes": 1000}, {"x-quorum-initial-group-size": 3},
    {"x-queue-leader-locator": "client-local"}, {"x-queue-leader-locator": "balanced"},
    {"x-overflow": "reject-publish"}, {"x-overflow": "reject-publish-dlx"}, {"x-single-active-consumer": True},
    {"x-message-ttl": 1000, "x-expires": 60000, "x-max-length": 5, "x-max-length-bytes": 100},
    {"x-cancel-on-ha-failover": True, "x-custom": 1},  # unknown: ignored, as for a classic queue
], ids=lambda a: ",".join(a))
def test_accepted_arguments(channel, names, args):
    q = names("qqok")
    assert channel.queue_declare(q, durable=True, arguments={**QQ, **args}).method.queue == q


def test_server_named_quorum_queue_is_refused(channel):
    channel_error(lambda: channel.queue_declare("", durable=True, arguments=QQ), 406,
                  "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue")


def test_redeclare_across_types_and_quorum_arguments(connection, names):
    cq, qq = names("cq"), names("qq")
    ch = connection.channel()
    ch.queue_declare(cq, durable=True)
    ch.queue_declare(cq, durable=True, arguments={"x-queue-type": "classic"})
    channel_error(lambda: ch.queue_declare(cq, durable=True, arguments=QQ), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{cq}' in vhost '/': "
                  "received the value 'quorum' of type 'longstr' but current is none")
    ch = connection.channel()
    quorum(ch, qq, x_delivery_limit=2)
    quorum(ch, qq, x_delivery_limit=2, x_max_priority=3)  # not a quorum argument: not compared
    for args, text in [
        ({}, "inequivalent arg 'x-queue-type' for queue '{q}' in vhost '/': received none but current is "
             "the value 'quorum' of type 'longstr'"),
        ({"x-queue-type": "classic", "x-delivery-limit": 2},
         "inequivalent arg 'x-queue-type' for queue '{q}' in vhost '/': received 'classic' but current is 'quorum'"),
        ({**QQ, "x-delivery-limit": 3},
         "inequivalent arg 'x-delivery-limit' for queue '{q}' in vhost '/': received '3' but current is '2'"),
        ({**QQ, "x-delivery-limit": 2, "x-max-in-memory-length": 3},
         "inequivalent arg 'x-max-in-memory-length' for queue '{q}' in vhost '/': received the value '3' of "
         "type 'signedint' but current is none"),
        ({**QQ, "x-delivery-limit": 2, "x-expires": 100000, "x-max-length": 4},
         "inequivalent arg 'x-expires' for queue '{q}' in vhost '/': received the value '100000' of type "
         "'signedint' but current is none"),
    ]:
        ch = connection.channel()
        channel_error(lambda: ch.queue_declare(qq, durable=True, arguments=args), 406,
                      "PRECONDITION_FAILED - " + text.format(q=qq))


@pytest.mark.parametrize("flag", ["if_unused", "if_empty"])
def test_delete_if_unused_or_if_empty_is_not_implemented(broker, names, flag):
    q = names("qqdel")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    quorum(ch, q)
    connection_error(lambda: ch.queue_delete(q, **{flag: True}), 540,
                     f"NOT_IMPLEMENTED - cannot delete queue '{q}' in vhost '/'. queue.delete operations with "
                     f"{flag.replace('_', '-')} flag set are not supported by quorum queues")


def test_global_qos_is_refused_at_consume(broker, names):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    q = quorum(ch, names("qqglobal"))
    ch.basic_qos(prefetch_count=5, global_qos=True)
    assert ch.basic_get(q) == (None, None, None)  # basic.get is fine
    connection_error(lambda: ch.basic_consume(q, lambda *a: None), 540,
                     f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    ch.basic_qos(prefetch_count=0, global_qos=True)  # no global limit any more
    ch.basic_consume(q, lambda *a: None)
    ch.basic_qos(prefetch_count=5, global_qos=True)  # once consuming, it is not checked again
    conn.close()


def test_basic_get_with_single_active_consumer_is_refused(channel, names):
    q = quorum(channel, names("qqsac"), x_single_active_consumer=True)
    channel_error(lambda: channel.basic_get(q), 405,
                  f"RESOURCE_LOCKED - cannot obtain access to locked queue '{q}' in vhost '/'. basic.get "
                  "operations are not supported by quorum queues with single active consumer")


# ------------------------------------------------------------------ delivery limit
def _return_until_gone(ch, q, how="nack", rounds=8):
    """Take the queue's one message and return it (requeue) until it is gone: the
    (redelivered, x-delivery-count) of each delivery."""
    seen = []
    for _ in range(rounds):
        method, props, _ = ch.basic_get(q)
        if method is None:
            time.sleep(0.05)  # the return may still be on its way (RabbitMQ)
            method, props, _ = ch.basic_get(q)
            if method is None:
                break
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count")))
        if how == "nack":
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_reject(method.delivery_tag, requeue=True)
    return seen


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_delivery_limit_dead_letters_after_limit_returns(channel, names, limit):
    """A message may come back `limit` times: on the next return it is dead-lettered with
    reason delivery_limit, without the x-delivery-count its deliveries carried."""
    q, dlq = with_dlq(channel, names, "qqlimit", x_delivery_limit=limit)
    channel.basic_publish("", q, b"m", pika.BasicProperties(headers={"h": 1}))
    wait_count(channel, q, 1)
    seen = _return_until_gone(channel, q, "nack" if limit != 1 else "reject")
    assert seen == [(False, 0)] + [(True, n) for n in range(1, limit + 1)]
    method, props, body = get_one(channel, dlq)
    assert body == b"m" and not method.redelivered
    assert deaths(props) == [{"count": 1, "reason": "delivery_limit", "queue": q, "exchange": "",
                              "routing-keys": [q]}]
    assert "x-delivery-count" not in props.headers and props.headers["h"] == 1
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    assert drain(channel, q) == []


@pytest.mark.parametrize("limit", [-1, "abc"])
def test_delivery_limit_values_rabbitmq_takes(channel, names, limit):
    """Any value is taken; -1 dead-letters at the first return, a string never limits."""
    q, dlq = with_dlq(channel, names, "qqodd", x_delivery_limit=limit)
    channel.basic_publish("", q, b"m")
    wait_count(channel, q, 1)
    seen = _return_until_gone(channel, q, rounds=4)
    assert len(seen) == (1 if limit == -1 else 4)
    if limit == -1:
        assert get_one(channel, dlq)[2] == b"m"
    else:
        wait_count(channel, q, 1)


def test_delivery_limit_without_dlx_drops(channel, names):
    q = quorum(channel, names("qqdrop"), x_delivery_limit=1)
    channel.basic_publish("", q, b"m")
    wait_count(channel, q, 1)
    assert _return_until_gone(channel, q) == [(False, 0), (True, 1)]
    wait_count(channel, q, 0)


def test_x_delivery_count_on_consumer_redeliveries(connection, channel, names):
    """A consumer's first delivery has no x-delivery-count (the publisher's own headers
    only); each redelivery has it, counting the returns so far."""
    q = quorum(channel, names("qqcount"))
    channel.basic_publish("", q, b"m", pika.BasicProperties(headers={"b": "x", "a": 1}))
    seen = []

    def on_message(ch, method, props, body):
        seen.append((method.redelivered, props.headers))
        if len(seen) < 4:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(q, on_message)
    wait_until(lambda: connection.process_data_events(0.02) or len(seen) == 4)
    assert seen == [(False, {"b": "x", "a": 1})] + [
        (True, {"a": 1, "b": "x", "x-delivery-count": n}) for n in (1, 2, 3)]
    assert list(seen[1][1]) == ["a", "b", "x-delivery-count"]  # sorted by key, as RabbitMQ writes it


def test_basic_get_always_has_x_delivery_count(channel, names):
    """basic.get adds x-delivery-count to every message, 0 for the first delivery, replacing
    one the publisher set."""
    q = quorum(channel, names("qqget"))
    channel.basic_publish("", q, b"m", pika.BasicProperties(headers={"x-delivery-count": 77, "a": "b"}))
    channel.basic_publish("", q, b"plain")
    method, props, _ = take(channel, q)
    assert props.headers == {"a": "b", "x-delivery-count": 0} and not method.redelivered
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, props, body = take(channel, q)
    assert body == b"plain" and props.headers == {"x-delivery-count": 0}
    channel.basic_ack(method.delivery_tag)
    method, props, _ = take(channel, q)
    assert props.headers == {"a": "b", "x-delivery-count": 1} and method.redelivered


def test_poison_message_reaches_the_dlq(connection, channel, names):
    """The seeds' poison message: a consumer that always rejects with requeue. With
    x-delivery-limit 3 it is delivered 4 times, then the DLQ has it and the queue moves on."""
    q, dlq = with_dlq(channel, names, "qqpoison", x_delivery_limit=3)
    channel.basic_publish("", q, b"poison")
    channel.basic_publish("", q, b"good")
    deliveries = []

    def on_message(ch, method, props, body):
        deliveries.append(body)
        if body == b"poison":
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(q, on_message)
    wait_until(lambda: connection.process_data_events(0.02) or deliveries.count(b"poison") == 4)
    ch2 = connection.channel()
    method, props, body = get_one(ch2, dlq)
    assert body == b"poison" and deaths(props)[0]["reason"] == "delivery_limit"
    assert deliveries.count(b"poison") == 4 and deliveries.count(b"good") == 1
    wait_count(ch2, q, 0)


# ------------------------------------------------------------------ requeue order
def _five(ch, q):
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    wait_count(ch, q, 5)


def test_requeue_order(channel, names):
    """Without a delivery limit a client's requeue goes to the tail (nack multiple: in
    delivery order); with one, returned messages go ahead of the ready ones, first returned
    first; a closed channel's messages go ahead in both cases."""
    plain, limited = quorum(channel, names("qqord")), quorum(channel, names("qqordl"), x_delivery_limit=10)
    for q, expect_single, expect_multiple in [(plain, ["3", "4", "2", "0"], ["3", "4", "0", "1", "2"]),
                                              (limited, ["2", "0", "3", "4"], ["0", "1", "2", "3", "4"])]:
        _five(channel, q)
        tags = [take(channel, q)[0].delivery_tag for _ in range(3)]
        channel.basic_nack(tags[2], requeue=True)
        channel.basic_nack(tags[0], requeue=True)
        wait_count(channel, q, 4)
        assert drain(channel, q) == expect_single
        channel.basic_ack(tags[1])
        _five(channel, q)
        tags = [take(channel, q)[0].delivery_tag for _ in range(3)]
        channel.basic_nack(tags[2], multiple=True, requeue=True)
        wait_count(channel, q, 5)
        assert drain(channel, q) == expect_multiple
        _five(channel, q)
        other = channel.connection.channel()
        for _ in range(3):
            take(other, q)
        other.close()
        wait_count(channel, q, 5)
        assert drain(channel, q) == ["0", "1", "2", "3", "4"]


# ------------------------------------------------------------------ limits and TTL
def test_reject_publish_lets_the_queue_reach_one_over_the_limit(channel, names):
    q = quorum(channel, names("qqrp"), x_max_length=2, x_overflow="reject-publish")
    channel.confirm_delivery()

    def publish(body):
        try:
            channel.basic_publish("", q, body.encode())
            return "ack"
        except pika.exceptions.NackError:
            return "nack"

    assert [publish(b) for b in "abcde"] == ["ack", "ack", "ack", "nack", "nack"]
    assert drain(channel, q) == ["a", "b", "c"]
    assert [publish(b) for b in "fgh"] == ["ack", "ack", "ack"]


def test_reject_publish_dlx_is_drop_head(channel, names):
    q, dlq = with_dlq(channel, names, "qqrpd", x_max_length=2, x_overflow="reject-publish-dlx")
    channel.confirm_delivery()
    for b in "abc":
        channel.basic_publish("", q, b.encode())  # all confirmed
    assert get_one(channel, dlq)[2] == b"a"
    assert drain(channel, q) == ["b", "c"]


def test_message_ttl(channel, names):
    q = quorum(channel, names("qqttl"))
    channel.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", q, b"kept")
    ttl_q = quorum(channel, names("qqttlq"), x_message_ttl=100)
    channel.basic_publish("", ttl_q, b"gone")
    time.sleep(0.3)  # (expiry is the point: nothing to wait for)
    assert drain(channel, q) == ["kept"]
    assert drain(channel, ttl_q) == []


# ------------------------------------------------------------------ Warren only
@warren_only
def test_transient_messages_survive_a_restart(make_broker, restart_broker, uid):
    """A quorum queue keeps every message, transient ones too, as RabbitMQ's Raft log does;
    and its delivery counts."""
    b = make_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    q = f"qqkeep-{uid}"
    quorum(ch, q, x_delivery_limit=5)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"transient", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", q, b"persistent", pika.BasicProperties(delivery_mode=2))
    method, _, _ = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    conn.close()
    b = restart_broker(b)
    ch = pika.BlockingConnection(b.pika_params()).channel()
    got = []
    for _ in range(2):
        method, props, body = ch.basic_get(q, auto_ack=True)
        got.append((body, method.redelivered, props.headers["x-delivery-count"]))
    assert got == [(b"transient", True, 1), (b"persistent", False, 0)]


@warren_only
def test_management_api_shows_a_quorum_queue(make_broker, uid):
    b = make_broker()
    ch = pika.BlockingConnection(b.pika_params()).channel()
    q = quorum(ch, f"qqapi-{uid}", x_delivery_limit=3)
    info = requests.get(f"{b.api}/queues/%2F/{q}", auth=("guest", "guest"), timeout=10).json()
    assert info["type"] == "quorum" and info["durable"] is True
    assert info["leader"] == info["node"] and info["members"] == [info["node"]] == info["online"]
    assert info["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": 3}
    defs = requests.get(f"{b.api}/definitions", auth=("guest", "guest"), timeout=10).json()
    (exported,) = [d for d in defs["queues"] if d["name"] == q]
    # RabbitMQ 3.10.8's API export has no queue "type": the argument makes it a quorum queue.
    assert "type" not in exported and exported["arguments"]["x-queue-type"] == "quorum"
    # Imported into a fresh broker, it is a quorum queue again.
    b2 = make_broker()
    r = requests.post(f"{b2.api}/definitions", json=defs, auth=("guest", "guest"), timeout=10)
    assert r.status_code in (200, 201, 204), r.text
    again = requests.get(f"{b2.api}/queues/%2F/{q}", auth=("guest", "guest"), timeout=10).json()
    assert (again["type"], again["arguments"]) == ("quorum", info["arguments"])


@warren_only
def test_at_least_once_keeps_a_dead_letter_until_it_routes(channel, names):
    """dead-letter-strategy at-least-once (with overflow reject-publish): a dead letter whose
    DLX is missing, or that routes nowhere, stays with its queue and is retried until it
    routes (RabbitMQ retries on its own, slower, schedule), instead of being dropped."""
    dlx, dlq = names("alo-dlx"), names("alo-dlq")
    q = quorum(channel, names("alo"), x_dead_letter_exchange=dlx, x_dead_letter_strategy="at-least-once",
               x_overflow="reject-publish")
    channel.basic_publish("", q, b"keep me")
    method, _props, _body = take(channel, q)
    channel.basic_reject(method.delivery_tag, requeue=False)  # the DLX does not exist yet
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq, durable=True)
    time.sleep(1.5)  # retried meanwhile: the exchange exists, but nothing is bound
    assert channel.queue_declare(dlq, passive=True).method.message_count == 0
    channel.queue_bind(dlq, dlx)
    _method, props, body = get_one(channel, dlq, auto_ack=True, timeout=5)
    assert body == b"keep me" and deaths(props)[0]["reason"] == "rejected"
    channel.queue_delete(dlq)
    channel.exchange_delete(dlx)
