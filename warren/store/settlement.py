"""Settlement handles: what a publisher confirm waits for.

A queue's enqueue returns one, and ops.enqueue combines those of every queue a message went
to. Whoever confirms the publish (a channel in confirm mode, the HTTP API's publish, a
shovel) keeps the handle: `status()` says whether the message is safe (True), refused or
lost (False: basic.nack) or not yet (None), and `notify(waiter)` asks to be told
(waiter.store_synced()) once that may have changed.

Kinds today: nothing to wait for (SETTLED), refused by a queue (REJECTED: x-overflow
reject-publish), a group-commit batch of the local persister (StoreBatch: one object per
batch, shared by every message written in it, so the publish path allocates nothing), and a
Ticket for records held back (holding: warren.store.persister). A follower's ack, a remote
broker's confirm or another process's fsync are further kinds of the same Protocol: the
channel waits on them unchanged.

The persister's handles live here, below the persister and the stores that hand them out:
they see the persister only as a GroupCommit.
"""

from __future__ import annotations

from typing import Callable, Protocol


class SyncWaiter(Protocol):
    """Waits on a settlement handle: a channel with publisher confirms due, the management
    API's publish, a shovel, a queue settling a copied message."""

    def store_synced(self) -> None:
        """What the waiter waits for may be settled now (an fsync finished, a held copy went)."""
        ...


class Wake:
    """A SyncWaiter that calls `wake` (a sink holding deliveries until their commit)."""

    __slots__ = ("wake",)

    def __init__(self, wake: Callable[[], None]):
        self.wake = wake

    def store_synced(self) -> None:
        self.wake()


class Decision:
    """A settlement its holder decides once, when an answer comes (another node's confirm of a
    publish it was sent): None until then; its waiter is told."""

    __slots__ = ("safe", "waiter")

    def __init__(self) -> None:
        self.safe: bool | None = None
        self.waiter: SyncWaiter | None = None

    def status(self) -> bool | None:
        return self.safe

    def notify(self, waiter: SyncWaiter) -> None:
        if self.safe is not None:  # (decided already: told at once)
            waiter.store_synced()
        else:
            self.waiter = waiter

    def decide(self, safe: bool) -> None:
        self.safe = safe
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.store_synced()


class GroupCommit(Protocol):
    """The persister's group commit as its handles read it (warren.store.persister.Persister)."""

    synced: int             # every batch up to this one is on disk (or failed)
    failed: dict[int, str]  # batch -> error text, for nacks

    def wait_for(self, waiter: SyncWaiter) -> None:
        """Call waiter.store_synced() when the next fsync finishes."""
        ...


class Settlement(Protocol):
    def status(self) -> bool | None:
        """True: safe (confirm); False: refused or its write failed (nack); None: not yet."""
        ...

    def notify(self, waiter: SyncWaiter) -> None:
        """Call waiter.store_synced() once status() may have changed (only while it is None)."""
        ...


class _Decided:
    __slots__ = ("safe", "name", "moved")

    def __init__(self, safe: bool, name: str, moved: bool = False):
        self.safe = safe
        self.name = name
        self.moved = moved

    def status(self) -> bool:
        return self.safe

    def notify(self, waiter: SyncWaiter) -> None:
        pass  # (decided: nothing will change)

    def __repr__(self) -> str:
        return self.name


SETTLED = _Decided(True, "SETTLED")    # nothing to wait for: in memory, or no queue needed a write
REJECTED = _Decided(False, "REJECTED")  # a queue refused the message (reject-publish): a nack
# Not taken where it was sent, its fate not decided there: a replicated queue's leader had moved
# (its node's publisher sends it again to the next leader: QuorumPublisher).
MOVED = _Decided(False, "MOVED", moved=True)


class StoreBatch:
    """A group-commit batch of the persister: safe once its fsync has finished without error."""

    __slots__ = ("persister", "number")

    def __init__(self, persister: GroupCommit, number: int):
        self.persister = persister
        self.number = number

    def status(self) -> bool | None:
        persister = self.persister
        if persister.synced < self.number:
            return None
        return self.number not in persister.failed

    def notify(self, waiter: SyncWaiter) -> None:
        self.persister.wait_for(waiter)

    def __repr__(self) -> str:
        return f"StoreBatch({self.number})"


class Ticket:
    """The confirm of one publish whose records some queues hold back (holding:
    warren.store.persister): due when no copy is pending (each written or settled) and the
    batches written for it are on disk."""

    __slots__ = ("persister", "pending", "batches", "waiter")

    def __init__(self, persister: GroupCommit) -> None:
        self.persister = persister
        self.pending = 0      # copies held: neither written nor settled yet
        # The persister batches its copies were written in: those written at once share one,
        # each held copy written later may join another, and an fsync of any may fail alone.
        self.batches: list[int] = []
        self.waiter: SyncWaiter | None = None  # the publishing channel, once it waits

    def written(self, batch: StoreBatch) -> None:
        """A held copy was written in `batch`: the fsync of that batch wakes the waiter."""
        self.pending -= 1
        self.include(batch)
        if not self.pending and self.waiter is not None:
            self.persister.wait_for(self.waiter)

    def include(self, batch: StoreBatch) -> None:
        """A copy was written in `batch` (at once, or held and written later)."""
        if batch.number not in self.batches:
            self.batches.append(batch.number)

    def settled(self) -> None:
        """A held copy was settled before its write: it needs no disk."""
        self.pending -= 1
        if not self.pending and self.waiter is not None:
            self.waiter.store_synced()

    def status(self) -> bool | None:
        """True (safe), False (a write or fsync failed), None (not yet)."""
        if self.pending:
            return None
        if not self.batches:
            return True
        persister = self.persister
        if persister.synced < max(self.batches):
            return None
        return not any(batch in persister.failed for batch in self.batches)

    def notify(self, waiter: SyncWaiter) -> None:
        self.waiter = waiter  # (woken when its last held copy is settled or written)
        self.persister.wait_for(waiter)

    def covering(self, settlement: Settlement) -> Settlement:
        """The handle of a publish with this ticket, whose copies written at once settle by
        `settlement`: the ticket, if any copy is held or was written, else `settlement`."""
        if isinstance(settlement, StoreBatch):
            self.include(settlement)
        elif settlement is not SETTLED:
            return AllOf((self, settlement)) if self.pending or self.batches else settlement
        return self if self.pending or self.batches else SETTLED


class AllOf:
    """Every part settled (a message whose copies wait on different things)."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Settlement, ...]):
        self.parts = parts

    def status(self) -> bool | None:
        undecided = False
        for part in self.parts:
            safe = part.status()
            if safe is False:
                return False
            undecided |= safe is None
        return None if undecided else True

    def notify(self, waiter: SyncWaiter) -> None:
        for part in self.parts:
            if part.status() is None:
                part.notify(waiter)
                return


def later(a: Settlement, b: Settlement) -> Settlement:
    """What a publish whose copies settle by `a` and by `b` waits for. Batches of one
    persister finish in order, so the later covers the earlier: no allocation on that path."""
    if a is SETTLED:
        return b
    if b is SETTLED:
        return a
    if type(a) is StoreBatch and type(b) is StoreBatch and a.persister is b.persister:
        return a if a.number >= b.number else b
    if a is REJECTED or b is REJECTED:
        return REJECTED
    return AllOf((*(a.parts if isinstance(a, AllOf) else (a,)), *(b.parts if isinstance(b, AllOf) else (b,))))
