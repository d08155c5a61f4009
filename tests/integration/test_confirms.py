"""Publisher confirms (confirm.select, basic.ack from the broker), including the order of
basic.return and basic.ack for unroutable mandatory messages, observed on the wire."""

import pika
import pytest
from pamqp import commands as c

from conftest import channel_error
from rawamqp import connect


# --------------------------------------------------------------------------- tests


def test_confirm_tags_start_at_one_per_channel(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Confirm.Select())
        raw.open_channel(2)
        raw.call(2, c.Confirm.Select())
        raw.publish(1, "amq.fanout", "x", b"a")
        ack = raw.expect(c.Basic.Ack, channel=1)
        assert ack.delivery_tag == 1 and ack.multiple is False
        raw.publish(2, "amq.fanout", "x", b"b")
        ack = raw.expect(c.Basic.Ack, channel=2)
        assert ack.delivery_tag == 1
        raw.publish(1, "amq.fanout", "x", b"c")
        ack = raw.expect(c.Basic.Ack, channel=1)
        assert ack.delivery_tag == 2 and ack.multiple is False


def _acked_tags(frames):
    """Expand broker basic.acks into the set of confirmed tags (assuming in-order acks)."""
    tags = []
    last = 0
    for f in frames:
        if isinstance(f, c.Basic.Ack):
            upto = f.delivery_tag
            tags.extend(range(last + 1, upto + 1) if f.multiple else [upto])
            last = max(last, upto)
    return tags


def test_confirm_many_publishes_all_acked(broker, uid):
    q = f"conf-many-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.call(1, c.Confirm.Select())
        for i in range(200):
            raw.publish(1, "", q, str(i).encode())
        frames = []
        while not frames or _acked_tags(frames)[-1:] != [200]:
            frames.append(raw.read_frame(5).value)  # TimeoutError: missing confirms
        tags = _acked_tags(frames)
        assert sorted(tags) == list(range(1, 201))
        assert all(isinstance(f, c.Basic.Ack) for f in frames)
        assert raw.call(1, c.Queue.Declare(queue=q, passive=True)).message_count == 200


def test_confirm_select_nowait(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.send_method(1, c.Confirm.Select(nowait=True))
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"x")
        # No select-ok: the first thing back is the ack of publish 1.
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1 and not ack.multiple


def test_unroutable_not_mandatory_is_acked_without_return(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Confirm.Select())
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"x")
        frames = raw.frames_until_quiet()
        assert len(frames) == 1
        assert isinstance(frames[0], c.Basic.Ack) and frames[0].delivery_tag == 1


def test_unroutable_mandatory_returns_before_ack(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Confirm.Select())
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"lost", mandatory=True,
                    properties=c.Basic.Properties(message_id="m1"))
        ret = raw.expect(c.Basic.Return)
        assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
        assert ret.exchange == "amq.direct" and ret.routing_key == f"nobody-{uid}"
        header, body = raw.read_content()
        assert body == b"lost" and header.properties.message_id == "m1"
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1 and not ack.multiple
        assert raw.frames_until_quiet(0.2) == []


def test_mixed_routable_and_returned_with_pika_select(broker, uid):
    """pika's SelectConnection sees each return before the ack of its publish."""
    q = f"conf-mix-{uid}"
    events = []

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        ch.add_on_return_callback(lambda _ch, method, props, body: events.append(("return", body)))
        ch.queue_declare(q, exclusive=True, callback=lambda _f: ch.confirm_delivery(
            lambda frame: on_confirm(ch, frame), callback=lambda _f: publish(ch)))

    def publish(ch):
        ch.basic_publish("", q, b"1")
        ch.basic_publish("", f"missing-{uid}", b"2", mandatory=True)
        ch.basic_publish("", q, b"3", mandatory=True)
        ch.basic_publish("", f"missing-{uid}", b"4", mandatory=True)

    confirmed: set = set()

    def on_confirm(ch, frame):
        m = frame.method
        events.append(("ack" if isinstance(m, pika.spec.Basic.Ack) else "nack", m.delivery_tag, m.multiple))
        confirmed.update(range(1, m.delivery_tag + 1) if m.multiple else (m.delivery_tag,))
        # Once all four are confirmed: RabbitMQ may confirm 4 (unroutable, at once) before 1
        # and 3 (when their queue has them), most often on a busy machine.
        if confirmed >= {1, 2, 3, 4}:
            ch.connection.close()

    conn = pika.SelectConnection(broker.pika_params(), on_open_callback=on_open)
    conn.ioloop.call_later(5, conn.ioloop.stop)
    conn.add_on_close_callback(lambda *a: conn.ioloop.stop())
    conn.ioloop.start()
    returns = [e for e in events if e[0] == "return"]
    assert returns == [("return", b"2"), ("return", b"4")]
    # RabbitMQ may ack out of order (an unroutable message is confirmed at once, a routed one
    # when its queue has it), and with multiple=true an ack covers every earlier tag.
    acked = set()
    for i, e in enumerate(events):
        if e[0] == "ack":
            newly = set(range(1, e[1] + 1)) - acked if e[2] else {e[1]}
            acked |= newly
            for tag, body in ((2, b"2"), (4, b"4")):
                if tag in newly:
                    assert ("return", body) in events[:i], events
    assert acked == {1, 2, 3, 4}
    assert not [e for e in events if e[0] == "nack"]


def test_mandatory_publish_before_select_does_not_shift_numbering(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"before", mandatory=True)
        raw.expect(c.Basic.Return)
        raw.read_content()
        raw.publish(1, "amq.fanout", "", b"before2")
        raw.call(1, c.Confirm.Select())
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"after", mandatory=True)
        raw.expect(c.Basic.Return)
        raw.read_content()
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1


def test_pika_blocking_confirms_and_unroutable(channel, uid):
    q = f"conf-blk-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"ok")  # raises unless acked
    with pytest.raises(pika.exceptions.UnroutableError) as err:
        channel.basic_publish("", f"missing-{uid}", b"lost", mandatory=True)
    assert [m.body for m in err.value.messages] == [b"lost"]
    assert channel.basic_get(q, auto_ack=True)[2] == b"ok"


def test_confirm_select_after_tx_select_is_406(channel):
    channel.tx_select()
    channel_error(channel.confirm_delivery, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_select_after_confirm_select_is_406(channel):
    channel.confirm_delivery()
    channel_error(channel.tx_select, 406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


def test_confirm_select_twice_is_fine(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Confirm.Select())
        raw.call(1, c.Confirm.Select())
        raw.publish(1, "amq.fanout", "", b"x")
        assert raw.expect(c.Basic.Ack).delivery_tag == 1
