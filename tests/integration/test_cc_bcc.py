"""Sender-selected distribution: the CC and BCC headers of a publish, as RabbitMQ 3.10 routes
them (rabbit_basic:header_routes, rabbit_exchange:route/2) and dead-letters them
(rabbit_dead_letter:make_msg)."""

import os
import time

import pika
import pytest

from conftest import Returns, channel_error, get_all, queue

AE = "alternate-exchange"


def props(**headers) -> pika.BasicProperties:
    return pika.BasicProperties(headers=headers)


def bound(channel, exchange, *keys) -> str:
    q = queue(channel)
    for key in keys:
        channel.queue_bind(q, exchange, key)
    return q


def test_cc_and_bcc_add_routing_keys(channel, names):
    x = names("ccx")
    channel.exchange_declare(x, "direct")
    qa, qb, qc, qd = bound(channel, x, "a"), bound(channel, x, "b"), bound(channel, x, "c"), bound(channel, x, "d")
    channel.basic_publish(x, "a", b"m", props(CC=["b"], BCC=["c"], other="kept"))
    for q in (qa, qb, qc):
        ((method, properties, body),) = get_all(channel, q)
        # Every copy names the publish's exchange and routing key; BCC is gone, CC stays.
        assert (method.exchange, method.routing_key, body) == (x, "a", b"m")
        assert properties.headers == {"CC": ["b"], "other": "kept"}
    assert get_all(channel, qd) == []


def test_a_queue_matched_by_several_keys_gets_the_message_once(channel, names):
    x = names("cconce")
    channel.exchange_declare(x, "topic")
    q = bound(channel, x, "a.*", "*.b", "c")
    other = bound(channel, x, "z")
    channel.basic_publish(x, "a.b", b"m", props(CC=["c", "a.b"], BCC=["c", "x.b"]))
    assert [body for _, _, body in get_all(channel, q)] == [b"m"]
    assert get_all(channel, other) == []


def test_default_exchange(channel, names):
    q1, q2, q3 = queue(channel), queue(channel), queue(channel)
    channel.basic_publish("", q1, b"m", props(CC=[q2], BCC=[q3, "no-such-queue"]))
    for q in (q1, q2, q3):
        ((method, properties, _),) = get_all(channel, q)
        assert (method.exchange, method.routing_key, properties.headers) == ("", q1, {"CC": [q2]})


def test_only_longstr_elements_count(channel, names):
    # pika sends ints as 'I'/'l' and bytes as 'x': RabbitMQ ignores those elements.
    q1, q2, q3 = queue(channel), queue(channel), queue(channel)
    channel.basic_publish("", q1, b"m", props(CC=[5, q3.encode(), q2]))
    assert [len(get_all(channel, q)) for q in (q1, q2, q3)] == [1, 1, 0]


def test_only_bcc_leaves_empty_headers(channel):
    q1, q2 = queue(channel), queue(channel)
    channel.basic_publish("", q1, b"m", props(BCC=[q2]))
    for q in (q1, q2):
        ((_, properties, _),) = get_all(channel, q)
        assert properties.headers == {}


@pytest.mark.parametrize("headers, text", [
    ({"CC": "q"}, '{unacceptable_type_in_header,"CC",longstr}'),
    ({"BCC": {"a": "b"}}, '{unacceptable_type_in_header,"BCC",table}'),
    ({"CC": 3}, '{unacceptable_type_in_header,"CC",signedint}'),
    ({"CC": ["ok"], "BCC": None}, '{unacceptable_type_in_header,"BCC",void}'),
])
def test_a_routing_header_that_is_not_an_array_closes_the_channel(connection, headers, text):
    ch = connection.channel()
    ch.basic_publish("", "anything", b"m", pika.BasicProperties(headers=headers))
    code, reply = channel_error(lambda: ch.queue_declare("", exclusive=True))
    assert (code, reply) == (406, "PRECONDITION_FAILED - invalid message: " + text)


def test_alternate_exchange_only_when_no_key_routes(channel, names):
    x, ae = names("ccae"), names("ccae-ae")
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(x, "direct", arguments={AE: ae})
    routed, unrouted = bound(channel, x, "a"), bound(channel, ae, "")
    channel.basic_publish(x, "nothing", b"cc-routes", props(CC=["a"]))
    channel.basic_publish(x, "nothing", b"none-routes", props(CC=["nothing-either"], BCC=["nor-this"]))
    channel.basic_publish(x, "a", b"key-routes", props(BCC=["nowhere"]))
    assert [b for _, _, b in get_all(channel, routed)] == [b"cc-routes", b"key-routes"]
    ((method, properties, body),) = get_all(channel, unrouted)
    assert (method.routing_key, body, properties.headers) == ("nothing", b"none-routes", {"CC": ["nothing-either"]})


def test_exchange_to_exchange_bindings_see_every_key(channel, names):
    # x1 routes key k2 to x2, which routes key k1 to the queue: with k1 + CC k2 it arrives.
    x1, x2 = names("cce1"), names("cce2")
    channel.exchange_declare(x1, "direct")
    channel.exchange_declare(x2, "direct")
    channel.exchange_bind(x2, x1, "k2")
    q = bound(channel, x2, "k1")
    channel.basic_publish(x1, "k1", b"both", props(CC=["k2"]))
    channel.basic_publish(x1, "k1", b"one", props())
    assert [body for _, _, body in get_all(channel, q)] == [b"both"]


def test_mandatory_returns_only_when_no_key_routes(connection, channel, names):
    x = names("ccmand")
    channel.exchange_declare(x, "direct")
    q = bound(channel, x, "a")
    returns = Returns(connection, channel)
    channel.basic_publish(x, "nothing", b"routed", props(BCC=["a"]), mandatory=True)
    channel.basic_publish(x, "nothing", b"returned", props(CC=["c"], BCC=["b"]), mandatory=True)
    ((method, properties, body),) = returns.collect(channel)
    assert (method.reply_code, method.routing_key, body) == (312, "nothing", b"returned")
    assert properties.headers == {"CC": ["c"]}  # returned as stored: without BCC
    assert [b for _, _, b in get_all(channel, q)] == [b"routed"]


def test_confirmed_and_in_transactions(connection, names):
    ch = connection.channel()
    q1, q2 = queue(ch), queue(ch)
    ch.confirm_delivery()
    ch.basic_publish("", q1, b"c", props(BCC=[q2]))
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", q1, b"t", props(CC=[q2]))
    assert [b for _, _, b in get_all(ch, q2)] == [b"c"]  # the transaction's not yet
    tx.tx_commit()
    assert [b for _, _, b in get_all(ch, q1)] == [b"c", b"t"]
    assert [b for _, _, b in get_all(ch, q2)] == [b"t"]


# -------------------------------------------------------------------- dead-lettering
def dead_letter_setup(channel, names, dlrk=None):
    dlx = names("ccdlx")
    channel.exchange_declare(dlx, "direct")
    args = {"x-dead-letter-exchange": dlx}
    if dlrk is not None:
        args["x-dead-letter-routing-key"] = dlrk
    src = channel.queue_declare(names("ccsrc"), arguments=args).method.queue
    return dlx, src


def reject_all(channel, q) -> None:
    method, _, _ = channel.basic_get(q)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)


def wait_for(channel, q, n=1, timeout=3.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += get_all(channel, q)
        if len(got) < n:
            time.sleep(0.02)
    return got


def test_dead_lettering_routes_with_the_cc_and_bcc_keys(channel, names):
    dlx, src = dead_letter_setup(channel, names)
    # Without a dead-letter routing key the message keeps its keys: the publish's (the
    # queue's name here) and those CC and BCC added, BCC's although it left the header.
    targets = [bound(channel, dlx, key) for key in (src, "cc", "bcc")]
    channel.basic_publish("", src, b"m", props(CC=["cc"], BCC=["bcc"]))
    reject_all(channel, src)
    for q in targets:
        ((method, properties, body),) = wait_for(channel, q)
        assert (method.exchange, method.routing_key, body) == (dlx, src, b"m")
        assert properties.headers["CC"] == ["cc"] and "BCC" not in properties.headers
        (death,) = properties.headers["x-death"]
        assert death["routing-keys"] == [src, "cc"]  # the BCC key is not written
        assert (death["queue"], death["reason"], death["exchange"], death["count"]) == (src, "rejected", "", 1)


def test_dead_letter_routing_key_replaces_them_and_drops_cc(channel, names):
    dlx, src = dead_letter_setup(channel, names, dlrk="dl")
    to_dl, to_cc = bound(channel, dlx, "dl"), bound(channel, dlx, "cc")
    channel.basic_publish("", src, b"m", props(CC=["cc"], BCC=["dl"]))
    reject_all(channel, src)
    ((method, properties, body),) = wait_for(channel, to_dl)
    assert (method.exchange, method.routing_key, body) == (dlx, "dl", b"m")
    assert "CC" not in properties.headers and "BCC" not in properties.headers
    assert properties.headers["x-death"][0]["routing-keys"] == [src, "cc"]
    assert get_all(channel, to_cc) == []


def test_dead_letter_exchange_alternate_only_when_no_key_routes(channel, names):
    dlx, src = dead_letter_setup(channel, names)
    ae = names("ccdlx-ae")
    channel.exchange_declare(ae, "fanout")
    channel.exchange_delete(dlx)
    channel.exchange_declare(dlx, "direct", arguments={AE: ae})
    to_cc, to_ae = bound(channel, dlx, "cc"), bound(channel, ae, "")
    channel.basic_publish("", src, b"cc-routes", props(CC=["cc"]))  # the key `src` routes nowhere
    reject_all(channel, src)
    channel.basic_publish("", src, b"none-routes", props(BCC=["nowhere"]))
    reject_all(channel, src)
    assert [b for _, _, b in wait_for(channel, to_cc)] == [b"cc-routes"]
    assert [b for _, _, b in wait_for(channel, to_ae)] == [b"none-routes"]
    assert get_all(channel, to_cc) == get_all(channel, to_ae) == []


def test_consistent_hash_exchange_hashes_the_publish_key_only(broker, channel, names):
    # The plugin hashes the message's list of keys, and takes a list's head: one queue, the
    # one the routing key alone picks (RabbitMQ 3.10.8 checked with 40 keys over 10 queues).
    probe = pika.BlockingConnection(broker.pika_params())
    try:
        probe.channel().exchange_declare(names("cc-chx"), "x-consistent-hash")
    except pika.exceptions.ConnectionClosedByBroker as err:
        if err.reply_code == 503 and os.environ.get("WARREN_TEST_BROKER"):
            pytest.skip("the broker under test lacks the rabbitmq_consistent_hash_exchange plugin")
        raise
    finally:
        if probe.is_open:
            probe.close()
    x = names("cc-chx")
    qs = [bound(channel, x, "1") for _ in range(5)]
    for i in range(20):
        channel.basic_publish(x, f"k{i}", f"k{i}".encode(), props(CC=[f"c{i}", f"d{i}"], BCC=[f"e{i}"]))
        channel.basic_publish(x, f"k{i}", f"k{i}".encode(), props())
    per_queue = [[b for _, _, b in get_all(channel, q)] for q in qs]
    assert sum(map(len, per_queue)) == 40
    for bodies in per_queue:
        assert bodies[0::2] == bodies[1::2]  # each key's two messages side by side in one queue
