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
from .stats import RetiredCounters, new_node_counters
from .vhost import VHost
from . import shovel

if TYPE_CHECKING:
    from .records import ConnectionHandle
    from ..store.persister import Persister

@dataclass
class Limits:
    """Connection parameters offered in connection.tune and enforced afterwards."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024  # RabbitMQ 3.x default
    handshake_timeout: float = 10.0
    # ms a delivery may stay unacked before its channel is closed (406); None: never.
    consumer_timeout: int | None = 1_800_000  # RabbitMQ 3.10's default, 30 min


@dataclass
class Broker:
    limits: Limits = field(default_factory=Limits)
    loopback_users: set = field(default_factory=lambda: {"guest"})
    # The SASL mechanisms offered (auth_mechanisms.N, in warren.broker.auth_mechanisms'
    # order; EXTERNAL only on TLS connections) and where EXTERNAL finds the user name in a
    # client certificate (ssl_cert_login_from: distinguished_name or common_name,
    # warren.broker.x509).
    auth_mechanisms: tuple = ("PLAIN", "AMQPLAIN")
    ssl_cert_login_from: str = "distinguished_name"
    # The open connections (from connection.open-ok to their close), as handles: what the
    # management API and the metrics show of them are their records (warren.broker.records).
    connections: "set[ConnectionHandle]" = field(default_factory=set)
    # Message counters of the channels that have closed (the overview's totals include them).
    message_totals: dict = field(default_factory=dict)
    # The counters of deleted queues and exchanges and closed connections, and the node's
    # events (connections opened, queues created, logins...): warren.broker.stats.
    retired: RetiredCounters = field(default_factory=RetiredCounters)
    node_counters: dict = field(default_factory=new_node_counters)
    # The message store's writer (a warren.store.persister.Persister), or None: queues then
    # keep their messages in memory only.
    persister: "Persister | None" = None
    # The resource alarms in effect (memory, disk): raised by the server's monitors, heard by
    # connections, which block their publishers. mem_limit and disk_free_limit are the
    # monitors' thresholds in bytes (None: not monitored).
    alarms: Alarms = field(default_factory=Alarms)
    mem_limit: int | None = None
    disk_free_limit: int | None = None
    # Timers for the model, injected by the server (None: no timers, e.g. in unit tests).
    scheduler: Scheduler | None = None
    # Writes what a reply promises before the reply leaves (definitions, message records).
    durability: Durability = field(init=False)
    # The queues that pressed their publishers during the read being handled (queue_flow.py).
    queue_flow: QueueFlow = field(default_factory=QueueFlow)

    # vhosts, users, permissions and global parameters, changed only by commands
    # (warren.broker.metadata): read through the properties below.
    metadata: MetadataStore = field(init=False)

    def __post_init__(self) -> None:
        self.durability = Durability(self)
        self.metadata = MetadataStore(self)

    @property
    def vhosts(self) -> "dict[str, VHost]":
        return self.metadata.vhosts

    @property
    def users(self) -> "dict[str, User]":
        return self.metadata.users

    @property
    def permissions(self) -> "dict[tuple[str, str], Permission]":
        return self.metadata.permissions

    @property
    def topic_permissions(self) -> "dict[tuple[str, str, str], TopicPermission]":
        return self.metadata.topic_permissions

    @property
    def global_parameters(self) -> dict:
        return self.metadata.global_parameters

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
        apply = self.metadata.apply
        apply(commands.PutVHost(vhost, description="Default virtual host"))
        apply(commands.PutUser(User.with_password(user, password, tags=list(tags))))
        apply(commands.SetPermissions(user, vhost, *permissions))

    def set_scheduler(self, scheduler: Scheduler) -> None:
        """The server's loop is running: the model's timers can start, also those of queues
        recovered before it (x-expires, the TTL of the messages at their heads)."""
        self.scheduler = scheduler
        for vhost in list(self.vhosts.values()):
            for queue in list(vhost.queues.values()):
                queue.start_timers()
        shovel.start_all(self)  # (on the loop's next turn: every queue is recovered by then)

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
