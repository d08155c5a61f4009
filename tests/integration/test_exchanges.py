"""exchange.declare / delete / bind / unbind and the predeclared exchanges, as RabbitMQ 3.10
answers them (codes and exact reply texts)."""

import pika
import pytest

from conftest import channel_error, connection_error, drain, queue

CLOSED = pika.exceptions.ChannelClosedByBroker
DEFAULT_REFUSED = (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


# ------------------------------------------------------------- declare basics


@pytest.mark.parametrize("xtype", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type_and_redeclare(channel, names, xtype):
    x = names(xtype)
    channel.exchange_declare(x, xtype)
    channel.exchange_declare(x, xtype)  # identical redeclare is ok
    channel.exchange_declare(x, passive=True)
    channel.exchange_declare(x, "fanout" if xtype != "fanout" else "direct", passive=True)  # passive ignores type


def test_passive_declare_missing_exchange_is_404(channel, uid):
    x = f"missing-{uid}"
    assert channel_error(lambda: channel.exchange_declare(x, passive=True)) == (
        404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


def test_reserved_amq_prefix_refused(channel, uid):
    x = f"amq.mine-{uid}"
    assert channel_error(lambda: channel.exchange_declare(x, "direct")) == (
        403, f"ACCESS_REFUSED - exchange name '{x}' contains reserved prefix 'amq.*'")


@pytest.mark.parametrize("field,kwargs,received,current", [
    ("type", {"exchange_type": "topic"}, "topic", "direct"),
    ("durable", {"durable": True}, "true", "false"),
    ("auto_delete", {"auto_delete": True}, "true", "false"),
    ("internal", {"internal": True}, "true", "false"),
])
def test_redeclare_inequivalent_flags(connection, names, field, kwargs, received, current):
    x = names("ineq")
    ch = connection.channel()
    ch.exchange_declare(x, "direct")
    args = {"exchange_type": "direct", **kwargs}
    assert channel_error(lambda: ch.exchange_declare(x, **args)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg '{field}' for exchange '{x}' in vhost '/': "
             f"received '{received}' but current is '{current}'")


@pytest.mark.parametrize("first,second,text", [
    (None, {"alternate-exchange": "ae1"},
     "received the value 'ae1' of type 'longstr' but current is none"),
    ({"alternate-exchange": "ae1"}, None,
     "received none but current is the value 'ae1' of type 'longstr'"),
    ({"alternate-exchange": "ae1"}, {"alternate-exchange": "ae2"},
     "received 'ae2' but current is 'ae1'"),
    ({"alternate-exchange": "ae1"}, {"alternate-exchange": True},
     "received 'true' but current is 'ae1'"),
    (None, {"alternate-exchange": 5},
     "received the value '5' of type 'signedint' but current is none"),
    (None, {"alternate-exchange": b"ae"},
     "received the value 'ae' of type 'binary' but current is none"),
])
def test_redeclare_inequivalent_alternate_exchange(connection, names, first, second, text):
    x = names("ineq-ae")
    ch = connection.channel()
    ch.exchange_declare(x, "direct", arguments=first)
    assert channel_error(lambda: ch.exchange_declare(x, "direct", arguments=second)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{x}' in vhost '/': {text}")


def test_redeclare_other_argument_differences_accepted(channel, names):
    x = names("args")
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": "ae", "x-foo": 1})
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": "ae", "x-foo": 2, "bar": "z"})
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": "ae"})
    # The same AE name sent as a byte array ('x') is the same value for RabbitMQ.
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": b"ae"})
    y = names("args2")
    channel.exchange_declare(y, "fanout")
    channel.exchange_declare(y, "fanout", arguments={"x-anything": "goes"})


@pytest.mark.parametrize("value,type_name", [(5, "signedint"), (2**40, "long"), (True, "bool"),
                                             (b"ae", "binary"), (None, "void"), ({"a": 1}, "table"),
                                             ([1], "array")])
def test_alternate_exchange_argument_type_checked(connection, uid, value, type_name):
    x = f"badae-{uid}"
    ch = connection.channel()
    assert channel_error(lambda: ch.exchange_declare(x, "direct", arguments={"alternate-exchange": value})) == (
        406, f"PRECONDITION_FAILED - invalid type '{type_name}' for arg 'alternate-exchange' "
             f"in exchange '{x}' in vhost '/'")
    ch = connection.channel()
    assert channel_error(lambda: ch.exchange_declare(x, passive=True))[0] == 404  # nothing was created


# --------------------------------------------------------- unknown exchange type


def test_unknown_exchange_type_closes_connection(broker, uid):
    xtype = f"no-such-type-{uid}"
    for name in (f"x-{uid}", ""):  # the type is checked before the default-exchange name
        conn = pika.BlockingConnection(broker.pika_params())
        ch = conn.channel()
        assert connection_error(lambda: ch.exchange_declare(name, xtype)) == (
            503, f"COMMAND_INVALID - unknown exchange type '{xtype}'")
        assert conn.is_closed


def test_empty_exchange_type_is_invalid(broker, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    assert connection_error(lambda: ch.exchange_declare(f"x-{uid}", "")) == (
        503, "COMMAND_INVALID - invalid exchange type ''")


def test_unknown_type_on_existing_exchange(broker, names):
    x = names("known")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.exchange_declare(x, "direct")
    ch.exchange_declare(x, "no-such-type", passive=True)  # passive: the type is not looked at
    assert connection_error(lambda: ch.exchange_declare(x, "no-such-type")) == (
        503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")


# ------------------------------------------------------------ default exchange


def test_default_exchange_operations_refused(connection):
    ops = [
        lambda ch: ch.exchange_declare("", "direct"),
        lambda ch: ch.exchange_declare("", "direct", passive=True),
        lambda ch: ch.exchange_delete(""),
        lambda ch: ch.exchange_bind("amq.direct", "", "k"),
        lambda ch: ch.exchange_bind("", "amq.direct", "k"),
        lambda ch: ch.exchange_unbind("amq.direct", "", "k"),
        lambda ch: (queue(ch), ch.queue_bind("", "", "k")),
        lambda ch: (queue(ch), ch.queue_unbind("", "", "k")),
    ]
    for op in ops:
        ch = connection.channel()
        assert channel_error(lambda: op(ch)) == DEFAULT_REFUSED


def test_default_exchange_routes_to_every_queue_by_name(channel, uid):
    q1, q2 = queue(channel, f"dq1-{uid}"), queue(channel, f"dq2-{uid}")
    channel.basic_publish("", q1, b"one")
    channel.basic_publish("", q2, b"two")
    channel.basic_publish("", f"nothing-{uid}", b"lost")
    method, _, body = channel.basic_get(q1, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"one", "", q1)
    assert drain(channel, q2) == [b"two"]
    assert drain(channel, q1) == []


# ------------------------------------------------------- predeclared exchanges

PREDECLARED = [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
               ("amq.headers", "headers"), ("amq.match", "headers")]


def test_predeclared_exchanges_exist(connection):
    ch = connection.channel()
    for name, xtype in PREDECLARED:
        ch.exchange_declare(name, passive=True)
        ch.exchange_declare(name, xtype, durable=True)  # equivalent redeclare is allowed
    ch.exchange_declare("amq.rabbitmq.trace", passive=True)
    for name, xtype in PREDECLARED:
        ch = connection.channel()
        other = "fanout" if xtype != "fanout" else "direct"
        assert channel_error(lambda: ch.exchange_declare(name, other, durable=True)) == (
            406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                 f"received '{other}' but current is '{xtype}'")
    ch = connection.channel()
    assert channel_error(lambda: ch.exchange_declare("amq.direct", "direct")) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': "
             "received 'false' but current is 'true'")


def test_deleting_amq_exchanges_refused(connection, uid):
    for name in [n for n, _ in PREDECLARED] + [f"amq.missing-{uid}"]:
        ch = connection.channel()
        assert channel_error(lambda: ch.exchange_delete(name)) == (
            403, f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not allowed")
    connection.channel().exchange_declare("amq.direct", passive=True)


def test_predeclared_exchanges_route(channel, uid):
    q = queue(channel)
    channel.queue_bind(q, "amq.direct", f"k-{uid}")
    channel.queue_bind(q, "amq.fanout")
    channel.queue_bind(q, "amq.topic", f"t-{uid}.#")
    channel.queue_bind(q, "amq.headers", arguments={"id": uid})
    channel.queue_bind(q, "amq.match", arguments={"x-match": "any", "mid": uid})
    channel.basic_publish("amq.direct", f"k-{uid}", b"direct")
    channel.basic_publish("amq.topic", f"t-{uid}.a.b", b"topic")
    channel.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"id": uid}))
    channel.basic_publish("amq.match", "", b"match", pika.BasicProperties(headers={"mid": uid}))
    channel.basic_publish("amq.direct", f"other-{uid}", b"nothing")
    assert drain(channel, q) == [b"direct", b"topic", b"headers", b"match"]
    channel.basic_publish("amq.fanout", "whatever", b"fanout")
    # amq.fanout is shared with other tests: only look for our own message.
    assert b"fanout" in drain(channel, q)


# ------------------------------------------------------------ internal exchange


def test_publish_to_internal_exchange_refused(connection, names):
    x = names("internal")
    ch = connection.channel()
    ch.exchange_declare(x, "fanout", internal=True)
    ch.basic_publish(x, "", b"m")
    assert channel_error(lambda: ch.queue_declare("", exclusive=True)) == (
        403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'")


def test_internal_exchange_redeclared_after_publishing(connection, names):
    """A channel that published to an exchange must still refuse it once it is internal."""
    x = names("became-internal")
    ch = connection.channel()
    ch.exchange_declare(x, "fanout")
    ch.basic_publish(x, "", b"m")
    ch.exchange_delete(x)
    ch.exchange_declare(x, "fanout", internal=True)
    ch.basic_publish(x, "", b"m")
    assert channel_error(lambda: ch.queue_declare("", exclusive=True)) == (
        403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'")


def test_internal_exchange_reachable_through_binding(channel, names):
    front, inner = names("front"), names("inner")
    channel.exchange_declare(front, "direct")
    channel.exchange_declare(inner, "fanout", internal=True)
    channel.exchange_bind(inner, front, "k")
    q = queue(channel)
    channel.queue_bind(q, inner)
    channel.basic_publish(front, "k", b"through")
    channel.basic_publish(front, "other", b"not")
    method, _, body = channel.basic_get(q, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"through", front, "k")
    assert drain(channel, q) == []


# ---------------------------------------------------------------- auto-delete


def exists(connection, x) -> bool:
    ch = connection.channel()
    try:
        ch.exchange_declare(x, passive=True)
    except CLOSED as err:
        assert err.reply_code == 404
        return False
    ch.close()
    return True


def test_auto_delete_exchange_goes_with_its_last_binding(connection, names):
    x = names("ad")
    ch = connection.channel()
    ch.exchange_declare(x, "direct", auto_delete=True)
    assert exists(connection, x)  # never bound: stays
    q = queue(ch)
    ch.queue_bind(q, x, "a")
    ch.queue_bind(q, x, "b")
    ch.queue_unbind(q, x, "a")
    assert exists(connection, x)
    ch.queue_unbind(q, x, "b")
    assert not exists(connection, x)


def test_auto_delete_exchange_goes_when_bound_queue_deleted(connection, names):
    x = names("ad-q")
    ch = connection.channel()
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = queue(ch)
    ch.queue_bind(q, x)
    ch.queue_delete(q)
    assert not exists(connection, x)


def test_auto_delete_exchange_with_exchange_bindings(connection, names):
    ad, other = names("ad-e2e"), names("ad-dest")
    ch = connection.channel()
    ch.exchange_declare(ad, "direct", auto_delete=True)
    ch.exchange_declare(other, "direct")
    # Being the destination of a binding does not count.
    ch.exchange_bind(ad, other, "k")
    ch.exchange_unbind(ad, other, "k")
    assert exists(connection, ad)
    # As the source: deleting the destination removes the last binding, and the exchange.
    ch.exchange_bind(other, ad, "k")
    ch.exchange_delete(other)
    assert not exists(connection, ad)


# ------------------------------------------------------- exchange-to-exchange


def test_exchange_binding_chain(channel, names):
    a, b, c = names("chain-a"), names("chain-b"), names("chain-c")
    channel.exchange_declare(a, "direct")
    channel.exchange_declare(b, "topic")
    channel.exchange_declare(c, "fanout")
    channel.exchange_bind(b, a, "k.x")
    channel.exchange_bind(c, b, "k.*")
    q = queue(channel)
    channel.queue_bind(q, c)
    channel.basic_publish(a, "k.x", b"1")
    channel.basic_publish(a, "k.y", b"2")  # a does not route k.y
    channel.basic_publish(b, "k.y", b"3")
    method, _, body = channel.basic_get(q, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"1", a, "k.x")
    assert drain(channel, q) == [b"3"]


def test_fan_out_through_exchanges_delivers_once_per_queue(channel, names):
    top, left, right = names("top"), names("left"), names("right")
    channel.exchange_declare(top, "fanout")
    channel.exchange_declare(left, "fanout")
    channel.exchange_declare(right, "direct")
    channel.exchange_bind(left, top)
    channel.exchange_bind(right, top, "k")
    channel.exchange_bind(right, left, "k")  # right is reachable twice
    q1, q2, q3 = queue(channel), queue(channel), queue(channel)
    channel.queue_bind(q1, left)
    channel.queue_bind(q1, right, "k")
    channel.queue_bind(q1, top)
    channel.queue_bind(q2, right, "k")
    channel.queue_bind(q3, left)
    channel.basic_publish(top, "k", b"m")
    assert (drain(channel, q1), drain(channel, q2), drain(channel, q3)) == ([b"m"], [b"m"], [b"m"])


def test_exchange_binding_loops_terminate(channel, names):
    a, b = names("loop-a"), names("loop-b")
    channel.exchange_declare(a, "fanout")
    channel.exchange_declare(b, "fanout")
    channel.exchange_bind(b, a)
    channel.exchange_bind(a, b)
    channel.exchange_bind(a, a)  # a binding to itself is allowed too
    q = queue(channel)
    channel.queue_bind(q, b)
    channel.basic_publish(a, "", b"1")
    channel.basic_publish(b, "", b"2")
    assert drain(channel, q) == [b"1", b"2"]


def test_exchange_unbind(channel, names):
    a, b = names("unbind-a"), names("unbind-b")
    channel.exchange_declare(a, "direct")
    channel.exchange_declare(b, "fanout")
    channel.exchange_bind(b, a, "k")
    q = queue(channel)
    channel.queue_bind(q, b)
    channel.basic_publish(a, "k", b"before")
    channel.exchange_unbind(b, a, "other")  # no such binding: ok, nothing changes
    channel.exchange_unbind(b, a, "k")
    channel.basic_publish(a, "k", b"after")
    assert drain(channel, q) == [b"before"]
    channel.exchange_unbind(b, a, "k")  # again: still ok


def test_unbind_with_missing_resources_is_ok(channel, uid):
    """RabbitMQ 3.10 answers unbind-ok even when the source or destination does not exist."""
    channel.exchange_unbind(f"nod-{uid}", f"nos-{uid}", "k")
    channel.exchange_unbind("amq.direct", f"nos-{uid}", "k")
    channel.exchange_unbind(f"nod-{uid}", "amq.direct", "k")
    channel.queue_unbind(f"noq-{uid}", "amq.direct", "k")
    channel.queue_unbind(queue(channel), f"nox-{uid}", "k")


def test_bind_missing_resources_is_404(connection, names, uid):
    x = names("bind404")
    connection.channel().exchange_declare(x, "direct")
    src, dst = f"nosrc-{uid}", f"nodst-{uid}"
    cases = [
        (lambda ch: ch.exchange_bind(x, src, "k"), src),
        (lambda ch: ch.exchange_bind(dst, x, "k"), dst),
        (lambda ch: ch.exchange_bind(dst, src, "k"), src),  # the source is reported first
        (lambda ch: ch.queue_bind(queue(ch), src, "k"), src),
    ]
    for op, missing in cases:
        ch = connection.channel()
        assert channel_error(lambda: op(ch)) == (404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'")
    q = f"noq-{uid}"
    ch = connection.channel()
    assert channel_error(lambda: ch.queue_bind(q, x, "k")) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")
    ch = connection.channel()  # both missing: the exchange is reported
    assert channel_error(lambda: ch.queue_bind(q, src, "k")) == (
        404, f"NOT_FOUND - no exchange '{src}' in vhost '/'")


# ------------------------------------------------------------------- delete


def test_delete_missing_exchange_is_ok(channel, uid):
    channel.exchange_delete(f"never-{uid}")
    channel.exchange_delete(f"never-{uid}", if_unused=True)


def test_delete_if_unused(connection, names):
    x, dest = names("ifunused"), names("ifunused-dest")
    ch = connection.channel()
    ch.exchange_declare(x, "direct")
    ch.exchange_declare(dest, "direct")
    q = queue(ch)
    ch.queue_bind(q, x, "k")
    assert channel_error(lambda: ch.exchange_delete(x, if_unused=True)) == (
        406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use")
    assert exists(connection, x)
    ch = connection.channel()
    ch.queue_unbind(q, x, "k")
    ch.exchange_bind(x, dest, "k")  # only a destination: not "in use"
    ch.exchange_bind(dest, x, "k")  # a source now
    assert channel_error(lambda: ch.exchange_delete(x, if_unused=True)) == (
        406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use")
    ch = connection.channel()
    ch.exchange_unbind(dest, x, "k")
    ch.exchange_delete(x, if_unused=True)
    assert not exists(connection, x)


def test_delete_removes_bindings(channel, names):
    x, up = names("del"), names("del-up")
    channel.exchange_declare(x, "fanout")
    channel.exchange_declare(up, "fanout")
    channel.exchange_bind(x, up)
    q = queue(channel)
    channel.queue_bind(q, x)
    channel.exchange_delete(x)
    channel.exchange_declare(x, "fanout")  # a new exchange of the same name has no bindings
    channel.basic_publish(x, "", b"to-x")
    channel.basic_publish(up, "", b"to-up")
    assert drain(channel, q) == []
    channel.queue_bind(q, x)
    channel.basic_publish(up, "", b"to-up")  # up -> x binding went with the old x
    channel.basic_publish(x, "", b"to-x")
    assert drain(channel, q) == [b"to-x"]


def test_a_reply_text_past_255_bytes_is_cut_to_255_bytes(broker):
    """A name of 127 two-byte characters makes a 404 text longer than a shortstr holds:
    RabbitMQ cuts it to 255 bytes (mid-character if need be) and the channel closes as
    usual; it must not become an internal error."""
    import struct

    import rawamqp
    name = "é" * 127
    with rawamqp.RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        # exchange.declare, passive, by hand: pamqp refuses names of over 127 characters
        raw.send_frame(rawamqp.FRAME_METHOD, 1, struct.pack(">HHH", 40, 10, 0) + rawamqp.shortstr(name)
                       + rawamqp.shortstr("direct") + b"\x01" + b"\x00\x00\x00\x00")
        frame = raw.read_frame()
        assert frame.channel == 1 and frame.payload[:4] == b"\x00\x14\x00\x28"  # channel.close
        (code,) = struct.unpack_from(">H", frame.payload, 4)
        text = frame.payload[7:7 + frame.payload[6]]
        assert code == 404
        assert len(text) == 255
        assert text.startswith(b"NOT_FOUND - no exchange '" + "é".encode() * 100)
