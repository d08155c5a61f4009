"""RabbitMQ's definitions JSON: import (the format `load_definitions` reads, also newer
RabbitMQ's, as RabbitMQ 3.10 reads them) and export, also the format of Warren's data dir.

The export here has every field either of RabbitMQ's exporters writes (vhost metadata, queue
type, the exchanges' "internal"), so that the data dir keeps everything; the management API
shapes it into RabbitMQ 3.10.8's GET /api/definitions (warren.mgmt.api.definitions)."""

from __future__ import annotations

import datetime
import decimal
import functools
import gc
import html
import json
from typing import TYPE_CHECKING

from .. import __version__
from ..amqp.codec import typed_float, typed_int
from .auth import MD5, SHA256, SHA512, User, invalid_regexp
from .errors import AMQPError
from .links import ConnectionLink, ExclusiveOwner
from .exchanges import TYPES
from .policy import Policy, PolicyError
from .metadata import change, commands
from . import limits, missing_exchange, ops, parameters as runtime_parameters, queues

if TYPE_CHECKING:
    from .node import Node



class DefinitionsError(ValueError):
    pass


def _tags(value) -> list:
    if isinstance(value, list):
        return [str(t) for t in value]
    return [t.strip() for t in str(value or "").split(",") if t.strip()]


def load(broker, data: dict, on_error=None, acting_user: str | None = None) -> dict:
    """Apply users (with their limits), vhosts, permissions, topic permissions, policies,
    runtime parameters (operator policies, vhost limits and shovels, which start once the
    load is done; a component Warren does not have, such as a federation upstream, fails the
    import: warren.broker.parameters), global parameters,
    exchanges, queues and bindings to the broker. An import (no on_error) whose new queues
    would pass a vhost's max-queues is refused before anything is applied, as RabbitMQ's.

    acting_user is the user importing over the API: as in RabbitMQ (rabbit_vhost:put_vhost),
    each vhost the import creates gives that user full permissions there, unless the import
    sets its permissions there itself. A load at start-up or from the control socket has none
    (RabbitMQ's internal user and rabbitmqctl get nothing either).

    Without on_error the first bad definition raises DefinitionsError. With it, each bad
    definition is reported as on_error(kind, item, message) and skipped (recovery from the
    data dir: one bad entry must not keep the rest from coming back). Returns how many of
    each kind were applied.

    A cluster member imports through its cluster's log instead (ClusterImport)."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    if on_error is None:  # an import (recovery restores what was there, over any limit)
        _check_queue_limits(broker, data)
    # Everything a bulk load creates lives on: the cyclic collector would only walk the
    # growing model again and again (a full collection per 25% of growth, each one slower
    # as the heap outgrows the caches), which made 100,000 bindings ~18x the time of 10,000.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(broker, data, on_error, acting_user)
    finally:
        if collecting:
            gc.enable()


def _load(broker, data: dict, on_error, acting_user: str | None) -> dict:
    counts = {}
    now = _Now(broker)
    for kind, apply in _KINDS:
        items = data.get(kind) or []
        if not isinstance(items, list):
            _fail(on_error, kind, items, f"'{kind}' must be a list")
            items = []
        counts[kind] = 0
        for item in items:
            message = _item_error(now, kind, apply, item)
            if message is None:
                counts[kind] += 1
            else:
                _fail(on_error, kind, item, message)
        if kind == "permissions":
            _grant_creator(now, broker, acting_user, now.created)
    return counts


def _item_error(sink, kind: str, apply, item) -> str | None:
    """Load one definition through `sink`: None, or why it is refused."""
    try:
        if not isinstance(item, dict):
            raise DefinitionsError(f"each of '{kind}' must be a JSON object")
        apply(sink, item)
    except Exception as err:
        return _refusal(err)
    return None


def _refusal(err: Exception) -> str:
    """What a definition's failure says (RabbitMQ's texts); a failure that is no definition's
    fault is raised again."""
    if isinstance(err, KeyError):
        return f"definition is missing the field {err}"
    if isinstance(err, AMQPError):
        return err.text
    if isinstance(err, PolicyError):
        return " ".join(err.errors)
    if isinstance(err, (DefinitionsError, TypeError, ValueError)):
        return str(err)
    raise err


def _grant_creator(sink, broker, acting_user: str | None, created: list) -> None:
    """RabbitMQ's put_vhost gives the acting user full permissions on a vhost it creates,
    before the import's own permissions apply: the same end state as granting them now where
    the import set none (and the export keeps the import's order)."""
    if acting_user is None or acting_user not in broker.users:
        return
    for name in created:
        if name in broker.vhosts and (acting_user, name) not in broker.permissions:
            sink.apply(commands.SetPermissions(acting_user, name, ".*", ".*", ".*"))


def _fail(on_error, kind, item, message):
    if on_error is None:
        raise DefinitionsError(message) from None
    on_error(kind, item, message)


class _Now:
    """Where a load's commands go on a node alone (and in recovery): applied at once, so each
    definition is checked against what the ones before it made."""

    def __init__(self, broker: Node) -> None:
        self.broker = broker
        self.created: list[str] = []  # the vhosts this load created

    def apply(self, command: commands.Command):
        return self.broker.metadata.apply(command)

    def run(self, operation):
        return change.run(self, operation)

    def has_vhost(self, name: str) -> bool:
        return name in self.broker.vhosts

    def has_exchange(self, vhost, name: str) -> bool:
        return name in vhost.exchanges

    def has_queue(self, vhost, name: str) -> bool:
        return name in vhost.queues

    def user_limits(self, name: str) -> dict:
        return self.broker.users[name].limits

    def home(self, q: dict) -> str | None:
        return q.get("node")  # (a cluster member's journal: see _queue_json)

    def replicas(self, vhost, q: dict, arguments: dict) -> tuple[tuple[str, ...] | None, str | None, str | None]:
        """A replicated queue's members, incarnation and first leader (a cluster member's
        journal: see _queue_json)."""
        members = q.get("members")
        return tuple(members) if isinstance(members, list) and members else None, q.get("incarnation"), self.home(q)


class _Plan(_Now):
    """Where a cluster member's import puts its commands: into one batch for the cluster's log
    (ClusterImport), checked as _Now checks them, against the metadata as it is and what the
    batch's commands before them will make (an import's definitions of one kind depend on
    each other only through what they name: vhosts, users, exchanges, queues). Classic queues
    get this node as their home, as RabbitMQ's import declares them on the importing node, and
    quorum queues lead from it first, with their replicas where placement puts them."""

    def __init__(self, broker: Node) -> None:
        super().__init__(broker)
        self.commands: list[commands.Command] = []
        self.vhosts: set[str] = set()
        self.exchanges: set[tuple[str, str]] = set()
        self.queues: set[tuple[str, str]] = set()
        self.limits_after: dict[str, dict] = {}  # user -> limits, as the batch leaves them

    def apply(self, command: commands.Command):
        result = None
        if isinstance(command, commands.PutVHost):
            result = not self.has_vhost(command.name)
            self.vhosts.add(command.name)
        elif isinstance(command, commands.PutUser):  # (a user replaced keeps its limits)
            name = command.user.name
            old = self.user_limits(name) if name in self.limits_after or name in self.broker.users else {}
            self.limits_after[name] = dict(command.user.limits) or old
        elif isinstance(command, commands.SetUserLimits):
            self.limits_after[command.user] = dict(command.limits)
        elif isinstance(command, commands.DeclareExchange):
            self.exchanges.add((command.vhost, command.name))
        elif isinstance(command, commands.DeclareQueue):
            # Checked before the batch is written (every node checks it again as it applies it).
            queues.checked_type(command.vhost, command.name, command.durable, False, command.auto_delete,
                                command.arguments)
            self.queues.add((command.vhost, command.name))
        self.commands.append(command)
        return result

    def has_vhost(self, name: str) -> bool:
        return name in self.vhosts or name in self.broker.vhosts

    def has_exchange(self, vhost, name: str) -> bool:
        return (vhost.name, name) in self.exchanges or name in vhost.exchanges

    def has_queue(self, vhost, name: str) -> bool:
        return (vhost.name, name) in self.queues or name in vhost.queues

    def user_limits(self, name: str) -> dict:
        return self.limits_after[name] if name in self.limits_after else self.broker.users[name].limits

    def home(self, q: dict) -> str | None:
        return self.broker.config.node_name

    def replicas(self, vhost, q: dict, arguments: dict) -> tuple[tuple[str, ...] | None, str | None, str | None]:
        """A quorum queue is placed as a client's declare on this node places it (its leader
        first, replicas on other members)."""
        members, incarnation = ops.replicas_of_new(self.broker, vhost, q["name"], arguments)
        return members, incarnation, members[0] if members else self.home(q)


# What a batch of an import holds at most: well within etcd's request limit (1.5 MiB).
BATCH_ITEMS = 1000
BATCH_BYTES = 256 * 1024


class ClusterImport:
    """An import into a cluster (through its member `broker`): what load does on a node alone,
    with the same checks, errors and order, put in the cluster's log a batch at a time, each
    batch one entry every node applies (commands.Batch). Like a node alone's import (and
    RabbitMQ's), it is not atomic: what was imported before the first bad definition stays.

    A quorum queue is placed as a client's declare on the
    importing node places it (_Plan.replicas).

        for step in ClusterImport(broker, data, user).steps():
            await (the cluster's log carries out step())

    A step is an operation (warren.broker.metadata.change): it plans its batch against the
    metadata as it is when the log runs it, again if another change got in first."""

    def __init__(self, broker: Node, data: dict, acting_user: str | None = None) -> None:
        if not isinstance(data, dict):
            raise DefinitionsError("definitions must be a JSON object")
        _check_queue_limits(broker, data)
        self.broker = broker
        self.data = data
        self.acting_user = acting_user
        self.counts: dict[str, int] = {}
        self.created: list[str] = []  # the vhosts the import created
        self._done = 0  # of the current kind's items, those imported

    def steps(self):
        """The operations that import the definitions, one after the other; each is to be
        carried out before the next is asked for."""
        for kind, apply in _KINDS:
            items = self.data.get(kind) or []
            if not isinstance(items, list):
                raise DefinitionsError(f"'{kind}' must be a list")
            self.counts[kind] = self._done = 0
            while self._done < len(items):
                yield functools.partial(self._batch, kind, apply, items)
            if kind == "permissions" and self.acting_user is not None:
                yield self._grant

    def _batch(self, kind: str, apply, items: list) -> change.Change[None]:
        plan = _Plan(self.broker)
        end, size, refused = self._done, 0, None
        while end < len(items) and len(plan.commands) < BATCH_ITEMS and size < BATCH_BYTES:
            item = items[end]
            refused = _item_error(plan, kind, apply, item)
            if refused is not None:
                break
            size += len(json.dumps(item, default=str))
            end += 1
        if plan.commands:
            try:
                yield commands.Batch(tuple(plan.commands))
            except commands.BatchStopped as stopped:
                raise DefinitionsError(_refusal(stopped.error)) from None
        if refused is not None:
            raise DefinitionsError(refused)
        self.counts[kind] += end - self._done
        self._done = end
        self.created.extend(plan.created)

    def _grant(self) -> change.Change[None]:
        plan = _Plan(self.broker)
        _grant_creator(plan, self.broker, self.acting_user, self.created)
        if plan.commands:
            yield commands.Batch(tuple(plan.commands))


def _load_vhost(sink, v) -> None:
    """RabbitMQ's put_vhost: description and tags from the top-level keys, else from
    "metadata", else empty (an existing vhost listed without them loses its own);
    default_queue_type (in "metadata") only when the vhost is created. Warren's
    missing_exchange likewise (warren.broker.missing_exchange), but an existing vhost listed
    without it keeps its own. The sink notes the vhosts created."""
    name = v["name"]
    if not isinstance(name, str):
        raise DefinitionsError("a vhost's name must be a string")
    metadata = v.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    description = v.get("description", metadata.get("description"))
    description = "" if description is None else str(description)
    tags = _tags(v.get("tags", metadata.get("tags")))
    default_queue_type = metadata.get("default_queue_type")
    # Warren's capture exchange: from the top level, else "metadata"; absent, an existing
    # vhost keeps its own (RabbitMQ's exports never have it); checked before anything changes.
    capture = v[missing_exchange.SETTING] if missing_exchange.SETTING in v else metadata.get(
        missing_exchange.SETTING, commands.KEEP)
    if capture is not commands.KEEP:
        try:
            capture = missing_exchange.validate(capture)
        except missing_exchange.SettingError as err:
            raise DefinitionsError(f"{err} (vhost '{name}')") from None
    if not sink.has_vhost(name) and default_queue_type is not None and default_queue_type not in queues.TYPES:
        # (rabbit_queue_type:discover)
        raise DefinitionsError(f"invalid_queue_type '{default_queue_type}' for vhost '{name}'")
    if sink.apply(commands.PutVHost(name, description, tags, capture, default_queue_type)):
        sink.created.append(name)


def _load_user(sink, u):
    algorithm = u.get("hashing_algorithm", SHA256)
    if algorithm not in (SHA256, SHA512, MD5):
        raise DefinitionsError(f"unsupported hashing algorithm '{algorithm}' for user '{u['name']}'")
    if "password_hash" in u:
        user = User(u["name"], u["password_hash"], _tags(u.get("tags")), algorithm)
    else:
        user = User.with_password(u["name"], u.get("password", ""), _tags(u.get("tags")))
    given = limits.validate_user_limits(u.get("limits") or {})  # before the user changes
    sink.apply(commands.PutUser(user))
    if given:  # merged with the user's own, as RabbitMQ (limits.update_user_limits)
        sink.apply(commands.SetUserLimits(user.name, {**sink.user_limits(user.name), **given}))


def _load_permission(sink, p):
    if not sink.has_vhost(p["vhost"]):
        raise DefinitionsError(f"permission for unknown vhost '{p['vhost']}'")
    sink.apply(commands.SetPermissions(p["user"], p["vhost"], p.get("configure", ""), p.get("write", ""),
                                       p.get("read", "")))


def _load_topic_permission(sink, p):
    user, vhost, exchange, write, read = p["user"], p["vhost"], p["exchange"], p["write"], p["read"]
    if user not in sink.broker.users:
        raise DefinitionsError(f"topic permission for unknown user '{user}'")
    if not sink.has_vhost(vhost):
        raise DefinitionsError(f"topic permission for unknown vhost '{vhost}'")
    check_topic_permission(exchange, write, read)
    sink.apply(commands.SetTopicPermissions(user, vhost, exchange, write, read))


def check_topic_permission(exchange, write, read) -> None:
    """DefinitionsError unless the exchange name is a string and both patterns are valid
    regular expressions (what the API and imports accept)."""
    if not isinstance(exchange, str):
        raise DefinitionsError("a topic permission's exchange must be a string")
    for pattern in (write, read):
        problem = invalid_regexp(pattern)
        if problem is not None:
            raise DefinitionsError(f"invalid_regexp {pattern!r}: {problem}")


def _load_policy(sink, p, operator=False):
    """A policy, validated as the API's PUT validates it; refused with RabbitMQ's import text
    (its validation text, " (vhost/name)" added, HTML-escaped)."""
    vhost = _vhost(sink.broker, p)
    try:
        policy = Policy.validated(vhost.name, p["name"], p["pattern"], p["definition"], p.get("priority", 0),
                                  p.get("apply-to", "all"), operator)
    except PolicyError as err:
        raise DefinitionsError(html.escape(f"{err} ({vhost.name}/{p['name']})", quote=False)) from None
    sink.apply(commands.SetPolicy(policy, operator))


def _load_parameter(sink, p):
    """A runtime parameter, validated as the API's PUT validates it (a shovel's URIs without
    a user's permissions, as RabbitMQ's import): a component Warren does not have
    (federation-upstream: a plugin) fails the import, as in a RabbitMQ without that plugin,
    with its text (HTML-escaped, " (vhost/component/name)" added)."""
    vhost = _vhost(sink.broker, p)
    component, name = p["component"], p["name"]
    try:
        sink.run(runtime_parameters.set_parameter.change(sink.broker, vhost, component, name, p["value"]))
    except runtime_parameters.ParameterError as err:
        text = f"{err} ({vhost.name}/{component}/{name})"
        raise DefinitionsError(html.escape(text, quote=False)) from None


def _load_global_parameter(sink, p):
    """A global runtime parameter: any name and value (cluster_name names the broker)."""
    try:
        sink.run(runtime_parameters.set_global.change(sink.broker, p["name"], p["value"]))
    except runtime_parameters.ParameterError as err:
        raise DefinitionsError(str(err)) from None


def _check_queue_limits(broker, data: dict) -> None:
    """RabbitMQ checks an import's new queues against their vhosts' max-queues before it
    applies anything (the queues it then declares are not checked one by one)."""
    queues = data.get("queues")
    adding: dict = {}
    for q in queues if isinstance(queues, list) else ():
        if isinstance(q, dict):
            vhost = broker.vhosts.get(q.get("vhost", "/"))
            if vhost is not None and q.get("name") not in vhost.queues:
                adding[vhost.name] = adding.get(vhost.name, 0) + 1
    try:
        limits.check_import(broker, adding)
    except limits.LimitError as err:
        raise DefinitionsError(str(err)) from None


def _load_exchange(sink, x):
    # Like RabbitMQ's import, an exchange or queue that exists already is kept as it is.
    vhost = _vhost(sink.broker, x)
    if sink.has_exchange(vhost, x["name"]):
        return
    if x.get("type", "direct") not in TYPES:
        raise DefinitionsError(f"unknown exchange type '{x.get('type')}' for exchange '{x['name']}'")
    sink.apply(commands.DeclareExchange(
        vhost.name, x["name"], x.get("type", "direct"), x.get("durable", True), x.get("auto_delete", False),
        x.get("internal", False), typed_arguments(x)))


def _load_queue(sink, q):
    vhost = _vhost(sink.broker, q)
    if sink.has_queue(vhost, q["name"]):
        return
    owner = q.get("owner")  # (a cluster member's journal: see _queue_json)
    if isinstance(owner, list) and len(owner) == 5:
        owner = ExclusiveOwner(owner[0], owner[1], ConnectionLink(*owner[2:]))
    arguments = typed_arguments(q)
    members, incarnation, home = sink.replicas(vhost, q, arguments)
    sink.apply(commands.DeclareQueue(vhost.name, q["name"], q.get("durable", True), owner or None,
                                     q.get("auto_delete", False), arguments, home, members, incarnation))


def _load_binding(sink, b):
    vhost = _vhost(sink.broker, b)
    sink.apply(commands.Bind(vhost.name, b["source"], b.get("destination_type", "queue"), b["destination"],
                                        b.get("routing_key", ""), typed_arguments(b)))


# The kinds of definitions, in the order a load applies them.
_KINDS = (("vhosts", _load_vhost), ("users", _load_user), ("permissions", _load_permission),
          ("topic_permissions", _load_topic_permission), ("policies", _load_policy),
          ("parameters", _load_parameter), ("global_parameters", _load_global_parameter),
          ("exchanges", _load_exchange), ("queues", _load_queue), ("bindings", _load_binding))


def typed_arguments(item: dict) -> dict:
    """An item's arguments typed as RabbitMQ's import types JSON in a field table
    (rabbit_misc:to_amqp_table: integers long, other numbers double), so that what checks a
    type (x-federation-upstream's x-max-hops must be a long) finds what the declare gave."""
    return _typed(item.get("arguments") or {})


def _typed(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, dict, list)):
        return value
    if isinstance(value, int):
        return typed_int("long", value) if -(1 << 63) <= value < (1 << 63) else value
    if isinstance(value, float):
        return typed_float("double", value)
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    return [_typed(v) for v in value]


def _vhost(broker, item):
    name = item.get("vhost", "/")
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise DefinitionsError(f"unknown vhost '{name}'")
    return vhost


# -- export ---------------------------------------------------------------------

def _json_value(value):
    """A field-table value as JSON (as RabbitMQ's management API shows arguments): numbers,
    strings, booleans, null, objects and lists stay; binaries become strings, a timestamp its
    seconds, a decimal a number."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value).decode("latin-1")
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def _is_kept_queue(q, durable_only: bool, member: bool = False) -> bool:
    """Whether the definitions keep it; a cluster member's journal keeps every queue (its tables
    are the cluster's log's: a restart goes on from what they include)."""
    return (member and durable_only) or (not q.exclusive and (q.durable or not durable_only))


def _vhost_json(vhost) -> dict:
    metadata = {"description": vhost.description, "tags": list(vhost.tags)}
    if vhost.default_queue_type is not None:
        metadata["default_queue_type"] = vhost.default_queue_type
    if vhost.missing_exchange is not None:  # Warren's (RabbitMQ's import ignores the key)
        metadata[missing_exchange.SETTING] = vhost.missing_exchange
    return {"name": vhost.name, "limits": [], "metadata": metadata}


def _exchange_json(vhost, x) -> dict:
    return {"name": x.name, "vhost": vhost.name, "type": x.type_name, "durable": x.durable,
            "auto_delete": x.auto_delete, "internal": x.internal, "arguments": _json_value(x.arguments)}


def _queue_json(vhost, q, member: bool = False) -> dict:
    record = {"name": q.name, "vhost": vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
              "type": q.queue_type, "arguments": _json_value(q.arguments)}
    if member:  # (Warren's keys, in a member's journal only: where it lives, who owns it)
        record["node"] = getattr(q, "home", vhost.broker.config.node_name)
        if q.owner is not None:
            o = q.owner
            record["owner"] = [o.node, o.id, o.link.name, o.link.peer_host, o.link.peer_port]
        if q.members:
            record["members"] = list(q.members)
            record["incarnation"] = q.incarnation
    return record


def _binding_json(vhost, x, b) -> dict:
    return {"source": x.name, "vhost": vhost.name, "destination": b.destination.name,
            "destination_type": b.destination.kind, "routing_key": b.routing_key,
            "arguments": _json_value(b.arguments)}


def _user_json(u) -> dict:
    return {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.algorithm,
            "tags": list(u.tags), "limits": dict(u.limits)}


def _permission_json(user, vhost, p) -> dict:
    return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}


def topic_permission_json(key, p) -> dict:
    """key: (user, vhost, exchange); the shape of the definitions and of /api/topic-permissions."""
    return {"user": key[0], "vhost": key[1], "exchange": key[2], "write": p.write, "read": p.read}


def _is_kept_exchange(x, durable_only: bool, member: bool = False) -> bool:
    """A cluster member's journal keeps transient exchanges too (a restarted member goes on
    from its tables: RabbitMQ's nodes keep them while any node runs)."""
    return not x.is_default and not x.name.startswith("amq.") and (x.durable or not durable_only or member)


def _is_kept_binding(vhost, x, b, durable_only: bool, member: bool = False) -> bool:
    if x.is_default or (durable_only and not x.durable and not member):
        return False
    dest = b.destination
    if dest.kind == "queue":
        return _is_kept_queue(dest, durable_only, member) and vhost.queues.get(dest.name) is dest
    return not durable_only or dest.durable or member


def export(broker, durable_only: bool = True) -> dict:
    """The broker's definitions as RabbitMQ exports them: the default exchange and the
    predeclared amq.* exchanges are left out, and so are exclusive queues. With durable_only
    (what survives a restart) only durable exchanges and queues, and the bindings between
    two durable objects."""
    vhosts: list[dict] = []
    exchanges: list[dict] = []
    queues: list[dict] = []
    bindings: list[dict] = []
    policies: list[dict] = []
    parameters: list[dict] = []
    member = durable_only and broker.metadata.member  # (a cluster member's journal)
    for vhost in broker.vhosts.values():
        policies.extend(p.to_json() for p in vhost.policies.values())
        parameters.extend(runtime_parameters.listed(broker, vhost=vhost))
        vhosts.append(_vhost_json(vhost))
        for x in vhost.exchanges.values():
            if _is_kept_exchange(x, durable_only, member):
                exchanges.append(_exchange_json(vhost, x))
        for q in vhost.queues.values():
            if _is_kept_queue(q, durable_only, member):
                queues.append(_queue_json(vhost, q, member))
        for x in vhost.exchanges.values():
            if x.is_default or (durable_only and not x.durable and not member):
                continue
            for b in x.bindings.values():
                if _is_kept_binding(vhost, x, b, durable_only, member):
                    bindings.append(_binding_json(vhost, x, b))
    users = [_user_json(u) for u in broker.users.values()]
    permissions = [_permission_json(user, vhost, p) for (user, vhost), p in broker.permissions.items()]
    topic_permissions = [topic_permission_json(key, p) for key, p in broker.topic_permissions.items()]
    global_parameters = [{"name": name, "value": value}
                         for name, value in runtime_parameters.global_parameters(broker).items()]
    data = {"warren_version": __version__, "users": users, "vhosts": vhosts, "permissions": permissions,
            "topic_permissions": topic_permissions, "parameters": parameters, "global_parameters": global_parameters,
            "policies": policies,
            "queues": queues, "exchanges": exchanges, "bindings": bindings}
    if durable_only and broker.metadata.revision:  # (what the data dir keeps: see cluster_revision)
        data[CLUSTER] = [_cluster_json(broker)]
    return data


# A cluster member's definitions on disk also say which change of the cluster's metadata log
# they include (warren.cluster.metadata_log), in a collection of their own.
CLUSTER = "cluster"


def _cluster_json(broker) -> dict:
    return {"name": "revision", "revision": broker.metadata.revision}


def cluster_revision(data: dict) -> int:
    """The cluster log's revision saved definitions include (0: none)."""
    for item in data.get(CLUSTER) or ():
        if isinstance(item, dict) and item.get("name") == "revision" and isinstance(item.get("revision"), int):
            return item["revision"]
    return 0


def changes(broker, marks: dict) -> list:
    """The durable state now of each object in `marks` (what the model marked as changed, see
    MetadataStore.record), as journal records (op, kind, object): ("put", kind,
    its export) when it exists and survives a restart, else ("delete", kind, its identity).
    kind is the collection of the definitions format it belongs to ("queues", ...)."""
    out = []
    member = broker.metadata.member
    vhosts = broker.vhosts
    for (kind, key), binding in marks.items():
        if kind == "vhost":
            v = vhosts.get(key)
            out.append(("put", "vhosts", _vhost_json(v)) if v is not None else ("delete", "vhosts", {"name": key}))
        elif kind == "user":
            u = broker.users.get(key)
            out.append(("put", "users", _user_json(u)) if u is not None else ("delete", "users", {"name": key}))
        elif kind == "permission":
            p = broker.permissions.get(key)
            out.append(("put", "permissions", _permission_json(key[0], key[1], p)) if p is not None
                       else ("delete", "permissions", {"user": key[0], "vhost": key[1]}))
        elif kind == "topic_permission":
            tp = broker.topic_permissions.get(key)
            out.append(("put", "topic_permissions", topic_permission_json(key, tp)) if tp is not None
                       else ("delete", "topic_permissions", {"user": key[0], "vhost": key[1], "exchange": key[2]}))
        elif kind in ("policy", "operator_policy"):
            v = vhosts.get(key[0])
            table = None if v is None else (v.policies if kind == "policy" else v.operator_policies)
            p = None if table is None else table.get(key[1])
            if kind == "policy":
                out.append(("put", "policies", p.to_json()) if p is not None
                           else ("delete", "policies", {"vhost": key[0], "name": key[1]}))
            else:
                out.append(("put", "parameters", p.to_parameter()) if p is not None else
                           ("delete", "parameters", {"vhost": key[0], "component": "operator_policy",
                                                     "name": key[1]}))
        elif kind == "vhost_limits":
            v = vhosts.get(key)
            identity = {"vhost": key, "component": runtime_parameters.VHOST_LIMITS, "name": limits.PARAMETER_NAME}
            out.append(("put", "parameters", runtime_parameters.parameter_json(
                key, runtime_parameters.VHOST_LIMITS, limits.PARAMETER_NAME, limits.value_json(v.limits)))
                if v is not None and v.limits is not None else ("delete", "parameters", identity))
        elif kind == "global_parameter":
            values = runtime_parameters.global_parameters(broker)
            out.append(("put", "global_parameters", {"name": key, "value": values[key]}) if key in values
                       else ("delete", "global_parameters", {"name": key}))
        elif kind == CLUSTER:
            out.append(("put", CLUSTER, _cluster_json(broker)))
        elif kind == "exchange":
            v = vhosts.get(key[0])
            x = None if v is None else v.exchanges.get(key[1])
            out.append(("put", "exchanges", _exchange_json(v, x)) if x is not None and _is_kept_exchange(x, True, member)
                       else ("delete", "exchanges", {"vhost": key[0], "name": key[1]}))
        elif kind == "queue":
            v = vhosts.get(key[0])
            q = None if v is None else v.queues.get(key[1])
            out.append(("put", "queues", _queue_json(v, q, member)) if q is not None and _is_kept_queue(q, True, member)
                       else ("delete", "queues", {"vhost": key[0], "name": key[1]}))
        elif kind == "binding":
            # key: (vhost name, source name, Binding.key); the value is the Binding last marked
            v = vhosts.get(key[0])
            x = None if v is None else v.exchanges.get(key[1])
            b = None if x is None else x.bindings.get(key[2])
            if b is not None and _is_kept_binding(v, x, b, True, member):
                out.append(("put", "bindings", _binding_json(v, x, b)))
            else:
                b = binding
                out.append(("delete", "bindings", {
                    "source": key[1], "vhost": key[0], "destination": b.destination.name,
                    "destination_type": b.destination.kind, "routing_key": b.routing_key,
                    "arguments": _json_value(b.arguments)}))
        else:
            raise ValueError(f"unknown kind of definition {kind!r}")
    return out
