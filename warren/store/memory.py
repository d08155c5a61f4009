"""An in-memory queue store: a deque of new messages plus a heap of requeued ones."""

import heapq
from collections import deque


class MemoryQueueStore:
    __slots__ = ("_fresh", "_requeued", "ready_bytes")

    def __init__(self):
        self._fresh = deque()
        # Requeued messages always precede every fresh one (they were taken from the head
        # earlier), so ordering them by sequence number restores their original places.
        self._requeued: list = []
        self.ready_bytes = 0

    def __len__(self):
        return len(self._fresh) + len(self._requeued)

    def accept(self, qm):
        return 0  # nothing to wait for: memory only

    def delivered(self, qm):
        pass

    def destroy(self):
        self.purge()

    def push(self, qm):
        self._fresh.append(qm)
        self.ready_bytes += len(qm.message.body)

    def pop(self):
        if self._requeued:
            qm = heapq.heappop(self._requeued)
        elif self._fresh:
            qm = self._fresh.popleft()
        else:
            return None
        self.ready_bytes -= len(qm.message.body)
        return qm

    def requeue(self, qm):
        heapq.heappush(self._requeued, qm)
        self.ready_bytes += len(qm.message.body)

    def settle(self, qm):
        pass

    def purge(self):
        count = len(self)
        self._fresh.clear()
        self._requeued.clear()
        self.ready_bytes = 0
        return count

    def peek_all(self):
        return sorted(self._requeued) + list(self._fresh)
