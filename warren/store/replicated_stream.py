"""A stream on a cluster member (its leader or a follower alike), as StreamQueue reads a
StreamLog: its messages are the entries of the stream's replica log (warren.store.replica_log),
one per message, whose payload is the message's record as a stream's segment stores it
(segments.py: its offset, and its chunk's flag and time on a chunk's first record). Every
replica holds the same entries at the same offsets, so offsets are the same on every node, and
a record-batch consumer gets the payloads as they are.

Readers see *committed* offsets only: on the leader, what warren.cluster.replication commits
(a majority of the members and every in-sync one hold it on disk: its publish is confirmed
then); on a follower, what its leader last said was committed and its own disk holds. A new
leader holds every committed entry, so an offset a reader saw is never another message's.
Nothing is known committed at start-up until the leader says so (the commit point is not
written down): a restarted replica's readers wait for it.

A chunk is what the leader appended between two group commits (RabbitMQ's unit: `last`
starts at the newest committed one). Chunk times are indexed in memory at STAMP_GRAIN (a
timestamp offset spec scans the records from the indexed chunk before it).

Retention (max-length-bytes, max-age) is the leader's: `release_cursor` is the offset below
which whole segments may go, and warren.cluster.replicas releases them on every replica.
Named consumers' offsets (Warren's x-stream-consumer-name) are each node's own."""

from __future__ import annotations

import bisect
import time
from array import array
from collections import deque
from typing import TYPE_CHECKING, Callable

from ..amqp.message import Message
from . import segments as sg
from .disk import BIG_BODY, _route_parts
from .replicated import CommitPoint, Commits
from .stream import DEFAULT_SEGMENT_SIZE, READ_SIZE, ConsumerOffsets

if TYPE_CHECKING:
    from .replica_log import ReplicaLog

STREAM = 16            # the replica-log kind of a stream's entry
STAMP_GRAIN = 100      # ms between two chunk times the index keeps
TAIL_CHUNKS = 4096     # chunk starts kept for `last` at most (the newest)


def chunk_stamp(payload: bytes) -> int | None:
    """The chunk time of an entry's record (ms), if it starts a chunk."""
    if sg.RECORD_HEAD.unpack_from(payload)[2] & sg.FLAG_CHUNK:
        return sg.EXPIRY.unpack_from(payload, sg.HEAD_SIZE)[0]
    return None


class ChunkIndex:
    """Where the stream's chunks start, and when they were appended: every start among the
    newest (for `last`), and one per STAMP_GRAIN (for timestamps and retention by age). Made
    before the replica log, which tells it of the entries it finds at start-up (`scanned`)."""

    def __init__(self) -> None:
        self.offsets = array("Q")
        self.stamps = array("q")
        self.tail: deque[int] = deque(maxlen=TAIL_CHUNKS)

    def scanned(self, offset: int, payload: bytes) -> None:
        """An entry of the log (at start-up, or as a follower receives it)."""
        stamp = chunk_stamp(payload)
        if stamp is not None:
            self.started(offset, stamp)

    def started(self, offset: int, stamp: int) -> None:
        self.tail.append(offset)
        if not self.stamps or stamp - self.stamps[-1] >= STAMP_GRAIN:
            self.offsets.append(offset)
            self.stamps.append(stamp)

    def at_or_after(self, offset: int) -> int:
        """The index of the first indexed chunk starting at or after `offset`."""
        return bisect.bisect_left(self.offsets, offset)

    def newest_before(self, offset: int) -> float:
        """No chunk that starts below `offset` is newer than this: the time of the last indexed
        chunk below it and the grain (a chunk is left out only within STAMP_GRAIN of the last
        one indexed before it); infinity with no indexed chunk below it."""
        i = self.at_or_after(offset)
        return self.stamps[i - 1] + STAMP_GRAIN if i else float("inf")

    def truncated(self, cut: int) -> None:
        i = self.at_or_after(cut)
        del self.offsets[i:], self.stamps[i:]
        while self.tail and self.tail[-1] >= cut:
            self.tail.pop()

    def released(self, first: int) -> None:
        i = self.at_or_after(first)
        if i > 1:  # (one is kept: the chunk the first entries belong to)
            del self.offsets[:i - 1], self.stamps[:i - 1]


class ReplicatedStreamReader:
    """One consumer's place in a replicated stream: the next offset it reads."""

    __slots__ = ("stream", "offset")

    def __init__(self, stream: ReplicatedStream, offset: int):
        self.stream = stream
        self.offset = offset

    @property
    def caught_up(self) -> bool:
        return self.offset >= self.stream.committed

    def _span(self, count: int) -> int:
        """The end of what may be read now (retention may have removed what it had not read)."""
        log_ = self.stream.log
        if self.offset < log_.first:
            self.offset = log_.first
        return min(self.stream.committed, self.offset + count, log_.end)

    def take(self, count: int, max_bytes: int = READ_SIZE) -> list[tuple[int, Message]]:
        """Up to `count` messages from the reader's offset on (about max_bytes, at least one)."""
        end = self._span(count)
        if self.offset >= end:
            return []
        out = []
        offset = self.offset
        last_route, parts = b"", ("", "")
        for payload in self.stream.log.payloads(offset, end, max_bytes):
            record = sg.read_record(payload, 0)
            if record.route != last_route:
                last_route, parts = record.route, _route_parts(record.route)
            out.append((offset, Message(parts[0], parts[1], record.route, record.header, record.body)))
            offset += 1
        self.offset = offset
        return out

    def take_records(self, max_bytes: int) -> tuple[int, int, bytes] | None:
        """The records from the reader's offset on, as a stream stores them: (first offset,
        how many, the records), or None when nothing committed is left to read."""
        end = self._span(1 << 62)
        if self.offset >= end:
            return None
        payloads = self.stream.log.payloads(self.offset, end, max_bytes)
        first, self.offset = self.offset, self.offset + len(payloads)
        return first, len(payloads), b"".join(payloads)


class ReplicatedStream(Commits, ConsumerOffsets):
    """The stream's replica on this node, read as a StreamLog; `leading`: this node appends."""

    def __init__(self, log_: ReplicaLog, epoch: int, chunks: ChunkIndex):
        Commits.__init__(self, 0)
        ConsumerOffsets.__init__(self, log_.directory)
        self.log = log_
        self.epoch = epoch
        self.leader = ""  # the node that leads it
        self.leading = False
        self.failed = True  # (until it leads: an append is not its to make)
        self.leader_committed = 0  # a follower's: what its leader last said is committed
        self.on_commit: Callable[[], None] | None = None  # told when `committed` moves
        self.max_bytes: int | None = None
        self.max_age_ms: int | None = None
        self._chunk_batch: object = None  # the group commit the open chunk's appends join
        self.chunks = chunks
        self.on_retention: Callable[[], None] = lambda: None  # (the leader's: its retention changed)

    # ------------------------------------------------------------------ leading, following
    def lead(self, epoch: int) -> None:
        self.epoch, self.leading, self.failed = epoch, True, False

    def follow(self) -> None:
        """Another node leads: what this one appended and did not commit is nacked."""
        self.leading = False
        self.fail()

    def commit(self, end: int) -> None:
        before = self.committed
        super().commit(end)
        if self.committed > before and self.on_commit is not None:
            self.on_commit()

    def leader_says(self, committed: int) -> None:
        """A follower's: its leader's commit point."""
        if committed > self.leader_committed:
            self.leader_committed = committed
            self.durable_moved()

    def durable_moved(self) -> None:
        if not self.leading:
            self.commit(min(self.leader_committed, self.log.durable))

    def truncated(self, cut: int) -> None:
        """The log was cut at `cut` (a divergent tail: never committed), or restarted there."""
        self.chunks.truncated(cut)
        self.leader_committed = min(self.leader_committed, cut)
        self.committed = min(self.committed, cut)
        self.released()

    # ------------------------------------------------------------------ appending
    def append(self, message: Message) -> CommitPoint:
        """The leader's: append a message at the log's end; confirmed once committed."""
        log_ = self.log
        if not self.leading:  # (a follower, or deposed: the log is its leader's to write; a nack)
            return CommitPoint(self, log_.end + 1)
        offset = log_.end
        flags, stamp = sg.FLAG_DURABLE, None
        batch = log_.persister.batch
        if batch is not self._chunk_batch:
            self._chunk_batch = batch
            flags |= sg.FLAG_CHUNK
            stamp = int(time.time() * 1000)
            self.chunks.started(offset, stamp)
        body = message.body
        if len(body) >= BIG_BODY:
            log_.append(self.epoch, STREAM, sg.encode_record_head(flags, offset, message.route, message.header, body,
                                                                  stamp), body)
        else:
            log_.append(self.epoch, STREAM, sg.encode_record(flags, offset, message.route, message.header,
                                                             bytes(body), stamp))
        return self._point(log_.end)

    # ------------------------------------------------------------------ figures
    @property
    def first_offset(self) -> int:
        return self.log.first

    @property
    def count(self) -> int:
        return max(self.committed - self.log.first, 0)

    def __len__(self) -> int:
        return self.count

    @property
    def segments(self) -> list:
        return self.log.segments

    @property
    def total_bytes(self) -> int:
        return sum(seg.size for seg in self.log.segments)

    ready_bytes = total_bytes

    @property
    def last_chunk(self) -> int | None:
        """The first offset of the newest committed chunk (RabbitMQ's `last`)."""
        tail = self.chunks.tail
        while len(tail) > 1 and tail[1] < self.committed:
            tail.popleft()
        if tail and self.log.first <= tail[0] < self.committed:
            return tail[0]
        return None

    @property
    def last_offset(self) -> int | None:
        return self.committed - 1 if self.committed > self.log.first else None

    @property
    def first_timestamp(self) -> int | None:
        chunks = self.chunks
        i = chunks.at_or_after(self.log.first)
        return chunks.stamps[i] if i < len(chunks.stamps) else None

    def offset_at(self, timestamp_ms: int) -> int:
        """The first offset of the first committed chunk appended at or after `timestamp_ms`
        (the committed end if none): RabbitMQ's timestamp offset spec."""
        end, chunks = self.committed, self.chunks
        i = bisect.bisect_left(chunks.stamps, timestamp_ms)  # (the first indexed chunk at or after it)
        found = min(chunks.offsets[i], end) if i < len(chunks.stamps) else end
        offset = max(chunks.offsets[i - 1] if i else 0, self.log.first)
        while offset < found:  # (a chunk between two indexed ones may be the first)
            payloads = self.log.payloads(offset, found, READ_SIZE)
            for payload in payloads:
                stamp = chunk_stamp(payload)
                if stamp is not None and stamp >= timestamp_ms:
                    return offset
                offset += 1
        return found

    def reader(self, offset: int) -> ReplicatedStreamReader:
        return ReplicatedStreamReader(self, offset)

    # ------------------------------------------------------------------ retention
    def set_retention(self, max_bytes: int | None, max_age_ms: int | None, max_segment_size: int | None) -> None:
        self.max_bytes, self.max_age_ms = max_bytes, max_age_ms
        self.log.segment_size = max_segment_size or DEFAULT_SEGMENT_SIZE
        self.on_retention()  # (as osiris evaluates a changed retention at once)

    def apply_retention(self) -> int:
        """(The leader's replicas service releases what release_cursor allows, on every
        replica, when a new segment starts and when the retention changes.)"""
        return 0

    def release_cursor(self) -> int:
        """The offset below which retention lets whole segments go (never the last one): by
        size, and by age once every chunk of a segment is older than max-age."""
        segs = self.log.segments
        total = sum(seg.size for seg in segs)
        cutoff = int(time.time() * 1000) - self.max_age_ms if self.max_age_ms is not None else None
        cursor = self.log.first
        for head, nxt in zip(segs, segs[1:]):
            too_big = self.max_bytes is not None and total > self.max_bytes
            too_old = cutoff is not None and self.chunks.newest_before(nxt.first) < cutoff
            if not (too_big or too_old):
                break
            total -= head.size
            cursor = nxt.first
        return cursor

    def released(self) -> None:
        """Segments went from the head: index entries below the log's first offset go too."""
        self.chunks.released(self.log.first)

    def destroy(self) -> None:
        self.log.destroy()
