"""A stream's log (warren.store.stream): offsets, chunks, committed offsets, readers, the
sparse index, retention and recovery after a clean stop, a torn tail or a damaged index."""

import os

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.amqp.properties import encode_header
from warren.store import segments as sg
from warren.store import stream as st
from warren.store.persister import Persister

from .fake_transport import ManualFsync


def message(body: bytes, rk: str = "s") -> Message:
    return Message("", rk, shortstr("") + shortstr(rk), encode_header(len(body), {}), body)


@pytest.fixture
def persister(tmp_path):
    return Persister(str(tmp_path))


def new_log(persister, name="s") -> st.StreamLog:
    return st.StreamLog(persister, os.path.join(persister.root, name))


def append(log, bodies) -> None:
    """Append and commit (one flush: one chunk, one fsync)."""
    for body in bodies:
        log.append(message(body))
    log.persister.flush()


def read_all(log, offset=0, count=10**6) -> list[tuple[int, bytes]]:
    reader = log.reader(offset)
    out = []
    while True:
        got = reader.take(count - len(out))
        if not got:
            return out
        out += [(o, m.body) for o, m in got]


def test_offsets_chunks_and_reading(persister):
    log = new_log(persister)
    append(log, [b"a", b"b", b"c"])
    append(log, [b"d"])
    assert (log.first_offset, log.committed, log.next_offset) == (0, 4, 4)
    assert log.last_chunk == 3 and log.last_offset == 3 and log.count == 4
    assert read_all(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert read_all(log, 2) == [(2, b"c"), (3, b"d")]
    assert read_all(log, 99) == []  # clamped to the end: waits there
    reader = log.reader(1)
    assert [o for o, _ in reader.take(2)] == [1, 2]
    assert [o for o, _ in reader.take(5)] == [3] and reader.caught_up


def test_readers_see_committed_offsets_only(tmp_path):
    fsync = ManualFsync()
    persister = Persister(str(tmp_path), run_in_thread=fsync)
    log = new_log(persister)
    commits = []
    log.on_commit = lambda: commits.append(log.committed)
    log.append(message(b"x"))
    persister.flush()  # written, fsync running
    reader = log.reader(0)
    assert log.next_offset == 1 and log.committed == 0 and reader.take(10) == []
    assert log.last_chunk is None and log.last_offset is None
    log.append(message(b"y"))
    persister.flush()  # joins the next batch
    fsync.finish()
    assert commits == [1] and [o for o, _ in reader.take(10)] == [0]
    fsync.finish()
    assert commits == [1, 2] and [o for o, _ in reader.take(10)] == [1]


def test_a_failed_fsync_commits_nothing_until_written_again(tmp_path):
    fsync = ManualFsync()
    persister = Persister(str(tmp_path), run_in_thread=fsync)
    log = new_log(persister)
    log.append(message(b"x"))
    persister.flush()
    fsync.finish(error="EIO")
    assert log.committed == 0  # re-joined the open batch
    persister.flush()
    fsync.finish()
    assert log.committed == 1


def test_segments_roll_and_the_index_finds_offsets(persister, monkeypatch):
    monkeypatch.setattr(st, "INDEX_SPACING", 500)
    log = new_log(persister)
    log.set_retention(None, None, 4000)
    for i in range(200):
        append(log, [b"%03d" % i + b"." * 97])  # a chunk each
    assert len(log.segments) > 3
    assert all(seg.index and seg.index[0][0] == seg.first for seg in log.segments)
    assert sum(len(seg.index) for seg in log.segments) < 200  # sparse
    for start in (0, 1, 57, 150, 199):
        got = read_all(log, start, 3)
        assert [o for o, _ in got] == list(range(start, min(start + 3, 200)))
        assert got[0][1].startswith(b"%03d" % start)


def test_big_bodies_are_read_whole(persister):
    log = new_log(persister)
    big = os.urandom(st.READ_SIZE * 2 + 5)
    append(log, [b"small", big, b"after"])
    assert read_all(log) == [(0, b"small"), (1, big), (2, b"after")]


def test_retention_by_size_removes_whole_segments_from_the_head(persister):
    log = new_log(persister)
    log.set_retention(10_000, None, 3000)
    reader = log.reader(0)
    assert [o for o, _ in reader.take(0)] == []
    for i in range(100):
        append(log, [b"%03d" % i + b"." * 197])
    assert log.total_bytes <= 10_000 + 3000 + 300
    assert log.first_offset > 0 and log.segments[0].first == log.first_offset
    got = read_all(log)
    assert got[0][0] == log.first_offset and got[-1][0] == 99
    assert [o for o, _ in got] == list(range(log.first_offset, 100))  # whole segments: no hole
    assert [o for o, _ in reader.take(1)] == [log.first_offset]  # a reader left behind goes on


def test_retention_by_age(persister, monkeypatch):
    now = [1_000_000_000_000]
    monkeypatch.setattr(st, "_now_ms", lambda: now[0])
    log = new_log(persister)
    log.set_retention(None, 60_000, 1000)
    for i in range(30):
        append(log, [b"." * 300])
        now[0] += 10_000  # 10 s between chunks
    assert log.first_offset > 0  # at each roll
    now[0] += 30_000
    log.apply_retention()  # (the queue's timer): the head goes once its successor is too old
    assert log.segments[1].index[0][2] >= now[0] - 60_000
    assert log.segments[0].index[0][2] < now[0] - 60_000 or len(log.segments) == 1
    first = log.first_offset
    now[0] += 3600_000
    log.apply_retention()
    assert len(log.segments) == 1 and log.first_offset > first  # never the segment being written


def test_offset_by_time(persister, monkeypatch):
    now = [1_000_000_000_000]
    monkeypatch.setattr(st, "_now_ms", lambda: now[0])
    monkeypatch.setattr(st, "INDEX_SPACING", 10_000)  # few entries: between them the chunks are walked
    log = new_log(persister)
    log.set_retention(None, None, 2000)
    for i in range(20):
        append(log, [b"a" * 100, b"b" * 100])  # chunks at offsets 0, 2, 4, ...
        now[0] += 1000
    assert log.offset_at(0) == 0
    assert log.offset_at(1_000_000_000_000 + 5000) == 10
    assert log.offset_at(1_000_000_000_000 + 4500) == 10
    assert log.offset_at(now[0]) == log.next_offset


def test_recovery_after_a_stop(persister):
    log = new_log(persister)
    log.set_retention(None, None, 3000)
    for i in range(50):
        append(log, [b"%02d" % i + b"." * 200])
    log.track("job", 17)
    log.save_tracking()
    again = new_log(Persister(persister.root))
    assert (again.first_offset, again.next_offset, again.committed) == (0, 50, 50)
    assert again.last_chunk == 49 and again.tracked == {"job": 17}
    assert read_all(again, 10, 2) == read_all(log, 10, 2)
    append(again, [b"new"])
    assert read_all(again, 50) == [(50, b"new")]


def test_a_torn_tail_is_cut_and_its_offsets_reused_once(persister):
    log = new_log(persister)
    append(log, [b"one", b"two", b"three"])
    seg = log.segments[-1]
    os.truncate(seg.path, seg.size - 2)  # the last record, cut by a crash
    with open(seg.index_path, "ab") as f:
        f.write(b"\x01" * 7)  # and a torn index entry
    again = new_log(Persister(persister.root))
    assert again.next_offset == 2 and read_all(again) == [(0, b"one"), (1, b"two")]
    append(again, [b"three again"])
    assert read_all(again) == [(0, b"one"), (1, b"two"), (2, b"three again")]


def test_a_damaged_index_is_rebuilt_from_the_records(persister, monkeypatch):
    monkeypatch.setattr(st, "INDEX_SPACING", 100)
    log = new_log(persister)
    for i in range(40):
        append(log, [b"%02d" % i + b"." * 60])
    seg = log.segments[0]
    with open(seg.index_path, "r+b") as f:
        f.seek(st.INDEX_ENTRY * 3 + 5)
        f.write(b"\xff\xff")  # entry 3 no longer checks: it and those after are not trusted
    again = new_log(Persister(persister.root))
    assert len(again.segments[0].index) >= 3
    assert read_all(again, 33, 2) == [(33, b"33" + b"." * 60), (34, b"34" + b"." * 60)]


def test_a_segment_created_just_before_a_crash_keeps_the_next_offset(persister):
    log = new_log(persister)
    append(log, [b"a"])
    path = os.path.join(log.directory, sg.segment_name(1))
    with open(path, "wb") as f:
        f.write(sg.MAGIC[:3])
    again = new_log(Persister(persister.root))
    assert again.next_offset == 1 and not os.path.exists(path)
    append(again, [b"b"])
    assert read_all(again) == [(0, b"a"), (1, b"b")]


def read_records(log, offset=0, max_bytes=1000) -> list[tuple[int, int, bytes]]:
    """take_records() until caught up: [(first offset, count, records)]."""
    reader = log.reader(offset)
    out = []
    while (got := reader.take_records(max_bytes)) is not None:
        out.append(got)
    return out


def entries(batch: bytes) -> list[tuple[int, bytes]]:
    records = pytest.importorskip("warren.spark.records").Records()
    return [(offset, body) for offset, _x, _rk, _props, body in records.decode([batch]).rows()]


def test_record_batches_across_segments_from_any_offset(persister, monkeypatch):
    """take_records: the stored records from the reader's offset (inside an index entry's
    run), about max_bytes a batch (at least one record), within one segment, committed only."""
    monkeypatch.setattr(st, "INDEX_SPACING", 500)
    log = new_log(persister)
    log.set_retention(None, None, 4000)
    for i in range(0, 200, 4):
        append(log, [b"%03d" % j + b"." * 97 for j in range(i, i + 4)])  # chunks of 4
    assert len(log.segments) > 3
    for start, size in ((0, 1000), (1, 1), (57, 300), (150, 10**6), (199, 1000)):
        got = read_records(log, start, size)
        seen = [e for _first, _count, batch in got for e in entries(batch)]
        assert [o for o, _ in seen] == list(range(start, 200))
        assert all(body.startswith(b"%03d" % o) for o, body in seen)
        for first, count, batch in got:
            parsed = entries(batch)
            assert (first, count) == (parsed[0][0], len(parsed))
            assert len(batch) - len(parsed[-1][1]) - 150 < size or count == 1  # (a record is ~150 bytes)
            assert log.segment_for(first) is log.segment_for(first + count - 1)
    log.append(message(b"not committed"))
    [(first, count, batch)] = read_records(log, 199)
    assert (first, count) == (199, 1) and [o for o, _ in entries(batch)] == [199]


def test_record_batches_hold_big_records_whole_and_skip_what_retention_removed(persister):
    log = new_log(persister)
    big = os.urandom(st.READ_SIZE * 2 + 5)
    append(log, [b"small", big, b"after"])
    assert [entries(b) for _f, _c, b in read_records(log, 0, 10)] == [[(0, b"small")], [(1, big)], [(2, b"after")]]
    kept = new_log(persister, "kept")
    kept.set_retention(10_000, None, 3000)
    reader = kept.reader(0)
    for i in range(100):
        append(kept, [b"%03d" % i + b"." * 197])
    first, _count, batch = reader.take_records(1000)
    assert first == kept.first_offset > 0 and entries(batch)[0][0] == first
