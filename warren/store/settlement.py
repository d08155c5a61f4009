"""Settlement handles: what a publisher confirm waits for.

A queue's enqueue returns one, and ops.enqueue combines those of every queue a message went
to. Whoever confirms the publish (a channel in confirm mode, the HTTP API's publish, a
shovel) keeps the handle: `status()` says whether the message is safe (True), refused or
lost (False: basic.nack) or not yet (None), and `notify(waiter)` asks to be told
(waiter.store_synced()) once that may have changed.

Kinds today: nothing to wait for (SETTLED), refused by a queue (REJECTED: x-overflow
reject-publish), a group-commit batch of the local persister (StoreBatch: one object per
batch, shared by every message written in it, so the publish path allocates nothing), and a
Ticket for records held back (warren.store.persister). A follower's ack, a remote broker's
confirm or another process's fsync are further kinds of the same Protocol: the channel
waits on them unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .interface import SyncWaiter
    from .persister import Persister


class Settlement(Protocol):
    def status(self) -> bool | None:
        """True: safe (confirm); False: refused or its write failed (nack); None: not yet."""
        ...

    def notify(self, waiter: SyncWaiter) -> None:
        """Call waiter.store_synced() once status() may have changed (only while it is None)."""
        ...


class _Decided:
    __slots__ = ("safe", "name")

    def __init__(self, safe: bool, name: str):
        self.safe = safe
        self.name = name

    def status(self) -> bool:
        return self.safe

    def notify(self, waiter: SyncWaiter) -> None:
        pass  # (decided: nothing will change)

    def __repr__(self) -> str:
        return self.name


SETTLED = _Decided(True, "SETTLED")    # nothing to wait for: in memory, or no queue needed a write
REJECTED = _Decided(False, "REJECTED")  # a queue refused the message (reject-publish): a nack


class StoreBatch:
    """A group-commit batch of the persister: safe once its fsync has finished without error."""

    __slots__ = ("persister", "number")

    def __init__(self, persister: Persister, number: int):
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
