"""What a dead-lettered message becomes, byte for byte as RabbitMQ 3.10 makes it
(rabbit_dead_letter:make_msg and detect_cycles).

The new message keeps the body and every property but `expiration`; its headers table gets
an "x-death" array with one table per (queue, reason), newest first, and the first death
also "x-first-death-reason/-queue/-exchange". RabbitMQ's quirks are kept because clients
read these headers: the first death's table is in RabbitMQ's field order (count, reason,
queue, time, exchange, routing-keys[, original-expiration]) while a table written on a later
death is sorted by key; a repeated death in the same queue and for the same reason only
increments that table's count and moves it to the front; the headers table is sorted by
key; entries from before RabbitMQ 3.5 (several per queue and reason) are merged.
"""

from __future__ import annotations

import logging

from ..amqp import reencode as rt
from ..amqp.codec import shortstr
from ..amqp.message import Message
from ..amqp.properties import FLAG_EXPIRATION, FLAG_HEADERS
from .sender_selected import header_routes

log = logging.getLogger("warren.dead_letter")

X_DEATH = b"x-death"
_TABLE, _ARRAY = 0x46, 0x41
_REJECTED = rt.longstr_value(b"rejected")


def _bytes(name: str) -> bytes:
    # Names read from the wire may hold lone surrogates for bytes that are not UTF-8.
    return name.encode("utf-8", "surrogateescape")


def dead_letter_message(message: Message, reason: str, queue: str, dlx: str, dlrk: str | None,
                        now: int) -> tuple[Message, list[str]]:
    """The message `queue` dead-letters to exchange `dlx` for `reason` ("rejected",
    "expired", "maxlen", "delivery_limit"), and the routing keys to route it with.

    With a dead-letter routing key `dlrk`, that is the only key and the CC header goes;
    without, the keys are the message's own: its routing key and those its CC and BCC
    headers added (message.cc_keys, or the CC header when those are not known). Deliveries
    of the new message name `dlx` and the first key. `now` is the time of death in seconds
    since the epoch. The body is shared, not copied."""
    props = rt.split_header(message.header)
    table = props.get(FLAG_HEADERS)
    headers = rt.table_fields(table) if table is not None else []
    routes = header_routes(headers)
    info: list[rt.Field] = [
        (b"reason", rt.longstr_value(reason.encode())),
        (b"queue", rt.longstr_value(_bytes(queue))),
        (b"time", rt.timestamp_value(now)),
        (b"exchange", rt.longstr_value(_bytes(message.exchange))),
        # The publish's routing key, then the CC keys (BCC left the header at publish).
        (b"routing-keys", rt.array_value([rt.longstr_value(k) for k in [_bytes(message.routing_key), *routes]])),
    ]
    expiration = props.pop(FLAG_EXPIRATION, None)
    if expiration is not None:
        info.append((b"original-expiration", rt.longstr_value(expiration[1:])))
    headers = _update_x_death(info, headers)
    if dlrk is not None:
        headers = rt.delete_field(headers, b"CC")
        keys = [dlrk]
    else:
        extra = message.cc_keys
        if extra is None:
            extra = tuple(k.decode("utf-8", "surrogateescape") for k in routes)
        keys = [message.routing_key, *extra]
    # RabbitMQ encodes the whole property record again: every value as it re-encodes it.
    props[FLAG_HEADERS] = rt.encode_fields([(k, rt.normalized(v)) for k, v in headers])
    header = rt.join_header(message.header, props)
    dead = Message(dlx, keys[0], shortstr(dlx) + shortstr(keys[0]), header, message.body)
    if len(keys) > 1:
        dead.cc_keys = tuple(keys[1:])
    return dead, keys


def _update_x_death(info: list[rt.Field], headers: list[rt.Field]) -> list[rt.Field]:
    """rabbit_dead_letter:update_x_death_header."""
    reason, queue, exchange = (rt.lookup(info, k) for k in (b"reason", b"queue", b"exchange"))
    assert reason is not None and queue is not None and exchange is not None
    first = [(b"count", rt.long_value(1)), *info]
    x_death = rt.lookup(headers, X_DEATH)
    if x_death is None:
        headers = rt.set_table_value(headers, b"x-first-death-reason", reason)
        headers = rt.set_table_value(headers, b"x-first-death-queue", queue)
        headers = rt.set_table_value(headers, b"x-first-death-exchange", exchange)
        return rt.set_table_value(headers, X_DEATH, rt.array_value([rt.table_value(first)]))
    if x_death[0] != _ARRAY:
        # Clients that consume and republish sometimes turn it into a string (rabbitmq-server#767).
        log.warning("Message has invalid x-death header (type: %s). Resetting header %r",
                    rt.type_name(x_death), x_death)
        return rt.set_table_value(headers, X_DEATH, rt.array_value([rt.table_value(first)]))
    key = (rt.erlang_term(queue), rt.erlang_term(reason))
    entry: list[rt.Field] | None = None
    others = []
    for item in _group_by_queue_and_reason(rt.array_items(x_death)):
        if entry is None and item[0] == _TABLE:
            fields = rt.table_fields(item[1:])
            if _event_key(fields) == key:
                entry = _increment_count(fields)
                continue
        others.append(item)
    if entry is None:
        entry = first
    return rt.set_table_value(headers, X_DEATH, rt.array_value([rt.table_value(rt.sort_fields(entry)), *others]))


def _event_key(fields: list[rt.Field]) -> tuple:
    return rt.erlang_term(rt.lookup(fields, b"queue")), rt.erlang_term(rt.lookup(fields, b"reason"))


def _group_by_queue_and_reason(items: list[bytes]) -> list[bytes]:
    """Entries written before RabbitMQ 3.5 (one per death) merged into one per (queue,
    reason): the first of each with a count of how many there were (unless it has a count).
    As RabbitMQ's fold, the result is in reverse order of first appearance. An array with
    something else than tables crashes RabbitMQ's queue (the message is lost): here it is
    left as it is."""
    if len(items) < 2 or any(item[0] != _TABLE for item in items):
        return items
    tables = [rt.table_fields(item[1:]) for item in items]
    keys = [_event_key(t) for t in tables]
    grouped: list[bytes] = []
    seen: set = set()
    for item, fields, key in zip(items, tables, keys):
        if key in seen:
            continue
        seen.add(key)
        if rt.erlang_term(rt.lookup(fields, b"count")) is None:
            item = rt.table_value([(b"count", rt.long_value(keys.count(key))), *fields])
        grouped.insert(0, item)
    return grouped


def _increment_count(fields: list[rt.Field]) -> list[rt.Field]:
    count = rt.lookup(fields, b"count")
    if rt.erlang_term(count) is None:
        return [(b"count", rt.long_value(1)), *fields]
    # A count that is no integer makes RabbitMQ's queue crash (badarith): counted from 0 here.
    n = rt.integer(count) or 0
    out = list(fields)
    for i, (k, _) in enumerate(out):
        if k == b"count":
            out[i] = (b"count", rt.long_value(n + 1))
            break
    return out


def detect_cycles(message: Message, reason: str, queue_names: list[str]) -> dict[str, list[str]]:
    """rabbit_dead_letter:detect_cycles: of the queues the dead-lettered `message` (as
    dead_letter_message made it) was routed to, those that would close a cycle of
    dead-lettering with no rejection in it; the message must not go to them. Maps each to
    the cycle RabbitMQ logs: that queue, then the queue of every x-death entry, newest first
    ("Message dropped. Dead-letter queues cycle detected: [...]"). Nothing is dropped for
    reason "rejected": a client decided."""
    if reason == "rejected" or not queue_names:
        return {}
    table = rt.split_header(message.header).get(FLAG_HEADERS)
    if table is None:
        return {}
    x_death = rt.lookup(rt.table_fields(table), X_DEATH)
    if x_death is None or x_death[0] != _ARRAY:
        return {}
    deaths = [rt.table_fields(d[1:]) if d[0] == _TABLE else None for d in rt.array_items(x_death)]
    death_queues = [rt.lookup(d, b"queue") if d is not None else None for d in deaths]
    cycles: dict[str, list[str]] = {}
    for name in queue_names:
        if _is_cycle(rt.longstr_value(_bytes(name)), deaths, death_queues):
            old = [q.decode("utf-8", "surrogateescape") for q in map(rt.longstr, death_queues) if q is not None]
            cycles[name] = [name, *old]
    return cycles


def _is_cycle(queue: bytes, deaths: list, death_queues: list) -> bool:
    """rabbit_dead_letter:is_cycle: the message died in `queue` before, and every death since
    (that one included) was automatic: no "rejected" and nothing a client put there."""
    for n, q in enumerate(death_queues):
        if q == queue:
            return all(d is not None and rt.lookup(d, b"reason") != _REJECTED for d in deaths[:n + 1])
    return False
