"""Health checks: /api/healthchecks/node, /api/health/checks/*, /api/aliveness-test/{vhost},
with RabbitMQ 3.10's answers (200 {"status":"ok"}; 503 {"status":"failed", ...}).

/api/healthchecks/alarms is Warren's alias of /api/health/checks/alarms (the name the issue
uses; RabbitMQ 3.10 only has the latter)."""

import datetime

from aiohttp import web

from ...amqp.properties import encode_header
from ...broker import ops, x509
from ...broker.errors import AMQPError
from ...cluster import queue_members
from ..access import ANY, VHOST, access
from .. import changes
from .. import stats
from ..app import ApiError, bad_request, json_response, not_found
from ..resources import actor, check_vhost_access
from .overview import listeners

routes = web.RouteTableDef()

OK = {"status": "ok"}
ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"
TIME_UNITS = ("days", "weeks", "months", "years")
# RabbitMQ's seconds per unit (a month is a twelfth of 365 days).
_UNIT_SECONDS = {"days": 86400, "weeks": 86400 * 7, "months": 86400 * 365 / 12, "years": 86400 * 365}
# RabbitMQ's other names of the protocols Warren listens for (rabbit_mgmt_wm_health_check_protocol_listener).
_PROTOCOL_NAMES = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
                   "amqps": "amqp/ssl", "http1": "http", "http1.1": "http", "http_api": "http",
                   "management": "http", "management_ui": "http", "ui": "http"}


def _failed(data: dict) -> web.Response:
    return json_response(dict({"status": "failed"}, **data), status=503)


# The resources as rabbit_alarm:format_as_map names them in the health checks.
_RESOURCE_NAMES = {"memory": "memory", "disk": "disk space"}


def _alarms_check(in_alarm: list[tuple[str, str]], where: str) -> web.Response:
    if not in_alarm:
        return json_response(OK)
    return _failed({"alarms": [{"node": node, "resource": _RESOURCE_NAMES.get(r, r)} for node, r in in_alarm],
                    "reason": f"There are alarms in effect {where}"})


def _cluster_check(request) -> web.Response:
    """Every running node's alarms (the cluster's other members' from their running records)."""
    return _alarms_check(stats.cluster_alarms(request.app["broker"]), "in the cluster")


@routes.get("/api/health/checks/alarms")
@access(ANY)
async def alarms(request):
    return _cluster_check(request)


@routes.get("/api/healthchecks/alarms")
@access(ANY)
async def alarms_alias(request):
    return _cluster_check(request)


@routes.get("/api/health/checks/local-alarms")
@access(ANY)
async def local_alarms(request):
    broker = request.app["broker"]
    node = stats.node_name(broker)
    return _alarms_check([(node, r) for r in stats.alarms(broker)], "on the node")


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
    """This node's quorum queues that would lose their quorum if it stopped
    (warren.cluster.queue_members, as rabbit_quorum_queue:list_with_minimum_quorum_for_cli)."""
    broker = request.app["broker"]
    if queue_members.single_node_cluster(broker):
        return json_response({"status": "ok", "reason": "single node cluster"})
    critical = queue_members.quorum_critical(broker)
    if not critical:
        return json_response(OK)
    return _failed({"reason": "There are quorum queues that would lose their quorum if the target node is shut down",
                    "queues": [{"readable_name": q.describe(), "name": q.name, "virtual_host": q.vhost.name,
                                "type": "quorum"} for q in critical]})


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
        within = int(request.match_info["within"])
    except ValueError:
        raise bad_request("Invalid value for 'within'") from None
    deadline = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
        seconds=within * _UNIT_SECONDS[request.match_info["unit"]])
    expiring = [entry for entry in _tls_listener_expiry(request, deadline) if entry is not None]
    if expiring:
        return _failed({"reason": "Certificates expiring", "expired": expiring})
    return json_response(OK)


def _tls_listener_expiry(request, deadline: datetime.datetime) -> list:
    """As RabbitMQ: for each AMQPS listener whose certfile or cacertfile holds a certificate
    that expires before `deadline`, the files and those certificates' expiry times."""
    server = request.app["server"]
    options = getattr(server, "tls_options", {})
    out: list = []
    for host, port in getattr(server, "tls_addresses", ()):
        dates = {name: _expiring(options.get(name), deadline) for name in ("certfile", "cacertfile")}
        if not any(dates.values()):
            out.append(None)
            continue
        out.append({"node": stats.node_name(request.app["broker"]), "protocol": "amqp/ssl", "interface": host,
                    "port": port, "certfile": options.get("certfile"), "cacertfile": options.get("cacertfile"),
                    "certfile_expires_on": dates["certfile"], "cacertfile_expires_on": dates["cacertfile"]})
    return out


def _expiring(path: str | None, deadline: datetime.datetime) -> list:
    """The expiry times ("2026-11-30 8:10:05", as RabbitMQ writes them) of the certificates in
    a PEM file that expire before `deadline`."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            certificates = x509.pem_certificates(f.read())
        ends = [x509.not_after(der) for der in certificates]
    except (OSError, x509.CertificateError) as err:
        return [f"cannot read {path}: {err}"]
    return [f"{t.year}-{t.month:02}-{t.day:02} {t.hour}:{t.minute:02}:{t.second:02}" for t in ends if t < deadline]


def _listeners(request) -> list:
    """(protocol, port) of every listener, as GET /api/overview lists them."""
    if request.app["server"] is not None:
        return list(dict.fromkeys((entry["protocol"], entry["port"]) for entry in listeners(request)))
    out = []
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
    protocols = list(dict.fromkeys(p for p, _ in _listeners(request)))
    # RabbitMQ accepts the protocol's other names too (amqp091, amqps ...) and answers with
    # the listener's name.
    wanted = _PROTOCOL_NAMES.get(protocol.lower(), protocol.lower())
    if wanted in protocols:
        return json_response({"status": "ok", "protocol": wanted})
    return _failed({"reason": "No active listener", "missing": wanted, "protocols": protocols})


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
        await changes.perform(request, lambda: ops.declare_queue.change(who, ALIVENESS_QUEUE))
        message, _, _ = ops.publish(who, "", ALIVENESS_QUEUE, route, encode_header(len(ALIVENESS_BODY), {}),
                                    ALIVENESS_BODY)
        queue = ops.readable_queue(who, ALIVENESS_QUEUE)
        if queue.remote:  # (on a cluster it lives on the node that declared it first)
            # The publish and the gets go to its home in order: ours is the last message there.
            qm = got = None
            while (got := (await changes.answer(lambda done: queue.get_async(True, done)))[0]) is not None:
                qm = got
        else:
            _, qm = ops.get(who, ALIVENESS_QUEUE, no_ack=True)
            while qm is not None and qm.message is not message:  # leftovers of an earlier run
                _, qm = ops.get(who, ALIVENESS_QUEUE, no_ack=True)
        if qm is None:
            return _failed({"reason": "aliveness-test message not received"})
    except AMQPError as err:
        if err.code == 403:  # as RabbitMQ's channel: refused, not failed
            raise ApiError(401, "not_authorised", err.reply_text) from None
        return _failed({"reason": err.reply_text})
    except ApiError as err:  # (what a cluster does not do yet, or its etcd not answering)
        return _failed({"reason": err.reason})
    broker.metadata.flush()
    return json_response(OK)
