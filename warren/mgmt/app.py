"""The management HTTP API: the paths, JSON shapes, auth and errors of RabbitMQ's
management plugin, served from the broker's event loop with aiohttp.

Handlers read and change the broker model directly (the loop is single-threaded, so no
locking); `request.app["broker"]` is the Broker and `request.app["server"]` the Server.
"""

import base64
import importlib
import json
import logging
import pkgutil
from typing import Any

from aiohttp import web

from ..amqp import codec
from . import access, api

log = logging.getLogger("warren.mgmt")



class ApiError(Exception):
    """An error answered the way RabbitMQ's API does: {"error": ..., "reason": ...}. The reason
    is a text, or a list (an Erlang term as RabbitMQ's JSON shows it, e.g. ["not_integer", "x"])."""

    def __init__(self, status: int, error: str, reason: str | list[Any]):
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def not_found(reason: str = "Not Found") -> ApiError:
    return ApiError(404, "Object Not Found", reason)


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def json_response(data, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


def _unauthorised(reason: str, error: str = "not_authorised") -> web.Response:
    # As RabbitMQ: only a failed login asks for credentials again (WWW-Authenticate); a user
    # who is not allowed this route gets the reason alone.
    headers = {"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'} if error == "not_authorized" else None
    return web.json_response({"error": error, "reason": reason}, status=401, headers=headers)


@web.middleware
async def auth_middleware(request, handler):
    """HTTP basic auth with the broker's users, then the route's access rule (warren.mgmt.access:
    RabbitMQ 3.10's rules per user tag)."""
    if request.match_info.http_exception is not None:
        # As RabbitMQ (cowboy): an unknown path (404) or method (405) is answered before
        # authentication.
        return await handler(request)
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        # RabbitMQ answers a request without credentials with an empty 401.
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'})
    try:
        username, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return _unauthorised("Not authorised")
    user = request.app["broker"].authenticate(username, password)
    if user is None:
        return _unauthorised("Login failed", "not_authorized")  # RabbitMQ spells this one so
    refused = access.check(request, user)
    if refused is not None:
        return _unauthorised(refused)
    request["user"] = user
    return await handler(request)


@web.middleware
async def error_middleware(request, handler):
    try:
        return await handler(request)
    except ApiError as err:
        return web.json_response({"error": err.error, "reason": err.reason}, status=err.status)
    except web.HTTPNotFound:
        return web.json_response({"error": "Object Not Found", "reason": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return await _not_allowed(request)


# RabbitMQ's resources list their methods in this order (then OPTIONS, which each one serves).
_METHOD_ORDER = ("HEAD", "GET", "PUT", "POST", "DELETE")


async def _not_allowed(request) -> web.Response:
    """As RabbitMQ (cowboy_rest), before authentication: an empty 405 whose Allow header lists
    the path's methods; OPTIONS is answered with that list (200). The methods are those of
    the first path template that matches, as cowboy's first matching route serves the path
    (aiohttp's own list joins every match: /api/users/bulk-delete and /api/users/{name})."""
    allowed: set[str] = set()
    first = None
    for resource in request.app.router.resources():
        if first is not None and resource.canonical != first:
            continue  # (a template's methods may be spread over several resources)
        _, found = await resource.resolve(request)
        if found:
            first = resource.canonical
            allowed |= found
    methods = allowed | ({"HEAD"} if "GET" in allowed else set())
    header = ", ".join([m for m in _METHOD_ORDER if m in methods] + ["OPTIONS"])
    return web.Response(status=200 if request.method == "OPTIONS" else 405, headers={"Allow": header})


def make_app(broker, server=None, service: "ManagementService | None" = None) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app["broker"] = broker
    app["server"] = server
    app["management"] = service
    # Arguments may nest codec.MAX_NESTING levels; converting and showing them recurses.
    codec.allow_nesting()
    # Message rates: the counters are sampled every few seconds while the API runs.
    from . import stats
    app.on_startup.append(stats.start_sampler)
    app.on_cleanup.append(stats.stop_sampler)
    # Every module under warren/mgmt/api/ is a resource with a `routes` RouteTableDef.
    for info in sorted(pkgutil.iter_modules(api.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{api.__name__}.{info.name}")
        app.add_routes(module.routes)
        # As RabbitMQ (cowboy's router), one trailing slash names the same resource:
        # amqpstorm's healthchecks.get() asks for /api/healthchecks/node/.
        app.add_routes([web.RouteDef(r.method, r.path + "/", r.handler, r.kwargs)
                        for r in module.routes if isinstance(r, web.RouteDef)])
    return app


class ManagementService:
    """The API on host:port, as one of the server's services (warren.server.listener.Service)."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self, server) -> None:
        runner = self._runner = web.AppRunner(make_app(server.broker, server, self), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port, reuse_address=True).start()
        log.info("management API listening on http://%s:%d/api/", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
