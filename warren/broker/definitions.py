"""RabbitMQ's definitions JSON: import (the format `load_definitions` reads) and export (what
its management API's GET /api/definitions writes), also the format of Warren's data dir."""

import datetime
import decimal
import gc

from .. import __version__
from .auth import MD5, SHA256, SHA512, User
from .errors import AMQPError
from .exchanges import TYPES
from .policy import Policy, PolicyError, set_policy


class DefinitionsError(ValueError):
    pass


def _tags(value) -> list:
    if isinstance(value, list):
        return [str(t) for t in value]
    return [t.strip() for t in str(value or "").split(",") if t.strip()]


def load(broker, data: dict, on_error=None) -> dict:
    """Apply users, vhosts, permissions, policies, operator policies (RabbitMQ exports them as
    "parameters" of the component "operator_policy"; other parameters are ignored), exchanges,
    queues and bindings to the broker.

    Without on_error the first bad definition raises DefinitionsError. With it, each bad
    definition is reported as on_error(kind, item, message) and skipped (recovery from the
    data dir: one bad entry must not keep the rest from coming back). Returns how many of
    each kind were applied."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    # Everything a bulk load creates lives on: the cyclic collector would only walk the
    # growing model again and again (a full collection per 25% of growth, each one slower
    # as the heap outgrows the caches), which made 100,000 bindings ~18x the time of 10,000.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(broker, data, on_error)
    finally:
        if collecting:
            gc.enable()


def _load(broker, data: dict, on_error) -> dict:
    counts = {}
    for kind, apply in (("vhosts", _load_vhost), ("users", _load_user), ("permissions", _load_permission),
                        ("policies", _load_policy), ("parameters", _load_parameter),
                        ("global_parameters", _load_global_parameter),
                        ("exchanges", _load_exchange), ("queues", _load_queue), ("bindings", _load_binding)):
        items = data.get(kind) or []
        if not isinstance(items, list):
            _fail(on_error, kind, items, f"'{kind}' must be a list")
            items = []
        counts[kind] = 0
        for item in items:
            try:
                if not isinstance(item, dict):
                    raise DefinitionsError(f"each of '{kind}' must be a JSON object")
                apply(broker, item)
                counts[kind] += 1
            except KeyError as err:
                _fail(on_error, kind, item, f"definition is missing the field {err}")
            except AMQPError as err:
                _fail(on_error, kind, item, err.text)
            except PolicyError as err:
                _fail(on_error, kind, item, " ".join(err.errors))
            except (DefinitionsError, TypeError, ValueError) as err:
                _fail(on_error, kind, item, str(err))
    return counts


def _fail(on_error, kind, item, message):
    if on_error is None:
        raise DefinitionsError(message) from None
    on_error(kind, item, message)


def _load_vhost(broker, v):
    vhost = broker.add_vhost(v["name"])
    metadata = v.get("metadata")
    if isinstance(metadata, dict):
        description, tags = str(metadata.get("description") or ""), _tags(metadata.get("tags"))
        if (description, tags) != (vhost.description, vhost.tags):
            vhost.description, vhost.tags = description, tags
            broker.mark_definitions_changed("vhost", vhost.name)


def _load_user(broker, u):
    algorithm = u.get("hashing_algorithm", SHA256)
    if algorithm not in (SHA256, SHA512, MD5):
        raise DefinitionsError(f"unsupported hashing algorithm '{algorithm}' for user '{u['name']}'")
    if "password_hash" in u:
        user = User(u["name"], u["password_hash"], _tags(u.get("tags")), algorithm)
    else:
        user = User.with_password(u["name"], u.get("password", ""), _tags(u.get("tags")))
    broker.add_user(user)


def _load_permission(broker, p):
    if p["vhost"] not in broker.vhosts:
        raise DefinitionsError(f"permission for unknown vhost '{p['vhost']}'")
    broker.set_permissions(p["user"], p["vhost"], p.get("configure", ""), p.get("write", ""), p.get("read", ""))


def _load_policy(broker, p, operator=False):
    vhost = _vhost(broker, p)
    set_policy(vhost, Policy.validated(vhost.name, p["name"], p["pattern"], p["definition"],
                                       p.get("priority", 0), p.get("apply-to", "all"), operator), operator)


def _load_parameter(broker, p):
    """Runtime parameters: Warren knows operator policies only (federation upstreams, shovels
    and other plugins' parameters are skipped)."""
    if p.get("component") != "operator_policy":
        return
    value = p.get("value")
    if not isinstance(value, dict):
        raise DefinitionsError(f"operator policy '{p.get('name')}' has no value object")
    _load_policy(broker, {**value, "vhost": p.get("vhost", "/"), "name": p["name"]}, operator=True)


def _load_global_parameter(broker, p):
    """Global runtime parameters: Warren knows cluster_name only (RabbitMQ's internal_cluster_id
    and others are skipped)."""
    if p["name"] != "cluster_name":
        return
    if not isinstance(p.get("value"), str):
        raise DefinitionsError("global parameter 'cluster_name' must be a string")
    broker.set_cluster_name(p["value"])


def _load_exchange(broker, x):
    # Like RabbitMQ's import, an exchange or queue that exists already is kept as it is.
    vhost = _vhost(broker, x)
    if x["name"] in vhost.exchanges:
        return
    if x.get("type", "direct") not in TYPES:
        raise DefinitionsError(f"unknown exchange type '{x.get('type')}' for exchange '{x['name']}'")
    vhost.declare_exchange(x["name"], x.get("type", "direct"), x.get("durable", True),
                           x.get("auto_delete", False), x.get("internal", False), x.get("arguments") or {})


def _load_queue(broker, q):
    vhost = _vhost(broker, q)
    if q["name"] in vhost.queues:
        return
    vhost.declare_queue(q["name"], q.get("durable", True), None, q.get("auto_delete", False),
                        q.get("arguments") or {})


def _load_binding(broker, b):
    vhost = _vhost(broker, b)
    source = vhost.exchange(b["source"])
    if b.get("destination_type", "queue") == "queue":
        dest = vhost.queue(b["destination"])
    else:
        dest = vhost.exchange(b["destination"])
    vhost.bind(source, dest, b.get("routing_key", ""), b.get("arguments") or {})


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


def _is_kept_queue(q, durable_only: bool) -> bool:
    return not q.exclusive and (q.durable or not durable_only)


def _vhost_json(vhost) -> dict:
    return {"name": vhost.name, "limits": [],
            "metadata": {"description": getattr(vhost, "description", ""), "tags": list(getattr(vhost, "tags", []))}}


def _exchange_json(vhost, x) -> dict:
    return {"name": x.name, "vhost": vhost.name, "type": x.type_name, "durable": x.durable,
            "auto_delete": x.auto_delete, "internal": x.internal, "arguments": _json_value(x.arguments)}


def _queue_json(vhost, q) -> dict:
    return {"name": q.name, "vhost": vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
            "type": q.queue_type, "arguments": _json_value(q.arguments)}


def _binding_json(vhost, x, b) -> dict:
    return {"source": x.name, "vhost": vhost.name, "destination": b.destination.name,
            "destination_type": b.destination.kind, "routing_key": b.routing_key,
            "arguments": _json_value(b.arguments)}


def _user_json(u) -> dict:
    return {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.algorithm,
            "tags": list(u.tags), "limits": {}}


def _permission_json(user, vhost, p) -> dict:
    return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}


def _is_kept_exchange(x, durable_only: bool) -> bool:
    return not x.is_default and not x.name.startswith("amq.") and (x.durable or not durable_only)


def _is_kept_binding(vhost, x, b, durable_only: bool) -> bool:
    if x.is_default or (durable_only and not x.durable):
        return False
    dest = b.destination
    if dest.kind == "queue":
        return _is_kept_queue(dest, durable_only) and vhost.queues.get(dest.name) is dest
    return not durable_only or dest.durable


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
    for vhost in broker.vhosts.values():
        policies.extend(p.to_json() for p in vhost.policies.values())
        parameters.extend(p.to_parameter() for p in vhost.operator_policies.values())
        vhosts.append(_vhost_json(vhost))
        for x in vhost.exchanges.values():
            if _is_kept_exchange(x, durable_only):
                exchanges.append(_exchange_json(vhost, x))
        for q in vhost.queues.values():
            if _is_kept_queue(q, durable_only):
                queues.append(_queue_json(vhost, q))
        for x in vhost.exchanges.values():
            if x.is_default or (durable_only and not x.durable):
                continue
            for b in x.bindings.values():
                if _is_kept_binding(vhost, x, b, durable_only):
                    bindings.append(_binding_json(vhost, x, b))
    users = [_user_json(u) for u in broker.users.values()]
    permissions = [_permission_json(user, vhost, p) for (user, vhost), p in broker.permissions.items()]
    global_parameters = ([{"name": "cluster_name", "value": broker.cluster_name}]
                         if broker.cluster_name_set else [])
    return {"warren_version": __version__, "users": users, "vhosts": vhosts, "permissions": permissions,
            "topic_permissions": [], "parameters": parameters, "global_parameters": global_parameters,
            "policies": policies,
            "queues": queues, "exchanges": exchanges, "bindings": bindings}


def changes(broker, marks: dict) -> list:
    """The durable state now of each object in `marks` (what the model marked as changed, see
    Broker.mark_definitions_changed), as journal records (op, kind, object): ("put", kind,
    its export) when it exists and survives a restart, else ("delete", kind, its identity).
    kind is the collection of the definitions format it belongs to ("queues", ...)."""
    out = []
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
        elif kind == "exchange":
            v = vhosts.get(key[0])
            x = None if v is None else v.exchanges.get(key[1])
            out.append(("put", "exchanges", _exchange_json(v, x)) if x is not None and _is_kept_exchange(x, True)
                       else ("delete", "exchanges", {"vhost": key[0], "name": key[1]}))
        elif kind == "queue":
            v = vhosts.get(key[0])
            q = None if v is None else v.queues.get(key[1])
            out.append(("put", "queues", _queue_json(v, q)) if q is not None and _is_kept_queue(q, True)
                       else ("delete", "queues", {"vhost": key[0], "name": key[1]}))
        elif kind == "binding":
            # key: (vhost name, source name, Binding.key); the value is the Binding last marked
            v = vhosts.get(key[0])
            x = None if v is None else v.exchanges.get(key[1])
            b = None if x is None else x.bindings.get(key[2])
            if b is not None and _is_kept_binding(v, x, b, True):
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
