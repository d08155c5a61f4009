"""/api/parameters[/component[/vhost[/name]]] and /api/global-parameters[/name]: RabbitMQ's
runtime parameters (warren.broker.parameters: the core's components, and the shovel and
federation plugins' "shovel", "federation-upstream" and "federation-upstream-set")."""

from aiohttp import web

from .. import changes
from ...broker import parameters
from ..access import GLOBAL_PARAMETERS, IN_LOGIN_VHOSTS, POLICIES, access
from ..app import bad_request, json_response, not_found, trusted
from ..resources import flush, html_escaped, list_response, read_value, vhost_for_change, vhost_or_404

routes = web.RouteTableDef()


# -------------------------------------------------------------- vhost parameters
@routes.get("/api/parameters")
@access(POLICIES, lists=IN_LOGIN_VHOSTS)
async def list_all(request):
    return list_response(request, parameters.listed(request.app["broker"]))


@routes.get("/api/parameters/{component}")
@access(POLICIES, lists=IN_LOGIN_VHOSTS)
async def list_component(request):
    return list_response(request, parameters.listed(request.app["broker"], request.match_info["component"]))


@routes.get("/api/parameters/{component}/{vhost}")
@access(POLICIES, lists=IN_LOGIN_VHOSTS)
async def list_vhost(request):
    vhost = vhost_or_404(request)
    return list_response(request, parameters.listed(request.app["broker"], request.match_info["component"], vhost))


@routes.get("/api/parameters/{component}/{vhost}/{name}")
@access(POLICIES)
async def get_one(request):
    found = parameters.lookup(vhost_or_404(request), request.match_info["component"], request.match_info["name"])
    if found is None:
        raise not_found()
    return json_response(found)


@routes.put("/api/parameters/{component}/{vhost}/{name}")
@access(POLICIES)
async def put_one(request):
    vhost = vhost_for_change(request)
    value = await read_value(request)
    try:
        component, name = request.match_info["component"], request.match_info["name"]
        who = None if trusted(request) else request["user"]
        created = await changes.perform(request, lambda: parameters.set_parameter.change(
            request.app["broker"], vhost, component, name, value, who))
    except parameters.ParameterError as err:
        raise bad_request(html_escaped(str(err))) from None
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/parameters/{component}/{vhost}/{name}")
@access(POLICIES)
async def delete_one(request):
    vhost = vhost_or_404(request)
    try:
        component, name = request.match_info["component"], request.match_info["name"]
        existed = await changes.perform(request, lambda: parameters.clear_parameter.change(
            request.app["broker"], vhost, component, name))
    except parameters.ParameterError as err:
        raise bad_request(str(err)) from None
    if not existed:
        raise not_found()
    flush(request)
    return web.Response(status=204)


# ------------------------------------------------------------- global parameters
@routes.get("/api/global-parameters")
@access(GLOBAL_PARAMETERS)
async def list_global(request):
    items = [{"name": name, "value": value}
             for name, value in parameters.global_parameters(request.app["broker"]).items()]
    return list_response(request, items, default_sort=("name",))


@routes.get("/api/global-parameters/{name}")
@access(GLOBAL_PARAMETERS)
async def get_global(request):
    name = request.match_info["name"]
    values = parameters.global_parameters(request.app["broker"])
    if name not in values:
        raise not_found()
    return json_response({"value": values[name], "name": name})


@routes.put("/api/global-parameters/{name}")
@access(GLOBAL_PARAMETERS)
async def put_global(request):
    value = await read_value(request)
    try:
        name = request.match_info["name"]
        created = await changes.perform(request, lambda: parameters.set_global.change(request.app["broker"], name, value))
    except parameters.ParameterError as err:
        raise bad_request(str(err)) from None
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/global-parameters/{name}")
@access(GLOBAL_PARAMETERS)
async def delete_global(request):
    name = request.match_info["name"]
    if not await changes.perform(request, lambda: parameters.clear_global.change(request.app["broker"], name)):
        raise not_found()
    flush(request)
    return web.Response(status=204)
