"""TTL deadlines live in the segment records (FLAG_EXPIRY, wall-clock ms): a message read back
from a disk store's tail, or recovered after a restart, keeps its deadline."""

import time

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.amqp.properties import encode_header
from warren.store import segments as sg
from warren.store.persister import Persister
from warren.store.queued_message import QueuedMessage


def qm(seq: int, expiry: float | None, persistent: bool = False, size: int = 1) -> QueuedMessage:
    body = b"x" * size
    header = encode_header(len(body), {"delivery_mode": 2 if persistent else 1})
    m = QueuedMessage(seq, Message("", "q", shortstr("") + shortstr("q"), header, body))
    m.expiry = expiry
    return m


def test_deadlines_survive_the_disk_tail(tmp_path):
    store = Persister(str(tmp_path), window=2).queue_store("/", "q", False)
    now = time.monotonic()
    deadlines = [None, now + 10, now + 11, None, now + 12.5, None, now + 20]
    sizes = [1, 1, 70_000, 1, 1, 1, 70_000]  # big bodies take the record-head path
    for seq, (expiry, size) in enumerate(zip(deadlines, sizes), 1):
        store.push(qm(seq, expiry, size=size))
    assert store.disk_count == 5
    got = [(m.seq, m.expiry) for m in iter(store.pop, None)]
    assert [seq for seq, _ in got] == list(range(1, 8))
    for (_seq, expiry), want in zip(got, deadlines):
        assert (expiry is None) == (want is None)
        if want is not None:
            assert abs(expiry - want) < 0.01  # ms in the record, and two clocks


def test_deadlines_survive_a_restart(tmp_path):
    persister = Persister(str(tmp_path))
    store = persister.queue_store("/", "q", True)
    now = time.monotonic()
    for seq, expiry in enumerate([now + 30, None, now + 40], 1):
        m = qm(seq, expiry, persistent=True)
        store.accept(m)
        store.push(m)
    persister.sync_now()
    again = Persister(str(tmp_path)).queue_store("/", "q", True)
    got = [(m.seq, m.expiry) for m in iter(again.pop, None)]
    assert [seq for seq, _ in got] == [1, 2, 3]
    assert abs(got[0][1] - (now + 30)) < 0.01 and got[1][1] is None and abs(got[2][1] - (now + 40)) < 0.01


def test_records_with_and_without_a_deadline():
    route, header = shortstr("x") + shortstr("k"), encode_header(5, {})
    data = sg.MAGIC + sg.encode_record(sg.FLAG_DURABLE, 1, route, header, b"hello", expiry=1_700_000_000_123) \
        + sg.encode_record(sg.FLAG_PAGED, 2, route, header, b"hello")
    (a, flags_a, _), (b, flags_b, _) = sg.scan(data)[0]
    assert flags_a == sg.FLAG_DURABLE | sg.FLAG_EXPIRY and flags_b == sg.FLAG_PAGED
    ra, rb = sg.read_record(data, a), sg.read_record(data, b)
    assert (ra.route, ra.header, ra.body, ra.expiry) == (route, header, b"hello", 1_700_000_000_123)
    assert (rb.route, rb.header, rb.body, rb.expiry) == (route, header, b"hello", None)
    assert sg.record_body_length(data, a) == sg.record_body_length(data, b) == 5


def test_paged_out_bodies_with_a_deadline_read_back(tmp_path):
    """page_out() writes records with the deadline too; reading the body back finds the route
    and header after it."""
    store = Persister(str(tmp_path)).queue_store("/", "q", False)
    now = time.monotonic()
    for seq, size in enumerate([5, 70_000, 7], 1):
        m = qm(seq, now + seq, size=size)
        store.push(m)
    assert store.page_out(10, 1 << 30)[0] == 3
    got = [m for m in iter(store.pop, None)]
    assert [(m.seq, len(m.message.body), m.message.routing_key) for m in got] == [(1, 5, "q"), (2, 70_000, "q"),
                                                                                 (3, 7, "q")]
    assert [round(m.expiry - now) for m in got] == [1, 2, 3]
