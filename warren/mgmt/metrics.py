"""Prometheus metrics with the names, types, help texts and labels of RabbitMQ 3.10.8's
rabbitmq_prometheus plugin, built from the broker at scrape time.

Nothing here runs on the message path: a scrape reads the counters the model keeps anyway
(warren.broker.stats: per queue, exchange and channel, the node's events, and what deleted
queues and exchanges and closed channels and connections had counted) and the figures the
management API shows (memory and disk from the server's monitors, alarms). Every metric is
a real reading: a number Warren does not have is left out (README, "Prometheus metrics"),
never given as a constant.

Two collectors, as the plugin's two registries:

- `RabbitMQCollector(server, per_object=False)` is /metrics: one unlabelled sample per queue,
  channel and connection metric, the sum over every object. Where RabbitMQ sums only the
  objects still open (its channel and connection counters fall when one closes), Warren's
  counters also keep what the deleted and closed ones counted, so they only grow, as a
  Prometheus counter must.
- `RabbitMQCollector(server, per_object=True)` is /metrics/per-object: a sample per queue
  ({vhost, queue}), per channel ({channel}) and per connection (also {channel}, as RabbitMQ
  3.10.8 labels it), no alarms (the plugin registers its alarm and process collectors for
  /metrics only). RabbitMQ's per-object message counters of a channel are split by exchange
  or queue ({channel, vhost, exchange} / {channel, vhost, queue}); Warren counts per channel
  only, so they are left out there.

`registries(server, per_object_metrics=False)` gives the two prometheus_client registries
(the first with the process collector: process_cpu_seconds_total, process_start_time_seconds,
...), which warren.mgmt.prometheus serves.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from functools import cache
from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from .. import __version__
from ..broker.alarms import DISK, MEMORY
from ..broker.stats import CHANNEL_COUNTERS, CONNECTION_COUNTERS, RECEIVED_CONFIRM
from ..server.disk_monitor import DiskMonitor
from . import stats
from .api.overview import RABBITMQ_VERSION
from .node_resources import data_dir, mem_used, service_of
from .shapes import channel_name, connection_name

PROTOCOL = "amqp091"
# Warren's queue types as RabbitMQ's queue_type label names them, in its order.
QUEUE_TYPES = (("classic", "rabbit_classic_queue"), ("quorum", "rabbit_quorum_queue"),
               ("stream", "rabbit_stream_queue"))
OPEN = 0  # warren.session.channel's OPEN: a closing channel's counters are already in the totals

_KINDS = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "untyped": UnknownMetricFamily}


def family(kind: str, name: str, documentation: str, rows: Iterable[tuple[tuple[str, ...], float]] = (),
           labels: tuple[str, ...] = ()) -> Metric:
    """One metric family; rows are (label values, value). A counter's name ends in _total, as
    RabbitMQ's (prometheus_client puts the suffix back on its samples)."""
    metric = _KINDS[kind](name, documentation, labels=labels)
    for values, value in rows:
        metric.add_metric(values, value)
    return metric


def one(kind: str, name: str, documentation: str, value: float) -> Metric:
    return family(kind, name, documentation, [((), value)])


def _add(totals: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value


def open_channels(broker) -> Iterator:
    for conn in list(broker.connections):
        for ch in conn.channels.values():
            if ch.state == OPEN:
                yield ch


# ------------------------------------------------------------------ node-wide totals
def channel_totals(broker) -> dict[str, int]:
    """Every channel's message counters (and its publishes in confirm mode), the closed
    channels' included."""
    totals = dict.fromkeys(CHANNEL_COUNTERS + (RECEIVED_CONFIRM,), 0)
    for key, value in broker.message_totals.items():
        if key in totals:
            totals[key] += value
    for ch in open_channels(broker):
        _add(totals, ch.stats)
        totals[RECEIVED_CONFIRM] += ch.publish_seq
    return totals


def queue_totals_by_type(broker) -> dict[str, dict[str, int]]:
    """Queue counters summed per queue type, the deleted queues' included."""
    totals: dict[str, dict[str, int]] = {kind: {} for kind, _ in QUEUE_TYPES}
    for kind, counts in broker.retired.queues.items():
        _add(totals.setdefault(kind, {}), counts)
    for vhost in list(broker.vhosts.values()):
        for queue in vhost.queues.values():
            _add(totals.setdefault(queue.queue_type, {}), queue.stats)
    return totals


def routed_total(broker) -> int:
    """Copies of published messages routed to queues (exchanges' publish_out: one per queue a
    message went to, as RabbitMQ 3.10's messages_routed), deleted exchanges' included."""
    total = broker.retired.exchanges.get("publish_out", 0)
    for vhost in list(broker.vhosts.values()):
        for exchange in vhost.exchanges.values():
            counts = getattr(exchange, "stats", None)
            if counts:
                total += counts.get("publish_out", 0)
    return total


# ------------------------------------------------------------------------- the node
def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def max_fds() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


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


def alarm_metrics(broker) -> Iterator[Metric]:
    alarms = broker.alarms
    yield one("untyped", "rabbitmq_alarms_free_disk_space_watermark",
              "is 1 if free disk space watermark alarm is in effect", int(DISK in alarms))
    yield one("untyped", "rabbitmq_alarms_memory_used_watermark",
              "is 1 if VM memory watermark alarm is in effect", int(MEMORY in alarms))


_CHURN = (
    ("connections_opened", "rabbitmq_connections_opened_total", "Total number of connections opened"),
    ("connections_closed", "rabbitmq_connections_closed_total", "Total number of connections closed or terminated"),
    ("channels_opened", "rabbitmq_channels_opened_total", "Total number of channels opened"),
    ("channels_closed", "rabbitmq_channels_closed_total", "Total number of channels closed"),
    ("queues_declared", "rabbitmq_queues_declared_total", "Total number of queues declared"),
    ("queues_created", "rabbitmq_queues_created_total", "Total number of queues created"),
    ("queues_deleted", "rabbitmq_queues_deleted_total", "Total number of queues deleted"),
)


def churn_metrics(broker) -> Iterator[Metric]:
    counters = broker.node_counters
    for key, name, documentation in _CHURN:
        yield one("counter", name, documentation, counters[key])


def node_metrics(server, broker) -> Iterator[Metric]:
    fds = open_fds()
    if fds is not None:
        yield one("gauge", "rabbitmq_process_open_fds", "Open file descriptors", fds)
    # AMQP client sockets, as RabbitMQ's sockets_used (its AMQP connections).
    yield one("gauge", "rabbitmq_process_open_tcp_sockets", "Open TCP sockets", len(server.protocols))
    yield one("gauge", "rabbitmq_process_resident_memory_bytes", "Memory used in bytes", mem_used(server))
    free = disk_free(server, broker)
    if free is not None:
        yield one("gauge", "rabbitmq_disk_space_available_bytes", "Disk space available in bytes", free)
    limit = max_fds()
    if limit is not None:
        yield one("gauge", "rabbitmq_process_max_fds", "Open file descriptors limit", limit)
    if broker.mem_limit is not None:
        yield one("gauge", "rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes",
                  broker.mem_limit)
    if broker.disk_free_limit is not None:  # (None: disk monitoring is disabled)
        yield one("gauge", "rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
                  broker.disk_free_limit)
    yield one("gauge", "rabbitmq_erlang_uptime_seconds", "Node uptime", time.monotonic() - stats.STARTED)


def auth_metrics(broker) -> Iterator[Metric]:
    counters = broker.node_counters
    succeeded, failed = counters["auth_attempts_succeeded"], counters["auth_attempts_failed"]
    for name, documentation, value in (
            ("rabbitmq_auth_attempts_total", "Total number of authorization attempts", succeeded + failed),
            ("rabbitmq_auth_attempts_succeeded_total", "Total number of successful authentication attempts",
             succeeded),
            ("rabbitmq_auth_attempts_failed_total", "Total number of failed authentication attempts", failed)):
        yield family("counter", name, documentation, [((PROTOCOL,), value)], ("protocol",))


# --------------------------------------------------------------------------- queues
_QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
    ("rabbitmq_queue_messages_bytes", "Size in bytes of ready and unacknowledged messages"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages"),
    ("rabbitmq_queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages"),
)


def queue_rows(broker) -> Iterator[tuple[tuple[str, str], tuple[int, ...]]]:
    """((vhost, queue), values in _QUEUE_GAUGES' order) for every queue, counted as the
    management API counts them (a stream's messages are every entry it holds)."""
    unacked_bytes = stats.unacked_bytes_by_queue(broker)
    for vhost in list(broker.vhosts.values()):
        for queue in vhost.queues.values():
            ready = len(queue.store)
            unacked = queue.unacked_count
            ready_bytes = queue.store.ready_bytes
            held_bytes = unacked_bytes.get(queue, 0)
            total = ready if queue.queue_type == "stream" else ready + unacked
            yield (vhost.name, queue.name), (ready, unacked, total, queue.consumer_count,
                                             ready_bytes + held_bytes, ready_bytes, held_bytes)


def queue_metrics(broker, per_object: bool) -> Iterator[Metric]:
    rows = list(queue_rows(broker))
    for i, (name, documentation) in enumerate(_QUEUE_GAUGES):
        if per_object:
            yield family("gauge", name, documentation, [(labels, values[i]) for labels, values in rows],
                         ("vhost", "queue"))
        else:
            yield one("gauge", name, documentation, sum(values[i] for _, values in rows))


# ------------------------------------------------------------------------- channels
_CHANNEL_GAUGES = (
    ("rabbitmq_channel_consumers", "Consumers on a channel", lambda ch: len(ch.consumers)),
    ("rabbitmq_channel_messages_unacked", "Delivered but not yet acknowledged messages",
     lambda ch: len(ch.unacked)),
    ("rabbitmq_channel_messages_unconfirmed", "Published but not yet confirmed messages",
     lambda ch: ch.publish_seq - ch.confirmed),
    ("rabbitmq_channel_messages_uncommitted", "Messages received in a transaction but not yet committed",
     lambda ch: ch.tx.messages_uncommitted if ch.tx is not None else 0),
    ("rabbitmq_channel_acks_uncommitted", "Message acknowledgements in a transaction not yet committed",
     lambda ch: ch.tx.acks_uncommitted if ch.tx is not None else 0),
    ("rabbitmq_consumer_prefetch", "Limit of unacknowledged messages for each consumer", lambda ch: ch.prefetch),
    ("rabbitmq_channel_prefetch", "Total limit of unacknowledged messages for all consumers on a channel",
     lambda ch: ch.global_prefetch),
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


def channel_metrics(broker, per_object: bool, channels: list, totals: dict[str, int]) -> Iterator[Metric]:
    for name, documentation, read in _CHANNEL_GAUGES:
        if per_object:
            yield family("gauge", name, documentation, [((channel_name(ch),), read(ch)) for ch in channels],
                         ("channel",))
        else:
            yield one("gauge", name, documentation, sum(read(ch) for ch in channels))
    if not per_object:
        for key, name, documentation in _CHANNEL_COUNTERS:
            yield one("counter", name, documentation, totals[key])


# ---------------------------------------------------------------------- connections
_CONNECTION_COUNTERS = (
    ("recv_oct", "rabbitmq_connection_incoming_bytes_total", "Total number of bytes received on a connection"),
    ("send_oct", "rabbitmq_connection_outgoing_bytes_total", "Total number of bytes sent on a connection"),
    ("recv_cnt", "rabbitmq_connection_incoming_packets_total", "Total number of packets received on a connection"),
    ("send_cnt", "rabbitmq_connection_outgoing_packets_total", "Total number of packets sent on a connection"),
)
assert {key for key, _, _ in _CONNECTION_COUNTERS} == set(CONNECTION_COUNTERS)


def connection_metrics(broker, per_object: bool) -> Iterator[Metric]:
    conns = list(broker.connections)
    if per_object:
        # Labelled "channel", as RabbitMQ 3.10.8 labels a connection's metrics (by its pid).
        names = [(connection_name(conn),) for conn in conns]
        for key, name, documentation in _CONNECTION_COUNTERS:
            yield family("counter", name, documentation,
                         [(label, getattr(conn, key, 0)) for label, conn in zip(names, conns)], ("channel",))
        yield family("gauge", "rabbitmq_connection_channels", "Channels on a connection",
                     [(label, len(conn.channels)) for label, conn in zip(names, conns)], ("channel",))
        return
    retired = broker.retired.connections
    for key, name, documentation in _CONNECTION_COUNTERS:
        yield one("counter", name, documentation, retired[key] + sum(getattr(conn, key, 0) for conn in conns))
    yield one("gauge", "rabbitmq_connection_channels", "Channels on a connection",
              sum(len(conn.channels) for conn in conns))


# --------------------------------------------------------------------- the totals
def total_metrics(broker, channels: list) -> Iterator[Metric]:
    queues = consumers = 0
    for vhost in list(broker.vhosts.values()):
        queues += len(vhost.queues)
        for queue in vhost.queues.values():
            consumers += queue.consumer_count
    yield one("gauge", "rabbitmq_connections", "Connections currently open", len(broker.connections))
    yield one("gauge", "rabbitmq_channels", "Channels currently open", len(channels))
    yield one("gauge", "rabbitmq_consumers", "Consumers currently connected", consumers)
    yield one("gauge", "rabbitmq_queues", "Queues available", queues)


@cache
def client_version() -> str:
    from importlib import metadata  # (at the first scrape, not at every start)
    try:
        return metadata.version("prometheus-client")
    except metadata.PackageNotFoundError:
        return ""


def identity_metrics(broker) -> Iterator[Metric]:
    # RabbitMQ's erlang_version has no Warren counterpart: python_version stands beside it.
    yield family("untyped", "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                 [((RABBITMQ_VERSION, __version__, client_version(), platform.python_version()), 1)],
                 ("rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version", "python_version"))
    yield family("untyped", "rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                 [((stats.node_name(broker), broker.cluster_name), 1)], ("rabbitmq_node", "rabbitmq_cluster"))


# ------------------------------------------------------- rabbitmq_global_* (3.10's counters)
# (Warren's queue counters, metric, help): per queue type.
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
    (stats.DELIVER_GET, "rabbitmq_global_messages_delivered_total", "Total number of messages delivered to consumers"),
    (("get_empty",), "rabbitmq_global_messages_get_empty_total",
     "Total number of times basic.get operations fetched no message"),
)


def global_metrics(broker, channels: list, totals: dict[str, int]) -> Iterator[Metric]:
    by_type = queue_totals_by_type(broker)
    consumers = sum(queue.consumer_count for vhost in list(broker.vhosts.values()) for queue in vhost.queues.values())

    def by_queue_type(keys, name, documentation):
        rows = [((PROTOCOL, label), sum(by_type.get(kind, {}).get(key, 0) for key in keys))
                for kind, label in QUEUE_TYPES]
        return family("counter", name, documentation, rows, ("protocol", "queue_type"))

    def node(kind, name, documentation, value):
        return family(kind, name, documentation, [((PROTOCOL,), value)], ("protocol",))

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
               "Total number of messages routed to queues or streams", routed_total(broker))
    yield node("counter", "rabbitmq_global_messages_unroutable_dropped_total",
               "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
               totals["drop_unroutable"])
    yield node("counter", "rabbitmq_global_messages_unroutable_returned_total",
               "Total number of messages published as mandatory into an exchange and returned to the publisher as "
               "unroutable", totals["return_unroutable"])
    yield node("gauge", "rabbitmq_global_publishers", "Current number of publishers",
               sum(1 for ch in channels if ch.stats["publish"]))


# ------------------------------------------------------------------------ collectors
class RabbitMQCollector:
    """A prometheus_client collector over a running server (warren.server.listener.Server):
    per_object gives a sample per queue, channel and connection; alarms adds the
    rabbitmq_alarms_* metrics (RabbitMQ's /metrics has them, /metrics/per-object not)."""

    def __init__(self, server, per_object: bool = False, alarms: bool = True):
        self.server = server
        self.per_object = per_object
        self.alarms = alarms

    def describe(self) -> list:
        # Registering must not scrape: the names are fixed, the values read at collect().
        return []

    def collect(self) -> Iterator[Metric]:
        server = self.server
        broker = server.broker
        per_object = self.per_object
        channels = list(open_channels(broker))
        totals = channel_totals(broker)
        if self.alarms:
            yield from alarm_metrics(broker)
        yield from churn_metrics(broker)
        yield from node_metrics(server, broker)
        yield from auth_metrics(broker)
        yield from queue_metrics(broker, per_object)
        yield from channel_metrics(broker, per_object, channels, totals)
        yield from connection_metrics(broker, per_object)
        if not per_object:
            yield one("counter", "rabbitmq_queue_messages_published_total", "Total number of messages published to queues",
                      routed_total(broker))
        yield from total_metrics(broker, channels)
        yield from identity_metrics(broker)
        yield from global_metrics(broker, channels, totals)


def registries(server, per_object_metrics: bool = False) -> tuple[CollectorRegistry, CollectorRegistry]:
    """(/metrics, /metrics/per-object). With per_object_metrics (RabbitMQ's
    prometheus.return_per_object_metrics) /metrics gives the objects one by one too."""
    default = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=default)
    default.register(RabbitMQCollector(server, per_object=per_object_metrics))
    per_object = CollectorRegistry(auto_describe=False)
    per_object.register(RabbitMQCollector(server, per_object=True, alarms=False))
    return default, per_object
