"""The broker: vhosts, users and permissions, and the limits connections negotiate."""

from dataclasses import dataclass, field

from .auth import Permission, User, check
from .vhost import VHost


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
    cluster_name: str = "warren@localhost"

    @classmethod
    def with_defaults(cls, user="guest", password="guest", vhost="/", **kwargs):
        broker = cls(**kwargs)
        broker.add_vhost(vhost)
        broker.add_user(User.with_password(user, password, tags=["administrator"]))
        broker.set_permissions(user, vhost, ".*", ".*", ".*")
        return broker

    def add_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name)
        return vhost

    def add_user(self, user: User) -> None:
        self.users[user.name] = user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.permissions[(user, vhost)] = Permission(configure, write, read)

    def authenticate(self, username: str, password: str):
        user = self.users.get(username)
        if user is not None and user.check_password(password):
            return user
        return None

    def check(self, user: str, vhost: str, what: str, kind: str, name: str) -> None:
        check(self.permissions.get((user, vhost)), user, what, kind, name, vhost)
