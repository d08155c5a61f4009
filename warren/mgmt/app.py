"""The management HTTP API: the paths, JSON shapes, auth and errors of RabbitMQ's
management plugin, served from the broker's event loop with aiohttp.

Handlers read and change the broker model directly (the loop is single-threaded, so no
locking); `request.app["broker"]` is the Broker and `request.app["server"]` the Server.
"""

import base64
import importlib
import json
import logging
import os
import pkgutil
import socket
import ssl
import struct
import tempfile
from typing import Any, NamedTuple

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from ..amqp import codec
from ..broker.auth import User
from ..cluster.membership import Membership
from . import access, api, webui

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


# Who a request on the control socket acts as: rabbitmqctl's acting user. Not one of the
# broker's users (it cannot log in anywhere else: no password) and never given permissions:
# its Actor is trusted (warren.broker.ops.Actor.trusted), as rabbitmqctl on its node.
CONTROL_USER = User("rmq-cli", "", [access.ADMINISTRATOR])


def trusted(request) -> bool:
    """Whether the request came through the control socket (and so may do anything)."""
    return request.get("user") is CONTROL_USER


def _control_peer(request) -> bool | None:
    """None for a request over TCP; for one over the control socket (the only Unix socket
    the API listens on), whether the peer runs as the broker's own user (or root). The
    socket's mode already keeps other users out; this holds even if the mode is changed."""
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # no way to ask (not Linux): the socket's 0600 mode is the check
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid in (os.getuid(), 0)


@web.middleware
async def auth_middleware(request, handler):
    """HTTP basic auth with the broker's users, then the route's access rule (warren.mgmt.access:
    RabbitMQ 3.10's rules per user tag). A request on the control socket needs no credentials:
    it acts as CONTROL_USER."""
    if request.match_info.http_exception is not None:
        # As RabbitMQ (cowboy): an unknown path (404) or method (405) is answered before
        # authentication.
        return await handler(request)
    if request.match_info.route.resource in request.app["public"]:
        return await handler(request)  # the web UI's files (warren.mgmt.webui)
    local = _control_peer(request)
    if local is not None:
        if not local:
            return _unauthorised("Not the broker's user")
        request["user"] = CONTROL_USER
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


# The methods cowboy knows; RabbitMQ answers any other with an empty 501, on any path and
# before authentication. (aiohttp's parser itself refuses methods it does not know, such as
# FOO, with a 400 before the app sees them; those it knows, such as TRACE or PROPFIND, reach
# this check.)
KNOWN_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


@web.middleware
async def routing_middleware(request, handler):
    """cowboy's routing where aiohttp's differs: an unknown method is 501; a path that is one
    of the API's fixed paths belongs to that path's resource alone, so a method it lacks is
    405 there even when a template would take it (GET /api/users/bulk-delete is not the user
    "bulk-delete", as in RabbitMQ)."""
    if request.method not in KNOWN_METHODS:
        return web.Response(status=501)
    if request.match_info.http_exception is None:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical != request.path and \
                request.path in request.app["fixed_paths"]:
            return await _not_allowed(request)
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
    methods = allowed  # a GET route brings its HEAD route, unless allow_head=False (the limits: RabbitMQ's 405)
    header = ", ".join([m for m in _METHOD_ORDER if m in methods] + ["OPTIONS"])
    return web.Response(status=200 if request.method == "OPTIONS" else 405, headers={"Allow": header})


# management.http.max_body_size's default (bytes), RabbitMQ's since 3.11.24 and 3.12.7 (and
# Debian's 3.10.8): a bigger request body is refused (warren.mgmt.body, which reads every
# body). Upstream RabbitMQ 3.10 read bodies of any size.
MAX_BODY_SIZE = 10_000_000


async def expect_later(request) -> None:
    """The routes' Expect handler: 100 Continue is sent when the body is read (warren.mgmt.body);
    any other expectation is refused (417) as aiohttp's own handler does."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version == HttpVersion11 and expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")


def make_app(broker, server=None, service: "ManagementService | None" = None,
             max_body_size: int = MAX_BODY_SIZE) -> web.Application:
    # aiohttp bounds its own reads too (request.read(), .post()), should a handler use them;
    # its 0 would mean no bound.
    app = web.Application(middlewares=[routing_middleware, error_middleware, auth_middleware],
                          client_max_size=max(max_body_size, 1))
    app["max_body_size"] = max_body_size
    app["broker"] = broker
    app["server"] = server
    app["management"] = service
    app["membership"] = service.membership if service is not None else None
    # Arguments may nest codec.MAX_NESTING levels; converting and showing them recurses.
    codec.allow_nesting()
    # Message rates: the counters are sampled every few seconds while the API runs.
    from . import stats
    app.on_startup.append(stats.start_sampler)
    app.on_cleanup.append(stats.stop_sampler)
    # Every module under warren/mgmt/api/ is a resource with a `routes` RouteTableDef.
    for info in sorted(pkgutil.iter_modules(api.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{api.__name__}.{info.name}")
        routes = [r for r in module.routes if isinstance(r, web.RouteDef)]
        # As RabbitMQ (cowboy's router), one trailing slash names the same resource:
        # amqpstorm's healthchecks.get() asks for /api/healthchecks/node/. 100 Continue
        # waits until the body is read (warren.mgmt.body).
        for suffix in ("", "/"):
            app.add_routes([web.RouteDef(r.method, r.path + suffix, r.handler,
                                         {**r.kwargs, "expect_handler": expect_later}) for r in routes])
    # The web UI's page and files, public as in RabbitMQ (the page logs in to the API).
    app["ui_assets"] = webui.load_assets()
    app["public"] = frozenset(route.resource for route in app.add_routes(webui.routes))
    app["fixed_paths"] = frozenset(r.canonical for r in app.router.resources() if isinstance(r, web.PlainResource))
    return app


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class HTTPS(NamedTuple):
    """The API's HTTPS listener (management.ssl.*): its address, TLS context and the options
    it was made from (what the API shows of them)."""
    host: str
    port: int
    context: ssl.SSLContext
    options: dict


class ManagementService:
    """The API on host:port (port None: not over TCP), over HTTPS if `https` says where, and
    on the control socket (a Unix socket path, or None), as one of the server's services
    (warren.server.listener.Service). Request bodies may be up to max_body_size bytes
    (management.http.max_body_size)."""

    def __init__(self, host: str, port: int | None, control_socket: str | None = None,
                 https: HTTPS | None = None, max_body_size: int = MAX_BODY_SIZE,
                 membership: Membership | None = None):
        self.host = host
        self.membership = membership  # the cluster's nodes as etcd knows them; None alone
        self.port = port
        self.https = https
        self.max_body_size = max_body_size
        self.control_socket = control_socket
        self._control_inode: tuple[int, int] | None = None  # of the socket file we made
        self._runner: web.AppRunner | None = None

    async def start(self, server) -> None:
        app = make_app(server.broker, server, self, self.max_body_size)
        runner = self._runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        if self.port:
            await web.TCPSite(runner, self.host, self.port, reuse_address=True).start()
            log.info("management API listening on http://%s:%d/api/", self.host, self.port)
        if self.https is not None:
            https = self.https
            await web.TCPSite(runner, https.host, https.port, ssl_context=https.context, reuse_address=True).start()
            log.info("management API listening on https://%s:%d/api/", _url_host(https.host), https.port)
        if self.control_socket is not None:
            try:
                sock = self._bind_control_socket(self.control_socket)
            except OSError as err:
                # Not fatal: warrenctl falls back to the API over TCP with a user.
                log.error("no control socket for warrenctl at %s: %s", self.control_socket,
                          err.strerror or err)
                return
            await web.SockSite(runner, sock).start()
            log.info("control socket for warrenctl at %s", self.control_socket)

    def _bind_control_socket(self, path: str) -> socket.socket:
        """Bind the socket in a fresh 0700 directory, make it 0600, then rename it into place:
        no other user can connect to it at any moment, and a stale socket left by a killed
        broker is replaced in one step. (Not umask: it is process-wide, and the fsync thread
        may be creating files meanwhile.)"""
        directory = os.path.dirname(path) or "."
        # (A short name: the staged path must fit AF_UNIX's ~107 bytes wherever the final one does.)
        private = tempfile.mkdtemp(prefix=".wc", dir=directory)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            staged = os.path.join(private, "s")
            sock.bind(staged)
            os.chmod(staged, 0o600)
            os.replace(staged, path)
            st = os.stat(path)
            self._control_inode = (st.st_dev, st.st_ino)
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        finally:
            try:
                os.unlink(os.path.join(private, "s"))
            except FileNotFoundError:
                pass
            os.rmdir(private)
        return sock

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.control_socket is not None and self._control_inode is not None:
            try:
                st = os.stat(self.control_socket)
                if (st.st_dev, st.st_ino) == self._control_inode:  # not another broker's since
                    os.unlink(self.control_socket)
            except FileNotFoundError:
                pass
            self._control_inode = None
