"""TTL deadlines of messages that go to a disk store's tail (past its in-memory window) come
back with them, kept as runs per millisecond rather than one entry per message."""

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.amqp.properties import encode_header
from warren.store.persister import Persister
from warren.store.queued_message import QueuedMessage


def qm(seq: int, expiry: float | None) -> QueuedMessage:
    body = b"%d" % seq
    m = QueuedMessage(seq, Message("", "q", shortstr("") + shortstr("q"), encode_header(len(body), {}), body))
    m.expiry = expiry
    return m


def test_deadlines_survive_the_disk_tail(tmp_path):
    store = Persister(str(tmp_path), window=2).queue_store("/", "q", False)
    deadlines = [None, 10.0, 10.0001, 10.0004, None, 12.5, 12.5, None, None, 20.0]
    for seq, expiry in enumerate(deadlines, 1):
        store.push(qm(seq, expiry))
    assert store.disk_count == 8
    # Runs, not entries (the tail starts at seq 3): 10.0001 and 10.0004 round up into one
    # millisecond, 12.5 twice is one run.
    assert list(store.tail_expiry) == [(3, 10.001), (5, None), (6, 12.5), (8, None), (10, 20.0)]
    got = []
    while (m := store.pop()) is not None:
        got.append((m.seq, m.expiry))
    assert got == [(1, None), (2, 10.0), (3, 10.001), (4, 10.001), (5, None), (6, 12.5), (7, 12.5), (8, None),
                   (9, None), (10, 20.0)]
    assert not store.tail_expiry  # the tail is empty: nothing kept


def test_no_runs_without_deadlines(tmp_path):
    store = Persister(str(tmp_path), window=1).queue_store("/", "q", False)
    for seq in range(1, 50):
        store.push(qm(seq, None))
    assert not store.tail_expiry
