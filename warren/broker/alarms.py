"""The resource alarms in effect (RabbitMQ's rabbit_alarm): memory and disk.

The monitors (warren.server: the process's memory against the watermark, the data
directory's free space against the limit) raise and clear this node's; on a cluster member,
warren.cluster.membership gives the other running members' (from their running records).
Connections subscribe and block their publishers while any node has one (warren.session), as
RabbitMQ blocks publishing across the cluster until every alarm has cleared. Nothing here
does I/O.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping

MEMORY = "memory"
DISK = "disk"

# connection.blocked's reason per set of alarms, as RabbitMQ 3.10 words it.
_REASONS = {frozenset({MEMORY}): "low on memory", frozenset({DISK}): "low on disk",
            frozenset({MEMORY, DISK}): "low on disk & memory"}


class Alarms:
    """The resources in alarm on this node and on the cluster's other running nodes, and who
    is told when either changes.

    Iterating, `in` and truth are this node's own alarms ("memory", "disk"): what the node
    reports as its own (/api/nodes, Prometheus, local-alarms) and what holds its own work
    (paging, the node links it reads). `blocking` and `reason` are over every node's: what
    holds publishers."""

    def __init__(self) -> None:
        self.active: set[str] = set()  # this node's
        self.others: dict[str, frozenset[str]] = {}  # another running member's, by node (none: absent)
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

    def set_others(self, alarms: Mapping[str, Iterable[str]]) -> None:
        """The other running members' alarms, all of them (a node left out has none: it does
        not run, or its alarms cleared); resources this node does not know are left out.
        Listeners hear of real changes only."""
        others = {node: frozenset(r for r in resources if r in (MEMORY, DISK)) for node, resources in alarms.items()}
        others = {node: resources for node, resources in others.items() if resources}
        if others == self.others:
            return
        self.others = others
        for listener in list(self._listeners):
            listener()

    def in_effect(self) -> frozenset[str]:
        """The resources in alarm on any node: what blocks publishers."""
        return frozenset(self.active).union(*self.others.values())

    @property
    def blocking(self) -> bool:
        """Publishers are held: some node has an alarm."""
        return bool(self.active) or bool(self.others)

    def by_node(self, here: str) -> list[tuple[str, str]]:
        """Every node's alarms as (node, resource), `here` being this node's name; by node."""
        nodes = {**self.others, here: frozenset(self.active)}
        return [(node, resource) for node in sorted(nodes) for resource in sorted(nodes[node])]

    def reason(self) -> str:
        """connection.blocked's reason for the alarms in effect on any node ('' when none):
        RabbitMQ's connection is blocked by the resources in alarm, whichever node has them."""
        return _REASONS.get(self.in_effect(), "")

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners[listener] = None

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.pop(listener, None)
