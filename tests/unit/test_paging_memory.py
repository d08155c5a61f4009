"""Paging by memory (issue 10): the store's side (new arrivals to the disk tail while paging,
bodies of the window evicted and read back in order, crash safety, the disk alarm's rule) and
the memory monitor's (threshold, hysteresis, ratio above 1.0, a slice evicted per sample),
without a server. The store helpers are test_disk_store's (a real Persister and queue)."""

import glob
import os

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.alarms import DISK
from warren.broker.broker import Broker
from warren.server.memory_monitor import MemoryMonitor
from warren.store import segments as sg
from warren.store.disk import PAGED_OUT
from warren.store.persister import Persister

from .test_disk_store import Store, bodies, body_of, message

MiB = 1 << 20


def record_flags(store) -> list[int]:
    """The flags of every record in the store's segment files (flushed first)."""
    store.persister.flush()
    flags = []
    for path in sorted(glob.glob(os.path.join(store.dir, "*.seg"))):
        with open(path, "rb") as f:
            data = f.read()
        records, _, problem = sg.scan(data)
        assert problem is None
        flags += [f for _, f, _ in records]
    return flags


# ------------------------------------------------------------------------ the store

@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient-queue"])
def test_while_paging_new_arrivals_go_to_the_disk_tail_in_order(tmp_path, durable):
    s = Store(tmp_path, durable=durable)  # the default window (32768): never full here
    s.publish_many(range(10), persistent=False)
    s.store.set_paging(True, False)
    s.publish_many(range(10, 30), persistent=False)
    assert (len(s.store._fresh), s.store.disk_count) == (10, 20)
    s.store.set_paging(False, False)
    s.publish_many(range(30, 40), persistent=False)  # behind the disk tail: still to disk
    assert s.store.disk_count == 30
    assert record_flags(s) == [sg.FLAG_PAGED] * 30
    got = s.drain()
    assert bodies(got) == [body_of(i) for i in range(40)]
    assert len(s.store) == 0 and s.store.ready_bytes == 0
    assert len(s.seg_files()) <= 1


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient-queue"])
def test_page_out_evicts_window_bodies_and_reads_them_back_in_order(tmp_path, durable):
    s = Store(tmp_path, durable=durable)
    sizes = [100, 70_000, 300, 5000]  # small, big (written by reference), and between
    expected = []
    for i in range(60):
        body = body_of(i, sizes[i % 4])
        s.publish(body, persistent=i % 3 == 0, headers={"n": i})
        expected.append(body)
    s.persister.flush()
    ready_bytes = s.store.ready_bytes
    assert s.store.resident == 60 and s.store.fresh_bytes == ready_bytes
    s.store.set_paging(True, False)
    count, freed = s.store.page_out(25, 1 << 40)  # a slice: the newest first
    assert count == 25 and freed == sum(len(b) for b in expected[35:])
    assert [qm.message is PAGED_OUT for qm in s.store._fresh] == [False] * 35 + [True] * 25
    assert s.store.page_out(1000, 1 << 40)[0] == 35
    assert s.store.resident == 0 and s.store.fresh_bytes == 0
    assert s.store.ready_bytes == ready_bytes and len(s.store) == 60
    # Arrivals meanwhile queue behind them on disk.
    for i in range(60, 70):
        s.publish(body_of(i), persistent=False)
        expected.append(body_of(i))
    got = s.drain()
    assert bodies(got) == expected
    assert [qm.message.headers for qm in got[:60]] == [{"n": i} for i in range(60)]
    assert [qm.message.routing_key for qm in got] == ["q"] * 70
    assert s.store.paged_out == 0 and s.store.ready_bytes == 0
    assert len(s.seg_files()) <= 1  # every record settled


def test_an_evicted_message_shared_with_another_queue_keeps_its_body_there(tmp_path):
    a, b = Store(tmp_path, name="a"), Store(tmp_path, name="b")
    shared = message(b"fanout" * 100, persistent=False)
    a.queue.publish(shared)
    b.queue.publish(shared)
    a.store.page_out(10, 1 << 40)
    assert a.store._fresh[0].message is PAGED_OUT
    assert shared.body == b"fanout" * 100 and b.store._fresh[0].message is shared
    assert a.get().message.body == shared.body == b.get().message.body


def test_evicted_records_are_not_taken_again_by_the_disk_tail_walk(tmp_path, monkeypatch):
    monkeypatch.setattr(sg, "SEGMENT_SIZE", 4096)
    s = Store(tmp_path, durable=False)
    s.publish_many(range(20), persistent=False)
    s.store.set_paging(True, False)
    s.publish_many(range(20, 40), persistent=False)  # the disk tail starts here
    s.store.page_out(100, 1 << 40)  # their records are written after the tail's first ones
    s.publish_many(range(40, 60), persistent=False)
    assert (len(s.store._fresh), s.store.disk_count, s.store.paged_out) == (20, 40, 20)
    got = s.drain()
    assert bodies(got) == [body_of(i) for i in range(60)]  # no duplicates, none missing
    assert len(s.seg_files()) <= 1


def test_peek_purge_and_requeue_of_evicted_messages(tmp_path):
    s = Store(tmp_path)
    s.publish_many(range(5), persistent=False)
    s.store.page_out(100, 1 << 40)
    assert s.store.peek().message.body == body_of(0)  # read back, left in place
    assert [qm.message.body for qm in s.store.peek_all()] == [body_of(i) for i in range(5)]
    s.store.page_out(100, 1 << 40)
    first = s.get(ack=False)
    s.queue.reject(first, requeue=True)
    assert s.get().message.body == body_of(0)
    s.store.page_out(100, 1 << 40)
    assert s.queue.purge() == 4
    assert s.store.paged_out == 0 and s.store.fresh_bytes == 0 and s.store.ready_bytes == 0
    s.persister.flush()
    assert len(s.seg_files()) <= 1


def test_a_crash_after_paging_recovers_the_persistent_messages_once(tmp_path):
    s = Store(tmp_path)
    for i in range(40):
        s.publish(body_of(i), persistent=i % 2 == 0)
    s.store.set_paging(True, False)
    for i in range(40, 60):
        s.publish(body_of(i), persistent=i % 2 == 0)
    s.store.page_out(1000, 1 << 40)
    assert [s.get().message.body for _ in range(3)] == [body_of(i) for i in range(3)]  # 0 and 2 acked
    recovered = s.crash()
    got = recovered.drain()
    assert bodies(got) == [body_of(i) for i in range(4, 60, 2)]  # persistent ones, not yet acked
    assert not any(qm.redelivered for qm in got)


def test_under_the_disk_alarm_no_transient_message_is_written(tmp_path):
    s = Store(tmp_path)
    s.store.set_paging(True, True)
    for i in range(20):
        s.publish(body_of(i), persistent=i % 2 == 0)
    # Nothing is on disk yet behind which order would force transient writes: all stay in
    # the window, and only the persistent ones (already on disk) lose their bodies.
    assert s.store.disk_count == 0
    assert s.store.page_out(1000, 1 << 40)[0] == 10
    assert [qm.message is PAGED_OUT for qm in s.store._fresh] == [i % 2 == 0 for i in range(20)]
    assert record_flags(s) == [sg.FLAG_DURABLE] * 10
    s.store.set_paging(True, False)  # the alarm clears: now they go too
    assert s.store.page_out(1000, 1 << 40)[0] == 10
    assert record_flags(s) == [sg.FLAG_DURABLE] * 10 + [sg.FLAG_PAGED] * 10
    assert bodies(s.drain()) == [body_of(i) for i in range(20)]


_FREES_THE_MEMORY = """
import sys
from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.broker import Broker
from warren.server.memory_monitor import MemoryMonitor, ResidentMemory
from warren.store.persister import Persister

MiB = 1 << 20
broker = Broker.with_defaults()
broker.persister = Persister(sys.argv[1])
actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
ops.declare_queue(actor, "q", durable=True)
used = [10 * MiB]
m = MemoryMonitor(broker, ("absolute", 100 * MiB), total_memory=lambda: 1 << 34,
                  memory_used=lambda: used[0], paging_ratio=0.5)
m.set_watermark(("absolute", 100 * MiB))
rss = ResidentMemory()
before = rss()
header = encode_header(64 * 1024, {"delivery_mode": 1})
for i in range(1600):  # 100 MiB, transient
    body = (b"%06d" % i).ljust(64 * 1024, b".")
    msg, queues = ops.route(actor, "", "q", shortstr("") + shortstr("q"), header, body)
    ops.enqueue(msg, queues)
broker.persister.flush()
grown = rss() - before
used[0] = 60 * MiB
while m.page_out(list(m._stores())):
    pass
print(grown, before + grown - rss())
"""


def test_page_out_frees_the_memory(tmp_path):
    """RSS falls by most of the evicted bodies (malloc_trim hands them back to the OS). In a
    fresh interpreter: the test process's own heap would make RSS say little."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _FREES_THE_MEMORY, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=True)
    grown, freed = map(int, out.stdout.split())
    assert grown > 90 * MiB
    assert freed > 75 * MiB, f"only {freed / MiB:.0f} MiB of 100 came back"


# ---------------------------------------------------------------------- the monitor

def paging_broker(tmp_path, ratio=0.5):
    """A broker with a persister and queue q, and a monitor with a 100 MiB limit whose RSS
    is `used[0]`."""
    broker = Broker.with_defaults()
    broker.persister = Persister(str(tmp_path))
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    ops.declare_queue(actor, "q", durable=True)
    used = [10 * MiB]
    m = MemoryMonitor(broker, ("absolute", 100 * MiB), total_memory=lambda: 1 << 34,
                      memory_used=lambda: used[0], paging_ratio=ratio)
    m.set_watermark(("absolute", 100 * MiB))
    return broker, m, used


def publish(broker, n, size=100, persistent=True, start=0):
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    for i in range(start, start + n):
        body = body_of(i, size)
        msg, queues = ops.route(actor, "", "q", shortstr("") + shortstr("q"),
                                encode_header(len(body), {"delivery_mode": 2 if persistent else 1}), body)
        ops.enqueue(msg, queues)
    broker.persister.flush()


def store_of(broker):
    return broker.vhosts["/"].queues["q"].store


def sample(m, used, value):
    used[0] = value
    m.check()
    m.check_paging()


def test_paging_starts_past_the_ratio_and_stops_below_its_hysteresis(tmp_path):
    broker, m, used = paging_broker(tmp_path)
    publish(broker, 10)
    sample(m, used, 50 * MiB)  # at the threshold is not past it
    assert not m.paging and not store_of(broker).paging and store_of(broker).paged_out == 0
    sample(m, used, 50 * MiB + 1)
    assert m.paging and store_of(broker).paging and store_of(broker).paged_out == 10
    assert "memory" not in broker.alarms
    publish(broker, 5, start=10)
    assert store_of(broker).disk_count == 5
    sample(m, used, 46 * MiB)  # above 0.9 of the threshold: still paging
    assert m.paging
    sample(m, used, 44 * MiB)
    assert not m.paging and not store_of(broker).paging
    publish(broker, 5, start=15)
    q = broker.vhosts["/"].queues["q"]
    got = [q.get().message.body for _ in range(20)]
    assert got == [body_of(i) for i in range(20)]


def test_a_ratio_above_one_never_pages(tmp_path):
    broker, m, used = paging_broker(tmp_path, ratio=1.5)
    publish(broker, 10)
    sample(m, used, 99 * MiB)
    sample(m, used, 200 * MiB)
    assert "memory" in broker.alarms
    assert not m.paging and not store_of(broker).paging and store_of(broker).paged_out == 0


def test_a_slice_per_sample_and_the_disk_alarm_passed_on(tmp_path, monkeypatch):
    import warren.server.memory_monitor as mm
    monkeypatch.setattr(mm, "PAGE_OUT_MESSAGES", 30)
    broker, m, used = paging_broker(tmp_path)
    publish(broker, 50, persistent=False)
    publish(broker, 50, start=50)
    broker.alarms.set(DISK, True)
    sample(m, used, 60 * MiB)
    store = store_of(broker)
    assert store.disk_alarm and store.paged_out == 30  # persistent ones only, newest first
    sample(m, used, 60 * MiB)
    assert store.paged_out == 50
    sample(m, used, 60 * MiB)
    assert store.paged_out == 50  # the transient ones stay while the disk alarm is on
    broker.alarms.set(DISK, False)
    sample(m, used, 60 * MiB)
    assert not store.disk_alarm and store.paged_out == 80
    q = broker.vhosts["/"].queues["q"]
    assert [q.get().message.body for _ in range(100)] == [body_of(i) for i in range(100)]


def test_a_queue_declared_during_the_disk_alarm_starts_with_it(tmp_path):
    """The monitor's word lives on the persister too: a store created after the change (with
    paging off, when the monitor does not walk the queues) starts with it."""
    broker, m, used = paging_broker(tmp_path)
    broker.alarms.set(DISK, True)
    sample(m, used, 10 * MiB)  # no paging
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    ops.declare_queue(actor, "later", durable=True)
    assert broker.vhosts["/"].queues["later"].store.disk_alarm
    sample(m, used, 10 * MiB)
    broker.alarms.set(DISK, False)
    sample(m, used, 10 * MiB)
    ops.declare_queue(actor, "after", durable=True)
    assert not broker.vhosts["/"].queues["after"].store.disk_alarm


def test_paging_walks_the_queues_once_a_second_not_every_sample(tmp_path, monkeypatch):
    """While paging goes on, the queues with bodies in memory are looked for once per
    RESCAN_EVERY; the samples in between page from that list."""
    import warren.server.memory_monitor as mm

    broker, m, used = paging_broker(tmp_path)
    walks = []
    stores = m._stores
    monkeypatch.setattr(m, "_stores", lambda: walks.append(1) or stores())
    clock = [1000.0]
    monkeypatch.setattr(mm.time, "monotonic", lambda: clock[0])
    publish(broker, 10)
    sample(m, used, 60 * MiB)  # paging starts: a walk, and the bodies go
    assert len(walks) == 1 and store_of(broker).paged_out == 10
    for _ in range(5):
        clock[0] += mm.INTERVAL
        sample(m, used, 60 * MiB)
    assert len(walks) == 1
    clock[0] += mm.RESCAN_EVERY
    sample(m, used, 60 * MiB)
    assert len(walks) == 2
