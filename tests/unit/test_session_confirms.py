"""Publisher confirms at the session level (tests/integration/test_confirms.py without a socket):
acks batched per read, basic.return before the ack, and persistent messages confirmed only
once the persister's fsync has run."""

import os

import pytest
from pamqp import commands

from .fake_transport import (
    Ack, ChannelClose, Client, ManualFsync, Method, Return, durable_broker,
)

SELECT_OK = Method(1, "Confirm.SelectOk")


@pytest.fixture
def c():
    """Channel 1 in confirm mode, queue "q" declared."""
    client = Client()
    client.open_channel(1)
    client.declare(1, "q")
    assert client.call(1, commands.Confirm.Select()) == [SELECT_OK]
    return client


def test_confirm_select_ok():
    c = Client()
    c.open_channel(1)
    assert c.call(1, commands.Confirm.Select()) == [SELECT_OK]


def test_confirm_select_twice_is_fine(c):
    assert c.call(1, commands.Confirm.Select()) == [SELECT_OK]
    c.publish(1, "amq.fanout", "", b"x")
    assert c.receive() == [Ack(1, 1)]


def test_confirm_select_nowait_has_no_reply():
    c = Client()
    c.open_channel(1)
    c.send(1, commands.Confirm.Select(nowait=True))
    assert c.receive() == []
    c.publish(1, "amq.direct", "nobody", b"x")
    assert c.receive() == [Ack(1, 1)]


def test_one_publish_one_ack(c):
    c.publish(1, "", "q", b"a")
    assert c.receive() == [Ack(1, 1)]
    c.publish(1, "", "q", b"b")
    assert c.receive() == [Ack(1, 2)]


def test_publishes_in_one_read_are_acked_with_one_multiple_ack(c):
    writes = c.transport.write_count
    with c.batch():
        for body in (b"a", b"b", b"c"):
            c.publish(1, "", "q", body)
    assert c.receive() == [Ack(1, 3, multiple=True)]
    assert c.transport.write_count == writes + 1
    c.publish(1, "", "q", b"d")
    assert c.receive() == [Ack(1, 4)]
    assert c.drain(1) == [(b"a", False), (b"b", False), (b"c", False), (b"d", False)]


def test_confirm_tags_count_per_channel(c):
    c.open_channel(2)
    assert c.call(2, commands.Confirm.Select()) == [Method(2, "Confirm.SelectOk")]
    c.publish(1, "amq.fanout", "x", b"a")
    assert c.receive() == [Ack(1, 1)]
    c.publish(2, "amq.fanout", "x", b"b")
    assert c.receive() == [Ack(2, 1)]
    c.publish(1, "amq.fanout", "x", b"c")
    assert c.receive() == [Ack(1, 2)]


def test_unroutable_not_mandatory_is_acked_without_return(c):
    c.publish(1, "amq.direct", "nobody", b"x")
    assert c.receive() == [Ack(1, 1)]


def test_unroutable_mandatory_is_returned_before_the_ack(c):
    c.publish(1, "amq.direct", "nobody", b"lost", mandatory=True,
              properties=commands.Basic.Properties(message_id="m1"))
    got = c.receive()
    assert got == [Return(1, 312, "NO_ROUTE", "amq.direct", "nobody", b"lost"), Ack(1, 1)]
    assert got[0].properties.message_id == "m1"


def test_returns_of_a_read_all_come_before_its_ack(c):
    with c.batch():
        c.publish(1, "", "q", b"1")
        c.publish(1, "", "missing", b"2", mandatory=True)
        c.publish(1, "", "q", b"3", mandatory=True)
        c.publish(1, "", "missing", b"4", mandatory=True)
    assert c.receive() == [Return(1, 312, "NO_ROUTE", "", "missing", b"2"),
                           Return(1, 312, "NO_ROUTE", "", "missing", b"4"),
                           Ack(1, 4, multiple=True)]


def test_publishes_before_select_do_not_shift_numbering():
    c = Client()
    c.open_channel(1)
    c.publish(1, "amq.direct", "nobody", b"before", mandatory=True)
    assert c.receive() == [Return(1, 312, "NO_ROUTE", "amq.direct", "nobody", b"before")]
    c.publish(1, "amq.fanout", "", b"before2")
    assert c.call(1, commands.Confirm.Select()) == [SELECT_OK]
    c.publish(1, "amq.direct", "nobody", b"after", mandatory=True)
    assert c.receive() == [Return(1, 312, "NO_ROUTE", "amq.direct", "nobody", b"after"), Ack(1, 1)]


def test_publish_to_a_missing_exchange_closes_the_channel_404(c):
    c.publish(1, "missing", "q", b"x")
    assert c.receive() == [ChannelClose(1, 404, "NOT_FOUND - no exchange 'missing' in vhost '/'", 60, 40)]


# ------------------------------------------------------- persistent messages


def durable_client(broker):
    client = Client(broker)
    client.open_channel(1)
    client.declare(1, "dq", durable=True)
    assert client.call(1, commands.Confirm.Select()) == [SELECT_OK]
    return client


class FsyncSpy:
    """Records, for each os.fsync, how many writes `client`'s transport had seen by then."""

    def __init__(self):
        self.client = None
        self.calls: list = []


@pytest.fixture
def spy(monkeypatch):
    spy = FsyncSpy()
    real = os.fsync

    def fsync(fd):
        spy.calls.append(spy.client.transport.write_count if spy.client else None)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return spy


def test_persistent_message_to_durable_queue_is_acked_after_its_fsync(tmp_path, spy):
    c = spy.client = durable_client(durable_broker(tmp_path))  # fsyncs run inline
    spy.calls.clear()  # the definitions journal's fsyncs (the durable queue's declare)
    writes = c.transport.write_count
    c.publish(1, "", "dq", b"p", persistent=True)
    # The message's file was fsynced before the write that carries the ack.
    assert spy.calls == [writes]
    assert c.receive() == [Ack(1, 1)]
    assert c.transport.write_count == writes + 1


def test_transient_message_to_durable_queue_needs_no_fsync(tmp_path, spy):
    c = durable_client(durable_broker(tmp_path))
    spy.calls.clear()
    c.publish(1, "", "dq", b"t")
    assert c.receive() == [Ack(1, 1)]
    assert spy.calls == []


def test_persistent_message_to_transient_queue_needs_no_fsync(tmp_path, spy):
    c = durable_client(durable_broker(tmp_path))
    c.declare(1, "tq")
    spy.calls.clear()
    c.publish(1, "", "tq", b"p", persistent=True)
    assert c.receive() == [Ack(1, 1)]
    assert spy.calls == []


def test_the_ack_waits_for_a_slow_fsync(tmp_path):
    fsync = ManualFsync()
    c = durable_client(durable_broker(tmp_path, run_in_thread=fsync))
    c.publish(1, "", "dq", b"p", persistent=True)
    assert c.receive() == []
    assert len(fsync.jobs) == 1 and c.transport.scheduled == []
    fsync.finish()
    # The fsync's completion asks for a flush; the ack goes out when the loop runs it.
    assert c.receive() == []
    assert c.tick() == [Ack(1, 1)]


def test_transient_publishes_are_not_held_behind_a_pending_fsync(tmp_path):
    fsync = ManualFsync()
    c = durable_client(durable_broker(tmp_path, run_in_thread=fsync))
    c.declare(1, "tq")
    c.publish(1, "", "tq", b"t1")
    assert c.receive() == [Ack(1, 1)]
    c.publish(1, "", "dq", b"p", persistent=True)
    c.publish(1, "", "tq", b"t2")
    # Confirms go out in order: 3 waits for 2, which waits for its fsync.
    assert c.receive() == []
    fsync.finish()
    assert c.tick() == [Ack(1, 3, multiple=True)]


def test_each_publish_waits_for_the_fsync_of_its_own_batch(tmp_path):
    fsync = ManualFsync()
    c = durable_client(durable_broker(tmp_path, run_in_thread=fsync))
    c.publish(1, "", "dq", b"p1", persistent=True)  # starts fsync 1
    c.publish(1, "", "dq", b"p2", persistent=True)  # joins the next batch: fsync 1 is running
    assert c.receive() == [] and len(fsync.jobs) == 1
    fsync.finish()  # covers p1 only; starts fsync 2 for p2
    assert c.tick() == [Ack(1, 1)]
    assert len(fsync.jobs) == 1
    fsync.finish()
    assert c.tick() == [Ack(1, 2)]


def test_a_group_commit_confirms_everything_it_covered_in_one_ack(tmp_path):
    fsync = ManualFsync()
    c = durable_client(durable_broker(tmp_path, run_in_thread=fsync))
    c.publish(1, "", "dq", b"p1", persistent=True)  # fsync 1 starts
    with c.batch():
        for i in range(2, 5):
            c.publish(1, "", "dq", b"p%d" % i, persistent=True)  # all join batch 2
    fsync.finish()
    assert c.tick() == [Ack(1, 1)]
    fsync.finish()
    assert c.tick() == [Ack(1, 4, multiple=True)]


def test_a_failed_fsync_nacks_the_publish(tmp_path):
    fsync = ManualFsync()
    c = durable_client(durable_broker(tmp_path, run_in_thread=fsync))
    c.publish(1, "", "dq", b"p", persistent=True)
    fsync.finish(error="EIO")
    # (RabbitMQ's requeue bit on a publisher nack is not checked here.)
    assert [f[:4] for f in c.tick()] == [(1, "Basic.Nack", 1, False)]


def test_tx_commit_of_a_persistent_message_fsyncs_before_commit_ok(tmp_path, spy):
    c = spy.client = Client(durable_broker(tmp_path))
    c.open_channel(1)
    c.declare(1, "dq", durable=True)
    assert c.call(1, commands.Tx.Select()) == [Method(1, "Tx.SelectOk")]
    spy.calls.clear()  # the definitions journal's fsyncs (the durable queue's declare)
    c.publish(1, "", "dq", b"p", persistent=True)
    assert spy.calls == []
    writes = c.transport.write_count
    assert c.call(1, commands.Tx.Commit()) == [Method(1, "Tx.CommitOk")]
    assert spy.calls and all(w == writes for w in spy.calls)
