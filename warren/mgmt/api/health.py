"""Health checks: /api/healthchecks/node, /api/health/checks/*, /api/aliveness-test/{vhost},
with RabbitMQ 3.10's answers (200 {"status":"ok"}; 503 {"status":"failed", ...}).

/api/healthchecks/alarms is Warren's alias of /api/health/checks/alarms (the name the issue
uses; RabbitMQ 3.10 only has the latter)."""

from aiohttp import web

from ...amqp.properties import encode_header
from ...broker import ops
from ...broker.errors import AMQPError
from ..access import ANY, VHOST, access
from .. import stats
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import actor, check_vhost_access

routes = web.RouteTableDef()

OK = {"status": "ok"}
ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"
TIME_UNITS = ("days", "weeks", "months", "years")


def _failed(data: dict) -> web.Response:
    return json_response(dict({"status": "failed"}, **data), status=503)


def _alarms_check(request, where: str) -> web.Response:
    broker = request.app["broker"]
    in_alarm = stats.alarms(broker)
    if not in_alarm:
        return json_response(OK)
    node = stats.node_name(broker)
    return _failed({"alarms": [{"node": node, "resource": r} for r in in_alarm],
                    "reason": f"There are alarms in effect {where}"})


@routes.get("/api/health/checks/alarms")
@access(ANY)
async def alarms(request):
    return _alarms_check(request, "in the cluster")


@routes.get("/api/healthchecks/alarms")
@access(ANY)
async def alarms_alias(request):
    return _alarms_check(request, "in the cluster")


@routes.get("/api/health/checks/local-alarms")
@access(ANY)
async def local_alarms(request):
    return _alarms_check(request, "on the node")


def _node_check(request) -> web.Response:
    broker = request.app["broker"]
    in_alarm = stats.alarms(broker)
    if not in_alarm:
        return json_response(OK)
    node = stats.node_name(broker)
    terms = ",".join(f"{{resource_limit,{r},{node}}}" for r in in_alarm)
    return _failed({"reason": f"resource alarm(s) in effect:[{terms}]"})


@routes.get("/api/healthchecks/node")
@access(ANY)
async def node_health(request):
    return _node_check(request)


@routes.get("/api/healthchecks/node/{node}")
@access(ANY)
async def named_node_health(request):
    if request.match_info["node"] != stats.node_name(request.app["broker"]):
        raise not_found()
    return _node_check(request)


@routes.get("/api/health/checks/virtual-hosts")
@access(ANY)
async def virtual_hosts(request):
    return json_response(OK)


@routes.get("/api/health/checks/node-is-quorum-critical")
@access(ANY)
async def quorum_critical(request):
    return json_response({"status": "ok", "reason": "single node cluster"})


@routes.get("/api/health/checks/node-is-mirror-sync-critical")
@access(ANY)
async def mirror_sync_critical(request):
    return json_response({"status": "ok", "reason": "single node cluster"})


@routes.get("/api/health/checks/certificate-expiration/{within}/{unit}")
@access(ANY)
async def certificate_expiration(request):
    if request.match_info["unit"] not in TIME_UNITS:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    try:
        int(request.match_info["within"])
    except ValueError:
        raise bad_request("Invalid value for 'within'") from None
    return json_response(OK)  # Warren has no TLS listeners: no certificate expires


def _listeners(request) -> list:
    """(protocol, port) of every listener."""
    server = request.app["server"]
    out = []
    if server is not None:
        out.append(("amqp", server.port))
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname:
        out.append(("http", sockname[1]))
    return out


@routes.get("/api/health/checks/port-listener/{port}")
@access(ANY)
async def port_listener(request):
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = [p for _, p in _listeners(request)]
    if port in ports:
        return json_response({"status": "ok", "port": port})
    return _failed({"reason": "No active listener", "missing": port, "ports": ports})


@routes.get("/api/health/checks/protocol-listener/{protocol}")
@access(ANY)
async def protocol_listener(request):
    protocol = request.match_info["protocol"]
    protocols = [p for p, _ in _listeners(request)]
    # RabbitMQ accepts the protocol's other names too (amqp091, amqp0-9-1 ...).
    wanted = "amqp" if protocol.lower() in ("amqp", "amqp091", "amqp0-9-1", "amqp0.9.1") else protocol.lower()
    if wanted in protocols:
        return json_response({"status": "ok", "protocol": protocol})
    return _failed({"reason": "No active listener", "missing": protocol, "protocols": protocols})


@routes.get("/api/aliveness-test/{vhost}")
@access(VHOST)
async def aliveness_test(request):
    """Declare the aliveness-test queue, publish a message to it and get it back, as RabbitMQ
    does over a channel of the API's user."""
    broker = request.app["broker"]
    vhost = broker.vhosts.get(request.match_info["vhost"])
    if vhost is None:
        raise not_found()
    # An administrator without permissions there (others are refused by the VHOST rule):
    # RabbitMQ's channel cannot open.
    check_vhost_access(request, vhost)
    who = actor(request, vhost)
    route = bytes((0,)) + bytes((len(ALIVENESS_QUEUE),)) + ALIVENESS_QUEUE.encode()
    try:
        # Through the operations layer, as RabbitMQ goes through a channel: permissions and
        # the vhost's max-queues apply.
        ops.declare_queue(who, ALIVENESS_QUEUE)
        message, queues = ops.route(who, "", ALIVENESS_QUEUE, route,
                                    encode_header(len(ALIVENESS_BODY), {}), ALIVENESS_BODY)
        ops.enqueue(message, queues)
        queue = ops.readable_queue(who, ALIVENESS_QUEUE)
        qm = queue.get()
        while qm is not None and qm.message is not message:  # leftovers of an earlier run
            queue.delivered(qm, True, True)
            qm = queue.get()
        if qm is None:
            return _failed({"reason": "aliveness-test message not received"})
        queue.delivered(qm, True, True)
    except AMQPError as err:
        if err.code == 403:  # as RabbitMQ's channel: refused, not failed
            raise ApiError(401, "not_authorised", err.reply_text) from None
        return _failed({"reason": err.reply_text})
    broker.flush_definitions()
    return json_response(OK)
