"""`warren server`: run the broker in the foreground."""

import argparse
import asyncio
import functools
import gc
import json
import logging
import os
import resource
import signal
import socket
import sys
import time

from ..amqp import codec
from ..broker import definitions, parameters, static_shovel
from ..broker.broker import Broker, default_definitions
from ..broker.node_config import Limits, NodeConfig
from ..server.disk_monitor import DEFAULT_LIMIT, DiskMonitor
from ..spark import pipeline
from ..server.listener import LOOPBACK, Listen, Server
from ..server.memory_monitor import DEFAULT_PAGING_RATIO, DEFAULT_WATERMARK, MemoryMonitor
from ..server.tls import HANDSHAKE_TIMEOUT, TLSError, server_context
from ..store.definitions import DefinitionsFile
from ..store.persister import Persister
from .config import ConfigError, load_config
from . import local_cluster, logs
from .local import DATA_DIR_ENV, DEFAULT_DATA_DIR, control_socket

log = logging.getLogger("warren")



def _port_or_zero(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got '{text}'")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warren", description="Warren AMQP 0-9-1 broker")
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("server", help="run the broker in the foreground")
    server.add_argument("--host", action="append", default=None, metavar="ADDRESS",
                        help="address to listen on for AMQP; repeat it or separate addresses with commas "
                             "to listen on several (default: the config file's listeners.tcp.* addresses, "
                             "else both loopbacks, 127.0.0.1 and ::1 when the machine has IPv6)")
    server.add_argument("--port", type=int, default=None,
                        help="AMQP port, for every address (default: the config file's listeners.tcp.*, "
                             "else 5672)")
    server.add_argument("--data-dir", default=os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR,
                        help="directory for definitions, messages and warrenctl's control socket "
                             f"(default ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR})")
    server.add_argument("--node-name", default=os.environ.get("RABBITMQ_NODENAME"), metavar="NAME",
                        help="the node's name, name@host as RabbitMQ's (a name without @ gets this "
                             "machine's short host name); default $RABBITMQ_NODENAME, else warren@localhost")
    server.add_argument("--config", default=None, metavar="FILE",
                        help="RabbitMQ config file: rabbitmq.conf's 'key = value' format, or the classic "
                             "Erlang-term format (a *.config file, or one starting with '['); "
                             "the flags here override its settings")
    server.add_argument("--management-port", type=int, default=None, metavar="PORT",
                        help="port of the management HTTP API (default: the config file's management.tcp.port, "
                             "else 15672; 0 disables it); it listens on 127.0.0.1 unless management.tcp.ip says")
    server.add_argument("--prometheus-port", type=_port_or_zero, default=None, metavar="PORT",
                        help="port of the Prometheus metrics (/metrics, /metrics/per-object; default: the config "
                             "file's prometheus.tcp.port, else 15692, skipped (logged) if that one is taken; "
                             "0 turns them off); it listens on 127.0.0.1 unless prometheus.tcp.ip says")
    server.add_argument("--queue-window", type=int, default=None, metavar="N",
                        help="ready messages a queue keeps in memory at most; it pages to disk before "
                             "that when memory passes the paging ratio of the watermark (default: the "
                             "config file's warren.queue_window, else 32768)")
    server.add_argument("--definitions", default=None, help="RabbitMQ definitions JSON to load at start")
    server.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                        help="least severe level logged to the console (default: the config file's "
                             "log.console.level, else info); the config file's log.* keys set the rest")
    pipeline.add_parser(sub)
    local_cluster.add_parser(sub)
    return parser


def _describe_counts(counts: dict) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _recover_definitions(broker: Broker, store, config: dict) -> list:
    """Give the broker the definitions saved in the data dir, or, on the first start (no saved
    definitions), the default user and vhost, as RabbitMQ creates them only then. A cluster
    member's first start creates nothing here: it gets the cluster's definitions from the
    cluster's log, and the defaults are what it writes there if the log is empty (returned)."""
    broker.metadata.disk = store
    started = time.monotonic()
    saved = store.load() if store is not None else None
    if saved is None:
        user, vhost = config.get("default_user", "guest"), config.get("default_vhost", "/")
        defaults = default_definitions(user, config.get("default_pass", "guest"), vhost,
                                       config.get("default_user_tags", ("administrator",)),
                                       config.get("default_permissions", (".*", ".*", ".*")))
        if "cluster" in config:
            return defaults
        for command in defaults:
            broker.metadata.apply(command)
        if store is not None:
            log.info("no saved definitions in %s: created the default user '%s' and vhost '%s'",
                     store.dir, user, vhost)
        return []
    skipped = []

    def skip(kind, item, message):
        skipped.append(kind)
        log.error("cannot recover one of the %s in %s (%s): %s", kind, store.path, message,
                  json.dumps(item)[:500])

    counts = definitions.load(broker, saved, on_error=skip)
    broker.metadata.revision = definitions.cluster_revision(saved)
    log.info("recovered definitions from %s in %.2f s: %s", store.path, time.monotonic() - started,
             _describe_counts(counts))
    if skipped:
        log.error("skipped %d definitions that could not be recovered", len(skipped))
    broker.metadata.recovered(complete=not skipped)
    return []


async def _flush_definitions_periodically(broker, interval: float = 0.5) -> None:
    """Replies flush the definitions before they go out; this catches changes that no reply
    follows (nowait methods, auto-delete after a connection drops)."""
    while True:
        await asyncio.sleep(interval)
        broker.metadata.flush()


async def _serve(server, broker) -> None:
    flusher = None
    if broker.metadata.disk is not None:
        flusher = asyncio.get_running_loop().create_task(_flush_definitions_periodically(broker))
    try:
        await server.serve()
    finally:
        if flusher is not None:
            flusher.cancel()
        broker.metadata.flush()


def _listen_addresses(hosts: list[str] | None, port: int | None, config: dict) -> list[Listen]:
    """Where to listen for AMQP: --host and --port win over the config file's listeners; an
    entry with a port but no address means the loopbacks, where ::1 is optional (a machine
    without IPv6 still starts)."""
    if "listeners" in config:
        entries = list(config["listeners"])
    else:
        entries = [(config.get("host"), config.get("port", 5672))]
    names = [h.strip() for arg in hosts or () for h in arg.split(",") if h.strip()]
    if names:
        entries = [(h, port if port is not None else entries[0][1]) for h in names]
    elif port is not None:
        entries = [(h, port) for h, _ in entries]
    out: list[Listen] = []
    for host, p in entries:
        for listen in ([Listen(host, p)] if host is not None else
                       [Listen(d.host, p, d.optional) for d in LOOPBACK]):
            if all((listen.host, listen.port) != (o.host, o.port) for o in out):
                out.append(listen)
    return out


def _tls_listen(config: dict, context) -> list[Listen]:
    """The AMQPS listeners (listeners.ssl.*): an entry with a port alone means the loopbacks,
    as for listeners.tcp.*."""
    out: list[Listen] = []
    for host, port in config.get("ssl_listeners", ()):
        for listen in ([Listen(host, port, tls=context)] if host is not None else
                       [Listen(d.host, port, d.optional, tls=context) for d in LOOPBACK]):
            if all((listen.host, listen.port) != (o.host, o.port) for o in out):
                out.append(listen)
    return out


def _node_name(name: str | None) -> str:
    """As RabbitMQ: a name without a host part gets this machine's short host name."""
    if not name:
        return NodeConfig.node_name
    return name if "@" in name else f"{name}@{socket.gethostname().split('.')[0]}"


def _cluster(broker: Broker, cluster: dict | None, listen: list[Listen], seed: list):
    """A cluster member's services (warren.cluster): its membership, its node links (to the
    queues of other members, and theirs to its own), the metadata log every change of
    metadata goes through, its replicated queues and which shovels and federation links it
    runs; None for a node alone."""
    if cluster is None:
        return None
    from ..cluster.config import ClusterConfig
    from ..cluster.etcd import Etcd
    from ..cluster.link_owners import LinkOwners
    from ..cluster.membership import Membership
    from ..cluster.metadata_log import MetadataLog
    from ..cluster.node_links import NodeLinks, advertised_host
    from ..cluster.replicas import Replicas
    config = ClusterConfig(broker.config.node_name, tuple(cluster["endpoints"]),
                           **{k: cluster[k] for k in ("key_prefix", "cluster_name", "node_ttl", "history")
                              if k in cluster})
    amqp = [entry for entry in listen if entry.tls is None] or listen
    # RabbitMQ's distribution port: the AMQP port + 20000 unless configured.
    dist_port = cluster.get("dist_port", amqp[0].port + 20000)
    if not 0 < dist_port < 65536:
        raise SystemExit(f"warren: the node links' port {dist_port} (the AMQP port + 20000) is not a port: "
                         "set distribution.listener.port_range.min and .max")
    dist_host = amqp[0].host
    identity = {"processors": os.cpu_count() or 1,
                "amqp": [[entry.host, entry.port] for entry in listen if entry.tls is None],
                "dist": [advertised_host(dist_host, broker.config.node_name), dist_port]}
    etcd = Etcd(list(config.endpoints))
    persister = broker.persister
    membership = Membership(config, etcd, identity, broker.config, broker.alarms,
                            None if persister is None else persister.stalled)
    links = broker.node_links = NodeLinks(config, etcd, membership, broker, dist_host, dist_port)
    replicas = broker.metadata.replicas
    assert isinstance(replicas, Replicas)  # (made before the definitions' recovery)
    replicas.links = links
    metadata_log = MetadataLog(config, etcd, broker.metadata, seed)
    metadata_log.replicated = links.replicated
    metadata_log.compacts = lambda: min(membership.running, default=None) == config.node_name
    owners = broker.link_owners = LinkOwners(config, etcd, lambda node: links.peer(node).up)
    links.on_peer_lost.append(owners.peer_lost)
    return membership, links, metadata_log, replicas, owners


def _raise_open_files_limit() -> None:
    """Each connection holds a file descriptor and each queue segment two: allow as many as
    the system lets us (with a data directory or without one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "pipeline":
        return pipeline.run(args)
    if args.command == "local-cluster":
        return local_cluster.run(args)
    codec.allow_nesting()  # field tables as deep as the wire accepts survive every later walk
    # A write past a file-size limit must fail with EFBIG (and nack its publishes), not kill us.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    warnings: list[str] = []
    try:
        config = load_config(args.config, warnings) if args.config else {}
    except ConfigError as err:
        for line in err.errors:
            print(f"warren: {line}", file=sys.stderr)
        return 2
    # Command-line flags win over the config file.
    try:
        logs.configure(config, logs.LEVELS[args.log_level] if args.log_level else None)
    except logs.LogSetupError as err:
        print(f"warren: {err}", file=sys.stderr)
        return 2
    for message in warnings:
        log.warning("%s", message)
    limits = Limits(**{k: config[k] for k in ("channel_max", "frame_max", "heartbeat", "max_message_size",
                                              "handshake_timeout", "consumer_timeout") if k in config})
    store = None
    if args.data_dir:
        try:
            os.makedirs(args.data_dir, exist_ok=True)
        except OSError as err:
            print(f"warren: cannot create data directory {args.data_dir}: {err}", file=sys.stderr)
            return 1
        store = DefinitionsFile.in_dir(args.data_dir)
    broker = Broker(NodeConfig(node_name=_node_name(args.node_name), limits=limits,
                               cluster_name=config.get("cluster_name")))
    if args.data_dir:
        # Before definitions are recovered, so durable queues recover their messages too.
        broker.persister = Persister(args.data_dir, window=args.queue_window or config.get("queue_window"))
    _raise_open_files_limit()
    if "cluster" in config:  # (before recovery: a member's definitions hold other nodes' queues)
        from ..cluster.remote_queue import RemoteQueue
        broker.metadata.stand_in = functools.partial(RemoteQueue.stand_in, broker)
        from ..cluster.replicas import Replicas
        broker.metadata.replicas = Replicas(broker)
    seed = _recover_definitions(broker, store, config)
    if "loopback_users" in config:
        broker.config.loopback_users = config["loopback_users"]
    broker.config.auth_mechanisms = config.get("auth_mechanisms", broker.config.auth_mechanisms)
    broker.config.ssl_cert_login_from = config.get("ssl_cert_login_from", broker.config.ssl_cert_login_from)
    # The TLS contexts now: a certificate that cannot be used stops the start with its reason.
    try:
        amqps = server_context(config["ssl_options"]) if "ssl_listeners" in config else None
        https_options = config.get("management_ssl")
        https_context = server_context(https_options, "management.ssl") if https_options else None
    except TLSError as err:
        print(f"warren: {err}", file=sys.stderr)
        return 2
    boot_definitions = None  # (a cluster member's: imported through the cluster's log once it runs)
    if args.definitions:
        try:
            with open(args.definitions) as f:
                boot_definitions = json.load(f)
            if "cluster" not in config:
                counts = definitions.load(broker, boot_definitions)
                log.info("imported definitions from %s: %s", args.definitions, _describe_counts(counts))
        except (OSError, ValueError) as err:
            print(f"warren: cannot load definitions {args.definitions}: {err}", file=sys.stderr)
            return 2
    # The permanent id (Prometheus's rabbitmq_cluster_permanent_id), saved with the definitions;
    # a cluster's first member writes it to the cluster's log with the defaults.
    if "cluster" not in config:
        parameters.permanent_cluster_id(broker)
    elif seed:
        seed.append(parameters.new_cluster_id_command())
    if broker.persister is not None:
        broker.persister.clean_start((v.name, q.name) for v in broker.vhosts.values()
                                     for q in v.queues.values() if q.durable)
    # (A member's snapshot always: what it applies from the cluster's log is journaled after it.)
    if store is not None and (broker.metadata.dirty or "cluster" in config):
        try:
            store.save(definitions.export(broker))
        except OSError as err:
            print(f"warren: cannot write definitions to {store.path}: {err}", file=sys.stderr)
            return 1
        broker.metadata.flushed()
    # The config file's shovels; they start with the dynamic ones once the server's loop runs.
    broker.static_shovels = static_shovel.create(broker, config.get("static_shovels", {}))
    listen = _listen_addresses(args.host, args.port, config) + _tls_listen(config, amqps)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    # What exists at start-up stays out of every collection (the thresholds: warren.server.memory).
    gc.freeze()
    # As RabbitMQ: with management.ssl.* and no management.tcp.*, the API is on HTTPS only.
    management_port = args.management_port if args.management_port is not None else config.get(
        "management_port", 0 if https_options else 15672)
    # The resource alarms first: they are on before the API answers and a client connects.
    memory = MemoryMonitor(broker, config.get("vm_memory_high_watermark", DEFAULT_WATERMARK),
                           paging_ratio=config.get("vm_memory_high_watermark_paging_ratio", DEFAULT_PAGING_RATIO))
    services: list = [memory, DiskMonitor(broker, args.data_dir or os.getcwd(),
                                          config.get("disk_free_limit", DEFAULT_LIMIT), memory.total_memory)]
    # A cluster's member (cluster_formation.peer_discovery_backend = etcd) joins it through etcd.
    cluster = _cluster(broker, config.get("cluster"), listen, seed)
    membership = None
    if cluster is not None:
        membership = cluster[0]
        services.extend(cluster)
        if args.definitions:
            from ..cluster.boot_definitions import BootDefinitions
            services.append(BootDefinitions(broker, args.definitions, boot_definitions))
    # The API over TCP (unless its port is 0) and, with a data dir, on warrenctl's control
    # socket there (even with the TCP port off: rabbitmqctl needs no management plugin).
    socket_path = control_socket(args.data_dir) if args.data_dir else None
    if management_port or socket_path or https_options:
        from ..mgmt.app import HTTPS, MAX_BODY_SIZE, ManagementService  # aiohttp is loaded only when the API is on
        https = None
        if https_options and https_context is not None:
            https = HTTPS(https_options.get("ip", config.get("management_host", "127.0.0.1")),
                          https_options["port"], https_context, https_options)
        services.append(ManagementService(config.get("management_host", "127.0.0.1"), management_port or None,
                                          socket_path, https=https,
                                          max_body_size=config.get("management_max_body_size", MAX_BODY_SIZE),
                                          membership=membership))
        if cluster is not None:  # the other members' listings of this node's connections, channels, consumers
            from ..mgmt import peers
            cluster[1].records_source = peers.source(broker)
    prometheus_port = args.prometheus_port if args.prometheus_port is not None else config.get("prometheus_port")
    if prometheus_port != 0:
        from ..mgmt.prometheus import DEFAULT_PORT, PrometheusService
        # The default port is a convenience: taken (another broker on this machine), no metrics.
        services.append(PrometheusService(config.get("prometheus_host", "127.0.0.1"), prometheus_port or DEFAULT_PORT,
                                          config.get("prometheus_per_object", False),
                                          required=prometheus_port is not None))
    server = Server(broker, services=services, listen=listen,
                    tls_handshake_timeout=config.get("ssl_handshake_timeout", HANDSHAKE_TIMEOUT))
    server.tls_options = config.get("ssl_options", {}) if amqps is not None else {}
    try:
        asyncio.run(_serve(server, broker))
    except OSError as err:
        print(f"warren: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
