"""Prometheus metrics with the names, types, help texts and labels of RabbitMQ 3.10.8's
rabbitmq_prometheus plugin, built from the broker at scrape time.

Nothing here runs on the message path: a scrape reads the counters the model keeps anyway
(warren.broker.stats: per queue, exchange and channel, the node's events, and what deleted
queues and exchanges and closed channels and connections had counted) and the figures the
management API shows (memory and disk from the server's monitors, alarms). Every metric is
a real reading: a number Warren does not have is left out (docs/prometheus.md, "What Warren
leaves out"), never given as a constant.

Two endpoints, as the plugin's two registries:

- `/metrics` (per_object False): one unlabelled sample per queue, channel and connection
  metric, the sum over every object. Where RabbitMQ sums only the objects still open (its
  channel and connection counters fall when one closes), Warren's counters also keep what
  the deleted and closed ones counted, so they only grow, as a Prometheus counter must.
- `/metrics/per-object`: a sample per queue ({vhost, queue}), per channel ({channel}) and per
  connection (also {channel}, as RabbitMQ 3.10.8 labels it), no alarms and no process
  metrics (the plugin registers its alarm and process collectors for /metrics only).
  RabbitMQ's per-object message counters of a channel are split by exchange or queue
  ({channel, vhost, exchange} / {channel, vhost, queue}); Warren counts per channel only, so
  they are left out there.

A scrape is `read()` (every number, as plain values, on the broker's loop) then `families()`
(the prometheus_client metric families, anywhere): `endpoints(server)` gives the two
Endpoints, whose read() returns a registry for prometheus_client's generate_latest, which
warren.mgmt.prometheus runs in a thread. The process collector adds
process_cpu_seconds_total, process_start_time_seconds, ... to /metrics.
"""

from __future__ import annotations

import operator
import os
import platform
import time
from dataclasses import dataclass
from functools import cache
from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from .. import __version__
from ..broker import queues
from ..broker.alarms import DISK, MEMORY
from ..broker.parameters import permanent_cluster_id
from ..broker.records import ChannelInfo
from ..broker.stats import CHANNEL_COUNTERS, CONNECTION_COUNTERS, DELIVER_GET, RECEIVED_CONFIRM
from ..server.disk_monitor import DiskMonitor
from . import stats
from .api.overview import RABBITMQ_VERSION
from .node_resources import data_dir, max_fds, max_tcp_sockets, mem_used, open_fds, service_of

PROTOCOL = "amqp091"
AMQP = {"protocol": PROTOCOL}
# Warren's queue types as RabbitMQ's queue_type label names them, in its order.
QUEUE_TYPES = tuple((name, t.CAPABILITIES.module) for name, t in queues.TYPES.items())

_KINDS = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "untyped": UnknownMetricFamily}


def family(kind: str, name: str, documentation: str, rows: Iterable[tuple[dict[str, str], float]] = ()) -> Metric:
    """One metric family; rows are (labels, value), a labels dict possibly shared by the
    families of one object (10,000 queues make 70,000 samples: add_metric's dict per sample
    costs more than twice as much). A counter's name ends in _total, as RabbitMQ's
    (prometheus_client keeps the family's name without it, and its samples' with it)."""
    metric = _KINDS[kind](name, documentation)
    sample_name = metric.name + "_total" if kind == "counter" else metric.name
    metric.samples.extend(Sample(sample_name, labels, value) for labels, value in rows)
    return metric


NO_LABELS: dict[str, str] = {}


def one(kind: str, name: str, documentation: str, value: float) -> Metric:
    return family(kind, name, documentation, [(NO_LABELS, value)])


def _add(totals: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value


def open_channels(broker) -> list[ChannelInfo]:
    """The records of the channels not closing (a closing one's counters are in the totals)."""
    infos = [ch.info() for conn in list(broker.connections) for ch in list(conn.channels.values())]
    return [info for info in infos if info.state == "running"]


# ------------------------------------------------------------------ node-wide totals
def channel_totals(broker, channels: list[ChannelInfo]) -> dict[str, int]:
    """Every channel's message counters (and its publishes in confirm mode), the closed
    channels' included (`channels`: open_channels(broker))."""
    totals = dict.fromkeys(CHANNEL_COUNTERS + (RECEIVED_CONFIRM,), 0)
    for key, value in broker.stats.message_totals.items():
        if key in totals:
            totals[key] += value
    for ch in channels:
        _add(totals, ch.counters)
        totals[RECEIVED_CONFIRM] += ch.received_confirm
    return totals


# The queue counters the rabbitmq_global_* metrics read.
GLOBAL_QUEUE_COUNTERS = ("ack", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver")


def queue_totals_by_type(broker, queues: list) -> dict[str, dict[str, int]]:
    """GLOBAL_QUEUE_COUNTERS summed per queue type, the deleted queues' included."""
    totals: dict[str, dict[str, int]] = {}
    for kind in {kind for kind, _ in QUEUE_TYPES} | {q.queue_type for q in queues} | set(broker.stats.retired.queues):
        of_kind = [q.stats for q in queues if q.queue_type == kind]
        retired = broker.stats.retired.queues.get(kind, {})
        totals[kind] = {key: retired.get(key, 0) + sum(stats[key] for stats in of_kind)
                        for key in GLOBAL_QUEUE_COUNTERS}
    return totals


def routed_total(broker) -> int:
    """Copies of published messages routed to queues (exchanges' publish_out: one per queue a
    message went to, as RabbitMQ 3.10's messages_routed), deleted exchanges' included."""
    total = broker.stats.retired.exchanges.get("publish_out", 0)
    for vhost in list(broker.vhosts.values()):
        for exchange in vhost.exchanges.values():
            counts = getattr(exchange, "stats", None)
            if counts:
                total += counts.get("publish_out", 0)
    return total


def queue_rows(broker, queues: list, per_object: bool) -> list[tuple[dict[str, str], tuple[float, ...]]]:
    """({vhost, queue}, values in _QUEUE_GAUGES' order) for every queue, counted as the
    management API counts them (a stream's messages are every entry it holds); not per
    object, one row of their sums (and no object made per queue: the scrape of a broker with
    many queues stays short on its loop)."""
    unacked_bytes = stats.unacked_bytes_by_queue(broker)
    rows: list[tuple[dict[str, str], tuple[float, ...]]] = []
    sums = [0] * 7
    for queue in queues:
        store = queue.store
        ready = len(store)
        unacked = queue.unacked_count
        ready_bytes = store.ready_bytes
        held_bytes = unacked_bytes.get(queue, 0) if unacked_bytes else 0
        total = ready + unacked if queue.CAPABILITIES.counts_unacked else ready
        if per_object:
            rows.append(({"vhost": queue.vhost.name, "queue": queue.name},
                         (ready, unacked, total, queue.consumer_count, ready_bytes + held_bytes, ready_bytes,
                          held_bytes)))
        else:
            sums[0] += ready
            sums[1] += unacked
            sums[2] += total
            sums[3] += queue.consumer_count
            sums[4] += ready_bytes + held_bytes
            sums[5] += ready_bytes
            sums[6] += held_bytes
    return rows if per_object else [(NO_LABELS, tuple(sums))]


# ------------------------------------------------------------------------- the node
def disk_free(server, broker) -> int | None:
    """The free space the disk monitor saw last, else read now (None if it cannot be)."""
    monitor = service_of(server, DiskMonitor)
    if monitor is not None and monitor.free is not None:
        return monitor.free
    try:
        st = os.statvfs(data_dir(broker))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@cache
def client_version() -> str:
    from importlib import metadata  # (at the first scrape, not at every start)
    try:
        return metadata.version("prometheus-client")
    except metadata.PackageNotFoundError:
        return ""


@cache
def build_info() -> dict[str, str]:
    """rabbitmq_build_info's labels: RabbitMQ's, with product_name and product_version as a
    node whose product.name and product.version are set has them (Warren's, as in
    /api/overview), the version of the rabbitmq_prometheus plugin whose output this is, no
    Erlang/OTP ("none": an empty value would drop the label), and Python's version beside it."""
    return {"product_name": "Warren", "product_version": __version__, "rabbitmq_version": RABBITMQ_VERSION,
            "prometheus_plugin_version": RABBITMQ_VERSION, "prometheus_client_version": client_version(),
            "erlang_version": "none", "python_version": platform.python_version()}


# ------------------------------------------------------------------------ a reading
# (metric, help, the ChannelInfo field)
_CHANNEL_GAUGES = (
    ("rabbitmq_channel_consumers", "Consumers on a channel", "consumer_count"),
    ("rabbitmq_channel_messages_unacked", "Delivered but not yet acknowledged messages", "unacked"),
    ("rabbitmq_channel_messages_unconfirmed", "Published but not yet confirmed messages", "unconfirmed"),
    ("rabbitmq_channel_messages_uncommitted", "Messages received in a transaction but not yet committed",
     "uncommitted"),
    ("rabbitmq_channel_acks_uncommitted", "Message acknowledgements in a transaction not yet committed",
     "acks_uncommitted"),
    ("rabbitmq_consumer_prefetch", "Limit of unacknowledged messages for each consumer", "prefetch"),
    ("rabbitmq_channel_prefetch", "Total limit of unacknowledged messages for all consumers on a channel",
     "global_prefetch"),
)
_channel_gauges = operator.attrgetter(*(field for _, _, field in _CHANNEL_GAUGES))

_CONNECTION_COUNTERS = (
    ("recv_oct", "rabbitmq_connection_incoming_bytes_total", "Total number of bytes received on a connection"),
    ("send_oct", "rabbitmq_connection_outgoing_bytes_total", "Total number of bytes sent on a connection"),
    ("recv_cnt", "rabbitmq_connection_incoming_packets_total", "Total number of packets received on a connection"),
    ("send_cnt", "rabbitmq_connection_outgoing_packets_total", "Total number of packets sent on a connection"),
)
assert {key for key, _, _ in _CONNECTION_COUNTERS} == set(CONNECTION_COUNTERS)
_connection_counts = operator.attrgetter(*(key for key, _, _ in _CONNECTION_COUNTERS))

Rows = list[tuple[dict[str, str], tuple[float, ...]]]


@dataclass
class Reading:
    """Every number of one scrape, read from the broker on its loop (plain values: the
    metric families are made from it anywhere, a thread included)."""
    node_counters: dict[str, int]
    alarms: tuple[int, int]  # disk, memory
    node: list[tuple[str, str, float]]  # (name, help, value) of the node's gauges that have a value
    queues: Rows  # ({vhost, queue}, values in _QUEUE_GAUGES' order); one row of sums if not per object
    queue_count: int
    channels: Rows  # ({channel}, values in _CHANNEL_GAUGES' order): labels only when per object
    connections: Rows  # ({channel}, values in _CONNECTION_COUNTERS' order + channels)
    retired_connections: dict[str, int]
    channel_totals: dict[str, int]
    by_queue_type: dict[str, dict[str, int]]
    routed: int
    publishers: int
    identity: dict[str, str]


def read(server, per_object: bool) -> Reading:
    broker = server.broker
    channels = list(open_channels(broker))
    # This node's queues (a cluster's other members report theirs, as RabbitMQ's nodes do).
    queues = [queue for vhost in list(broker.vhosts.values()) for queue in vhost.queues.values() if not queue.remote]
    conns = list(broker.connections)
    no_label = NO_LABELS
    node: list[tuple[str, str, float | None]] = [
        ("rabbitmq_process_open_fds", "Open file descriptors", open_fds()),
        # AMQP client sockets, as RabbitMQ's sockets_used (its AMQP connections).
        ("rabbitmq_process_open_tcp_sockets", "Open TCP sockets", len(server.protocols)),
        ("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", mem_used(server)),
        ("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", disk_free(server, broker)),
        ("rabbitmq_process_max_fds", "Open file descriptors limit", max_fds()),
        # (RabbitMQ's limit for that many fds: node_resources.sockets_limit)
        ("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit", max_tcp_sockets()),
        ("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", broker.config.mem_limit),
        # (None while disk monitoring is disabled)
        ("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
         broker.config.disk_free_limit),
        ("rabbitmq_erlang_uptime_seconds", "Node uptime", time.monotonic() - stats.STARTED),
    ]
    return Reading(
        node_counters=dict(broker.stats.node_counters),
        alarms=(int(DISK in broker.alarms), int(MEMORY in broker.alarms)),
        node=[(name, documentation, value) for name, documentation, value in node if value is not None],
        queues=queue_rows(broker, queues, per_object),
        queue_count=len(queues),
        channels=[({"channel": ch.name} if per_object else no_label, _channel_gauges(ch)) for ch in channels],
        # Labelled "channel", as RabbitMQ 3.10.8 labels a connection's metrics (by its pid).
        connections=[({"channel": conn.connection_link().name} if per_object else no_label,
                      _connection_counts(conn.counters()) + (len(conn.channels),))
                     for conn in conns],
        retired_connections=dict(broker.stats.retired.connections),
        channel_totals=channel_totals(broker, channels),
        by_queue_type=queue_totals_by_type(broker, queues),
        routed=routed_total(broker),
        publishers=sum(1 for ch in channels if ch.counters["publish"]),
        identity={"rabbitmq_node": stats.node_name(broker), "rabbitmq_cluster": broker.cluster_name,
                  "rabbitmq_cluster_permanent_id": permanent_cluster_id(broker)},
    )


# ---------------------------------------------------------------------- the families
_CHURN = (
    ("connections_opened", "rabbitmq_connections_opened_total", "Total number of connections opened"),
    ("connections_closed", "rabbitmq_connections_closed_total", "Total number of connections closed or terminated"),
    ("channels_opened", "rabbitmq_channels_opened_total", "Total number of channels opened"),
    ("channels_closed", "rabbitmq_channels_closed_total", "Total number of channels closed"),
    ("queues_declared", "rabbitmq_queues_declared_total", "Total number of queues declared"),
    ("queues_created", "rabbitmq_queues_created_total", "Total number of queues created"),
    ("queues_deleted", "rabbitmq_queues_deleted_total", "Total number of queues deleted"),
)

_QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
    ("rabbitmq_queue_messages_bytes", "Size in bytes of ready and unacknowledged messages"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages"),
    ("rabbitmq_queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages"),
)

# (Warren's channel counter, RabbitMQ's metric, its help): the channel_exchange_metrics, then
# the channel_queue_metrics, in the plugin's order.
_CHANNEL_COUNTERS = (
    ("publish", "rabbitmq_channel_messages_published_total",
     "Total number of messages published into an exchange on a channel"),
    ("confirm", "rabbitmq_channel_messages_confirmed_total",
     "Total number of messages published into an exchange and confirmed on the channel"),
    ("return_unroutable", "rabbitmq_channel_messages_unroutable_returned_total",
     "Total number of messages published as mandatory into an exchange and returned to the publisher as "
     "unroutable"),
    ("drop_unroutable", "rabbitmq_channel_messages_unroutable_dropped_total",
     "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ("get", "rabbitmq_channel_get_ack_total",
     "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    ("get_no_ack", "rabbitmq_channel_get_total",
     "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    ("deliver", "rabbitmq_channel_messages_delivered_ack_total",
     "Total number of messages delivered to consumers in manual acknowledgement mode"),
    ("deliver_no_ack", "rabbitmq_channel_messages_delivered_total",
     "Total number of messages delivered to consumers in automatic acknowledgement mode"),
    ("redeliver", "rabbitmq_channel_messages_redelivered_total", "Total number of messages redelivered to consumers"),
    ("ack", "rabbitmq_channel_messages_acked_total", "Total number of messages acknowledged by consumers"),
    ("get_empty", "rabbitmq_channel_get_empty_total", "Total number of times basic.get operations fetched no message"),
)

# (Warren's queue counters, metric, help): rabbitmq_global_* per queue type.
_GLOBAL_BY_QUEUE_TYPE = (
    (("ack",), "rabbitmq_global_messages_acknowledged_total", "Total number of messages acknowledged by consumers"),
    (("deliver_no_ack",), "rabbitmq_global_messages_delivered_consume_auto_ack_total",
     "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment"),
    (("deliver",), "rabbitmq_global_messages_delivered_consume_manual_ack_total",
     "Total number of messages delivered to consumers using basic.consume with manual acknowledgment"),
    (("get_no_ack",), "rabbitmq_global_messages_delivered_get_auto_ack_total",
     "Total number of messages delivered to consumers using basic.get with automatic acknowledgment"),
    (("get",), "rabbitmq_global_messages_delivered_get_manual_ack_total",
     "Total number of messages delivered to consumers using basic.get with manual acknowledgment"),
    (DELIVER_GET, "rabbitmq_global_messages_delivered_total", "Total number of messages delivered to consumers"),
    (("get_empty",), "rabbitmq_global_messages_get_empty_total",
     "Total number of times basic.get operations fetched no message"),
)

_QUEUE_TYPE_LABELS = [(kind, {"protocol": PROTOCOL, "queue_type": label}) for kind, label in QUEUE_TYPES]


def _per_object_or_sum(kind: str, name: str, documentation: str, rows: Rows, i: int, per_object: bool) -> Metric:
    if per_object:
        return family(kind, name, documentation, [(labels, values[i]) for labels, values in rows])
    return one(kind, name, documentation, sum(values[i] for _, values in rows))


def families(r: Reading, per_object: bool, alarms: bool) -> Iterator[Metric]:
    """The metric families of a reading, in the plugin's order."""
    if alarms:
        yield one("untyped", "rabbitmq_alarms_free_disk_space_watermark",
                  "is 1 if free disk space watermark alarm is in effect", r.alarms[0])
        yield one("untyped", "rabbitmq_alarms_memory_used_watermark",
                  "is 1 if VM memory watermark alarm is in effect", r.alarms[1])
    counters = r.node_counters
    for key, name, documentation in _CHURN:
        yield one("counter", name, documentation, counters[key])
    for name, documentation, value in r.node:
        yield one("gauge", name, documentation, value)
    succeeded, failed = counters["auth_attempts_succeeded"], counters["auth_attempts_failed"]
    yield family("counter", "rabbitmq_auth_attempts_total", "Total number of authorization attempts",
                 [(AMQP, succeeded + failed)])
    yield family("counter", "rabbitmq_auth_attempts_succeeded_total",
                 "Total number of successful authentication attempts", [(AMQP, succeeded)])
    yield family("counter", "rabbitmq_auth_attempts_failed_total", "Total number of failed authentication attempts",
                 [(AMQP, failed)])
    for i, (name, documentation) in enumerate(_QUEUE_GAUGES):
        yield _per_object_or_sum("gauge", name, documentation, r.queues, i, per_object)
    for i, (name, documentation, _) in enumerate(_CHANNEL_GAUGES):
        yield _per_object_or_sum("gauge", name, documentation, r.channels, i, per_object)
    totals = r.channel_totals
    if not per_object:  # (per object, RabbitMQ's are per channel and exchange or queue: not Warren's)
        for key, name, documentation in _CHANNEL_COUNTERS:
            yield one("counter", name, documentation, totals[key])
    for i, (key, name, documentation) in enumerate(_CONNECTION_COUNTERS):
        if per_object:
            yield _per_object_or_sum("counter", name, documentation, r.connections, i, True)
        else:
            yield one("counter", name, documentation,
                      r.retired_connections[key] + sum(values[i] for _, values in r.connections))
    yield _per_object_or_sum("gauge", "rabbitmq_connection_channels", "Channels on a connection", r.connections,
                             len(_CONNECTION_COUNTERS), per_object)
    if not per_object:
        yield one("counter", "rabbitmq_queue_messages_published_total", "Total number of messages published to queues",
                  r.routed)
    consumers = sum(values[3] for _, values in r.queues)
    yield one("gauge", "rabbitmq_connections", "Connections currently open", len(r.connections))
    yield one("gauge", "rabbitmq_channels", "Channels currently open", len(r.channels))
    yield one("gauge", "rabbitmq_consumers", "Consumers currently connected", consumers)
    yield one("gauge", "rabbitmq_queues", "Queues available", r.queue_count)
    yield family("untyped", "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info", [(build_info(), 1)])
    yield family("untyped", "rabbitmq_identity_info", "RabbitMQ node & cluster identity info", [(r.identity, 1)])

    by_type = r.by_queue_type

    def by_queue_type(keys, name, documentation):
        rows = [(labels, sum(by_type[kind][key] for key in keys)) for kind, labels in _QUEUE_TYPE_LABELS]
        return family("counter", name, documentation, rows)

    def node(kind, name, documentation, value):
        return family(kind, name, documentation, [(AMQP, value)])

    yield node("gauge", "rabbitmq_global_consumers", "Current number of consumers", consumers)
    yield by_queue_type(*_GLOBAL_BY_QUEUE_TYPE[0])
    yield node("counter", "rabbitmq_global_messages_confirmed_total", "Total number of messages confirmed to publishers",
               totals["confirm"])
    for entry in _GLOBAL_BY_QUEUE_TYPE[1:]:
        yield by_queue_type(*entry)
    yield node("counter", "rabbitmq_global_messages_received_confirm_total",
               "Total number of messages received from publishers expecting confirmations", totals[RECEIVED_CONFIRM])
    yield node("counter", "rabbitmq_global_messages_received_total", "Total number of messages received from publishers",
               totals["publish"])
    yield by_queue_type(("redeliver",), "rabbitmq_global_messages_redelivered_total",
                        "Total number of messages redelivered to consumers")
    yield node("counter", "rabbitmq_global_messages_routed_total",
               "Total number of messages routed to queues or streams", r.routed)
    yield node("counter", "rabbitmq_global_messages_unroutable_dropped_total",
               "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
               totals["drop_unroutable"])
    yield node("counter", "rabbitmq_global_messages_unroutable_returned_total",
               "Total number of messages published as mandatory into an exchange and returned to the publisher as "
               "unroutable", totals["return_unroutable"])
    yield node("gauge", "rabbitmq_global_publishers", "Current number of publishers", r.publishers)


# ------------------------------------------------------------------------ collectors
class Frozen(Collector):
    """The families of one reading (to be written out in a thread)."""

    def __init__(self, reading: Reading, per_object: bool, alarms: bool):
        self.reading, self.per_object, self.alarms = reading, per_object, alarms

    def collect(self) -> Iterator[Metric]:
        return families(self.reading, self.per_object, self.alarms)


class Endpoint:
    """The metrics of one path. `read()`, on the broker's loop (the model has no locks), reads
    the broker and gives a registry that only writes out what was read: per object, 10,000
    queues are 70,000 samples, most of a second of Python to make into text, which can then
    be done in a thread. per_object gives a sample per queue, channel and connection; alarms
    the rabbitmq_alarms_* metrics and process the process collector (RabbitMQ's /metrics has
    both, /metrics/per-object neither)."""

    def __init__(self, server, per_object: bool, alarms: bool = True, process: bool = True):
        self.server = server
        self.per_object = per_object
        self.alarms = alarms
        self.process = ProcessCollector(registry=None) if process else None

    def read(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        if self.process is not None:
            registry.register(self.process)  # (it reads /proc when written out)
        registry.register(Frozen(read(self.server, self.per_object), self.per_object, self.alarms))
        return registry


def endpoints(server, per_object_metrics: bool = False) -> tuple[Endpoint, Endpoint]:
    """(/metrics, /metrics/per-object). With per_object_metrics (RabbitMQ's
    prometheus.return_per_object_metrics) /metrics gives the objects one by one too."""
    return (Endpoint(server, per_object=per_object_metrics),
            Endpoint(server, per_object=True, alarms=False, process=False))
