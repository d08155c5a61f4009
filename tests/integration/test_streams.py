"""x-queue-type=stream over AMQP 0-9-1, as RabbitMQ 3.10 runs it on one node
(rabbit_stream_queue.erl on osiris): declare rules and argument checks, what a stream refuses
(basic.get, purge, nack/reject, no-ack consumers), the x-stream-offset consumer argument and
header, consumer credit, retention by size and age (arguments and policies), dead-lettering
into a stream and what the management API shows. Every case was checked on RabbitMQ 3.10.8.

Messages are published one at a time, each confirmed before the next, wherever the tests count
deliveries: RabbitMQ writes every confirmed publish as its own chunk then, and a chunk is what
it reads and delivers as a whole ("last" is the start of the last chunk; a consumer gets all of
a chunk's messages even beyond its credit). Consumers are pumped until they have what they
should, and asynchronous things (retention, statistics, dead-lettering) are polled for."""

import asyncio
import datetime
import decimal
import os
import time
import uuid

import pika
import pytest
import requests
from pamqp import commands as c

from conftest import EXTERNAL, RABBITMQ, channel_error, connection_error, pump
from rawamqp import FRAME_BODY, FRAME_HEADER, connect
from .dlx_helpers import _content_header_table, get_one, is_long, policies, wait_until

STREAM = {"x-queue-type": "stream"}
MGMT = os.environ.get("WARREN_TEST_MGMT")
INTERNAL_ERROR = (541, "INTERNAL_ERROR")
assert policies  # the fixture (rabbitmqctl set_policy on RabbitMQ, warrenctl on Warren)


def stream(ch, name, **args):
    """Declare a (durable) stream with these x-arguments (x_max_age=... for x-max-age)."""
    ch.queue_declare(name, durable=True, arguments={**STREAM, **{k.replace("_", "-"): v for k, v in args.items()}})
    return name


def publish(connection, q, bodies, properties=None, exchange="", routing_key=None):
    """Publish each body (bytes, or str() of it) on a confirm channel, waiting for its confirm
    before the next: one message per chunk. properties: BasicProperties, or a function of the
    body giving them."""
    ch = connection.channel()
    ch.confirm_delivery()
    for body in bodies:
        props = properties(body) if callable(properties) else properties
        ch.basic_publish(exchange, q if routing_key is None else routing_key,
                         body if isinstance(body, bytes) else str(body).encode(), props)
    ch.close()


def offset_of(props):
    return props.headers["x-stream-offset"]


class Consumer:
    """A pika consumer on its own channel of `connection`, with basic.qos(prefetch) first;
    keeps (method, properties, body) of each delivery and acks it unless ack=False."""

    def __init__(self, connection, q, offset="first", prefetch=100, ack=True, exclusive=False, arguments=None):
        self.connection = connection
        self.ack = ack
        self.got = []
        self.ch = connection.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        args = dict(arguments or {})
        if offset is not None:
            args["x-stream-offset"] = offset
        self.tag = self.ch.basic_consume(q, self._on_message, arguments=args or None, exclusive=exclusive)

    def _on_message(self, ch, method, props, body):
        self.got.append((method, props, body))
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    def wait(self, n, timeout=5.0):
        """Pump until at least n deliveries arrived; returns self."""
        pump(self.connection, lambda: len(self.got) >= n, timeout)
        return self

    def idle(self, seconds=0.3):
        """Pump for `seconds` (to see that nothing more arrives); returns self."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.02)
        return self

    @property
    def offsets(self):
        return [offset_of(props) for _, props, _ in self.got]

    @property
    def bodies(self):
        return [body.decode() for _, _, body in self.got]


def new_connection(broker):
    return pika.BlockingConnection(broker.pika_params())


@pytest.fixture(scope="module")
def ten(broker):
    """A stream holding "0".."9" at offsets 0..9 (each its own chunk, headers {"i": n}), which
    tests only read."""
    conn = new_connection(broker)
    q = f"stream-ten-{uuid.uuid4().hex[:10]}"
    stream(conn.channel(), q)
    publish(conn, q, range(10), lambda i: pika.BasicProperties(headers={"i": i}))
    conn.close()
    yield q
    conn = new_connection(broker)
    conn.channel().queue_delete(q)
    conn.close()


@pytest.fixture
def api(broker):
    """The management API's URL, or None when RabbitMQ runs without it."""
    if EXTERNAL and not MGMT:
        return None
    return MGMT if EXTERNAL else broker.api


def queue_json(api, q):
    return requests.get(f"{api}/queues/%2F/{q}", auth=("guest", "guest"), timeout=10).json()


def wait_json(api, q, until):
    """The queue's management JSON once until(json) holds (RabbitMQ fills in a stream's
    statistics, policy included, every 5 s)."""
    return wait_until(lambda: (lambda d: d if until(d) else None)(queue_json(api, q)), timeout=8, interval=0.2,
                      what=f"the management API's {q}")


# ------------------------------------------------------------------------- declare
@pytest.mark.parametrize("durable, exclusive, auto_delete, prop", [
    (False, False, False, "non-durable"),
    (True, True, False, "exclusive-owner"),
    (False, True, False, "exclusive-owner"),
    (True, False, True, "auto-delete"),
    (False, False, True, "auto-delete"),
    (True, True, True, "auto-delete"),  # auto-delete is checked first, then exclusive
])
def test_streams_are_durable_only(channel, uid, durable, exclusive, auto_delete, prop):
    q = f"sprop-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                                                arguments=STREAM), 406,
                  f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{q}' in vhost '/'")


@pytest.mark.parametrize("durable", [True, False])
def test_server_named_stream_is_refused(channel, durable):
    channel_error(lambda: channel.queue_declare("", durable=durable, arguments={**STREAM, "x-max-priority": 1}), 406,
                  "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")


@pytest.mark.parametrize("key, value", [
    ("x-max-priority", 5), ("x-message-ttl", 1000), ("x-dead-letter-exchange", "dlx"),
    ("x-dead-letter-routing-key", "rk"), ("x-max-length", 10), ("x-overflow", "drop-head"), ("x-expires", 10000),
    ("x-single-active-consumer", True), ("x-queue-mode", "lazy"), ("x-delivery-limit", 3),
    ("x-max-in-memory-length", 5), ("x-max-in-memory-bytes", 5), ("x-dead-letter-strategy", "at-most-once"),
    ("x-quorum-initial-group-size", 1), ("x-queue-version", 2), ("x-queue-master-locator", "client-local"),
    ("x-overflow", "bogus"),  # refused as a key: its value is never looked at
])
def test_arguments_of_other_queue_types_are_refused(channel, uid, key, value):
    q = f"sarg-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=True, arguments={**STREAM, key: value}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/' "
                  "of queue type rabbit_stream_queue")


def test_check_order_values_then_keys_then_properties(connection, uid):
    """Argument values are checked first, then argument keys, then the declare's properties;
    the segment size maximum only after the properties."""
    q = f"sorder-{uid}"
    for kwargs, text in [
        (dict(durable=False, arguments={**STREAM, "x-max-priority": 5, "x-max-age": "10x"}),
         f"invalid arg 'x-max-age' for queue '{q}' in vhost '/': invalid_max_age"),
        (dict(durable=False, arguments={**STREAM, "x-max-priority": 5}),
         f"invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_stream_queue"),
        (dict(durable=False, arguments={**STREAM, "x-stream-max-segment-size-bytes": 3_000_000_001}),
         f"invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    ]:
        ch = connection.channel()
        channel_error(lambda: ch.queue_declare(q, **kwargs), 406, "PRECONDITION_FAILED - " + text)


@pytest.mark.parametrize("args", [
    {"x-max-length-bytes": 100000}, {"x-max-length-bytes": 0}, {"x-max-length-bytes": 2 ** 40},
    {"x-max-age": "7D"}, {"x-max-age": "12h"}, {"x-max-age": "30m"}, {"x-max-age": "10s"}, {"x-max-age": "1Y"},
    {"x-max-age": "1M"}, {"x-max-age": "01s"},
    {"x-max-age": "1s\nthe rest"},  # (RabbitMQ's unit ends at the end of the first line)
    {"x-stream-max-segment-size-bytes": 1000}, {"x-stream-max-segment-size-bytes": 3_000_000_000},
    {"x-queue-leader-locator": "client-local"}, {"x-queue-leader-locator": "balanced"},
    {"x-initial-cluster-size": 1}, {"x-initial-cluster-size": 3},
    {"x-custom": 1, "x-cancel-on-ha-failover": True},  # unknown: ignored
], ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
def test_accepted_arguments(channel, names, args):
    q = names("sok")
    ok = channel.queue_declare(q, durable=True, arguments={**STREAM, **args}).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 0)


@pytest.mark.parametrize("key, value, detail", [
    ("x-max-age", "10x", "invalid_max_age"),
    ("x-max-age", "0s", "invalid_max_age"),
    ("x-max-age", "10", "invalid_max_age"),
    ("x-max-age", "1d", "invalid_max_age"),  # units are Y M D h m s, case-sensitive
    ("x-max-age", "1 h", "invalid_max_age"),
    ("x-max-age", 10, "{unacceptable_type,signedint}"),
    ("x-max-age", 2 ** 40, "{unacceptable_type,long}"),
    ("x-max-age", True, "{unacceptable_type,bool}"),
    ("x-max-length-bytes", -1, "{value_negative,-1}"),
    ("x-max-length-bytes", "a", '"expected integer, got longstr"'),
    ("x-stream-max-segment-size-bytes", -1, "{value_negative,-1}"),
    ("x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ("x-initial-cluster-size", 0, "{value_zero,0}"),
    ("x-initial-cluster-size", -1, "{value_negative,-1}"),
])
def test_invalid_argument_values(channel, uid, key, value, detail):
    q = f"sbad-{uid}"
    channel_error(lambda: channel.queue_declare(q, durable=True, arguments={**STREAM, key: value}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/': {detail}")


@pytest.mark.parametrize("value", ["abc", "", "s", "-1s"])
def test_max_age_without_leading_digits(connection, uid, value):
    """RabbitMQ's parser takes the leading digits and crashes on an empty digit string (541);
    Warren refuses these as it refuses "10x"."""
    ch = connection.channel()
    declare = lambda: ch.queue_declare(f"sage-{uid}", durable=True, arguments={**STREAM, "x-max-age": value})
    if RABBITMQ:
        connection_error(declare, *INTERNAL_ERROR)
    else:
        channel_error(declare, 406, f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 'sage-{uid}' in vhost "
                                    "'/': invalid_max_age")


def test_segment_size_above_the_maximum(channel, uid):
    channel_error(lambda: channel.queue_declare(f"sseg-{uid}", durable=True,
                                                arguments={**STREAM, "x-stream-max-segment-size-bytes": 3_000_000_001}),
                  406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes")


def test_redeclare_compares_the_stream_arguments(connection, names):
    q = names("sre")
    ch = connection.channel()
    stream(ch, q, x_max_age="1D")
    stream(ch, q, x_max_age="1D")
    # keys that are not the stream's own are neither compared nor checked on a redeclare
    stream(ch, q, x_max_age="1D", x_custom=5, x_max_priority=5)
    assert ch.queue_declare(q, passive=True).method.queue == q
    assert ch.queue_declare(q, durable=False, passive=True).method.queue == q
    for kwargs, text in [
        (dict(x_max_age="2D"), "received '2D' but current is '1D'"),
        (dict(x_max_age="24h"), "received '24h' but current is '1D'"),  # compared as written
        (dict(), "received none but current is the value '1D' of type 'longstr'"),
    ]:
        ch = connection.channel()
        channel_error(lambda: stream(ch, q, **kwargs), 406,
                      f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue '{q}' in vhost '/': {text}")
    for key, value, text in [
        ("x_max_length_bytes", 1000, "the value '1000' of type 'signedint'"),
        ("x_stream_max_segment_size_bytes", 1000, "the value '1000' of type 'signedint'"),
        ("x_initial_cluster_size", 1, "the value '1' of type 'signedint'"),
        ("x_queue_leader_locator", "balanced", "the value 'balanced' of type 'longstr'"),
    ]:
        ch = connection.channel()
        channel_error(lambda: stream(ch, q, x_max_age="1D", **{key: value}), 406,
                      f"PRECONDITION_FAILED - inequivalent arg '{key.replace('_', '-')}' for queue '{q}' "
                      f"in vhost '/': received {text} but current is none")


def test_redeclare_with_another_type_or_flags(connection, names):
    q = names("sretype")
    stream(connection.channel(), q)
    prefix = f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{q}' in vhost '/': "
    for kwargs, code, text in [
        (dict(durable=True, arguments={"x-queue-type": "classic"}), 406,
         prefix + "received 'classic' but current is 'stream'"),
        (dict(durable=True, arguments={"x-queue-type": "quorum"}), 406,
         prefix + "received 'quorum' but current is 'stream'"),
        (dict(durable=True), 406, prefix + "received none but current is the value 'stream' of type 'longstr'"),
        (dict(durable=False, arguments=STREAM), 406,
         f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': "
         "received 'false' but current is 'true'"),
        (dict(durable=True, auto_delete=True, arguments=STREAM), 406,
         f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{q}' in vhost '/': "
         "received 'true' but current is 'false'"),
        (dict(durable=True, exclusive=True, arguments=STREAM), 405,
         f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. It could be "
         "originally declared on another connection or the exclusive property value does not match that of "
         "the original declaration."),
    ]:
        ch = connection.channel()
        channel_error(lambda: ch.queue_declare(q, **kwargs), code, text)


def test_other_types_redeclared_as_stream(connection, names):
    cq, qq = names("scq"), names("sqq")
    ch = connection.channel()
    ch.queue_declare(cq, durable=True)
    ch.queue_declare(qq, durable=True, arguments={"x-queue-type": "quorum"})
    channel_error(lambda: stream(ch, cq), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{cq}' in vhost '/': "
                  "received the value 'stream' of type 'longstr' but current is none")
    ch = connection.channel()
    channel_error(lambda: stream(ch, qq), 406,
                  f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{qq}' in vhost '/': "
                  "received 'stream' but current is 'quorum'")


def test_declare_ok_counts_messages_but_never_consumers(connection, names):
    """message_count is the number of messages in the stream (RabbitMQ takes it from statistics
    refreshed every 5 s, so it lags); consumer_count is always 0."""
    q = stream(connection.channel(), names("scount"))
    publish(connection, q, range(3))
    consumer = Consumer(connection, q).wait(3)
    ch = connection.channel()

    def counts():
        passive = ch.queue_declare(q, passive=True).method
        active = ch.queue_declare(q, durable=True, arguments=STREAM).method
        return [(passive.message_count, passive.consumer_count), (active.message_count, active.consumer_count)]
    wait_until(lambda: counts()[0][0] == 3, timeout=8, interval=0.1)
    assert counts() == [(3, 0), (3, 0)]
    assert consumer.offsets == [0, 1, 2]


# ------------------------------------------------------------- get, purge, delete
@pytest.mark.parametrize("auto_ack", [False, True])
def test_basic_get_is_not_implemented(broker, names, auto_ack):
    conn = new_connection(broker)
    q = stream(conn.channel(), names("sget"))
    publish(conn, q, ["m"])
    ch = conn.channel()
    connection_error(lambda: ch.basic_get(q, auto_ack=auto_ack), 540,
                     f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{q}' in vhost '/'")


def test_purge_is_not_implemented(broker, names):
    conn = new_connection(broker)
    q = stream(conn.channel(), names("spurge"))
    ch = conn.channel()
    connection_error(lambda: ch.queue_purge(q), 540,
                     f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{q}' in vhost '/'")


@pytest.mark.parametrize("flag", ["if_empty", "if_unused"])
def test_delete_ignores_if_empty_and_if_unused(connection, names, flag):
    """A stream with messages and a consumer is deleted anyway (delete-ok says 0 messages);
    the consumer gets basic.cancel and its channel stays open."""
    q = stream(connection.channel(), names("sdel"))
    publish(connection, q, range(3))
    consumer = Consumer(connection, q).wait(3)
    cancelled = []
    consumer.ch.add_on_cancel_callback(lambda method: cancelled.append(method.method.consumer_tag))
    assert connection.channel().queue_delete(q, **{flag: True}).method.message_count == 0
    pump(connection, lambda: cancelled == [consumer.tag])
    assert consumer.ch.is_open
    ch = connection.channel()
    channel_error(lambda: ch.queue_declare(q, passive=True), 404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


# ------------------------------------------------------------------------ consume
def _prefetch_not_set(q):
    return f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{q}' in vhost '/''"


@pytest.mark.parametrize("auto_ack", [False, True])
def test_consume_needs_a_prefetch_count(connection, ten, auto_ack):
    ch = connection.channel()
    channel_error(lambda: ch.basic_consume(ten, lambda *a: None, auto_ack=auto_ack), 406, _prefetch_not_set(ten))
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)  # a global limit is not a consumer's prefetch
    channel_error(lambda: ch.basic_consume(ten, lambda *a: None), 406, _prefetch_not_set(ten))


def test_consume_with_no_ack_is_not_implemented(broker, ten):
    conn = new_connection(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    connection_error(lambda: ch.basic_consume(ten, lambda *a: None, auto_ack=True), 540,
                     f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{ten}' "
                     "in vhost '/'")


def test_global_qos_is_refused_at_consume(broker, ten):
    conn = new_connection(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    ch.basic_qos(prefetch_count=10, global_qos=True)
    connection_error(lambda: ch.basic_consume(ten, lambda *a: None), 540,
                     f"NOT_IMPLEMENTED - queue '{ten}' in vhost '/' does not support global qos")
    conn = new_connection(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    ch.basic_qos(prefetch_count=5)  # a consumer prefetch lifts the channel's global limit
    ch.basic_consume(ten, lambda *a: None)
    ch.basic_qos(prefetch_count=1, global_qos=True)  # once consuming, it is not checked again
    ch.queue_declare(ten, passive=True)
    conn.close()


@pytest.mark.parametrize("key, value", [("x-priority", 5), ("x-priority", "a"), ("x-cancel-on-ha-failover", True)])
def test_consumer_arguments_of_other_queue_types_are_refused(connection, ten, key, value):
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    channel_error(lambda: ch.basic_consume(ten, lambda *a: None, arguments={key: value}), 406,
                  f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{ten}' in vhost '/' "
                  "of queue type rabbit_stream_queue")


def test_unknown_consumer_arguments_and_x_credit_are_accepted(connection, ten):
    consumer = Consumer(connection, ten, arguments={"x-foo": 1, "x-credit": {"credit": 5, "drain": False}})
    assert consumer.wait(10).offsets == list(range(10))


def test_exclusive_consume_is_not_enforced(connection, names):
    q = stream(connection.channel(), names("sexcl"))
    first = Consumer(connection, q, exclusive=True)
    second = Consumer(connection, q)
    third = Consumer(connection, q, exclusive=True)
    publish(connection, q, range(2))
    for consumer in (first, second, third):
        assert consumer.wait(2).bodies == ["0", "1"]


# ------------------------------------------------------------------ x-stream-offset
@pytest.mark.parametrize("offset, first", [
    ("first", 0), ("last", 9), (0, 0), (3, 3), (9, 9), (-1, 0), (-5, 0),
    ("10m", 0), ("1D", 0),  # intervals: now minus the interval, as a timestamp
    (datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc), 0),  # AMQP timestamp before everything
    (b"first", 0),  # the name may be any string type (pika sends bytes as 'x')
], ids=repr)
def test_offset_specs(connection, ten, offset, first):
    consumer = Consumer(connection, ten, offset=offset)
    pump(connection, lambda: consumer.offsets[-1:] == [9])
    assert consumer.offsets == list(range(first, 10))
    assert consumer.bodies == [str(i) for i in range(first, 10)]


def test_offsets_at_or_beyond_the_end_wait_for_new_messages(connection, names):
    """"next" (also the default) and the next offset start with the next message; a larger
    offset waits for it and skips what comes before; a far one or a future timestamp get
    nothing of what is published now (a future timestamp attaches like "next")."""
    q = stream(connection.channel(), names("snext"))
    publish(connection, q, range(3))
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    consumers = {spec: Consumer(connection, q, offset=spec) for spec in ["next", None, 3, 5, 2 ** 40]}
    at_future = Consumer(connection, q, offset=future)
    publish(connection, q, range(3, 10))
    for spec, first in [("next", 3), (None, 3), (3, 3), (5, 5)]:
        pump(connection, lambda: consumers[spec].offsets[-1:] == [9])
        assert consumers[spec].offsets == list(range(first, 10)), spec
    pump(connection, lambda: at_future.offsets[-1:] == [9])
    assert at_future.offsets == list(range(3, 10))
    assert consumers[2 ** 40].idle(0.2).got == []


def test_offset_timestamps_and_intervals(connection, names):
    """An AMQP timestamp (seconds) or an interval ("1s": now minus one second) starts at the
    first chunk written at or after that time."""
    q = stream(connection.channel(), names("sts"))
    publish(connection, q, ["old0", "old1"])
    written = time.time()
    time.sleep(1.2)
    since = int(time.time())  # after the old messages were written: written < since <= now
    assert since > written
    publish(connection, q, ["new0", "new1"])
    at = Consumer(connection, q, offset=datetime.datetime.fromtimestamp(since, datetime.timezone.utc))
    last_second = Consumer(connection, q, offset="1s")
    ten_minutes = Consumer(connection, q, offset="10m")
    assert at.wait(2).idle(0.1).bodies == ["new0", "new1"]
    assert last_second.wait(2).bodies == ["new0", "new1"]
    assert ten_minutes.wait(4).bodies == ["old0", "old1", "new0", "new1"]
    assert at.offsets == [2, 3]


@pytest.mark.parametrize("value", ["0s", "10x", "10", "1 h"])
def test_invalid_offset_intervals(connection, ten, value):
    ch = connection.channel()
    ch.basic_qos(prefetch_count=10)
    channel_error(lambda: ch.basic_consume(ten, lambda *a: None, arguments={"x-stream-offset": value}), 406,
                  f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{ten}' in vhost '/': "
                  f'{{invalid_stream_offset_arg,{{longstr,<<"{value}">>}}}}')


@pytest.mark.parametrize("value, term", [
    ("bogus", '{longstr,<<"bogus">>}'), ("", '{longstr,<<>>}'), ("FIRST", '{longstr,<<"FIRST">>}'),
    ("-1s", '{longstr,<<"-1s">>}'), (True, "{bool,true}"), (False, "{bool,false}"),
    ({"a": 1}, '{table,[{<<"a">>,signedint,1}]}'), ([1], "{array,[{signedint,1}]}")], ids=repr)
def test_offsets_rabbitmq_crashes_on(broker, ten, value, term):
    """Strings without leading digits (that are not first/last/next), booleans, tables and
    arrays make RabbitMQ 3.10 fail with an internal error; Warren refuses them as "10x"."""
    conn = new_connection(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    consume = lambda: ch.basic_consume(ten, lambda *a: None, arguments={"x-stream-offset": value})
    if RABBITMQ:
        connection_error(consume, *INTERNAL_ERROR)
    else:
        channel_error(consume, 406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{ten}' in "
                                    f"vhost '/': {{invalid_stream_offset_arg,{term}}}")


# ---------------------------------------------------------------------- deliveries
def test_deliveries_carry_the_offset_as_a_long_header(broker, ten):
    """On the wire: x-stream-offset is a signed 64-bit 'l', the headers sorted by name;
    redelivered is false and exchange/routing key are the publisher's."""
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.call(1, c.Basic.Qos(prefetch_count=100))
        raw.call(1, c.Basic.Consume(queue=ten, consumer_tag="ctag", arguments={"x-stream-offset": 8}))
        for n in (8, 9):
            deliver = raw.read_frame().value
            assert isinstance(deliver, c.Basic.Deliver)
            assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered, deliver.exchange,
                    deliver.routing_key) == ("ctag", n - 7, False, "", ten)
            header = raw.read_frame()
            assert header.type == FRAME_HEADER
            assert _content_header_table(header.payload) == [("i", "I", n), ("x-stream-offset", "l", n)]
            body = raw.read_frame()
            assert (body.type, body.payload) == (FRAME_BODY, str(n).encode())


def test_properties_survive_except_cluster_id_and_nested_headers(connection, names):
    """The message goes through AMQP 1.0 and back: every property but cluster-id survives,
    scalar headers keep their types, tables and arrays are dropped, the headers come back
    sorted by name and a publisher's own x-stream-offset is replaced. Warren keeps the
    message as published (cluster-id, tables and arrays too), its headers sorted the same."""
    q = stream(connection.channel(), names("sprops"))
    stamp = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    props = pika.BasicProperties(
        content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=3, correlation_id="corr",
        reply_to="reply", expiration="60000", message_id="id", timestamp=1234567890, type="kind",
        user_id="guest", app_id="app", cluster_id="cluster",
        headers={"zz": 1, "a": "s", "long": 2 ** 40, "neg": -3, "flag": False, "ts": stamp, "void": None,
                 "table": {"n": 1}, "array": [1, "x"], "x-stream-offset": 77})
    publish(connection, q, [b"full"], props)
    publish(connection, q, [b""])  # no properties at all, and an empty body
    consumer = Consumer(connection, q).wait(2)
    (m0, p0, b0), (m1, p1, b1) = consumer.got
    assert b0 == b"full" and b1 == b""
    got = {k: getattr(p0, k) for k in ("content_type", "content_encoding", "delivery_mode", "priority",
                                       "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                                       "type", "user_id", "app_id", "cluster_id")}
    assert got == dict(content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=3,
                       correlation_id="corr", reply_to="reply", expiration="60000", message_id="id",
                       timestamp=1234567890, type="kind", user_id="guest", app_id="app",
                       cluster_id=None if RABBITMQ else "cluster")
    kept = {} if RABBITMQ else {"array": [1, "x"], "table": {"n": 1}}
    assert p0.headers == {"a": "s", "flag": False, "long": 2 ** 40, "neg": -3, "ts": stamp, "void": None,
                          "x-stream-offset": 0, "zz": 1, **kept}
    assert list(p0.headers) == sorted(["a", "flag", "long", "neg", "ts", "void", "x-stream-offset", "zz", *kept])
    assert is_long(p0.headers["x-stream-offset"]) and is_long(p0.headers["long"])
    assert p1.headers == {"x-stream-offset": 1} and p1.content_type is None and p1.delivery_mode is None
    assert not m0.redelivered and not m1.redelivered


def test_a_decimal_header_fails_the_publish(broker, names):
    """RabbitMQ 3.10 cannot convert a decimal header (541); Warren keeps it."""
    conn = new_connection(broker)
    q = stream(conn.channel(), names("sdec"))
    ch = conn.channel()
    ch.confirm_delivery()
    publish_it = lambda: ch.basic_publish("", q, b"m", pika.BasicProperties(headers={"d": decimal.Decimal("1.5")}))
    if RABBITMQ:
        connection_error(publish_it, *INTERNAL_ERROR)
        return
    publish_it()
    [(_m, props, _b)] = Consumer(conn, q).wait(1).got
    assert props.headers == {"d": decimal.Decimal("1.5"), "x-stream-offset": 0}


def test_deliveries_name_the_exchange_and_routing_key_published_to(connection, names):
    q, x = names("sroute"), names("sroutex")
    ch = connection.channel()
    stream(ch, q)
    ch.exchange_declare(x, "topic")
    ch.queue_bind(q, x, "a.#")
    publish(connection, q, [b"direct"])
    publish(connection, q, [b"topic"], exchange=x, routing_key="a.b.c")
    consumer = Consumer(connection, q).wait(2)
    assert [(m.exchange, m.routing_key, m.redelivered, body) for m, _, body in consumer.got] == [
        ("", q, False, b"direct"), (x, "a.b.c", False, b"topic")]


# -------------------------------------------------------------- credit and settling
def test_prefetch_is_credit_that_acks_give_back(connection, ten):
    consumer = Consumer(connection, ten, prefetch=3, ack=False)
    assert consumer.wait(3).idle(0.3).offsets == [0, 1, 2]
    consumer.ch.basic_ack(consumer.got[0][0].delivery_tag)
    assert consumer.wait(4).idle(0.3).offsets == [0, 1, 2, 3]
    consumer.ch.basic_ack(consumer.got[2][0].delivery_tag, multiple=True)  # acks tags 2 and 3
    assert consumer.wait(6).idle(0.3).offsets == list(range(6))
    consumer.ch.basic_qos(prefetch_count=10)  # the consumer keeps the credit it started with
    consumer.ch.basic_ack(consumer.got[3][0].delivery_tag)
    assert consumer.wait(7).idle(0.3).offsets == list(range(7))
    consumer.ch.basic_ack(consumer.got[-1][0].delivery_tag, multiple=True)
    assert consumer.wait(10).offsets == list(range(10))


@pytest.mark.parametrize("how, requeue, multiple", [
    ("nack", True, False), ("nack", False, False), ("nack", False, True), ("reject", True, False),
    ("reject", False, False)])
def test_nack_and_reject_are_not_implemented(broker, ten, how, requeue, multiple):
    conn = new_connection(broker)
    consumer = Consumer(conn, ten, prefetch=2, ack=False).wait(2)
    tag = consumer.got[-1][0].delivery_tag
    settle = ((lambda: consumer.ch.basic_nack(tag, multiple=multiple, requeue=requeue)) if how == "nack"
              else (lambda: consumer.ch.basic_reject(tag, requeue=requeue)))

    def go():
        settle()
        consumer.ch.queue_declare(ten, passive=True)  # a round trip to see the close
    connection_error(go, 540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues "
                              f"queue '{ten}' in vhost '/'")


@pytest.mark.parametrize("requeue, error", [(True, INTERNAL_ERROR), (False, (540, "NOT_IMPLEMENTED - requeue=false"))])
def test_recover_with_unacked_stream_deliveries(broker, ten, requeue, error):
    """RabbitMQ 3.10 fails with 541 on a requeueing recover; Warren says what it cannot do."""
    if requeue and not RABBITMQ:
        error = (540, f"NOT_IMPLEMENTED - basic.recover not supported by stream queues queue '{ten}' in vhost '/'")
    conn = new_connection(broker)
    consumer = Consumer(conn, ten, prefetch=2, ack=False).wait(2)

    def go():
        consumer.ch.basic_recover(requeue=requeue)
        consumer.ch.queue_declare(ten, passive=True)
    connection_error(go, *error)


def test_consuming_never_removes_messages(connection, broker, names):
    q = stream(connection.channel(), names("skeep"))
    publish(connection, q, range(5))
    acking = Consumer(connection, q).wait(5)
    other = new_connection(broker)
    unacked = Consumer(other, q, ack=False).wait(5)
    other.close()  # unacked deliveries of a closed channel go nowhere
    again = Consumer(connection, q).wait(5)
    for consumer in (acking, unacked, again):
        assert consumer.offsets == list(range(5))
        assert consumer.bodies == [str(i) for i in range(5)]
        assert not any(m.redelivered for m, _, _ in consumer.got)


def test_consumers_follow_the_tail(connection, names):
    q = stream(connection.channel(), names("stail"))
    publish(connection, q, ["a", "b", "c"])
    first, last, nxt = (Consumer(connection, q, offset=spec) for spec in ("first", "last", "next"))
    first.wait(3)
    last.wait(1)
    publish(connection, q, ["d", "e"])
    assert first.wait(5).bodies == ["a", "b", "c", "d", "e"]
    assert last.wait(3).bodies == ["c", "d", "e"]
    assert nxt.wait(2).bodies == ["d", "e"]
    assert nxt.offsets == [3, 4]


def test_last_starts_at_the_last_chunk_of_a_burst(connection, names):
    """Publishes sent without waiting share chunks: "last" starts at the last chunk's first
    message (which messages that is, is RabbitMQ's batching)."""
    q = stream(connection.channel(), names("sburst"))
    ch = connection.channel()
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())
    publish(connection, q, ["end"])
    last = Consumer(connection, q, offset="last")
    pump(connection, lambda: last.bodies[-1:] == ["end"])
    assert 0 < last.offsets[0] and last.offsets == list(range(last.offsets[0], 21))
    assert last.bodies == [str(i) for i in range(last.offsets[0], 20)] + ["end"]


# ------------------------------------------------------------------------ retention
def read_all(broker, q, n):
    """The message numbers (the first 5 bytes of each body) a consumer from "first" gets, up to
    the newest one, n - 1; None if the consume failed with INTERNAL_ERROR: RabbitMQ 3.10 fails
    a reader that attaches while retention is deleting segments (osiris init_reader:
    retries_exhausted), so readers poll on their own connections."""
    conn = new_connection(broker)
    try:
        consumer = Consumer(conn, q)
        pump(conn, lambda: consumer.got and int(consumer.got[-1][2][:5]) == n - 1)
        return [int(body[:5]) for _, _, body in consumer.got]
    except pika.exceptions.ConnectionClosedByBroker as e:
        assert (e.reply_code, e.reply_text) == INTERNAL_ERROR
        return None
    finally:
        if conn.is_open:
            conn.close()


def retained(broker, q, n):
    """Poll until a consumer from "first" no longer sees message 0: the numbers it gets then
    (a run of the newest messages)."""
    kept = wait_until(lambda: (lambda got: got if got and got[0] > 0 else None)(read_all(broker, q, n)),
                      timeout=8, interval=0.1, what=f"retention on {q}")
    assert kept == list(range(kept[0], n))
    return kept


def numbered(numbers, size=100):
    return [b"%05d" % i + b"x" * size for i in numbers]


def test_max_length_bytes_drops_the_oldest_segments(broker, connection, names):
    q = stream(connection.channel(), names("sbytes"), x_max_length_bytes=5000, x_stream_max_segment_size_bytes=1000)
    publish(connection, q, numbered(range(100)))
    kept = retained(broker, q, 100)
    assert 5 <= len(kept) <= 50


def test_max_age_drops_old_segments_when_new_ones_are_written(broker, connection, names):
    q = stream(connection.channel(), names("sage"), x_max_age="1s", x_stream_max_segment_size_bytes=1000)
    publish(connection, q, numbered(range(20)))
    time.sleep(1.2)
    publish(connection, q, numbered(range(20, 30)))
    kept = retained(broker, q, 30)
    assert kept[0] <= 20


def test_retention_policy_beats_arguments(broker, connection, names, uid, policies, api):
    """A policy's max-length-bytes wins over the argument; a policy with any key a stream does
    not support (here message-ttl) does not apply to streams at all, whatever its priority."""
    q, cq = names("spol"), names("cpol")
    low, high = names("pol-low"), names("pol-high")
    pattern = f"^[sc]pol-{uid}$"
    policies.set_all([
        ("policy", low, pattern, {"max-length-bytes": 3000, "stream-max-segment-size-bytes": 500, "max-age": "1h"},
         1, "queues"),
        ("policy", high, pattern, {"max-length-bytes": 7777, "message-ttl": 100000}, 10, "queues")])
    stream(connection.channel(), q, x_max_length_bytes=100_000_000, x_max_age="1D")
    connection.channel().queue_declare(cq, durable=True)
    publish(connection, q, numbered(range(60)))
    kept = retained(broker, q, 60)
    assert len(kept) <= 30
    if api:
        d = wait_json(api, q, lambda d: "effective_policy_definition" in d)
        assert (d["policy"], d["effective_policy_definition"]) == (
            low, {"max-age": "1h", "max-length-bytes": 3000, "stream-max-segment-size-bytes": 500})
        assert queue_json(api, cq)["policy"] == high


def test_retention_policy_on_an_existing_stream_applies_at_once(broker, connection, names, policies):
    q = stream(connection.channel(), names("spolnow"), x_stream_max_segment_size_bytes=500)
    publish(connection, q, numbered(range(60)))
    assert read_all(broker, q, 60) == list(range(60))
    policies.set(names("pol"), f"^{q}$", {"max-length-bytes": 2000})
    kept = retained(broker, q, 60)  # without any further publish
    assert len(kept) <= 20


# ------------------------------------------------------------------- dead-lettering
def test_dead_letters_from_a_classic_queue_are_dropped(connection, names):
    """RabbitMQ 3.10 dead-letters "stateless", which a stream ignores: rejected, expired and
    overflowing messages of a classic queue never reach the stream they are routed to.
    Warren appends them, with their x-death: a durable audit log of the dead letters."""
    s = stream(connection.channel(), names("sdlx"))
    to_stream = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": s}
    rejecting, expiring, overflowing = names("cdlx-rej"), names("cdlx-ttl"), names("cdlx-len")
    ch = connection.channel()
    ch.queue_declare(rejecting, arguments=to_stream)
    ch.queue_declare(expiring, arguments={**to_stream, "x-message-ttl": 1})
    ch.queue_declare(overflowing, arguments={**to_stream, "x-max-length": 1})
    ch.confirm_delivery()
    ch.basic_publish("", rejecting, b"rejected", pika.BasicProperties(headers={"h": 1}))
    ch.basic_publish("", expiring, b"expired")
    ch.basic_publish("", overflowing, b"overflowed")
    ch.basic_publish("", overflowing, b"kept")
    ch.basic_reject(get_one(ch, rejecting, auto_ack=False)[0].delivery_tag, requeue=False)
    wait_until(lambda: [ch.queue_declare(q, passive=True).method.message_count
                        for q in (rejecting, expiring, overflowing)] == [0, 0, 1])
    publish(connection, s, [b"sentinel"])
    if RABBITMQ:
        consumer = Consumer(connection, s).wait(1).idle(0.2)
        assert consumer.bodies == ["sentinel"] and consumer.offsets == [0]
        return
    consumer = Consumer(connection, s).wait(4).idle(0.2)
    assert sorted(consumer.bodies[:3]) == ["expired", "overflowed", "rejected"] and consumer.bodies[3] == "sentinel"
    assert consumer.offsets == [0, 1, 2, 3]
    reasons = {body: props.headers["x-death"][0]["reason"] for _m, props, body in consumer.got[:3]}
    assert reasons == {b"rejected": "rejected", b"expired": "expired", b"overflowed": "maxlen"}
    [rejected] = [props for _m, props, body in consumer.got if body == b"rejected"]
    assert rejected.headers["h"] == 1 and rejected.headers["x-first-death-queue"] == rejecting


def test_at_least_once_dead_letters_reach_the_stream_without_x_death(connection, names):
    """A quorum queue's at-least-once dead-lettering does deliver into a stream; x-death (an
    array of tables) is lost on the way, the x-first-death-* headers stay."""
    s = stream(connection.channel(), names("salo"))
    qq = names("qalo")
    ch = connection.channel()
    ch.queue_declare(qq, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": s,
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
    publish(connection, qq, [b"poison"], pika.BasicProperties(headers={"h": "v"}))
    ch.basic_reject(get_one(ch, qq, auto_ack=False)[0].delivery_tag, requeue=False)
    consumer = Consumer(connection, s).wait(1, timeout=10)
    m, props, body = consumer.got[0]
    assert (body, m.exchange, m.routing_key, m.redelivered) == (b"poison", "", s, False)
    death = {} if RABBITMQ else {"x-death": props.headers.get("x-death")}  # Warren keeps x-death
    assert props.headers == {"h": "v", "x-first-death-exchange": "", "x-first-death-queue": qq,
                             "x-first-death-reason": "rejected", "x-stream-offset": 0, **death}
    if not RABBITMQ:
        assert death["x-death"][0]["queue"] == qq and death["x-death"][0]["reason"] == "rejected"


# ------------------------------------------------------------------ management API
def test_management_api_shows_a_stream(api, connection, names):
    if not api:
        pytest.skip("needs the management API (WARREN_TEST_MGMT for RabbitMQ)")
    q = stream(connection.channel(), names("smgmt"), x_max_age="7D")
    d = queue_json(api, q)
    assert (d["name"], d["type"], d["durable"], d["auto_delete"], d["exclusive"], d["arguments"]) == (
        q, "stream", True, False, False, {"x-queue-type": "stream", "x-max-age": "7D"})
    publish(connection, q, range(4))
    d = wait_json(api, q, lambda d: d.get("messages") == 4)
    assert (d["messages_ready"], d["messages_unacknowledged"], d["type"]) == (4, 0, "stream")


# ------------------------------------------------------------------------ publishing
def test_confirms_and_mandatory_publishes(connection, names):
    q, x = names("sconf"), names("sconfx")
    ch = connection.channel()
    stream(ch, q)
    ch.exchange_declare(x, "fanout")
    ch.queue_bind(q, x)
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", q, str(i).encode(), mandatory=True)  # raises unless acked (and not returned)
    ch.basic_publish(x, "any", b"via-exchange", mandatory=True)
    assert returned == []
    consumer = Consumer(connection, q).wait(11)
    assert consumer.bodies == [str(i) for i in range(10)] + ["via-exchange"]


# -------------------------------------------------------------------------- aio-pika
@pytest.mark.asyncio
async def test_aio_pika_publish_and_consume(broker, names):
    import aio_pika
    q_name = names("saio")
    conn = await aio_pika.connect(broker.url, timeout=10)
    try:
        ch = await conn.channel()  # publisher confirms on: publish() waits for the ack
        q = await ch.declare_queue(q_name, durable=True, arguments={**STREAM, "x-max-length-bytes": 10_000_000})
        for i in range(5):
            confirmation = await ch.default_exchange.publish(
                aio_pika.Message(str(i).encode(), headers={"n": i}, message_id=f"id{i}"), routing_key=q_name)
            assert isinstance(confirmation, c.Basic.Ack)
        await ch.set_qos(prefetch_count=2)
        got = []
        done = asyncio.Event()

        async def on_message(message):
            got.append((message.headers["x-stream-offset"], message.body, message.message_id, message.redelivered,
                        message.headers["n"]))
            await message.ack()
            if len(got) == 4:
                done.set()
        await q.consume(on_message, arguments={"x-stream-offset": 1})
        await asyncio.wait_for(done.wait(), 5)
        assert got == [(i, str(i).encode(), f"id{i}", False, i) for i in range(1, 5)]
        declared = await ch.declare_queue(q_name, passive=True)
        assert declared.declaration_result.consumer_count == 0
    finally:
        await conn.close()


@pytest.mark.asyncio
async def test_aio_pika_refusals(broker, names, ten):
    """basic.get and a no-ack consumer close the connection (540); so does a float offset
    (541; Warren: 406), which pika cannot even send."""
    import aio_pika
    import aiormq
    for attempt, exc, text in [
        ("get", aiormq.exceptions.ConnectionNotImplemented,
         f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{ten}' in vhost '/'"),
        ("no_ack", aiormq.exceptions.ConnectionNotImplemented,
         f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{ten}' in vhost '/'"),
        ("float", aiormq.exceptions.ConnectionInternalError, "INTERNAL_ERROR") if RABBITMQ else
        ("float", aiormq.exceptions.ChannelPreconditionFailed,
         f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{ten}' in vhost '/': "
         "{invalid_stream_offset_arg,{float,1.5}}"),
    ]:
        conn = await aio_pika.connect(broker.url, timeout=10)
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=5)
            q = await ch.get_queue(ten)

            async def ignore(message):
                pass
            with pytest.raises(exc) as err:
                if attempt == "get":
                    await q.get(timeout=5)
                elif attempt == "no_ack":
                    await q.consume(ignore, no_ack=True, timeout=5)
                else:
                    await q.consume(ignore, arguments={"x-stream-offset": 1.5}, timeout=5)
            assert text in str(err.value), attempt
        finally:
            await conn.close()
