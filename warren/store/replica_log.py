"""A replicated queue's log on one node's disk (leader or follower alike): entries appended at
consecutive offsets, each with the epoch it was first written in (warren.cluster.replication),
read back by offset, cut at an offset (a divergent tail) and dropped at the head (below the
release cursor). What the entries mean is the queue type's.

Segment files (`OFFSET.seg`, named by their first entry's offset, after segments.py's MAGIC) of
records

    u32 length of the rest | u32 xxh3 of the rest | u64 offset | u32 epoch | u8 kind | payload

appended through the node's persister, so a follower's writes join the same group commit as
every queue's (one fsync per tick for the node). `durable` is the offset below which every
entry is fsynced: what a follower acknowledges and a leader counts for itself. At start-up
the records are scanned and checked; a torn tail (a crash in a write) is cut off, and the
epoch history is rebuilt from the records."""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import struct
from array import array
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

from ..amqp.body import Body
from . import segments as sg
from .epochs import EpochHistory
from .segment_file import Segment

if TYPE_CHECKING:
    from .persister import Persister

log = logging.getLogger("warren.replica")

SEGMENT_SIZE = 64 << 20
_HEAD = struct.Struct(">IIQIB")   # length, checksum, offset, epoch, kind
_FIXED = struct.Struct(">QIB")    # what the checksum covers before the payload
HEAD_SIZE = _HEAD.size
SCAN_WINDOW = 8 << 20
READ_AHEAD = 1 << 20  # bytes of entries read at once by `entries`
PEEK = 32  # bytes of each payload shown to `scanned` at start-up
# A leader's entries appended and not yet shipped to every linked follower, kept as they were
# given, up to these bounds: it ships each in the tick it was appended, and reading it back
# from its segment (two preads, or a walk of the buffered pieces) was a quarter of a leader's
# CPU (py-spy, bench/RESULTS.md "Quorum queues: entries shipped from memory"). A follower
# keeps none (`shipping` False); one that lags reads from the segments.
RECENT_ENTRIES = 4096
RECENT_BYTES = 4 << 20


class Entry(NamedTuple):
    offset: int
    epoch: int
    kind: int
    payload: bytes


class _Segment(Segment):
    """A segment of the log and where each of its records starts."""

    __slots__ = ("first", "positions")

    def __init__(self, log_: ReplicaLog, first: int, create: bool):
        super().__init__(log_.persister, log_.directory, first, create)
        self.first = first
        self.positions = array("Q")  # record positions, by offset - first


class ReplicaLog:
    """The log of one replicated queue on this node."""

    def __init__(self, persister: Persister, directory: str, segment_size: int = SEGMENT_SIZE,
                 scanned: Callable[[int, bytes], None] | None = None):
        """`scanned`: told of each entry found at start-up (its offset and its payload's
        first PEEK bytes), for what a queue type indexes (a stream's chunk times)."""
        self.persister = persister
        self._scanned = scanned
        self.directory = directory
        self.segment_size = segment_size
        self.segments: list[_Segment] = []
        self._firsts: list[int] = []
        self.history = EpochHistory()
        self.first = 0    # the oldest offset kept
        self.end = 0      # the next entry's offset
        self.durable = 0  # every entry below is on disk
        self._pending: deque[list] = deque()  # [persister batch, end offset] not fsynced yet
        self._waiting = False
        self.on_durable: Callable[[int], None] | None = None  # told when `durable` moves
        self.on_append: Callable[[], None] | None = None      # told of each entry appended
        self.shipping = False  # (a leader's: its last entries are kept until shipped)
        self._recent: deque[tuple[int, int, bytes, Body | None]] = deque()  # (epoch, kind, head, body), up to end
        self._recent_bytes = 0
        if os.path.isdir(directory):
            self._recover()
        else:
            os.makedirs(directory)
        self.durable = self.end

    # ------------------------------------------------------------------ writing
    def append(self, epoch: int, kind: int, head: bytes, body: Body | None = None) -> int:
        """Add an entry whose payload is `head` (and `body`, written from its own buffers):
        its offset. It is on disk once `durable` passes it."""
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.size >= self.segment_size:
            seg = self._roll()
        offset = self.end
        self.history.appended(epoch, offset)  # (first: an entry of an older epoch is refused unwritten)
        rest = _FIXED.pack(offset, epoch, kind) + head
        size = len(rest) + (len(body) if body is not None else 0)
        if body is None:
            check = sg.checksum(rest)
        else:
            check = sg.checksum(rest + bytes(body))  # (one copy; the write itself takes the body by reference)
        record = struct.pack(">II", size, check) + rest
        seg.positions.append(seg.append(record, body))
        self.end = offset + 1
        if self.shipping:
            self._recent.append((epoch, kind, head, body))
            self._recent_bytes += size
            if self._recent_bytes > RECENT_BYTES or len(self._recent) > RECENT_ENTRIES:
                self._drop_recent(1)
        batch = self.persister.durable_append(seg)
        pending = self._pending
        if pending and pending[-1][0] == batch:
            pending[-1][1] = self.end
        else:
            pending.append([batch, self.end])
            if not self._waiting:
                self._waiting = True
                self.persister.wait_for(self)
        if self.on_append is not None:
            self.on_append()
        return offset

    def store_synced(self) -> None:
        """A SyncWaiter: entries whose batch is fsynced are durable. A failed batch's bytes
        stay buffered and are written again: they join the open batch."""
        self._waiting = False
        pending = self._pending
        moved = False
        while pending:
            batch, end = pending[0]
            safe = batch.status()
            if safe is None:
                break
            if not safe:
                for entry in pending:
                    entry[0] = self.persister.durable_append(self.segments[-1])
                break
            pending.popleft()
            if end > self.durable:
                self.durable = end
                moved = True
        if pending:
            self._waiting = True
            self.persister.wait_for(self)
        if moved and self.on_durable is not None:
            self.on_durable(self.durable)

    def _roll(self) -> _Segment:
        seg = _Segment(self, self.end, create=True)
        self.segments.append(seg)
        self._firsts.append(seg.first)
        return seg

    # ------------------------------------------------------------------ reading
    def _locate(self, offset: int) -> tuple[_Segment, int]:
        if not self.first <= offset < self.end:
            raise IndexError(f"offset {offset} is not in the log [{self.first}, {self.end})")
        seg = self.segments[bisect.bisect_right(self._firsts, offset) - 1]
        return seg, seg.positions[offset - seg.first]

    def read(self, offset: int) -> Entry:
        seg, pos = self._locate(offset)
        size = _HEAD.unpack(seg.read(pos, HEAD_SIZE))[0]
        data = seg.read(pos, 8 + size)
        _, _, at, epoch, kind = _HEAD.unpack_from(data)
        return Entry(at, epoch, kind, data[HEAD_SIZE:])

    def payloads(self, start: int, end: int, max_bytes: int) -> list[bytes]:
        """The payloads of the entries from `start` on, below `end`, in `start`'s segment and
        about `max_bytes` of them (at least one): read at once (a reader's bulk read)."""
        seg, pos = self._locate(start)
        positions = seg.positions
        first, last = start - seg.first, min(end, seg.first + len(positions)) - seg.first
        # (the entries that start within max_bytes of the first, the first always)
        last = max(first + 1, min(last, bisect.bisect_right(positions, pos + max_bytes, first, last)))
        stop = positions[last] if last < len(positions) else seg.size
        data = seg.read(pos, stop - pos)
        out = []
        for i in range(first, last):
            at = positions[i] - pos
            out.append(data[at + HEAD_SIZE:at + 8 + _HEAD.unpack_from(data, at)[0]])
        return out

    def entries(self, start: int, end: int | None = None) -> Iterator[Entry]:
        offset = start
        while offset < (self.end if end is None else min(end, self.end)):
            recent = self._recent
            at = offset - (self.end - len(recent))
            if at >= 0 and offset >= self.first:  # (appended lately: as it was given)
                epoch, kind, head, body = recent[at]
                yield Entry(offset, epoch, kind, head if body is None else head + bytes(body))
                offset += 1
                continue
            # Older ones: a run of a segment's entries read at once, READ_AHEAD bytes or one
            # entry (two preads per entry made a new leader's replay of 50,000 take 270 ms).
            seg, pos = self._locate(offset)
            positions = seg.positions
            first = offset - seg.first
            last = min(self.end - len(recent) if recent else self.end, self.end if end is None else end,
                       seg.first + len(positions)) - seg.first
            last = max(first + 1, min(last, bisect.bisect_right(positions, pos + READ_AHEAD, first, last)))
            data = seg.read(pos, (positions[last] if last < len(positions) else seg.size) - pos)
            for i in range(first, last):
                at = positions[i] - pos
                size, _, entry_offset, epoch, kind = _HEAD.unpack_from(data, at)
                yield Entry(entry_offset, epoch, kind, data[at + HEAD_SIZE:at + 8 + size])
            offset = seg.first + last

    # ------------------------------------------------------------------ cutting
    def truncate(self, offset: int) -> None:
        """Drop the entries from `offset` on (a divergent tail, or what a crash lost)."""
        if offset >= self.end:
            return
        if offset < self.first:
            raise ValueError(f"cannot cut at {offset}: the log starts at {self.first}")
        while self.segments and self.segments[-1].first >= offset and self.segments[-1].first > self.first:
            self.segments.pop().remove()
            self._firsts.pop()
        if self.segments:
            seg = self.segments[-1]
            keep = offset - seg.first
            if keep < len(seg.positions):
                cut = seg.positions[keep]
                seg.write_out()  # (its buffered bytes first: then the file is cut where they were)
                self.persister.dirty.discard(seg)
                assert seg.fd is not None
                os.ftruncate(seg.fd, cut)
                seg.size = seg.flushed = cut
                del seg.positions[keep:]
                self.persister.to_sync.add(seg)  # (the cut is made durable with the next batch)
        self._forget_recent()
        self.end = offset
        self.durable = min(self.durable, offset)
        self.history.truncate(offset)
        for entry in self._pending:
            entry[1] = min(entry[1], offset)

    def drop_before(self, offset: int) -> None:
        """Entries below `offset` are no longer needed: whole segments below it go."""
        while len(self.segments) > 1 and self.segments[1].first <= offset:
            self.segments.pop(0).remove()
            self._firsts.pop(0)
            self.first = self.segments[0].first

    def restart_at(self, offset: int) -> None:
        """Drop the whole log and go on at `offset` (a follower behind its leader's first
        entry: what it misses was released)."""
        for seg in self.segments:
            seg.remove()
        self.segments.clear()
        self._firsts.clear()
        self._pending.clear()
        self._forget_recent()
        self.history.starts.clear()
        self.first = self.end = self.durable = offset

    def shipped(self, below: int) -> None:
        """Every linked follower has been sent the entries below `below`: they need not be
        kept in memory any more."""
        self._drop_recent(below - (self.end - len(self._recent)))

    def _drop_recent(self, count: int) -> None:
        recent = self._recent
        while recent and (count > 0 or self._recent_bytes > RECENT_BYTES or len(recent) > RECENT_ENTRIES):
            _, _, head, body = recent.popleft()
            self._recent_bytes -= _FIXED.size + len(head) + (len(body) if body is not None else 0)
            count -= 1

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_bytes = 0

    def destroy(self) -> None:
        for seg in self.segments:
            seg.remove()
        self.segments.clear()
        self._firsts.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        firsts = sorted(int(n[:-4]) for n in os.listdir(self.directory) if n.endswith(".seg") and n[:-4].isdigit())
        for i, first in enumerate(firsts):
            seg = _Segment(self, first, create=False)
            assert seg.fd is not None
            size = os.fstat(seg.fd).st_size
            if os.pread(seg.fd, len(sg.MAGIC), 0) != sg.MAGIC or (self.segments and first != self.end):
                log.error("replica log %s: %s is damaged or out of place: it and what follows are dropped",
                          self.directory, seg.path)
                for later in firsts[i:]:
                    os.unlink(os.path.join(self.directory, sg.segment_name(later)))
                seg.fd = None
                break
            good = self._scan(seg, size)
            if good < size:
                log.warning("replica log %s: torn tail in %s: cut to %d bytes", self.directory, seg.path, good)
                os.ftruncate(seg.fd, good)
            seg.size = seg.flushed = good
            if not seg.positions and i < len(firsts) - 1:
                seg.remove()
                continue
            self.segments.append(seg)
            self._firsts.append(first)
            if len(self.segments) == 1:
                self.first = first
            self.end = first + len(seg.positions)
        if not self.segments and firsts:
            self.first = self.end = firsts[0]

    def _scan(self, seg: _Segment, size: int) -> int:
        """Check the records of `seg`: their positions and epochs; returns the intact end."""
        assert seg.fd is not None
        pos = len(sg.MAGIC)
        expected = seg.first
        while pos < size:
            window = os.pread(seg.fd, min(SCAN_WINDOW, size - pos), pos)
            rel = 0
            while rel + HEAD_SIZE <= len(window):
                length, check, offset, epoch, _kind = _HEAD.unpack_from(window, rel)
                end = rel + 8 + length
                if end > len(window):
                    if rel == 0 and pos + end <= size:
                        window = os.pread(seg.fd, end, pos)  # one record bigger than the window
                    else:
                        break
                if (length < _FIXED.size or offset != expected or epoch < self.history.last_epoch
                        or sg.checksum(memoryview(window)[rel + 8:end]) != check):
                    return pos + rel
                seg.positions.append(pos + rel)
                self.history.appended(epoch, offset)
                if self._scanned is not None:
                    self._scanned(offset, bytes(window[rel + HEAD_SIZE:min(end, rel + HEAD_SIZE + PEEK)]))
                expected += 1
                rel = end
            if rel == 0:
                return pos
            pos += rel
        return pos
