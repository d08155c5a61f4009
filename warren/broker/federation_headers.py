"""The headers federation reads and writes (rabbit_federation_util, rabbit_basic): a
message's x-received-from (one table per federation link it went through, newest first) and
a binding's x-bound-from (one table per link it was propagated over), which bound how far
messages and bindings travel (max-hops) and stop cycles (a link's own cluster name and vhost
in the list)."""

from __future__ import annotations

from typing import Any

from ..amqp import reencode as rt
from ..amqp.codec import typed_int
from ..amqp.properties import FLAG_HEADERS

ROUTING_HEADER = "x-received-from"
BINDING_HEADER = "x-bound-from"


def already_seen(name: str | None, vhost: str | None, entries: list) -> bool:
    """Whether a table of the list names this cluster and vhost."""
    return any(isinstance(t, dict) and t.get("cluster-name") == name and t.get("vhost") == vhost
               for t in entries)


def should_forward(headers: dict[str, Any] | None, max_hops: int, name: str | None, vhost: str | None) -> bool:
    """rabbit_federation_util:should_forward: fewer than max_hops links behind it, none of
    them this downstream's."""
    if not headers:
        return True
    received = headers.get(ROUTING_HEADER)
    if not isinstance(received, list):
        return True
    return len(received) < max_hops and not already_seen(name, vhost, received)


def with_received_from(header: bytes, info: list[tuple[bytes, bytes]], clear_user_id: bool) -> bytes:
    """The content header with `info` (typed table fields) prepended to x-received-from, and
    without user_id unless the upstream is trusted (trust-user-id)."""
    props = rt.split_header(header)
    table = props.get(FLAG_HEADERS)
    fields = rt.table_fields(table) if table is not None else []
    fields = rt.prepend_table_header(fields, ROUTING_HEADER.encode(), rt.table_value(info))
    props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in fields])
    if clear_user_id:
        props.pop(1 << 4, None)
    return rt.join_header(header, props)


def bound_from(arguments: dict[str, Any], max_hops: int, upstream_name: str | None, upstream_vhost: str,
               cluster: str, vhost: str, exchange: str) -> dict[str, Any] | None:
    """A downstream binding's arguments as its link binds upstream
    (rabbit_federation_exchange_link:update_binding): an x-bound-from table for this link
    prepended, its hops counted down from the most restrictive max-hops passed; None when it
    should go no further (0 hops left, or back where it came from)."""
    previous = arguments.get(BINDING_HEADER)
    if isinstance(previous, list) and previous:
        first = previous[0] if isinstance(previous[0], dict) else {}
        hops = 0 if already_seen(upstream_name, upstream_vhost, previous) else min(
            _hops(first.get("hops")) - 1, max_hops)
        prior = previous
    else:
        hops, prior = max_hops, []
    if hops <= 0:
        return None
    info = {"cluster-name": cluster, "vhost": vhost, "exchange": exchange, "hops": typed_int("short", hops)}
    return {**{k: v for k, v in arguments.items() if k != BINDING_HEADER}, BINDING_HEADER: [info, *prior]}


def is_propagated(arguments: dict[str, Any]) -> bool:
    """A binding a link made (it has x-bound-from): mirrored only where the link's rules say."""
    return isinstance(arguments.get(BINDING_HEADER), list)


def _hops(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def queue_link_header(message: Any, info: list[tuple[bytes, bytes]], clear_user_id: bool) -> bytes:
    """A queue link's headers (rabbit_federation_queue_link:update_headers): the first time
    a message is federated, x-original-exchange and x-original-routing-key record where it
    was published; each link's entry in x-received-from counts its visits (visit-count, the
    previous entry of the same URI and queue taken out); a CC header becomes x-original-cc
    (so that the republish does not route it again)."""
    props = rt.split_header(message.header)
    table = props.get(FLAG_HEADERS)
    fields = rt.table_fields(table) if table is not None else []
    received = rt.lookup(fields, ROUTING_HEADER.encode())
    count = 0
    if received is not None and received[:1] == b"A":
        kept = []
        for item in rt.array_items(received):
            if item[:1] == b"F" and _same_link(rt.table_fields(item[1:]), info):
                count = rt.integer(rt.lookup(rt.table_fields(item[1:]), b"visit-count")) or 0
            else:
                kept.append(item)
        fields = rt.set_table_value(fields, ROUTING_HEADER.encode(), rt.array_value(kept))
    else:
        fields = rt.set_table_value(fields, b"x-original-exchange", rt.longstr_value(message.exchange.encode()))
        fields = rt.set_table_value(fields, b"x-original-routing-key",
                                    rt.longstr_value(message.routing_key.encode()))
    fields = [(b"x-original-cc" if k == b"CC" else k, v) for k, v in fields]
    entry = rt.table_value([*info, (b"visit-count", rt.long_value(count + 1))])
    fields = rt.prepend_table_header(fields, ROUTING_HEADER.encode(), entry)
    props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in fields])
    if clear_user_id:
        props.pop(1 << 4, None)
    return rt.join_header(message.header, props)


def _same_link(fields: list[tuple[bytes, bytes]], info: list[tuple[bytes, bytes]]) -> bool:
    """visit_match: the same uri, virtual_host and queue."""
    mine = dict(info)
    return all(rt.lookup(fields, key) == mine.get(key) for key in (b"uri", b"virtual_host", b"queue"))
