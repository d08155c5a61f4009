"""/api/users: list, create or replace (password, or password_hash and hashing_algorithm,
and tags), delete (closing the user's connections), permissions, bulk delete."""

import base64
import binascii
import os

from aiohttp import web

from .. import changes
from ...broker.metadata.commands import DeleteUser, PutUser
from ...broker.auth import MD5, SHA256, SHA512, User, hash_password
from ...broker.limits import LimitError, update_user_limits, validate_user_limits
from ..access import ADMIN, access
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import flush, list_response, read_body, require
from .connections import close_connections
from .vhosts import permission_json

routes = web.RouteTableDef()

ALGORITHMS = (SHA256, SHA512, MD5)


def user_json(u) -> dict:
    return {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.algorithm,
            "tags": list(u.tags), "limits": dict(u.limits)}


def parse_tags(value) -> list:
    if isinstance(value, list):
        return [str(t).strip() for t in value if str(t).strip()]
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    raise ApiError(400, "bad_request", ["invalid_tags", value])


@routes.get("/api/users")
@access(ADMIN)
async def list_users(request):
    broker = request.app["broker"]
    return list_response(request, [user_json(u) for u in broker.users.values()], default_sort=("name",))


# Before /api/users/{name}, which would match it too.
@routes.get("/api/users/without-permissions")
@access(ADMIN)
async def without_permissions(request):
    broker = request.app["broker"]
    with_some = {user for user, _ in broker.permissions}
    return list_response(request, [user_json(u) for u in broker.users.values() if u.name not in with_some],
                         default_sort=("name",))


@routes.post("/api/users/bulk-delete")
@access(ADMIN)
async def bulk_delete(request):
    """Delete the users in order; an unknown one stops there (as RabbitMQ: those before it
    are gone)."""
    broker = request.app["broker"]
    body = await read_body(request)
    require(body, "users")
    names = body["users"]
    if not isinstance(names, list):
        raise bad_request("users must be a list")
    try:
        for name in names:
            if not isinstance(name, str) or not await _delete(request, broker, name):
                raise ApiError(400, "bad_request", ["no_such_user", name])
    finally:
        flush(request)
    return web.Response(status=204)


@routes.get("/api/users/{name}")
@access(ADMIN)
async def get_user(request):
    user = request.app["broker"].users.get(request.match_info["name"])
    if user is None:
        raise not_found()
    return json_response(user_json(user))


@routes.put("/api/users/{name}")
@access(ADMIN)
async def put_user(request):
    """Create or replace a user. Without a password a new user gets a random one and an
    existing one loses its password (as RabbitMQ)."""
    broker = request.app["broker"]
    name = request.match_info["name"]
    body = await read_body(request)
    if "tags" not in body:
        raise bad_request("tags_not_present")
    tags = parse_tags(body["tags"])
    password, password_hash = body.get("password"), body.get("password_hash")
    if password is not None and password_hash is not None:
        raise bad_request("both_password_and_password_hash_are_provided")
    algorithm = body.get("hashing_algorithm", SHA256)
    if algorithm not in ALGORITHMS:
        raise bad_request(f"unsupported hashing algorithm '{algorithm}'")
    existing = broker.users.get(name)
    if password_hash is not None:
        if not isinstance(password_hash, str):
            raise ApiError(400, "bad_request", ["not_base64", password_hash])
        try:
            base64.b64decode(password_hash, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "bad_request", ["not_base64", password_hash]) from None
        user = User(name, password_hash, tags, algorithm)
    elif password is not None:
        if not isinstance(password, str):
            raise bad_request("password must be a string")
        user = User(name, hash_password(password, algorithm), tags, algorithm)
    elif existing is None:
        user = User(name, hash_password(base64.b64encode(os.urandom(24)).decode()), tags)
    else:
        user = User(name, "", tags)
    limits = body.get("limits") or {}
    try:  # merged with the user's own, as RabbitMQ (which answers a bad one with a 500)
        validate_user_limits(limits)
    except LimitError as err:
        raise bad_request(str(err)) from None
    await changes.apply(request, PutUser(user))
    # (the stored user: a cluster node's command applied a copy of `user`, with the limits it kept)
    await changes.perform(request, lambda: update_user_limits.change(broker, broker.users.get(name, user), limits))
    flush(request)
    return web.Response(status=204 if existing is not None else 201)


async def _delete(request, broker, name: str) -> bool:
    if await changes.apply(request, DeleteUser(name)) is None:
        return False
    await close_connections(request, "user", name, f"user '{name}' is deleted")
    return True


@routes.delete("/api/users/{name}")
@access(ADMIN)
async def delete_user(request):
    broker = request.app["broker"]
    if not await _delete(request, broker, request.match_info["name"]):
        raise not_found()
    flush(request)
    return web.Response(status=204)


@routes.get("/api/users/{name}/permissions")
@access(ADMIN)
async def user_permissions(request):
    broker = request.app["broker"]
    name = request.match_info["name"]
    if name not in broker.users:
        raise not_found()
    items = [permission_json(u, v, p) for (u, v), p in broker.permissions.items() if u == name]
    return list_response(request, items, default_sort=("vhost",))
