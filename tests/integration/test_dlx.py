"""Dead-lettering as RabbitMQ 3.10 does it (rabbit_dead_letter.erl): the triggers (reject and
nack without requeue, expiry, overflow), where the message goes (the DLX, with the
dead-letter routing key or the original keys), the headers written (x-death, newest first,
one entry per queue and reason, x-first-death-*), CC handling, missing DLXs and cycles.

Every expectation was checked on a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py).
"""

import asyncio
import datetime

import kombu
import pika
import pytest

from conftest import Returns, drain
from .dlx_helpers import (DLRK, DLX, MAX_LENGTH, NEW_ENTRY_KEYS, TTL, bodies, deaths, get_n, get_one,
                          is_long, message_count, typed_headers, wait_count, wait_until)


def dl_pair(ch, names, dlx_type="direct", dlrk=None, bind_key="dead", **src_args):
    """A source queue whose DLX is a new exchange, and a DLQ bound to that exchange with
    `bind_key`; returns (source, dlx, dlq)."""
    src, dlx, dlq = names("src"), names("dlx"), names("dlq")
    ch.exchange_declare(dlx, dlx_type)
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, bind_key)
    args = {DLX: dlx, **src_args}
    if dlrk is not None:
        args[DLRK] = dlrk
    ch.queue_declare(src, arguments=args)
    return src, dlx, dlq


# ------------------------------------------------------------------------------ triggers

def test_reject_without_requeue_dead_letters_with_the_routing_key(channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"poison", pika.BasicProperties(
        content_type="text/plain", message_id="m1", correlation_id="c1", delivery_mode=2, priority=3,
        headers={"app": "billing"}, app_id="app", type="t", user_id="guest", reply_to="r",
        timestamp=1700000000))
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (body, method.exchange, method.routing_key, method.redelivered) == (b"poison", dlx, "dead", False)
    assert deaths(props) == [{"count": 1, "reason": "rejected", "queue": src, "exchange": "",
                              "routing-keys": [src]}]
    assert is_long(props.headers["x-death"][0]["count"])
    assert props.headers["x-first-death-queue"] == src
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-exchange"] == ""
    assert props.headers["app"] == "billing"
    # Every other property is carried unchanged.
    assert (props.content_type, props.message_id, props.correlation_id, props.delivery_mode, props.priority,
            props.app_id, props.type, props.user_id, props.reply_to, props.timestamp, props.expiration) == (
        "text/plain", "m1", "c1", 2, 3, "app", "t", "guest", "r", 1700000000, None)
    assert message_count(channel, src) == 0


def test_without_a_dead_letter_routing_key_the_original_key_is_used(channel, names):
    src, dlx, dlq = dl_pair(channel, names, bind_key="orders.created")
    x = names("in")
    channel.exchange_declare(x, "topic")
    channel.queue_bind(src, x, "orders.*")
    channel.basic_publish(x, "orders.created", b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (body, method.exchange, method.routing_key) == (b"m", dlx, "orders.created")
    assert deaths(props) == [{"count": 1, "reason": "rejected", "queue": src, "exchange": x,
                              "routing-keys": ["orders.created"]}]
    assert props.headers["x-first-death-exchange"] == x


def test_reject_with_requeue_does_not_dead_letter(channel, names):
    src, _, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = get_one(channel, src)
    assert (body, method.redelivered) == (b"m", True)
    assert message_count(channel, dlq) == 0


def test_nack_single_and_multiple(channel, names):
    src, _, dlq = dl_pair(channel, names, dlrk="dead")
    for i in range(5):
        channel.basic_publish("", src, str(i).encode())
    tags = [get_one(channel, src, auto_ack=False)[0].delivery_tag for _ in range(5)]
    channel.basic_nack(tags[1], multiple=False, requeue=False)  # just 1
    channel.basic_nack(tags[3], multiple=True, requeue=False)   # 0, 2 and 3
    got = get_n(channel, dlq, 4)
    # Single nack first; a multiple nack dead-letters in delivery-tag order.
    assert bodies(got) == [b"1", b"0", b"2", b"3"]
    assert all(deaths(p)[0]["reason"] == "rejected" for _, p, _ in got)
    channel.basic_nack(0, multiple=True, requeue=False)  # tag 0 + multiple: everything outstanding
    assert bodies(get_n(channel, dlq, 1)) == [b"4"]
    assert message_count(channel, src) == 0


def test_reject_from_a_consumer(connection, channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    for i in range(3):
        channel.basic_publish("", src, str(i).encode())
    got = []

    def on_message(ch, method, props, body):
        ch.basic_reject(method.delivery_tag, requeue=False)

    def on_dead(ch, method, props, body):
        got.append((body, method.exchange, method.routing_key, deaths(props)[0]["reason"]))

    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(src, on_message)
    channel.basic_consume(dlq, on_dead, auto_ack=True)
    wait_until(lambda: connection.process_data_events(0.02) or len(got) == 3)
    assert got == [(str(i).encode(), dlx, "dead", "rejected") for i in range(3)]


def test_unacked_messages_of_a_closed_channel_are_requeued_not_dead_lettered(connection, channel, names):
    src, _, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m")
    other = connection.channel()
    get_one(other, src, auto_ack=False)
    other.close()
    method, props, body = get_one(channel, src)
    assert (body, method.redelivered, props.headers) == (b"m", True, None)
    assert message_count(channel, dlq) == 0


def test_purge_and_delete_do_not_dead_letter(channel, names):
    src, _, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"purged")
    wait_count(channel, src, 1)
    assert channel.queue_purge(src).method.message_count == 1
    channel.basic_publish("", src, b"deleted")
    wait_count(channel, src, 1)
    channel.queue_delete(src)
    channel.queue_declare(dlq, passive=True)
    channel.basic_publish("", dlq, b"marker")  # the DLQ's only message if nothing was dead-lettered
    assert bodies(get_n(channel, dlq, 1)) == [b"marker"]
    assert message_count(channel, dlq) == 0


def test_no_dead_letter_exchange_drops_the_message(channel, names):
    src = names("plain")
    channel.queue_declare(src)
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert message_count(channel, src) == 0
    channel.basic_publish("", src, b"next")
    assert bodies(get_n(channel, src, 1)) == [b"next"]


def test_missing_dead_letter_exchange_drops_and_the_queue_keeps_working(channel, names):
    src, missing, dlq = names("src"), names("missing-dlx"), names("dlq")
    channel.queue_declare(src, arguments={DLX: missing, DLRK: "k"})
    channel.basic_publish("", src, b"lost")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.basic_publish("", src, b"later")
    method, _, body = get_one(channel, src, auto_ack=False)
    assert body == b"later"
    # Once the exchange exists, dead-lettering goes through it.
    channel.exchange_declare(missing, "direct")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, missing, "k")
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (body, method.exchange, props.headers["x-first-death-queue"]) == (b"later", missing, src)
    assert message_count(channel, dlq) == 0


def test_dead_lettered_message_that_routes_nowhere_is_dropped(connection, channel, names):
    src, _, dlq = dl_pair(channel, names, dlrk="unbound-key")
    returns = Returns(connection, channel)
    channel.basic_publish("", src, b"m", mandatory=True)
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert returns.collect(channel) == []  # dead-lettering is never mandatory
    assert message_count(channel, dlq) == 0


def test_default_exchange_as_dead_letter_exchange(channel, names):
    src, dlq = names("src"), names("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(src, arguments={DLX: "", DLRK: dlq})
    channel.basic_publish("amq.direct", "unrouted-here", b"m")  # no binding: gone
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (body, method.exchange, method.routing_key) == (b"m", "", dlq)


def test_fanout_dead_letter_exchange_reaches_every_bound_queue(channel, names):
    src, dlx = names("src"), names("dlx")
    channel.exchange_declare(dlx, "fanout")
    dlqs = [names(f"dlq{i}") for i in range(2)]
    for q in dlqs:
        channel.queue_declare(q)
        channel.queue_bind(q, dlx)
    channel.queue_declare(src, arguments={DLX: dlx})
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_nack(method.delivery_tag, requeue=False)
    for q in dlqs:
        method, _, body = get_one(channel, q)
        assert (body, method.exchange, method.routing_key) == (b"m", dlx, src)


def test_alternate_exchange_of_the_dead_letter_exchange_applies(channel, names):
    src, dlx, ae, caught = names("src"), names("dlx"), names("ae"), names("caught")
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(dlx, "direct", arguments={"alternate-exchange": ae})
    channel.queue_declare(caught)
    channel.queue_bind(caught, ae)
    channel.queue_declare(src, arguments={DLX: dlx, DLRK: "nobody"})
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, caught)
    assert (body, method.exchange, method.routing_key) == (b"m", dlx, "nobody")
    assert deaths(props)[0]["queue"] == src


# ------------------------------------------------------------------------------ CC and BCC

def test_cc_with_a_dead_letter_routing_key_is_removed(channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    x = names("in")
    channel.exchange_declare(x, "direct")
    channel.queue_bind(src, x, "main")
    cc_target = names("cc-target")
    channel.queue_declare(cc_target)
    channel.queue_bind(cc_target, dlx, "copy")
    channel.basic_publish(x, "main", b"m", pika.BasicProperties(
        headers={"CC": ["copy"], "BCC": ["hidden"], "other": "kept"}))
    method, props, _ = get_one(channel, src, auto_ack=False)
    assert props.headers == {"CC": ["copy"], "other": "kept"}  # BCC is removed at publish
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dlq)
    assert (method.exchange, method.routing_key) == (dlx, "dead")
    assert "CC" not in props.headers and "BCC" not in props.headers
    # routing-keys lists the original key and the CC keys.
    assert deaths(props) == [{"count": 1, "reason": "rejected", "queue": src, "exchange": x,
                              "routing-keys": ["main", "copy"]}]
    assert props.headers["other"] == "kept"
    channel.basic_publish("", cc_target, b"marker")  # only the DLRK was routed: no copy here
    assert bodies(get_n(channel, cc_target, 1)) == [b"marker"]


def test_cc_without_a_dead_letter_routing_key_is_kept_and_routed(channel, names):
    src, dlx, dlq = dl_pair(channel, names, bind_key="main")
    x = names("in")
    channel.exchange_declare(x, "direct")
    channel.queue_bind(src, x, "main")
    cc_target = names("cc-target")
    channel.queue_declare(cc_target)
    channel.queue_bind(cc_target, dlx, "copy")
    channel.basic_publish(x, "main", b"m", pika.BasicProperties(headers={"CC": ["copy"]}))
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    for q in (dlq, cc_target):  # the DLX routes the original key and the CC keys
        method, props, body = get_one(channel, q)
        assert (body, method.exchange, method.routing_key) == (b"m", dlx, "main")
        assert props.headers["CC"] == ["copy"]
        assert deaths(props)[0]["routing-keys"] == ["main", "copy"]
    assert (message_count(channel, dlq), message_count(channel, cc_target)) == (0, 0)


# ------------------------------------------------------------------------------ header shapes

def test_x_death_entry_keys_types_and_header_order(broker, channel, names):
    """The exact wire encoding: x-death is an array ('A') of tables ('F'); count a signed
    64-bit int ('l'), time a timestamp ('T'), routing-keys an array of long strings; the
    headers table comes back sorted by key."""
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m", pika.BasicProperties(expiration="60000", headers={"zeta": 1, "Alpha": "a"}))
    method, _, _ = get_one(channel, src, auto_ack=False)
    before = int(datetime.datetime.now().timestamp())
    channel.basic_reject(method.delivery_tag, requeue=False)
    wait_count(channel, dlq, 1)
    headers = typed_headers(broker, dlq)
    assert [(name, kind) for name, kind, _ in headers] == [
        ("Alpha", "S"), ("x-death", "A"), ("x-first-death-exchange", "S"), ("x-first-death-queue", "S"),
        ("x-first-death-reason", "S"), ("zeta", "I")]  # pika sends small ints as 'I': kept
    (entry_kind, entry), = dict((n, v) for n, _, v in headers)["x-death"]
    assert entry_kind == "F"
    assert [(k, t) for k, t, _ in entry] == [
        ("count", "l"), ("reason", "S"), ("queue", "S"), ("time", "T"), ("exchange", "S"),
        ("routing-keys", "A"), ("original-expiration", "S")]
    values = {k: v for k, _, v in entry}
    assert values["count"] == 1 and values["reason"] == "rejected" and values["queue"] == src
    assert values["exchange"] == "" and values["routing-keys"] == [("S", src)]
    assert values["original-expiration"] == "60000"
    assert before - 1 <= values["time"] <= before + 5  # seconds since the epoch
    assert [k for k, _, _ in entry][:len(NEW_ENTRY_KEYS)] == NEW_ENTRY_KEYS


def test_x_death_order_counts_and_first_death(channel, names):
    """A rejected from A, then B, then A again: entries newest first, A's count goes to 2 and
    its entry moves to the front (keys then sorted, its other fields those of the first
    death); x-first-death-* stay those of the first death."""
    a, b = names("a"), names("b")
    channel.queue_declare(a, arguments={DLX: "", DLRK: b})
    channel.queue_declare(b, arguments={DLX: "", DLRK: a})

    def bounce(q):
        method, _, _ = get_one(channel, q, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)

    channel.basic_publish("", a, b"m", pika.BasicProperties(headers={"app": 1}))
    bounce(a)
    method, props, _ = get_one(channel, b, auto_ack=False)
    assert deaths(props) == [{"count": 1, "reason": "rejected", "queue": a, "exchange": "", "routing-keys": [a]}]
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, _ = get_one(channel, a, auto_ack=False)
    assert (method.exchange, method.routing_key) == ("", a)
    assert deaths(props) == [
        {"count": 1, "reason": "rejected", "queue": b, "exchange": "", "routing-keys": [b]},
        {"count": 1, "reason": "rejected", "queue": a, "exchange": "", "routing-keys": [a]}]
    first_time = props.headers["x-death"][1]["time"]
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, _ = get_one(channel, b)
    entries = props.headers["x-death"]
    assert deaths(props) == [
        {"count": 2, "exchange": "", "queue": a, "reason": "rejected", "routing-keys": [a]},
        {"count": 1, "reason": "rejected", "queue": b, "exchange": "", "routing-keys": [b]}]
    # Only the very first entry (written when the message had no x-death) has its keys in
    # NEW_ENTRY_KEYS order; every entry written or updated later has them sorted. The
    # updated entry's time is still the first death's.
    assert list(entries[0]) == ["count", "exchange", "queue", "reason", "routing-keys", "time"]
    assert list(entries[1]) == ["count", "exchange", "queue", "reason", "routing-keys", "time"]
    assert entries[0]["time"] == first_time
    assert is_long(entries[0]["count"])
    assert (props.headers["x-first-death-queue"], props.headers["x-first-death-reason"],
            props.headers["x-first-death-exchange"]) == (a, "rejected", "")
    assert props.headers["app"] == 1


def test_x_death_entries_reordering_on_each_death(channel, names):
    """Four queues rejecting round a ring, twice. On every death RabbitMQ 3.10
    (rabbit_dead_letter:update_x_death_header/2) puts the entry of this queue and reason
    first (new, or updated with count + 1) and the other entries after it in the REVERSE of
    their previous order (its group_by_queue_and_reason folds them into a list back to front;
    a single entry is left as is). Only the first entry ever written keeps make_msg's key
    order; entries written or updated later have their keys sorted."""
    qs = [names(f"ring{i}") for i in range(4)]
    for i, q in enumerate(qs):
        channel.queue_declare(q, arguments={DLX: "", DLRK: qs[(i + 1) % 4]})
    channel.basic_publish("", qs[0], b"m", pika.BasicProperties(expiration="60000"))
    seen = []
    for step in range(9):
        q = qs[step % 4]
        method, props, _ = get_one(channel, q, auto_ack=False)
        seen.append([(qs.index(d["queue"]), d["count"]) for d in (props.headers or {}).get("x-death", [])])
        if step == 8:
            entries = props.headers["x-death"]
        channel.basic_reject(method.delivery_tag, requeue=False)
    assert seen == [
        [],
        [(0, 1)],
        [(1, 1), (0, 1)],
        [(2, 1), (0, 1), (1, 1)],
        [(3, 1), (1, 1), (0, 1), (2, 1)],
        [(0, 2), (2, 1), (1, 1), (3, 1)],
        [(1, 2), (3, 1), (2, 1), (0, 2)],
        [(2, 2), (0, 2), (3, 1), (1, 2)],
        [(3, 2), (1, 2), (0, 2), (2, 2)],
    ]
    sorted_keys = ["count", "exchange", "queue", "reason", "routing-keys", "time"]
    assert [list(e) for e in entries] == [sorted_keys, sorted_keys, sorted_keys[:2] + ["original-expiration"]
                                          + sorted_keys[2:], sorted_keys]
    assert entries[2]["original-expiration"] == "60000"  # kept from the first death


def test_same_queue_different_reasons_get_separate_entries(channel, names):
    """a expires the message (per-message TTL) to b, b rejects it back to a, a rejects it
    to b: a has two entries, one per reason."""
    a, b = names("a"), names("b")
    channel.queue_declare(a, arguments={DLX: "", DLRK: b})
    channel.queue_declare(b, arguments={DLX: "", DLRK: a})
    channel.basic_publish("", a, b"m", pika.BasicProperties(expiration="50"))
    method, props, _ = get_one(channel, b, auto_ack=False)  # a: expired
    assert props.expiration is None
    channel.basic_reject(method.delivery_tag, requeue=False)  # b: rejected, back to a (no TTL now)
    method, props, _ = get_one(channel, a, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=True)  # a requeue changes nothing
    method, props, _ = get_one(channel, a, auto_ack=False)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [(b, "rejected", 1), (a, "expired", 1)]
    channel.basic_reject(method.delivery_tag, requeue=False)  # a: rejected
    method, props, _ = get_one(channel, b)
    # The new entry goes first; RabbitMQ 3.10 reverses the order of the others (see
    # test_x_death_entries_reordering_on_each_death).
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [
        (a, "rejected", 1), (a, "expired", 1), (b, "rejected", 1)]
    assert "original-expiration" not in deaths(props)[0]
    assert deaths(props)[1]["original-expiration"] == "50"
    assert props.headers["x-first-death-reason"] == "expired"


def test_republished_x_death_header_of_the_wrong_type_is_replaced(channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m", pika.BasicProperties(headers={"x-death": "not an array"}))
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, _ = get_one(channel, dlq)
    assert deaths(props) == [{"count": 1, "reason": "rejected", "queue": src, "exchange": "",
                              "routing-keys": [src]}]
    # The header was present (if unusable): no x-first-death-* are added.
    assert not any(k.startswith("x-first-death") for k in props.headers)


def test_client_supplied_x_death_array_is_continued(channel, names):
    """A consumer that republishes a dead-lettered message as it got it (the DLQ drain
    pattern) keeps its history: the next death adds to it."""
    a, dlq = names("a"), names("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(a, arguments={DLX: "", DLRK: dlq})
    channel.basic_publish("", a, b"m")
    method, _, _ = get_one(channel, a, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, props, body = get_one(channel, dlq)
    channel.basic_publish("", a, body, props)  # republish unchanged
    method, _, _ = get_one(channel, a, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, props, _ = get_one(channel, dlq)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [(a, "rejected", 2)]
    assert props.headers["x-first-death-queue"] == a


# ------------------------------------------------------------------------------ other triggers

def test_expired_message_dead_lettered_with_original_expiration(channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m", pika.BasicProperties(expiration="50"))
    method, props, body = get_one(channel, dlq)
    assert (body, method.exchange, method.routing_key, props.expiration) == (b"m", dlx, "dead", None)
    assert deaths(props) == [{"count": 1, "reason": "expired", "queue": src, "exchange": "",
                              "routing-keys": [src], "original-expiration": "50"}]
    assert props.headers["x-first-death-reason"] == "expired"


def test_maxlen_drop_head_dead_letters_the_head(channel, names):
    src, dlx, dlq = dl_pair(channel, names, dlrk="dead", **{MAX_LENGTH: 1})
    for i in range(3):
        channel.basic_publish("", src, str(i).encode())
    got = get_n(channel, dlq, 2)
    assert bodies(got) == [b"0", b"1"]
    assert [deaths(p)[0]["reason"] for _, p, _ in got] == ["maxlen", "maxlen"]
    assert bodies(get_n(channel, src, 1)) == [b"2"]


# ------------------------------------------------------------------------------ cycles

def test_expiry_back_to_the_same_queue_is_dropped(channel, names):
    """A queue whose TTL dead-letters into itself: RabbitMQ detects the cycle (the message's
    x-death already names the queue with no rejection since) and drops that copy; other
    queues the DLX routes to still get theirs."""
    src, dlx, watch = names("self"), names("dlx"), names("watch")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(src, arguments={DLX: dlx, TTL: 50})
    channel.queue_declare(watch)
    channel.queue_bind(src, dlx)
    channel.queue_bind(watch, dlx)
    channel.basic_publish("", src, b"m")
    method, props, body = get_one(channel, watch)
    assert deaths(props) == [{"count": 1, "reason": "expired", "queue": src, "exchange": "", "routing-keys": [src]}]
    wait_count(channel, src, 0)
    channel.basic_publish("", watch, b"marker")
    assert bodies(get_n(channel, watch, 1)) == [b"marker"]  # exactly one dead-lettered copy
    assert message_count(channel, src) == 0


def test_expiry_cycle_through_two_queues_is_dropped(channel, names):
    a, b, watch = names("a"), names("b"), names("watch")
    xa, xb = names("xa"), names("xb")  # fanout DLXs: a's to b and watch, b's to a and watch
    for x in (xa, xb):
        channel.exchange_declare(x, "fanout")
    channel.queue_declare(a, arguments={DLX: xa, TTL: 50})
    channel.queue_declare(b, arguments={DLX: xb, TTL: 50})
    channel.queue_declare(watch)
    for q, x in ((b, xa), (watch, xa), (a, xb), (watch, xb)):
        channel.queue_bind(q, x)
    channel.basic_publish("", a, b"m")
    got = get_n(channel, watch, 2)
    assert [[(d["queue"], d["reason"], d["count"]) for d in deaths(p)] for _, p, _ in got] == [
        [(a, "expired", 1)], [(b, "expired", 1), (a, "expired", 1)]]
    wait_count(channel, a, 0)
    wait_count(channel, b, 0)
    channel.basic_publish("", watch, b"marker")
    assert bodies(get_n(channel, watch, 1)) == [b"marker"]


def test_cycle_with_a_rejection_keeps_going(channel, names):
    """Reject from A to B (TTL 50 ms), expire back to A: a rejection in the cycle means a
    client is in the loop, so RabbitMQ delivers it each time; both counts grow."""
    a, b = names("a"), names("b")
    channel.queue_declare(a, arguments={DLX: "", DLRK: b})
    channel.queue_declare(b, arguments={DLX: "", DLRK: a, TTL: 50})
    channel.basic_publish("", a, b"m")
    for attempt in range(1, 5):
        method, props, body = get_one(channel, a, auto_ack=False)
        if attempt == 1:
            assert props.headers is None
        else:
            assert (method.exchange, method.routing_key) == ("", a)
            assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [
                (b, "expired", attempt - 1), (a, "rejected", attempt - 1)]
        channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, a)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(props)] == [(b, "expired", 4), (a, "rejected", 4)]


# ------------------------------------------------------------------------------ other clients

@pytest.mark.asyncio
async def test_aio_pika_reject_to_dead_letter_queue(broker, uid):
    import aio_pika

    connection = await aio_pika.connect(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        dlx = await channel.declare_exchange(f"aio-dlx-{uid}", aio_pika.ExchangeType.DIRECT, auto_delete=True)
        dlq = await channel.declare_queue(f"aio-dlq-{uid}", auto_delete=True)
        await dlq.bind(dlx, routing_key="failed")
        work = await channel.declare_queue(f"aio-work-{uid}", auto_delete=True, arguments={
            DLX: dlx.name, DLRK: "failed"})
        await channel.default_exchange.publish(aio_pika.Message(b"job", headers={"n": 1}), routing_key=work.name)
        message = await work.get(timeout=5)
        await message.reject(requeue=False)
        dead = None
        for _ in range(250):
            dead = await dlq.get(fail=False)
            if dead is not None:
                break
            await asyncio.sleep(0.02)
        assert dead is not None
        await dead.ack()
        assert (dead.body, dead.exchange, dead.routing_key) == (b"job", dlx.name, "failed")
        (entry,) = dead.headers["x-death"]
        assert (entry["count"], entry["reason"], entry["queue"], entry["exchange"], entry["routing-keys"]) == (
            1, "rejected", work.name, "", [work.name])
        assert isinstance(entry["time"], datetime.datetime)
        assert dead.headers["x-first-death-queue"] == work.name


def test_kombu_reject_to_dead_letter_queue(broker, uid):
    url = f"pyamqp://guest:guest@{broker.host}:{broker.port}//"
    dlx = kombu.Exchange(f"kombu-dlx-{uid}", type="direct", auto_delete=True)
    dlq = kombu.Queue(f"kombu-dlq-{uid}", dlx, routing_key="failed", auto_delete=True)
    work = kombu.Queue(f"kombu-work-{uid}", auto_delete=True, queue_arguments={
        DLX: dlx.name, DLRK: "failed"})
    with kombu.Connection(url, connect_timeout=5) as conn:
        bound_dlq = dlq(conn.default_channel)
        bound_dlq.declare()
        bound_work = work(conn.default_channel)
        bound_work.declare()
        with conn.Producer() as producer:
            producer.publish({"job": 1}, routing_key=work.name, serializer="json")
        message = wait_until(lambda: bound_work.get())
        message.reject()
        dead = wait_until(lambda: bound_dlq.get(accept=["json"]))
        assert dead.payload == {"job": 1}
        assert (dead.delivery_info["exchange"], dead.delivery_info["routing_key"]) == (dlx.name, "failed")
        (entry,) = dead.headers["x-death"]
        assert (entry["count"], entry["reason"], entry["queue"]) == (1, "rejected", work.name)
        dead.ack()
        bound_work.delete()
        bound_dlq.delete()


def test_drain_helper_sees_nothing_left(channel, names):
    """After dead-lettering, the source queue holds nothing (no ghost copy)."""
    src, _, dlq = dl_pair(channel, names, dlrk="dead")
    channel.basic_publish("", src, b"m")
    method, _, _ = get_one(channel, src, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    get_one(channel, dlq)
    assert drain(channel, src) == [] and drain(channel, dlq) == []
