"""/api/policies and /api/operator-policies: list, set, clear (stored, persisted with the
definitions; see warren.broker.policy for how they attach to exchanges and queues)."""

from aiohttp import web

from .. import changes
from ...broker.metadata.commands import ClearPolicy, SetPolicy
from ...broker.policy import Policy, PolicyError
from ..access import ADMIN, IN_LOGIN_VHOSTS, POLICIES, VHOST, access
from ..app import bad_request, json_response, not_found
from ..resources import (check_nesting, flush, html_escaped, list_response, read_body, require, vhost_for_change,
                         vhost_or_404)

routes = web.RouteTableDef()

KINDS = (("policies", False), ("operator-policies", True))


def _table(vhost, operator: bool) -> dict:
    return vhost.operator_policies if operator else vhost.policies


def _handlers(operator: bool):
    async def list_all(request):
        broker = request.app["broker"]
        items = [p.to_json() for v in broker.vhosts.values() for p in _table(v, operator).values()]
        return list_response(request, items)

    async def list_vhost(request):
        vhost = vhost_or_404(request)
        return list_response(request, [p.to_json() for p in _table(vhost, operator).values()])

    async def get_one(request):
        vhost = vhost_or_404(request)
        policy = _table(vhost, operator).get(request.match_info["name"])
        if policy is None:
            raise not_found()
        return json_response(policy.to_json())

    async def put_one(request):
        vhost = vhost_for_change(request)
        body = await read_body(request)
        require(body, "pattern", "definition")
        check_nesting(body["definition"])
        try:
            policy = Policy.validated(vhost.name, request.match_info["name"], body["pattern"], body["definition"],
                                      body.get("priority", 0), body.get("apply-to", "all"), operator)
        except PolicyError as err:
            raise bad_request(str(err) if operator else html_escaped(str(err))) from None
        created = await changes.apply(request, SetPolicy(policy, operator))
        flush(request)
        return web.Response(status=201 if created else 204)

    async def delete_one(request):
        vhost = vhost_or_404(request)
        if not await changes.apply(request, ClearPolicy(vhost.name, request.match_info["name"], operator)):
            raise not_found()
        flush(request)
        return web.Response(status=204)

    return list_all, list_vhost, get_one, put_one, delete_one


for _path, _operator in KINDS:
    _list_all, _list_vhost, _get, _put, _delete = _handlers(_operator)
    # As RabbitMQ: anyone may list the (operator) policies of their vhosts; a policy itself is
    # for policymakers with permissions in its vhost, an operator policy for administrators.
    _one = ADMIN if _operator else POLICIES
    routes.get(f"/api/{_path}")(access(VHOST, lists=IN_LOGIN_VHOSTS)(_list_all))
    routes.get(f"/api/{_path}/{{vhost}}")(access(VHOST, lists=IN_LOGIN_VHOSTS)(_list_vhost))
    routes.get(f"/api/{_path}/{{vhost}}/{{name}}")(access(_one)(_get))
    routes.put(f"/api/{_path}/{{vhost}}/{{name}}")(access(_one)(_put))
    routes.delete(f"/api/{_path}/{{vhost}}/{{name}}")(access(_one)(_delete))
