"""The broker: one node's configuration, its metadata store (warren.broker.metadata), what runs
on it (connections, the message store's writer, alarms, timers) and its counters."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .alarms import Alarms
from .auth import Permission, TopicPermission, User, check, check_topic
from .durability import Durability
from .metadata import commands
from .metadata.store import MetadataStore
from .ports import Scheduler
from .queue_flow import QueueFlow
from .node_config import NodeConfig
from .stats import NodeStats
from .vhost import VHost
from . import federation, shovel

if TYPE_CHECKING:
    from .records import ConnectionHandle
    from .node import LinkOwners, NodeLinks
    from .shovel_links import ShovelLinks
    from ..store.persister import Persister


def default_definitions(user="guest", password="guest", vhost="/", tags=("administrator",),
                        permissions=(".*", ".*", ".*")) -> list[commands.Command]:
    """What a first start creates: the default vhost, the default user and its permissions."""
    return [commands.PutVHost(vhost, description="Default virtual host"),
            commands.PutUser(User.with_password(user, password, tags=list(tags))),
            commands.SetPermissions(user, vhost, *permissions)]


@dataclass
class Broker:
    """One node: its configuration, its metadata (changed only by commands), what runs on it
    (connections, the message store's writer, alarms, timers) and its counters."""

    config: NodeConfig = field(default_factory=NodeConfig)
    # The open connections (from connection.open-ok to their close), as handles: what the
    # management API and the metrics show of them are their records (warren.broker.records).
    connections: "set[ConnectionHandle]" = field(default_factory=set)
    stats: NodeStats = field(default_factory=NodeStats)
    # The message store's writer (a warren.store.persister.Persister), or None: queues then
    # keep their messages in memory only.
    persister: "Persister | None" = None
    # The resource alarms in effect (memory, disk): raised by the server's monitors (at the
    # config's mem_limit and disk_free_limit), heard by connections, which block their
    # publishers.
    alarms: Alarms = field(default_factory=Alarms)
    # Timers for the model, injected by the server (None: no timers, e.g. in unit tests).
    scheduler: Scheduler | None = None
    # Connections to other brokers for shovels' remote ends, injected by the server (None:
    # this node makes none, e.g. in unit tests).
    links: "ShovelLinks | None" = None
    # A cluster member's links to the other members (warren.cluster.node_links), through
    # which the stand-ins of other nodes' queues reach them; None on a node alone.
    node_links: "NodeLinks | None" = None  # (warren.cluster.node_links.NodeLinks)
    # Which member runs each shovel and federation link; None on a node alone (this one).
    link_owners: "LinkOwners | None" = None  # (warren.cluster.link_owners.LinkOwners)
    # Writes what a reply promises before the reply leaves (definitions, message records).
    durability: Durability = field(init=False)
    # The queues that pressed their publishers during the read being handled (queue_flow.py).
    queue_flow: QueueFlow = field(default_factory=QueueFlow)
    # The config file's shovels (warren.broker.static_shovel), by name: the node's, not a
    # vhost's; they start with the vhosts' (shovel.start_all).
    static_shovels: "dict[str, shovel.Shovel]" = field(default_factory=dict)

    # vhosts, users, permissions and global parameters, changed only by commands
    # (warren.broker.metadata). The tables below are the store's own dicts (it changes them
    # in place, never replaces them), plain attributes because a publish reads one: a
    # property there cost 1 % of a publish's instructions.
    metadata: MetadataStore = field(init=False)
    vhosts: "dict[str, VHost]" = field(init=False)
    users: "dict[str, User]" = field(init=False)
    permissions: "dict[tuple[str, str], Permission]" = field(init=False)
    topic_permissions: "dict[tuple[str, str, str], TopicPermission]" = field(init=False)
    global_parameters: dict = field(init=False)

    def __post_init__(self) -> None:
        self.durability = Durability(self)
        metadata = self.metadata = MetadataStore(self)
        self.vhosts, self.users, self.permissions = metadata.vhosts, metadata.users, metadata.permissions
        self.topic_permissions, self.global_parameters = metadata.topic_permissions, metadata.global_parameters

    @property
    def cluster_name(self) -> str:
        return self.metadata.cluster_name

    @classmethod
    def with_defaults(cls, user="guest", password="guest", vhost="/", **kwargs):
        broker = cls(**kwargs)
        broker.create_defaults(user, password, vhost)
        return broker

    def create_defaults(self, user="guest", password="guest", vhost="/", tags=("administrator",),
                        permissions=(".*", ".*", ".*")) -> None:
        """The default vhost and user, as RabbitMQ creates them on a node's first start
        (permissions: configure, write, read)."""
        for command in default_definitions(user, password, vhost, tags, permissions):
            self.metadata.apply(command)

    def set_scheduler(self, scheduler: Scheduler) -> None:
        """The server's loop is running: the model's timers can start, also those of queues
        recovered before it (x-expires, the TTL of the messages at their heads)."""
        self.scheduler = scheduler
        for vhost in list(self.vhosts.values()):
            for queue in list(vhost.queues.values()):
                queue.start_timers()
        shovel.start_all(self)  # (on the loop's next turn: every queue is recovered by then)
        federation.start_all(self)

    def shutdown(self) -> None:
        """The server stops: queues save what they keep between writes (stream consumer offsets)."""
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                queue.shutdown()

    def authenticate(self, username: str, password: str):
        user = self.users.get(username)
        # As RabbitMQ's internal backend, an empty password never logs in (even if it is the
        # one that was set).
        if user is not None and password and user.check_password(password):
            return user
        return None

    def check(self, user: str, vhost: str, what: str, kind: str, name: str) -> None:
        check(self.permissions.get((user, vhost)), user, what, kind, name, vhost)

    def check_topic(self, user: str, vhost: str, what: str, exchange: str, routing_key: str) -> None:
        """403 unless the user may write (publish) or read (bind) `routing_key` on the topic
        exchange (Actor.check_topic checks that it is one)."""
        check_topic(self.topic_permissions.get((user, vhost, exchange)), user, what, exchange, routing_key, vhost)
