"""/api/bindings: list bindings, bind an exchange to a queue or to an exchange, unbind.

A binding between a source and a destination is named by its "properties key" (see
warren.mgmt.resources.properties_key), as in RabbitMQ: the routing key, or "~" for an empty
one, and "~" plus a hash of the arguments when it has any.
"""

from aiohttp import web

from .. import changes
from ...broker import ops
from ...broker.errors import AMQPError
from ..access import IN_LOGIN_VHOSTS, VHOST, access
from ..app import bad_request, json_response, not_found
from ..resources import (actor, args_hash, check_vhost_access, direct_error,
                         exchange_name, flush, json_to_table, list_response, properties_key, quote_plus,
                         read_body, unpack_properties_key, vhost_for_change, vhost_or_404)
from ..shapes import binding_json, vhost_bindings

routes = web.RouteTableDef()

_PAIR = "/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{dest}"


@routes.get("/api/bindings")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_all(request):
    broker = request.app["broker"]
    items = [b for v in broker.vhosts.values() for b in vhost_bindings(v)]
    return list_response(request, items, default_sort=())


@routes.get("/api/bindings/{vhost}")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_vhost(request):
    vhost = vhost_or_404(request)
    return list_response(request, vhost_bindings(vhost), default_sort=())


def _names(request):
    source = exchange_name(request.match_info["source"])
    dtype = request.match_info["dtype"]
    dest = request.match_info["dest"]
    return source, ("queue" if dtype == "q" else "exchange"), (dest if dtype == "q" else exchange_name(dest))


def _objects(vhost, source_name, dest_kind, dest_name):
    source = vhost.exchanges.get(source_name)
    dest = (vhost.queues if dest_kind == "queue" else vhost.exchanges).get(dest_name)
    return source, dest


@routes.get(_PAIR)
@access(VHOST)
async def list_pair(request):
    vhost = vhost_or_404(request)
    source, dest = _objects(vhost, *_names(request))
    if source is None or dest is None:
        return json_response([])  # as RabbitMQ: an empty list, not a 404
    return json_response(vhost_bindings(vhost, source=source, destination=dest))


@routes.post(_PAIR)
@access(VHOST)
async def create_binding(request):
    vhost = vhost_for_change(request)
    source_name, dest_kind, dest_name = _names(request)
    body = await read_body(request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    arguments = json_to_table(body.get("arguments"))
    try:
        check_vhost_access(request, vhost)
        who = actor(request, vhost)
        await changes.perform(request, lambda: ops.bind.change(who, source_name, dest_kind, dest_name, routing_key,
                                                               arguments))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    target = "/api/bindings/" + "/".join(quote_plus(part) for part in (
        vhost.name, "e", request.match_info["source"], request.match_info["dtype"], request.match_info["dest"],
        properties_key(routing_key, arguments)))
    return web.Response(status=201, headers={"Location": relativise(request.rel_url.raw_path, target)})


def relativise(from_path: str, to_path: str) -> str:
    """RabbitMQ's Location of a new binding: the new binding's path relative to the request's
    (rabbit_web_dispatch_util:relativise; "q/k1" when they share all but the last part)."""
    source = [p for p in from_path.split("/") if p]
    target = [p for p in to_path.split("/") if p]
    while source and target:
        if len(source) == 1 and source[0] == target[0]:
            return "/".join(target)
        if source[0] != target[0]:
            break
        source, target = source[1:], target[1:]
    return "/".join([".."] * (len(source) - 1) + target)


def _find(request, vhost):
    """(source, destination, binding or None for the implicit default one) named by the path; 404 if none."""
    source_name, dest_kind, dest_name = _names(request)
    source, dest = _objects(vhost, source_name, dest_kind, dest_name)
    unpacked = unpack_properties_key(request.match_info["props"])
    if source is None or dest is None or unpacked is None:
        raise not_found()
    routing_key, hashed = unpacked
    if source.is_default:
        if hashed is None and routing_key == dest.name and dest_kind == "queue":
            return source, dest, None
        raise not_found()
    for b in source.bindings.values():
        if b.destination is dest and b.routing_key == routing_key:
            if (hashed is None and not b.arguments) or (
                    hashed is not None and b.arguments and args_hash(b.arguments) == hashed):
                return source, dest, b
    raise not_found()


@routes.get(_PAIR + "/{props}")
@access(VHOST)
async def get_binding(request):
    vhost = vhost_or_404(request)
    source, dest, b = _find(request, vhost)
    if b is None:
        return json_response(binding_json(vhost.name, "", dest.name, "queue", dest.name, {}))
    return json_response(binding_json(vhost.name, source.name, dest.name, dest.kind, b.routing_key, b.arguments))


@routes.delete(_PAIR + "/{props}")
@access(VHOST)
async def delete_binding(request):
    vhost = vhost_or_404(request)
    source, dest, b = _find(request, vhost)
    # b is None for the default exchange's implicit binding, which the operation refuses.
    routing_key, arguments = (b.routing_key, b.arguments) if b is not None else (dest.name, {})
    try:
        check_vhost_access(request, vhost)
        who = actor(request, vhost)
        await changes.perform(request, lambda: ops.unbind.change(who, source.name, dest.kind, dest.name, routing_key,
                                                                 arguments))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=204)
