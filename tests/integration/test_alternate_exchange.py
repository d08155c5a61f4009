"""Alternate exchanges, rule by rule as RabbitMQ documents and implements them
(rabbit_exchange:route/2 in 3.10)."""

import time

import pika
import pytest

from conftest import Returns, channel_error, drain, queue

AE = "alternate-exchange"


def test_documented_example(channel, names):
    my_direct, my_ae = names("my-direct"), names("my-ae")
    channel.exchange_declare(my_direct, "direct", arguments={AE: my_ae})
    channel.exchange_declare(my_ae, "fanout")
    routed, unrouted = queue(channel), queue(channel)
    channel.queue_bind(routed, my_direct, "key1")
    channel.queue_bind(unrouted, my_ae, "")
    channel.basic_publish(my_direct, "key2", b"test2")
    channel.basic_publish(my_direct, "key1", b"test1")
    method, _, body = channel.basic_get(unrouted, auto_ack=True)
    # The delivery names the exchange and key the message was published with.
    assert (body, method.exchange, method.routing_key) == (b"test2", my_direct, "key2")
    assert drain(channel, routed) == [b"test1"]  # routed normally: the AE is not involved
    assert drain(channel, unrouted) == []


def test_ae_declared_after_the_exchange_and_deleted(channel, names):
    x, ae = names("late"), names("late-ae")
    channel.exchange_declare(x, "direct", arguments={AE: ae})
    channel.basic_publish(x, "k", b"before")  # the AE does not exist yet: dropped
    channel.exchange_declare(ae, "fanout")
    q = queue(channel)
    channel.queue_bind(q, ae)
    channel.basic_publish(x, "k", b"during")
    channel.exchange_delete(ae)
    channel.basic_publish(x, "k", b"after")
    assert drain(channel, q) == [b"during"]


def test_ae_routes_with_the_original_key_and_headers(channel, names):
    x, topic_ae, headers_ae = names("orig"), names("orig-topic"), names("orig-headers")
    channel.exchange_declare(x, "direct", arguments={AE: topic_ae})
    channel.exchange_declare(topic_ae, "topic", arguments={AE: headers_ae})
    channel.exchange_declare(headers_ae, "headers")
    qt, qh = queue(channel), queue(channel)
    channel.queue_bind(qt, topic_ae, "a.*")
    channel.queue_bind(qh, headers_ae, arguments={"h": "yes"})
    channel.basic_publish(x, "a.b", b"topic")
    channel.basic_publish(x, "b.c", b"headers", pika.BasicProperties(headers={"h": "yes"}))
    channel.basic_publish(x, "b.c", b"lost", pika.BasicProperties(headers={"h": "no"}))
    assert drain(channel, qt) == [b"topic"]
    assert drain(channel, qh) == [b"headers"]


def test_ae_chain_is_followed(channel, names):
    x, a1, a2, a3 = names("chain"), names("chain-a1"), names("chain-a2"), names("chain-a3")
    channel.exchange_declare(x, "direct", arguments={AE: a1})
    channel.exchange_declare(a1, "direct", arguments={AE: a2})
    channel.exchange_declare(a2, "topic", arguments={AE: a3})
    channel.exchange_declare(a3, "fanout")
    q1, q2, q3 = queue(channel), queue(channel), queue(channel)
    channel.queue_bind(q1, a1, "one")
    channel.queue_bind(q2, a2, "two.#")
    channel.queue_bind(q3, a3)
    channel.basic_publish(x, "one", b"1")
    channel.basic_publish(x, "two.x", b"2")
    channel.basic_publish(x, "three", b"3")
    assert (drain(channel, q1), drain(channel, q2), drain(channel, q3)) == ([b"1"], [b"2"], [b"3"])


def test_ae_cycle_stops_at_an_exchange_already_tried(connection, channel, names):
    """The Java client's AlternateExchange topology: x -> u -> v -> x, each exchange routing
    its own name to the queue of that name."""
    resources = {r: names(r) for r in ("x", "u", "v")}
    nxt = {"x": "u", "u": "v", "v": "x"}
    for r, name in resources.items():
        channel.exchange_declare(name, "direct", arguments={AE: resources[nxt[r]]})
    for r, name in resources.items():
        queue(channel, name)
        channel.queue_bind(name, name, name)
    keys = [*resources.values(), names("z")]
    returns = Returns(connection, channel)
    for start in resources.values():
        for key in keys:
            channel.basic_publish(start, key, f"{start}:{key}".encode(), mandatory=True)
    returned = returns.brief(channel)
    for name in resources.values():
        assert drain(channel, name) == [f"{start}:{name}".encode() for start in resources.values()]
    # Only z, which nothing routes, is returned (once per publish).
    assert returned == [(312, start, keys[3], f"{start}:{keys[3]}".encode()) for start in resources.values()]


def test_ae_pointing_to_itself(connection, channel, names):
    x = names("self")
    channel.exchange_declare(x, "direct", arguments={AE: x})
    q = queue(channel)
    channel.queue_bind(q, x, "k")
    returns = Returns(connection, channel)
    channel.basic_publish(x, "k", b"routed", mandatory=True)
    channel.basic_publish(x, "other", b"lost", mandatory=True)
    assert returns.brief(channel) == [(312, x, "other", b"lost")]
    assert drain(channel, q) == [b"routed"]


def test_missing_ae_drops_and_warns(broker, connection, channel, names):
    x, missing = names("missing"), names("missing-ae")
    channel.exchange_declare(x, "direct", arguments={AE: missing})
    q = queue(channel)
    channel.queue_bind(q, x, "k")
    returns = Returns(connection, channel)
    channel.basic_publish(x, "other", b"dropped")
    channel.basic_publish(x, "other", b"returned", mandatory=True)
    channel.basic_publish(x, "k", b"routed", mandatory=True)
    assert returns.brief(channel) == [(312, x, "other", b"returned")]
    assert drain(channel, q) == [b"routed"]
    if broker.proc is not None:  # RabbitMQ 3.10 logs nothing here; Warren warns, as the AE docs say
        deadline = time.monotonic() + 2
        while f"alternate exchange '{missing}'" not in broker.log() and time.monotonic() < deadline:
            time.sleep(0.02)
        warnings = [line for line in broker.log().splitlines() if f"alternate exchange '{missing}'" in line]
        assert warnings and all("[warning]" in line and f"exchange '{x}' in vhost '/'" in line
                                and "does not exist" in line for line in warnings)


def test_missing_ae_later_in_the_chain(connection, channel, names):
    x, a1 = names("mid"), names("mid-a1")
    channel.exchange_declare(x, "direct", arguments={AE: a1})
    channel.exchange_declare(a1, "direct", arguments={AE: names("mid-gone")})
    returns = Returns(connection, channel)
    channel.basic_publish(x, "k", b"m", mandatory=True)
    assert returns.brief(channel) == [(312, x, "k", b"m")]


def test_ae_routed_counts_as_routed_for_mandatory_and_confirms(connection, names):
    ch = connection.channel()
    x, ae = names("confirm"), names("confirm-ae")
    ch.exchange_declare(x, "direct", arguments={AE: ae})
    ch.exchange_declare(ae, "fanout")
    q = queue(ch)
    ch.queue_bind(q, ae)
    ch.confirm_delivery()
    # pika raises UnroutableError for a returned message and NackError for a nack.
    ch.basic_publish(x, "unroutable", b"via-ae", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):  # the same channel does see returns
        ch.basic_publish("amq.direct", names("nobody"), b"x", mandatory=True)
    assert drain(ch, q) == [b"via-ae"]


def test_properties_are_carried_through(channel, names):
    x, ae = names("props"), names("props-ae")
    channel.exchange_declare(x, "topic", arguments={AE: ae})
    channel.exchange_declare(ae, "fanout")
    q = names("props-q")
    channel.queue_declare(q, durable=True)
    channel.queue_bind(q, ae)
    props = pika.BasicProperties(
        content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=4,
        headers={"a": 1, "b": "two", "c": [True, None], "d": {"e": 2**40}}, correlation_id="c",
        reply_to="r", expiration="60000", message_id="m", timestamp=1600000000, type="t",
        user_id="guest", app_id="app")
    channel.basic_publish(x, "no.match", b"body", props)
    method, got, body = channel.basic_get(q, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"body", x, "no.match")
    for field in ("content_type", "content_encoding", "delivery_mode", "priority", "headers", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(got, field) == getattr(props, field), field


def test_ae_routing_inside_a_transaction(broker, channel, names):
    x, ae = names("tx"), names("tx-ae")
    channel.exchange_declare(x, "direct", arguments={AE: ae})
    channel.exchange_declare(ae, "fanout")
    q = names("tx-q")
    channel.queue_declare(q)
    channel.queue_bind(q, ae)
    observer = pika.BlockingConnection(broker.pika_params())
    try:
        watch = observer.channel()
        channel.tx_select()
        channel.basic_publish(x, "k", b"committed")
        channel.queue_declare(q, passive=True)  # round trip: the publish has been handled
        assert watch.queue_declare(q, passive=True).method.message_count == 0
        channel.tx_commit()
        assert drain(watch, q) == [b"committed"]
        channel.basic_publish(x, "k", b"rolled-back")
        channel.tx_rollback()
        channel.tx_commit()
        assert drain(watch, q) == []
    finally:
        observer.close()


def test_default_exchange_has_no_ae(connection, channel, uid):
    returns = Returns(connection, channel)
    channel.basic_publish("", f"no-such-queue-{uid}", b"m", mandatory=True)
    assert returns.brief(channel) == [(312, "", f"no-such-queue-{uid}", b"m")]
    channel_error(lambda: channel.exchange_declare("", "direct", arguments={AE: "amq.fanout"}), 403,
                  "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_ae_with_exchange_to_exchange_bindings(connection, channel, names):
    """rabbit_exchange:route/2: an exchange's AE is used only when the exchange's own bindings
    select nothing at all -- selecting another exchange (even one that then routes nowhere)
    counts. Exchanges reached through bindings use their own AEs the same way."""
    x, y, x_ae, y_ae = names("e2e-x"), names("e2e-y"), names("e2e-x-ae"), names("e2e-y-ae")
    channel.exchange_declare(x, "direct", arguments={AE: x_ae})
    channel.exchange_declare(y, "direct")
    channel.exchange_declare(x_ae, "fanout")
    channel.exchange_bind(y, x, "to-y")
    qx_ae, qy, qy_ae = queue(channel), queue(channel), queue(channel)
    channel.queue_bind(qx_ae, x_ae)
    channel.queue_bind(qy, y, "only-this")
    returns = Returns(connection, channel)
    # x selects y, y selects nothing and has no AE: dropped, x's AE not used.
    channel.basic_publish(x, "to-y", b"1", mandatory=True)
    assert returns.brief(channel) == [(312, x, "to-y", b"1")]
    assert drain(channel, qx_ae) == []
    # x selects nothing: x's AE.
    channel.basic_publish(x, "elsewhere", b"2", mandatory=True)
    assert returns.brief(channel) == []
    assert drain(channel, qx_ae) == [b"2"]
    # Give y an AE: a message reaching y through the binding now goes to y's AE.
    channel.exchange_delete(y)
    channel.exchange_declare(y, "direct", arguments={AE: y_ae})
    channel.exchange_declare(y_ae, "fanout")
    channel.queue_bind(qy_ae, y_ae)
    channel.exchange_bind(y, x, "to-y")
    channel.basic_publish(x, "to-y", b"3", mandatory=True)
    assert returns.brief(channel) == []
    assert (drain(channel, qy_ae), drain(channel, qx_ae)) == ([b"3"], [])
    # x routes to a queue and to y: y's AE is still tried for y.
    qx = queue(channel)
    channel.queue_bind(qx, x, "to-y")
    channel.basic_publish(x, "to-y", b"4")
    assert (drain(channel, qx), drain(channel, qy_ae), drain(channel, qx_ae)) == ([b"4"], [b"4"], [])


def test_ae_reached_again_through_a_binding_is_tried_once(channel, names):
    """An exchange that is both bound and an AE in the same routing is visited once."""
    x, ae = names("once-x"), names("once-ae")
    channel.exchange_declare(x, "topic", arguments={AE: ae})
    channel.exchange_declare(ae, "fanout")
    channel.exchange_bind(x, ae)  # ae -> x: a loop through the AE
    q = queue(channel)
    channel.queue_bind(q, ae)
    channel.basic_publish(x, "k", b"once")
    channel.basic_publish(ae, "k", b"direct-to-ae")
    assert drain(channel, q) == [b"once", b"direct-to-ae"]


def test_internal_exchange_can_be_an_ae(channel, names):
    x, ae = names("int-x"), names("int-ae")
    channel.exchange_declare(x, "direct", arguments={AE: ae})
    channel.exchange_declare(ae, "fanout", internal=True)
    q = queue(channel)
    channel.queue_bind(q, ae)
    channel.basic_publish(x, "k", b"m")
    assert drain(channel, q) == [b"m"]


def test_redeclare_with_same_or_different_ae(connection, names):
    x = names("redecl")
    ch = connection.channel()
    ch.exchange_declare(x, "direct", arguments={AE: "ae1"})
    ch.exchange_declare(x, "direct", arguments={AE: "ae1"})
    ch.exchange_declare(x, passive=True)
    channel_error(lambda: ch.exchange_declare(x, "direct", arguments={AE: "ae2"}), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{x}' in vhost '/': "
                  "received 'ae2' but current is 'ae1'")
