"""Writes buffered segment data once per loop tick and runs group-commit fsyncs.

Durable appends join the open *batch*. At every flush the buffered bytes of all dirty
segments are written (before any client output of that tick, so a delivery is never sent
before its delivered-mark is written); then, if no fsync is running, the open batch is
closed and its files are fsynced in a worker thread while new appends join the next batch.
When the fsync returns, every confirm waiting on that batch (or an earlier one) goes out in
one basic.ack per channel. There is no timer: a lone publish is confirmed after one fsync,
and under load one fsync covers everything that arrived while the previous one ran.

The store is the one hop of the publish path where accepted work can pile up (the loop is
single-threaded: everything else is handled before the next read). Its *outstanding* bytes
are those written for durable records but not yet covered by a finished fsync, plus bytes
kept after a failed write. Past FLOW_HIGH the persister says it is `over` (its listeners are
told); the session then stops reading the publishers that wrote into it (credit flow), and
once an fsync brings it below FLOW_LOW it tells them again. It drains by itself (the fsync
runs in a thread), so no client is ever waited on.

Big bodies held back (RabbitMQ's rule, rabbit_msg_store's "flying" writes and
rabbit_variable_queue's confirm on ack): a persistent message with a body of HOLD_MIN or more,
published on a channel into durable queues that have consumers, is not written at once. Each
such queue keeps its record in memory (DiskQueueStore.held) for up to `hold_time` seconds, and
the held bodies of all queues for at most `hold_max` bytes (past it the oldest is written).
A record whose message is settled in its queue before then (acked, delivered without ack,
dead-lettered nowhere, purged, its queue deleted) is never written; one still unsettled at its
deadline is written then, and one requeued, paged or followed by another record of its queue
is written at once (a queue's records stay in its order). The publish's confirm is a Ticket
(warren.store.settlement): due once every queue it went to has settled its copy or written it,
and the batches written for it are fsynced. So a message delivered but not acked is on disk
before its confirm, and one acked before its write never touches the disk: disk bandwidth goes
to the messages that need it, at the cost of up to `hold_time` more confirm latency for those.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable

# The persister is above the disk store it makes and the handles it hands out: those see it
# through Protocols (disk.StorePersister, settlement.GroupCommit), so none imports it.
from .disk import DiskQueueStore
from .settlement import StoreBatch

if TYPE_CHECKING:
    from .queued_message import QueuedMessage
    from .segment_file import Segment
    from .settlement import SyncWaiter

    RunInThread = Callable[[Callable[[], None], Callable[[str | None], None]], None]

log = logging.getLogger("warren.store")

# Outstanding bytes (written, fsync pending) at which publishers into the store are paused,
# and at which they are let go again. A disk that keeps up never gets there (an fsync of
# 64 MiB took 25-30 ms on the development VM, where one publisher writes ~350 MiB/s); one that
# does not holds at most this much in dirty pages instead of letting the kernel's dirty-page
# throttling stall the whole event loop in pwrite. The gap keeps a publisher from toggling on
# every fsync.
FLOW_HIGH = 64 << 20
FLOW_LOW = FLOW_HIGH // 2

# Holding big bodies back (see the module's docstring). Smaller bodies are cheap to write (the
# disk is not their limit) and keep the plain path. The time covers a consumer that acks every
# few messages of a few MiB each; the bytes bound what a deadline can release at once.
HOLD_MIN = 64 << 10
HOLD_TIME = float(os.environ.get("WARREN_HOLD_MS", "250")) / 1000
HOLD_BYTES = 64 << 20


def _fsync_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.fsync(fd)


class Persister:
    def __init__(self, root: str, run_in_thread: RunInThread | None = None, window: int | None = None):
        self.root = root
        self.window = window  # fresh messages a queue keeps in memory (None: the store's default)
        # run_in_thread(fn, done): run fn() off the event loop and call done(error) on it.
        # Without one (unit tests), fsyncs run inline.
        self.run_in_thread = run_in_thread
        self.dirty: set[Segment] = set()       # segments with buffered bytes or marks
        self.batch = StoreBatch(self, 1)       # the batch new durable appends join
        self.synced = 0                        # every batch up to this one is on disk (or failed)
        self.failed: dict[int, str] = {}       # batch -> error text, for nacks
        self.syncing = False
        self.to_sync: set[Segment] = set()     # segments with durable data in the open batch
        self.waiting: set[SyncWaiter] = set()  # channels with confirms waiting for a batch
        self.close_after_sync: list[int] = []
        self.syncing_fds: list[int] = []       # what the running fsync covers
        self.sync_started = 0.0                # when the running fsync started (monotonic)
        # Credit flow (see the module's docstring).
        self.flow_high = FLOW_HIGH
        self.flow_low = FLOW_LOW
        self.unsynced = 0        # bytes written for the open batch
        self.syncing_bytes = 0   # bytes the running fsync covers
        self.stuck = 0           # bytes still buffered after a failed write
        self.written = 0         # record bytes the last flush had to write (who published into the store)
        self.over = False        # outstanding passed flow_high and has not fallen to flow_low yet
        self.flow_listeners: dict[Callable[[bool], None], None] = {}  # a set, in order
        # The memory monitor's word for the queue stores (DiskQueueStore.set_paging), kept
        # here so a store created later starts with it.
        self.paging = False
        self.disk_alarm = False
        # Held big bodies (see the module's docstring): every store's, oldest first, with the
        # store and the deadline. Holding needs the broker's timers (`scheduler`).
        self.scheduler: Any = None
        self.hold_time = HOLD_TIME
        self.hold_max = HOLD_BYTES
        self.held: OrderedDict[QueuedMessage, tuple[DiskQueueStore, float]] = OrderedDict()
        self.held_bytes = 0
        self._hold_timer: Any = None
        self.holds = 0           # records held back, since the start
        self.holds_skipped = 0   # ... of which never written (settled first)
        self.held_bytes_skipped = 0

    # queue stores ---------------------------------------------------------------
    _paging_ids = itertools.count(1)

    def queue_dir(self, vhost: str, queue: str) -> str:
        digest = hashlib.sha1(f"{vhost}\0{queue}".encode()).hexdigest()[:24]
        return os.path.join(self.root, "queues", digest)

    def replica_dir(self, vhost: str, queue: str) -> str:
        """Where a replicated queue's log is kept on a cluster member, leader or follower."""
        digest = hashlib.sha1(f"{vhost}\0{queue}".encode()).hexdigest()[:24]
        return os.path.join(self.root, "replicas", digest)

    def queue_store(self, vhost: str, queue: str, durable: bool) -> DiskQueueStore:
        kwargs = {"window": self.window} if self.window else {}
        if durable:
            return DiskQueueStore(self, self.queue_dir(vhost, queue), durable=True, **kwargs)
        # Transient queues only touch the disk when they page; nothing there outlives a run.
        return DiskQueueStore(self, os.path.join(self.root, "paging", str(next(self._paging_ids))),
                              durable=False, **kwargs)

    def clean_start(self, durable_queues: Iterable[tuple[str, str]]) -> None:
        """At start-up: forget paged transient messages and message dirs of queues that no
        longer exist (deleted while the broker was down, or just before a crash)."""
        shutil.rmtree(os.path.join(self.root, "paging"), ignore_errors=True)
        live = {self.queue_dir(v, q) for v, q in durable_queues}
        queues_dir = os.path.join(self.root, "queues")
        if os.path.isdir(queues_dir):
            for name in os.listdir(queues_dir):
                path = os.path.join(queues_dir, name)
                if path not in live:
                    log.info("removing messages of a queue that no longer exists: %s", path)
                    shutil.rmtree(path, ignore_errors=True)

    # called by stores ---------------------------------------------------------
    def durable_append(self, segment: Segment) -> StoreBatch:
        """`segment` holds a durable record of the open batch: its handle."""
        self.to_sync.add(segment)
        return self.batch

    @property
    def holding(self) -> bool:
        """Whether big records may be held back (timers are running)."""
        return self.scheduler is not None and self.hold_time > 0

    def hold(self, store: DiskQueueStore, qm: QueuedMessage) -> None:
        """`store` holds qm's record back (it set qm.hold)."""
        scheduler = self.scheduler
        self.held[qm] = (store, scheduler.now() + self.hold_time)
        self.held_bytes += len(qm.message.body)
        self.holds += 1
        while self.held_bytes > self.hold_max:
            old, (old_store, _) = next(iter(self.held.items()))
            old_store.write_held(old)
        if self._hold_timer is None and self.held:
            self._hold_timer = scheduler.call_later(self.hold_time, self._hold_expired)

    def unhold(self, qm: QueuedMessage, written: bool) -> None:
        """qm's record is held no more: written, or (not `written`) never to be."""
        if self.held.pop(qm, None) is not None:
            size = len(qm.message.body)
            self.held_bytes -= size
            if not written:
                self.holds_skipped += 1
                self.held_bytes_skipped += size

    def write_held(self) -> None:
        """Write every held record now (shutdown)."""
        while self.held:
            qm, (store, _) = next(iter(self.held.items()))
            store.write_held(qm)

    def _hold_expired(self) -> None:
        self._hold_timer = None
        held = self.held
        if not held:
            return
        now = self.scheduler.now()
        wrote = False
        while held:
            qm, (store, deadline) = next(iter(held.items()))
            if deadline > now + 0.0005:
                self._hold_timer = self.scheduler.call_later(deadline - now, self._hold_expired)
                break
            store.write_held(qm)
            wrote = True
        if wrote:
            self.flush()

    def subscribe_flow(self, listener: Callable[[bool], None]) -> None:
        """Call listener(over) whenever `over` changes."""
        self.flow_listeners[listener] = None

    def unsubscribe_flow(self, listener: Callable[[bool], None]) -> None:
        self.flow_listeners.pop(listener, None)

    @property
    def outstanding(self) -> int:
        return self.unsynced + self.syncing_bytes + self.stuck

    def close_fd(self, fd: int) -> None:
        """Close a file descriptor, but not under a running fsync."""
        if self.syncing:
            self.close_after_sync.append(fd)
        else:
            os.close(fd)

    # called by the session layer -------------------------------------------------
    def flush(self) -> None:
        """Write everything buffered, then start an fsync if one is due."""
        appended = 0
        if self.dirty:
            dirty, self.dirty = self.dirty, set()
            to_sync = self.to_sync
            for segment in dirty:
                before = segment.flushed
                appended += segment.size - before
                try:
                    segment.write_out()
                except OSError as err:
                    log.error("write to %s failed: %s", segment.path, err)
                    if segment in to_sync:  # else only bytes of batches already failed
                        self.failed[self.batch.number] = str(err)
                    self.dirty.add(segment)  # keep the bytes; retried at the next flush
                if segment in to_sync:  # durable records: outstanding until fsynced
                    self.unsynced += segment.flushed - before
        # (Every flush: a segment whose write failed may have been removed since.)
        self.stuck = sum(s.size - s.flushed for s in self.dirty) if self.dirty else 0
        if self.to_sync and not self.syncing:
            self._start_sync()  # (an inline fsync flushes again: set `written` after it)
        elif not self.syncing:
            self.unsynced = 0  # the segments written for were removed: nothing to sync
        # Record bytes this flush had to write, written or not (a failed write counts: its
        # bytes stay in memory): who published into the store is held when it is over.
        self.written = appended
        if appended or self.over:
            self._check_flow()

    def wait_for(self, channel: SyncWaiter) -> None:
        self.waiting.add(channel)

    def sync_now(self, write_held: bool = False) -> bool:
        """Flush and fsync everything synchronously (tx.commit, shutdown). True if all is safe.
        `write_held` (shutdown): the held records too, the queues' messages outlive the run.
        A commit leaves them held: a transaction's publishes are never held, and settling
        the others needs no write."""
        if write_held:
            self.write_held()
        self.flush()
        batch = self.batch.number
        # Also cover a batch whose fsync is still running in the worker: marking this batch
        # synced marks that one too.
        fds = [s.fd for s in self.to_sync if s.fd is not None] + self.syncing_fds
        self.to_sync = set()
        self.batch = StoreBatch(self, batch + 1)
        self.unsynced = self.syncing_bytes = 0  # the running fsync's bytes are covered too
        error = None
        try:
            _fsync_all(fds)
        except OSError as err:
            error = str(err)
        self._synced(batch, error)
        self._check_flow()
        return error is None and batch not in self.failed

    # group commit ---------------------------------------------------------------
    def _start_sync(self) -> None:
        batch = self.batch.number
        fds = self.syncing_fds = [s.fd for s in self.to_sync if s.fd is not None]
        self.to_sync = set()
        self.batch = StoreBatch(self, batch + 1)
        self.syncing = True
        self.sync_started = time.monotonic()
        self.syncing_bytes, self.unsynced = self.unsynced, 0
        if self.run_in_thread is None:
            try:
                _fsync_all(fds)
                self._sync_done(batch, None)
            except OSError as err:
                self._sync_done(batch, str(err))
            return
        self.run_in_thread(lambda: _fsync_all(fds), lambda error: self._sync_done(batch, error))

    def stalled(self, seconds: float) -> bool:
        """Whether the running fsync has taken longer than `seconds` (a stalled disk: a
        cluster member then stops renewing its lease, warren.cluster.membership)."""
        return self.syncing and time.monotonic() - self.sync_started > seconds

    def _sync_done(self, batch: int, error: str | None) -> None:
        self.syncing = False
        self.syncing_fds = []
        self.syncing_bytes = 0
        for fd in self.close_after_sync:
            os.close(fd)
        self.close_after_sync.clear()
        self._synced(batch, error)
        # Whatever arrived meanwhile forms the next batch (and flush tells the listeners
        # if the store has drained).
        self.flush()

    def _check_flow(self) -> None:
        level = self.outstanding
        if self.over:
            if level > self.flow_low:
                return
            self.over = False
        elif level > self.flow_high:
            self.over = True
        else:
            return
        for listener in list(self.flow_listeners):
            listener(self.over)

    def _synced(self, batch: int, error: str | None) -> None:
        if error:
            log.error("fsync failed: %s", error)
            self.failed[batch] = error
        self.synced = max(self.synced, batch)
        waiting, self.waiting = self.waiting, set()
        for channel in waiting:
            channel.store_synced()
        if len(self.failed) > 1000:
            for b in [b for b in self.failed if b < self.synced - 1000]:
                del self.failed[b]
