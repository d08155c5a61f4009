"""/api/overview (with /api/whoami and /api/cluster-name): the broker at a glance, in the
shape of RabbitMQ 3.10's management API.

PUT /api/cluster-name renames the broker as RabbitMQ does (its cluster_name global runtime
parameter): the overview and new connections' server properties show the name, and it is
kept in the definitions, so across a restart.

Versions: product_name "Warren" and product_version / warren_version are Warren's own;
rabbitmq_version and management_version say "3.10.8", the RabbitMQ release whose API and
behaviour Warren follows, so clients that check the broker's version keep working.
"""

import platform

from aiohttp import web

from ...broker.metadata.commands import CLUSTER_NAME, SetGlobalParameter
from ... import __version__
from ...broker.exchanges import TYPES
from ..access import ADMIN, ANY, access, is_monitor, visible_vhosts
from .. import changes, peers
from .. import stats
from ..resources import flush, item_response, read_body, require
from ..app import bad_request, json_response
from ..node_resources import resource_figures

routes = web.RouteTableDef()

RABBITMQ_VERSION = "3.10.8"

EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
    "x-consistent-hash": "Consistent Hashing Exchange",
    "x-federation-upstream": "Federation upstream helper exchange",
}
# The types a plugin declares for its own use (rabbit_federation_upstream_exchange:description).
INTERNAL_PURPOSES = {"x-federation-upstream": "federation"}


def exchange_types() -> list:
    return [{"description": EXCHANGE_TYPE_DESCRIPTIONS.get(name, ""), "enabled": True, "name": name,
             **({"internal_purpose": INTERNAL_PURPOSES[name]} if name in INTERNAL_PURPOSES else {})}
            for name in sorted(TYPES)]


def listeners(request) -> list:
    """As RabbitMQ: one entry per address and port listened on (AMQP on each address bound,
    e.g. 127.0.0.1 and ::1), then the API's, then the Prometheus endpoint's. warrenctl's
    control socket is not one (RabbitMQ lists no CLI entry but its Erlang distribution port,
    which Warren has not). In a cluster, then every other running node's AMQP listeners, as
    its running record gives them (warren.cluster.membership)."""
    broker = request.app["broker"]
    server = request.app["server"]
    node = stats.node_name(broker)
    out: list[dict] = []
    if server is not None:
        addresses = server.addresses or [(server.host, server.port)]
        out.extend({"ip_address": host, "node": node, "port": port, "protocol": "amqp", "socket_opts": {}}
                    for host, port in addresses)
        # The TLS listeners, with their ssl_options as RabbitMQ shows them (not the password).
        tls_opts = tls_socket_opts(getattr(server, "tls_options", {}))
        out.extend({"ip_address": host, "node": node, "port": port, "protocol": "amqp/ssl", "socket_opts": tls_opts}
                    for host, port in getattr(server, "tls_addresses", ()))
        port = _management_port(request)
        if port:
            out.append({"ip_address": _management_host(request), "node": node,
                        "port": port, "protocol": "http", "socket_opts": {}})
        https = getattr(request.app["management"], "https", None)
        if https is not None:
            out.append({"ip_address": https.host, "node": node, "port": https.port, "protocol": "https",
                        "socket_opts": {"port": https.port, "ssl": True, "ssl_opts": tls_socket_opts(https.options)}})
        for service in getattr(server, "services", ()):
            if getattr(service, "listening", False):  # the Prometheus endpoint (warren.mgmt.prometheus)
                out.append({"ip_address": service.host, "node": node, "port": service.port,
                            "protocol": "http/prometheus", "socket_opts": {}})
    membership = request.app["membership"]
    if membership is not None:
        for other, record in sorted(membership.running.items()):
            if other != node:
                out.extend({"ip_address": host, "node": other, "port": port, "protocol": "amqp", "socket_opts": {}}
                           for host, port in _addresses(record.get("amqp")))
    return out


def _addresses(value) -> list[tuple[str, int]]:
    """A running record's [[host, port], ...], what of it is well formed (another node wrote it)."""
    if not isinstance(value, list):
        return []
    return [(entry[0], entry[1]) for entry in value
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
            and isinstance(entry[1], int) and not isinstance(entry[1], bool)]


def tls_socket_opts(options: dict) -> dict:
    """A TLS listener's options as the listeners show them: the files, verify,
    fail_if_no_peer_cert and versions given (never the key's password)."""
    return {k: v for k, v in options.items() if k in ("cacertfile", "certfile", "keyfile", "verify",
                                                      "fail_if_no_peer_cert", "versions")}


def _management_port(request):
    """The API's plain HTTP port (None if it listens on the control socket only)."""
    service = request.app["management"]
    if request.secure and service is not None:  # asked over HTTPS
        return service.port
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sockname, tuple):  # asked over TCP (over the control socket: a path)
        return sockname[1]
    service = request.app["management"]
    return service.port if service is not None else None


def _management_host(request) -> str:
    service = request.app["management"]
    return service.host if service is not None else "127.0.0.1"


def contexts(request) -> list:
    return [{"description": "RabbitMQ Management", "ip": _management_host(request),
             "node": stats.node_name(request.app["broker"]), "path": "/",
             "port": str(_management_port(request)), "ssl_opts": []}]


async def _own_totals(request, user) -> dict:
    """What a user without the monitoring tag sees of the totals, as RabbitMQ: queues and
    exchanges of the vhosts they have permissions in, their own connections and channels
    (on every cluster member), no consumer count."""
    broker = request.app["broker"]
    vhosts = [broker.vhosts[name] for name in visible_vhosts(request, user)]
    queues = [q for v in vhosts for q in v.queues.values()]
    ready, unacked = stats.message_totals(queues)
    conns = await peers.listing(request, peers.CONNECTIONS, {"user": user.name})
    return {
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked},
        "object_totals": {"channels": sum(c["channels"] for c in conns), "connections": len(conns),
                          "exchanges": sum(len(v.exchanges) for v in vhosts), "queues": len(queues)},
    }


@routes.get("/api/overview")
@access(ANY)
async def overview(request):
    """The whole node for monitoring users and administrators; the others (as RabbitMQ) see
    no node, listeners or contexts, and totals of their own vhosts and connections only."""
    broker = request.app["broker"]
    data = {
        "cluster_name": broker.cluster_name,
        "contexts": contexts(request),
        "disable_stats": False,
        "enable_queue_totals": False,
        "exchange_types": exchange_types(),
        "listeners": listeners(request),
        "management_version": RABBITMQ_VERSION,
        "message_stats": stats.overview_message_stats(broker),
        "node": stats.node_name(broker),
        "object_totals": stats.object_totals(broker, await peers.cluster_totals(request)),
        "product_name": "Warren",
        "product_version": __version__,
        "queue_totals": stats.queue_totals(broker),
        "rabbitmq_version": RABBITMQ_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600],
                                      "detailed": [600]},
        "statistics_db_event_queue": 0,
        "warren_version": __version__,
        "python_version": platform.python_version(),
    }
    # Beyond RabbitMQ's overview (the issue asks for them here too): the node's memory and
    # disk figures and alarms, as /api/nodes gives them; for monitoring users, as the node.
    user = request["user"]
    if is_monitor(user):
        data.update(resource_figures(request))
    else:
        for key in ("contexts", "listeners", "node"):
            del data[key]
        data.update(await _own_totals(request, user))
    return item_response(request, data)


@routes.get("/api/whoami")
@access(ANY)
async def whoami(request):
    user = request["user"]
    return json_response({"name": user.name, "tags": list(user.tags)})


@routes.get("/api/cluster-name")
@access(ANY)
async def get_cluster_name(request):
    return json_response({"name": request.app["broker"].cluster_name})


@routes.put("/api/cluster-name")
@access(ADMIN)
async def put_cluster_name(request):
    """204 whether or not the name changes, as RabbitMQ; any string, even empty. RabbitMQ
    crashes (500) on a name that is not a string; Warren refuses it with a 400."""
    body = await read_body(request)
    require(body, "name")
    name = body["name"]
    if not isinstance(name, str):
        raise bad_request("name must be a string")
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON allows "\ud800"): not a text to send
        raise bad_request("name must be valid unicode") from None
    await changes.apply(request, SetGlobalParameter(CLUSTER_NAME, name))
    flush(request)
    return web.Response(status=204)
