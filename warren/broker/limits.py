"""Vhost limits (max-connections, max-queues) and user limits (max-connections, max-channels),
validated and enforced as RabbitMQ 3.10 does (rabbit_vhost_limit, rabbit_auth_backend_internal,
rabbit_reader, rabbit_channel).

A vhost keeps its limits in `vhost.limits`: None while it has no "limits" runtime parameter,
else that parameter's value (a dict, maybe empty: RabbitMQ keeps the parameter, with value
[], after its last limit is cleared). A user keeps its limits in `user.limits` (a dict).
A negative value means no limit and 0 that nothing is allowed.

The counts are taken only when a limit applies, by walking the open connections: opening a
connection or a channel under a limit costs O(connections), and nothing otherwise. On a
cluster member they are counted over every running member, as RabbitMQ counts them: the
node asks the others for their counts (Usage) and checks the sum (`elsewhere`); nothing is
asked while no limit applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..amqp.erlang import erl_json, erl_list
from .errors import AMQPError, not_allowed, precondition_failed
from .metadata.change import Change, Operation
from .metadata.commands import SetUserLimits, SetVHostLimits
from .records import Usage

if TYPE_CHECKING:
    from .auth import User
    from .node import Node
    from .records import ConnectionHandle
    from .vhost import VHost

MAX_CONNECTIONS = "max-connections"
MAX_QUEUES = "max-queues"
MAX_CHANNELS = "max-channels"
VHOST_LIMITS = (MAX_CONNECTIONS, MAX_QUEUES)
USER_LIMITS = (MAX_CONNECTIONS, MAX_CHANNELS)
# The one name of the vhost-limits runtime parameter that RabbitMQ reads limits from.
PARAMETER_NAME = "limits"


class LimitError(ValueError):
    """Limits RabbitMQ's validation refuses: `errors` are its texts, in its order."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))

    def validation_failed(self) -> str:
        """As rabbit_runtime_parameters reports a refused parameter."""
        return "Validation failed\n\n" + "".join(e + "\n" for e in self.errors)


# --------------------------------------------------------------------- validation
def _items(value) -> list:
    """A JSON value as RabbitMQ's proplist validation sees it: an object as its (key, value)
    pairs in key order (maps:to_list), a list as it is."""
    if isinstance(value, dict):
        return sorted(value.items())
    return list(value)


def _term(item) -> str:
    if isinstance(item, tuple):
        return "{" + ",".join(erl_json(part) for part in item) + "}"
    return erl_json(item)


def validate(value, names: Sequence[str], what: str) -> dict[str, int]:
    """The limits in `value` (a JSON object of integers, or a list: [] is no limits) as a
    dict, or LimitError with RabbitMQ's texts (rabbit_parameter_validation:proplist with
    optional integer keys: errors in reverse order of `names`; unrecognised terms alone)."""
    if not isinstance(value, (dict, list)):
        raise LimitError([f"{what} not a list {erl_json(value)}"])
    rest = _items(value)
    errors: list[str] = []
    found: dict[str, int] = {}
    for name in names:
        for i, item in enumerate(rest):
            if isinstance(item, tuple) and item[0] == name:
                del rest[i]
                number = item[1]
                if isinstance(number, int) and not isinstance(number, bool):
                    found[name] = number
                else:
                    errors.insert(0, f"{name} should be a number, actually was {erl_json(number)}")
                break
    if rest:
        raise LimitError([f"Unrecognised terms {erl_list([_term(item) for item in rest])} in {what}"])
    if errors:
        raise LimitError(errors)
    return found


def validate_vhost_limits(value) -> dict[str, int]:
    return validate(value, VHOST_LIMITS, PARAMETER_NAME)


def validate_user_limits(value) -> dict[str, int]:
    return validate(value, USER_LIMITS, "user-limits")


def value_json(limits: dict[str, int]) -> Any:
    """A limits parameter's value as RabbitMQ shows it: an empty proplist is []."""
    return dict(limits) if limits else []


# ------------------------------------------------------------------- changes (as commands)
@Operation
def set_vhost_limit(broker: Node, vhost: VHost, name: str, value) -> Change[None]:
    """PUT /api/vhost-limits/V/NAME: one limit, the others kept (rabbit_vhost_limit:
    update_limit puts the new one first)."""
    current = {k: v for k, v in (vhost.limits or {}).items() if k != name}
    limits = validate_vhost_limits({name: value, **current})
    (yield SetVHostLimits(vhost.name, {name: limits[name], **current}))


@Operation
def clear_vhost_limit(broker: Node, vhost: VHost, name: str) -> Change[None]:
    """One limit cleared; the parameter stays, even empty (as RabbitMQ)."""
    (yield SetVHostLimits(vhost.name, {k: v for k, v in (vhost.limits or {}).items() if k != name}))


@Operation
def update_user_limits(broker: Node, user: User, value) -> Change[None]:
    """Set the limits given (validated), keeping the others: PUT /api/users with "limits"
    and an imported user's "limits" merge, as RabbitMQ's do."""
    given = validate_user_limits(value)
    if given:
        (yield SetUserLimits(user.name, {**user.limits, **given}))


@Operation
def set_user_limit(broker: Node, user: User, name: str, value) -> Change[None]:
    given = validate_user_limits({name: value})
    (yield SetUserLimits(user.name, {**user.limits, **given}))


@Operation
def clear_user_limit(broker: Node, user: User, name: str) -> Change[None]:
    if name in user.limits:
        (yield SetUserLimits(user.name, {k: v for k, v in user.limits.items() if k != name}))


# --------------------------------------------------------------------- enforcement
def limit(limits: dict[str, int] | None, name: str) -> int | None:
    """The limit in force, or None for none (absent or negative)."""
    value = (limits or {}).get(name)
    return value if value is not None and value >= 0 else None


def _connections(broker: Node) -> Iterable[ConnectionHandle]:
    return broker.connections


NONE = Usage()


def usage(broker: Node, vhost_name: str | None, user_name: str) -> Usage:
    """This node's count of the vhost's connections, the user's connections and their
    channels (what another member asks before it opens one under a limit)."""
    vhost_connections = user_connections = user_channels = 0
    for c in _connections(broker):
        vhost = c.vhost
        if vhost is not None and vhost.name == vhost_name:
            vhost_connections += 1
        if c.user is not None and c.user.name == user_name:
            user_connections += 1
            user_channels += len(c.channels)
    return Usage(vhost_connections, user_connections, user_channels)


def connection_limited(broker: Node, vhost_name: str, user: User) -> bool:
    """Whether a connection.open into the vhost as the user is under a limit that counts
    connections (else no counts are needed)."""
    vhost = broker.vhosts.get(vhost_name)
    return (vhost is not None and limit(vhost.limits, MAX_CONNECTIONS) is not None
            or limit(user.limits, MAX_CONNECTIONS) is not None)


def channel_limited(broker: Node, user: User | None) -> bool:
    """Whether a channel.open of the user's is under a max-channels limit."""
    return user is not None and limit(broker.users.get(user.name, user).limits, MAX_CHANNELS) is not None


def check_connection(broker: Node, vhost_name: str, user: User, elsewhere: Usage = NONE) -> None:
    """At connection.open, before the vhost access check (RabbitMQ's order): the vhost's
    max-connections, then the user's, over this node's connections and `elsewhere` (the
    other members'). 530, as rabbit_reader refuses."""
    vhost = broker.vhosts.get(vhost_name)
    if vhost is None:
        return  # "vhost ... not found" comes first (the caller's)
    allowed = limit(vhost.limits, MAX_CONNECTIONS)
    if allowed is not None and (allowed == 0 or elsewhere.vhost_connections + sum(
            1 for c in _connections(broker) if c.vhost is vhost) >= allowed):
        raise AMQPError(530, f"access to vhost '{vhost_name}' refused for user '{user.name}': "
                             f"connection limit ({allowed}) is reached", (10, 40))
    allowed = limit(user.limits, MAX_CONNECTIONS)
    if allowed is not None and (allowed == 0 or elsewhere.user_connections + sum(
            1 for c in _connections(broker) if c.user is not None and c.user.name == user.name) >= allowed):
        raise AMQPError(530, f"connection refused for user '{user.name}': user connection limit ({allowed}) "
                             "is reached", (10, 40))


def check_channel(broker: Node, user: User | None, elsewhere: Usage = NONE) -> None:
    """At channel.open: the user's max-channels over all its connections, on this node and
    `elsewhere` (a connection error, 530, as rabbit_reader's)."""
    if user is None:
        return
    # The user as it is now: a password or tags change (or an import) replaces the User
    # object this connection logged in as, and the limits live on the current one.
    user = broker.users.get(user.name, user)
    allowed = limit(user.limits, MAX_CHANNELS)
    if allowed is None:
        return
    if allowed == 0 or elsewhere.user_channels + sum(len(c.channels) for c in _connections(broker)
                                                     if c.user is not None and c.user.name == user.name) >= allowed:
        raise not_allowed(f"number of channels opened for user '{user.name}' has reached the maximum "
                          f"allowed user limit of ({allowed})", (0, 0))


def check_queue(vhost: VHost, name: str) -> None:
    """Before a new queue is declared (over AMQP or HTTP): the vhost's max-queues (406, as
    rabbit_channel's check_vhost_queue_limit)."""
    allowed = limit(vhost.limits, MAX_QUEUES)
    if allowed is not None and len(vhost.queues) + 1 > allowed:
        raise precondition_failed(f"cannot declare queue '{name}': queue limit in vhost '{vhost.name}' "
                                  f"({allowed}) is reached")


def check_import(broker: Node, new_queues: dict[str, int]) -> None:
    """Before a definitions import declares `new_queues` (vhost name -> how many queues it
    adds): RabbitMQ refuses the whole import if any vhost would pass its max-queues."""
    for vhost_name, adding in new_queues.items():
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            continue
        allowed = limit(vhost.limits, MAX_QUEUES)
        if adding and allowed is not None and len(vhost.queues) + adding > allowed:
            raise LimitError([f'Adding {adding} queue(s) to virtual host "{vhost_name}" would exceed the limit of '
                              f"{allowed} queue(s).\n\nThis virtual host currently has {len(vhost.queues)} "
                              "queue(s) defined.\n\nImport aborted!"])
