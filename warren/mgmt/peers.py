"""Connections, channels and consumers over a cluster's running members: RabbitMQ's API lists
every running node's, each record naming its `node`, through whichever node is asked.

Each node makes the JSON of its own objects (their rates are its own sampler's): `local` here,
and over the node links for the others (warren.cluster.node_links.NodeLinks.records, answered
by `local` on their side: `source`, which the server gives its node links when the API runs). `listing` merges
this node's with every other running member's that answers within a second (a member that does
not is left out, as RabbitMQ's API leaves out a node it cannot reach); the handlers then filter
(who sees what), sort and page the merged list as on one node.

A kind and its filter (`where`, field: value, all optional):

- "connections": name, vhost, user;
- "channels": name, vhost, connection (its connection's name); details: with consumer_details;
- "consumers": vhost, queue (with vhost: that queue's consumers, its consumer_details);
- "totals": one record, {connections, channels, consumers} of the node (the overview's);
- "shovels", "federation-links": the statuses of those the node runs (one member runs each:
  warren.cluster.link_owners).

A consumer of another member that a queue here serves (warren.cluster.queue_home) is that
member's to show, as its channel's: it is not listed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

from ..broker import federation, shovel
from .shapes import channel_json, connection_json, consumer_json
from .stats import node_name

if TYPE_CHECKING:
    from aiohttp import web

    from ..broker.broker import Broker
    from ..broker.consumer import Consumer
    from ..cluster.node_links import NodeLinks

CONNECTIONS, CHANNELS, CONSUMERS, TOTALS = "connections", "channels", "consumers", "totals"
SHOVELS, FEDERATION_LINKS = "shovels", "federation-links"


def local(broker: Broker, kind: str, where: dict[str, Any]) -> list[dict[str, Any]]:
    """This node's records of a kind (ValueError for a kind there is not)."""
    if kind == CONNECTIONS:
        return [connection_json(broker, c, info) for c in list(broker.connections)
                for info in (c.info(),) if _matches(where, name=info.name, vhost=info.vhost, user=info.user)]
    if kind == CHANNELS:
        details = bool(where.get("details"))
        return [channel_json(broker, ch, details, info) for c in list(broker.connections)
                for ch in list(c.channels.values()) for info in (ch.info(),)
                if _matches(where, name=info.name, vhost=info.vhost, connection=info.connection.name)]
    if kind == CONSUMERS:
        return [consumer_json(broker, c) for c in _consumers(broker, where.get("vhost"), where.get("queue"))]
    if kind == TOTALS:
        return [totals(broker)]
    if kind == SHOVELS:
        return [s.status(node_name(broker)) for s in shovel.statuses(broker) if s.runs_here()]
    if kind == FEDERATION_LINKS:
        return [link.link_status(node_name(broker)) for link in federation.statuses(broker) if link.runs_here()]
    raise ValueError(f"no records of kind {kind!r}")


def _matches(where: dict[str, Any], **fields: Any) -> bool:
    return all(where.get(k) is None or where[k] == v for k, v in fields.items())


def _consumers(broker: Broker, vhost_name: str | None, queue_name: str | None) -> list[Consumer]:
    if queue_name is not None:
        vhost = broker.vhosts.get(vhost_name or "")
        queue = None if vhost is None else vhost.queues.get(queue_name)
        return [] if queue is None else [c for c in list(queue.consumers) if not c.remote]
    return [c for conn in list(broker.connections) for ch in list(conn.channels.values())
            for c in list(ch.consumers.values()) if vhost_name is None or c.queue.vhost.name == vhost_name] + [
        # The shovels' (RabbitMQ: of their direct connections, user "none").
        s.consumer for s in shovel.statuses(broker)
        if s.consumer is not None and (vhost_name is None or s.consumer.queue.vhost.name == vhost_name)]


def totals(broker: Broker) -> dict[str, int]:
    """The node's own connections, channels and consumers (of its channels and shovels)."""
    conns = list(broker.connections)
    consumers = 0
    for vhost in broker.vhosts.values():
        for q in vhost.queues.values():
            consumers += sum(1 for c in q.consumers if not c.remote)
    return {"connections": len(conns), "channels": sum(len(c.channels) for c in conns), "consumers": consumers}


def _links(broker: Broker) -> NodeLinks | None:
    """A cluster member's node links (None on a node alone)."""
    return cast("NodeLinks | None", broker.node_links)


async def listing(request: web.Request, kind: str, where: dict[str, Any] | None = None,
                  here: bool = True) -> list[dict[str, Any]]:
    """This node's records (unless `here` is False) and every other running member's that
    answer in time."""
    broker = request.app["broker"]
    where = where or {}
    records = local(broker, kind, where) if here else []
    links = _links(broker)
    if links is not None:
        records += await links.records(kind, where)
    return records


async def cluster_totals(request: web.Request) -> dict[str, int]:
    """totals() summed over the running members."""
    out = dict.fromkeys(("connections", "channels", "consumers"), 0)
    for record in await listing(request, TOTALS):
        for key in out:
            out[key] += int(record.get(key, 0))
    return out


async def close_elsewhere(request: web.Request, where: dict[str, Any], reason: str) -> int:
    """Close the other members' connections that match `where` (name, user or vhost)."""
    links = _links(request.app["broker"])
    return 0 if links is None else await links.close_connections(where, reason)


async def restart_elsewhere(request: web.Request, kind: str, vhost: str, name: str) -> bool:
    """Restart the shovel ("shovel", by name) or federation link ("federation", by id) that
    another member runs: whether one did."""
    links = _links(request.app["broker"])
    return links is not None and await links.restart_link(kind, vhost, name)


def source(broker: Broker) -> Callable[[str, dict[str, Any]], list[dict[str, Any]]]:
    """What answers the other members' questions for records (NodeLinks.records_source): this
    node's, as `local` makes them."""
    return lambda kind, where: local(broker, kind, where)
