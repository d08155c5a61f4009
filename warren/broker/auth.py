"""Users, password hashes, per-vhost permissions and topic permissions, as RabbitMQ's internal
auth backend."""

import base64
import hashlib
import hmac
import os
import re

from .errors import access_refused

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
_HASHES = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}


def hash_password(password: str, algorithm: str = SHA256, salt: bytes | None = None) -> str:
    """RabbitMQ's salted hash: base64(salt(4) + H(salt + password))."""
    salt = salt if salt is not None else os.urandom(4)
    digest = _HASHES[algorithm](salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


class User:
    def __init__(self, name: str, password_hash: str, tags=(), algorithm: str = SHA256,
                 limits: dict[str, int] | None = None):
        self.name = name
        self.password_hash = password_hash
        self.algorithm = algorithm
        self.tags = list(tags)
        # max-connections, max-channels (warren.broker.limits)
        self.limits: dict[str, int] = dict(limits) if limits else {}

    @classmethod
    def with_password(cls, name, password, tags=()):
        return cls(name, hash_password(password), tags)

    def check_password(self, password: str) -> bool:
        if not self.password_hash:
            return False  # a user without a password cannot log in with one
        try:
            raw = base64.b64decode(self.password_hash)
        except ValueError:
            return False
        salt = raw[:4]
        expected = hash_password(password, self.algorithm, salt)
        return hmac.compare_digest(expected, self.password_hash)


def invalid_regexp(pattern) -> str | None:
    """Why `pattern` is not a permission regex (not a string, or not a valid expression), or
    None when it is one."""
    if not isinstance(pattern, str):
        return "not a string"
    try:
        re.compile(pattern)
    except re.error as err:
        return str(err)
    return None


class Permission:
    __slots__ = ("configure", "write", "read", "_res")

    def __init__(self, configure: str, write: str, read: str):
        self.configure, self.write, self.read = configure, write, read
        self._res = {k: (re.compile(v) if v else None) for k, v in
                     (("configure", configure), ("write", write), ("read", read))}

    def allows(self, what: str, name: str) -> bool:
        regex = self._res[what]
        return regex is not None and regex.search(name) is not None


def check(permission: Permission | None, user: str, what: str, kind: str, name: str, vhost: str) -> None:
    """Raise 403 unless `user` may `what` (configure/write/read) the named resource."""
    # RabbitMQ checks the default exchange under the name amq.default.
    checked = "amq.default" if kind == "exchange" and name == "" else name
    if permission is None or not permission.allows(what, checked):
        raise access_refused(
            f"{what} access to {kind} '{checked}' in vhost '{vhost}' refused for user '{user}'")


class TopicPermission:
    """A user's write and read regexes for the routing keys of one topic exchange in one vhost
    (rabbit_auth_backend_internal's topic permissions). The patterns are kept as given (the
    API and the definitions show them so); what is matched is the pattern with "{username}"
    and "{vhost}" replaced by the plain names (no regex escaping, as RabbitMQ's
    expand_topic_permission, which substitutes username first), and an empty pattern matches
    only the empty key ("^$"). AMQP 0-9-1 connections carry no other variables (RabbitMQ
    fills client_id only for its MQTT and STOMP plugins' direct connections)."""

    __slots__ = ("write", "read", "_write", "_read")

    def __init__(self, write: str, read: str, user: str, vhost: str):
        self.write, self.read = write, read
        self._write = _topic_regex(write, user, vhost)
        self._read = _topic_regex(read, user, vhost)

    def allows(self, what: str, routing_key: str) -> bool:
        return (self._write if what == "write" else self._read).search(routing_key) is not None


def _topic_regex(pattern: str, user: str, vhost: str) -> "re.Pattern[str]":
    expanded = (pattern or "^$").replace("{username}", user).replace("{vhost}", vhost)
    try:
        return re.compile(expanded)
    except re.error:
        # A name that makes the expansion invalid (e.g. a user "a(") can never match: RabbitMQ's
        # re:run fails there and refuses the access too.
        return re.compile(r"(?!)")


def check_topic(permission: TopicPermission | None, user: str, what: str, exchange: str, routing_key: str,
                vhost: str) -> None:
    """Raise 403 unless `user` may `what` (write: publish, read: bind) `routing_key` on the topic
    exchange; no topic permission for that exchange allows everything, as in RabbitMQ."""
    if permission is not None and not permission.allows(what, routing_key):
        # RabbitMQ 3.12+'s wording, which names the permission (3.10: "access to topic ...").
        raise access_refused(f"{what} access to topic '{routing_key}' in exchange '{exchange}' in vhost "
                             f"'{vhost}' refused for user '{user}'")
