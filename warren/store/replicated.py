"""A replicated queue's store (the QueueStore protocol over a ReplicaLog): every change of the
queue's content is an entry of its log, so any replica that has the log can become the
queue. What the queue holds in memory is what MemoryQueueStore holds (fresh messages, then the
requeued ones by position); the log is its only durable form.

Entries (kind, payload):

- ENQUEUE: a message accepted (its seq, delivery count, expiry, route, header, body); the
  entry's offset is the message's id on every replica. ENQUEUE_FROM is the same with the
  publish's origin (its node's publisher and its number, in order: QuorumPublisher): a publish
  sent again after the leader that had it died or stopped leading is recognised (`enqueuers`: each publisher's
  last, taken in order: QuorumQueue.publish_from) and not taken twice (rabbit_fifo's
  enqueuer sequence numbers);
- SETTLE: ids gone for good (acked, rejected, expired, dead-lettered, dropped);
- RETURN: an id back ahead of the ready messages with a new seq (rabbit_fifo's returns);
  a requeue to the tail is an ENQUEUE of the copy and a SETTLE of the original;
- DELIVERED: ids handed to a consumer that must ack, and who holds them (its *holder*: the
  key a consumer of another node keeps across leaders, or "" for one of the leader's node);
- PURGE: every ready message at that point settled;
- NOOP: nothing, a proven new leader's first entry (warren.cluster.replication: entries of
  earlier epochs commit with one of the leader's own).

A publish is confirmed once its ENQUEUE is *committed* (`commit`: on one node, on disk; on a
cluster, warren.cluster.replication's rule), through the settlement handle accept() returns.
Entries are committed in order, so a SETTLE never outlives the ENQUEUE it settles, and a
requeue's copy is in the log before its original goes.

Replaying the log (recover) rebuilds the store as the queue was after its last committed, or
last written, entry: a message handed out and not settled stays *parked* with its holder when
that consumer may still be there (its node runs: it re-attaches to the new leader and acks
it there, as a quorum queue's consumers on surviving nodes do in RabbitMQ), and otherwise comes
back redelivered with its count one higher, ahead of the ready ones (rabbit_fifo returns a lost
consumer's messages so)."""

from __future__ import annotations

import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..amqp.message import Message
from .disk import _route_parts
from .queued_message import QueuedMessage
from .requeued import RequeuedMessages
from .settlement import SyncWaiter

if TYPE_CHECKING:
    from .replica_log import ReplicaLog
    from .settlement import Ticket

ENQUEUE, SETTLE, RETURN, DELIVERED, PURGE, ENQUEUE_FROM, NOOP = 1, 2, 3, 4, 5, 6, 7

_ENQUEUE = struct.Struct(">QIqHI")  # seq, deliveries, expiry (wall ms, -1: none), route length, header length
_ORIGIN = struct.Struct(">QB")      # ENQUEUE_FROM's: the publish's number, its publisher's length (then it)
_IDS = struct.Struct(">Q")
_RETURN = struct.Struct(">QQI")     # id, new seq, deliveries
_HOLDER = struct.Struct(">H")       # a DELIVERED entry's holder length (the holder, then ids)

# qm.seg of a message in the log: it has a durable record (so the queue waits for a copy's
# safety before settling it, as for a disk store's record).
IN_LOG: Any = object()
# qm.message of a ready message whose body is only in the log (read back when it is next).
PAGED = Message("", "", b"", b"", b"")
WINDOW = 10_000  # ready messages kept in memory, from the head; the others are read back


def _ids(qms: Iterable[QueuedMessage]) -> bytes:
    return b"".join(_IDS.pack(qm.off) for qm in qms)


class CommitPoint:
    """A settlement handle: safe once the log is committed up to `end`, failed if this replica
    stopped leading first (its fate is unknown: a nack). The appends of one tick share one."""

    __slots__ = ("store", "end", "waiters")

    def __init__(self, store: Commits, end: int):
        self.store = store
        self.end = end
        self.waiters: list[SyncWaiter] = []

    def status(self) -> bool | None:
        if self.store.committed >= self.end:
            return True
        return False if self.store.failed else None

    @property
    def moved(self) -> bool:
        """(False:) its replica stopped leading first: the entry may yet be committed by the
        next leader, or not."""
        return self.store.failed

    def notify(self, waiter: SyncWaiter) -> None:
        if self.status() is not None:
            waiter.store_synced()
        else:
            self.waiters.append(waiter)


class Commits:
    """A replicated store's commits (a quorum queue's, a stream's): `committed` moves as its
    leader's rules say, and the appends waiting for it are then settled."""

    def __init__(self, committed: int):
        self.committed = committed
        self.failed = False
        self._points: deque[CommitPoint] = deque()

    def commit(self, end: int) -> None:
        """Entries below `end` are committed: their publishes are confirmed."""
        if end <= self.committed:
            return
        self.committed = end
        points = self._points
        while points and points[0].end <= end:
            for waiter in points.popleft().waiters:
                waiter.store_synced()

    def fail(self) -> None:
        """This replica no longer leads: what was not committed is not confirmed (nacks)."""
        self.failed = True
        points, self._points = self._points, deque()
        for point in points:
            for waiter in point.waiters:
                waiter.store_synced()

    def _point(self, end: int) -> CommitPoint:
        """What an append that ends the log at `end` waits for."""
        points = self._points
        if points and not points[-1].waiters:
            points[-1].end = end  # (no one waits on it yet: it covers this entry too)
            return points[-1]
        point = CommitPoint(self, end)
        points.append(point)
        return point


class ReplicatedQueueStore(Commits):
    """The queue's messages in memory, their changes in its replica log."""

    def __init__(self, log: ReplicaLog, epoch: int, window: int = WINDOW):
        # Nothing is known committed until its leader's rules say so: a new leader's log may
        # end in entries its predecessor never committed, and what it delivers, or confirms of
        # a publish sent again (enqueued), waits for them to be held by a majority.
        super().__init__(0)
        self.log = log
        self.epoch = epoch
        self.window = window
        self._sizes: dict[int, int] = {}  # a paged message's body size, by id
        self._fresh: deque[QueuedMessage] = deque()
        self._requeued = RequeuedMessages()
        self.ready_bytes = 0
        self.by_id: dict[int, QueuedMessage] = {}  # every message not settled, ready or not
        self.max_seq = 0
        # What consumers held when this replica took over, by holder, until they re-attach
        # (claim) or the leader gives up on them: not ready, counted unacked.
        self.parked: dict[str, dict[int, QueuedMessage]] = {}
        self.returned: list[QueuedMessage] = []  # what a replay gave back of what was handed out
        self.enqueuers: dict[str, int] = {}  # a publisher -> the last of its publishes written
        # A restarted leader's entries until it has an epoch of its own (warren.cluster.replicas:
        # its old one may hold entries its followers have and it lost): written by `lead`.
        self.held: list[tuple[int, bytes, Any]] | None = None
        self.origin: tuple[str, int] | None = None  # the publish being accepted (QuorumQueue.publish_from)

    def _append(self, kind: int, head: bytes, body: Any = None) -> CommitPoint:
        if self.failed:  # (no longer its leader: its log is a follower's now, written by the leader only)
            return CommitPoint(self, self.log.end + 1)
        if self.held is not None:
            self.held.append((kind, head, body))
            return self._point(self.log.end + len(self.held))
        self.log.append(self.epoch, kind, head, body)
        return self._point(self.log.end)

    def lead(self, epoch: int) -> None:
        """Its leader's epoch from now on: what it held is written in it."""
        self.epoch = epoch
        held, self.held = self.held or [], None
        for kind, head, body in held:
            self.log.append(epoch, kind, head, body)

    @property
    def _end(self) -> int:
        return self.log.end + (len(self.held) if self.held else 0)

    def release_cursor(self) -> int:
        """Below this offset no entry is needed to rebuild the queue: its oldest live message's
        (ids go into by_id in offset order), or the log's end when it holds none."""
        return min(next(iter(self.by_id), self.log.end), self.log.end)  # (a held message is not in the log yet)

    # ------------------------------------------------------------------ QueueStore
    def __len__(self) -> int:
        return len(self._fresh) + len(self._requeued)

    def accept(self, qm: QueuedMessage, ticket: Ticket | None = None) -> CommitPoint:
        message = qm.message
        expiry = -1 if qm.expiry is None else int((qm.expiry - time.monotonic() + time.time()) * 1000)
        head = _ENQUEUE.pack(qm.seq, qm.deliveries, expiry, len(message.route), len(message.header))
        kind, origin = ENQUEUE, self.origin
        if origin is not None:
            self.origin = None
            publisher = origin[0].encode()
            kind, head = ENQUEUE_FROM, head + _ORIGIN.pack(origin[1], len(publisher)) + publisher
            self.enqueuers[origin[0]] = origin[1]  # (taken in order: QuorumQueue.publish_from)
        qm.off = self._end
        qm.seg = IN_LOG
        qm.durable = True
        point = self._append(kind, head + message.route + message.header, message.body)
        self.by_id[qm.off] = qm
        self.max_seq = max(self.max_seq, qm.seq)
        return point

    def write_held(self, qm: QueuedMessage) -> None:
        pass  # (never holds a record back)

    def push(self, qm: QueuedMessage) -> None:
        self.ready_bytes += len(qm.message.body)
        if len(self._fresh) >= self.window:  # (beyond the window: its body is read back when it is next)
            self._sizes[qm.off] = len(qm.message.body)
            qm.message = PAGED
        self._fresh.append(qm)

    def pop(self) -> QueuedMessage | None:
        if self._requeued:
            qm = self._requeued.take()
        elif self._fresh:
            qm = self._fresh.popleft()
            if qm.message is PAGED:
                self._load(qm)
        else:
            return None
        self.ready_bytes -= len(qm.message.body)
        return qm

    def peek(self) -> QueuedMessage | None:
        if self._requeued:
            return self._requeued.first()
        if not self._fresh:
            return None
        qm = self._fresh[0]
        if qm.message is PAGED:
            self._load(qm)
        return qm

    def _load(self, qm: QueuedMessage) -> None:
        self._sizes.pop(qm.off, None)
        if self.held and qm.off >= self.log.end:  # (not written yet: lead)
            kind, head, body = self.held[qm.off - self.log.end]
            qm.message = _message(kind, head if body is None else head + bytes(body))
            return
        entry = self.log.read(qm.off)
        qm.message = _message(entry.kind, entry.payload)

    def drop_head(self, n: int) -> list[QueuedMessage]:
        taken: list[QueuedMessage] = []
        while len(taken) < n and (qm := self.pop()) is not None:
            taken.append(qm)
        return taken

    def requeue(self, qm: QueuedMessage) -> None:
        self._append(RETURN, _RETURN.pack(qm.off, qm.seq, qm.deliveries))
        self.max_seq = max(self.max_seq, qm.seq)
        self._requeued.push(qm)
        self.ready_bytes += len(qm.message.body)

    def delivered(self, qm: QueuedMessage, holder: str = "") -> None:
        key = holder.encode()
        self._append(DELIVERED, _HOLDER.pack(len(key)) + key + _IDS.pack(qm.off))

    def delivery_gate(self) -> CommitPoint | None:
        """What a delivery just recorded (its DELIVERED or SETTLE entry, and the ENQUEUE
        before it) waits for before it leaves: their commit, or None once they are. A leader
        that stopped leading gives a point that fails: the delivery never leaves."""
        end = self._end
        if self.committed >= end:
            return None
        return CommitPoint(self, end + 1) if self.failed else self._point(end)

    def claim(self, holder: str) -> dict[int, QueuedMessage]:
        """What `holder` held when this replica took over (it re-attached, or is given up on)."""
        return self.parked.pop(holder, {})

    def take_back(self, holder: str, ids: Iterable[int]) -> dict[int, QueuedMessage]:
        """Those of `ids` that are ready here though `holder` was handed them: their DELIVERED
        entry died with the old leader, before it reached this replica. They leave the ready
        ones as handed to it (so a message a consumer holds or acked is not delivered again as
        new); the caller counts them unacked."""
        wanted = {ident for ident in ids if ident in self.by_id}
        if not wanted:
            return {}
        taken = {qm.off: qm for qm in self._requeued if qm.off in wanted}
        if taken:
            kept = [qm for qm in self._requeued if qm.off not in taken]
            self._requeued.clear()
            for qm in kept:
                self._requeued.push(qm)
        if len(taken) < len(wanted):  # (fresh ones are in offset order: only the head is looked at)
            last, head, fresh = max(wanted), [], self._fresh
            while fresh and fresh[0].off <= last:
                qm = fresh.popleft()
                if qm.off in wanted:
                    taken[qm.off] = qm
                else:
                    head.append(qm)
            fresh.extendleft(reversed(head))
        for qm in taken.values():
            if qm.message is PAGED:
                self._load(qm)
            self.ready_bytes -= len(qm.message.body)
            qm.deliveries += 1  # (as the old leader counted its delivery)
        if taken:
            key = holder.encode()
            self._append(DELIVERED, _HOLDER.pack(len(key)) + key + _ids(taken.values()))
        return taken

    def log_returns(self) -> None:
        """Write what the replay gave back as returns (only once this replica surely leads: a
        replica that may follow writes nothing of its own)."""
        returned, self.returned = self.returned, []
        for qm in returned:
            if self.by_id.get(qm.off) is qm:
                self._append(RETURN, _RETURN.pack(qm.off, qm.seq, qm.deliveries))

    def unpark(self, ident: int) -> QueuedMessage | None:
        """A parked message settled by id (its consumer acked it before re-attaching)."""
        for holder, held in self.parked.items():
            qm = held.pop(ident, None)
            if qm is not None:
                if not held:
                    del self.parked[holder]
                return qm
        return None

    def carry_deliveries(self, qm: QueuedMessage) -> None:
        pass  # (its ENQUEUE carries the count)

    def settle(self, qm: QueuedMessage) -> None:
        if self.by_id.pop(qm.off, None) is not None:
            self._append(SETTLE, _IDS.pack(qm.off))

    def purge(self) -> int:
        count = len(self)
        for qm in self._requeued.in_order() + list(self._fresh):
            self.by_id.pop(qm.off, None)
        self._sizes.clear()
        self._fresh.clear()
        self._requeued.clear()
        self.ready_bytes = 0
        self._append(PURGE, b"")
        return count

    def peek_all(self) -> list[QueuedMessage]:
        """(Management views: every paged body is read back.)"""
        for qm in self._fresh:
            if qm.message is PAGED:
                self._load(qm)
        return self._requeued.in_order() + list(self._fresh)

    def destroy(self) -> None:
        self.fail()
        self.log.destroy()

    # ------------------------------------------------------------------ replay
    @classmethod
    def recover(cls, log: ReplicaLog, epoch: int, keep: Callable[[str], bool] = lambda holder: False
                ) -> ReplicatedQueueStore:
        """The store as the log leaves it (module docstring), to lead it in `epoch`; what a
        holder for which `keep` is true held stays parked with it."""
        store = cls(log, epoch)
        live: dict[int, QueuedMessage] = {}
        ahead: set[int] = set()        # returned ahead of the ready ones
        out: dict[int, str] = {}       # handed out, not settled: by whom
        now_wall, now = time.time(), time.monotonic()
        for entry in log.entries(log.first):
            kind, payload = entry.kind, entry.payload
            if kind == ENQUEUE or kind == ENQUEUE_FROM:  # (its body stays in the log: read back when needed)
                seq, deliveries, expiry, route_len, header_len, at, origin = _enqueued(kind, payload)
                if origin is not None:
                    store.enqueuers[origin[0]] = max(origin[1], store.enqueuers.get(origin[0], 0))
                qm = QueuedMessage(seq, PAGED, deliveries > 0)
                store._sizes[entry.offset] = len(payload) - at - route_len - header_len
                qm.deliveries = deliveries
                qm.off, qm.seg, qm.durable = entry.offset, IN_LOG, True
                if expiry >= 0:
                    qm.expiry = now + (expiry / 1000 - now_wall)
                live[entry.offset] = qm
                store.max_seq = max(store.max_seq, seq)
            elif kind == SETTLE:
                for (ident,) in _IDS.iter_unpack(payload):
                    live.pop(ident, None)
                    ahead.discard(ident)
                    out.pop(ident, None)
            elif kind == RETURN:
                ident, seq, deliveries = _RETURN.unpack(payload)
                if ident in live:
                    live[ident].seq, live[ident].deliveries, live[ident].redelivered = seq, deliveries, True
                    ahead.add(ident)
                    out.pop(ident, None)
                    store.max_seq = max(store.max_seq, seq)
            elif kind == DELIVERED:
                (length,) = _HOLDER.unpack_from(payload)
                holder = bytes(payload[_HOLDER.size:_HOLDER.size + length]).decode()
                for (ident,) in _IDS.iter_unpack(payload[_HOLDER.size + length:]):
                    if ident in live:
                        out[ident] = holder
                        ahead.discard(ident)
            elif kind == PURGE:
                for ident in [i for i in live if i not in out]:
                    del live[ident]
                ahead.clear()
        sizes, store._sizes = store._sizes, {}
        for ident, qm in live.items():  # (in offset order: the order they were enqueued)
            store.by_id[ident] = qm
            store.ready_bytes += sizes[ident]
            held_by = out.get(ident)
            if held_by is not None and keep(held_by):  # (its consumer may re-attach: it keeps it)
                qm.deliveries += 1
                qm.redelivered = True
                store._load(qm)
                store.parked.setdefault(held_by, {})[ident] = qm
                store.ready_bytes -= sizes[ident]
            elif held_by is not None:  # its consumer is gone with the old leader: back, counted, ahead
                qm.deliveries += 1
                qm.redelivered = True
                store.max_seq += 1
                qm.seq = store.max_seq
                store._load(qm)
                store._requeued.push(qm)
                store.returned.append(qm)
            elif ident in ahead:
                store._load(qm)
                store._requeued.push(qm)
            else:
                if len(store._fresh) < store.window:
                    store._load(qm)
                else:
                    store._sizes[ident] = sizes[ident]
                store._fresh.append(qm)
        return store


def _enqueued(kind: int, payload: bytes) -> tuple[int, int, int, int, int, int, tuple[str, int] | None]:
    """An ENQUEUE or ENQUEUE_FROM entry's seq, delivery count, expiry, route and header
    lengths, where its route starts, and its origin (None: not numbered, as a requeue's copy)."""
    seq, deliveries, expiry, route_len, header_len = _ENQUEUE.unpack_from(payload)
    if kind != ENQUEUE_FROM:
        return seq, deliveries, expiry, route_len, header_len, _ENQUEUE.size, None
    n, length = _ORIGIN.unpack_from(payload, _ENQUEUE.size)
    at = _ENQUEUE.size + _ORIGIN.size
    return seq, deliveries, expiry, route_len, header_len, at + length, (bytes(payload[at:at + length]).decode(), n)


def _message(kind: int, payload: bytes) -> Message:
    """The message of an ENQUEUE or ENQUEUE_FROM entry's payload."""
    _seq, _deliveries, _expiry, route_len, header_len, at, _origin = _enqueued(kind, payload)
    route = payload[at:at + route_len]
    header = payload[at + route_len:at + route_len + header_len]
    return Message(*_route_parts(route), route, header, payload[at + route_len + header_len:])
