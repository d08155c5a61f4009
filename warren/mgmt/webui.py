"""The management web UI's files: GET / (the single page) and /ui/{path} (its scripts and
styles), served without authentication as RabbitMQ serves its UI's assets. The page itself
logs in and calls the public /api with the user's credentials (warren/mgmt/ui/js/api.js).

The files are those shipped in the package under warren/mgmt/ui/, read once when the app is
made: only a path in that list is served, so no request can name anything else (no
traversal, no directory listings)."""

import hashlib
from importlib import resources
from typing import NamedTuple

from aiohttp import web

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".ico": "image/x-icon"}

# The page talks to its own origin only; this makes the browser hold it to that (a value
# shown unescaped by a bug could not load or send anything elsewhere).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


class Asset(NamedTuple):
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file under warren/mgmt/ui/ whose type we serve, by its path there."""
    assets: dict[str, Asset] = {}
    stack = [("", resources.files(__package__).joinpath("ui"))]
    while stack:
        prefix, folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                stack.append((f"{prefix}{entry.name}/", entry))
                continue
            suffix = entry.name[entry.name.rfind("."):] if "." in entry.name else ""
            if suffix in TYPES:
                body = entry.read_bytes()
                assets[prefix + entry.name] = Asset(body, TYPES[suffix], f'"{hashlib.sha1(body).hexdigest()[:16]}"')
    return assets


def _serve(request: web.Request, asset: Asset | None) -> web.StreamResponse:
    if asset is None:
        raise web.HTTPNotFound()
    # no-cache: the browser keeps the file but asks each time (a 304 when it is unchanged),
    # so an upgraded broker's UI is never mixed with old cached modules.
    headers = {"Cache-Control": "no-cache", "ETag": asset.etag, "X-Content-Type-Options": "nosniff",
               "Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
    if asset.etag in (tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")):
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = asset.content_type
    return web.Response(body=asset.body, headers=headers)


routes = web.RouteTableDef()


@routes.get("/")
async def index(request):
    return _serve(request, request.app["ui_assets"].get("index.html"))


@routes.get("/ui/{path:.+}")
async def asset(request):
    return _serve(request, request.app["ui_assets"].get(request.match_info["path"]))
