"""/api/exchanges: list, declare, delete, their bindings, and publishing a message."""

import asyncio
import base64
import binascii
from typing import Any

from aiohttp import web

from .. import changes
from ...amqp.codec import shortstr
from ...amqp.properties import encode_header
from ...broker import ops
from ...broker.errors import AMQPError
from ...store.settlement import REJECTED, SETTLED, Settlement
from ..access import IN_LOGIN_VHOSTS, VHOST, access
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import (actor, channel_error_text, check_vhost_access, direct_error, exchange_name,
                         flush, json_to_table, list_response, parse_bool, query_bool, read_body, require,
                         vhost_for_change, vhost_or_404)
from ..shapes import exchange_json, vhost_bindings

routes = web.RouteTableDef()


def _exchange_or_404(request):
    vhost = vhost_or_404(request)
    x = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if x is None:
        raise not_found()
    return vhost, x


@routes.get("/api/exchanges")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_all(request):
    broker = request.app["broker"]
    return list_response(request, [exchange_json(x) for v in broker.vhosts.values() for x in v.exchanges.values()])


@routes.get("/api/exchanges/{vhost}")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_vhost(request):
    vhost = vhost_or_404(request)
    return list_response(request, [exchange_json(x) for x in vhost.exchanges.values()])


@routes.get("/api/exchanges/{vhost}/{name}")
@access(VHOST)
async def get_exchange(request):
    _, x = _exchange_or_404(request)
    return json_response({**exchange_json(x), "incoming": [], "outgoing": []})


@routes.put("/api/exchanges/{vhost}/{name}")
@access(VHOST)
async def put_exchange(request):
    """Declare an exchange as exchange.declare does (RabbitMQ's defaults: direct, not durable)."""
    vhost = vhost_for_change(request)
    name = exchange_name(request.match_info["name"])
    body = await read_body(request)
    type_name = body.get("type", "direct")
    durable = parse_bool(body, "durable")
    auto_delete = parse_bool(body, "auto_delete")
    internal = parse_bool(body, "internal")
    arguments = json_to_table(body.get("arguments"))
    if not isinstance(type_name, str):
        raise bad_request(f"unknown exchange type '{type_name}'")
    try:
        check_vhost_access(request, vhost)
        who = actor(request, vhost)
        _, created = await changes.perform(request, lambda: ops.declare_exchange.change(
            who, name, type_name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/exchanges/{vhost}/{name}")
@access(VHOST)
async def delete_exchange(request):
    vhost = vhost_or_404(request)
    name = exchange_name(request.match_info["name"])
    x = vhost.exchanges.get(name)
    if x is None:
        raise not_found()
    try:
        check_vhost_access(request, vhost)
        who, if_unused = actor(request, vhost), query_bool(request, "if-unused")
        await changes.perform(request, lambda: ops.delete_exchange.change(who, name, if_unused))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=204)


@routes.get("/api/exchanges/{vhost}/{name}/bindings/source")
@access(VHOST)
async def bindings_source(request):
    vhost = vhost_or_404(request)
    x = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    # RabbitMQ answers [] for a missing exchange.
    return json_response(vhost_bindings(vhost, source=x) if x is not None else [])


@routes.get("/api/exchanges/{vhost}/{name}/bindings/destination")
@access(VHOST)
async def bindings_destination(request):
    vhost = vhost_or_404(request)
    x = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if x is None or x.is_default:
        return json_response([])
    return json_response([b for b in vhost_bindings(vhost, destination=x) if b["source"] != ""])


# ------------------------------------------------------------------ publish
_STRING_PROPS = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                 "type", "user_id", "app_id", "cluster_id")
_INT_PROPS = (("delivery_mode", 255), ("priority", 255), ("timestamp", (1 << 64) - 1))


def basic_properties(props) -> dict:
    """The "properties" object of a publish as AMQP basic properties (unknown keys ignored)."""
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    out: dict[str, Any] = {}
    for key in _STRING_PROPS:
        value = props.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value.encode()) > 255:
            raise ApiError(400, "bad_request", ["not_string", key])
        out[key] = value
    for key, limit in _INT_PROPS:
        value = props.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise ApiError(400, "bad_request", ["not_int", key])
        out[key] = value
    if props.get("headers") is not None:
        out["headers"] = json_to_table(props["headers"])
    return out


class _Settled:
    """Waits, as a channel's confirm does, until a settlement handle is decided (a SyncWaiter)."""

    def __init__(self, settlement: Settlement):
        self.settlement = settlement
        self.future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def store_synced(self) -> None:
        if self.future.done():
            return
        safe = self.settlement.status()
        if safe is None:
            self.settlement.notify(self)
        else:
            self.future.set_result(safe)


async def _confirmed(broker, settlement: Settlement) -> bool:
    """Whether the published message is safe: on disk if it had to be written."""
    broker.durability.flush()
    waiter = _Settled(settlement)
    waiter.store_synced()
    return await waiter.future


def publish(request, vhost, name: str, routing_key: str, properties: dict, body: bytes):
    """basic.publish on a channel of the API's user, through the same operations. Returns
    (routed, what its confirm waits for)."""
    ops.check_message_size(request.app["broker"], len(body))  # first, as rabbit_channel does
    try:
        route = shortstr(name) + shortstr(routing_key)
    except ValueError:
        raise bad_request("routing_key is longer than 255 bytes") from None
    _, queues, settlement = ops.publish(actor(request, vhost), name, routing_key, route,
                                        encode_header(len(body), properties), body)
    if settlement is REJECTED:  # a queue refused it (reject-publish): not routed, as a nack
        return False, SETTLED
    return bool(queues), settlement


async def _alarms_cleared(broker) -> None:
    """Return once no resource alarm is on (on any node of the cluster). An HTTP publish is held during an alarm as a
    blocked AMQP publisher's is (RabbitMQ 3.10's API publishes through it; Warren's alarms
    bound memory and disk for every way in)."""
    alarms = broker.alarms
    if not alarms.blocking:
        return
    cleared = asyncio.get_running_loop().create_future()

    def changed() -> None:
        if not alarms.blocking and not cleared.done():
            cleared.set_result(None)

    alarms.subscribe(changed)
    try:
        await cleared
    finally:
        alarms.unsubscribe(changed)


@routes.post("/api/exchanges/{vhost}/{name}/publish")
@access(VHOST)
async def publish_message(request):
    vhost = vhost_for_change(request)
    name = exchange_name(request.match_info["name"])
    body = await read_body(request)
    require(body, "routing_key", "properties", "payload", "payload_encoding")
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "bad_request", ["not_base64", payload]) from None
    else:
        raise ApiError(400, "bad_request", ["unsupported_encoding", encoding])
    routing_key = body["routing_key"]
    if not isinstance(routing_key, str):
        routing_key = str(routing_key)
    properties = basic_properties(body["properties"])
    check_vhost_access(request, vhost)  # RabbitMQ's channel for the API's user must open
    await _alarms_cleared(request.app["broker"])
    try:
        routed, settlement = publish(request, vhost, name, routing_key, properties, data)
    except AMQPError as err:
        raise bad_request(channel_error_text(err)) from None
    if not await _confirmed(request.app["broker"], settlement):
        raise ApiError(500, "internal_error", "the message could not be written to disk")
    return json_response({"routed": routed})
