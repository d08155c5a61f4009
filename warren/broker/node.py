"""The node as the broker's modules see it: what the operations layer, the limits, runtime
parameters, shovels and the metadata store read of the broker (warren.broker.broker.Broker).

The broker holds them all (its metadata store, which makes shovels, which act through the
operations layer), so they name it by this Protocol instead of importing it: none of them
needs to know what else a node holds, and a node elsewhere is one more implementation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from .alarms import Alarms
    from .auth import Permission, TopicPermission, User
    from .durability import Durability
    from .metadata.change import Change, ClusterLog
    from .metadata.commands import Command
    from .node_config import NodeConfig
    from .ports import Scheduler
    from .records import ConnectionHandle, Usage
    from .shovel_links import ShovelLinks
    from .stats import NodeStats
    from .vhost import VHost

T = TypeVar("T")

class Metadata(Protocol):
    """The node's metadata store (warren.broker.metadata.store.MetadataStore) as one that
    sends it commands sees it."""

    def apply(self, command: Command) -> Any:
        """Carry out a command (warren.broker.metadata.commands); what it returns is the
        command's."""

    def run(self, operation: Change[T]) -> T:
        """Carry out an operation's change (warren.broker.metadata.change) at once."""

    def submit(self, command: Command, then: Callable[[], None] | None = None) -> None:
        """A change the node makes on its own: at once, or through the cluster's log;
        `then()` once this node has applied it."""

    @property
    def log(self) -> ClusterLog | None:
        """A cluster member's log (None on a node alone)."""


class NodeLinks(Protocol):
    """A cluster member's links to the other members, as the layer above this one makes them
    (warren.cluster.node_links.NodeLinks: its stand-ins of other nodes' queues use it, and
    the limits through usage_elsewhere)."""

    def usage_elsewhere(self, vhost: str | None, user: str, done: Callable[[Usage], None]) -> bool:
        """Ask the other running members what they count of the vhost's connections and the
        user's connections and channels; `done(their sum)` later, once all have answered or
        the wait is over (a member that did not answer in time is left out). False, and no
        call of done, when there is no other member to ask."""

    def online(self, nodes: list[str]) -> list[str]:
        """Those of `nodes` that run now (a replicated queue's members that are online)."""

    def placement(self, size: int | None, balanced: bool = False) -> tuple[str, ...]:
        """The members of a replicated queue declared here, its first leader first: this node
        (RabbitMQ's client-local) or, `balanced`, the running member leading fewest; and size - 1
        others (None: every other member), running ones first, those with the fewest replicas
        first (rabbit_queue_location)."""


class LinkOwners(Protocol):
    """Which member of a cluster runs each shovel and federation link
    (warren.cluster.link_owners.LinkOwners): one at a time, claimed in etcd."""

    def want(self, link: Any) -> None:
        """The link runs here once this member holds it (its begin())."""

    def drop(self, link: Any) -> None:
        """The link stopped for good here: another member may not take it over."""

    def runs(self, link: Any) -> bool: ...


class Node(Protocol):
    """One node: its configuration, counters, metadata (changed by commands, read through
    the tables below) and what runs on it."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def stats(self) -> NodeStats: ...

    @property
    def metadata(self) -> Metadata: ...

    @property
    def durability(self) -> Durability: ...

    @property
    def scheduler(self) -> Scheduler | None:
        """Timers (None: no loop runs, e.g. in unit tests)."""

    @property
    def node_links(self) -> NodeLinks | None:  # (warren.cluster.node_links.NodeLinks)
        """A cluster member's links to the other members (None on a node alone)."""

    @property
    def link_owners(self) -> LinkOwners | None:
        """Which member runs each shovel and federation link (None on a node alone: this one)."""

    @property
    def links(self) -> ShovelLinks | None:
        """Opens shovels' ends on other brokers (None: this node makes no connections)."""

    @property
    def alarms(self) -> Alarms: ...

    @property
    def connections(self) -> Collection[ConnectionHandle]:
        """The open connections, as handles (warren.broker.records)."""

    # The metadata's tables, read directly: routing must not pay a call per lookup.
    @property
    def vhosts(self) -> Mapping[str, VHost]: ...

    @property
    def users(self) -> Mapping[str, User]: ...

    @property
    def permissions(self) -> Mapping[tuple[str, str], Permission]: ...

    @property
    def topic_permissions(self) -> Mapping[tuple[str, str, str], TopicPermission]: ...

    @property
    def global_parameters(self) -> Mapping[str, Any]: ...

    @property
    def cluster_name(self) -> str: ...

    @property
    def static_shovels(self) -> Mapping[str, Any]:
        """The config file's shovels (warren.broker.static_shovel), by name (Any: the shovel
        module names this one)."""

    def check(self, user: str, vhost: str, what: str, kind: str, name: str) -> None:
        """403 unless the user may configure/write/read the named resource in the vhost."""

    def check_topic(self, user: str, vhost: str, what: str, exchange: str, routing_key: str) -> None:
        """403 unless the user's topic permission on the exchange lets it write or read the key."""
