"""Big persistent bodies held back (warren.store.persister, RabbitMQ's confirm on ack): a
publish into durable queues with consumers is confirmed once each queue has settled its copy
or fsynced it, and a record settled before its write is never written. The session is driven
with bytes, the fsyncs and the hold timer by the test."""

import os

import pytest
from pamqp import commands

from warren.store import segments as sg
from warren.store.persister import HOLD_MIN, Persister

from .fake_transport import Ack, Client, ManualFsync, ManualScheduler, durable_broker

BIG = b"b" * HOLD_MIN
BIGGER = b"B" * (HOLD_MIN * 2)


def recovered(tmp_path):
    """The queue's store as a restart (after a crash now) would recover it."""
    return Persister(str(tmp_path)).queue_store("/", "dq", True)


def records_on_disk(broker, queue="dq") -> list[tuple[int, bytes]]:
    """(flags, body) of every record written to the queue's segment files, in file order."""
    directory = broker.persister.queue_dir("/", queue)
    out = []
    if not os.path.isdir(directory):
        return out
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".seg")):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        records, _end, problem = sg.scan(data)
        assert problem is None, problem
        out += [(flags, sg.read_record(data, pos).body) for pos, flags, _seq in records]
    return out


class Scene:
    """A durable broker with timers (so it holds), a publisher in confirm mode on channel 1
    and a consumer connection."""

    def __init__(self, tmp_path, queues=("dq",), fsync=None, consume=True, no_ack=False, prefetch=0):
        self.broker = durable_broker(tmp_path, run_in_thread=fsync)
        self.clock = ManualScheduler()
        self.broker.set_scheduler(self.clock)
        self.persister: Persister = self.broker.persister
        self.persister.scheduler = self.clock  # (as the server's listener does)
        self.pub = Client(self.broker)
        self.pub.open_channel(1)
        for q in queues:
            self.pub.declare(1, q, durable=True)
            got = self.pub.call(1, commands.Queue.Bind(queue=q, exchange="amq.fanout"))
            assert got[0][1] == "Queue.BindOk"
        assert self.pub.call(1, commands.Confirm.Select())[0][1] == "Confirm.SelectOk"
        self.con = Client(self.broker)
        self.con.open_channel(1)
        if prefetch:
            self.con.qos(1, prefetch)
            self.con.receive()
        if consume:
            for q in queues:
                self.con.consume(1, f"c-{q}", q, no_ack=no_ack)
                assert self.con.receive()[0][1] == "Basic.ConsumeOk"

    def publish(self, body, exchange="amq.fanout", routing_key="", persistent=True):
        self.pub.publish(1, exchange, routing_key, body, persistent=persistent)

    def deliveries(self) -> list:
        got = self.con.tick()
        assert all(f[1] == "Basic.Deliver" for f in got), got
        return got

    def advance(self, seconds=None):
        self.clock.advance(self.persister.hold_time + 0.01 if seconds is None else seconds)


def test_acked_before_its_write_is_confirmed_and_never_written(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    assert s.pub.tick() == []  # held: no fsync to wait for, no ack yet
    [d] = s.deliveries()
    assert d[-1] == BIG
    s.con.ack(1, d[3])
    assert s.pub.tick() == [Ack(1, 1)]
    s.advance(5)
    assert records_on_disk(s.broker) == []
    assert (s.persister.holds, s.persister.holds_skipped, s.persister.held_bytes) == (1, 1, 0)
    assert s.persister.held == {}


def test_delivered_without_ack_is_written_and_fsynced_before_its_confirm(tmp_path):
    fsync = ManualFsync()
    s = Scene(tmp_path, fsync=fsync)
    s.publish(BIG)
    [d] = s.deliveries()
    assert s.pub.tick() == []
    s.advance(s.persister.hold_time / 2)
    assert records_on_disk(s.broker) == [] and fsync.jobs == []
    s.advance()  # its deadline: written, fsync started
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, BIG)]
    assert s.pub.tick() == []  # not before the fsync
    fsync.finish()
    assert s.pub.tick() == [Ack(1, 1)]
    # A crash now (nothing more written): the message comes back, as delivered before.
    store = recovered(tmp_path)
    qm = store.pop()
    assert qm is not None and qm.message.body == BIG and qm.redelivered and qm.deliveries == 1
    # And the ack that comes later marks the written record settled.
    s.con.ack(1, d[3])
    s.con.receive()
    assert recovered(tmp_path).pop() is None


def test_requeued_is_written_at_once(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    [d] = s.deliveries()
    s.con.nack(1, d[3], requeue=True)
    [again] = s.deliveries()  # redelivered to the same consumer
    assert again[4] is True
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, BIG)]
    assert s.pub.tick() == [Ack(1, 1)]  # (fsyncs run inline here)
    s.con.ack(1, again[3])
    s.con.receive()
    assert recovered(tmp_path).pop() is None


def test_a_consumer_closing_its_channel_gets_its_held_messages_written(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    s.publish(BIGGER)
    assert len(s.deliveries()) == 2
    s.con.close_channel(1)
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, BIG), (sg.FLAG_DURABLE, BIGGER)]
    assert s.pub.tick() == [Ack(1, 2, multiple=True)]
    store = recovered(tmp_path)
    assert [store.pop().message.body, store.pop().message.body] == [BIG, BIGGER]


def test_small_message_behind_a_held_one_writes_it_first(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    s.publish(b"small")  # not held: the queue's records stay in its order
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, BIG), (sg.FLAG_DURABLE, b"small")]
    assert s.pub.tick() == [Ack(1, 2, multiple=True)]
    assert s.persister.holds_skipped == 0


def test_small_messages_are_never_held(tmp_path):
    s = Scene(tmp_path)
    s.publish(b"s" * (HOLD_MIN - 1))
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, b"s" * (HOLD_MIN - 1))]
    assert s.pub.tick() == [Ack(1, 1)]
    assert s.persister.holds == 0


def test_confirms_stay_in_order_behind_a_held_message(tmp_path):
    s = Scene(tmp_path, queues=("dq", "other"), consume=False)
    s.con.consume(1, "c", "dq")
    s.con.receive()
    s.publish(BIG)  # held in dq; "other" has no consumer: written at once
    s.publish(b"t", exchange="", routing_key="nowhere", persistent=False)  # confirmed at once
    assert s.pub.tick() == []  # 2 waits for 1
    [d] = s.deliveries()
    s.con.ack(1, d[3])
    assert s.pub.tick() == [Ack(1, 2, multiple=True)]
    assert records_on_disk(s.broker, "dq") == []
    assert records_on_disk(s.broker, "other") == [(sg.FLAG_DURABLE, BIG)]


def test_two_queues_confirm_when_both_have_settled(tmp_path):
    s = Scene(tmp_path, queues=("q1", "q2"))
    s.publish(BIG)
    d1, d2 = s.deliveries()
    s.con.ack(1, d1[3])
    assert s.pub.tick() == []  # q2 still needs it
    s.con.ack(1, d2[3])
    assert s.pub.tick() == [Ack(1, 1)]
    s.advance(5)
    assert records_on_disk(s.broker, "q1") == records_on_disk(s.broker, "q2") == []


def test_two_queues_one_settled_one_written(tmp_path):
    fsync = ManualFsync()
    s = Scene(tmp_path, queues=("q1", "q2"), fsync=fsync)
    s.publish(BIG)
    d1, d2 = s.deliveries()
    tag_q1 = d1[3] if d1[2] == "c-q1" else d2[3]
    s.con.ack(1, tag_q1)
    s.con.receive()
    assert s.pub.tick() == []
    s.advance()  # q2's copy is still unacked: written
    assert records_on_disk(s.broker, "q1") == []
    assert records_on_disk(s.broker, "q2") == [(sg.FLAG_DURABLE, BIG)]
    assert s.pub.tick() == []
    fsync.finish()
    assert s.pub.tick() == [Ack(1, 1)]


def test_a_failed_fsync_of_one_copy_nacks_though_the_other_copy_is_safe(tmp_path):
    """q2 (no consumer) writes at once and its fsync fails; q1's held copy is written at its
    deadline into the next batch, whose fsync succeeds: the publish is nacked, not acked."""
    fsync = ManualFsync()
    s = Scene(tmp_path, queues=("q1", "q2"), fsync=fsync, consume=False)
    s.con.consume(1, "c-q1", "q1")
    assert s.con.receive()[0][1] == "Basic.ConsumeOk"
    s.publish(BIG)
    s.deliveries()
    assert records_on_disk(s.broker, "q2") == [(sg.FLAG_DURABLE, BIG)] and len(s.persister.held) == 1
    fsync.finish(error="EIO")
    assert s.pub.tick() == []  # q1's copy is still held
    s.advance()
    assert records_on_disk(s.broker, "q1") == [(sg.FLAG_DURABLE, BIG)]
    fsync.finish()
    assert [f[:4] for f in s.pub.tick()] == [(1, "Basic.Nack", 1, False)]


def test_a_queue_without_consumers_writes_at_once(tmp_path):
    s = Scene(tmp_path, consume=False)
    s.publish(BIG)
    assert records_on_disk(s.broker) == [(sg.FLAG_DURABLE, BIG)]
    assert s.pub.tick() == [Ack(1, 1)]
    assert s.persister.holds == 0


def test_no_ack_delivery_is_never_written(tmp_path):
    s = Scene(tmp_path, no_ack=True)
    s.publish(BIG)
    assert s.pub.tick() == [Ack(1, 1)]
    assert len(s.deliveries()) == 1
    assert records_on_disk(s.broker) == []


def test_the_held_bytes_are_bounded(tmp_path):
    s = Scene(tmp_path)
    s.persister.hold_max = 3 * len(BIG)
    for _ in range(5):
        s.publish(BIG)
    # The oldest were written to stay within the bound; the newest three are held.
    assert len(records_on_disk(s.broker)) == 2
    assert s.persister.held_bytes == 3 * len(BIG)
    assert s.pub.tick() == [Ack(1, 1), Ack(1, 2)]  # (written, and fsynced inline here)
    tags = [d[3] for d in s.deliveries()]
    s.con.ack(1, tags[-1], multiple=True)
    assert s.pub.tick() == [Ack(1, 5, multiple=True)]
    assert s.persister.held_bytes == 0 and s.persister.holds_skipped == 3
    assert recovered(tmp_path).pop() is None


def test_a_queue_behind_its_prefetch_still_holds_until_the_deadline(tmp_path):
    s = Scene(tmp_path, prefetch=1)
    s.publish(BIG)
    s.publish(BIGGER)  # ready in the queue: the consumer's prefetch is full
    [d] = s.deliveries()
    s.con.ack(1, d[3])
    [d2] = s.deliveries()
    assert d2[-1] == BIGGER
    s.con.ack(1, d2[3])
    assert s.pub.tick() == [Ack(1, 2, multiple=True)]
    assert records_on_disk(s.broker) == []


def test_rejected_into_a_durable_dead_letter_queue_is_written_before_it_goes(tmp_path):
    s = Scene(tmp_path, consume=False)
    got = s.pub.call(1, commands.Queue.Declare(queue="work", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dq"}))
    assert got[0][1] == "Queue.DeclareOk"
    s.con.consume(1, "w", "work")
    s.con.receive()
    s.publish(BIG, exchange="", routing_key="work")
    [d] = s.deliveries()
    s.con.reject(1, d[3], requeue=False)
    s.con.receive()
    # The dead letter went to "dq" (no consumer: written at once), and the source was written
    # too, so that it stays until the copy is fsynced.
    assert records_on_disk(s.broker, "dq") == [(sg.FLAG_DURABLE, BIG)]
    assert records_on_disk(s.broker, "work") == [(sg.FLAG_DURABLE, BIG)]
    assert s.pub.tick() == [Ack(1, 1)]
    assert Persister(str(tmp_path)).queue_store("/", "work", True).pop() is None


def test_rejected_without_dead_letter_exchange_is_never_written(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    [d] = s.deliveries()
    s.con.reject(1, d[3], requeue=False)
    assert s.pub.tick() == [Ack(1, 1)]
    assert records_on_disk(s.broker) == []


def test_tx_commit_leaves_held_records_held(tmp_path):
    """A commit fsyncs its own publishes; another publisher's held record stays held (and is
    never written if acked in time)."""
    s = Scene(tmp_path)
    s.publish(BIG)
    s.deliveries()
    other = Client(s.broker)
    other.open_channel(1)
    other.declare(1, "txq", durable=True)
    assert other.call(1, commands.Tx.Select())[0][1] == "Tx.SelectOk"
    other.publish(1, "", "txq", b"t", persistent=True)
    assert other.call(1, commands.Tx.Commit())[0][1] == "Tx.CommitOk"
    assert records_on_disk(s.broker, "txq") == [(sg.FLAG_DURABLE, b"t")]
    assert records_on_disk(s.broker) == [] and len(s.persister.held) == 1 and s.pub.tick() == []


def test_deleting_the_queue_lets_its_held_confirms_go(tmp_path):
    s = Scene(tmp_path)
    s.publish(BIG)
    s.deliveries()
    s.pub.open_channel(2)
    got = s.pub.call(2, commands.Queue.Delete(queue="dq")) + s.pub.tick()
    assert sorted(f[1] for f in got) == ["Basic.Ack", "Queue.DeleteOk"], got
    assert Ack(1, 1) in got
    assert s.persister.held == {}


@pytest.mark.parametrize("holding", [True, False])
def test_without_timers_nothing_is_held(tmp_path, holding):
    s = Scene(tmp_path)
    if not holding:
        s.persister.scheduler = None
    s.publish(BIG)
    assert (records_on_disk(s.broker) == []) is holding
