"""What the management API's resource modules share: RabbitMQ's JSON shapes for exchanges,
queues and bindings, its binding "properties keys", its list options (sort, columns,
pagination), its ways of reporting AMQP errors, and JSON <-> AMQP field tables."""

import base64
import datetime
import decimal
import json
import math
import re
from urllib.parse import unquote_plus

from ..amqp import codec
from ..amqp.constants import REPLY_NAMES
from ..broker.errors import AMQPError
from .app import ApiError, bad_request, json_response, not_found
from .erlhash import Atom, phash2

from . import stats as _stats
from .stats import exchange_stats, queue_stats, unacked_bytes_by_queue

ACCESS_REFUSED = "Access refused."


# ----------------------------------------------------------------------- basics
def node_name(broker) -> str:
    return _stats.node_name(broker)


def flush(request) -> None:
    """Durable state changed: it is on disk before the answer goes out."""
    request.app["broker"].flush_definitions()


def vhost_or_404(request, key: str = "vhost"):
    """The vhost named in the path, for reads (RabbitMQ: 404 Object Not Found)."""
    vhost = request.app["broker"].vhosts.get(request.match_info[key])
    if vhost is None:
        raise not_found()
    return vhost


def vhost_for_change(request, key: str = "vhost"):
    """The vhost named in the path, for a PUT/POST (RabbitMQ: 404 vhost_not_found)."""
    vhost = request.app["broker"].vhosts.get(request.match_info[key])
    if vhost is None:
        raise ApiError(404, "not_found", "vhost_not_found")
    return vhost


def exchange_name(path_name: str) -> str:
    """The default exchange is "amq.default" in paths."""
    return "" if path_name == "amq.default" else path_name


def user_name(request) -> str:
    return request["user"].name


def check_vhost_access(request, vhost) -> None:
    """Changing things in a vhost needs permissions there, as over AMQP (401 as RabbitMQ)."""
    if (user_name(request), vhost.name) not in request.app["broker"].permissions:
        raise ApiError(401, "not_authorised", ACCESS_REFUSED)


def check_permission(request, vhost, what: str, kind: str, name: str) -> None:
    """configure/write/read on a resource, raising the AMQP 403 the channel would."""
    request.app["broker"].check(user_name(request), vhost.name, what, kind, name)


def direct_error(err: AMQPError) -> ApiError:
    """An AMQP error of a declare/delete/bind/purge, as RabbitMQ's API reports those: 404 for
    a missing object, 401 "Access refused." for a refused one, else 400 with the text."""
    if err.code == 404:
        return ApiError(404, "not_found", err.text)
    if err.code in (403, 530):
        return ApiError(401, "not_authorised", ACCESS_REFUSED)
    return bad_request(err.text)


def channel_error_text(err: AMQPError) -> str:
    """"406 PRECONDITION_FAILED - text", as RabbitMQ's API reports a channel error."""
    return f"{err.code} {REPLY_NAMES.get(err.code, 'ERROR')} - {err.text}"


async def read_body(request) -> dict:
    """The request body as a JSON object; 400 not_json as RabbitMQ otherwise."""
    text = await request.text()
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        raise bad_request("not_json") from None
    if not isinstance(data, dict):
        raise bad_request("not_json")
    return data


def erl_list(items: list) -> str:
    """An Erlang list of terms as ~p prints it (one line if it fits in 80 columns)."""
    one_line = "[" + ",".join(items) + "]"
    if len(one_line) < 80:
        return one_line
    return "[" + ",\n ".join(items) + "]"


def require(body: dict, *keys) -> None:
    """400 [{key_missing,k},...] for missing mandatory keys, in the order given."""
    missing = [k for k in keys if k not in body]
    if missing:
        raise bad_request(erl_list([f"{{key_missing,{k}}}" for k in missing]))


def parse_bool(body: dict, key: str, default=False) -> bool:
    value = body.get(key, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false" or value is None:
        return False
    raise ApiError(400, "bad_request", ["not_boolean", value])


def parse_int(value, what=None) -> int:
    """RabbitMQ's parse_int: an integer, a float (truncated) or a string of digits."""
    if isinstance(value, bool):
        raise ApiError(400, "bad_request", ["not_integer", value])
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ApiError(400, "bad_request", ["not_integer", value])


def query_bool(request, key: str) -> bool:
    return request.query.get(key, "").lower() == "true"


# ----------------------------------------------------------- field tables <-> JSON
def json_to_value(value):
    """A JSON value as RabbitMQ types it in a field table: integers long, other numbers
    double, strings longstr; null is refused."""
    if value is None:
        raise bad_request("null_not_allowed")
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int):
        return codec._long(value) if -(1 << 63) <= value < (1 << 63) else value
    if isinstance(value, float):
        return codec._double(value)
    if isinstance(value, dict):
        return json_to_table(value)
    if isinstance(value, list):
        return [json_to_value(v) for v in value]
    raise bad_request(f"unhandled_type {value!r}")


def json_to_table(obj) -> dict:
    """A JSON object as a field table, keys in order (as RabbitMQ's decoded JSON maps)."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise bad_request("arguments must be a JSON object")
    return {k: json_to_value(obj[k]) for k in sorted(obj)}


def _binary_json(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "Invalid UTF-8, base64 is: " + base64.b64encode(raw).decode()


def value_json(value):
    """A field-table value as RabbitMQ's API shows it."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray)):
        return _binary_json(bytes(value))
    if isinstance(value, dict):
        return table_json(value)
    if isinstance(value, (list, tuple)):
        return [value_json(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def table_json(table) -> dict:
    return {str(k): value_json(v) for k, v in (table or {}).items()}


def _erl_type(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if type(value) is int:  # from JSON (definitions): RabbitMQ reads those as long
        return "long"
    return codec.table_type_name(value)


def _erl_value(value):
    if isinstance(value, dict):
        return erl_table(value)
    if isinstance(value, list):
        return [(Atom(_erl_type(v)), _erl_value(v)) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * 10 ** max(0, exponent)
        return (max(0, -exponent), -unscaled if sign else unscaled)
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return value
    return str(value)


def erl_table(args: dict) -> list:
    """A field table as RabbitMQ holds it: [{Key, Type, Value}]."""
    return [(k, Atom(_erl_type(v)), _erl_value(v)) for k, v in args.items()]


# --------------------------------------------------------------- binding keys
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-~_")


def quote_plus(text: str) -> str:
    """mochiweb_util:quote_plus: space as +, unreserved bytes kept, the rest %XX."""
    out = []
    for b in text.encode():
        if b == 0x20:
            out.append("+")
        elif b in _SAFE:
            out.append(chr(b))
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


def _quote_binding(text: str) -> str:
    return quote_plus(text).replace("~", "%7E")


def args_hash(args: dict) -> str:
    """RabbitMQ's hash of a binding's arguments: base64url of phash2(Args) as 32 bits."""
    digest = phash2(erl_table(args)).to_bytes(4, "big")
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def properties_key(routing_key: str, args: dict) -> str:
    """How RabbitMQ names a binding between a source and a destination in paths."""
    if not args:
        return "~" if routing_key == "" else _quote_binding(routing_key)
    return _quote_binding(routing_key) + "~" + _quote_binding(args_hash(args))


def unpack_properties_key(props: str):
    """(routing_key, args hash or None) from a properties key (None if malformed)."""
    parts = []
    rest = props
    while rest:  # RabbitMQ's tokeniser: "k~" is ["k"], "~" is [""], "~~" is ["", ""]
        head, sep, rest = rest.partition("~")
        parts.append(head)
    if len(parts) == 1:
        return unquote_plus(parts[0]), None
    if len(parts) == 2:
        return unquote_plus(parts[0]), unquote_plus(parts[1])
    return None


def binding_json(vhost_name: str, source: str, destination: str, dest_type: str, routing_key: str,
                 arguments: dict) -> dict:
    return {"source": source, "vhost": vhost_name, "destination": destination, "destination_type": dest_type,
            "routing_key": routing_key, "arguments": table_json(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def binding_of(b) -> dict:
    return binding_json(b.source.vhost.name, b.source.name, b.destination.name, b.destination.kind,
                        b.routing_key, b.arguments)


def default_binding(queue) -> dict:
    """The implicit binding of every queue to the default exchange (RabbitMQ lists it)."""
    return binding_json(queue.vhost.name, "", queue.name, "queue", queue.name, {})


def _binding_sort_key(b: dict):
    return (b["vhost"], b["source"], b["destination"], b["destination_type"], b["routing_key"],
            b["properties_key"])


def vhost_bindings(vhost, source=None, destination=None) -> list:
    """The bindings of a vhost (optionally from one source / to one destination), the
    default exchange's implicit ones included, in RabbitMQ's order."""
    out = []
    if source is None or source.is_default:
        for q in sorted(vhost.queues.values(), key=lambda q: q.name):
            if destination is None or destination is q:
                out.append(default_binding(q))
    explicit = []
    for x in vhost.exchanges.values():
        if x.is_default or (source is not None and x is not source):
            continue
        for b in x.bindings.values():
            if destination is None or b.destination is destination:
                explicit.append(binding_of(b))
    explicit.sort(key=_binding_sort_key)
    return out + explicit


# -------------------------------------------------------------- object shapes
def exchange_json(x) -> dict:
    d = {"name": x.name, "vhost": x.vhost.name, "type": x.type_name, "durable": x.durable,
         "auto_delete": x.auto_delete, "internal": x.internal, "arguments": table_json(x.arguments)}
    if x.policy is not None:
        d["policy"] = x.policy.name
    d.update(exchange_stats(x))
    return d


def _effective_definition(q) -> dict:
    merged = dict(q.policy.definition) if q.policy is not None else {}
    op = getattr(q, "operator_policy", None)
    if op is not None:
        for key, value in op.definition.items():
            # RabbitMQ keeps the stricter (smaller) of two numeric limits.
            if key in merged and isinstance(value, (int, float)) and isinstance(merged[key], (int, float)):
                merged[key] = min(merged[key], value)
            else:
                merged[key] = value
    return merged


def _connections_module():
    """warren.mgmt.api.connections (connection names and consumer JSON), if it is there."""
    try:
        from .api import connections
    except ImportError:  # pragma: no cover
        return None
    return connections


def _conn_details(conn) -> dict:
    peer = getattr(conn, "peer", ("", 0))
    connections = _connections_module()
    name = connections.connection_name(conn) if connections is not None else conn.name
    return {"name": name, "peer_host": peer[0], "peer_port": peer[1]}


def consumer_json(c) -> dict:
    connections = _connections_module()
    if connections is not None:
        return connections.consumer_info(c)
    ch = c.channel
    conn = ch.conn
    peer = getattr(conn, "peer", ("", 0))
    return {"consumer_tag": c.tag, "exclusive": c.exclusive, "ack_required": not c.no_ack,
            "prefetch_count": c.prefetch, "active": True, "activity_status": "up",
            "arguments": table_json(c.arguments), "queue": {"name": c.queue.name, "vhost": c.queue.vhost.name},
            "channel_details": {"name": f"{conn.name} ({ch.id})", "number": ch.id, "connection_name": conn.name,
                                "peer_host": peer[0], "peer_port": peer[1],
                                "user": conn.user.name if conn.user is not None else "",
                                "node": node_name(conn.broker)}}


def queue_json(q, unacked_bytes=None, details: bool = False) -> dict:
    broker = q.vhost.broker
    op = getattr(q, "operator_policy", None)
    d = {"name": q.name, "vhost": q.vhost.name, "durable": q.durable, "auto_delete": q.auto_delete,
         "exclusive": q.exclusive, "arguments": table_json(q.arguments), "type": "classic",
         "node": node_name(broker) if broker is not None else "",
         "policy": q.policy.name if q.policy is not None else None,
         "operator_policy": op.name if op is not None else None,
         "effective_policy_definition": _effective_definition(q),
         "single_active_consumer_tag": None}
    ready, unacked = len(q.store), q.unacked_count
    d.update({"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
              "message_bytes": q.store.ready_bytes, "message_bytes_ready": q.store.ready_bytes,
              "consumers": q.consumer_count, "state": "running",
              "exclusive_consumer_tag": next((c.tag for c in q.consumers if c.exclusive), None)})
    d.update(queue_stats(q, unacked_bytes))
    if q.owner is not None:
        d["owner_pid_details"] = _conn_details(q.owner)
    if details:
        d["consumer_details"] = [consumer_json(c) for c in q.consumers]
        d["incoming"] = []
        d["deliveries"] = []
    return d


def queues_json(broker, queues) -> list:
    unacked = unacked_bytes_by_queue(broker)
    return [queue_json(q, unacked.get(q, 0)) for q in queues]


# -------------------------------------------------------------------- lists
_MISSING = object()


def _get_path(item, path, default=None):
    for part in path:
        if not isinstance(item, dict) or part not in item:
            return default
        item = item[part]
    return item


def _prune(item: dict, columns: list) -> dict:
    """Only the given (dotted) columns of an item, nested as they were."""
    out: dict = {}
    for path in columns:
        value = _get_path(item, path, _MISSING)
        if value is _MISSING:
            continue
        target = out
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    return out


def item_response(request, item: dict):
    """One object, pruned to ?columns= like a list item."""
    columns = [c.split(".") for c in request.query.get("columns", "").split(",") if c]
    return json_response(_prune(item, columns) if columns else item)


def _sort_value(value):
    # None sorts first, numbers before strings, like RabbitMQ's term order roughly does.
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    return (2, str(value))


def list_response(request, items: list, default_sort=("vhost", "name")):
    """A list as RabbitMQ answers it: sorted (?sort=a.b&sort_reverse=true), paged
    (?page=&page_size=, filtered by ?name=&use_regex=) and pruned to ?columns=a,b.c."""
    q = request.query
    sort = q.get("sort")
    keys = [sort.split(".")] if sort else [[k] for k in default_sort]
    items = sorted(items, key=lambda i: tuple(_sort_value(_get_path(i, k)) for k in keys),
                   reverse=query_bool(request, "sort_reverse"))
    columns = [c.split(".") for c in q.get("columns", "").split(",") if c]
    if "page" not in q:  # as RabbitMQ, ?name= filters pages only
        return json_response([_prune(i, columns) for i in items] if columns else items)
    total = len(items)
    items = _filter(request, items)
    page = parse_int(q.get("page", "1"))
    page_size = parse_int(q.get("page_size", "100"))
    if page < 1 or page_size < 1 or page_size > 500:
        raise bad_request("page and page_size must be positive, page_size at most 500")
    page_count = max(1, math.ceil(len(items) / page_size))
    if page > page_count:
        raise bad_request(f"page out of range: there are {page_count} pages")
    chunk = items[(page - 1) * page_size:page * page_size]
    if columns:
        chunk = [_prune(i, columns) for i in chunk]
    return json_response({"filtered_count": len(items), "item_count": len(chunk), "items": chunk, "page": page,
                          "page_count": page_count, "page_size": page_size, "total_count": total})


def _filter(request, items: list) -> list:
    name = request.query.get("name", "")
    if not name:
        return items
    if query_bool(request, "use_regex"):
        try:
            regex = re.compile(name, re.IGNORECASE)
        except re.error as err:
            raise bad_request(f"invalid regular expression: {err}") from None
        return [i for i in items if regex.search(str(i.get("name", "")))]
    name = name.lower()
    return [i for i in items if name in str(i.get("name", "")).lower()]
