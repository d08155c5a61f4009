"""A queue store backed by segment files, with a bounded in-memory window.

Ready messages are, in delivery order: requeued ones (in memory, by original position), the
in-memory window of fresh ones, then the *disk tail*: messages that exist only in the
segment files, read back in batches as the window drains. Persistent messages of durable
queues are written when they arrive (their confirm waits for the fsync); transient ones
touch the disk only when the window is full or the broker's memory is high (paging).
Acks and deliveries leave marks in each segment's .ack file; a segment whose records are
all settled is deleted.

Paging (set by the memory monitor past the paging ratio of the watermark) does two things:
new arrivals go to the disk tail as if the window were full, and page_out() evicts the
bodies of messages already in the window, newest first (the head is delivered soonest).
An evicted message keeps its place in the window; its Message is replaced by PAGED_OUT and
read back from its record when it is taken. A durable one has its record already; a
transient one is first written as a FLAG_PAGED record that is marked settled for the
disk-tail walk (its offset in acked_set): only the window's entry leads to it, so it is
never taken twice, and it is discarded at start-up like every paged record. While the disk
alarm is on, no transient message is written to disk for paging (RabbitMQ's rule): no disk
tail starts (behind an existing one arrivals still go, as order requires) and page_out()
evicts only bodies that are on disk already.

Holding (warren.store.persister): a big persistent message accepted with a confirm Ticket while
the queue has no disk tail and is not paging gets no record yet; it waits in `held` (in queue
order) until settled (then it is never written), its deadline or the held-bytes bound (then it
is written, with its delivery count), or until it must be on disk now: requeued, paged, or
followed by another record of the queue (records stay in queue order, and every record behind
the disk tail's cursor stays one the tail walk may hand out).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Protocol

from ..amqp.codec import read_shortstr
from ..amqp.message import Message
from . import segments as sg
from .queued_message import QueuedMessage
from .interface import take_head
from .requeued import RequeuedMessages
from .segment_file import Segment, SegmentWriter
from .settlement import SETTLED, Settlement

if TYPE_CHECKING:
    from .settlement import StoreBatch, Ticket

log = logging.getLogger("warren.store")

WINDOW = 32768          # fresh messages kept in memory before paging starts
# ... and before big bodies page, whatever their number. A per-queue bound until memory-based
# paging (the memory watermark) decides: paging a backlog that a consumer is draining costs
# more than it saves (measured: half the rate of 64 KiB-1 MiB bodies with a 64 MiB bound).
WINDOW_BYTES = 1 << 30
FLAG_DURABLE = sg.FLAG_DURABLE
READ_CHUNK = 1 << 20
# After a record bigger than a read chunk, read this much first: the next record is likely
# big too, and its body is read on its own.
_PROBE = 16 << 10
BIG_BODY = 64 << 10      # a body this big is written from the message, not copied first
# The disk tail is read back a bounded amount at a time (bodies in memory at once: reading
# half a 1 GiB window in one go was a 500 MB step that the memory watermark cannot see
# coming); while paging, in small batches once the window is empty: what is read stays in
# memory only until a consumer takes it.
READ_BACK_BYTES = 64 << 20
PAGING_LOAD = 256
PAGING_LOAD_BYTES = 4 << 20

# What an evicted message's entry in the window holds instead of its Message (shared by every
# queue the message went to: never changed, only no longer referenced from here).
PAGED_OUT = Message("", "", b"", b"", b"")


class StorePersister(SegmentWriter, Protocol):
    """What a disk store asks of the node's persister (warren.store.persister.Persister, which
    makes the stores: it sees them, they see only this)."""

    root: str          # the data directory (quarantined segments go under it)
    paging: bool       # the memory monitor's word, for a store made meanwhile
    disk_alarm: bool
    hold_max: int      # held bodies of all stores, at most (bytes)

    def durable_append(self, segment: Segment) -> StoreBatch:
        """`segment` holds a durable record of the open batch: its handle."""
        ...

    def hold(self, store: DiskQueueStore, qm: QueuedMessage) -> None:
        """`store` holds qm's record back (it set qm.hold)."""
        ...

    def unhold(self, qm: QueuedMessage, written: bool) -> None:
        """qm's record is held no more: written, or (not `written`) never to be."""
        ...


def _route_parts(route: bytes) -> tuple[str, str]:
    exchange, pos = read_shortstr(route, 0)
    routing_key, _ = read_shortstr(route, pos)
    return exchange, routing_key


class DiskQueueStore:
    """The QueueStore of a queue when the broker has a data directory."""

    def __init__(self, persister: StorePersister, directory: str, durable: bool, window: int = WINDOW,
                 window_bytes: int | None = None):
        self.persister = persister
        self.directory = directory
        self.durable = durable
        self.window = window
        self.window_bytes = WINDOW_BYTES if window_bytes is None else window_bytes
        self._fresh: deque[QueuedMessage] = deque()
        self.fresh_bytes = 0      # bodies in _fresh
        self._requeued = RequeuedMessages()
        self.ready_bytes = 0
        self.disk_count = 0       # ready messages that live only in the segments
        self.cursor: tuple[Segment, int] | None = None  # (segment, offset) of the first of them
        self.segments: dict[int, Segment] = {}  # id -> Segment, in id order
        self.write_seg: Segment | None = None
        self.max_seq = 0          # highest sequence number recovered
        # Set by the memory monitor (set_paging): memory is high / free disk is low.
        # A queue declared meanwhile starts with the broker's current word (the persister's).
        self.paging = persister.paging
        self.disk_alarm = persister.disk_alarm
        self.paged_out = 0        # entries of _fresh whose body is evicted (PAGED_OUT)
        # Records held back, in queue order (an OrderedDict: taken from the front, O(1)).
        self.held: OrderedDict[QueuedMessage, None] = OrderedDict()
        if durable and os.path.isdir(directory):
            self._recover()

    # --------------------------------------------------------------- QueueStore
    def __len__(self) -> int:
        return len(self._fresh) + len(self._requeued) + self.disk_count

    keep_all = False  # a quorum queue's store: transient messages are written (and kept) too

    def accept(self, qm: QueuedMessage, ticket: Ticket | None = None) -> Settlement:
        """Write a persistent message of a durable queue now; returns the batch to wait for.
        With a `ticket` (a big body, consumers waiting) its record may be held back instead
        (the ticket then tracks it, and SETTLED is returned)."""
        if self.durable and (qm.message.persistent or self.keep_all):
            # (Not behind a backlog its consumers will not take before the hold ends.)
            if ticket is not None and not (self.keep_all or self.disk_count or self.paging) \
                    and self.ready_bytes < self.persister.hold_max:
                qm.hold = ticket
                ticket.pending += 1
                self.held[qm] = None
                self.persister.hold(self, qm)
                return SETTLED
            if self.held:
                self._write_held_all()  # (queue order)
            return self.persister.durable_append(self._append(qm, sg.FLAG_DURABLE))  # the seg it set in qm
        return SETTLED

    def push(self, qm: QueuedMessage) -> None:
        size = len(qm.message.body)
        self.ready_bytes += size
        # To the disk tail behind one (order), or past the window or while paging. While the
        # disk alarm is on no disk tail starts: the transient messages behind it would be
        # written too (page_out() still evicts the persistent ones' bodies, at no disk cost).
        if self.disk_count or (not self.disk_alarm and (
                self.paging or len(self._fresh) >= self.window
                or (size >= BIG_BODY and self.fresh_bytes >= self.window_bytes))):
            if self.held:
                self._write_held_all()  # (before the disk tail's first record, and qm's)
            seg = qm.seg if qm.seg is not None else self._append(qm, sg.FLAG_PAGED)
            if not self.disk_count:
                self.cursor = (seg, qm.off)
            self.disk_count += 1

            return
        self._fresh.append(qm)
        self.fresh_bytes += size

    def pop(self) -> QueuedMessage | None:
        if self._requeued:
            qm = self._requeued.take()
        else:
            if self.disk_count and (self.paging or len(self._fresh) <= self.window // 2):
                self._refill()  # (the test inlined: this runs for every message of a drain)
            if not self._fresh:
                return None
            qm = self._fresh.popleft()
            if qm.message is PAGED_OUT:
                self._restore(qm)
            self.fresh_bytes -= len(qm.message.body)
        self.ready_bytes -= len(qm.message.body)
        return qm

    def peek(self) -> QueuedMessage | None:
        if self._requeued:
            return self._requeued.first()
        if not self._fresh and self.disk_count:
            self._refill()  # as pop() would
        if not self._fresh:
            return None
        qm = self._fresh[0]
        if qm.message is PAGED_OUT:
            self._restore(qm)
        return qm

    def drop_head(self, n: int) -> list[QueuedMessage]:
        return take_head(self, n)

    def requeue(self, qm: QueuedMessage) -> None:
        if qm.hold is not None:
            self.write_held(qm)  # back in the queue: no ack is coming soon
        self._requeued.push(qm)
        self.ready_bytes += len(qm.message.body)

    def delivered(self, qm: QueuedMessage, holder: str = "") -> None:
        """Handed to a consumer that must ack: leave a mark so a restart sets redelivered."""
        seg = qm.seg
        if seg is not None and qm.durable:
            seg.mark(sg.MARK_DELIVERED, qm.off)

    def carry_deliveries(self, qm: QueuedMessage) -> None:
        """qm (a message appended again) keeps its delivery count across a restart."""
        seg = qm.seg
        if seg is not None and qm.durable and qm.deliveries:
            seg.mark_count(qm.off, qm.deliveries)

    def settle(self, qm: QueuedMessage) -> None:
        seg = qm.seg
        if seg is None:
            if qm.hold is not None:
                self._drop_held(qm)
            return
        qm.seg = None
        if qm.durable:
            seg.mark(sg.MARK_ACK, qm.off)
        seg.acked += 1
        if seg.acked >= seg.count and seg is not self.write_seg:
            self._drop(seg)

    def purge(self) -> int:
        count = len(self)
        for qm in self._requeued.take_all():
            self.settle(qm)
        while self._fresh:
            self.settle(self._fresh.popleft())
        if self.disk_count:
            self._purge_disk_tail()
        self.ready_bytes = self.fresh_bytes = self.paged_out = 0
        return count

    def peek_all(self) -> list[QueuedMessage]:
        if self.paged_out:  # not the hot path: read them back (paging evicts them again)
            for qm in self._fresh:
                if qm.message is PAGED_OUT:
                    self._restore(qm)
        return self._requeued.in_order() + list(self._fresh)

    # ---------------------------------------------------------------- paging
    def set_paging(self, paging: bool, disk_alarm: bool) -> None:
        """The memory monitor's word: memory is past the paging ratio (new arrivals go to disk
        and page_out() evicts), free disk is below its limit (no transient writes for it)."""
        self.paging = paging
        self.disk_alarm = disk_alarm

    @property
    def resident(self) -> int:
        """Messages of the window whose body is in memory (what page_out() can evict)."""
        return len(self._fresh) - self.paged_out

    def page_out(self, max_messages: int, max_bytes: int) -> tuple[int, int]:
        """Evict up to about max_messages / max_bytes of window bodies, newest first (the
        head is delivered soonest); returns (messages, bytes) evicted. Transient ones are
        written first (not while the disk alarm is on: those stay)."""
        count = freed = 0
        if not self.resident:
            return 0, 0
        if self.held:
            self._write_held_all()  # their bodies are evicted as durable records
        disk_alarm = self.disk_alarm
        for qm in reversed(self._fresh):
            if count >= max_messages or freed >= max_bytes or self.paged_out == len(self._fresh):
                break
            message = qm.message
            if message is PAGED_OUT:
                continue
            if qm.seg is None:
                if disk_alarm:
                    continue
                seg = self._append(qm, sg.FLAG_PAGED)
                # Only this entry leads to the record: the disk-tail walk must skip it.
                seg.acked_set.add(qm.off)
            size = len(message.body)
            qm.message = PAGED_OUT
            self.paged_out += 1
            self.fresh_bytes -= size
            count += 1
            freed += size
        return count, freed

    def _restore(self, qm: QueuedMessage) -> None:
        """Read an evicted message of the window back from its record."""
        seg = qm.seg
        assert seg is not None, "an evicted message without a record"
        offset = qm.off
        head = seg.read(offset, _PROBE)
        length, _crc, flags, _seq, route_len = sg.RECORD_HEAD.unpack_from(head, 0)
        end = sg.PREFIX_SIZE + length
        route_start = sg.route_start(flags)
        header_start = route_start + route_len + sg.HEADER_LEN_SIZE
        if header_start > len(head):
            head = seg.read(offset, header_start)
        header_end = header_start + sg.HEADER_LEN.unpack_from(head, header_start - sg.HEADER_LEN_SIZE)[0]
        if end > len(head):
            if header_end > len(head):
                head = seg.read(offset, header_end)
            body = seg.read_body(offset + header_end, end - header_end)
        else:
            body = head[header_end:end]
        route = head[route_start:route_start + route_len]
        exchange, routing_key = _route_parts(route)
        qm.message = Message(exchange, routing_key, route, head[header_start:header_end], body)
        self.paged_out -= 1
        self.fresh_bytes += len(body)

    def destroy(self) -> None:
        for qm in list(self.held):
            self._drop_held(qm)  # (their confirms are due: the queue is gone)
        for seg in list(self.segments.values()):
            seg.remove()
        self.segments.clear()
        self.write_seg = None
        shutil.rmtree(self.directory, ignore_errors=True)
        # Nothing of the queue is left to hand out, in memory either (as MemoryQueueStore).
        self._fresh.clear()
        self._requeued.clear()
        self.disk_count = self.ready_bytes = self.fresh_bytes = self.paged_out = 0
        self.cursor = None

    # ---------------------------------------------------------------- holding
    def write_held(self, qm: QueuedMessage) -> None:
        """qm's record is held: write it now, and the held records before it (queue order)."""
        persister = self.persister
        queue_held = self.held
        while queue_held:
            held = next(iter(queue_held))
            ticket = held.hold
            assert ticket is not None
            held.hold = None
            del queue_held[held]
            persister.unhold(held, True)
            seg = self._append(held, sg.FLAG_DURABLE)
            if held.deliveries:  # handed out meanwhile: a restart must know it
                seg.mark_count(held.off, held.deliveries)
            ticket.written(persister.durable_append(seg))
            if held is qm:
                break

    def _write_held_all(self) -> None:
        if self.held:
            self.write_held(next(reversed(self.held)))  # (up to the newest: all of them)

    def _drop_held(self, qm: QueuedMessage) -> None:
        """A held record's message is settled: it is never written."""
        ticket = qm.hold
        assert ticket is not None
        qm.hold = None
        del self.held[qm]
        self.persister.unhold(qm, False)
        ticket.settled()

    # ---------------------------------------------------------------- writing
    def _append(self, qm: QueuedMessage, flags: int) -> Segment:
        seg = self.write_seg
        if seg is None or seg.size >= sg.SEGMENT_SIZE:
            seg = self._roll()
        msg = qm.message
        body = msg.body
        # A TTL deadline goes into the record in wall-clock ms, which mean the same after a restart.
        expiry = None if qm.expiry is None else int((qm.expiry - time.monotonic() + time.time()) * 1000)
        if len(body) >= BIG_BODY:
            qm.off = seg.append(sg.encode_record_head(flags, qm.seq, msg.route, msg.header, body, expiry), body)
        else:
            qm.off = seg.append(sg.encode_record(flags, qm.seq, msg.route, msg.header, bytes(body), expiry))
        qm.seg = seg
        qm.durable = flags == sg.FLAG_DURABLE
        return seg

    def _roll(self) -> Segment:
        if not self.segments:
            os.makedirs(self.directory, exist_ok=True)
        old = self.write_seg
        seg_id = (max(self.segments) + 1) if self.segments else 1
        seg = Segment(self.persister, self.directory, seg_id, create=True)
        self.segments[seg_id] = seg
        self.write_seg = seg
        if old is not None and old.acked >= old.count:
            self._drop(old)
        return seg

    def _drop(self, seg: Segment) -> None:
        if self.cursor is not None and self.cursor[0] is seg:
            return  # still being read from (possible only for skipped records)
        self.segments.pop(seg.id, None)
        seg.remove()

    # ---------------------------------------------------------------- reading
    def _refill(self) -> None:
        """Read the disk tail back into the window when it runs low: up to half a window (and
        READ_BACK_BYTES) at a time, or while paging a small batch once it is empty."""
        if self.paging:
            if not self._fresh:
                self._load(PAGING_LOAD, PAGING_LOAD_BYTES)
            return
        limit = min(self.window_bytes, READ_BACK_BYTES)
        if len(self._fresh) <= self.window // 2 and self.fresh_bytes <= limit // 2:
            self._load(self.window // 2 + 1, limit - self.fresh_bytes)

    def _load(self, want: int, max_bytes: int) -> None:
        """Move up to `want` messages (and about max_bytes of bodies; at least one) from the
        disk tail into the in-memory window."""
        assert self.cursor is not None  # there is a disk tail
        seg, offset = self.cursor
        fresh = self._fresh
        ids = None
        # The record layout of segments.py, bound to locals: this loop stays inline because a
        # call per record (sg.read_record) costs measurably here.
        unpack_head, unpack_header_len = sg.RECORD_HEAD.unpack_from, sg.HEADER_LEN.unpack_from
        head_size, prefix_size, header_len_size = sg.HEAD_SIZE, sg.PREFIX_SIZE, sg.HEADER_LEN_SIZE
        flag_expiry, expiry_size, unpack_expiry = sg.FLAG_EXPIRY, sg.EXPIRY_SIZE, sg.EXPIRY.unpack_from
        clock = time.monotonic() - time.time()  # a record's wall-clock deadline -> this run's clock
        last_route = last_header = b""  # never a record's (a route holds two shortstrs)
        last_parts = ("", "")
        read_size = READ_CHUNK
        room = max_bytes
        while want > 0 and self.disk_count and (room > 0 or not fresh):
            if offset >= seg.size:
                ids = ids or sorted(self.segments)
                later = [i for i in ids if i > seg.id]
                if not later:
                    log.error("queue store %s: %d messages missing from the segments", self.directory,
                              self.disk_count)
                    self.disk_count = 0
                    break
                finished, seg, offset = seg, self.segments[later[0]], len(sg.MAGIC)
                if finished.acked >= finished.count and finished is not self.write_seg:
                    self.cursor = (seg, offset)
                    self._drop(finished)
                continue
            chunk = seg.read(offset, read_size)
            size = len(chunk)
            pos = 0
            acked, delivered = seg.acked_set, seg.delivered
            # The hottest loop of a draining deep queue: unpack by hand, and share the route
            # and header of consecutive alike records (as the publishing channel did).
            while want and pos + head_size <= size and (room > 0 or not fresh):
                length, _crc, flags, seq, route_len = unpack_head(chunk, pos)
                end = pos + prefix_size + length
                body: bytes | None = None
                if end > size:
                    if pos:
                        break
                    # A record larger than the chunk (a big body): the body is read on its
                    # own, into the object the message keeps; the next read starts small.
                    size = end
                    read_size = _PROBE
                    if not (acked and offset in acked):
                        start = head_size + route_len + header_len_size
                        if flags & flag_expiry:
                            start += expiry_size
                        if start > len(chunk):
                            chunk = seg.read(offset, start)
                        start += unpack_header_len(chunk, start - header_len_size)[0]
                        if start > len(chunk):
                            chunk = seg.read(offset, start)
                        body = seg.read_body(offset + start, end - start)
                else:
                    read_size = READ_CHUNK
                record_offset = offset + pos
                p = pos + head_size
                pos = end
                if acked and record_offset in acked:
                    continue
                expiry = None
                if flags & flag_expiry:
                    expiry = clock + unpack_expiry(chunk, p)[0] / 1000
                    p += expiry_size
                route = chunk[p:p + route_len]
                p += route_len
                header_end = p + header_len_size + unpack_header_len(chunk, p)[0]
                header = chunk[p + header_len_size:header_end]
                if body is None:
                    body = chunk[header_end:end]
                if route != last_route:
                    last_route = route
                    last_parts = _route_parts(route)
                if header != last_header:
                    last_header = header
                qm = QueuedMessage(seq, Message(last_parts[0], last_parts[1], last_route, last_header, body))
                qm.seg = seg
                qm.off = record_offset
                qm.durable = bool(flags & FLAG_DURABLE)
                qm.expiry = expiry
                if delivered:
                    deliveries = delivered.get(record_offset, 0)
                    if deliveries:
                        qm.redelivered = True
                        qm.deliveries = deliveries
                fresh.append(qm)
                room -= len(body)
                self.fresh_bytes += len(body)
                want -= 1
                self.disk_count -= 1
                if not self.disk_count:
                    break
            offset += pos
        self.cursor = (seg, offset) if self.disk_count else None

    def _purge_disk_tail(self) -> None:
        assert self.cursor is not None  # there is a disk tail
        seg, offset = self.cursor
        self.cursor = None
        self.disk_count = 0
        # Every record from the cursor on is ready (never delivered): settle them all.
        ids = sorted(self.segments)
        for seg_id in ids:
            if seg_id < seg.id:
                continue
            current = self.segments[seg_id]
            if seg_id > seg.id and current is not self.write_seg:
                self.segments.pop(seg_id)
                current.remove()
                continue
            start = offset if current is seg else len(sg.MAGIC)
            data = current.read(start, current.size - start)
            records, _, _ = sg.scan(data, 0, current.check)
            for rel, flags, _seq in records:
                off = start + rel
                if off in current.acked_set:
                    continue
                if flags & sg.FLAG_DURABLE:
                    current.mark(sg.MARK_ACK, off)
                current.acked += 1
            if current.acked >= current.count and current is not self.write_seg:
                self.segments.pop(seg_id)
                current.remove()

    # --------------------------------------------------------------- recovery
    def _recover(self) -> None:
        """Rebuild the disk tail from the segment files after a restart or crash."""
        started = time.monotonic()
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".seg"))
        total = 0
        last_name = names[-1] if names else None
        for name in names:
            try:
                seg_id = int(name[:-4])
            except ValueError:
                continue
            seg = Segment(self.persister, self.directory, seg_id, create=False)
            ack_path = seg.path[:-4] + ".ack"
            if os.path.exists(ack_path):
                with open(ack_path, "rb") as f:
                    marks = f.read()
                acked, delivered, problem = sg.read_marks(marks)
                if problem:
                    log.warning("queue store %s: %s in %s: skipped (their messages may be delivered again)",
                                self.directory, problem, ack_path)
                    if len(marks) % sg.MARK_SIZE:  # new marks must start at a mark boundary
                        os.truncate(ack_path, len(marks) - len(marks) % sg.MARK_SIZE)
                seg.acked_set, seg.delivered = acked, delivered
            with open(seg.path, "rb") as f:
                data = f.read()
            check = sg.CHECKSUMS.get(data[:len(sg.MAGIC)])
            if check is None:
                if not sg.MAGIC.startswith(data):  # else just created before a crash
                    self._quarantine(seg, "bad segment header")
                seg.remove()  # (copied to quarantine): its id must be free for new segments
                continue
            seg.check = check
            records, good_end, problem = sg.scan(data, len(sg.MAGIC), check)
            if problem:
                if name == last_name:
                    if "checksum" in problem:  # damage rather than a torn append: keep a copy
                        self._quarantine(seg, problem)
                    log.warning("queue store %s: torn tail in %s (%s): truncated to %d bytes",
                                self.directory, name, problem, good_end)
                    assert seg.fd is not None  # just opened
                    os.ftruncate(seg.fd, good_end)
                else:
                    self._quarantine(seg, problem)
            seg.size = seg.flushed = good_end
            seg.count = len(records)
            live = 0
            for offset, flags, seq in records:
                if seq > self.max_seq:
                    self.max_seq = seq
                if not flags & sg.FLAG_DURABLE or offset in seg.acked_set:
                    seg.acked_set.add(offset)  # paged transient messages do not survive restarts
                    continue
                if self.cursor is None:
                    self.cursor = (seg, offset)
                live += 1
                self.ready_bytes += sg.record_body_length(data, offset)
            seg.acked = seg.count - live
            if live == 0:
                seg.remove()
                continue
            self.segments[seg_id] = seg
            self.disk_count += live
            total += live
        if total or names:
            log.info("queue store %s: recovered %d messages from %d segments in %.2fs", self.directory, total,
                     len(names), time.monotonic() - started)

    def _quarantine(self, seg: Segment, problem: str) -> None:
        target_dir = os.path.join(self.persister.root, "quarantine")
        os.makedirs(target_dir, exist_ok=True)
        target = os.path.join(target_dir, f"{os.path.basename(self.directory)}-{os.path.basename(seg.path)}")
        shutil.copyfile(seg.path, target)
        log.error("queue store %s: corrupt segment %s (%s): copied to %s; the records before it are recovered",
                  self.directory, seg.path, problem, target)
