"""Request bodies of the management API, read within `management.http.max_body_size`, as
RabbitMQ does since 3.11.24 and 3.12.7 (CVE-2023-46118: before, a body of any size was read
whole into memory).

A body over the limit is refused with RabbitMQ's 400 {"error": "bad_request", "reason":
"Exceeded HTTP request body size limit"} without being kept: a Content-Length over the
limit is refused before a byte is read, a chunked body as soon as what came passes it. The
rest is discarded as it arrives (aiohttp's lingering close), never held. (3.11.24 and 3.12.7
compare the size in bits, and only between cowboy's reads of 8 MB; Warren counts bytes, as the
key's documentation and RabbitMQ 4 do, and checks Content-Length first, as RabbitMQ 4 does
for definitions.)

Bodies are read only here, by handlers, so after authentication and the route's access rule
(warren.mgmt.app.auth_middleware): a request without valid credentials gets its 401 and its
body is never read. As in cowboy, `Expect: 100-continue` is answered only when the body is
read (aiohttp answers it before any middleware by default): a client that waits for it sends
nothing to a request that is refused. The control socket (warrenctl, acting as rabbitmqctl)
has no limit, as rabbitmqctl's import_definitions has none.
"""

import logging

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from multidict import MultiDictProxy

from .app import ApiError, trusted

log = logging.getLogger("warren.mgmt")

EXCEEDED = "Exceeded HTTP request body size limit"


def _limit(request) -> int | None:
    return None if trusted(request) else request.app["max_body_size"]


def _too_large(request, limit: int, size: int) -> ApiError:
    log.warning("HTTP API: %s %s: the request body (%s%d bytes) exceeds the limit of %d bytes; "
                "management.http.max_body_size raises it", request.method, request.raw_path,
                "" if request.content_length is not None else "at least ", size, limit)
    return ApiError(400, "bad_request", EXCEEDED)


async def _start(request) -> int | None:
    """The limit, once a declared length over it is refused; then 100 Continue if the
    client waits for it."""
    limit = _limit(request)
    declared = request.content_length
    if limit is not None and declared is not None and declared > limit:
        raise _too_large(request, limit, declared)
    if request.version == HttpVersion11 and request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # (the response's size starts after it)
    return limit


async def read(request) -> bytearray:
    """The whole body (decoded if it came compressed), within the limit."""
    limit = await _start(request)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if limit is not None and len(body) > limit:
            raise _too_large(request, limit, len(body))
    return body


async def form(request) -> "MultiDictProxy[str | bytes | web.FileField]":
    """The fields of a form upload (multipart/form-data or urlencoded), within the limit:
    aiohttp's parser, bounded by it (its 0 would mean no bound)."""
    limit = await _start(request)
    try:
        fields = await request.clone(client_max_size=0 if limit is None else max(limit, 1)).post()
    except web.HTTPRequestEntityTooLarge:
        assert limit is not None  # (unbounded without one)
        raise _too_large(request, limit, request.content.total_bytes) from None
    if limit is not None and request.content.total_bytes > limit:
        raise _too_large(request, limit, request.content.total_bytes)
    return fields
