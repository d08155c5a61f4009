"""A stream's log: messages appended once and read by offset, never consumed away.

The log is a directory of segment files named by the offset of their first record, in the
record layout of segments.py (per-record checksums, so a torn tail is found at start-up);
a record's sequence number is its offset. The records appended between two flushes of the
persister form a *chunk* (RabbitMQ's unit: `last` starts at the last chunk); the first
record of a chunk has FLAG_CHUNK and the chunk's time in ms. Appends join the persister's
group commit like a durable queue's, so a confirm means fsynced.

Beside each segment a sparse index (`.idx`, entries of offset, position and chunk time, each
with its own check bits) leads a reader to a place near any offset without scanning the
segment from its start: an entry per chunk that starts at least INDEX_SPACING bytes after
the previous entry. It is written with the segment but not fsynced: at start-up its entries
past the segment's intact end are dropped and the tail is scanned, so it can only be short.

A message is *committed* once the group commit it joined is fsynced: readers see committed
offsets only, so no consumer ever sees an offset that a crash could give to another message
(a Spark job re-reading a range after a broker restart gets the same messages), and the
offsets the stream reports (next, last) are committed ones.

Readers keep their own position (segment, byte position, next offset) and read a bounded
batch at a time, so a consumer far behind costs a read buffer, not memory per message
(the page cache is shared by every reader). The newest messages also stay in memory
(`recent`, RECENT_BYTES of bodies): consumers at the tail take them from there, as they
were published, without reading them back.

Retention removes whole segments from the head, never the one being written: by total size
(x-max-length-bytes) and by age (x-max-age: a segment goes once the next one's first chunk
is older than that). A reader in a removed segment goes on from the new first offset.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

import xxhash

from ..amqp.message import Message
from . import segments as sg
from .disk import BIG_BODY, _route_parts
from .segment_file import Segment

if TYPE_CHECKING:
    from .persister import Persister
    from .settlement import StoreBatch

log = logging.getLogger("warren.stream")

DEFAULT_SEGMENT_SIZE = 500_000_000   # x-stream-max-segment-size-bytes, RabbitMQ's default
INDEX_SPACING = 64 << 10
READ_SIZE = 256 << 10                # a reader's disk read
SCAN_WINDOW = 8 << 20                # start-up scans read a segment this much at a time
RECENT_BYTES = 4 << 20               # bodies of the newest messages kept in memory (per stream)
RECENT_COUNT = 8192
TRACKING_FILE = "consumer-offsets.json"

_INDEX = struct.Struct(">QQq")       # offset, position, chunk time (ms)
_CHECK = struct.Struct(">I")
INDEX_ENTRY = _INDEX.size + _CHECK.size


def _index_entry(offset: int, pos: int, stamp: int) -> bytes:
    packed = _INDEX.pack(offset, pos, stamp)
    return packed + _CHECK.pack(xxhash.xxh3_64_intdigest(packed) & 0xFFFFFFFF)


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamSegment(Segment):
    """A stream segment: a Segment of records whose ids are offsets, and its sparse index."""

    __slots__ = ("first", "index", "index_buf", "index_fd", "stream")

    def __init__(self, stream: StreamLog, first: int, create: bool):
        super().__init__(stream.persister, stream.directory, first, create)
        self.stream = stream
        self.first = first
        self.index: list[tuple[int, int, int]] = []  # (offset, position, chunk time), in order
        self.index_buf = bytearray()
        self.index_fd: int | None = None

    @property
    def index_path(self) -> str:
        return self.path[:-4] + ".idx"

    def add_index(self, offset: int, pos: int, stamp: int, write: bool = True) -> None:
        self.index.append((offset, pos, stamp))
        if write:
            self.index_buf += _index_entry(offset, pos, stamp)

    def write_out(self) -> None:
        super().write_out()
        if self.index_buf:
            if self.index_fd is None:
                self.index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            n = os.write(self.index_fd, self.index_buf)
            del self.index_buf[:n]
        self.stream.chunk_ended()

    def remove(self) -> None:
        if self.index_fd is not None:
            self.persister.close_fd(self.index_fd)
            self.index_fd = None
        super().remove()
        try:
            os.unlink(self.index_path)
        except FileNotFoundError:
            pass

    @property
    def removed(self) -> bool:
        return self.fd is None


class StreamReader:
    """One consumer's place in a stream: the next offset it reads, and where that is."""

    __slots__ = ("stream", "offset", "seg", "pos")

    def __init__(self, stream: StreamLog, offset: int):
        self.stream = stream
        self.offset = offset
        self.seg: StreamSegment | None = None  # where `offset` is, once found
        self.pos = 0

    @property
    def caught_up(self) -> bool:
        return self.offset >= self.stream.committed

    def take(self, count: int, max_bytes: int = READ_SIZE) -> list[tuple[int, Message]]:
        """Up to `count` messages from the reader's offset on (and about max_bytes of bodies,
        at least one), in order, as (offset, message)."""
        stream = self.stream
        if self.offset < stream.first_offset:
            self.offset = stream.first_offset  # retention removed what it had not read
            self.seg = None
        count = min(count, stream.committed - self.offset)
        if count <= 0:
            return []
        recent = stream.recent
        if recent and recent[0][0] <= self.offset <= recent[-1][0]:
            taken = []
            room = max_bytes
            for i in range(self.offset - recent[0][0], min(self.offset - recent[0][0] + count, len(recent))):
                entry = recent[i]
                taken.append(entry)
                room -= len(entry[1].body)
                if room <= 0:
                    break
            self.offset = taken[-1][0] + 1
            self.seg = None  # (found again if it ever falls behind `recent`)
            return taken
        return self._read(count, max_bytes)

    def take_records(self, max_bytes: int) -> tuple[int, int, bytes] | None:
        """The records from the reader's offset on, as stored (segments.py's layout), up to
        about max_bytes (at least one record), within one segment: (first offset, how many,
        the records), or None when there is nothing committed to read. For record-batch
        consumers: the records are read from the segment files (committed means written;
        the page cache holds the recent ones), never taken apart."""
        stream = self.stream
        if self.offset < stream.first_offset:
            self.offset = stream.first_offset
            self.seg = None
        committed = stream.committed
        if self.offset >= committed:
            return None
        if self.seg is None or self.seg.removed:
            self._locate()
        unpack_head, prefix_size = sg.RECORD_HEAD.unpack_from, sg.PREFIX_SIZE
        while True:
            seg = self.seg
            assert seg is not None
            if self.pos >= seg.size:
                later = stream.segment_after(seg)
                if later is None:
                    return None
                self.seg, self.pos = later, len(sg.MAGIC)
                continue
            chunk = seg.read(self.pos, max_bytes + (16 << 10))  # (a bigger last record is read whole)
            size, pos, first, start = len(chunk), 0, -1, 0
            while pos + sg.HEAD_SIZE <= size and (first < 0 or pos - start < max_bytes):
                length, _crc, _flags, offset, _route_len = unpack_head(chunk, pos)
                if offset >= committed:
                    break
                end = pos + prefix_size + length
                if end > size:
                    if first >= 0 or pos:
                        break
                    chunk = seg.read(self.pos, end)  # one record bigger than a read: read whole
                    size = len(chunk)
                if offset < self.offset:
                    start = end  # before the reader's offset (it started at an index entry)
                elif first < 0:
                    first = offset
                self.offset = max(self.offset, offset + 1)
                pos = end
            self.pos += pos
            if first >= 0:
                return first, self.offset - first, chunk[start:pos]
            if pos == 0:
                return None  # (a record at or past the committed offset)

    def _locate(self) -> None:
        stream = self.stream
        seg = stream.segment_for(self.offset)
        pos = len(sg.MAGIC)
        if seg.index:
            i = bisect.bisect_right(seg.index, (self.offset, 1 << 64, 0)) - 1
            if i >= 0:
                pos = seg.index[i][1]
        self.seg, self.pos = seg, pos

    def _read(self, count: int, max_bytes: int) -> list[tuple[int, Message]]:
        if self.seg is None or self.seg.removed:
            self._locate()
        out: list[tuple[int, Message]] = []
        room = max_bytes
        stream = self.stream
        committed = stream.committed
        head_size, prefix_size, header_len_size = sg.HEAD_SIZE, sg.PREFIX_SIZE, sg.HEADER_LEN_SIZE
        unpack_head, unpack_header_len = sg.RECORD_HEAD.unpack_from, sg.HEADER_LEN.unpack_from
        # (sg.route_start inlined: a call per record costs here, as in DiskQueueStore._load)
        slot_flags, slot_start = sg.FLAG_CHUNK | sg.FLAG_EXPIRY, head_size + sg.EXPIRY_SIZE
        last_route = b""
        parts = ("", "")
        while len(out) < count and (room > 0 or not out) and self.offset < committed:
            seg = self.seg
            assert seg is not None
            if self.pos >= seg.size:
                later = stream.segment_after(seg)
                if later is None:
                    break
                self.seg, self.pos = later, len(sg.MAGIC)
                continue
            chunk = seg.read(self.pos, READ_SIZE)
            pos = 0
            size = len(chunk)
            while len(out) < count and pos + head_size <= size and (room > 0 or not out):
                length, _crc, flags, offset, route_len = unpack_head(chunk, pos)
                if offset >= committed:
                    break
                end = pos + prefix_size + length
                if end > size:
                    if pos:
                        break
                    chunk = seg.read(self.pos, end)  # one record bigger than a read: read whole
                    size = len(chunk)
                p = pos + (slot_start if flags & slot_flags else head_size)
                record_end, pos = end, end
                if offset < self.offset:
                    continue  # before the reader's offset (it started at an index entry)
                route = chunk[p:p + route_len]
                p += route_len
                header_end = p + header_len_size + unpack_header_len(chunk, p)[0]
                header = chunk[p + header_len_size:header_end]
                body = chunk[header_end:record_end]
                if route != last_route:
                    last_route = route
                    parts = _route_parts(route)
                out.append((offset, Message(parts[0], parts[1], route, header, body)))
                room -= len(body)
                self.offset = offset + 1
            self.pos += pos
            if pos == 0:
                break  # (a record at or past the committed offset)
        return out


class ConsumerOffsets:
    """Named consumers' offsets (the next offset each will read), saved now and then in
    TRACKING_FILE in the stream's directory: a crash forgets the last second of them, so those
    are read again."""

    def __init__(self, directory: str):
        self.directory = directory
        self.tracked: dict[str, int] = {}
        self._tracking_dirty = False
        self._load_tracking()

    def track(self, name: str, offset: int) -> None:
        if offset > self.tracked.get(name, -1):
            self.tracked[name] = offset
            self._tracking_dirty = True

    def save_tracking(self) -> None:
        """Write the named consumers' offsets (atomically: a new file renamed over the old)."""
        if not self._tracking_dirty:
            return
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, TRACKING_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(self.tracked, f, sort_keys=True)
            os.replace(path + ".tmp", path)
            self._tracking_dirty = False
        except OSError as err:
            log.error("stream %s: cannot save consumer offsets: %s", self.directory, err)

    def _load_tracking(self) -> None:
        path = os.path.join(self.directory, TRACKING_FILE)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            log.error("stream %s: unreadable consumer offsets (%s): they start again", self.directory, err)
            return
        if isinstance(data, dict):
            self.tracked = {str(k): int(v) for k, v in data.items() if isinstance(v, int)}


class StreamLog(ConsumerOffsets):
    """The segments of one stream, its offsets, retention and readers."""

    def __init__(self, persister: Persister, directory: str):
        self.persister = persister
        self.segments: list[StreamSegment] = []
        self._firsts: list[int] = []         # the segments' first offsets (bisect)
        self.write_seg: StreamSegment | None = None
        self.first_offset = 0                # the oldest offset still in the log
        self.next_offset = 0                 # the offset the next message gets
        # First offsets of the newest chunks: the newest committed one and those after it.
        self._chunks: deque[int] = deque()
        self.total_bytes = 0                 # segment bytes (retention by size)
        self.max_segment_size = DEFAULT_SEGMENT_SIZE
        self.max_bytes: int | None = None
        self.max_age_ms: int | None = None
        self._chunk_open = False
        self._index_pos = -INDEX_SPACING     # position of the write segment's last index entry
        self.recent: deque[tuple[int, Message]] = deque()
        self._recent_bytes = 0
        # Committed offsets: every offset below `committed` is fsynced. `_pending` holds
        # [persister batch, the offset after its last message] of the appends not yet safe.
        self.committed = 0
        self._pending: deque[list] = deque()  # [StoreBatch, end offset]
        self._waiting = False
        self.on_commit: Callable[[], None] | None = None  # told when `committed` moves
        ConsumerOffsets.__init__(self, directory)
        if os.path.isdir(directory):
            self._recover()
        self.committed = self.next_offset

    # ----------------------------------------------------------------- figures
    @property
    def count(self) -> int:
        """Committed messages in the log (what a queue's message count shows)."""
        return max(self.committed - self.first_offset, 0)

    def __len__(self) -> int:
        return self.count

    @property
    def ready_bytes(self) -> int:
        return self.total_bytes

    @property
    def last_chunk(self) -> int | None:
        """The first offset of the newest committed chunk (RabbitMQ's `last`)."""
        chunks = self._chunks
        while len(chunks) > 1 and chunks[1] < self.committed:
            chunks.popleft()
        if chunks and chunks[0] < self.committed:
            return chunks[0]
        return None

    @property
    def last_offset(self) -> int | None:
        """The newest committed offset (None: none)."""
        return self.committed - 1 if self.committed > self.first_offset else None

    @property
    def first_timestamp(self) -> int | None:
        """When the oldest chunk still in the log was appended (ms since the epoch)."""
        for seg in self.segments:
            if seg.index:
                return seg.index[0][2]
        return None

    # ---------------------------------------------------------------- appending
    def append(self, message: Message) -> StoreBatch:
        """Append a message at next_offset; returns the persister batch its confirm waits for."""
        seg = self.write_seg
        if seg is None or seg.size >= self.max_segment_size:
            seg = self._roll()
        offset = self.next_offset
        flags = sg.FLAG_DURABLE
        stamp = None
        if not self._chunk_open:
            self._chunk_open = True
            flags |= sg.FLAG_CHUNK
            stamp = _now_ms()
            self._chunks.append(offset)
        body = message.body
        if len(body) >= BIG_BODY:
            pos = seg.append(sg.encode_record_head(flags, offset, message.route, message.header, body, stamp), body)
        else:
            pos = seg.append(sg.encode_record(flags, offset, message.route, message.header, bytes(body), stamp))
        if stamp is not None and (pos - self._index_pos >= INDEX_SPACING or not seg.index):
            seg.add_index(offset, pos, stamp)
            self._index_pos = pos
        self.total_bytes += seg.size - pos
        self.next_offset = offset + 1
        recent = self.recent
        recent.append((offset, message))
        self._recent_bytes += len(body)
        while recent and (self._recent_bytes > RECENT_BYTES or len(recent) > RECENT_COUNT):
            self._recent_bytes -= len(recent.popleft()[1].body)
        persister = self.persister
        batch = persister.durable_append(seg)
        pending = self._pending
        if pending and pending[-1][0] == batch:
            pending[-1][1] = offset + 1
        else:
            pending.append([batch, offset + 1])
            if not self._waiting:
                self._waiting = True
                persister.wait_for(self)
        return batch

    def store_synced(self) -> None:
        """A SyncWaiter: an fsync finished; offsets whose batches are on disk are committed.
        A batch whose write or fsync failed is not: its records stay buffered, are written
        again by the persister, and join the open batch here."""
        self._waiting = False
        persister = self.persister
        pending = self._pending
        moved = False
        while pending:
            batch, end = pending[0]
            safe = batch.status()
            if safe is None:
                break
            if not safe:
                if self.write_seg is not None:
                    for entry in pending:
                        entry[0] = persister.durable_append(self.write_seg)
                break
            pending.popleft()
            self.committed = end
            moved = True
        if pending:
            self._waiting = True
            persister.wait_for(self)
        if moved and self.on_commit is not None:
            self.on_commit()

    def chunk_ended(self) -> None:
        """The persister wrote the buffered records: the next append starts a new chunk."""
        self._chunk_open = False

    def _roll(self) -> StreamSegment:
        if not self.segments:
            os.makedirs(self.directory, exist_ok=True)
        old = self.write_seg
        if old is not None and old.fd is not None:
            # A sealed segment is on disk before the next one starts, so a crash never
            # leaves a later segment behind a torn one (a failed write is retried by the
            # persister, as any other).
            try:
                old.write_out()
                os.fsync(old.fd)
            except OSError as err:
                log.error("stream %s: sealing %s failed: %s", self.directory, old.path, err)
        seg = StreamSegment(self, self.next_offset, create=True)
        self.segments.append(seg)
        self._firsts.append(seg.first)
        self.write_seg = seg
        self.total_bytes += seg.size
        self._chunk_open = False  # each segment starts with a chunk (and an index entry)
        self._index_pos = -INDEX_SPACING
        self.apply_retention()
        return seg

    # ---------------------------------------------------------------- reading
    def reader(self, offset: int) -> StreamReader:
        """A reader from `offset`: before the first, from the first; beyond the end, it
        waits there (the messages before it are never its), as osiris readers do."""
        return StreamReader(self, max(offset, self.first_offset))

    def segment_for(self, offset: int) -> StreamSegment:
        i = bisect.bisect_right(self._firsts, offset) - 1
        return self.segments[max(i, 0)]

    def segment_after(self, seg: StreamSegment) -> StreamSegment | None:
        i = bisect.bisect_right(self._firsts, seg.first)
        return self.segments[i] if i < len(self.segments) else None

    def offset_at(self, timestamp_ms: int) -> int:
        """The first offset of the first chunk appended at or after `timestamp_ms` (next_offset
        if none): RabbitMQ's timestamp offset spec, at chunk granularity."""
        for seg in self.segments:
            later = self.segment_after(seg)
            if later is not None and later.index and later.index[0][2] < timestamp_ms:
                continue  # every chunk of this segment is older
            return self._scan_for_time(seg, timestamp_ms)
        return self.next_offset

    def _scan_for_time(self, seg: StreamSegment, timestamp_ms: int) -> int:
        start = len(sg.MAGIC)
        for offset, pos, stamp in seg.index:
            if stamp >= timestamp_ms:
                return offset
            start = pos
        # Between index entries: walk the chunk starts from the last entry before it.
        pos = start
        while pos < seg.size:
            head = seg.read(pos, sg.HEAD_SIZE + sg.EXPIRY_SIZE)
            length, _crc, flags, offset, _rl = sg.RECORD_HEAD.unpack_from(head, 0)
            if flags & sg.FLAG_CHUNK and sg.EXPIRY.unpack_from(head, sg.HEAD_SIZE)[0] >= timestamp_ms:
                return offset
            pos += sg.PREFIX_SIZE + length
        later = self.segment_after(seg)
        return later.first if later is not None else self.next_offset

    # ---------------------------------------------------------------- retention
    def set_retention(self, max_bytes: int | None, max_age_ms: int | None, max_segment_size: int | None) -> None:
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self.max_segment_size = max_segment_size or DEFAULT_SEGMENT_SIZE
        self.apply_retention()

    def apply_retention(self) -> int:
        """Remove whole segments from the head that the limits no longer allow (never the
        segment being written); returns how many were removed."""
        removed = 0
        cutoff = _now_ms() - self.max_age_ms if self.max_age_ms is not None else None
        while len(self.segments) > 1:
            head, nxt = self.segments[0], self.segments[1]
            too_big = self.max_bytes is not None and self.total_bytes > self.max_bytes
            too_old = cutoff is not None and bool(nxt.index) and nxt.index[0][2] < cutoff
            if not (too_big or too_old):
                break
            self.segments.pop(0)
            self._firsts.pop(0)
            self.total_bytes -= head.size
            head.remove()
            removed += 1
            self.first_offset = nxt.first
        if removed:
            while self.recent and self.recent[0][0] < self.first_offset:
                self._recent_bytes -= len(self.recent.popleft()[1].body)
            log.debug("stream %s: retention removed %d segment(s); first offset now %d", self.directory, removed,
                     self.first_offset)
        return removed

    def destroy(self) -> None:
        for seg in self.segments:
            seg.remove()
        self.segments.clear()
        self._firsts.clear()
        self.write_seg = None
        self.recent.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    # ---------------------------------------------------------------- recovery
    def _recover(self) -> None:
        """Rebuild offsets and indexes from the segment files: each segment's index entries up
        to its intact end, then its records from the last entry on, checked; a torn tail
        (a record cut by a crash) is cut off the last segment."""
        started = time.monotonic()
        firsts = sorted(int(n[:-4]) for n in os.listdir(self.directory)
                        if n.endswith(".seg") and n[:-4].isdigit())
        for i, first in enumerate(firsts):
            last = i == len(firsts) - 1
            seg = StreamSegment(self, first, create=False)
            assert seg.fd is not None
            size = os.fstat(seg.fd).st_size
            magic = os.pread(seg.fd, len(sg.MAGIC), 0)
            if magic != sg.MAGIC:
                if sg.MAGIC.startswith(magic):  # created just before a crash: nothing in it
                    seg.remove()
                    self.next_offset = max(self.next_offset, first)
                    continue
                log.error("stream %s: segment %s has a bad header: skipped", self.directory, seg.path)
                seg.fd = None
                continue
            entries = self._read_index(seg, size)
            start = entries[-1][1] if entries else len(sg.MAGIC)
            seg.index = entries
            good_end, last_offset = self._scan(seg, start, size)
            if good_end < size:
                if last:
                    log.warning("stream %s: torn tail in %s: truncated to %d bytes", self.directory, seg.path,
                                good_end)
                else:
                    log.error("stream %s: damaged segment %s: the records after byte %d are lost", self.directory,
                              seg.path, good_end)
                os.ftruncate(seg.fd, good_end)
            seg.index = [e for e in seg.index if e[1] < good_end]
            if os.path.exists(seg.index_path):
                os.truncate(seg.index_path, len([e for e in entries if e[1] < good_end]) * INDEX_ENTRY)
            seg.size = seg.flushed = good_end
            if last_offset is None:  # no record: its name says where the stream was
                seg.remove()
                self.next_offset = max(self.next_offset, first)
                continue
            self.segments.append(seg)
            self._firsts.append(first)
            self.total_bytes += good_end
            self.next_offset = last_offset + 1
        if self.segments:
            self.first_offset = self.segments[0].first
        else:
            self.first_offset = self.next_offset
        if firsts:
            log.info("stream %s: recovered offsets %d to %d from %d segments in %.2fs", self.directory,
                     self.first_offset, self.next_offset - 1, len(self.segments), time.monotonic() - started)

    def _read_index(self, seg: StreamSegment, size: int) -> list[tuple[int, int, int]]:
        try:
            with open(seg.index_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        entries: list[tuple[int, int, int]] = []
        for pos in range(0, len(data) - INDEX_ENTRY + 1, INDEX_ENTRY):
            packed = data[pos:pos + _INDEX.size]
            if _CHECK.unpack_from(data, pos + _INDEX.size)[0] != xxhash.xxh3_64_intdigest(packed) & 0xFFFFFFFF:
                break
            entry = _INDEX.unpack(packed)
            if entry[1] >= size or (entries and entry[1] <= entries[-1][1]):
                break
            entries.append(entry)
        return entries

    def _scan(self, seg: StreamSegment, start: int, size: int) -> tuple[int, int | None]:
        """Check the records of `seg` from `start` on, a window at a time; add the index
        entries and the last chunk found. Returns (intact end, last offset or None)."""
        assert seg.fd is not None
        pos = start
        last_offset = seg.index[-1][0] - 1 if seg.index else None
        index_pos = seg.index[-1][1] if seg.index else -INDEX_SPACING
        check = sg.checksum
        while pos < size:
            window = os.pread(seg.fd, min(SCAN_WINDOW, size - pos), pos)
            rel = 0
            n = len(window)
            while rel + sg.PREFIX_SIZE <= n:
                length, crc = sg.RECORD_PREFIX.unpack_from(window, rel)
                end = rel + sg.PREFIX_SIZE + length
                if length < sg.MIN_LENGTH or pos + end > size:
                    return pos + rel, last_offset
                if end > n:
                    if rel:
                        break
                    window = os.pread(seg.fd, end, pos)  # one record bigger than the window
                    n = len(window)
                    if n < end:
                        return pos, last_offset
                if check(memoryview(window)[rel + sg.PREFIX_SIZE:end]) != crc:
                    return pos + rel, last_offset
                _l, _c, flags, offset, _rl = sg.RECORD_HEAD.unpack_from(window, rel)
                if flags & sg.FLAG_CHUNK:
                    stamp = sg.EXPIRY.unpack_from(window, rel + sg.HEAD_SIZE)[0]
                    self._chunks.clear()  # (all recovered offsets are committed: the last one counts)
                    self._chunks.append(offset)
                    if pos + rel - index_pos >= INDEX_SPACING or not seg.index:
                        seg.add_index(offset, pos + rel, stamp, write=False)
                        index_pos = pos + rel
                last_offset = offset
                rel = end
            if rel == 0:
                return pos, last_offset
            pos += rel
        return pos, last_offset
