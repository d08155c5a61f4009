"""An in-memory queue store: a deque of new messages plus a heap of requeued ones."""

from collections import deque

from .queued_message import QueuedMessage
from .interface import take_head
from .requeued import RequeuedMessages
from .settlement import SETTLED, Settlement


class MemoryQueueStore:
    __slots__ = ("_fresh", "_requeued", "ready_bytes")

    def __init__(self) -> None:
        self._fresh: deque[QueuedMessage] = deque()
        self._requeued = RequeuedMessages()
        self.ready_bytes = 0

    def __len__(self) -> int:
        return len(self._fresh) + len(self._requeued)

    def accept(self, qm: QueuedMessage, ticket: object = None) -> Settlement:
        return SETTLED  # nothing to wait for: memory only

    def write_held(self, qm: QueuedMessage) -> None:
        pass  # (never holds)

    def delivered(self, qm: QueuedMessage, holder: str = "") -> None:
        pass

    def destroy(self) -> None:
        self.purge()

    def push(self, qm: QueuedMessage) -> None:
        self._fresh.append(qm)
        self.ready_bytes += len(qm.message.body)

    def pop(self) -> QueuedMessage | None:
        if self._requeued:
            qm = self._requeued.take()
        elif self._fresh:
            qm = self._fresh.popleft()
        else:
            return None
        self.ready_bytes -= len(qm.message.body)
        return qm

    def peek(self) -> QueuedMessage | None:
        if self._requeued:
            return self._requeued.first()
        return self._fresh[0] if self._fresh else None

    def drop_head(self, n: int) -> list[QueuedMessage]:
        return take_head(self, n)

    def requeue(self, qm: QueuedMessage) -> None:
        self._requeued.push(qm)
        self.ready_bytes += len(qm.message.body)

    def settle(self, qm: QueuedMessage) -> None:
        pass

    def carry_deliveries(self, qm: QueuedMessage) -> None:
        pass

    def purge(self) -> int:
        count = len(self)
        self._fresh.clear()
        self._requeued.clear()
        self.ready_bytes = 0
        return count

    def peek_all(self) -> list[QueuedMessage]:
        return self._requeued.in_order() + list(self._fresh)
