"""What the management API's resource modules share for requests and responses: path and
body parsing, RabbitMQ's binding "properties keys" (how paths name a binding), its list
options (sort, columns, pagination), its ways of reporting AMQP errors, and JSON <-> AMQP
field tables. The objects' JSON shapes are warren.mgmt.shapes'."""

import base64
import datetime
import decimal
import html
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_plus

from ..amqp import codec
from ..amqp.constants import REPLY_NAMES
from ..amqp.erlang import erl_list
from ..broker.errors import AMQPError
from ..broker.ops import Actor
from . import access, body
from .app import ApiError, bad_request, json_response, not_found, trusted
from ..broker.erlhash import Atom, phash2

ACCESS_REFUSED = "Access refused."


# ----------------------------------------------------------------------- basics
def flush(request) -> None:
    """Durable state changed: it is on disk before the answer goes out."""
    request.app["broker"].durability.flush()


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
    """Changing things in a vhost needs permissions there, as over AMQP (401 as RabbitMQ);
    warrenctl on the control socket has them everywhere."""
    if not trusted(request) and (user_name(request), vhost.name) not in request.app["broker"].permissions:
        raise ApiError(401, "not_authorised", ACCESS_REFUSED)


def actor(request, vhost) -> Actor:
    """The API's user in a vhost, for the operations layer (never owns exclusive queues)."""
    return Actor(request.app["broker"], request["user"], vhost, trusted=trusted(request))


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


# How deeply arguments (queue, exchange, binding, policy, headers) may nest: as deeply as an
# AMQP field table may (RabbitMQ takes any depth over HTTP; Warren refuses what no client
# could be sent or send). make_app lets the interpreter recurse that deep (codec.allow_nesting).
TOO_DEEP = "JSON nested too deeply"
ARGUMENTS_TOO_DEEP = f"arguments nested deeper than {codec.MAX_NESTING} levels"


def check_nesting(value) -> None:
    """400 if arguments (a JSON value) nest deeper than codec.MAX_NESTING."""
    if nesting(value) > codec.MAX_NESTING:
        raise bad_request(ARGUMENTS_TOO_DEEP)


def parse_json(text: str, malformed: str = "not_json"):
    """Every JSON body of the API is parsed here: malformed JSON is a 400 with RabbitMQ's
    reason (`malformed`), and so is JSON nested too deeply for the parser (RabbitMQ parses
    any depth; Python's parser recurses, so a deep body is refused rather than crashing the
    request with a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise bad_request(TOO_DEEP) from None
    except ValueError:
        raise bad_request(malformed) from None


def nesting(value) -> int:
    """How deeply a JSON value nests objects and arrays (a scalar is 0), without recursing."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


async def read_body(request) -> dict:
    """The request body as a JSON object; 400 not_json as RabbitMQ otherwise."""
    text = (await body.read(request)).decode(request.charset or "utf-8")
    if not text.strip():
        return {}
    data = parse_json(text)
    if not isinstance(data, dict):
        raise bad_request("not_json")
    return data


def require(body: dict, *keys) -> None:
    """400 [{key_missing,k},...] for missing mandatory keys, in the order given."""
    missing = [k for k in keys if k not in body]
    if missing:
        raise bad_request(erl_list([f"{{key_missing,{k}}}" for k in missing]))


async def read_value(request):
    """The "value" of a PUT body (runtime parameters, limits), checked for nesting."""
    body = await read_body(request)
    require(body, "value")
    check_nesting(body["value"])
    return body["value"]


def html_escaped(text: str) -> str:
    """A validation error as RabbitMQ's parameter and policy resources give it."""
    return html.escape(text, quote=False)


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
    """A JSON object as a field table, keys in order (as RabbitMQ's decoded JSON maps); 400
    if it nests deeper than codec.MAX_NESTING."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise bad_request("arguments must be a JSON object")
    check_nesting(obj)
    try:
        return {k: json_to_value(obj[k]) for k in sorted(obj)}
    except RecursionError:  # within codec.MAX_NESTING, but deeper than this stack allows
        raise bad_request(ARGUMENTS_TOO_DEEP) from None


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


def objects_response(request, objects: list, shape: Callable[[list], list],
                     fields: dict[str, Callable[[Any], str]] | None = None):
    """list_response for model objects with `.name` and `.vhost.name`, made into JSON by
    `shape(objects)`. A page sorted by name or vhost (the UI's list, by default), or by one of
    the string `fields` given, is chosen from stubs of those fields, and only its objects are
    shaped: 10,000 queues' JSON is most of a second of Python, a page of 100 a few ms."""
    fields = {"name": lambda o: o.name, "vhost": lambda o: o.vhost.name, **(fields or {})}
    sort = request.query.get("sort")
    if "page" not in request.query or (sort and sort not in fields):
        return list_response(request, shape(objects))
    stubs = [{field: get(o) for field, get in fields.items()} | {"object": o} for o in objects]
    # (the fields are strings: compared as they are, they sort as _sort_value sorts them)
    by = operator.itemgetter(*([sort] if sort else ["vhost", "name"]))
    return list_response(request, stubs, shape=lambda page: shape([stub["object"] for stub in page]),
                         sort_key=by)


def list_response(request, items: list, default_sort=("vhost", "name"), shape=None, sort_key=None):
    """A list as RabbitMQ answers it: only the items the user may see (the route's
    access.ListFilter), sorted (?sort=a.b&sort_reverse=true), paged
    (?page=&page_size=, filtered by ?name=&use_regex=) and pruned to ?columns=a,b.c.
    `shape`, if given, makes the page's items into their JSON, and `sort_key` stands for the
    sort's own (objects_response)."""
    items = access.visible(request, items)
    q = request.query
    sort = q.get("sort")
    keys = [sort.split(".")] if sort else [[k] for k in default_sort]
    items = sorted(items, key=sort_key or (lambda i: tuple(_sort_value(_get_path(i, k)) for k in keys)),
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
    if shape is not None:
        chunk = shape(chunk)
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
