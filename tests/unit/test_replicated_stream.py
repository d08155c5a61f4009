"""A stream's replica on a cluster member (warren/store/replicated_stream.py): readers see
committed offsets only (the leader's commit point; on a follower, what its leader said and its
own disk holds), chunks and their times survive a restart, a divergent tail leaves the index,
retention by size and age gives the cursor whole segments go below, and a record-batch read is
the entries' payloads as stored."""

from __future__ import annotations

import time
import types

from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.store import segments as sg
from warren.store.persister import Persister
from warren.store import replicated_stream
from warren.store.replica_log import ReplicaLog
from warren.store.replicated_stream import STAMP_GRAIN, ChunkIndex, ReplicatedStream


def open_stream(tmp_path, segment_size: int = 1 << 20, leading: bool = True) -> tuple[Persister, ReplicatedStream]:
    persister = Persister(str(tmp_path))
    chunks = ChunkIndex()
    log_ = ReplicaLog(persister, str(tmp_path / "replica"), segment_size, chunks.scanned)
    stream = ReplicatedStream(log_, 1, chunks)
    if leading:
        stream.lead(1)
    return persister, stream


def message(n: int) -> Message:
    return Message("", "s", shortstr("") + shortstr("s"), b"header-%d" % n, b"body-%d" % n)


def bodies(stream: ReplicatedStream, offset: int = 0) -> list[tuple[int, bytes]]:
    reader = stream.reader(offset)
    out = []
    while taken := reader.take(1000):
        out.extend((o, bytes(m.body)) for o, m in taken)
    return out


def test_readers_see_what_is_committed_and_appends_are_confirmed_then(tmp_path):
    persister, stream = open_stream(tmp_path)
    commits = []
    stream.on_commit = lambda: commits.append(stream.committed)
    points = [stream.append(message(n)) for n in range(3)]
    persister.flush()
    assert stream.log.durable == 3
    assert bodies(stream) == [] and stream.count == 0 and points[0].status() is None  # (on disk, not committed)
    stream.commit(2)
    assert bodies(stream) == [(0, b"body-0"), (1, b"body-1")] and commits == [2]
    assert stream.count == 2 and stream.last_offset == 1
    stream.commit(3)
    assert [p.status() for p in points] == [True, True, True]


def test_a_follower_reads_what_its_leader_committed_and_its_disk_holds(tmp_path):
    persister, leader = open_stream(tmp_path / "a")
    for n in range(4):
        leader.append(message(n))
    persister.flush()
    f_persister, follower = open_stream(tmp_path / "b", leading=False)
    assert follower.append(message(9)).status() is False  # (a follower takes no publish: a nack)
    for entry in leader.log.entries(0):
        follower.chunks.scanned(follower.log.append(entry.epoch, entry.kind, entry.payload), entry.payload)
    follower.leader_says(3)
    assert follower.committed == 0  # (not on its disk yet)
    f_persister.flush()
    follower.durable_moved()
    assert bodies(follower) == [(0, b"body-0"), (1, b"body-1"), (2, b"body-2")]
    leader.commit(3)
    assert follower.last_chunk == leader.last_chunk == 0  # (one group commit: one chunk, the same offsets)


def test_chunks_and_their_times_survive_a_restart_and_a_cut(tmp_path):
    persister, stream = open_stream(tmp_path)
    starts = []
    for chunk in range(3):
        starts.append(stream.log.end)
        for n in range(2):
            stream.append(message(chunk * 2 + n))
        persister.flush()  # (a group commit ends a chunk)
        time.sleep(STAMP_GRAIN / 1000 + 0.02)
    stream.commit(stream.log.end)
    assert starts == [0, 2, 4] and stream.last_chunk == 4
    stamps = list(stream.chunks.stamps)
    assert len(stamps) == 3 and stream.first_timestamp == stamps[0]
    assert stream.offset_at(stamps[1]) == 2 and stream.offset_at(stamps[2] + 1) == 6
    _, again = open_stream(tmp_path)
    assert list(again.chunks.offsets) == [0, 2, 4] and list(again.chunks.stamps) == stamps
    assert again.committed == 0 and again.last_chunk is None  # (committed again by its leader)
    again.commit(3)
    assert again.last_chunk == 2 and bodies(again, 1) == [(1, b"body-1"), (2, b"body-2")]
    again.log.truncate(4)  # (an uncommitted tail its new leader does not have)
    again.truncated(4)
    assert list(again.chunks.offsets) == [0, 2] and again.last_chunk == 2


def test_retention_gives_the_cursor_below_which_whole_segments_go(tmp_path):
    persister, stream = open_stream(tmp_path, segment_size=400)
    for n in range(20):
        stream.append(message(n))
        persister.flush()
    stream.commit(20)
    segments = stream.log.segments
    assert len(segments) > 3
    assert stream.release_cursor() == 0  # (no limit)
    stream.set_retention(stream.total_bytes - segments[0].size, None, 400)
    assert stream.release_cursor() == segments[1].first  # (one segment less fits)
    stream.set_retention(None, 60_000, 400)
    assert stream.release_cursor() == 0  # (nothing a minute old)
    stream.max_age_ms = 0
    time.sleep(STAMP_GRAIN / 1000 + 0.02)  # (chunk times are known to the grain)
    assert stream.release_cursor() == segments[-1].first  # (all but the last)
    stream.log.drop_before(segments[-1].first)
    stream.released()
    reader = stream.reader(0)
    assert reader.take(100)[0][0] == stream.first_offset == stream.log.first


def test_chunks_within_one_grain_age_with_the_first_of_them(tmp_path, monkeypatch):
    """Chunks appended faster than the grain are known by the first's time: a later chunk (CI
    found it) must not make them look as young as itself. (The stream's clock is the test's:
    under load, twelve appends took longer than a grain.)"""
    clock = [1_800_000_000.0]
    monkeypatch.setattr(replicated_stream, "time", types.SimpleNamespace(time=lambda: clock[0]))
    persister, stream = open_stream(tmp_path, segment_size=400)
    for n in range(12):  # (each its own chunk, all within one grain: one index entry)
        stream.append(message(n))
        persister.flush()
    clock[0] += 0.35  # (past the grain and max-age: 100 + 200 ms)
    stream.append(message(12))
    persister.flush()
    stream.commit(13)
    segments = stream.log.segments
    assert len(segments) >= 3 and len(stream.chunks.stamps) == 2
    stream.set_retention(None, 200, 400)
    assert stream.release_cursor() == segments[-1].first  # (all but the newest, which must stay)


def test_record_batches_are_the_payloads_as_stored(tmp_path):
    persister, stream = open_stream(tmp_path)
    for n in range(5):
        stream.append(message(n))
    persister.flush()
    stream.commit(5)
    first, count, records = stream.reader(1).take_records(1 << 20)
    assert (first, count) == (1, 4)
    pos, seen = 0, []
    while pos < len(records):
        record = sg.read_record(records, pos)
        seen.append((record.seq, record.body))
        pos = record.end
    assert seen == [(n, b"body-%d" % n) for n in range(1, 5)]
