"""Import of RabbitMQ's definitions JSON (the format `load_definitions` reads)."""

from .auth import SHA256, User
from .errors import AMQPError


class DefinitionsError(ValueError):
    pass


def _tags(value) -> list:
    if isinstance(value, list):
        return [str(t) for t in value]
    return [t.strip() for t in str(value or "").split(",") if t.strip()]


def load(broker, data: dict) -> None:
    """Apply users, vhosts, permissions, exchanges, queues and bindings to the broker."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    try:
        for v in data.get("vhosts", []):
            broker.add_vhost(v["name"])
        for u in data.get("users", []):
            algorithm = u.get("hashing_algorithm", SHA256)
            if "password_hash" in u:
                user = User(u["name"], u["password_hash"], _tags(u.get("tags")), algorithm)
            else:
                user = User.with_password(u["name"], u.get("password", ""), _tags(u.get("tags")))
            broker.add_user(user)
        for p in data.get("permissions", []):
            if p["vhost"] not in broker.vhosts:
                raise DefinitionsError(f"permission for unknown vhost '{p['vhost']}'")
            broker.set_permissions(p["user"], p["vhost"], p.get("configure", ""), p.get("write", ""),
                                   p.get("read", ""))
        for x in data.get("exchanges", []):
            vhost = _vhost(broker, x)
            vhost.declare_exchange(x["name"], x.get("type", "direct"), x.get("durable", True),
                                   x.get("auto_delete", False), x.get("internal", False),
                                   x.get("arguments") or {})
        for q in data.get("queues", []):
            vhost = _vhost(broker, q)
            vhost.declare_queue(q["name"], q.get("durable", True), None, q.get("auto_delete", False),
                                q.get("arguments") or {})
        for b in data.get("bindings", []):
            vhost = _vhost(broker, b)
            source = vhost.exchange(b["source"])
            if b.get("destination_type", "queue") == "queue":
                dest = vhost.queue(b["destination"])
            else:
                dest = vhost.exchange(b["destination"])
            vhost.bind(source, dest, b.get("routing_key", ""), b.get("arguments") or {})
    except KeyError as err:
        raise DefinitionsError(f"definition is missing the field {err}") from None
    except AMQPError as err:
        raise DefinitionsError(err.text) from None


def _vhost(broker, item):
    name = item.get("vhost", "/")
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise DefinitionsError(f"unknown vhost '{name}'")
    return vhost
