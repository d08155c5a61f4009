"""PriorityQueueStore over memory stores and over segment-file stores (durable, and transient
that pages), with a tiny window so most messages of a disk level live only on disk: order by
priority, FIFO within a level, requeue to the original position, drop_head, purge,
ready_bytes, recovery of a durable queue's levels after a reopen (a "crash": a new Persister
on the same directory, as in test_disk_store.py), and the priority property read from header
bytes."""

import os

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.amqp.properties import decode_properties, encode_header, priority
from warren.broker.broker import Broker
from warren.broker.queues.classic import ClassicQueue
from warren.store.disk import DiskQueueStore
from warren.store.memory import MemoryQueueStore
from warren.store.persister import Persister
from warren.store.priority import PriorityQueueStore
from warren.store.queued_message import QueuedMessage

ROUTE = shortstr("") + shortstr("q")
WINDOW = 4
MAX = 9


def message(body: bytes, prio: int | None, persistent: bool = True, **props) -> Message:
    if persistent:
        props["delivery_mode"] = 2
    if prio is not None:
        props["priority"] = prio
    return Message("", "q", ROUTE, encode_header(len(body), props), body)


class Harness:
    """A priority store and what a queue does around it: number, accept and push messages."""

    def __init__(self, kind: str, root, max_priority: int = MAX):
        self.kind = kind
        self.root = str(root)
        self.max_priority = max_priority
        self.seq = 0
        self.open()

    def open(self) -> None:
        """(Re)open the store: for a durable one, a new Persister on the same directory."""
        if self.kind == "memory":
            self.persister = None
            self.store = PriorityQueueStore.in_memory(self.max_priority)
        else:
            self.persister = Persister(self.root, window=WINDOW)
            self.store = PriorityQueueStore.on_disk(self.persister, "/", "q", self.kind == "disk-durable",
                                                    self.max_priority)
            self.seq = max(self.seq, self.store.max_seq)

    def add(self, body: bytes, prio: int | None, persistent: bool = True, **props) -> QueuedMessage:
        self.seq += 1
        qm = QueuedMessage(self.seq, message(body, prio, persistent, **props))
        self.store.accept(qm)
        self.store.push(qm)
        return qm

    def add_all(self, spec) -> list[bytes]:
        """Publish (body, priority) pairs; returns the bodies."""
        for body, prio in spec:
            self.add(body, prio)
        self.flush()
        return [body for body, _ in spec]

    def flush(self) -> None:
        if self.persister is not None:
            self.persister.flush()

    def drain(self) -> list[bytes]:
        got = []
        while (qm := self.store.pop()) is not None:
            got.append(qm.message.body)
            self.store.settle(qm)
        self.flush()
        return got


@pytest.fixture(params=["memory", "disk-durable", "disk-paging"])
def h(request, tmp_path) -> Harness:
    return Harness(request.param, tmp_path)


def bodies(qms) -> list[bytes]:
    return [qm.message.body for qm in qms]


def total(bs) -> int:
    return sum(len(b) for b in bs)


def mixed(n: int) -> list[tuple[bytes, int | None]]:
    """n messages with priorities cycling through none, 0, 5, 9, 2 (a body names each)."""
    prios = [None, 0, 5, 9, 2]
    return [(b"p%s-%03d" % (str(prios[i % 5]).encode(), i), prios[i % 5]) for i in range(n)]


def expected_order(spec, max_priority: int = MAX) -> list[bytes]:
    """Highest priority first (above the max counts as the max, none as 0), FIFO within one."""
    keyed = [(-min(p or 0, max_priority), i, body) for i, (body, p) in enumerate(spec)]
    return [body for _, _, body in sorted(keyed)]


# ------------------------------------------------------------------ priority property

@pytest.mark.parametrize("props", [
    {}, {"priority": 0}, {"priority": 7}, {"priority": 255},
    {"delivery_mode": 2, "priority": 3},
    {"content_type": "text/plain", "content_encoding": "gzip", "headers": {"a": 1, "b": [1, "x"]},
     "delivery_mode": 1, "priority": 200, "correlation_id": "c", "expiration": "100"},
    {"content_type": "application/json", "headers": {}, "delivery_mode": 2},
    {"headers": {"k": "v"}, "priority": 4},
    {"message_id": "m", "timestamp": 5, "type": "t", "user_id": "u", "app_id": "a", "priority": 1},
])
def test_priority_is_read_from_the_header_bytes(props):
    header = encode_header(3, props)
    assert priority(header) == decode_properties(header).get("priority", 0) == props.get("priority", 0)


# ------------------------------------------------------------------------- order

def test_highest_priority_first_and_fifo_within_a_priority(h):
    spec = mixed(40)  # several times the window per level for the disk stores
    h.add_all(spec)
    assert len(h.store) == 40 and h.store.ready_bytes == total(b for b, _ in spec)
    if h.kind == "memory":  # (a disk store's peek_all shows its in-memory window only)
        assert bodies(h.store.peek_all()) == expected_order(spec)
    assert h.drain() == expected_order(spec)
    assert len(h.store) == 0 and h.store.ready_bytes == 0 and h.store.pop() is None


def test_above_the_max_counts_as_the_max_and_none_as_zero(h):
    spec = [(b"none", None), (b"max", MAX), (b"zero", 0), (b"over", MAX + 1), (b"top", 255), (b"one", 1)]
    h.add_all(spec)
    assert h.drain() == [b"max", b"over", b"top", b"one", b"none", b"zero"]


def test_arrivals_of_a_higher_priority_go_ahead_of_what_is_waiting(h):
    h.add_all([(b"low-1", 1), (b"low-2", 1)])
    assert h.store.pop().message.body == b"low-1"
    h.add_all([(b"high", 8)])
    assert h.store.peek().message.body == b"high"
    assert h.drain() == [b"high", b"low-2"]


def test_levels_are_created_by_their_first_message(h):
    assert h.store.levels() == [] and h.store.pop() is None and h.store.peek() is None
    h.add_all([(b"a", 3), (b"b", 3), (b"c", 7)])
    assert len(h.store.levels()) == 2


# ----------------------------------------------------------------------- requeue

def test_requeued_messages_go_back_to_their_level_at_their_position(h):
    spec = [(b"a5", 5), (b"b1", 1), (b"c5", 5), (b"d1", 1), (b"e5", 5), (b"f9", 9)]
    h.add_all(spec)
    taken = [h.store.pop() for _ in range(5)]
    assert bodies(taken) == [b"f9", b"a5", b"c5", b"e5", b"b1"]
    for qm in (taken[3], taken[1], taken[4]):  # e5, a5, b1: out of order
        qm.redelivered = True
        h.store.requeue(qm)
    assert len(h.store) == 4 and h.store.ready_bytes == total([b"a5", b"e5", b"b1", b"d1"])
    assert bodies(h.store.peek_all()) == [b"a5", b"e5", b"b1", b"d1"]
    h.store.settle(taken[0])
    h.store.settle(taken[2])
    got = []
    while (qm := h.store.pop()) is not None:
        got.append((qm.message.body, qm.redelivered))
        h.store.settle(qm)
    assert got == [(b"a5", True), (b"e5", True), (b"b1", True), (b"d1", False)]


def test_requeue_of_a_high_message_overtakes_lower_levels(h):
    h.add_all([(b"high", 6), (b"low", 2)])
    qm = h.store.pop()
    assert qm.message.body == b"high" and h.store.peek().message.body == b"low"
    h.store.requeue(qm)
    assert h.store.peek() is qm


# --------------------------------------------------------------- drop_head, purge

def test_drop_head_takes_across_levels_in_delivery_order(h):
    spec = mixed(23)
    h.add_all(spec)
    order = expected_order(spec)
    dropped = h.store.drop_head(12)  # all of levels 9 and 5, and some of level 2
    assert bodies(dropped) == order[:12]
    assert len(h.store) == 11 and h.store.ready_bytes == total(order[12:])
    for qm in dropped:
        h.store.settle(qm)
    assert h.store.drop_head(0) == []
    assert bodies(h.store.drop_head(100)) == order[12:]
    assert len(h.store) == 0 and h.store.drop_head(1) == []


def test_purge_empties_every_level(h):
    spec = mixed(30)
    h.add_all(spec)
    qm = h.store.pop()
    h.store.requeue(qm)
    assert h.store.purge() == 30
    h.flush()
    assert len(h.store) == 0 and h.store.ready_bytes == 0 and h.store.peek_all() == []
    h.add_all([(b"after", 3)])
    assert h.drain() == [b"after"]


def test_destroy_removes_every_level_directory(tmp_path):
    for kind in ("disk-durable", "disk-paging"):
        h = Harness(kind, tmp_path / kind)
        h.add_all(mixed(30))
        dirs = [s.directory for s in h.store.levels()]
        assert len(dirs) == 4 and all(os.path.isdir(d) for d in dirs)
        h.store.destroy()
        assert not any(os.path.exists(d) for d in dirs)
        if kind == "disk-durable":
            assert not os.path.exists(h.persister.queue_dir("/", "q"))


# ---------------------------------------------------------------------- recovery

def test_durable_levels_are_recovered_with_their_priorities(tmp_path):
    h = Harness("disk-durable", tmp_path)
    spec = mixed(30)
    for body, prio in spec:
        h.add(body, prio)
    h.add(b"transient", 9, persistent=False)  # does not survive
    h.flush()
    taken = h.store.pop()  # f9 level's first: delivered, unacked at the crash
    h.store.delivered(taken)
    acked = h.store.pop()
    h.store.settle(acked)
    h.flush()
    order = expected_order(spec)
    assert bodies([taken, acked]) == order[:2]
    h.open()  # the crash: a new persister and store on the same files
    assert len(h.store) == 29 and h.store.ready_bytes == total(order[:1] + order[2:])
    assert h.store.max_seq == 31  # the queue numbers new messages after every level's
    got = []
    while (qm := h.store.pop()) is not None:
        got.append((qm.message.body, qm.redelivered))
        h.store.settle(qm)
    h.flush()
    assert got == [(order[0], True)] + [(b, False) for b in order[2:]]
    h.open()
    assert len(h.store) == 0 and h.store.levels() == []


def test_queue_numbers_continue_after_recovered_levels(tmp_path):
    persister = Persister(str(tmp_path), window=WINDOW)
    args = {"x-max-priority": 5}
    store = ClassicQueue.make_store(persister, "/", "pq", True, args)
    assert isinstance(store, PriorityQueueStore)
    q = ClassicQueue(None, "pq", True, arguments=args, store=store)
    for i in range(6):
        q.publish(message(b"m%d" % i, i))
    persister.flush()
    persister = Persister(str(tmp_path), window=WINDOW)
    q = ClassicQueue(None, "pq", True, arguments=args, store=ClassicQueue.make_store(persister, "/", "pq", True, args))
    assert q.next_seq == 6
    q.publish(message(b"new", 5))
    got = []
    while (qm := q.get()) is not None:
        got.append((qm.message.body, qm.seq))
    assert got == [(b"m5", 6), (b"new", 7), (b"m4", 5), (b"m3", 4), (b"m2", 3),
                   (b"m1", 2), (b"m0", 1)]


def test_make_store_chooses_by_x_max_priority(tmp_path):
    assert ClassicQueue.make_store(None, "/", "q", True, {}) is None
    assert ClassicQueue.make_store(None, "/", "q", True, {"x-max-priority": 0}) is None  # one level: a plain queue
    store = ClassicQueue.make_store(None, "/", "q", True, {"x-max-priority": 3})
    assert isinstance(store, PriorityQueueStore) and store.max_priority == 3
    store.push(QueuedMessage(1, message(b"x", 2)))
    assert isinstance(store.levels()[0], MemoryQueueStore)
    persister = Persister(str(tmp_path))
    assert isinstance(ClassicQueue.make_store(persister, "/", "q", True, {"x-max-priority": 0}), DiskQueueStore)
    for durable in (True, False):
        store = ClassicQueue.make_store(persister, "/", "q", durable, {"x-max-priority": 255})
        store.push(QueuedMessage(1, message(b"x", 200)))
        assert isinstance(store, PriorityQueueStore) and isinstance(store.levels()[0], DiskQueueStore)


def test_messages_of_the_queue_directory_move_into_their_levels(tmp_path):
    """A durable queue that held messages before Warren honoured x-max-priority had them in
    its own directory: at the next start they move into their levels, in their order."""
    persister = Persister(str(tmp_path), window=WINDOW)
    plain = persister.queue_store("/", "q", True)
    spec = mixed(20)
    for i, (body, prio) in enumerate(spec, 1):
        qm = QueuedMessage(i, message(body, prio))
        plain.accept(qm)
        plain.push(qm)
    delivered = plain.pop()
    plain.delivered(delivered)  # unacked: redelivered after the move too
    persister.flush()
    h = Harness("disk-durable", tmp_path)
    assert h.store.max_seq == 20 and len(h.store) == 20
    assert not [n for n in os.listdir(h.persister.queue_dir("/", "q")) if n.endswith((".seg", ".ack"))]
    order = expected_order(spec)
    got = []
    while (qm := h.store.pop()) is not None:
        got.append((qm.message.body, qm.redelivered))
        h.store.settle(qm)
    assert [b for b, _ in got] == order
    assert [b for b, r in got if r] == [delivered.message.body]
    h.flush()
    h.open()  # moved once: nothing comes back
    assert len(h.store) == 0


def test_paging_levels_write_arrivals_to_disk(tmp_path):
    """The memory monitor pages each level (warren.server.memory_monitor finds them with
    levels()): while paging, a level's arrivals go to its disk tail, and come back in order."""
    h = Harness("disk-paging", tmp_path)
    spec = mixed(10)
    h.add_all(spec[:5])
    for level in h.store.levels():
        assert isinstance(level, DiskQueueStore)
        level.set_paging(True, False)
        level.page_out(100, 1 << 20)
    h.persister.paging = True  # a level created meanwhile starts paging too
    h.add_all(spec[5:] + [(b"new-level", 7)])
    assert all(level.paging for level in h.store.levels())
    assert h.drain() == expected_order(spec + [(b"new-level", 7)])


def test_the_memory_monitor_pages_every_level(tmp_path):
    """A priority queue declared through the broker (make_store) is paged level by level."""
    from warren.broker import ops
    from warren.server.memory_monitor import MemoryMonitor

    mib = 1 << 20
    broker = Broker.with_defaults()
    broker.persister = Persister(str(tmp_path))
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    q, _ = ops.declare_queue(actor, "pq", durable=True, arguments={"x-max-priority": 5})
    assert isinstance(q.store, PriorityQueueStore)
    used = [10 * mib]
    monitor = MemoryMonitor(broker, ("absolute", 100 * mib), total_memory=lambda: 1 << 34,
                            memory_used=lambda: used[0], paging_ratio=0.5)
    monitor.set_watermark(("absolute", 100 * mib))
    spec = [(b"m%02d" % i, i % 3) for i in range(30)]
    for i, (body, prio) in enumerate(spec):
        q.publish(message(body, prio, persistent=i % 2 == 0))
    used[0] = 60 * mib
    monitor.check()
    monitor.check_paging()
    levels = q.store.levels()
    assert len(levels) == 3 and all(level.paging and level.paged_out == 10 for level in levels)
    more = [(b"n0", 5), (b"n1", 0)]
    for body, prio in more:
        q.publish(message(body, prio, persistent=False))
    assert all(level.paging for level in q.store.levels()) and q.store.levels()[0].disk_count == 1
    got = []
    while (qm := q.get()) is not None:
        got.append(qm.message.body)
    assert got == expected_order(spec + more)


def test_a_level_above_the_maximum_moves_into_the_maximum(tmp_path):
    """Levels of a directory the queue's maximum does not reach (never written by the same
    declaration; a defensive path) are moved into the top level, behind what it holds,
    the highest first."""
    h = Harness("disk-durable", tmp_path, max_priority=9)
    h.add_all([(b"a9", 9), (b"b7", 7), (b"c5", 5), (b"d2", 2)])
    h.max_priority = 5
    h.open()
    root = h.persister.queue_dir("/", "q")
    assert sorted(os.listdir(root)) == [f"{os.path.basename(root)}-p{n}" for n in (2, 5)]
    assert h.drain() == [b"c5", b"a9", b"b7", b"d2"]
