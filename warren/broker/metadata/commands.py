"""The changes to a node's metadata, one command each: the only way vhosts, users,
permissions, exchanges, queues, bindings, policies, runtime parameters and limits change
(warren.broker.metadata.store.MetadataStore.apply carries them out).

A command is plain data, named by what it changes and holding what the change needs, already
validated by its caller (the operations layer checks permissions and arguments, the API its
body): applying it cannot be refused for a reason a user could fix. That is what lets a
cluster put commands in its consensus log and have every node apply the same ones, and what
a node's definitions journal records the effect of. Queues, exchanges and vhosts are named,
never held: a command means the same on any node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..auth import User
    from ..policy import Policy
    from ..links import ExclusiveOwner
    from ..shovel_config import Config as ShovelConfig


class _Keep:
    """A vhost setting a command leaves as it is."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()

CLUSTER_NAME = "cluster_name"  # the global parameter that names the cluster (and the node's)


# ---------------------------------------------------------------- vhosts, users, permissions
@dataclass(frozen=True, slots=True)
class PutVHost:
    """Create a vhost (default_queue_type only then) and set its description, tags and
    capture exchange (warren.broker.missing_exchange); KEEP leaves one as it is."""

    name: str
    description: Any = KEEP       # str
    tags: Any = KEEP              # list[str]
    missing_exchange: Any = KEEP  # str | None
    default_queue_type: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteVHost:
    """The vhost, its queues (and their messages), exchanges, policies, parameters and the
    permissions on it. Closing its connections is the caller's business."""

    name: str


@dataclass(frozen=True, slots=True)
class PutUser:
    """Add or replace a user; a replaced user keeps its limits unless the new one has some."""

    user: User


@dataclass(frozen=True, slots=True)
class DeleteUser:
    """The user and its permissions and topic permissions."""

    name: str


@dataclass(frozen=True, slots=True)
class SetUserLimits:
    """The user's limits (max-connections, max-channels), all of them."""

    user: str
    limits: dict[str, int]


@dataclass(frozen=True, slots=True)
class SetPermissions:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearPermissions:
    user: str
    vhost: str


@dataclass(frozen=True, slots=True)
class SetTopicPermissions:
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearTopicPermissions:
    """The user's topic permission on `exchange` in the vhost, or all of them there (None)."""

    user: str
    vhost: str
    exchange: str | None = None


# ---------------------------------------------------------------- exchanges, queues, bindings
@dataclass(frozen=True, slots=True)
class DeclareExchange:
    """Create an exchange, or check that the one of that name is equivalent."""

    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict | None = None


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    """The exchange and its bindings, both ways."""

    vhost: str
    name: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """Create a queue, or check that the one of that name is equivalent. owner: the
    connection an exclusive queue belongs to (None: not exclusive); node: on a cluster, the
    member it lives on (its home: the declaring connection's node); None on a node alone;
    members: on a cluster, a replicated queue's replicas (`node` is its first leader), and
    incarnation: what tells this queue from an earlier one of its name (its record in etcd)."""

    vhost: str
    name: str
    durable: bool = False
    owner: ExclusiveOwner | None = None
    auto_delete: bool = False
    arguments: dict | None = None
    node: str | None = None
    members: tuple[str, ...] | None = None
    incarnation: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """The queue, its messages and bindings; its consumers are cancelled."""

    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class _Binding:
    """A binding from exchange `source` to the queue or exchange `destination` (dest_kind
    "queue" or "exchange")."""

    vhost: str
    source: str
    dest_kind: str
    destination: str
    routing_key: str = ""
    arguments: dict | None = None


@dataclass(frozen=True, slots=True)
class Bind(_Binding):
    """Add the binding; binding again is no change."""


@dataclass(frozen=True, slots=True)
class Unbind(_Binding):
    """Remove the binding; one that does not exist is no change."""


# ---------------------------------------------------------------- policies, parameters, limits
@dataclass(frozen=True, slots=True)
class SetPolicy:
    """Add or replace a policy (or an operator policy), validated, in its vhost."""

    policy: Policy
    operator: bool = False


@dataclass(frozen=True, slots=True)
class ClearPolicy:
    vhost: str
    name: str
    operator: bool = False


@dataclass(frozen=True, slots=True)
class SetVHostLimits:
    """The vhost's "limits" runtime parameter (max-connections, max-queues); None removes it."""

    vhost: str
    limits: dict[str, int] | None


@dataclass(frozen=True, slots=True)
class SetShovel:
    """A "shovel" runtime parameter (value as given, config its validated reading): the
    shovel (re)starts unless the value is unchanged."""

    vhost: str
    name: str
    value: Any
    config: ShovelConfig


@dataclass(frozen=True, slots=True)
class ClearShovel:
    """The shovel parameter goes and its shovel stops."""

    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class SetFederationParameter:
    """A "federation-upstream" or "federation-upstream-set" runtime parameter (validated): the
    links that use it start again with it."""

    vhost: str
    component: str
    name: str
    value: Any


@dataclass(frozen=True, slots=True)
class ClearFederationParameter:
    vhost: str
    component: str
    name: str


@dataclass(frozen=True, slots=True)
class SetGlobalParameter:
    """A global runtime parameter (cluster_name renames the node's cluster)."""

    name: str
    value: Any


@dataclass(frozen=True, slots=True)
class ClearGlobalParameter:
    name: str


# ---------------------------------------------------------------- several at once
@dataclass(frozen=True, slots=True)
class Batch:
    """Several commands carried out in order as one change (on a cluster, one entry of its
    log: a definitions import's items, a batch at a time). The first that fails stops the
    batch with BatchStopped; those before it stay done, on every node alike. Returns the
    list of what each returned."""

    commands: tuple[Command, ...]


class BatchStopped(Exception):
    """A batch's command `index` failed with `error` (the commands before it were done)."""

    def __init__(self, index: int, error: Exception):
        super().__init__(f"command {index} of the batch failed: {error}")
        self.index = index
        self.error = error


Command = (PutVHost | DeleteVHost | PutUser | DeleteUser | SetUserLimits | SetPermissions | ClearPermissions
           | SetTopicPermissions | ClearTopicPermissions | DeclareExchange | DeleteExchange | DeclareQueue
           | DeleteQueue | Bind | Unbind | SetPolicy | ClearPolicy | SetVHostLimits | SetShovel | ClearShovel
           | SetFederationParameter | ClearFederationParameter | SetGlobalParameter | ClearGlobalParameter | Batch)
