"""Sender-selected distribution: the CC and BCC headers of a publish add routing keys.

As RabbitMQ 3.10 (rabbit_basic:header_routes and make_message): a message is routed with its
routing key and every longstr of its "CC" and "BCC" arrays, each queue getting it once;
deliveries still name the publish's routing key; "BCC" is removed from the message before it
is routed and stored, "CC" stays. A CC or BCC that is not an array refuses the publish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp import reencode as rt
from ..amqp.message import Message
from ..amqp.properties import FLAG_HEADERS
from .errors import precondition_failed

if TYPE_CHECKING:
    from .exchanges.base import Exchange

log = logging.getLogger("warren.routing")

ROUTING_HEADERS = (b"CC", b"BCC")


class Routing(Protocol):
    """What routing by several keys asks of a vhost: its queues by name and its routing
    (warren.broker.vhost.VHost, which dead-letters through this module, so named by what it
    does here rather than imported)."""

    @property
    def queues(self) -> Mapping[str, Any]: ...

    def route(self, exchange: Exchange, routing_key: str, message: Message) -> list: ...

    def follow(self, exchange: Exchange, dests: list, match: Callable[[Exchange], list]) -> list: ...


def header_routes(fields: list[rt.Field], strict: bool = False) -> list[bytes]:
    """The routing keys a headers table adds: the longstrs of its first "CC" and first "BCC"
    arrays, in that order (other elements are ignored, as RabbitMQ ignores them). `strict`
    (publish): a CC or BCC of another type is RabbitMQ's 406 "invalid message"; otherwise it
    adds nothing."""
    keys: list[bytes] = []
    for name in ROUTING_HEADERS:
        value = rt.lookup(fields, name)
        if value is None:
            continue
        if value[0] != 0x41:  # 'A'
            if strict:
                raise precondition_failed("invalid message: {unacceptable_type_in_header,"
                                          f'"{name.decode()}",{rt.type_name(value)}}}')
            continue
        for item in rt.array_items(value):
            key = rt.longstr(item)
            if key is not None:
                keys.append(key)
    return keys


def take_routing_headers(message: Message) -> tuple[str, ...] | None:
    """At publish, for a message whose header may hold CC or BCC: the routing keys they add
    (also kept as message.cc_keys), or None when it has neither. Strips BCC from the header,
    encoding the properties again as RabbitMQ does (then an 'L' field reads 'l' and a
    boolean 0 or 1); a header without BCC is kept byte for byte."""
    props = rt.split_header(message.header)
    table = props.get(FLAG_HEADERS)
    if table is None:
        return None
    fields = rt.table_fields(table)
    bcc = rt.lookup(fields, b"BCC")
    if bcc is None and rt.lookup(fields, b"CC") is None:
        return None
    keys = tuple(k.decode("utf-8", "surrogateescape") for k in header_routes(fields, strict=True))
    if bcc is not None:
        fields = rt.delete_field(fields, b"BCC")
        props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in fields])
        message.replace_header(rt.join_header(message.header, props))
    message.cc_keys = keys
    return keys


def route_keys(vhost: Routing, exchange: Exchange, routing_keys: list[str], message: Message) -> list:
    """The queues a message goes to with several routing keys (CC/BCC, dead-lettering), as
    rabbit_exchange:route/2 routes a message's routing_keys: each exchange matches all the
    keys at once, so its alternate exchange is tried only when none of them selects anything
    there; exchange-to-exchange bindings are followed with all the keys; no exchange is
    visited twice and each queue is routed to once. With one key: vhost.route."""
    if len(routing_keys) == 1:
        return vhost.route(exchange, routing_keys[0], message)
    if exchange.is_default:
        found: dict = {}
        for key in routing_keys:
            q = vhost.queues.get(key)
            if q is not None:
                found[q] = None
        return list(found)

    def match(x: Exchange) -> list:
        return _match(x, routing_keys, message)

    return vhost.follow(exchange, match(exchange), match)


def _match(x: Exchange, routing_keys: list[str], message: Message) -> list:
    """The destinations x's own bindings select for any of the keys, each once."""
    if x.type_name == "x-consistent-hash":
        # The plugin hashes the list of keys, and its jump_consistent_hash takes a list's
        # head: the publish's routing key alone picks the one queue.
        return list(x.match(routing_keys[0], message))
    dests: dict = {}
    for key in routing_keys:
        for d in x.match(key, message):
            dests[d] = None
    return list(dests)


def route_sender_selected(vhost: Routing, exchange: Exchange, message: Message) -> list:
    """Route a published message whose header may hold CC or BCC (see take_routing_headers)."""
    keys = take_routing_headers(message)
    if not keys:
        return vhost.route(exchange, message.routing_key, message)
    return route_keys(vhost, exchange, [message.routing_key, *keys], message)
