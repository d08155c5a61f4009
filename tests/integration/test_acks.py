"""basic.get, ack / nack / reject, recover, and what happens to unacked messages."""

import pika
import pytest
from pamqp import commands as c

from conftest import channel_error, connection_error, drain, drain_redelivered, get_tags, publish_numbered
from rawamqp import connect


@pytest.fixture
def q(channel, uid):
    """An exclusive queue holding messages b"1".. b"5" (published with confirms)."""
    name = f"acks-{uid}"
    channel.queue_declare(name, exclusive=True)
    channel.confirm_delivery()
    publish_numbered(channel, name, range(1, 6))
    return name


def get(channel, q, auto_ack=False):
    method, props, body = channel.basic_get(q, auto_ack=auto_ack)
    return method, body


# -------------------------------------------------------------------- get


def test_get_reports_remaining_ready_count(channel, q):
    counts = []
    for expected in (b"1", b"2", b"3", b"4", b"5"):
        method, body = get(channel, q)
        assert body == expected and not method.redelivered
        assert method.exchange == "" and method.routing_key == q
        counts.append(method.message_count)
    assert counts == [4, 3, 2, 1, 0]
    assert channel.basic_get(q) == (None, None, None)


def test_get_empty_on_raw_connection(broker, uid):
    q = f"gete-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        empty = raw.call(1, c.Basic.Get(queue=q), c.Basic.GetEmpty)
        assert empty.cluster_id == ""


def test_delivery_tags_count_up_per_channel(connection, q):
    ch2 = connection.channel()
    ch1 = connection.channel()
    assert get_tags(ch1, q, 2) == [1, 2]
    assert get(ch2, q)[0].delivery_tag == 1
    ch1.basic_ack(0, multiple=True)
    assert get(ch1, q)[0].delivery_tag == 3  # tags are never reused on a channel


# -------------------------------------------------------------------- ack


def test_ack_single_and_multiple(connection, channel, q):
    tags = get_tags(channel, q, 5)
    channel.basic_ack(tags[1])
    channel.basic_ack(tags[3], multiple=True)  # acks 1, 3 and 4 (2 already acked)
    channel.close()
    # Only message 5 was still unacked: it is requeued when the channel closes.
    assert drain_redelivered(connection.channel(), q) == [(b"5", True)]


def test_ack_multiple_with_tag_zero_acks_everything(connection, channel, q):
    for _ in range(5):
        get(channel, q)
    channel.basic_ack(0, multiple=True)
    channel.basic_ack(0, multiple=True)  # nothing outstanding: still fine
    channel.close()
    assert drain_redelivered(connection.channel(), q) == []


def test_ack_tag_zero_without_multiple_is_406(channel, q):
    get(channel, q)
    channel_error(lambda: (channel.basic_ack(0), channel.basic_get(q)), 406,
                  "PRECONDITION_FAILED - unknown delivery tag 0")


def test_unknown_delivery_tag_is_406(channel, q):
    get(channel, q)
    channel_error(lambda: (channel.basic_ack(7), channel.basic_get(q)), 406,
                  "PRECONDITION_FAILED - unknown delivery tag 7")


def test_double_ack_is_406(connection, channel, q):
    tag = get(channel, q)[0].delivery_tag
    channel.basic_ack(tag)
    channel_error(lambda: (channel.basic_ack(tag), channel.basic_get(q)), 406,
                  f"PRECONDITION_FAILED - unknown delivery tag {tag}")


def test_ack_error_names_the_ack_method(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.send_method(1, c.Basic.Ack(delivery_tag=3))
        raw.expect_channel_close(1, 406, "PRECONDITION_FAILED - unknown delivery tag 3", 60, 80)
        raw.open_channel(2)
        raw.send_method(2, c.Basic.Reject(delivery_tag=4))
        raw.expect_channel_close(2, 406, "PRECONDITION_FAILED - unknown delivery tag 4", 60, 90)
        raw.open_channel(3)
        raw.send_method(3, c.Basic.Nack(delivery_tag=5, multiple=True))
        raw.expect_channel_close(3, 406, "PRECONDITION_FAILED - unknown delivery tag 5", 60, 120)


def test_ack_multiple_with_an_already_acked_tag_is_406_and_acks_nothing(connection, channel, q):
    tags = get_tags(channel, q, 3)
    channel.basic_ack(tags[1])
    channel_error(lambda: (channel.basic_ack(tags[1], multiple=True), channel.basic_get(q)), 406,
                  f"PRECONDITION_FAILED - unknown delivery tag {tags[1]}")
    # The failed multiple ack settled nothing: 1 and 3 come back.
    assert drain(connection.channel(), q) == [b"1", b"3", b"4", b"5"]


# ------------------------------------------------------------ nack, reject


def test_nack_requeue_restores_original_positions(channel, q):
    tags = {body: m.delivery_tag for m, body in (get(channel, q) for _ in range(5))}
    channel.basic_nack(tags[b"2"], requeue=True)
    channel.basic_nack(tags[b"4"], requeue=True)
    m, body = get(channel, q)
    assert (body, m.redelivered, m.message_count) == (b"2", True, 1)
    m, body = get(channel, q)
    assert (body, m.redelivered, m.message_count) == (b"4", True, 0)
    assert channel.basic_get(q) == (None, None, None)


def test_requeued_messages_go_before_newer_ones(channel, q):
    tags = get_tags(channel, q, 3)  # 1, 2, 3 unacked; 4, 5 ready
    channel.basic_reject(tags[2], requeue=True)
    channel.basic_reject(tags[0], requeue=True)
    assert drain_redelivered(channel, q) == [(b"1", True), (b"3", True), (b"4", False), (b"5", False)]


def test_nack_multiple_requeue(channel, q):
    tags = get_tags(channel, q, 4)
    channel.basic_nack(tags[2], multiple=True, requeue=True)  # 1, 2, 3
    assert drain_redelivered(channel, q) == [(b"1", True), (b"2", True), (b"3", True), (b"5", False)]
    channel.basic_nack(0, multiple=True, requeue=True)  # 4, still unacked
    assert drain_redelivered(channel, q) == [(b"4", True)]


def test_nack_and_reject_without_requeue_drop(connection, channel, q):
    tags = get_tags(channel, q, 4)
    channel.basic_reject(tags[0], requeue=False)
    channel.basic_nack(tags[2], multiple=True, requeue=False)  # 2 and 3
    channel.basic_nack(0, multiple=True, requeue=False)  # 4
    channel.close()
    assert drain_redelivered(connection.channel(), q) == [(b"5", False)]


def test_redelivered_flag_on_consume_after_requeue(connection, channel, q):
    m, body = get(channel, q)
    channel.basic_reject(m.delivery_tag, requeue=True)
    got = []
    ch = connection.channel()
    ch.basic_consume(q, lambda _c, m, p, b: got.append((b, m.redelivered)), auto_ack=True)
    while len(got) < 5:
        connection.process_data_events(time_limit=1)
    assert got == [(b"1", True), (b"2", False), (b"3", False), (b"4", False), (b"5", False)]


# ---------------------------------------------------------------- recover


def test_recover_requeue_redelivers(connection, q):
    ch = connection.channel()
    got = []
    ch.basic_consume(q, lambda _c, m, p, b: got.append((b, m.redelivered, m.delivery_tag)))
    while len(got) < 5:
        connection.process_data_events(time_limit=1)
    assert [g[1] for g in got] == [False] * 5
    ch.basic_ack(got[0][2])
    ch.basic_recover(requeue=True)
    while len(got) < 9:
        connection.process_data_events(time_limit=1)
    assert [(b, r) for b, r, _ in got[5:]] == [(b"2", True), (b"3", True), (b"4", True), (b"5", True)]
    # New delivery tags after recover; the old ones are gone.
    assert [t for _, _, t in got[5:]] == [6, 7, 8, 9]
    ch.basic_ack(9, multiple=True)
    ch.close()
    assert drain_redelivered(connection.channel(), q) == []


def test_recover_requeue_false_is_not_implemented(channel, q):
    get(channel, q)
    connection_error(lambda: channel.basic_recover(requeue=False), 540, "NOT_IMPLEMENTED - requeue=false")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pamqp: recover-async is deprecated
def test_recover_async(broker, uid):
    q = f"reca-{uid}"
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.publish(1, "", q, b"m")
        assert raw.call(1, c.Basic.Get(queue=q), c.Basic.GetOk).delivery_tag == 1
        raw.read_content()
        raw.send_method(1, c.Basic.RecoverAsync(requeue=True))
        ok = raw.call(1, c.Basic.Get(queue=q), c.Basic.GetOk)
        assert (ok.delivery_tag, ok.redelivered) == (2, True)
        raw.read_content()
        raw.send_method(1, c.Basic.RecoverAsync(requeue=False))
        raw.expect_connection_close(540, "NOT_IMPLEMENTED - requeue=false")


# --------------------------------------------------- unacked on close


def test_unacked_requeued_when_channel_closes(connection, channel, q):
    for _ in range(3):
        get(channel, q)
    channel.close()
    assert drain_redelivered(connection.channel(), q) == [(b"1", True), (b"2", True), (b"3", True),
                                                          (b"4", False), (b"5", False)]


def test_unacked_requeued_when_connection_closes(broker, channel, uid):
    name = f"acks-conn-{uid}"
    channel.queue_declare(name, auto_delete=False)
    try:
        channel.confirm_delivery()
        for i in range(1, 4):
            channel.basic_publish("", name, str(i).encode())
        conn = pika.BlockingConnection(broker.pika_params())
        ch = conn.channel()
        got = []
        ch.basic_consume(name, lambda _c, m, p, b: got.append(b))
        while len(got) < 3:
            conn.process_data_events(time_limit=1)
        conn.close()
        assert drain_redelivered(channel, name) == [(b"1", True), (b"2", True), (b"3", True)]
    finally:
        channel.queue_delete(name)


def test_no_ack_get_is_not_requeued(connection, channel, q):
    assert get(channel, q, auto_ack=True)[1] == b"1"
    channel.close()
    assert drain(connection.channel(), q) == [b"2", b"3", b"4", b"5"]


# ---------------------------------------------------------------- publish


def test_immediate_publish_is_not_implemented(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, "", f"x-{uid}", b"x", immediate=True)
        raw.expect_connection_close(540, "NOT_IMPLEMENTED - immediate=true", 60, 40)
