"""Message statistics for the management API: RabbitMQ's field names over Warren's counters.

The model only counts (integer increments on the hot path, in the counters that
warren.broker.stats declares and makes); this module turns the counters into RabbitMQ's JSON
and computes rates by sampling the counters every few seconds, as RabbitMQ's management
plugin does (`*_details: {"rate": r}` = growth per second over the last sampling interval).
Every function here is cheap and safe to call from any handler.

Functions for the object shapes (warren.mgmt.shapes) and the handlers (all return fresh
dicts to merge into an object's JSON):

- `queue_stats(broker, queue, unacked_bytes=None) -> dict`
    messages, messages_details{rate}, messages_ready, messages_ready_details,
    messages_unacknowledged, messages_unacknowledged_details, message_bytes,
    message_bytes_ready, message_bytes_unacknowledged, message_bytes_ram, messages_ram,
    messages_ready_ram, messages_unacknowledged_ram, consumers, consumer_utilisation,
    consumer_capacity, exclusive_consumer_tag, state ("running"), message_stats {publish,
    deliver, deliver_no_ack, get, get_no_ack, get_empty, deliver_get, ack, redeliver, each
    with its *_details{rate}}.
    `unacked_bytes` is that queue's unacknowledged body bytes; leave it None and it is
    computed by scanning the channels (fine for one queue; for a list, compute the map once
    with `unacked_bytes_by_queue(broker)` and pass `map.get(queue, 0)`).
- `unacked_bytes_by_queue(broker) -> dict[Queue, int]`
- `exchange_stats(exchange) -> dict`
    {"message_stats": {publish_in, publish_in_details, publish_out, publish_out_details}}
    (publish_out counts one per queue a message was routed to, as RabbitMQ).
- `channel_stats(broker, channel, counts) -> dict`   {"message_stats": {publish, confirm,
    return_unroutable, drop_unroutable, deliver, deliver_no_ack, get, get_no_ack, get_empty,
    deliver_get, ack, redeliver, + *_details}}
- `connection_stats(broker, conn, info) -> dict`   recv_oct, recv_cnt, send_oct, send_cnt,
    send_pend and recv_oct_details / send_oct_details
- `overview_message_stats(broker) -> dict`, `queue_totals(broker) -> dict`,
  `object_totals(broker, own) -> dict`: the /api/overview parts (totals survive closed channels:
  a closing channel adds its counters to broker.stats.message_totals).
- `node_name(broker) -> str`: the node name every object's "node" field shows
  (broker.config.node_name).
- `alarms(broker) -> list[str]`: the node's own resource alarms in effect ("memory", "disk"),
  from broker.alarms (raised and cleared by the server's memory and disk monitors).
- `cluster_alarms(broker) -> list[(node, resource)]`: every running node's, this one's included
  (another cluster member's come from its running record: warren.cluster.membership).

Connections and channels are read through the broker's handles of them (Broker.connections,
warren.broker.records): their counters() for the sampling, info() records for the rest; the
sampler keys their rates by the handle, as it keys a queue's by the queue.

Counting differs from RabbitMQ 3.10.8 in two places, on purpose: get_empty (basic.get on an
empty queue) and drop_unroutable (an unroutable publish without mandatory) are counted, where
3.10.8 leaves both at 0 although it documents them. Every counter is always present (RabbitMQ
omits one that was never incremented).

The sampler is started with the app (`start_sampler` / `stop_sampler` as aiohttp
on_startup / on_cleanup hooks). Its interval is WARREN_STATS_INTERVAL seconds (default 5,
RabbitMQ's collect_statistics_interval).
"""

import asyncio
import operator
import os
import time
import weakref
from typing import Any, Iterable

from ..broker.records import ChannelCounters, ChannelHandle, ConnectionHandle, ConnectionInfo
from ..broker.stats import (
    CHANNEL_COUNTERS, CONNECTION_COUNTERS, DELIVER_GET, EXCHANGE_COUNTERS, QUEUE_COUNTERS, QUEUE_DEAD_LETTER_COUNTERS,
)

# Queue depths: sampled with the counters, for their rates (they are not counters).
QUEUE_DEPTHS = ("messages", "messages_ready", "messages_unacknowledged")


STARTED = time.monotonic()  # for the node's uptime (this module loads when the API starts)


def node_name(broker) -> str:
    return broker.config.node_name


def alarms(broker) -> list:
    return sorted(broker.alarms)


def cluster_alarms(broker) -> list[tuple[str, str]]:
    return broker.alarms.by_node(node_name(broker))


def interval() -> float:
    try:
        value = float(os.environ.get("WARREN_STATS_INTERVAL", "5"))
    except ValueError:
        value = 5.0
    return value if value > 0 else 5.0


# ------------------------------------------------------------------ sampling
_queue_counts = operator.itemgetter(*QUEUE_COUNTERS)
_exchange_counts = operator.itemgetter(*EXCHANGE_COUNTERS)


def _counts(getter, stats: dict, fields) -> tuple:
    try:
        return getter(stats)
    except KeyError:  # (a counters dict made without every field)
        return tuple(stats.get(f, 0) for f in fields)


MAX_SHARE = 0.02  # of the event loop's time, at most, spent sampling


class Sampler:
    """Remembers each object's counters at the last two samples; its rates are worked out
    when asked for. A round costs a few microseconds an object (100,000 queues are sampled
    every few seconds, also while they are being declared): one dict entry each, keyed by
    id() with a weak reference that tells a new object from a dead one whose id was reused,
    and nothing computed for objects nobody looks at."""

    def __init__(self, broker, period: float):
        self.broker = broker
        self.period = period
        # id(object) -> (weakref, fields, previous (time, counts) or None, last (time, counts));
        # each round keeps only the objects alive then.
        self.entries: dict[int, tuple] = {}
        self.sampled_at: float | None = None  # the previous round
        self.overview_last: tuple[float, tuple] | None = None
        self.overview_rates: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    def rates(self, obj) -> dict[str, float]:
        """Growth per second of each counter of obj over the last sampling interval."""
        e = self.entries.get(id(obj))
        if e is None or e[0]() is not obj or e[2] is None:
            return {}
        (t0, prev), (t1, counts) = e[2], e[3]
        dt = t1 - t0
        if dt <= 0:
            return {}
        return {f: (c - p) / dt for f, c, p in zip(e[1], counts, prev)}

    def sample(self) -> None:
        now = time.monotonic()
        broker = self.broker
        old = self.entries
        entries: dict[int, tuple] = {}
        # An object made since the previous round (it would have been sampled) counted from
        # zero then, so what it did before its first sample shows in its first rates.
        born = self.sampled_at

        def keep(obj, fields, counts) -> None:
            key = id(obj)
            e = old.get(key)
            if e is not None and e[0]() is obj:
                entries[key] = (e[0], fields, e[3], (now, counts))
            else:
                entries[key] = (weakref.ref(obj), fields,
                                None if born is None else (born, (0,) * len(counts)), (now, counts))

        ready_total = unacked_total = 0
        queue_fields = QUEUE_COUNTERS + QUEUE_DEPTHS
        for vhost in list(broker.vhosts.values()):
            for q in vhost.queues.values():
                ready, unacked, _ = q.message_counts()
                ready_total += ready
                unacked_total += unacked
                keep(q, queue_fields,
                     _counts(_queue_counts, q.stats, QUEUE_COUNTERS) + (ready + unacked, ready, unacked))
            for x in vhost.exchanges.values():
                s = getattr(x, "stats", None)
                if s is not None:
                    keep(x, EXCHANGE_COUNTERS, _counts(_exchange_counts, s, EXCHANGE_COUNTERS))
        channels = []
        for conn in list(broker.connections):
            keep(conn, CONNECTION_COUNTERS, conn.counters())  # (a tuple in CONNECTION_COUNTERS' order)
            for ch in list(conn.channels.values()):
                counters = ch.counters()
                keep(ch, CHANNEL_COUNTERS, counters.counts)
                channels.append(counters)
        self.entries = entries
        totals = _message_totals(broker, channels)
        fields = CHANNEL_COUNTERS + QUEUE_DEPTHS
        counts = tuple(totals[f] for f in CHANNEL_COUNTERS) + (
            ready_total + unacked_total, ready_total, unacked_total)
        prev = self.overview_last
        self.overview_last = (now, counts)
        if prev is not None and now > prev[0]:
            dt = now - prev[0]
            self.overview_rates = {f: (c - p) / dt for f, c, p in zip(fields, counts, prev[1])}
        self.sampled_at = now

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            try:
                self.sample()
            except Exception:  # never let a bad sample stop the sampling
                import logging
                logging.getLogger("warren.mgmt").exception("stats sampling failed")
            await asyncio.sleep(self.pause(time.perf_counter() - started))

    def pause(self, took: float) -> float:
        """The time to the next round: the period, or longer when a round takes more than
        MAX_SHARE of it (100,000 queues: 0.3 s a round, every 15 s rather than 5 s), so the
        sampling never takes more than that share of the event loop whatever the number of
        objects. Rates are over the time between the rounds, whatever it was."""
        return max(self.period, took / MAX_SHARE)


_samplers: dict = {}  # id(broker) -> Sampler (a Broker dataclass is not hashable)


def sampler_for(broker):
    return _samplers.get(id(broker))


async def start_sampler(app) -> None:
    broker = app["broker"]
    sampler = Sampler(broker, interval())
    _samplers[id(broker)] = sampler
    sampler.task = asyncio.get_running_loop().create_task(sampler.run())


async def stop_sampler(app) -> None:
    sampler = _samplers.pop(id(app["broker"]), None)
    if sampler is not None and sampler.task is not None:
        sampler.task.cancel()
        try:
            await sampler.task
        except (asyncio.CancelledError, Exception):
            pass


def _broker_of(obj):
    vhost = getattr(obj, "vhost", None)
    return getattr(vhost, "broker", None)


def _details(obj, counts: dict, fields, broker=None) -> dict:
    sampler = sampler_for(broker if broker is not None else _broker_of(obj))
    rates = sampler.rates(obj) if sampler is not None else {}
    out = {}
    for f in fields:
        out[f] = counts.get(f, 0)
        out[f + "_details"] = {"rate": round(rates.get(f, 0.0), 1)}
    return out


def _with_deliver_get(stats: dict, rates: dict) -> dict:
    """RabbitMQ's deliver_get: deliver + deliver_no_ack + get + get_no_ack."""
    stats["deliver_get"] = sum(stats.get(p, 0) for p in DELIVER_GET)
    stats["deliver_get_details"] = {"rate": round(sum(rates.get(p, 0.0) for p in DELIVER_GET), 1)}
    return stats


# ------------------------------------------------------------------- queues
def unacked_bytes_by_queue(broker) -> dict:
    """Body bytes delivered but not yet acknowledged, per queue (one scan of all channels)."""
    result: dict = {}
    for conn in list(broker.connections):
        for ch in list(conn.channels.values()):
            held = ch.unacked_bytes()
            if held:
                for queue, size in held.items():
                    result[queue] = result.get(queue, 0) + size
    return result


def queue_stats(broker, queue, unacked_bytes=None) -> dict:
    if unacked_bytes is None:
        unacked_bytes = unacked_bytes_by_queue(broker).get(queue, 0) if broker is not None else 0
    sampler = sampler_for(broker)
    rates = sampler.rates(queue) if sampler is not None else {}
    ready, unacked, ready_bytes = queue.message_counts()
    consumers = queue.consumer_count
    exclusive_tag = next((c.tag for c in queue.consumers if c.exclusive), None)
    counts = queue.stats
    message_stats = {}
    for f in QUEUE_COUNTERS:
        message_stats[f] = counts.get(f, 0)
        message_stats[f + "_details"] = {"rate": round(rates.get(f, 0.0), 1)}
    _with_deliver_get(message_stats, rates)
    # A stream's entries stay in it while delivered: its count is every entry it holds.
    total = ready + unacked if queue.CAPABILITIES.counts_unacked else ready
    return {
        "messages": total,
        "messages_details": {"rate": round(rates.get("messages", 0.0), 1)},
        "messages_ready": ready,
        "messages_ready_details": {"rate": round(rates.get("messages_ready", 0.0), 1)},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": round(rates.get("messages_unacknowledged", 0.0), 1)},
        "messages_ram": ready + unacked,
        "messages_ready_ram": ready,
        "messages_unacknowledged_ram": unacked,
        "message_bytes": ready_bytes + unacked_bytes,
        "message_bytes_ready": ready_bytes,
        "message_bytes_unacknowledged": unacked_bytes,
        "message_bytes_ram": ready_bytes + unacked_bytes,
        "consumers": consumers,
        "consumer_utilisation": 1.0 if consumers else 0,
        "consumer_capacity": 1.0 if consumers else 0,
        "exclusive_consumer_tag": exclusive_tag,
        "state": "running",
        "message_stats": message_stats,
        # Warren's: messages that left the queue other than by ack, by reason, republished to
        # its dead-letter exchange or dropped (RabbitMQ 3.10 counts these only node-wide).
        "dead_letter_stats": {f: counts.get(f, 0) for f in QUEUE_DEAD_LETTER_COUNTERS},
    }


# ---------------------------------------------------------------- exchanges
def exchange_stats(exchange) -> dict:
    counts = getattr(exchange, "stats", None) or {}
    return {"message_stats": _details(exchange, counts, EXCHANGE_COUNTERS)}


# ----------------------------------------------------- channels, connections
def channel_stats(broker, channel: ChannelHandle, counts: dict[str, int]) -> dict:
    """The message_stats of a channel (its rates are the sampler's of that handle)."""
    sampler = sampler_for(broker)
    rates = sampler.rates(channel) if sampler is not None else {}
    stats = _details(channel, counts, CHANNEL_COUNTERS, broker)
    return {"message_stats": _with_deliver_get(stats, rates)}


def connection_stats(broker, conn: ConnectionHandle, info: ConnectionInfo) -> dict:
    sampler = sampler_for(broker)
    rates = sampler.rates(conn) if sampler is not None else {}
    out: dict[str, Any] = dict(zip(CONNECTION_COUNTERS, info.counters))  # (a tuple in their order)
    out["recv_oct_details"] = {"rate": round(rates.get("recv_oct", 0.0), 1)}
    out["send_oct_details"] = {"rate": round(rates.get("send_oct", 0.0), 1)}
    out["send_pend"] = info.send_pend
    return out


# ----------------------------------------------------------------- overview
def channel_counters(broker) -> list[ChannelCounters]:
    return [ch.counters() for conn in list(broker.connections) for ch in list(conn.channels.values())]


def _message_totals(broker, channels: list[ChannelCounters]) -> dict:
    """Counters of every channel ever: the closed ones (folded into broker.stats.message_totals
    when they closed) plus the open ones (`channels`: channel_counters(broker))."""
    totals = dict.fromkeys(CHANNEL_COUNTERS, 0)
    for f, v in broker.stats.message_totals.items():
        if f in totals:
            totals[f] += v
    # (A closing channel's counts were already folded into the totals.)
    open_counts = [counters.counts for counters in channels if not counters.closing]
    if open_counts:
        for f, column in zip(CHANNEL_COUNTERS, zip(*open_counts)):
            totals[f] += sum(column)
    return totals


def overview_message_stats(broker) -> dict:
    totals = _message_totals(broker, channel_counters(broker))
    sampler = sampler_for(broker)
    rates = sampler.overview_rates if sampler is not None else {}
    out = {}
    for f in CHANNEL_COUNTERS:
        out[f] = totals[f]
        out[f + "_details"] = {"rate": round(rates.get(f, 0.0), 1)}
    return _with_deliver_get(out, rates)


def message_totals(queues: Iterable) -> tuple[int, int]:
    """(ready, unacknowledged) over `queues` (another node's: as its home last said)."""
    ready = unacked = 0
    for q in queues:
        r, u, _ = q.message_counts()
        ready += r
        unacked += u
    return ready, unacked


def queue_totals(broker) -> dict:
    ready, unacked = message_totals(q for vhost in broker.vhosts.values() for q in vhost.queues.values())
    out: dict[str, Any] = {"messages": ready + unacked, "messages_ready": ready,
                           "messages_unacknowledged": unacked}
    sampler = sampler_for(broker)
    rates = sampler.overview_rates if sampler is not None else {}
    for f in QUEUE_DEPTHS:
        out[f + "_details"] = {"rate": round(rates.get(f, 0.0), 1)}
    return out


def object_totals(broker, own: dict[str, int]) -> dict:
    """The overview's counts: the queues and exchanges, and `own`: the connections, channels
    and consumers (warren.mgmt.peers: every cluster member's)."""
    queues = exchanges = 0
    for vhost in broker.vhosts.values():
        queues += len(vhost.queues)
        exchanges += len(vhost.exchanges)
    totals = {**own, "exchanges": exchanges, "queues": queues}
    return {key: totals[key] for key in sorted(totals)}
