"""The broker: vhosts, users and permissions, and the limits connections negotiate."""

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .alarms import Alarms
from .auth import Permission, TopicPermission, User, check, check_topic
from .definitions import changes, export
from .durability import Durability
from .ports import Scheduler
from .queue_flow import QueueFlow
from .stats import RetiredCounters, new_node_counters
from .vhost import VHost
from . import shovel

if TYPE_CHECKING:
    from .records import ConnectionHandle
    from ..store.definitions import DefinitionsFile
    from ..store.persister import Persister

log = logging.getLogger("warren.definitions")


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
    vhosts: dict = field(default_factory=dict)
    users: dict = field(default_factory=dict)
    permissions: dict = field(default_factory=dict)  # (user, vhost) -> Permission
    # (user, vhost, exchange) -> TopicPermission; empty on most brokers, so a publish to a
    # topic exchange tests it for truth before looking its key up.
    topic_permissions: dict = field(default_factory=dict)
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
    cluster_name: str = "warren@localhost"
    # Set over the API or by imported definitions (RabbitMQ's cluster_name global runtime
    # parameter): only then is it exported, and so kept across a restart.
    cluster_name_set: bool = False
    # The other global runtime parameters: name -> JSON value (warren.broker.parameters).
    global_parameters: dict = field(default_factory=dict)
    # Where durable definitions are saved (a warren.store.definitions.DefinitionsFile), or None
    # without a data dir. The model only records what changed (definitions_changes, or
    # definitions_all_changed); the session layer calls flush_definitions() before it sends
    # any reply, so a declare-ok follows the write.
    definitions_store: "DefinitionsFile | None" = None
    definitions_dirty: bool = False
    definitions_changes: dict = field(default_factory=dict)  # (kind, key) -> Binding or None
    definitions_all_changed: bool = False
    definitions_save_failing: bool = False
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

    def __post_init__(self) -> None:
        self.durability = Durability(self)

    @classmethod
    def with_defaults(cls, user="guest", password="guest", vhost="/", **kwargs):
        broker = cls(**kwargs)
        broker.create_defaults(user, password, vhost)
        return broker

    def create_defaults(self, user="guest", password="guest", vhost="/", tags=("administrator",),
                        permissions=(".*", ".*", ".*")) -> None:
        """The default vhost and user, as RabbitMQ creates them on a node's first start
        (permissions: configure, write, read)."""
        self.add_vhost(vhost).description = "Default virtual host"
        self.add_user(User.with_password(user, password, tags=list(tags)))
        self.set_permissions(user, vhost, *permissions)

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

    def add_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name, self)
            self.mark_definitions_changed("vhost", name)
        return vhost

    def delete_vhost(self, name: str):
        """Remove a vhost and the permissions on it; returns it (or None). Closing its
        connections is the caller's business."""
        vhost = self.vhosts.pop(name, None)
        if vhost is not None:
            shovel.vhost_deleted(self, vhost)  # its shovel parameters go with it
            # Its queues and exchanges go with it: their counts stay in the node's totals.
            self.node_counters["queues_deleted"] += len(vhost.queues)
            for queue in vhost.queues.values():
                self.retired.queue_deleted(queue)
            for exchange in vhost.exchanges.values():
                self.retired.exchange_deleted(exchange)
            for key in [k for k in self.permissions if k[1] == name]:
                del self.permissions[key]
            for key in [k for k in self.topic_permissions if k[1] == name]:
                del self.topic_permissions[key]
            self.mark_definitions_changed()
        return vhost

    def add_user(self, user: User) -> None:
        old = self.users.get(user.name)
        if old is not None and not user.limits:  # a new password or tags keep the limits (RabbitMQ)
            user.limits = old.limits
        self.users[user.name] = user
        self.mark_definitions_changed("user", user.name)

    def delete_user(self, name: str):
        """Remove a user and its permissions; returns it (or None)."""
        user = self.users.pop(name, None)
        if user is not None:
            for key in [k for k in self.permissions if k[0] == name]:
                del self.permissions[key]
                self.mark_definitions_changed("permission", key)
            for key in [k for k in self.topic_permissions if k[0] == name]:
                del self.topic_permissions[key]
                self.mark_definitions_changed("topic_permission", key)
            self.mark_definitions_changed("user", name)
        return user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.permissions[(user, vhost)] = Permission(configure, write, read)
        self.mark_definitions_changed("permission", (user, vhost))

    def clear_permissions(self, user: str, vhost: str) -> bool:
        if self.permissions.pop((user, vhost), None) is None:
            return False
        self.mark_definitions_changed("permission", (user, vhost))
        return True

    def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        self.topic_permissions[(user, vhost, exchange)] = TopicPermission(write, read, user, vhost)
        self.mark_definitions_changed("topic_permission", (user, vhost, exchange))

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Remove the user's topic permission on `exchange` in the vhost, or all of them there
        (exchange None); whether there was any."""
        keys = ([(user, vhost, exchange)] if exchange is not None else
                [k for k in self.topic_permissions if k[0] == user and k[1] == vhost])
        found = False
        for key in keys:
            if self.topic_permissions.pop(key, None) is not None:
                self.mark_definitions_changed("topic_permission", key)
                found = True
        return found

    def set_cluster_name(self, name: str) -> None:
        """New connections announce it (connection.start's server properties); a rare change,
        so the next flush rewrites all definitions (their global_parameters hold it)."""
        self.cluster_name = name
        self.cluster_name_set = True
        self.mark_definitions_changed()

    def clear_cluster_name(self) -> None:
        """Back to the node's own name (DELETE /api/global-parameters/cluster_name)."""
        self.cluster_name = Broker.cluster_name
        self.cluster_name_set = False
        self.mark_definitions_changed()

    # durable definitions -------------------------------------------------------
    def mark_definitions_changed(self, kind: str | None = None, key=None, binding=None) -> None:
        """Something that survives a restart changed (the model calls this; no I/O here): the
        object `key` of `kind` ("vhost": name, "user": name, "permission": (user, vhost),
        "topic_permission": (user, vhost, exchange),
        "policy"/"operator_policy"/"exchange"/"queue": (vhost, name), "binding": (vhost,
        source, Binding.key) with the Binding), or, without a kind, anything (the next flush
        rewrites all definitions: for rare, sweeping changes)."""
        self.definitions_dirty = True
        if kind is None or self.definitions_store is None:
            self.definitions_all_changed = True
        elif not self.definitions_all_changed:
            self.definitions_changes[(kind, key)] = binding

    def definitions_flushed(self) -> None:
        """The stored definitions match the broker (nothing left to write)."""
        self.definitions_dirty = False
        self.definitions_all_changed = False
        self.definitions_changes = {}

    def flush_definitions(self) -> None:
        """Make the definitions changed since the last flush durable: the stores's journal gets
        one record per changed object (cost independent of how many definitions exist); a
        store without a journal, or a sweeping change, gets all the definitions."""
        if not self.definitions_dirty:
            return
        store = self.definitions_store
        if store is None:
            self.definitions_flushed()
            return
        append = getattr(store, "append", None)
        try:
            if self.definitions_all_changed or append is None:
                store.save(export(self))
            else:
                try:
                    append(changes(self, self.definitions_changes))
                except BaseException:
                    # The journal may hold a torn record: the next try rewrites everything.
                    self.definitions_all_changed = True
                    self.definitions_changes = {}
                    raise
        except (OSError, TypeError, ValueError) as err:
            if not self.definitions_save_failing:  # once, not on every retry
                log.error("cannot save definitions to %s: %s", getattr(store, "path", store), err)
            self.definitions_save_failing = True
            return  # still dirty: the next flush tries again
        if self.definitions_save_failing:
            log.info("definitions saved again to %s", getattr(store, "path", store))
            self.definitions_save_failing = False
        self.definitions_flushed()
        if append is not None and store.needs_compaction():
            try:
                store.save(export(self))
            except (OSError, TypeError, ValueError) as err:
                # The changes are durable in the journal; compaction is tried again later.
                log.error("cannot compact definitions into %s: %s", getattr(store, "path", store), err)

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
