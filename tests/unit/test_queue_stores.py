"""The QueueStore interface, run against every store: the in-memory one, and the segment-file
one with a tiny window (so most messages live only on disk) as a durable queue and as a
transient queue that pages. peek() and drop_head() are what TTL expiry and max-length need."""

import glob
import os

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.amqp.properties import encode_header
from warren.store import segments as sg
from warren.store.interface import QueueStore
from warren.store.memory import MemoryQueueStore
from warren.store.persister import Persister
from warren.store.queued_message import QueuedMessage

ROUTE = shortstr("") + shortstr("q")
WINDOW = 4


class Harness:
    """A store and what a queue would do around it: number, accept and push messages."""

    def __init__(self, store: QueueStore, persister: Persister | None = None):
        self.store = store
        self.persister = persister
        self.seq = 0

    def add(self, body: bytes, persistent: bool = True) -> QueuedMessage:
        self.seq += 1
        props = {"delivery_mode": 2} if persistent else {}
        qm = QueuedMessage(self.seq, Message("", "q", ROUTE, encode_header(len(body), props), body))
        self.store.accept(qm)
        self.store.push(qm)
        return qm

    def add_many(self, count: int) -> list[bytes]:
        bodies = [b"m%03d" % (self.seq + i + 1) + b"." * (self.seq + i) for i in range(count)]
        for body in bodies:
            self.add(body)
        self.flush()
        return bodies

    def flush(self) -> None:
        if self.persister is not None:
            self.persister.flush()


@pytest.fixture(params=["memory", "disk-durable", "disk-paging"])
def h(request, tmp_path) -> Harness:
    if request.param == "memory":
        return Harness(MemoryQueueStore())
    persister = Persister(str(tmp_path), window=WINDOW)
    return Harness(persister.queue_store("/", "q", request.param == "disk-durable"), persister)


def bodies(qms) -> list[bytes]:
    return [qm.message.body for qm in qms]


def total(bs) -> int:
    return sum(len(b) for b in bs)


# ---------------------------------------------------------------------------- peek

def test_empty_store(h):
    assert h.store.peek() is None
    assert h.store.drop_head(3) == []
    assert len(h.store) == 0 and h.store.ready_bytes == 0


def test_peek_is_what_pop_returns_next_and_takes_nothing(h):
    sent = h.add_many(3 * WINDOW)  # most of them only on disk for the disk stores
    got = []
    while (head := h.store.peek()) is not None:
        assert h.store.peek() is head
        left = len(h.store)
        assert h.store.ready_bytes == total(sent[len(got):])
        qm = h.store.pop()
        assert qm is head and len(h.store) == left - 1
        got.append(qm)
    assert bodies(got) == sent
    assert h.store.ready_bytes == 0


def test_peek_reads_the_disk_tail_when_the_window_is_empty(h):
    sent = h.add_many(3 * WINDOW)
    first = h.store.drop_head(WINDOW)  # empties the in-memory window of a disk store
    assert bodies(first) == sent[:WINDOW]
    head = h.store.peek()
    assert head is not None and head.message.body == sent[WINDOW]
    assert len(h.store) == 2 * WINDOW and h.store.ready_bytes == total(sent[WINDOW:])


def test_peek_sees_requeued_messages_first(h):
    sent = h.add_many(6)
    taken = [h.store.pop() for _ in range(3)]
    h.store.requeue(taken[2])
    h.store.requeue(taken[1])
    assert h.store.peek() is taken[1]
    assert h.store.ready_bytes == total(sent[1:])
    assert bodies(h.store.peek_all()) == sent[1:]


# ----------------------------------------------------------------------- drop_head

def test_drop_head_takes_up_to_n_in_delivery_order(h):
    sent = h.add_many(3 * WINDOW + 1)
    dropped = h.store.drop_head(WINDOW + 2)  # across the window and the disk tail
    assert bodies(dropped) == sent[:WINDOW + 2]
    assert len(h.store) == len(sent) - len(dropped)
    assert h.store.ready_bytes == total(sent[WINDOW + 2:])
    assert h.store.pop().message.body == sent[WINDOW + 2]
    assert h.store.drop_head(0) == []
    rest = h.store.drop_head(100)
    assert bodies(rest) == sent[WINDOW + 3:]
    assert len(h.store) == 0 and h.store.ready_bytes == 0 and h.store.drop_head(1) == []


def test_drop_head_takes_requeued_messages_first(h):
    sent = h.add_many(5)
    taken = [h.store.pop() for _ in range(3)]
    for qm in reversed(taken):
        h.store.requeue(qm)
    dropped = h.store.drop_head(4)
    assert dropped[:3] == taken and bodies(dropped) == sent[:4]
    assert bodies(h.store.peek_all()) == sent[4:]
    assert h.store.ready_bytes == total(sent[4:])


def test_ready_bytes_through_push_pop_requeue_and_purge(h):
    sent = h.add_many(2 * WINDOW)
    assert h.store.ready_bytes == total(sent)
    qm = h.store.pop()
    assert h.store.ready_bytes == total(sent[1:])
    h.store.requeue(qm)
    assert h.store.ready_bytes == total(sent)
    assert h.store.purge() == len(sent)
    assert h.store.ready_bytes == 0 and h.store.peek() is None


# -------------------------------------------------------------- disk store specifics

def durable_store(tmp_path) -> Harness:
    persister = Persister(str(tmp_path), window=WINDOW)
    return Harness(persister.queue_store("/", "q", True), persister)


def test_settled_dropped_messages_are_gone_after_a_restart(tmp_path):
    h = durable_store(tmp_path)
    sent = h.add_many(3 * WINDOW)
    for qm in h.store.drop_head(WINDOW + 1):  # the caller settles what it drops
        h.store.settle(qm)
    h.flush()
    again = durable_store(tmp_path)
    assert len(again.store) == len(sent) - WINDOW - 1
    assert bodies(again.store.drop_head(100)) == sent[WINDOW + 1:]


def test_recovered_ready_bytes_are_the_body_sizes(tmp_path):
    h = durable_store(tmp_path)
    sent = h.add_many(3 * WINDOW)
    again = durable_store(tmp_path)
    assert again.store.ready_bytes == total(sent)
    assert bodies(again.store.drop_head(100)) == sent
    assert again.store.ready_bytes == 0


def test_store_reads_what_the_segment_reader_reads(tmp_path):
    """The store's inlined read loop and segments.read_record agree on every record."""
    h = durable_store(tmp_path)
    h.add(b"")
    h.add(b"x" * 70000, persistent=True)
    h.add_many(2 * WINDOW)
    (path,) = glob.glob(os.path.join(h.store.directory, "*.seg"))
    with open(path, "rb") as f:
        data = f.read()
    records, end, problem = sg.scan(data)
    assert problem is None and end == len(data)
    loaded = durable_store(tmp_path).store.drop_head(100)
    assert len(loaded) == len(records)
    for (offset, flags, seq), qm in zip(records, loaded):
        record = sg.read_record(data, offset)
        assert (record.flags, record.seq) == (flags, seq) == (sg.FLAG_DURABLE, qm.seq)
        assert (record.route, record.header, record.body) == (qm.message.route, qm.message.header,
                                                              qm.message.body)
        assert sg.record_body_length(data, offset) == len(record.body)


# ------------------------------------------------------------------ segment reader

def test_read_record_round_trip():
    records = [(sg.FLAG_DURABLE, 7, ROUTE, encode_header(5, {}), b"hello"),
               (sg.FLAG_PAGED, 2 ** 63, b"", b"", b""),
               (sg.FLAG_DURABLE, 9, shortstr("x" * 255) + shortstr("k"), b"h" * 300, bytes(range(256)))]
    data = sg.MAGIC + b"".join(sg.encode_record(*r) for r in records)
    pos = len(sg.MAGIC)
    for flags, seq, route, header, body in records:
        record = sg.read_record(data, pos)
        assert record[:5] == (flags, seq, route, header, body)
        length = sg.RECORD_HEAD.unpack_from(data, pos)[0]
        assert record.end == pos + sg.record_size(length)
        assert sg.record_body_length(data, pos) == len(body)
        assert record.end - pos == sg.REC_OVERHEAD + len(route) + len(header) + len(body)
        pos = record.end
    assert pos == len(data)
    assert sg.scan(data)[1:] == (len(data), None)
