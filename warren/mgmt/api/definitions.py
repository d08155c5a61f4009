"""/api/definitions: export and import RabbitMQ's definitions JSON (users, vhosts,
permissions, policies, operator policies as "parameters", queues, exchanges, bindings), for
the whole broker or one vhost. Unlike the data dir's copy, the export includes transient
exchanges and queues (not exclusive ones), as RabbitMQ's does.

The export has the shape of RabbitMQ 3.10.8's (rabbit_mgmt_wm_definitions): only the fields
its rw_state/0 keeps, in the order its objects have them. So vhosts are listed by name only
(their limits are "vhost-limits" runtime parameters; Warren's capture exchange is added when
set) and queues have no "type" (a quorum queue or a stream has it in x-queue-type). `warrenctl export_definitions` gives rabbitmqctl's
shape, with vhost metadata and queue types (warren.cli.ctl).
"""

from typing import Any

from aiohttp import web

from ... import __version__
from ...broker import definitions, missing_exchange
from .. import body, changes
from ..access import ADMIN, access
from ..app import ApiError, bad_request, json_response, trusted
from ..resources import check_nesting, flush, parse_json
from .overview import RABBITMQ_VERSION

routes = web.RouteTableDef()


def _respond(request, data: dict):
    response = json_response(data)
    download = request.query.get("download")
    if download:
        response.headers["Content-Disposition"] = f"attachment; filename={download}"
    return response


# The fields RabbitMQ 3.10.8's export keeps of each kind, in the order its objects have them.
_FIELDS = {
    "users": ("name", "password_hash", "hashing_algorithm", "tags", "limits"),
    "vhosts": ("name",),
    "permissions": ("user", "vhost", "configure", "write", "read"),
    "topic_permissions": ("user", "vhost", "exchange", "write", "read"),
    "parameters": ("value", "vhost", "component", "name"),
    "global_parameters": ("name", "value"),
    "policies": ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
    "queues": ("name", "vhost", "durable", "auto_delete", "arguments"),
    "exchanges": ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"),
    "bindings": ("source", "vhost", "destination", "destination_type", "routing_key", "arguments"),
}
_VHOST_KINDS = ("parameters", "policies", "queues", "exchanges", "bindings")


def _shaped(kind: str, items: list, drop: str | None = None) -> list:
    return [{field: item[field] for field in _FIELDS[kind] if field in item and field != drop} for item in items]


def _vhost(item: dict) -> dict:
    """A vhost by name, and Warren's capture exchange when it is set (RabbitMQ's import
    ignores the key; Warren's reads it here as in "metadata")."""
    capture = item["metadata"].get(missing_exchange.SETTING)
    return {"name": item["name"]} if capture is None else {"name": item["name"], missing_exchange.SETTING: capture}


def export_all(broker) -> dict:
    data = definitions.export(broker, durable_only=False)
    out: dict[str, Any] = {"rabbit_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
                           "product_name": "Warren", "product_version": __version__}
    for kind in _FIELDS:
        out[kind] = [_vhost(v) for v in data[kind]] if kind == "vhosts" else _shaped(kind, data[kind])
    return out


def export_vhost(broker, name: str) -> dict:
    """One vhost's part, as RabbitMQ exports it: no users or vhosts, and no "vhost" keys on
    queues, exchanges and bindings."""
    data = definitions.export(broker, durable_only=False)
    out: dict[str, Any] = {"rabbit_version": RABBITMQ_VERSION}
    for kind in _VHOST_KINDS:
        items = [item for item in data[kind] if item.get("vhost") == name]
        out[kind] = _shaped(kind, items, drop="vhost" if kind in ("queues", "exchanges", "bindings") else None)
    return out


@routes.get("/api/definitions")
@access(ADMIN)
async def get_definitions(request):
    return _respond(request, export_all(request.app["broker"]))


@routes.get("/api/definitions/{vhost}")
@access(ADMIN)
async def get_vhost_definitions(request):
    broker = request.app["broker"]
    name = request.match_info["vhost"]
    if name not in broker.vhosts:
        raise bad_request("vhost_not_found")
    return _respond(request, export_vhost(broker, name))


async def _read_definitions(request) -> dict:
    """The posted definitions: a JSON body, or the "file" field of a form upload."""
    if request.content_type.startswith("multipart/") or request.content_type == "application/x-www-form-urlencoded":
        field = (await body.form(request)).get("file")
        value = field.file.read() if isinstance(field, web.FileField) else field or ""
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
    else:
        text = (await body.read(request)).decode(request.charset or "utf-8")
    data = parse_json(text, "failed_to_parse_json")
    if not isinstance(data, dict):
        raise bad_request("failed_to_parse_json")
    for kind, key in (("queues", "arguments"), ("exchanges", "arguments"), ("bindings", "arguments"),
                      ("policies", "definition")):
        items = data.get(kind)
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict):
                check_nesting(item.get(key))
    return data


async def _import(request, data: dict) -> None:
    broker = request.app["broker"]
    # As RabbitMQ, a vhost the import creates gives the importing user full permissions on it
    # (not the control socket: rabbitmqctl's import grants nothing).
    acting_user = None if trusted(request) else request["user"].name
    try:
        if broker.metadata.log is None:
            definitions.load(broker, data, acting_user=acting_user)
        else:  # through the cluster's log, a batch of definitions at a time
            for step in definitions.ClusterImport(broker, data, acting_user).steps():
                await changes.perform(request, step)
    except definitions.DefinitionsError as err:
        raise ApiError(400, "bad_request", str(err)) from None
    finally:
        flush(request)  # what was applied before an error stays, as in RabbitMQ


@routes.post("/api/definitions")
@access(ADMIN)
async def post_definitions(request):
    await _import(request, await _read_definitions(request))
    return web.Response(status=204)


@routes.post("/api/definitions/{vhost}")
@access(ADMIN)
async def post_vhost_definitions(request):
    broker = request.app["broker"]
    name = request.match_info["vhost"]
    if name not in broker.vhosts:
        raise bad_request("vhost_not_found")
    data = await _read_definitions(request)
    scoped = {}
    for kind in _VHOST_KINDS:
        items = data.get(kind) or []
        if isinstance(items, list):
            scoped[kind] = [{**item, "vhost": name} if isinstance(item, dict) else item for item in items]
        else:
            scoped[kind] = items
    await _import(request, scoped)
    return web.Response(status=204)
