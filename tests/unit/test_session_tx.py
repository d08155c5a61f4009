"""Transactions at the session level (tests/integration/test_tx.py without a socket): tx.select,
commit and rollback of publishes, acks, nacks and rejects, with RabbitMQ 3.10's errors."""

import pytest
from pamqp import commands

from .fake_transport import ChannelClose, Client, ConsumeOk, Deliver, Method, Return

SELECT_OK, COMMIT_OK, ROLLBACK_OK = Method(1, "Tx.SelectOk"), Method(1, "Tx.CommitOk"), Method(1, "Tx.RollbackOk")


@pytest.fixture
def c():
    """Channel 1 (the transactional one) and channel 2 (an observer) open, queue "q" empty."""
    client = Client()
    client.open_channel(1)
    client.open_channel(2)
    client.declare(2, "q")
    return client


def select(c):
    assert c.call(1, commands.Tx.Select()) == [SELECT_OK]


def commit(c):
    assert c.call(1, commands.Tx.Commit()) == [COMMIT_OK]


def rollback(c):
    assert c.call(1, commands.Tx.Rollback()) == [ROLLBACK_OK]


def holding(c, n):
    """Queue b"1".. b"n", take them all with basic.get on transactional channel 1: the tags."""
    c.fill(2, "q", [str(i).encode() for i in range(1, n + 1)])
    select(c)
    return c.get_tags(1, n)


def test_select_ok():
    c = Client()
    c.open_channel(1)
    assert c.call(1, commands.Tx.Select()) == [SELECT_OK]


def test_publishes_take_effect_at_commit(c):
    select(c)
    c.publish(1, "", "q", b"a")
    c.publish(1, "", "q", b"b")
    assert c.receive() == []
    assert c.drain(2) == []
    commit(c)
    assert c.drain(2) == [(b"a", False), (b"b", False)]
    # Still transactional after a commit.
    c.publish(1, "", "q", b"c")
    assert c.drain(2) == []
    commit(c)
    assert c.drain(2) == [(b"c", False)]


def test_a_consumer_gets_the_publishes_when_they_are_committed(c):
    consumer = Client(c.broker)
    consumer.open_channel(1)
    consumer.consume(1, "ctag", no_ack=True)
    assert consumer.receive() == [ConsumeOk(1, "ctag")]
    select(c)
    c.publish(1, "", "q", b"a")
    assert consumer.tick() == []
    commit(c)
    assert consumer.tick() == [Deliver(1, "ctag", 1, b"a")]


def test_rollback_discards_publishes(c):
    select(c)
    c.publish(1, "", "q", b"a")
    rollback(c)
    commit(c)
    assert c.drain(2) == []
    c.publish(1, "", "q", b"b")
    commit(c)
    assert c.drain(2) == [(b"b", False)]


def test_acks_take_effect_at_commit(c):
    tags = holding(c, 3)
    c.ack(1, tags[0])
    c.ack(1, tags[2])
    assert c.receive() == []
    commit(c)
    c.close_channel(1)
    # Only the unacked message 2 comes back.
    assert c.drain(2) == [(b"2", True)]


def test_uncommitted_acks_are_lost_when_the_channel_closes(c):
    tags = holding(c, 2)
    c.ack(1, tags[1], multiple=True)
    c.close_channel(1)
    assert c.drain(2) == [(b"1", True), (b"2", True)]


def test_rollback_undoes_acks(c):
    tags = holding(c, 3)
    c.ack(1, tags[1], multiple=True)
    rollback(c)
    # Unacked again, so they can be acked again (a second ack is no "unknown tag").
    c.ack(1, tags[0])
    c.ack(1, tags[1])
    commit(c)
    c.close_channel(1)
    assert c.drain(2) == [(b"3", True)]


def test_ack_twice_in_one_transaction_is_406(c):
    [tag] = holding(c, 1)
    c.ack(1, tag)
    c.ack(1, tag)
    assert c.receive() == [ChannelClose(1, 406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", 60, 80)]


def test_reject_and_nack_take_effect_at_commit(c):
    tags = holding(c, 4)
    c.reject(1, tags[0], requeue=True)
    c.nack(1, tags[2], multiple=True, requeue=False)  # 2 and 3: dropped
    assert c.drain(2) == []  # nothing requeued yet
    commit(c)
    assert c.drain(2) == [(b"1", True)]
    c.close_channel(1)
    assert c.drain(2) == [(b"4", True)]


def test_rollback_undoes_rejects(c):
    tags = holding(c, 2)
    c.reject(1, tags[0], requeue=False)
    c.nack(1, tags[1], requeue=True)
    rollback(c)
    commit(c)
    assert c.drain(2) == []
    c.ack(1, tags[0])
    commit(c)
    c.close_channel(1)
    assert c.drain(2) == [(b"2", True)]


def test_publish_and_ack_in_one_transaction(c):
    [tag] = holding(c, 1)
    c.publish(1, "", "q", b"reply")
    c.ack(1, tag)
    commit(c)
    c.close_channel(1)
    assert c.drain(2) == [(b"reply", False)]


def test_commit_without_select_is_406(c):
    assert c.call(1, commands.Tx.Commit()) == [
        ChannelClose(1, 406, "PRECONDITION_FAILED - channel is not transactional", 90, 20)]


def test_rollback_without_select_is_406(c):
    assert c.call(1, commands.Tx.Rollback()) == [
        ChannelClose(1, 406, "PRECONDITION_FAILED - channel is not transactional", 90, 30)]


def test_tx_select_twice_is_fine(c):
    select(c)
    select(c)
    c.publish(1, "", "q", b"x")
    commit(c)
    assert c.drain(2) == [(b"x", False)]


def test_confirm_select_after_tx_select_is_406(c):
    select(c)
    assert c.call(1, commands.Confirm.Select()) == [
        ChannelClose(1, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)]


def test_tx_select_after_confirm_select_is_406(c):
    assert c.call(1, commands.Confirm.Select()) == [Method(1, "Confirm.SelectOk")]
    assert c.call(1, commands.Tx.Select()) == [
        ChannelClose(1, 406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode", 90, 10)]


def test_unroutable_mandatory_in_tx_is_returned_at_commit(c):
    select(c)
    c.publish(1, "amq.direct", "nobody", b"lost", mandatory=True)
    assert c.receive() == []
    assert c.call(1, commands.Tx.Commit()) == [Return(1, 312, "NO_ROUTE", "amq.direct", "nobody", b"lost"),
                                               COMMIT_OK]


def test_rollback_drops_pending_returns(c):
    select(c)
    c.publish(1, "amq.direct", "nobody", b"lost", mandatory=True)
    rollback(c)
    commit(c)


def test_uncommitted_publishes_are_dropped_when_the_channel_closes(c):
    select(c)
    c.publish(1, "", "q", b"a")
    c.close_channel(1)
    assert c.drain(2) == []
