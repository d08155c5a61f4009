"""Requeued messages: delivered ones put back, ahead of every fresh message.

A message is requeued only after it was taken from the head, so it precedes every message
still fresh in the store; among themselves, requeued messages go back to their original
order, by sequence number. Both stores keep them in memory in this heap (as LavinMQ's
message_store/requeued_store.cr) and serve it before their fresh messages.
"""

import heapq

from .queued_message import QueuedMessage


class RequeuedMessages(list[QueuedMessage]):
    """A min-heap of requeued messages by sequence number.

    A list subclass so that a store's per-pop `if requeued:` stays a C length check (a
    wrapper's __len__ would cost a Python call per delivery). Change it only through these
    methods: list.append or insert would break the heap order.
    """

    __slots__ = ()

    def push(self, qm: QueuedMessage) -> None:
        heapq.heappush(self, qm)

    def take(self) -> QueuedMessage:
        """Remove and return the first one (lowest sequence number); the heap must not be empty."""
        return heapq.heappop(self)

    def first(self) -> QueuedMessage | None:
        """The one take() would return, left in place."""
        return self[0] if self else None

    def in_order(self) -> list[QueuedMessage]:
        return sorted(self)

    def take_all(self) -> list[QueuedMessage]:
        """Empty the heap, returning its messages in no particular order."""
        taken = list(self)
        self.clear()
        return taken
