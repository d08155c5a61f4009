"""The segment-file message store without a broker: DiskQueueStore behind a real Queue, and
the Persister's buffered writes and group commit. A "crash" is a new Persister and store on
the same directory while the old ones are simply abandoned (what was flushed is in the files,
as after a SIGKILL)."""

import glob
import os

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.amqp.message import Message
from warren.broker.queues.classic import ClassicQueue
from warren.store import segments as sg
from warren.store.persister import Persister
from warren.store.settlement import StoreBatch

ROUTE = shortstr("") + shortstr("q")


def message(body: bytes, persistent=True, **props) -> Message:
    if persistent:
        props["delivery_mode"] = 2
    return Message("", "q", ROUTE, encode_header(len(body), props), body)


def body_of(i: int, size: int = 100) -> bytes:
    return f"m{i:06d}-".encode().ljust(size, b".")


class Store:
    """A Persister (fsyncs inline) and one queue backed by a DiskQueueStore."""

    def __init__(self, root, durable=True, window=None, name="q"):
        self.root = str(root)
        self.persister = Persister(self.root, window=window)
        self.store = self.persister.queue_store("/", name, durable)
        self.queue = ClassicQueue(None, name, durable, store=self.store)

    @property
    def dir(self):
        return self.store.directory

    def publish(self, body, persistent=True, **props) -> int:
        """The number of the persister batch the message joined (0: none to wait for)."""
        settlement = self.queue.publish(message(body, persistent, **props))
        return settlement.number if isinstance(settlement, StoreBatch) else 0

    def publish_many(self, numbers, persistent=True, size=100):
        for i in numbers:
            self.publish(body_of(i, size), persistent)
        self.persister.flush()

    def get(self, ack=True):
        """The next ready message, delivered for a manual ack (and acked if `ack`)."""
        qm = self.queue.get()
        if qm is None:
            return None
        self.queue.delivered(qm, no_ack=False)
        if ack:
            self.queue.ack(qm)
        return qm

    def drain(self):
        got = []
        while (qm := self.get()) is not None:
            got.append(qm)
        self.persister.flush()
        return got

    def seg_files(self):
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.dir, "*.seg")))

    def crash(self, window=None) -> "Store":
        """Abandon this store (flushing what a tick would have written) and recover another."""
        self.persister.flush()
        return Store(self.root, durable=True, window=window)


def bodies(qms):
    return [qm.message.body for qm in qms]


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setattr(sg, "SEGMENT_SIZE", 4096)


# --------------------------------------------------------------------------- order

def test_order_across_segment_boundaries_and_reclaim(tmp_path, small_segments):
    s = Store(tmp_path, window=10)
    s.publish_many(range(300))
    assert len(s.queue.store) == 300
    assert len(s.seg_files()) > 5  # 300 records of ~140 bytes in 4 KiB segments
    got = s.drain()
    assert bodies(got) == [body_of(i) for i in range(300)]
    assert not any(qm.redelivered for qm in got)
    assert len(s.queue.store) == 0 and s.store.ready_bytes == 0
    # Every record is settled: only the segment still open for writing remains.
    assert s.seg_files() == [sg.segment_name(max(s.store.segments))]
    assert len(s.store.segments) == 1


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient-queue"])
def test_paging_mixed_persistent_and_transient(tmp_path, small_segments, durable):
    s = Store(tmp_path, durable=durable, window=8)
    expected = []
    for i in range(200):
        s.publish(body_of(i), persistent=i % 3 == 0)
        expected.append(body_of(i))
        if i % 50 == 49:
            s.persister.flush()
    s.persister.flush()
    assert len(s.queue.store) == 200
    # Beyond the window everything lives on disk, transient messages included.
    assert len(s.store._fresh) == 8 and s.store.disk_count == 192
    where = os.path.join(str(tmp_path), "queues" if durable else "paging")
    assert os.path.commonpath([where, s.dir]) == where
    assert len(s.seg_files()) > 3
    # Publishing while the tail is read back keeps the order.
    got = [s.get() for _ in range(50)]
    s.publish_many(range(200, 260), persistent=False)
    expected += [body_of(i) for i in range(200, 260)]
    got += s.drain()
    assert bodies(got) == expected
    assert len(s.seg_files()) == 1


def test_large_records_in_the_disk_tail(tmp_path, small_segments):
    # records larger than a segment and than the store's read chunk, among small ones
    sizes = [100, 3 << 20, 50, 5000, (1 << 20) + 3, 10, 0, 2 << 20, 7]
    s = Store(tmp_path, window=1)
    for i, size in enumerate(sizes):
        s.publish(bytes([i]) * size, persistent=i % 2 == 0)
    s.persister.flush()
    assert s.store.disk_count == len(sizes) - 1
    assert [len(b) for b in bodies(s.drain())] == sizes
    s.publish_many(range(3))
    r = s.crash(window=1)
    assert bodies(r.drain()) == [body_of(i) for i in range(3)]


def test_big_bodies_page_past_the_byte_window(tmp_path, monkeypatch):
    """Past WINDOW_BYTES of bodies in memory, big bodies page out whatever their number, are
    read back in order, and the window refills by bytes, not by count."""
    from warren.store import disk
    monkeypatch.setattr(disk, "WINDOW_BYTES", 1 << 20)
    s = Store(tmp_path, durable=False)
    big = [bytes([i]) * ((256 << 10) + i) for i in range(12)]
    for i, data in enumerate(big):
        s.publish(data, persistent=i % 3 == 0)
    s.persister.flush()
    assert s.store.fresh_bytes <= (1 << 20) + (256 << 10) + 12
    assert s.store.disk_count == len(big) - 4
    got = []
    while (qm := s.get()) is not None:
        got.append(qm.message.body)
        assert s.store.fresh_bytes <= (1 << 20) + (256 << 10) + 12
    assert got == big


def test_requeue_order(tmp_path, small_segments):
    s = Store(tmp_path, window=4)
    s.publish_many(range(40))
    taken = [s.get(ack=False) for _ in range(10)]  # 4 from memory, then from the disk tail
    for qm in (taken[7], taken[2], taken[9], taken[0]):
        s.queue.reject(qm, requeue=True)
    s.persister.flush()
    assert len(s.queue.store) == 34
    got = [s.get() for _ in range(6)]
    assert bodies(got) == [body_of(i) for i in (0, 2, 7, 9, 10, 11)]
    assert [qm.redelivered for qm in got] == [True, True, True, True, False, False]
    assert [qm.deliveries for qm in got] == [2, 2, 2, 2, 1, 1]
    for qm in taken:
        if qm.seg is not None:
            s.queue.ack(qm)
    assert bodies(s.drain()) == [body_of(i) for i in range(12, 40)]
    assert len(s.seg_files()) == 1


# ------------------------------------------------------------------------ recovery

def test_recovery_after_crash(tmp_path, small_segments):
    s = Store(tmp_path, window=5)
    for i in range(60):
        s.publish(body_of(i), persistent=i % 4 != 3,
                  headers={"n": i}, content_type="text/plain", message_id=f"id-{i}", priority=3)
    s.persister.flush()
    acked = [s.get() for _ in range(10)]              # 0..9 acked
    unacked = [s.get(ack=False) for _ in range(5)]    # 10..14 delivered, not acked
    assert bodies(acked + unacked) == [body_of(i) for i in range(15)]
    r = s.crash(window=5)
    persistent = [i for i in range(60) if i % 4 != 3]
    expected = [i for i in persistent if i >= 10]
    assert len(r.queue.store) == len(expected)
    got = r.drain()
    assert bodies(got) == [body_of(i) for i in expected]
    assert [qm.redelivered for qm in got] == [i < 15 for i in expected]
    assert [qm.deliveries for qm in got] == [2 if i < 15 else 1 for i in expected]  # 1 before the crash
    props = got[0].message.properties
    assert props["headers"] == {"n": 10} and props["message_id"] == "id-10"
    assert (props["content_type"], props["priority"], props["delivery_mode"]) == ("text/plain", 3, 2)
    assert got[0].message.routing_key == "q" and got[0].message.route == ROUTE
    # Everything was acked: the next start finds nothing (and removes the settled files).
    r2 = r.crash()
    assert len(r2.queue.store) == 0
    assert r2.seg_files() == []


def test_delivery_count_survives_restarts(tmp_path):
    s = Store(tmp_path)
    s.publish_many(range(3))
    for _ in range(3):  # message 0 delivered and requeued three times
        qm = s.get(ack=False)
        s.queue.reject(qm, requeue=True)
    qm = s.get(ack=False)  # a fourth delivery, unacked at the crash
    assert qm.deliveries == 4
    r = s.crash()
    qm = r.get(ack=False)
    assert (qm.message.body, qm.redelivered, qm.deliveries) == (body_of(0), True, 5)
    r.queue.reject(qm, requeue=True)
    r2 = r.crash()
    got = r2.drain()
    assert [(qm.message.body, qm.redelivered, qm.deliveries) for qm in got] == [
        (body_of(0), True, 6), (body_of(1), False, 1), (body_of(2), False, 1)]


def test_recovered_messages_keep_their_place_when_requeued(tmp_path):
    s = Store(tmp_path)
    s.publish_many(range(3))
    r = s.crash()
    r.publish_many(range(3, 5))
    first = r.get(ack=False)
    second = r.get(ack=False)
    r.queue.reject(second, requeue=True)
    r.queue.reject(first, requeue=True)
    assert bodies(r.drain()) == [body_of(i) for i in range(5)]


def test_transient_messages_and_queues_do_not_survive(tmp_path, small_segments):
    t = Store(tmp_path, durable=False, window=2, name="tq")
    t.publish_many(range(50), persistent=True)  # persistent, but in a transient queue
    assert t.seg_files()
    s = Store(tmp_path, window=2)
    s.publish_many(range(50), persistent=False)  # paged out, but transient
    assert len(s.seg_files()) > 1
    r = s.crash()
    assert len(r.queue.store) == 0
    r.persister.clean_start([("/", "q")])
    assert not os.path.exists(os.path.join(str(tmp_path), "paging"))


def test_clean_start_removes_deleted_queues(tmp_path):
    a = Store(tmp_path, name="a")
    b = Store(tmp_path, name="b")
    a.publish_many(range(3))
    b.publish_many(range(3))
    Persister(str(tmp_path)).clean_start([("/", "a")])
    assert os.path.isdir(a.dir) and not os.path.exists(b.dir)


def test_torn_tail_is_truncated(tmp_path):
    s = Store(tmp_path)
    s.publish_many(range(5))
    path = os.path.join(s.dir, s.seg_files()[-1])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 10)  # the last record loses its end
    r = s.crash()
    assert os.path.getsize(path) == size - len(body_of(4)) - 41  # the torn record is cut off
    assert bodies(r.drain()) == [body_of(i) for i in range(4)]


# ---------------------------------------------------------------------- reclaiming

def test_settled_segments_are_deleted(tmp_path, small_segments):
    s = Store(tmp_path, window=1000)
    s.publish_many(range(100))
    files = s.seg_files()
    assert len(files) > 3
    held = [s.get(ack=False) for _ in range(100)]
    s.persister.flush()
    for qm in held[:60]:
        s.queue.ack(qm)
    s.persister.flush()
    remaining = s.seg_files()
    # Segments whose records are all acked are gone; the others stay, with their ack files.
    assert remaining == [f for f in files if any(qm.seg and qm.seg.path.endswith(f) for qm in held[60:])]
    for f in remaining[:-1]:
        assert os.path.exists(os.path.join(s.dir, f[:-4] + ".ack"))
    for qm in held[60:]:
        s.queue.reject(qm, requeue=False)
    s.persister.flush()
    assert s.seg_files() == [files[-1]]  # the write segment
    assert s.crash().queue.store.__len__() == 0


def test_purge_of_disk_tail(tmp_path, small_segments):
    s = Store(tmp_path, window=10)
    s.publish_many(range(200))
    held = [s.get(ack=False) for _ in range(3)]
    assert s.queue.purge() == 197
    s.persister.flush()
    assert len(s.queue.store) == 0 and s.store.disk_count == 0 and s.store.ready_bytes == 0
    # Left: the segment holding the unacked messages and the write segment.
    assert s.seg_files() == sorted({os.path.basename(held[0].seg.path), sg.segment_name(max(s.store.segments))})
    r = s.crash(window=10)
    assert [(qm.message.body, qm.redelivered) for qm in r.drain()] == [(body_of(i), True) for i in range(3)]
    # New messages after a purge land behind it.
    s.publish_many(range(500, 530))
    for qm in held:
        s.queue.ack(qm)
    assert bodies(s.drain()) == [body_of(i) for i in range(500, 530)]
    assert len(s.seg_files()) == 1


def test_destroy_removes_directory(tmp_path, small_segments):
    s = Store(tmp_path, window=3)
    s.publish_many(range(50))
    s.get(ack=False)
    assert os.path.isdir(s.dir)
    s.store.destroy()
    s.persister.flush()
    assert not os.path.exists(s.dir)


# -------------------------------------------------------------------- group commit

class DeferredThread:
    """A run_in_thread that holds each fsync job until run() is called."""

    def __init__(self):
        self.jobs = []

    def __call__(self, job, done):
        self.jobs.append((job, done))

    def run(self):
        job, done = self.jobs.pop(0)
        try:
            job()
            done(None)
        except OSError as err:
            done(str(err))


class FakeChannel:
    def __init__(self):
        self.calls = 0

    def store_synced(self):
        self.calls += 1


def test_group_commit_batches(tmp_path):
    s = Store(tmp_path)
    thread = DeferredThread()
    p = s.persister
    p.run_in_thread = thread
    ch = FakeChannel()
    b1 = s.publish(b"one")
    assert s.publish(b"transient", persistent=False) == 0
    p.wait_for(ch)
    p.flush()  # written and an fsync started for batch b1
    assert p.syncing and len(thread.jobs) == 1 and p.synced < b1
    b2 = s.publish(b"two")
    b3 = s.publish(b"three")
    assert b2 == b3 == b1 + 1
    p.flush()  # no second fsync while one runs
    assert len(thread.jobs) == 1
    p.wait_for(ch)
    thread.run()
    assert p.synced == b1 and ch.calls == 1
    assert len(thread.jobs) == 1  # the next batch started at once
    thread.run()
    assert p.synced == b2 and not p.syncing and not p.failed
    # An idle persister starts nothing.
    p.flush()
    assert not thread.jobs


def test_write_failure_marks_the_batch_failed(tmp_path):
    s = Store(tmp_path)
    p = s.persister
    good = s.publish(b"good")
    p.flush()
    assert p.synced == good and not p.failed
    seg = s.store.write_seg
    real_fd = seg.fd
    seg.fd = os.open(os.devnull, os.O_RDONLY)  # writes now fail (EBADF)
    bad = s.publish(b"bad")
    p.flush()
    assert p.synced == bad and bad in p.failed and good not in p.failed
    # The bytes are kept and written once writing works again.
    os.close(seg.fd)
    seg.fd = real_fd
    later = s.publish(b"later")
    p.flush()
    assert later not in p.failed
    r = s.crash()
    assert bodies(r.drain()) == [b"good", b"bad", b"later"]


# ---------------------------------------------------------------------- corruption

def test_bad_header_in_last_segment_is_quarantined_and_its_id_reused(tmp_path, small_segments):
    s = Store(tmp_path, window=10)
    s.publish_many(range(60))
    files = s.seg_files()
    last = os.path.join(s.dir, files[-1])
    with open(last, "r+b") as f:
        f.write(b"XXXXXXXX")
    r = s.crash(window=10)
    quarantined = os.listdir(os.path.join(str(tmp_path), "quarantine"))
    assert quarantined == [f"{os.path.basename(s.dir)}-{files[-1]}"]
    assert r.seg_files() == files[:-1]
    kept = len(r.queue.store)
    assert 0 < kept < 60
    # New messages go to a new segment (the quarantined one's id is free again).
    r.publish_many(range(100, 105))
    assert bodies(r.drain()) == [body_of(i) for i in range(kept)] + [body_of(i) for i in range(100, 105)]


def test_segment_created_just_before_a_crash_is_not_corruption(tmp_path):
    s = Store(tmp_path)
    s.publish_many(range(3))
    empty = os.path.join(s.dir, sg.segment_name(2))
    open(empty, "wb").close()  # created by a roll, killed before its first write
    r = s.crash()
    assert not os.path.exists(os.path.join(str(tmp_path), "quarantine"))
    assert not os.path.exists(empty)
    r.publish_many([3])
    assert bodies(r.drain()) == [body_of(i) for i in range(4)]


def _rewrite_as_v1(path: str) -> None:
    """Turn a segment into the first format (WRNSEG1, crc32 checksums), record by record."""
    import zlib
    with open(path, "rb") as f:
        data = f.read()
    records, end, problem = sg.scan(data)
    assert problem is None and records
    out = bytearray(sg.MAGIC_V1)
    for offset, _flags, _seq in records:
        length, _crc = sg.RECORD_PREFIX.unpack_from(data, offset)
        rest = data[offset + sg.PREFIX_SIZE:offset + sg.PREFIX_SIZE + length]
        out += sg.RECORD_PREFIX.pack(length, zlib.crc32(rest)) + rest
    with open(path, "wb") as f:
        f.write(out)


def test_segments_of_the_first_format_are_recovered(tmp_path, small_segments):
    """Segments written before the xxh3 checksum (WRNSEG1, crc32) are read after an upgrade,
    and a corrupt one is still detected by its crc32."""
    s = Store(tmp_path)
    s.publish_many(range(30), size=3000)
    files = s.seg_files()
    assert len(files) > 1
    for name in files:
        _rewrite_as_v1(os.path.join(s.dir, name))
    s2 = s.crash()
    assert bodies(s2.drain()) == [body_of(i, 3000) for i in range(30)]

    s3 = Store(tmp_path / "other")
    s3.publish_many(range(5), size=3000)
    path = os.path.join(s3.dir, s3.seg_files()[-1])
    _rewrite_as_v1(path)
    with open(path, "r+b") as f:  # one flipped byte in the last record's body
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes((byte[0] ^ 0xFF,)))
    assert bodies(s3.crash().drain()) == [body_of(i, 3000) for i in range(4)]


def test_failed_writes_count_for_flow_and_a_removed_segment_releases_it(tmp_path, monkeypatch):
    """Bytes a failed write keeps in memory put the store over its flow mark (publishers are
    held); once that queue is deleted, the next flush finds nothing stuck and releases them."""
    import errno
    s = Store(tmp_path)
    p = s.persister
    p.flow_high, p.flow_low = 100_000, 50_000
    events = []
    p.subscribe_flow(events.append)
    real = os.pwritev

    def fail(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwritev", fail)
    for i in range(2000):
        s.publish(body_of(i, 100))
    p.flush()
    assert p.stuck > p.flow_high and p.over and events == [True] and p.written
    monkeypatch.setattr(os, "pwritev", real)
    s.store.destroy()  # the queue deleted to free space
    p.flush()
    assert (p.stuck, p.over, events) == (0, False, [True, False])


def test_delivery_count_marks():
    """A count pair ('C' + 'N') adds its count to the record's deliveries; an 'N' without its
    'C' (torn) counts for nothing, and 'D' marks still add one each."""
    data = (sg.encode_mark(sg.MARK_DELIVERED, 8) + sg.encode_mark(sg.MARK_COUNT, 8)
            + sg.encode_mark(sg.MARK_COUNT_VALUE, 41) + sg.encode_mark(sg.MARK_COUNT_VALUE, 7)
            + sg.encode_mark(sg.MARK_COUNT, 99) + sg.encode_mark(sg.MARK_ACK, 99))
    acked, delivered, problem = sg.read_marks(data)
    assert (acked, delivered, problem) == ({99}, {8: 42}, None)
