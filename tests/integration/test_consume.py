"""basic.consume / basic.cancel: tags, exclusivity, no-ack, and the broker's consumer
cancel notification when a queue goes away."""

import re

import pika
import pytest
from pamqp import commands as c

from conftest import channel_error, publish_numbered, pump
from rawamqp import connect

CANCEL_NOTIFY = {"consumer_cancel_notify": True}


def ready_count(channel, q):
    return channel.queue_declare(q, passive=True).method.message_count


def test_server_generated_tag_on_the_wire(broker, uid):
    q = f"ctag2-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        tag = raw.call(1, c.Basic.Consume(queue=q, consumer_tag="")).consumer_tag
        assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag), tag
        assert raw.call(1, c.Basic.Consume(queue=q, consumer_tag="")).consumer_tag not in (tag, "")
        raw.publish(1, "", q, b"x")
        deliver = raw.expect(c.Basic.Deliver)
        assert (deliver.delivery_tag, deliver.redelivered) == (1, False)
        assert (deliver.exchange, deliver.routing_key) == ("", q)
        assert raw.read_content()[1] == b"x"


def test_consume_no_ack(connection, channel, uid):
    q = f"noack-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    publish_numbered(channel, q, range(3))
    got = []
    tag = channel.basic_consume(q, lambda _c, m, p, b: got.append((b, m.delivery_tag)), auto_ack=True)
    pump(connection, lambda: len(got) == 3)
    assert got == [(b"0", 1), (b"1", 2), (b"2", 3)]
    channel.basic_cancel(tag)
    # Nothing was unacked, so nothing comes back when the channel closes.
    channel.close()
    assert connection.channel().basic_get(q) == (None, None, None)


def test_exclusive_consumer_blocks_others(connection, channel, uid):
    q = f"xcons-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.basic_consume(q, lambda *a: None, exclusive=True)
    ch = connection.channel()
    channel_error(lambda: ch.basic_consume(q, lambda *a: None), 403,
                  f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
    ch = connection.channel()
    channel_error(lambda: ch.basic_consume(q, lambda *a: None, exclusive=True), 403,
                  f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
    # basic.get is still allowed.
    assert connection.channel().basic_get(q) == (None, None, None)


def test_exclusive_consume_on_queue_with_consumers_is_403(connection, channel, uid):
    q = f"xcons2-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.basic_consume(q, lambda *a: None)
    ch = connection.channel()
    channel_error(lambda: ch.basic_consume(q, lambda *a: None, exclusive=True), 403,
                  f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


def test_exclusive_consumer_released_by_cancel(connection, channel, uid):
    q = f"xcons3-{uid}"
    channel.queue_declare(q, exclusive=True)
    tag = channel.basic_consume(q, lambda *a: None, exclusive=True)
    channel.basic_cancel(tag)
    connection.channel().basic_consume(q, lambda *a: None)


def test_reusing_a_consumer_tag_is_a_connection_error(broker, uid):
    q = f"retag-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(q, exclusive=True)
        ch.basic_consume(q, lambda *a: None, consumer_tag="mine")
        # The same tag on another channel is fine.
        conn.channel().basic_consume(q, lambda *a: None, consumer_tag="mine")
        with pytest.raises(pika.exceptions.DuplicateConsumerTag):
            ch.basic_consume(q, lambda *a: None, consumer_tag="mine")  # pika refuses locally
    finally:
        if conn.is_open:
            conn.close()
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="mine"))
        raw.send_method(1, c.Basic.Consume(queue=q, consumer_tag="mine"))
        raw.expect_connection_close(530, "NOT_ALLOWED - attempt to reuse consumer tag 'mine'", 60, 20)


def test_cancel_unknown_tag_is_ok(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        assert raw.call(1, c.Basic.Cancel(consumer_tag="never-was")).consumer_tag == "never-was"


def test_cancel_stops_deliveries_and_keeps_unacked(connection, channel, uid):
    q = f"cancel-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_qos(prefetch_count=2)
    publish_numbered(channel, q, range(4))
    got = []
    tag = channel.basic_consume(q, lambda _c, m, p, b: got.append(m.delivery_tag))
    pump(connection, lambda: len(got) == 2)
    channel.basic_cancel(tag)
    # Cancel does not requeue: the two deliveries stay unacked, the others stay ready.
    assert ready_count(channel, q) == 2
    channel.basic_ack(got[1], multiple=True)
    channel.basic_publish("", q, b"more")
    connection.process_data_events(time_limit=0.2)
    assert len(got) == 2
    channel.close()
    ch = connection.channel()
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(3)] == [b"2", b"3", b"more"]


def test_cancel_unacked_then_requeued_on_close(connection, channel, uid):
    q = f"cancel2-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"x")
    got = []
    tag = channel.basic_consume(q, lambda _c, m, p, b: got.append(b))
    pump(connection, lambda: got)
    channel.basic_cancel(tag)
    channel.close()
    method, _, body = connection.channel().basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"x", True)


def test_consume_from_missing_queue_is_404(channel, uid):
    channel_error(lambda: channel.basic_consume(f"nq-{uid}", lambda *a: None), 404,
                  f"NOT_FOUND - no queue 'nq-{uid}' in vhost '/'")


def test_consumers_counted(connection, channel, uid):
    q = f"ccount-{uid}"
    channel.queue_declare(q, exclusive=True)
    tags = [channel.basic_consume(q, lambda *a: None) for _ in range(2)]
    ch2 = connection.channel()
    ch2.basic_consume(q, lambda *a: None)
    assert channel.queue_declare(q, passive=True).method.consumer_count == 3
    channel.basic_cancel(tags[0])
    assert channel.queue_declare(q, passive=True).method.consumer_count == 2
    ch2.close()
    assert channel.queue_declare(q, passive=True).method.consumer_count == 1


# ------------------------------------------------- consumer cancel notification


def test_queue_delete_notifies_pika_consumers(connection, channel, uid):
    q = f"notify-{uid}"
    channel.queue_declare(q)
    cancelled = []
    tag = channel.basic_consume(q, lambda *a: None)
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    other = connection.channel()
    assert other.queue_delete(q).method.message_count == 0
    pump(connection, lambda: cancelled)
    assert cancelled == [tag]
    assert tag not in channel.consumer_tags


def test_queue_delete_sends_basic_cancel_when_capability_announced(broker, uid):
    q = f"notify2-{uid}"
    with connect(broker, capabilities=CANCEL_NOTIFY) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c1"))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c2", no_ack=True))
        raw.send_method(1, c.Queue.Delete(queue=q))
        frames = raw.frames_until_quiet()
        cancels = [f for f in frames if isinstance(f, c.Basic.Cancel)]
        assert sorted(f.consumer_tag for f in cancels) == ["c1", "c2"]
        assert all(f.nowait is True for f in cancels)
        assert [type(f) for f in frames if not isinstance(f, c.Basic.Cancel)] == [c.Queue.DeleteOk]
        # The consumers are gone: cancelling one now is a no-op that still answers cancel-ok.
        assert raw.call(1, c.Basic.Cancel(consumer_tag="c2")).consumer_tag == "c2"
        # The broker's basic.cancel has nowait set: a client must not answer cancel-ok.
        raw.send_method(1, c.Basic.CancelOk(consumer_tag="c1"))
        raw.expect_connection_close(503, "COMMAND_INVALID - unimplemented method", 60, 31)


def test_queue_delete_from_another_connection_notifies(broker, uid):
    q = f"notify3-{uid}"
    with connect(broker, capabilities=CANCEL_NOTIFY) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c1"))
        conn = pika.BlockingConnection(broker.pika_params())
        conn.channel().queue_delete(q)
        conn.close()
        cancel = raw.expect(c.Basic.Cancel)
        assert cancel.consumer_tag == "c1"


def test_no_cancel_notification_without_capability(broker, uid):
    q = f"notify4-{uid}"
    with connect(broker, capabilities={}) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c1"))
        raw.send_method(1, c.Queue.Delete(queue=q))
        frames = raw.frames_until_quiet()
        assert [type(f) for f in frames] == [c.Queue.DeleteOk]
        # The consumer is gone all the same: its tag can be used again.
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c1"))


def test_exclusive_queue_of_closed_connection_notifies_no_one_else(broker, uid):
    """Consumers of an auto-deleted queue on their own channel: the queue goes with the
    last consumer, no notification is needed."""
    q = f"notify5-{uid}"
    with connect(broker, capabilities=CANCEL_NOTIFY) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, auto_delete=True))
        raw.call(1, c.Basic.Consume(queue=q, consumer_tag="c1"))
        raw.call(1, c.Basic.Cancel(consumer_tag="c1"))
        assert raw.frames_until_quiet(0.2) == []
        raw.send_method(1, c.Queue.Declare(queue=q, passive=True))
        raw.expect_channel_close(1, 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")
