"""Message content: bodies split across frames, empty bodies, every basic property, user_id
and expiration checks, and the maximum message size."""

import datetime
import decimal
import os

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands as c
from pamqp import frame as pframe
from pamqp import header as pheader

from conftest import channel_error
from rawamqp import connect


def consume_one(connection, channel, q):
    """One message taken by a consumer (prefetch 1, acked), leaving the rest in the queue."""
    got = []
    channel.basic_qos(prefetch_count=1)
    tag = channel.basic_consume(q, lambda _c, m, p, b: got.append((m, p, b)))
    while not got:
        connection.process_data_events(time_limit=1)
    channel.basic_cancel(tag)
    channel.basic_ack(got[0][0].delivery_tag)
    assert len(got) == 1
    return got[0]


# ------------------------------------------------------------------ bodies


@pytest.mark.parametrize("frame_max", [None, 4096], ids=["default-frame-max", "frame-max-4096"])
def test_large_bodies_are_reassembled(broker, uid, frame_max):
    kw = {} if frame_max is None else {"frame_max": frame_max}
    conn = pika.BlockingConnection(broker.pika_params(**kw))
    try:
        ch = conn.channel()
        q = f"big-{uid}"
        ch.queue_declare(q, exclusive=True)
        ch.confirm_delivery()
        big, medium = os.urandom(1 << 20), os.urandom(300 * 1024)
        ch.basic_publish("", q, big)
        ch.basic_publish("", q, medium)
        exact = big[:(frame_max or 131072) - 8]  # exactly one full body frame
        ch.basic_publish("", q, exact)
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert body == big
        _, _, body = consume_one(conn, ch, q)
        assert body == medium
        assert ch.basic_get(q, auto_ack=True)[2] == exact
    finally:
        conn.close()


def test_body_frames_of_any_size_are_reassembled(broker, uid):
    q = f"frames-{uid}"
    payload = os.urandom(10000)
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        data = pframe.marshal(c.Basic.Publish(exchange="", routing_key=q), 1)
        data += pframe.marshal(pheader.ContentHeader(0, len(payload), c.Basic.Properties()), 1)
        for start, end in ((0, 1), (1, 4000), (4000, 4001), (4001, 10000)):
            data += pframe.marshal(pbody.ContentBody(payload[start:end]), 1)
        raw.send(data)
        raw.call(1, c.Basic.Get(queue=q, no_ack=True), c.Basic.GetOk)
        header, body = raw.read_content()
        assert header.body_size == len(payload) and body == payload


def test_small_frame_max_splits_deliveries(broker, uid):
    q = f"split-{uid}"
    payload = os.urandom(10000)
    with connect(broker, frame_max=4096) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.publish(1, "", q, payload)
        raw.call(1, c.Basic.Get(queue=q, no_ack=True), c.Basic.GetOk)
        raw.expect(pheader.ContentHeader)
        sizes = []
        while sum(sizes) < len(payload):
            sizes.append(len(raw.expect(pbody.ContentBody).value))
        assert sizes == [4088, 4088, 1824]  # frame_max minus the 8 bytes of frame overhead


def test_zero_length_body(connection, channel, uid):
    q = f"empty-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"", pika.BasicProperties(message_id="e1"))
    channel.basic_publish("", q, b"")
    method, props, body = channel.basic_get(q, auto_ack=True)
    assert (body, props.message_id) == (b"", "e1")
    _, _, body = consume_one(connection, channel, q)
    assert body == b""


def test_zero_length_body_has_no_body_frame(broker, uid):
    q = f"empty2-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.publish(1, "", q, b"")
        raw.send_method(1, c.Basic.Get(queue=q, no_ack=True))
        frames = raw.frames_until_quiet(0.3)
        assert [type(f) for f in frames] == [c.Basic.GetOk, pheader.ContentHeader]
        assert frames[1].body_size == 0


# -------------------------------------------------------------- properties


HEADERS = {
    "str": "text",
    "unicode": "h\u00e9llo \u2603",
    "int": 42,
    "negative": -7,
    "big": 2**40,
    "bool": True,
    "false": False,
    "none": None,
    "binary": b"\xff\x00\xfe",
    "decimal": decimal.Decimal("3.14"),
    "when": datetime.datetime(2021, 6, 1, 12, 30, 45, tzinfo=datetime.timezone.utc),
    "nested": {"a": 1, "deeper": {"b": [1, "two", {"c": True}]}},
    "list": [1, "x", [2, 3], {"k": "v"}, False],
    "empty-table": {},
    "empty-list": [],
}


def full_properties(user="guest"):
    return pika.BasicProperties(
        content_type="application/json", content_encoding="gzip", headers=HEADERS, delivery_mode=2,
        priority=7, correlation_id="corr-1", reply_to="reply-queue", expiration="60000",
        message_id="msg-1", timestamp=1700000000, type="order.created", user_id=user, app_id="tests")


def assert_full_properties(props):
    expected = full_properties()
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(props, name) == getattr(expected, name), name
    assert props.headers == HEADERS


def test_all_properties_round_trip(connection, channel, uid):
    q = f"props-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"body", full_properties())
    channel.basic_publish("", q, b"body", full_properties())
    method, props, body = channel.basic_get(q, auto_ack=True)
    assert body == b"body"
    assert_full_properties(props)
    _, props, _ = consume_one(connection, channel, q)
    assert_full_properties(props)


def test_properties_survive_fanout_and_return(connection, channel, uid):
    qs = [f"propsf-{uid}-{i}" for i in range(2)]
    for q in qs:
        channel.queue_declare(q, exclusive=True)
        channel.queue_bind(q, "amq.fanout")
    channel.confirm_delivery()
    try:
        channel.basic_publish("amq.fanout", "", b"fan", full_properties())
        for q in qs:
            assert_full_properties(channel.basic_get(q, auto_ack=True)[1])
    finally:
        for q in qs:
            channel.queue_unbind(q, "amq.fanout")
    with pytest.raises(pika.exceptions.UnroutableError) as err:
        channel.basic_publish("amq.direct", f"nobody-{uid}", b"back", full_properties(), mandatory=True)
    returned = err.value.messages[0]
    assert returned.body == b"back"
    assert_full_properties(returned.properties)


def test_no_properties_at_all(connection, channel, uid):
    q = f"noprops-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"bare")
    method, props, body = channel.basic_get(q, auto_ack=True)
    assert body == b"bare"
    assert (props.headers, props.content_type, props.delivery_mode, props.user_id) == (None, None, None, None)


def test_user_id_must_match_the_login(channel, uid):
    channel_error(lambda: (channel.basic_publish("amq.fanout", "", b"x", pika.BasicProperties(user_id="bob")),
                           channel.queue_declare("", exclusive=True)), 406,
                  "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user was 'guest'")


def test_user_id_error_names_basic_publish(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, "amq.fanout", "", b"x", properties=c.Basic.Properties(user_id="Guest"))
        raw.expect_channel_close(
            1, 406, "PRECONDITION_FAILED - user_id property set to 'Guest' but authenticated user was 'guest'", 60, 40)


def test_missing_exchange_is_checked_before_user_id(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, f"nox-{uid}", "", b"x", properties=c.Basic.Properties(user_id="bob"))
        raw.expect_channel_close(1, 404, f"NOT_FOUND - no exchange 'nox-{uid}' in vhost '/'")


@pytest.mark.parametrize("expiration, detail", [
    ("abc", "no_integer"),
    (" 5", "no_integer"),
    ("-1", "{value_negative,-1}"),
    ("1.5", '{leftover_string,".5"}'),
    ("99999999999999", "{value_too_large,99999999999999}"),
])
def test_invalid_expiration_is_406(broker, expiration, detail):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, "amq.fanout", "", b"x", properties=c.Basic.Properties(expiration=expiration))
        raw.expect_channel_close(1, 406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {detail}", 60, 40)


@pytest.mark.parametrize("expiration", ["0", "+5", "315360000000"])
def test_valid_expirations_are_accepted(broker, uid, expiration):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Confirm.Select())
        raw.publish(1, "amq.fanout", "", b"x", properties=c.Basic.Properties(expiration=expiration))
        assert raw.expect(c.Basic.Ack).delivery_tag == 1


# -------------------------------------------------------- max message size


def test_max_message_size_from_config(make_broker, tmp_path):
    config = tmp_path / "warren.conf"
    config.write_text("max_message_size = 1048576\n")
    b = make_broker("--config", str(config))
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        limit = os.urandom(1048576)
        ch.basic_publish("", q, limit)
        assert ch.basic_get(q, auto_ack=True)[2] == limit
        channel_error(lambda: ch.basic_publish("", q, limit + b"!"), 406,
                      "PRECONDITION_FAILED - message size 1048577 is larger than configured max size 1048576")
        # Only the channel is closed.
        ch = conn.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    finally:
        conn.close()


def test_oversized_message_error_on_the_wire(make_broker, tmp_path):
    config = tmp_path / "warren.conf"
    config.write_text("max_message_size = 5000\n")
    b = make_broker("--config", str(config))
    with connect(b, frame_max=4096) as raw:
        raw.open_channel(1)
        raw.publish(1, "amq.fanout", "", os.urandom(9000))
        raw.expect_channel_close(
            1, 406, "PRECONDITION_FAILED - message size 9000 is larger than configured max size 5000", 60, 40)
        # The rest of the oversized content is dropped; the connection carries on.
        raw.open_channel(2)
        raw.call(2, c.Queue.Declare(queue="", exclusive=True))
