"""A priority queue's store: one store per priority level, highest level delivered first.

RabbitMQ 3.10's classic priority queues (rabbit_priority_queue.erl) keep one backing queue
per priority and run the highest non-empty one; so does this store, over any QueueStore
(memory or segment files), so the queue above it does not change. A message's level is its
`priority` property, 0 when absent, capped at the queue's x-max-priority (RabbitMQ's
priority/2). It is read from the stored header bytes whenever a message must be found again
(requeue, settle): the header never changes, so a message always lands in the same level.
Within a level the store keeps its own order: FIFO, requeued messages back at their original
position. Sequence numbers come from the queue, so they are unique across levels.

Levels are created when the first message of that priority arrives (a queue declared with
x-max-priority 255 mostly uses a few). A durable queue keeps level N in a sub-directory
`<digest>-pN` of its own directory (warren.store.persister.queue_dir), so start-up finds
its levels by listing that directory and removing the queue removes them all; a transient
queue's levels page each into their own directory, as any transient queue does.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Callable

from ..amqp.properties import priority
from .disk import DiskQueueStore
from .interface import QueueStore
from .memory import MemoryQueueStore
from .queued_message import QueuedMessage
from .settlement import Settlement

if TYPE_CHECKING:
    from .persister import Persister

log = logging.getLogger("warren.store")

# Messages moved per fsync when a directory's messages are put into their levels at start-up.
MIGRATE_BATCH = 4096


class PriorityQueueStore:
    """The QueueStore of a queue declared with x-max-priority above 0."""

    def __init__(self, max_priority: int, make_level: Callable[[int], QueueStore],
                 on_destroy: Callable[[], None] | None = None):
        self.max_priority = max_priority
        self._make_level = make_level
        self._on_destroy = on_destroy
        self._by_level: list[QueueStore | None] = [None] * (max_priority + 1)
        self._order: list[QueueStore] = []  # the levels that exist, highest first
        self.max_seq = 0  # highest sequence number recovered (the queue continues after it)

    @classmethod
    def in_memory(cls, max_priority: int) -> PriorityQueueStore:
        return cls(max_priority, lambda _level: MemoryQueueStore())

    @classmethod
    def on_disk(cls, persister: Persister, vhost: str, queue: str, durable: bool,
                max_priority: int) -> PriorityQueueStore:
        """Levels backed by segment files; a durable queue's levels are recovered now."""
        if not durable:
            return cls(max_priority, lambda _level: persister.queue_store(vhost, queue, False))
        root = persister.queue_dir(vhost, queue)
        prefix = os.path.basename(root) + "-p"
        kwargs = {"window": persister.window} if persister.window else {}

        def make_level(level: int) -> QueueStore:
            return DiskQueueStore(persister, os.path.join(root, f"{prefix}{level}"), durable=True, **kwargs)

        store = cls(max_priority, make_level, lambda: shutil.rmtree(root, ignore_errors=True))
        if os.path.isdir(root):
            store._recover(persister, root, prefix)
        return store

    def levels(self) -> list[QueueStore]:
        """The level stores that exist, highest first (the memory monitor pages them)."""
        return list(self._order)

    def _level(self, qm: QueuedMessage) -> QueueStore:
        """The store of the message's level, created if it is the first of that priority."""
        level = priority(qm.message.header)
        if level > self.max_priority:
            level = self.max_priority
        store = self._by_level[level]
        if store is None:
            store = self._by_level[level] = self._make_level(level)
            self._order = [s for s in reversed(self._by_level) if s is not None]
        return store

    # --------------------------------------------------------------- QueueStore
    def __len__(self) -> int:
        return sum(map(len, self._order))

    @property
    def ready_bytes(self) -> int:
        return sum(s.ready_bytes for s in self._order)

    def accept(self, qm: QueuedMessage, ticket: object = None) -> Settlement:
        return self._level(qm).accept(qm)  # (never held back: no ticket)

    def write_held(self, qm: QueuedMessage) -> None:
        pass  # (never holds)

    def push(self, qm: QueuedMessage) -> None:
        self._level(qm).push(qm)

    def pop(self) -> QueuedMessage | None:
        for store in self._order:
            qm = store.pop()
            if qm is not None:
                return qm
        return None

    def peek(self) -> QueuedMessage | None:
        for store in self._order:
            qm = store.peek()
            if qm is not None:
                return qm
        return None

    def drop_head(self, n: int) -> list[QueuedMessage]:
        taken: list[QueuedMessage] = []
        for store in self._order:
            if len(taken) >= n:
                break
            taken += store.drop_head(n - len(taken))
        return taken

    def requeue(self, qm: QueuedMessage) -> None:
        self._level(qm).requeue(qm)

    def delivered(self, qm: QueuedMessage, holder: str = "") -> None:
        self._level(qm).delivered(qm, holder)

    def settle(self, qm: QueuedMessage) -> None:
        self._level(qm).settle(qm)

    def carry_deliveries(self, qm: QueuedMessage) -> None:
        self._level(qm).carry_deliveries(qm)

    def purge(self) -> int:
        return sum(store.purge() for store in self._order)

    def peek_all(self) -> list[QueuedMessage]:
        return [qm for store in self._order for qm in store.peek_all()]

    def destroy(self) -> None:
        for store in self._order:
            store.destroy()
        if self._on_destroy is not None:
            self._on_destroy()

    # --------------------------------------------------------------- recovery
    def _recover(self, persister: Persister, root: str, prefix: str) -> None:
        """Open the levels found in the queue's directory. Messages in a directory that is no
        level of this queue (segments of the queue's own directory, written before Warren
        honoured x-max-priority; a level above the max) are moved into their levels."""
        strays: list[tuple[DiskQueueStore, str | None]] = []
        found = [(int(name[len(prefix):]), os.path.join(root, name)) for name in os.listdir(root)
                 if name.startswith(prefix) and name[len(prefix):].isdigit()]
        for level, path in sorted(found, reverse=True):  # (strays: the highest first)
            if not os.path.isdir(path):
                continue
            if level > self.max_priority:
                strays.append((DiskQueueStore(persister, path, durable=True), path))
                continue
            store = self._make_level(level)
            self._by_level[level] = store
            self.max_seq = max(self.max_seq, getattr(store, "max_seq", 0))
        if any(name.endswith(".seg") for name in os.listdir(root)):
            strays.append((DiskQueueStore(persister, root, durable=True), None))
        # Levels left empty by consumers before the restart hold no files: keep only the
        # levels with messages (the others come back with their next message).
        for level, opened in enumerate(self._by_level):
            if opened is not None and not len(opened) and isinstance(opened, DiskQueueStore) and not opened.segments:
                self._by_level[level] = None
        self._order = [s for s in reversed(self._by_level) if s is not None]
        for stray, stray_dir in strays:
            self.max_seq = max(self.max_seq, stray.max_seq)
            if self._migrate(persister, stray) and stray_dir is not None:
                shutil.rmtree(stray_dir, ignore_errors=True)

    def _migrate(self, persister: Persister, source: DiskQueueStore) -> bool:
        """Move a recovered store's messages into their levels, in its order: each batch is
        written and fsynced in its levels before the source lets it go (a crash in between
        delivers those messages twice at the next start, never zero times). False if a write
        failed: the rest stays in the source's files, moved at the next start."""
        moved = 0
        while True:
            batch = source.drop_head(MIGRATE_BATCH)
            if not batch:
                break
            for qm in batch:
                copy = QueuedMessage(qm.seq, qm.message, qm.redelivered)
                copy.deliveries = qm.deliveries
                copy.expiry = qm.expiry
                store = self._level(copy)
                store.accept(copy)
                store.push(copy)
                for _ in range(max(qm.deliveries, int(qm.redelivered))):  # as many delivered-marks
                    store.delivered(copy)
            if not persister.sync_now():
                log.error("queue store %s: cannot write messages into their priority levels: %d moved, "
                          "the rest is left in place", source.directory, moved)
                return False
            for qm in batch:
                source.settle(qm)
            moved += len(batch)
        for seg in list(source.segments.values()):
            seg.remove()
        source.segments.clear()
        persister.flush()
        log.info("queue store %s: moved %d messages into their priority levels", source.directory, moved)
        return True
