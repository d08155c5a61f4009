"""The broker: vhosts, users and permissions, and the limits connections negotiate."""

import logging
from dataclasses import dataclass, field

from .auth import Permission, User, check
from .definitions import export
from .vhost import VHost

log = logging.getLogger("warren.definitions")


@dataclass
class Limits:
    """Connection parameters offered in connection.tune and enforced afterwards."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024  # RabbitMQ 3.x default
    handshake_timeout: float = 10.0


@dataclass
class Broker:
    limits: Limits = field(default_factory=Limits)
    vhosts: dict = field(default_factory=dict)
    users: dict = field(default_factory=dict)
    permissions: dict = field(default_factory=dict)  # (user, vhost) -> Permission
    loopback_users: set = field(default_factory=lambda: {"guest"})
    connections: set = field(default_factory=set)
    # Message counters of the channels that have closed (the overview's totals include them).
    message_totals: dict = field(default_factory=dict)
    cluster_name: str = "warren@localhost"
    # Where durable definitions are saved (a warren.store.definitions.DefinitionsFile), or None
    # without a data dir. The model only sets definitions_dirty; the session layer calls
    # flush_definitions() before it sends any reply, so a declare-ok follows the write.
    definitions_store: object = None
    definitions_dirty: bool = False
    definitions_save_failing: bool = False
    # The message store's writer (a warren.store.persister.Persister), or None: queues then
    # keep their messages in memory only.
    persister: object = None

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

    def make_store(self, vhost: str, queue: str, durable: bool):
        """The store for a new queue (None: the queue's in-memory default)."""
        return self.persister.queue_store(vhost, queue, durable) if self.persister is not None else None

    def add_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name, self)
            self.mark_definitions_changed()
        return vhost

    def delete_vhost(self, name: str):
        """Remove a vhost and the permissions on it; returns it (or None). Closing its
        connections is the caller's business."""
        vhost = self.vhosts.pop(name, None)
        if vhost is not None:
            for key in [k for k in self.permissions if k[1] == name]:
                del self.permissions[key]
            self.mark_definitions_changed()
        return vhost

    def add_user(self, user: User) -> None:
        self.users[user.name] = user
        self.mark_definitions_changed()

    def delete_user(self, name: str):
        """Remove a user and its permissions; returns it (or None)."""
        user = self.users.pop(name, None)
        if user is not None:
            for key in [k for k in self.permissions if k[0] == name]:
                del self.permissions[key]
            self.mark_definitions_changed()
        return user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.permissions[(user, vhost)] = Permission(configure, write, read)
        self.mark_definitions_changed()

    def clear_permissions(self, user: str, vhost: str) -> bool:
        if self.permissions.pop((user, vhost), None) is None:
            return False
        self.mark_definitions_changed()
        return True

    # durable definitions -------------------------------------------------------
    def mark_definitions_changed(self) -> None:
        """Something that survives a restart changed (the model calls this; no I/O here)."""
        self.definitions_dirty = True

    def flush_definitions(self) -> None:
        """Save the definitions if they changed since the last save (cheap when they did not)."""
        if not self.definitions_dirty:
            return
        store = self.definitions_store
        if store is None:
            self.definitions_dirty = False
            return
        try:
            store.save(export(self))
        except (OSError, TypeError, ValueError) as err:
            if not self.definitions_save_failing:  # once, not on every retry
                log.error("cannot save definitions to %s: %s", getattr(store, "path", store), err)
            self.definitions_save_failing = True
            return  # still dirty: the next flush tries again
        if self.definitions_save_failing:
            log.info("definitions saved again to %s", getattr(store, "path", store))
            self.definitions_save_failing = False
        self.definitions_dirty = False

    def authenticate(self, username: str, password: str):
        user = self.users.get(username)
        # As RabbitMQ's internal backend, an empty password never logs in (even if it is the
        # one that was set).
        if user is not None and password and user.check_password(password):
            return user
        return None

    def check(self, user: str, vhost: str, what: str, kind: str, name: str) -> None:
        check(self.permissions.get((user, vhost)), user, what, kind, name, vhost)
