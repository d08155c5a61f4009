"""/api/queues: list, declare, delete, purge, get messages, and a queue's bindings."""

import base64

from aiohttp import web

from .. import changes, peers
from ...broker import ops
from ...broker.errors import AMQPError
from ..access import IN_LOGIN_VHOSTS, VHOST, access
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import (actor, channel_error_text, check_vhost_access, direct_error, flush,
                         json_to_table, objects_response, parse_bool, parse_int, query_bool,
                         read_body, require, table_json, vhost_for_change, vhost_or_404)
from ..shapes import queue_json, queues_json, vhost_bindings

routes = web.RouteTableDef()

ACKMODES = {"ack_requeue_true": (True, True), "ack_requeue_false": (True, False),
            "reject_requeue_true": (False, True), "reject_requeue_false": (False, False)}


def _queue_or_404(request):
    vhost = vhost_or_404(request)
    q = vhost.queues.get(request.match_info["name"])
    if q is None or not q.reachable:  # (a queue whose home node is down: 404, as RabbitMQ)
        raise not_found()
    return vhost, q


# The web UI's streams page pages the queues sorted by type.
_STUB_FIELDS = {"type": lambda q: q.queue_type}


@routes.get("/api/queues")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_all(request):
    broker = request.app["broker"]
    queues = [q for v in broker.vhosts.values() for q in v.queues.values()]
    return objects_response(request, queues, lambda page: queues_json(broker, page), _STUB_FIELDS)


@routes.get("/api/queues/{vhost}")
@access(VHOST, lists=IN_LOGIN_VHOSTS)
async def list_vhost(request):
    vhost = vhost_or_404(request)
    return objects_response(request, list(vhost.queues.values()),
                            lambda page: queues_json(request.app["broker"], page), _STUB_FIELDS)


@routes.get("/api/queues/{vhost}/{name}")
@access(VHOST)
async def get_queue(request):
    vhost, q = _queue_or_404(request)
    d = queue_json(request.app["broker"], q, details=True)
    # Its consumers on the other cluster members, as they show them.
    d["consumer_details"] += await peers.listing(request, peers.CONSUMERS, {"vhost": vhost.name, "queue": q.name},
                                                 here=False)
    return json_response(d)


@routes.put("/api/queues/{vhost}/{name}")
@access(VHOST)
async def put_queue(request):
    """Declare a queue as queue.declare does (never exclusive; RabbitMQ's default: not durable)."""
    vhost = vhost_for_change(request)
    name = request.match_info["name"]
    body = await read_body(request)
    durable = parse_bool(body, "durable")
    auto_delete = parse_bool(body, "auto_delete")
    arguments = json_to_table(body.get("arguments"))
    try:
        check_vhost_access(request, vhost)
        who = actor(request, vhost)
        _, created = await changes.perform(request, lambda: ops.declare_queue.change(
            who, name, durable=durable, auto_delete=auto_delete, arguments=arguments))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=201 if created else 204)


@routes.delete("/api/queues/{vhost}/{name}")
@access(VHOST)
async def delete_queue(request):
    vhost, q = _queue_or_404(request)
    try:
        check_vhost_access(request, vhost)
        who, if_unused, if_empty = actor(request, vhost), query_bool(request, "if-unused"), query_bool(request, "if-empty")
        if q.remote and ops.queue_to_delete(who, q.name) is not None:  # (its home checks and deletes it)
            await changes.answer(lambda done: q.delete_async(if_unused, if_empty, done))
        else:
            await changes.perform(request, lambda: ops.delete_queue.change(who, q.name, if_unused, if_empty))
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=204)


@routes.delete("/api/queues/{vhost}/{name}/contents")
@access(VHOST)
async def purge_queue(request):
    vhost, q = _queue_or_404(request)
    try:
        check_vhost_access(request, vhost)
        q = ops.readable_queue(actor(request, vhost), q.name)
        if q.remote:
            await changes.answer(q.purge_async)
        else:
            q.purge()
    except AMQPError as err:
        raise direct_error(err) from None
    flush(request)
    return web.Response(status=204)


@routes.get("/api/queues/{vhost}/{name}/bindings")
@access(VHOST)
async def queue_bindings(request):
    vhost = vhost_or_404(request)
    q = vhost.queues.get(request.match_info["name"])
    return json_response(vhost_bindings(vhost, destination=q) if q is not None else [])


def _properties_json(props: dict) -> dict:
    out = {}
    for key, value in props.items():
        out[key] = table_json(value) if key == "headers" else value
    return out


def _message_json(qm, remaining: int, encoding: str, truncate) -> dict:
    msg = qm.message
    body = bytes(msg.body)
    shown = body[:truncate] if truncate is not None else body
    if encoding == "auto":
        try:
            payload, payload_encoding = shown.decode(), "string"
        except UnicodeDecodeError:
            payload, payload_encoding = base64.b64encode(shown).decode(), "base64"
    else:
        payload, payload_encoding = base64.b64encode(shown).decode(), "base64"
    return {"payload_bytes": len(body), "redelivered": qm.redelivered, "exchange": msg.exchange,
            "routing_key": msg.routing_key, "message_count": remaining,
            "properties": _properties_json(msg.properties), "payload": payload,
            "payload_encoding": payload_encoding}


@routes.post("/api/queues/{vhost}/{name}/get")
@access(VHOST)
async def get_messages(request):
    """Take up to `count` messages as basic.get does, then settle them all by `ackmode`
    (requeued ones go back to their places, marked redelivered)."""
    vhost = vhost_for_change(request)
    name = request.match_info["name"]
    body = await read_body(request)
    require(body, "ackmode", "count", "encoding")
    count = parse_int(body["count"])
    encoding = body["encoding"]
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    ackmode = ACKMODES.get(body["ackmode"])
    if ackmode is None:
        raise bad_request("Unsupported ackmode. Please use ack_requeue_true, ack_requeue_false, "
                          "reject_requeue_true or reject_requeue_false.")
    truncate = body.get("truncate")
    truncate = parse_int(truncate) if truncate not in (None, "") else None
    check_vhost_access(request, vhost)  # RabbitMQ's channel for the API's user must open
    who = actor(request, vhost)
    try:
        q = ops.readable_queue(who, name)
    except AMQPError as err:
        if err.code == 404:
            raise ApiError(404, "not_found", err.reply_text) from None
        if err.code == 403:
            raise ApiError(401, "not_authorised", err.reply_text) from None
        raise bad_request(channel_error_text(err)) from None
    taken = []
    result = []
    for _ in range(max(0, count)):
        if q.remote:  # (its home hands it out)
            qm, remaining = await changes.answer(lambda done: q.get_async(False, done))
        else:
            q, qm = ops.get(who, name, no_ack=False)
            remaining = q.message_count
        if qm is None:
            break
        taken.append(qm)
        result.append(_message_json(qm, remaining, encoding, truncate))
    ack, requeue = ackmode
    for qm in taken:
        ops.settle(qm, q, None, ack and not requeue, requeue)
    if requeue and taken:
        q.deliver_ready()
    if q.remote and taken:  # (answered once its home has them back: a request after the settles, on their link)
        await changes.answer(q.counts_async)
    flush(request)
    return json_response(result)
