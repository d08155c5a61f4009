"""basic.get, ack / nack / reject and recover at the session level (tests/integration/test_acks.py
on the wire, without a socket): exact frames for RabbitMQ 3.10's semantics and error texts."""

import pytest
from pamqp import commands

from .fake_transport import (
    ChannelClose, Client, ConnectionClose, ConsumeOk, Deliver, GetEmpty, GetOk, Method,
)


@pytest.fixture
def c():
    """Channel 1 open, queue "q" holding b"1".. b"5"."""
    client = Client()
    client.open_channel(1)
    client.declare(1, "q")
    client.fill(1, "q", [b"1", b"2", b"3", b"4", b"5"])
    return client


def unknown_tag(ch, tag, method_id=80):
    return ChannelClose(ch, 406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", 60, method_id)


# -------------------------------------------------------------------- get


def test_get_reports_remaining_ready_count(c):
    with c.batch():
        for _ in range(6):
            c.get(1)
    assert c.receive() == [GetOk(1, 1, b"1", 4), GetOk(1, 2, b"2", 3), GetOk(1, 3, b"3", 2),
                           GetOk(1, 4, b"4", 1), GetOk(1, 5, b"5", 0), GetEmpty(1)]


def test_delivery_tags_count_up_per_channel_and_are_never_reused(c):
    c.open_channel(2)
    assert c.get_tags(1, 2) == [1, 2]
    assert c.get_tags(2, 1) == [1]
    c.ack(1, 0, multiple=True)
    assert c.get_tags(1, 1) == [3]


# -------------------------------------------------------------------- ack


def test_ack_single_and_multiple(c):
    c.get_tags(1, 5)
    c.ack(1, 2)
    c.ack(1, 4, multiple=True)  # 1, 3 and 4 (2 is already acked)
    assert c.receive() == []
    c.close_channel(1)  # only 5 was unacked: requeued
    c.open_channel(2)
    assert c.drain(2) == [(b"5", True)]


def test_ack_multiple_with_tag_zero_acks_everything(c):
    c.get_tags(1, 5)
    c.ack(1, 0, multiple=True)
    c.ack(1, 0, multiple=True)  # nothing outstanding: still fine
    assert c.receive() == []
    c.close_channel(1)
    c.open_channel(2)
    assert c.drain(2) == []


def test_ack_tag_zero_without_multiple_is_406(c):
    c.get_tags(1, 1)
    c.ack(1, 0)
    assert c.receive() == [unknown_tag(1, 0)]


def test_unknown_delivery_tag_is_406(c):
    c.get_tags(1, 1)
    c.ack(1, 7)
    assert c.receive() == [unknown_tag(1, 7)]


def test_double_ack_is_406(c):
    [tag] = c.get_tags(1, 1)
    c.ack(1, tag)
    assert c.receive() == []
    c.ack(1, tag)
    assert c.receive() == [unknown_tag(1, tag)]


def test_the_close_names_the_failing_method(c):
    c.ack(1, 3)
    assert c.receive() == [unknown_tag(1, 3, 80)]
    c.open_channel(2)
    c.reject(2, 4)
    assert c.receive() == [unknown_tag(2, 4, 90)]
    c.open_channel(3)
    c.nack(3, 5, multiple=True)
    assert c.receive() == [unknown_tag(3, 5, 120)]


def test_ack_multiple_with_an_already_acked_tag_is_406_and_acks_nothing(c):
    tags = c.get_tags(1, 3)
    c.ack(1, tags[1])
    c.ack(1, tags[1], multiple=True)
    assert c.receive() == [unknown_tag(1, tags[1])]
    c.send(1, commands.Channel.CloseOk())
    c.open_channel(2)
    assert c.drain(2) == [(b"1", True), (b"3", True), (b"4", False), (b"5", False)]


def test_ack_of_another_channels_tag_is_406(c):
    c.open_channel(2)
    assert c.get_tags(1, 1) == [1]
    c.ack(2, 1)
    assert c.receive() == [unknown_tag(2, 1)]
    # Channel 1 still holds its delivery and can ack it.
    c.ack(1, 1)
    c.close_channel(1)
    c.open_channel(3)
    assert c.drain(3) == [(b"2", False), (b"3", False), (b"4", False), (b"5", False)]


def test_frames_after_a_channel_error_are_ignored_until_close_ok(c):
    c.ack(1, 9)
    assert c.receive() == [unknown_tag(1, 9)]
    c.get(1)
    c.ack(1, 1)
    assert c.receive() == []
    c.send(1, commands.Channel.CloseOk())
    c.open_channel(1)
    assert c.get_tags(1, 1) == [1]


def test_a_channel_error_requeues_the_channels_unacked_messages(c):
    c.get_tags(1, 2)
    c.ack(1, 9)
    assert c.receive() == [unknown_tag(1, 9)]
    c.open_channel(2)
    assert c.drain(2) == [(b"1", True), (b"2", True), (b"3", False), (b"4", False), (b"5", False)]


# ------------------------------------------------------------ nack, reject


def test_nack_requeue_restores_original_positions(c):
    c.get_tags(1, 5)
    c.nack(1, 2)
    c.nack(1, 4)
    assert c.receive() == []
    with c.batch():
        c.get(1)
        c.get(1)
        c.get(1)
    assert c.receive() == [GetOk(1, 6, b"2", 1, redelivered=True), GetOk(1, 7, b"4", 0, redelivered=True),
                           GetEmpty(1)]


def test_requeued_messages_go_before_newer_ones(c):
    c.get_tags(1, 3)  # 1, 2, 3 unacked; 4, 5 ready
    c.reject(1, 3)
    c.reject(1, 1)
    assert c.drain(1) == [(b"1", True), (b"3", True), (b"4", False), (b"5", False)]


def test_nack_multiple_requeue(c):
    c.get_tags(1, 4)
    c.nack(1, 3, multiple=True)  # 1, 2, 3
    assert c.drain(1) == [(b"1", True), (b"2", True), (b"3", True), (b"5", False)]
    c.nack(1, 0, multiple=True)  # 4, still unacked
    assert c.drain(1) == [(b"4", True)]


def test_nack_and_reject_without_requeue_drop(c):
    c.get_tags(1, 4)
    c.reject(1, 1, requeue=False)
    c.nack(1, 3, multiple=True, requeue=False)  # 2 and 3
    c.nack(1, 0, multiple=True, requeue=False)  # 4
    assert c.receive() == []
    c.close_channel(1)
    c.open_channel(2)
    assert c.drain(2) == [(b"5", False)]


def test_a_requeued_message_is_delivered_first_and_redelivered(c):
    c.get_tags(1, 1)
    c.reject(1, 1)
    c.consume(1, "ctag", no_ack=True)
    assert c.receive() == [ConsumeOk(1, "ctag"), Deliver(1, "ctag", 2, b"1", redelivered=True),
                           Deliver(1, "ctag", 3, b"2"), Deliver(1, "ctag", 4, b"3"),
                           Deliver(1, "ctag", 5, b"4"), Deliver(1, "ctag", 6, b"5")]


def test_a_rejected_delivery_goes_back_to_the_consumer(c):
    c.qos(1, 1)
    c.consume(1, "ctag")
    assert c.receive() == [Method(1, "Basic.QosOk"), ConsumeOk(1, "ctag"), Deliver(1, "ctag", 1, b"1")]
    c.reject(1, 1)
    assert c.receive() == [Deliver(1, "ctag", 2, b"1", redelivered=True)]
    c.ack(1, 2)
    assert c.receive() == [Deliver(1, "ctag", 3, b"2")]


# ---------------------------------------------------------------- recover


def test_recover_requeue_redelivers_with_new_tags(c):
    c.consume(1, "ctag")
    assert c.receive()[1:] == [Deliver(1, "ctag", t, str(t).encode()) for t in range(1, 6)]
    c.ack(1, 1)
    c.send(1, commands.Basic.Recover(requeue=True))
    got = c.receive()
    assert [f for f in got if f[1] != "Basic.RecoverOk"] == [
        Deliver(1, "ctag", 6, b"2", redelivered=True), Deliver(1, "ctag", 7, b"3", redelivered=True),
        Deliver(1, "ctag", 8, b"4", redelivered=True), Deliver(1, "ctag", 9, b"5", redelivered=True)]
    assert got.count(Method(1, "Basic.RecoverOk")) == 1
    c.ack(1, 5)  # the old tags are gone
    assert c.receive() == [unknown_tag(1, 5)]


def test_recover_ok_comes_before_the_redeliveries(c):
    c.consume(1, "ctag")
    c.receive()
    c.send(1, commands.Basic.Recover(requeue=True))
    assert c.receive() == [Method(1, "Basic.RecoverOk")] + [
        Deliver(1, "ctag", 5 + t, str(t).encode(), redelivered=True) for t in range(1, 6)]


def test_recover_requeue_false_is_not_implemented(c):
    c.get_tags(1, 1)
    c.send(1, commands.Basic.Recover(requeue=False))
    assert c.receive() == [ConnectionClose(540, "NOT_IMPLEMENTED - requeue=false", 60, 110)]
    assert c.transport.close_later_calls == [3.0] and not c.transport.closed
    c.send(0, commands.Connection.CloseOk())
    assert c.transport.closed


# --------------------------------------------------- unacked on close


def test_unacked_requeued_when_channel_closes(c):
    c.get_tags(1, 3)
    c.close_channel(1)
    c.open_channel(2)
    assert c.drain(2) == [(b"1", True), (b"2", True), (b"3", True), (b"4", False), (b"5", False)]


def test_unacked_requeued_when_connection_closes(c):
    c.get_tags(1, 2)
    assert c.call(0, commands.Connection.Close(200, "bye", 0, 0)) == [Method(0, "Connection.CloseOk")]
    # The socket is left for the client to close (read and discarded until then, 30 s at most).
    assert not c.transport.closed and c.transport.close_later_calls == [30.0]
    other = Client(c.broker)
    other.open_channel(1)
    assert other.drain(1) == [(b"1", True), (b"2", True), (b"3", False), (b"4", False), (b"5", False)]


def test_unacked_requeued_when_the_socket_drops(c):
    c.get_tags(1, 1)
    c.conn.connection_lost()
    other = Client(c.broker)
    other.open_channel(1)
    assert other.drain(1) == [(b"1", True), (b"2", False), (b"3", False), (b"4", False), (b"5", False)]


def test_no_ack_get_is_not_requeued(c):
    c.get(1, no_ack=True)
    assert c.receive() == [GetOk(1, 1, b"1", 4)]
    c.close_channel(1)
    c.open_channel(2)
    assert c.drain(2) == [(b"2", False), (b"3", False), (b"4", False), (b"5", False)]


def test_ack_of_a_no_ack_get_is_406(c):
    c.get(1, no_ack=True)
    c.ack(1, 1)
    assert c.receive() == [GetOk(1, 1, b"1", 4), unknown_tag(1, 1)]
