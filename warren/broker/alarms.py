"""The resource alarms in effect (RabbitMQ's rabbit_alarm): memory and disk.

The monitors (warren.server: the process's memory against the watermark, the data
directory's free space against the limit) raise and clear them; connections subscribe and
block their publishers while any is on (warren.session). Nothing here does I/O.
"""

from __future__ import annotations

from typing import Callable, Iterator

MEMORY = "memory"
DISK = "disk"

# connection.blocked's reason per set of alarms, as RabbitMQ 3.10 words it.
_REASONS = {frozenset({MEMORY}): "low on memory", frozenset({DISK}): "low on disk",
            frozenset({MEMORY, DISK}): "low on disk & memory"}


class Alarms:
    """The set of resources in alarm, and who is told when it changes.

    Iterating gives the resources in alarm ("memory", "disk"), so code that only reads them
    (the management API) treats this as the set it is."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        # Every open connection listens: a dict (ordered) so that one unsubscribing is not a
        # search through all the others (thousands of clients connecting per request).
        self._listeners: dict[Callable[[], None], None] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.active))

    def __bool__(self) -> bool:
        return bool(self.active)

    def __contains__(self, resource: object) -> bool:
        return resource in self.active

    def set(self, resource: str, on: bool) -> None:
        """Raise (on) or clear one alarm; listeners hear of real changes only."""
        if resource not in (MEMORY, DISK):
            raise ValueError(f"unknown resource {resource!r}")
        if (resource in self.active) == on:
            return
        if on:
            self.active.add(resource)
        else:
            self.active.discard(resource)
        for listener in list(self._listeners):
            listener()

    def reason(self) -> str:
        """connection.blocked's reason for the alarms in effect ('' when none)."""
        return _REASONS.get(frozenset(self.active), "")

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners[listener] = None

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.pop(listener, None)
