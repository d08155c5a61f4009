"""Transactions: tx.select / commit / rollback for publishes, acks, nacks and rejects."""

import pytest
from pamqp import commands as c

from conftest import channel_error, drain_redelivered, get_tags, publish_numbered
from rawamqp import connect


@pytest.fixture
def q(connection, uid):
    """An exclusive queue, declared on its own channel."""
    name = f"tx-{uid}"
    connection.channel().queue_declare(name, exclusive=True)
    return name


@pytest.fixture
def observer(connection):
    """A separate channel to look at the queue with."""
    return connection.channel()


def tx_holding(connection, observer, q, n):
    """Put messages b"1".. b"n" in the queue, then take them all with basic.get on a new
    transactional channel: returns that channel and the (unacked) delivery tags."""
    observer.confirm_delivery()
    publish_numbered(observer, q, range(1, n + 1))
    ch = connection.channel()
    ch.tx_select()
    return ch, get_tags(ch, q, n)


def test_publishes_take_effect_at_commit(channel, observer, q):
    channel.tx_select()
    channel.basic_publish("", q, b"a")
    channel.basic_publish("", q, b"b")
    assert observer.basic_get(q) == (None, None, None)
    channel.tx_commit()
    assert drain_redelivered(observer, q) == [(b"a", False), (b"b", False)]
    # Still transactional after a commit.
    channel.basic_publish("", q, b"c")
    assert observer.basic_get(q) == (None, None, None)
    channel.tx_commit()
    assert drain_redelivered(observer, q) == [(b"c", False)]


def test_rollback_discards_publishes(channel, observer, q):
    channel.tx_select()
    channel.basic_publish("", q, b"a")
    channel.tx_rollback()
    channel.tx_commit()
    assert observer.basic_get(q) == (None, None, None)
    channel.basic_publish("", q, b"b")
    channel.tx_commit()
    assert drain_redelivered(observer, q) == [(b"b", False)]


def test_acks_take_effect_at_commit(connection, observer, q):
    ch, tags = tx_holding(connection, observer, q, 3)
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[2])
    ch.tx_commit()
    ch.close()
    # Only the unacked message 2 comes back.
    assert drain_redelivered(observer, q) == [(b"2", True)]


def test_uncommitted_acks_are_lost_when_the_channel_closes(connection, observer, q):
    ch, tags = tx_holding(connection, observer, q, 2)
    ch.basic_ack(tags[1], multiple=True)
    ch.close()
    assert drain_redelivered(observer, q) == [(b"1", True), (b"2", True)]


def test_rollback_undoes_acks(connection, observer, q):
    ch, tags = tx_holding(connection, observer, q, 3)
    ch.basic_ack(tags[1], multiple=True)
    ch.tx_rollback()
    # The messages are unacked again and can be acked again (a second ack is no "unknown tag").
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[1])
    ch.tx_commit()
    ch.close()
    assert drain_redelivered(observer, q) == [(b"3", True)]


def test_ack_twice_in_one_transaction_is_406(connection, q, observer):
    ch, [tag] = tx_holding(connection, observer, q, 1)
    ch.basic_ack(tag)
    channel_error(lambda: (ch.basic_ack(tag), ch.tx_commit()), 406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")


def test_reject_and_nack_take_effect_at_commit(connection, observer, q):
    ch, tags = tx_holding(connection, observer, q, 4)
    ch.basic_reject(tags[0], requeue=True)
    ch.basic_nack(tags[2], multiple=True, requeue=False)  # 2 and 3: dropped
    assert observer.basic_get(q) == (None, None, None)  # nothing requeued yet
    ch.tx_commit()
    assert drain_redelivered(observer, q) == [(b"1", True)]
    ch.close()
    assert drain_redelivered(observer, q) == [(b"4", True)]


def test_rollback_undoes_rejects(connection, observer, q):
    ch, tags = tx_holding(connection, observer, q, 2)
    ch.basic_reject(tags[0], requeue=False)
    ch.basic_nack(tags[1], requeue=True)
    ch.tx_rollback()
    ch.tx_commit()
    assert observer.basic_get(q) == (None, None, None)
    ch.basic_ack(tags[0])
    ch.tx_commit()
    ch.close()
    assert drain_redelivered(observer, q) == [(b"2", True)]


def test_publish_and_ack_in_one_transaction(connection, observer, q):
    ch, [tag] = tx_holding(connection, observer, q, 1)
    ch.basic_publish("", q, b"reply")
    ch.basic_ack(tag)
    ch.tx_commit()
    ch.close()
    assert drain_redelivered(observer, q) == [(b"reply", False)]


def test_commit_without_select_is_406(channel):
    channel_error(channel.tx_commit, 406, "PRECONDITION_FAILED - channel is not transactional")


def test_rollback_without_select_is_406(channel):
    channel_error(channel.tx_rollback, 406, "PRECONDITION_FAILED - channel is not transactional")


def test_tx_select_twice_is_fine(channel, observer, q):
    channel.tx_select()
    channel.tx_select()
    channel.basic_publish("", q, b"x")
    channel.tx_commit()
    assert drain_redelivered(observer, q) == [(b"x", False)]


def test_unroutable_mandatory_in_tx_is_returned_at_commit(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Tx.Select())
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"lost", mandatory=True)
        assert raw.frames_until_quiet(0.2) == []
        raw.send_method(1, c.Tx.Commit())
        ret = raw.expect(c.Basic.Return)
        assert (ret.reply_code, ret.reply_text, ret.routing_key) == (312, "NO_ROUTE", f"nobody-{uid}")
        assert raw.read_content()[1] == b"lost"
        raw.expect(c.Tx.CommitOk)


def test_rollback_drops_pending_returns(broker, uid):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Tx.Select())
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"lost", mandatory=True)
        raw.call(1, c.Tx.Rollback())
        raw.call(1, c.Tx.Commit())
        assert raw.frames_until_quiet(0.2) == []
