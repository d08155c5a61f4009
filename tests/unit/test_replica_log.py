"""A replicated queue's log on disk (warren/store/replica_log.py): entries durable through the
persister's group commit, read back by offset after a restart, a torn tail cut, a divergent
tail truncated (and entries written again at its offsets), whole segments dropped below the
release cursor, the epoch history rebuilt from the records."""

from __future__ import annotations

import os

import pytest

from warren.amqp.body import SplitBody
from warren.store.persister import Persister
from warren.store.replica_log import ReplicaLog


def open_log(tmp_path, segment_size: int = 1 << 20) -> tuple[Persister, ReplicaLog]:
    persister = Persister(str(tmp_path))
    return persister, ReplicaLog(persister, str(tmp_path / "replica"), segment_size)


def test_entries_are_durable_after_the_group_commit_and_read_back_after_a_restart(tmp_path):
    persister, replica = open_log(tmp_path)
    told = []
    replica.on_durable = told.append
    assert [replica.append(1, 7, b"a" * n) for n in range(3)] == [0, 1, 2]
    assert replica.durable == 0 and replica.read(2).payload == b"aa"  # (readable before it is written)
    persister.flush()  # (inline fsync: the batch is safe)
    assert replica.durable == 3 and told == [3]
    replica.append(2, 8, b"head:", SplitBody([b"bo", b"dy"], 4))
    persister.sync_now()
    _, again = open_log(tmp_path)
    assert (again.first, again.end, again.durable) == (0, 4, 4)
    assert again.history.starts == [(1, 0), (2, 3)]
    assert [tuple(e) for e in again.entries(0)] == [(0, 1, 7, b""), (1, 1, 7, b"a"), (2, 1, 7, b"aa"),
                                                      (3, 2, 8, b"head:body")]


def test_a_torn_tail_is_cut_at_start(tmp_path):
    persister, replica = open_log(tmp_path)
    for n in range(5):
        replica.append(1, 1, bytes([n]) * 100)
    persister.sync_now()
    path = replica.segments[-1].path
    os.truncate(path, os.path.getsize(path) - 30)  # (a crash in the middle of the last write)
    _, again = open_log(tmp_path)
    assert again.end == 4 and again.read(3).payload == b"\x03" * 100
    assert again.append(1, 1, b"next") == 4


def test_a_damaged_record_ends_the_log_there(tmp_path):
    persister, replica = open_log(tmp_path)
    for n in range(5):
        replica.append(1, 1, bytes([n]) * 100)
    persister.sync_now()
    seg = replica.segments[-1]
    with open(seg.path, "r+b") as f:
        f.seek(seg.positions[2] + 30)
        f.write(b"\xff")
    _, again = open_log(tmp_path)
    assert again.end == 2


def test_a_divergent_tail_is_cut_and_its_offsets_written_again(tmp_path):
    persister, replica = open_log(tmp_path, segment_size=300)
    for n in range(10):
        replica.append(1, 1, bytes([n]) * 100)  # (about three entries per segment)
    persister.sync_now()
    segments = len(replica.segments)
    replica.truncate(4)
    assert (replica.end, replica.durable) == (4, 4) and len(replica.segments) < segments
    assert replica.append(2, 1, b"new") == 4
    replica.append(2, 1, b"newer")
    persister.sync_now()
    assert replica.durable == 6
    _, again = open_log(tmp_path, segment_size=300)
    assert again.end == 6 and again.history.starts == [(1, 0), (2, 4)]
    assert [e.payload for e in again.entries(3)] == [b"\x03" * 100, b"new", b"newer"]


def test_a_cut_of_entries_not_written_yet(tmp_path):
    persister, replica = open_log(tmp_path)
    replica.append(1, 1, b"kept")
    persister.sync_now()
    replica.append(1, 1, b"gone")
    replica.truncate(1)
    replica.append(2, 1, b"instead")
    persister.sync_now()
    _, again = open_log(tmp_path)
    assert [e.payload for e in again.entries(0)] == [b"kept", b"instead"]


def test_segments_below_the_release_cursor_go(tmp_path):
    persister, replica = open_log(tmp_path, segment_size=300)
    for n in range(12):
        replica.append(1, 1, bytes([n]) * 100)
    persister.sync_now()
    replica.drop_before(7)
    assert 0 < replica.first <= 7 and replica.read(7).payload == b"\x07" * 100
    with pytest.raises(IndexError):
        replica.read(replica.first - 1)
    with pytest.raises(ValueError):
        replica.truncate(replica.first - 1)
    _, again = open_log(tmp_path, segment_size=300)
    assert (again.first, again.end) == (replica.first, 12)
    assert again.history.epoch_at(again.first) == 1


def test_the_last_entries_are_read_from_memory_as_they_are_on_disk(tmp_path, monkeypatch):
    """What a leader ships in the tick it appended it comes from memory (RECENT_ENTRIES,
    RECENT_BYTES), and is what the segment holds: before and after the cut of a divergent
    tail, and past the bounds, where the older entries are read from their segment. What is
    shipped, or appended by a follower, is not kept."""
    import warren.store.replica_log as replica_log
    monkeypatch.setattr(replica_log, "RECENT_ENTRIES", 5)
    persister, replica = open_log(tmp_path, segment_size=300)
    replica.shipping = True
    for n in range(8):
        replica.append(1, 2, b"h%d:" % n, SplitBody([bytes([n]) * 40, b"!"], 41) if n % 2 else None)
    replica.truncate(6)
    replica.append(2, 3, b"after the cut")
    persister.sync_now()
    from_memory = list(replica.entries(0))
    replica._forget_recent()
    from_disk = list(replica.entries(0))
    assert from_memory == from_disk
    assert [e.payload for e in from_disk[5:]] == [b"h5:" + b"\x05" * 40 + b"!", b"after the cut"]
    monkeypatch.setattr(replica_log, "RECENT_BYTES", 100)
    for n in range(4):
        replica.append(2, 1, bytes([n]) * 60)
    assert replica._recent_bytes <= 100 and len(replica._recent) == 1
    assert [e.payload for e in replica.entries(7)] == [bytes([n]) * 60 for n in range(4)]
    replica.shipped(replica.end)
    assert not replica._recent and replica._recent_bytes == 0
    replica.shipping = False
    replica.append(2, 1, b"a follower's")
    assert not replica._recent and replica.read(replica.end - 1).payload == b"a follower's"


def test_entries_read_in_runs_across_segments_match_what_was_appended(tmp_path, monkeypatch):
    """`entries` reads a run of a segment's entries at once (READ_AHEAD bytes): every entry
    comes back whole and in order, across segments and from any start."""
    import warren.store.replica_log as replica_log
    monkeypatch.setattr(replica_log, "READ_AHEAD", 100)  # (runs of a few entries, and single ones)
    persister, replica = open_log(tmp_path, segment_size=4096)
    payloads = [bytes([n % 251]) * (n * 7 % 300) for n in range(300)]
    for n, payload in enumerate(payloads):
        replica.append(1 + n // 100, 3, payload)
    persister.sync_now()
    _, again = open_log(tmp_path, segment_size=4096)
    assert len(again.segments) > 5
    assert [(e.offset, e.epoch, e.payload) for e in again.entries(0)] == [
        (n, 1 + n // 100, p) for n, p in enumerate(payloads)]
    assert [e.offset for e in again.entries(17, 251)] == list(range(17, 251))
