"""Where the consumer cancel notification (basic.cancel from the server, for clients that
announce consumer_cancel_notify) goes relative to queue.delete-ok, as RabbitMQ 3.10 orders
them: checked frame by frame with the raw client.

RabbitMQ answers delete-ok before it cancels the deleting channel's own consumers, always.
Consumers on other channels of the same connection hear of the deletion independently of the
reply (RabbitMQ sends their cancel before or after delete-ok, mostly before), so only the order
on each channel is asserted there.
"""

from pamqp import commands as c

from rawamqp import connect


def read_frames(raw, n):
    """The next `n` frames as (channel, method), then nothing more for a moment."""
    frames = [raw.read_frame() for _ in range(n)]
    assert raw.frames_until_quiet(0.2) == []
    return [(f.channel, f.value) for f in frames]


def summary(frames):
    return [(ch, type(m).__name__, getattr(m, "consumer_tag", None)) for ch, m in frames]


def consume(raw, channel, queue, tag):
    raw.call(channel, c.Basic.Consume(queue=queue, consumer_tag=tag))


def test_same_channel_gets_delete_ok_before_its_cancels(broker, names):
    q = names("cancel-order-same")
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        consume(raw, 1, q, "c1")
        consume(raw, 1, q, "c2")
        raw.send_method(1, c.Queue.Delete(queue=q))
        frames = read_frames(raw, 3)
        assert summary(frames[:1]) == [(1, "DeleteOk", None)]
        assert sorted(summary(frames[1:])) == [(1, "Cancel", "c1"), (1, "Cancel", "c2")]
        assert all(m.nowait for _, m in frames[1:])


def test_same_channel_delete_ok_counts_ready_messages(broker, names):
    """kombu's test_ack_from_another_thread: consume, then delete the queue on the same
    channel and wait for delete-ok; the cancel comes after it."""
    q = names("cancel-order-count")
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        raw.call(1, c.Basic.Qos(prefetch_count=1))
        for body in (b"a", b"b", b"c"):
            raw.publish(1, "", q, body)
        consume(raw, 1, q, "k1")
        raw.expect(c.Basic.Deliver, 1)
        raw.read_content()
        assert raw.frames_until_quiet(0.2) == []
        ok = raw.call(1, c.Queue.Delete(queue=q))  # fails if the cancel came first
        assert ok.message_count == 2
        assert summary(read_frames(raw, 1)) == [(1, "Cancel", "k1")]
        # The channel is still usable, and the consumer is gone: cancelling it is a no-op.
        assert raw.call(1, c.Basic.Cancel(consumer_tag="k1")).consumer_tag == "k1"


def test_nowait_delete_on_the_consumers_channel_still_cancels(broker, names):
    q = names("cancel-order-nowait")
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q))
        consume(raw, 1, q, "c1")
        raw.send_method(1, c.Queue.Delete(queue=q, nowait=True))
        assert summary(read_frames(raw, 1)) == [(1, "Cancel", "c1")]


def test_other_channel_of_the_same_connection(broker, names):
    q = names("cancel-order-other-channel")
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.open_channel(2)
        raw.call(1, c.Queue.Declare(queue=q))
        consume(raw, 1, q, "c1")
        raw.send_method(2, c.Queue.Delete(queue=q))
        assert sorted(summary(read_frames(raw, 2))) == [(1, "Cancel", "c1"), (2, "DeleteOk", None)]


def test_consumers_on_the_deleting_channel_and_another(broker, names):
    q = names("cancel-order-both")
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.open_channel(2)
        raw.call(1, c.Queue.Declare(queue=q))
        consume(raw, 1, q, "c1")
        consume(raw, 2, q, "c2")
        raw.send_method(2, c.Queue.Delete(queue=q))
        frames = summary(read_frames(raw, 3))
        assert [f for f in frames if f[0] == 2] == [(2, "DeleteOk", None), (2, "Cancel", "c2")]
        assert [f for f in frames if f[0] == 1] == [(1, "Cancel", "c1")]


def test_deleted_from_another_connection(broker, names):
    q = names("cancel-order-other-connection")
    with connect(broker) as consumer, connect(broker) as deleter:
        consumer.open_channel(1)
        consumer.call(1, c.Queue.Declare(queue=q))
        consume(consumer, 1, q, "c1")
        deleter.open_channel(1)
        assert deleter.call(1, c.Queue.Delete(queue=q)).message_count == 0
        assert deleter.frames_until_quiet(0.2) == []
        assert summary(read_frames(consumer, 1)) == [(1, "Cancel", "c1")]


def test_exclusive_queue_has_no_consumers_on_other_connections(broker, names):
    """Only the owner connection can consume from (or delete) an exclusive queue, so when the
    owner goes, no other connection has a consumer to be told about."""
    q = names("cancel-order-exclusive")
    locked = (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. "
              "It could be originally declared on another connection or the exclusive property value "
              "does not match that of the original declaration.")
    with connect(broker) as owner, connect(broker) as other:
        owner.open_channel(1)
        owner.open_channel(2)
        owner.call(1, c.Queue.Declare(queue=q, exclusive=True))
        consume(owner, 1, q, "c1")
        consume(owner, 2, q, "c2")
        other.open_channel(1)
        other.send_method(1, c.Basic.Consume(queue=q, consumer_tag="o1"))
        other.expect_channel_close(1, 405, locked, 60, 20)
        other.open_channel(2)
        other.send_method(2, c.Queue.Delete(queue=q))
        other.expect_channel_close(2, 405, locked, 50, 40)
        assert owner.frames_until_quiet(0.2) == []
        owner.send_method(0, c.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        owner.expect(c.Connection.CloseOk, 0)  # no cancel before it
        owner.close()
        assert other.frames_until_quiet(0.3) == []  # nothing for the other connection
        other.open_channel(3)
        other.send_method(3, c.Queue.Declare(queue=q, passive=True))
        other.expect_channel_close(3, 404, f"NOT_FOUND - no queue '{q}' in vhost '/'", 50, 10)


def test_exclusive_queue_deleted_by_its_owner_on_another_channel(broker, names):
    q = names("cancel-order-exclusive-owner")
    with connect(broker) as owner:
        owner.open_channel(1)
        owner.open_channel(2)
        owner.call(1, c.Queue.Declare(queue=q, exclusive=True))
        consume(owner, 1, q, "c1")
        consume(owner, 2, q, "c2")
        owner.send_method(1, c.Queue.Delete(queue=q))
        frames = summary(read_frames(owner, 3))
        assert [f for f in frames if f[0] == 1] == [(1, "DeleteOk", None), (1, "Cancel", "c1")]
        assert [f for f in frames if f[0] == 2] == [(2, "Cancel", "c2")]
