"""The one interface between a queue and its storage.

A queue hands its store every message it accepts, takes the next ready one when a consumer
has credit, puts requeued ones back, and reports settled ones (acked, dropped) so a durable
store can reclaim their space. The in-memory store is the default; the durability work
backs the same interface with segment files.
"""

from typing import TYPE_CHECKING, Protocol

from .queued_message import QueuedMessage

if TYPE_CHECKING:
    from .settlement import Settlement, Ticket


class QueueStore(Protocol):
    def accept(self, qm: QueuedMessage, ticket: "Ticket | None" = None) -> "Settlement":
        """A message arrives: write it now if it must survive a restart. Returns what its
        confirm must wait for (the persister batch it joined, or SETTLED: nothing).
        With a confirm `ticket` (a big persistent body, consumers waiting) a store may hold
        the record back instead, setting qm.hold (warren.store.persister)."""
        ...

    def write_held(self, qm: QueuedMessage) -> None:
        """qm's record is held back (qm.hold): write it now (it must be on disk)."""
        ...

    def push(self, qm: QueuedMessage) -> None:
        """Append a newly enqueued message at the tail."""
        ...

    def pop(self) -> QueuedMessage | None:
        """Remove and return the next ready message (requeued ones first, by position)."""
        ...

    def peek(self) -> QueuedMessage | None:
        """The message pop() would return next, left in place (TTL expiry looks at the head).
        A disk store may read it back from its segments to answer."""
        ...

    def drop_head(self, n: int) -> list[QueuedMessage]:
        """Remove up to n ready messages from the head, in delivery order, and return them
        (max-length drop-head, TTL expiry). Like pop(), this does not settle them: the caller
        settles or dead-letters each one."""
        ...

    def requeue(self, qm: QueuedMessage) -> None:
        """Put a delivered message back at its original position."""
        ...

    def delivered(self, qm: QueuedMessage, holder: str = "") -> None:
        """Handed to a consumer that must ack (recorded so a restart sets redelivered); a
        replicated store records its holder too (warren.store.replicated)."""
        ...

    def carry_deliveries(self, qm: QueuedMessage) -> None:
        """qm, a message appended again (a quorum queue's requeue to the tail), was handed out
        qm.deliveries times: recorded once, so a restart knows its count."""
        ...

    def destroy(self) -> None:
        """The queue is deleted: drop everything, including files."""
        ...

    def settle(self, qm: QueuedMessage) -> None:
        """A delivered message is gone for good (acked, rejected, or delivered no-ack)."""
        ...

    def purge(self) -> int:
        """Drop every ready message, returning how many there were."""
        ...

    def peek_all(self) -> list[QueuedMessage]:
        """The ready messages in delivery order (management views; not the hot path)."""
        ...

    def __len__(self) -> int:
        """Number of ready messages: requeued, in memory and (disk store) only on disk."""
        ...

    @property
    def ready_bytes(self) -> int:
        """Total body size of the ready messages, the same set __len__ counts (not the
        unacked ones): kept up to date on every push, pop, requeue and purge, so
        x-max-length-bytes and the management API read it without a scan."""
        ...


def take_head(store: QueueStore, n: int) -> list[QueuedMessage]:
    """Up to n ready messages popped from the head, in delivery order (drop_head of a store
    whose pop() is all it takes)."""
    taken: list[QueuedMessage] = []
    while len(taken) < n and (qm := store.pop()) is not None:
        taken.append(qm)
    return taken
