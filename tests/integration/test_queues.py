"""queue.declare / bind / unbind / purge / delete, as RabbitMQ 3.10 answers them."""

import re

import pika
import pytest
from pamqp import commands as c

from conftest import channel_error
from rawamqp import connect


def locked(q):
    return ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. "
            "It could be originally declared on another connection or the exclusive property value "
            "does not match that of the original declaration." % q)


# ------------------------------------------------------------------ declare


def test_server_named_queue(channel):
    ok = channel.queue_declare("", exclusive=True)
    name = ok.method.queue
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", name), name
    assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)
    assert channel.queue_declare("", exclusive=True).method.queue != name
    # The server-named queue is usable by its name.
    channel.basic_publish("", name, b"x")
    assert channel.basic_get(name, auto_ack=True)[2] == b"x"


def test_passive_declare_missing_queue_is_404(channel, uid):
    q = f"missing-{uid}"
    channel_error(lambda: channel.queue_declare(q, passive=True), 404,
                  f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_passive_declare_reports_counts(connection, channel, uid):
    q = f"counts-{uid}"
    channel.confirm_delivery()  # RabbitMQ answers a declare before it has enqueued unconfirmed publishes
    channel.queue_declare(q, auto_delete=True)
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    assert channel.queue_declare(q, passive=True).method.message_count == 5
    # One unacked via basic.get, one unacked held by a prefetch-1 consumer: neither is ready.
    assert channel.basic_get(q)[2] == b"0"
    consumer_ch = connection.channel()
    consumer_ch.basic_qos(prefetch_count=1)
    got = []
    consumer_ch.basic_consume(q, lambda ch, m, p, b: got.append(b))
    connection.process_data_events(time_limit=0.2)
    assert got == [b"1"]
    ok = channel.queue_declare(q, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 3, 1)
    # A non-passive redeclare reports the same counts.
    ok = channel.queue_declare(q, auto_delete=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 1)


def test_redeclare_with_different_durable_is_406(connection, channel, uid):
    q = f"dur-{uid}"
    channel.queue_declare(q)
    try:
        channel_error(lambda: channel.queue_declare(q, durable=True), 406,
                      f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': "
                      "received 'true' but current is 'false'")
    finally:
        connection.channel().queue_delete(q)


def test_redeclare_durable_queue_as_transient_is_406(connection, uid):
    q = f"dur2-{uid}"
    ch = connection.channel()
    ch.queue_declare(q, durable=True)
    try:
        channel_error(lambda: ch.queue_declare(q), 406,
                      f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': "
                      "received 'false' but current is 'true'")
    finally:
        connection.channel().queue_delete(q)


def test_redeclare_with_different_auto_delete_is_406(channel, uid):
    q = f"ad-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel_error(lambda: channel.queue_declare(q, exclusive=True, auto_delete=True), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{q}' in vhost '/': "
                  "received 'true' but current is 'false'")


def test_redeclare_with_different_argument_values_is_406(channel, uid):
    q = f"args-{uid}"
    channel.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 1000})
    channel_error(lambda: channel.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 2000}), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{q}' in vhost '/': "
                  "received '2000' but current is '1000'")


def test_redeclare_without_an_argument_is_406(connection, uid):
    q = f"args2-{uid}"
    ch = connection.channel()
    ch.queue_declare(q, exclusive=True, arguments={"x-max-length": 10})
    # Same value, different integer width: equivalent.
    ch.queue_declare(q, exclusive=True, arguments={"x-max-length": 10})
    channel_error(lambda: ch.queue_declare(q, exclusive=True), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': "
                  "received none but current is the value '10' of type 'signedint'")
    ch = connection.channel()
    channel_error(lambda: ch.queue_declare(q, exclusive=True, arguments={"x-max-length": 10,
                                                                          "x-expires": 5000}), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-expires' for queue '{q}' in vhost '/': "
                  "received the value '5000' of type 'signedint' but current is none")


def test_unknown_x_arguments_are_ignored(channel, uid):
    q = f"unk-{uid}"
    channel.queue_declare(q, exclusive=True, arguments={"x-made-up": "yes", "foo": 1})
    channel.queue_declare(q, exclusive=True, arguments={"x-made-up": "no"})
    channel.queue_declare(q, exclusive=True)


def test_reserved_amq_prefix_is_403(channel):
    channel_error(lambda: channel.queue_declare("amq.mine"), 403,
                  "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'")


@pytest.mark.parametrize("args, detail", [
    ({"x-message-ttl": "abc"}, ("x-message-ttl", '"expected integer, got longstr"')),
    ({"x-message-ttl": -1}, ("x-message-ttl", "{value_negative,-1}")),
    ({"x-message-ttl": True}, ("x-message-ttl", '"expected integer, got bool"')),
    ({"x-message-ttl": 315360000001}, ("x-message-ttl", "{value_too_large,315360000001}")),
    ({"x-expires": 0}, ("x-expires", "{value_zero,0}")),
    ({"x-expires": -5}, ("x-expires", "{value_negative,-5}")),
    ({"x-expires": "1"}, ("x-expires", '"expected integer, got longstr"')),
    ({"x-expires": 2**40}, ("x-expires", "{value_too_large,1099511627776}")),
    ({"x-max-length": -1}, ("x-max-length", "{value_negative,-1}")),
    ({"x-max-length-bytes": -2}, ("x-max-length-bytes", "{value_negative,-2}")),
    ({"x-max-priority": 256}, ("x-max-priority", "{max_value_exceeded,256}")),
    ({"x-max-priority": -1}, ("x-max-priority", "{value_negative,-1}")),
    ({"x-max-priority": "9"}, ("x-max-priority", '"expected integer, got longstr"')),
    ({"x-dead-letter-routing-key": "rk"}, ("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")),
    ({"x-dead-letter-routing-key": 7, "x-dead-letter-exchange": "dlx"},
     ("x-dead-letter-routing-key", "{unacceptable_type,signedint}")),
    ({"x-overflow": "explode"}, ("x-overflow", "invalid_overflow")),
    ({"x-overflow": 1}, ("x-overflow", "{unacceptable_type,signedint}")),
    ({"x-queue-mode": "eager"}, ("x-queue-mode", '"unsupported queue mode \'eager\'"')),
    ({"x-queue-mode": 1}, ("x-queue-mode", "{unacceptable_type,signedint}")),
    ({"x-queue-version": 3}, ("x-queue-version", '"unsupported queue version \'3\'"')),
    ({"x-single-active-consumer": 1}, ("x-single-active-consumer", "{unacceptable_type,signedint}")),
    ({"x-queue-type": "bogus"}, ("x-queue-type", '"unsupported queue type \'bogus\'"')),
    # Checked in RabbitMQ's fixed order, not the table's: x-expires before x-message-ttl.
    ({"x-message-ttl": -1, "x-expires": 0}, ("x-expires", "{value_zero,0}")),
    ({"x-overflow": "x", "x-max-length": -3}, ("x-max-length", "{value_negative,-3}")),
])
def test_invalid_arguments_are_406(channel, uid, args, detail):
    q = f"badarg-{uid}"
    key, err = detail
    channel_error(lambda: channel.queue_declare(q, exclusive=True, arguments=args), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/': {err}")


def test_dead_letter_exchange_of_wrong_type_is_406(channel, uid):
    q = f"baddlx-{uid}"
    # RabbitMQ checks the DLX's type before the other arguments, with its own wording.
    channel_error(lambda: channel.queue_declare(q, exclusive=True, arguments={
        "x-dead-letter-exchange": 5, "x-message-ttl": "abc"}), 406,
        f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{q}' in vhost '/'")


@pytest.mark.parametrize("key, value", [("x-delivery-limit", 5), ("x-max-in-memory-length", 10),
                                        ("x-max-age", "1D"), ("x-quorum-initial-group-size", 3)])
def test_arguments_of_other_queue_types_are_406(channel, uid, key, value):
    q = f"qqarg-{uid}"
    channel_error(lambda: channel.queue_declare(q, exclusive=True, arguments={key: value}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/' "
                  "of queue type rabbit_classic_queue")


def test_argument_types_are_named_as_sent(broker, uid):
    """RabbitMQ names the wire type of a value (pamqp sends small integers as 'b' byte)."""
    q = f"wiretype-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.send_method(1, c.Queue.Declare(queue=q, exclusive=True, arguments={"x-single-active-consumer": 1}))
        raw.expect_channel_close(1, 406, f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue "
                                         f"'{q}' in vhost '/': {{unacceptable_type,byte}}")
        raw.open_channel(2)
        raw.call(2, c.Queue.Declare(queue=q, exclusive=True))
        raw.send_method(2, c.Queue.Declare(queue=q, exclusive=True, arguments={"x-max-priority": 5,
                                                                               "x-expires": 1000}))
        raw.expect_channel_close(2, 406, f"PRECONDITION_FAILED - inequivalent arg 'x-expires' for queue '{q}' in "
                                         "vhost '/': received the value '1000' of type 'short' but current is none")


def test_redeclare_compares_argument_type_classes(channel, uid):
    q = f"eqstr-{uid}"
    channel.queue_declare(q, exclusive=True, arguments={"x-dead-letter-exchange": "a",
                                                         "x-single-active-consumer": True})
    channel.queue_declare(q, exclusive=True, arguments={"x-dead-letter-exchange": "a",
                                                         "x-single-active-consumer": True,
                                                         "x-queue-type": "classic"})
    channel_error(lambda: channel.queue_declare(q, exclusive=True, arguments={
        "x-dead-letter-exchange": "b", "x-single-active-consumer": True}), 406,
        f"PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue '{q}' in vhost '/': "
        "received 'b' but current is 'a'")


def test_valid_arguments_are_accepted(channel, uid):
    q = f"goodarg-{uid}"
    args = {"x-message-ttl": 0, "x-expires": 60000, "x-max-length": 0, "x-max-length-bytes": 1000,
            "x-max-priority": 255, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dl",
            "x-overflow": "reject-publish", "x-queue-mode": "lazy"}
    ok = channel.queue_declare(q, exclusive=True, arguments=args)
    assert ok.method.queue == q


# --------------------------------------------------------------- exclusivity


def test_exclusive_queue_is_locked_to_its_connection(channel, other_connection, uid):
    q = f"excl-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.queue_bind(q, "amq.direct", q)
    attempts = {
        "declare": lambda ch: ch.queue_declare(q, exclusive=True),
        "declare-non-exclusive": lambda ch: ch.queue_declare(q),
        "passive": lambda ch: ch.queue_declare(q, passive=True),
        "consume": lambda ch: ch.basic_consume(q, lambda *a: None),
        "get": lambda ch: ch.basic_get(q),
        "purge": lambda ch: ch.queue_purge(q),
        "delete": lambda ch: ch.queue_delete(q),
        "bind": lambda ch: ch.queue_bind(q, "amq.fanout"),
        "unbind": lambda ch: ch.queue_unbind(q, "amq.direct", q),
    }
    for name, attempt in attempts.items():
        ch = other_connection.channel()
        assert channel_error(lambda: attempt(ch)) == (405, locked(q)), name
    # The owner still can.
    assert channel.queue_declare(q, passive=True).method.queue == q
    channel.queue_purge(q)


def test_redeclare_exclusive_flag_mismatch_on_owner_is_405(connection, channel, uid):
    q = f"excl2-{uid}"
    channel.queue_declare(q, auto_delete=True)
    try:
        channel_error(lambda: channel.queue_declare(q, exclusive=True, auto_delete=True), 405, locked(q))
    finally:
        connection.channel().queue_delete(q)


def test_exclusive_queue_deleted_when_connection_closes(broker, channel, uid):
    q = f"excl3-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"x")
    channel.queue_declare(f"sentinel-{uid}", exclusive=True)  # keep `channel` alive
    conn.close()
    channel_error(lambda: channel.queue_declare(q, passive=True), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_exclusive_queue_survives_its_channel_closing(connection, uid):
    q = f"excl4-{uid}"
    ch = connection.channel()
    ch.queue_declare(q, exclusive=True)
    ch.close()
    assert connection.channel().queue_declare(q, passive=True).method.queue == q


# --------------------------------------------------------------- auto-delete


def test_auto_delete_queue_without_consumers_stays(channel, uid):
    q = f"ad2-{uid}"
    channel.confirm_delivery()
    channel.queue_declare(q, auto_delete=True)
    channel.basic_publish("", q, b"x")
    assert channel.queue_declare(q, passive=True).method.message_count == 1
    channel.queue_delete(q)


def test_auto_delete_queue_deleted_after_last_consumer_cancels(connection, channel, uid):
    q = f"ad3-{uid}"
    channel.queue_declare(q, auto_delete=True)
    t1 = channel.basic_consume(q, lambda *a: None)
    t2 = channel.basic_consume(q, lambda *a: None)
    channel.basic_cancel(t1)
    assert channel.queue_declare(q, passive=True).method.consumer_count == 1
    channel.basic_cancel(t2)
    channel_error(lambda: channel.queue_declare(q, passive=True), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_auto_delete_queue_deleted_when_consumer_channel_closes(connection, uid):
    q = f"ad4-{uid}"
    ch = connection.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    channel_error(lambda: connection.channel().queue_declare(q, passive=True), 404,
                  f"NOT_FOUND - no queue '{q}' in vhost '/'")


# ---------------------------------------------------------------- bindings


def test_bind_and_unbind_with_arguments(channel, uid):
    q = f"hdr-{uid}"
    channel.queue_declare(q, exclusive=True)
    args = {"x-match": "all", "kind": f"k-{uid}"}
    channel.queue_bind(q, "amq.headers", arguments=args)
    channel.basic_publish("amq.headers", "", b"match", pika.BasicProperties(headers={"kind": f"k-{uid}"}))
    channel.basic_publish("amq.headers", "", b"nomatch", pika.BasicProperties(headers={"kind": "other"}))
    assert channel.basic_get(q, auto_ack=True)[2] == b"match"
    assert channel.basic_get(q, auto_ack=True) == (None, None, None)
    # Unbinding with other arguments removes nothing (and is not an error).
    channel.queue_unbind(q, "amq.headers", arguments={"x-match": "all", "kind": "other"})
    channel.basic_publish("amq.headers", "", b"still", pika.BasicProperties(headers={"kind": f"k-{uid}"}))
    assert channel.basic_get(q, auto_ack=True)[2] == b"still"
    channel.queue_unbind(q, "amq.headers", arguments=args)
    channel.basic_publish("amq.headers", "", b"gone", pika.BasicProperties(headers={"kind": f"k-{uid}"}))
    assert channel.basic_get(q, auto_ack=True) == (None, None, None)


def test_bind_same_key_twice_routes_once(channel, uid):
    q = f"bind2-{uid}"
    channel.confirm_delivery()
    channel.queue_declare(q, exclusive=True)
    channel.queue_bind(q, "amq.direct", f"k-{uid}")
    channel.queue_bind(q, "amq.direct", f"k-{uid}")
    channel.basic_publish("amq.direct", f"k-{uid}", b"once")
    assert channel.queue_declare(q, passive=True).method.message_count == 1


def test_bind_to_missing_queue_or_exchange_is_404(connection, uid):
    q = f"bind3-{uid}"
    ch = connection.channel()
    channel_error(lambda: ch.queue_bind(q, "amq.direct"), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")
    ch = connection.channel()
    ch.queue_declare(q, exclusive=True)
    channel_error(lambda: ch.queue_bind(q, f"nox-{uid}"), 404,
                  f"NOT_FOUND - no exchange 'nox-{uid}' in vhost '/'")


def test_bind_to_default_exchange_is_403(channel, uid):
    q = f"bind4-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel_error(lambda: channel.queue_bind(q, ""), 403,
                  "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_unbind_missing_binding_is_ok(channel, uid):
    q = f"unb-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.queue_unbind(q, "amq.direct", f"never-bound-{uid}")
    channel.queue_declare(q, passive=True)


# ------------------------------------------------------------ purge, delete


def test_purge_returns_ready_count(channel, uid):
    q = f"purge-{uid}"
    channel.queue_declare(q, exclusive=True)
    for i in range(4):
        channel.basic_publish("", q, b"x")
    method, _, _ = channel.basic_get(q)  # unacked: not purged
    assert channel.queue_purge(q).method.message_count == 3
    assert channel.queue_purge(q).method.message_count == 0
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = channel.basic_get(q, auto_ack=True)
    assert method.redelivered and method.message_count == 0


def test_purge_missing_queue_is_404(channel, uid):
    channel_error(lambda: channel.queue_purge(f"nq-{uid}"), 404, f"NOT_FOUND - no queue 'nq-{uid}' in vhost '/'")


def test_delete_returns_ready_count(channel, uid):
    q = f"del-{uid}"
    channel.confirm_delivery()
    channel.queue_declare(q)
    for i in range(3):
        channel.basic_publish("", q, b"x")
    assert channel.queue_delete(q).method.message_count == 3
    channel_error(lambda: channel.queue_declare(q, passive=True), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_delete_missing_queue_is_ok_with_zero(channel, uid):
    assert channel.queue_delete(f"never-{uid}").method.message_count == 0


def test_delete_if_unused(connection, channel, uid):
    q = f"delu-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.basic_consume(q, lambda *a: None)
    channel_error(lambda: channel.queue_delete(q, if_unused=True), 406,
                  f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")
    ch = connection.channel()
    assert ch.queue_declare(q, passive=True).method.consumer_count == 0  # the consumer went with its channel
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x")
    assert ch.queue_delete(q, if_unused=True).method.message_count == 1


def test_delete_if_empty(connection, channel, uid):
    q = f"dele-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.basic_publish("", q, b"x")
    channel_error(lambda: channel.queue_delete(q, if_empty=True), 406,
                  f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty")
    ch = connection.channel()
    method, _, _ = ch.basic_get(q)
    # Only ready messages count: an unacked one does not make the queue non-empty.
    assert ch.queue_delete(q, if_empty=True).method.message_count == 0
    channel_error(lambda: ch.queue_declare(q, passive=True), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_delete_queue_drops_its_bindings(channel, uid):
    q = f"delb-{uid}"
    channel.confirm_delivery()
    channel.queue_declare(q)
    channel.queue_bind(q, "amq.direct", f"k-{uid}")
    channel.queue_delete(q)
    channel.queue_declare(q, exclusive=True)
    channel.basic_publish("amq.direct", f"k-{uid}", b"x")
    assert channel.queue_declare(q, passive=True).method.message_count == 0


# ---------------------------------------------------- empty queue name shortcut


def test_empty_queue_name_means_last_declared_queue(broker, uid):
    q = f"short-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        assert raw.call(1, c.Queue.Declare(queue=q, exclusive=True)).queue == q
        # bind with empty queue and routing key: the queue's name is used as the key
        raw.call(1, c.Queue.Bind(queue="", exchange="amq.direct", routing_key=""))
        raw.publish(1, "amq.direct", q, b"one")
        raw.publish(1, "amq.direct", q, b"two")
        ok = raw.call(1, c.Basic.Get(queue="", no_ack=True), c.Basic.GetOk)
        assert ok.message_count == 1 and ok.routing_key == q
        assert raw.read_content()[1] == b"one"
        assert raw.call(1, c.Queue.Purge(queue="")).message_count == 1
        raw.call(1, c.Basic.Consume(queue="", consumer_tag="ct"))
        raw.publish(1, "", q, b"three")
        deliver = raw.expect(c.Basic.Deliver)
        assert deliver.consumer_tag == "ct" and deliver.routing_key == q
        assert raw.read_content()[1] == b"three"
        raw.send_method(1, c.Basic.Ack(delivery_tag=deliver.delivery_tag))
        raw.call(1, c.Basic.Cancel(consumer_tag="ct"))
        raw.call(1, c.Queue.Unbind(queue="", exchange="amq.direct", routing_key=q))
        assert raw.call(1, c.Queue.Delete(queue="")).message_count == 0
        raw.send_method(1, c.Queue.Declare(queue=q, passive=True))
        raw.expect_channel_close(1, 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_empty_queue_name_shortcut_with_server_named_queue(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        name = raw.call(1, c.Queue.Declare(queue="", exclusive=True)).queue
        raw.publish(1, "", name, b"x")
        ok = raw.call(1, c.Basic.Get(queue="", no_ack=True), c.Basic.GetOk)
        assert ok.routing_key == name and raw.read_content()[1] == b"x"


def test_passive_declare_has_no_empty_name_shortcut(broker, uid):
    q = f"short2-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.send_method(1, c.Queue.Declare(queue="", passive=True))
        raw.expect_channel_close(1, 404, "NOT_FOUND - no queue '' in vhost '/'")


@pytest.mark.parametrize("method", [
    c.Basic.Get(queue=""), c.Queue.Purge(queue=""), c.Queue.Delete(queue=""),
    c.Basic.Consume(queue=""), c.Queue.Bind(queue="", exchange="amq.direct"),
], ids=["get", "purge", "delete", "consume", "bind"])
def test_empty_queue_name_without_declared_queue_is_404(broker, method):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.send_method(1, method)
        close = raw.expect_channel_close(1, 404, "NOT_FOUND - no previously declared queue")
        assert (close.class_id, close.method_id) == divmod(method.index, 0x10000)
