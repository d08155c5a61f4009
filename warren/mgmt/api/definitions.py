"""/api/definitions: export and import RabbitMQ's definitions JSON (users, vhosts,
permissions, policies, operator policies as "parameters", queues, exchanges, bindings), for
the whole broker or one vhost. Unlike the data dir's copy, the export includes transient
exchanges and queues (not exclusive ones), as RabbitMQ's does."""

from typing import Any

from aiohttp import web

from ... import __version__
from ...broker import definitions
from .. import body
from ..access import ADMIN, access
from ..app import ApiError, bad_request, json_response, trusted
from ..resources import check_nesting, flush, parse_json

routes = web.RouteTableDef()

_VHOST_KINDS = ("parameters", "policies", "queues", "exchanges", "bindings")


def _respond(request, data: dict):
    response = json_response(data)
    download = request.query.get("download")
    if download:
        response.headers["Content-Disposition"] = f"attachment; filename={download}"
    return response


def export_all(broker) -> dict:
    data = definitions.export(broker, durable_only=False)
    return {"rabbit_version": __version__, "rabbitmq_version": __version__, "product_name": "Warren",
            "product_version": __version__, **data}


def export_vhost(broker, name: str) -> dict:
    """One vhost's part, as RabbitMQ exports it: no users or vhosts, and no "vhost" keys on
    queues, exchanges and bindings."""
    data = definitions.export(broker, durable_only=False)
    out: dict[str, Any] = {"rabbit_version": __version__}
    for kind in _VHOST_KINDS:
        items = [item for item in data.get(kind, []) if item.get("vhost") == name]
        if kind in ("queues", "exchanges", "bindings"):
            items = [{k: v for k, v in item.items() if k != "vhost"} for item in items]
        out[kind] = items
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


def _import(request, data: dict) -> None:
    broker = request.app["broker"]
    # As RabbitMQ, a vhost the import creates gives the importing user full permissions on it
    # (not the control socket: rabbitmqctl's import grants nothing).
    acting_user = None if trusted(request) else request["user"].name
    try:
        definitions.load(broker, data, acting_user=acting_user)
    except definitions.DefinitionsError as err:
        raise ApiError(400, "bad_request", str(err)) from None
    finally:
        flush(request)  # what was applied before an error stays, as in RabbitMQ


@routes.post("/api/definitions")
@access(ADMIN)
async def post_definitions(request):
    _import(request, await _read_definitions(request))
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
    _import(request, scoped)
    return web.Response(status=204)
