"""Warren's extensions to stream queues over AMQP 0-9-1 (issue 12), which RabbitMQ does not
have: the offsets of a stream on request (`amq.warren.stream-offsets`), consumer offsets kept
by the server for named consumers, and both in the management API. Warren only."""

import time

import pika
import pytest
import requests

from conftest import EXTERNAL

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="Warren's extensions")

STREAM = {"x-queue-type": "stream"}
OFFSETS = "amq.warren.stream-offsets"


def stream(ch, name, count=0, **args):
    ch.queue_declare(name, durable=True, arguments={**STREAM, **args})
    if count:
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", name, f"m{i}".encode())
    return name


def ask(conn, name, **headers):
    """Publish an offsets request for stream `name`; the reply's headers and JSON body."""
    ch = conn.channel()
    reply = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish(OFFSETS, name, b"", pika.BasicProperties(reply_to=reply, correlation_id="c1",
                                                               headers=headers or None))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(reply, auto_ack=True)
        if method is not None:
            assert props.correlation_id == "c1" and props.content_type == "application/json"
            assert (method.exchange, method.routing_key) == ("", reply)
            ch.close()
            return props.headers, body
        time.sleep(0.01)
    raise AssertionError("no answer")


def consume(conn, name, count, **args):
    """Consume `count` entries, then cancel and ack them all; their offsets. (The prefetch is
    `count`, so no more come: pika rejects deliveries still pending when a consumer is
    cancelled, and a stream refuses a reject.)"""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=count)
    got = []
    tag = ch.basic_consume(name, lambda c, m, props, b: got.append((m.delivery_tag, props.headers["x-stream-offset"])),
                           arguments=args)
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got) == count, f"only {len(got)} of {count} came"
    ch.basic_cancel(tag)
    ch.basic_ack(got[-1][0], multiple=True)
    ch.close()
    return [offset for _tag, offset in got]


def test_offsets_on_request(connection, names):
    ch = connection.channel()
    s = stream(ch, names("so"), count=5)
    headers, body = ask(connection, s)
    assert headers["x-stream-first-offset"] == 0 and headers["x-stream-next-offset"] == 5
    assert headers["x-stream-last-offset"] == 4 and headers["x-stream-messages"] == 5
    assert 0 <= headers["x-stream-last-chunk"] <= 4
    assert abs(headers["x-stream-first-timestamp-ms"] / 1000 - time.time()) < 60
    assert headers["x-stream-segments"] == 1 and headers["x-stream-bytes"] > 5 * 2
    import json
    assert json.loads(body)["x-stream-next-offset"] == 5
    empty = stream(ch, names("so-empty"))
    headers, _ = ask(connection, empty)
    assert headers["x-stream-first-offset"] == headers["x-stream-next-offset"] == 0
    assert "x-stream-last-offset" not in headers and "x-stream-first-timestamp" not in headers


def test_offsets_errors_are_answered(connection, names):
    ch = connection.channel()
    ch.queue_declare(names("so-classic"))
    headers, _ = ask(connection, names("so-classic"))
    assert headers == {"x-error": f"PRECONDITION_FAILED - queue '{names('so-classic')}' in vhost '/' is not a stream"}
    headers, _ = ask(connection, "so-missing-stream")
    assert headers == {"x-error": "NOT_FOUND - no queue 'so-missing-stream' in vhost '/'"}


def test_offsets_without_reply_to_are_returned_when_mandatory(connection, names):
    ch = connection.channel()
    s = stream(ch, names("so-noreply"), count=1)
    ch = connection.channel()  # (not in confirm mode: pika would raise on the return)
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m.reply_code))
    ch.basic_publish(OFFSETS, s, b"", mandatory=True)
    connection.process_data_events(0.3)
    assert returned == [312]


def test_the_offsets_name_is_no_exchange(broker, channel, names):
    """Nothing lists it, declares it or binds to it: RabbitMQ's tools see what they see there."""
    from conftest import channel_error
    channel.queue_declare(names("so-bind"))
    channel_error(lambda: channel.queue_bind(names("so-bind"), OFFSETS, "x"), 404,
                  f"NOT_FOUND - no exchange '{OFFSETS}' in vhost '/'")
    listed = requests.get(f"{broker.api}/exchanges/%2F", auth=("guest", "guest"), timeout=10).json()
    assert OFFSETS not in {x["name"] for x in listed}


def test_a_named_consumer_resumes_after_its_last_ack(connection, names):
    ch = connection.channel()
    s = stream(ch, names("so-named"), count=10)
    assert consume(connection, s, 4, **{"x-stream-offset": "first", "x-stream-consumer-name": "job"}) == [0, 1, 2, 3]
    # No x-stream-offset: it starts after its last ack (not at `next`).
    assert consume(connection, s, 3, **{"x-stream-consumer-name": "job"}) == [4, 5, 6]
    headers, _ = ask(connection, s, **{"x-stream-consumer-name": "job"})
    assert headers["x-stream-consumer-offset"] == 7
    # An explicit offset wins; another name starts at next as any consumer.
    assert consume(connection, s, 1, **{"x-stream-offset": 2, "x-stream-consumer-name": "job"}) == [2]
    ch.basic_publish("", s, b"late")
    assert consume(connection, s, 1, **{"x-stream-offset": 10, "x-stream-consumer-name": "other"}) == [10]


def test_named_offsets_survive_a_restart(make_broker, restart_broker):
    b = make_broker()
    with pika.BlockingConnection(b.pika_params()) as conn:
        stream(conn.channel(), "kept", count=6)
        consume(conn, "kept", 5, **{"x-stream-offset": "first", "x-stream-consumer-name": "job"})
    b = restart_broker(b)  # SIGTERM: saved at shutdown (else about once a second)
    with pika.BlockingConnection(b.pika_params()) as conn:
        assert consume(conn, "kept", 1, **{"x-stream-consumer-name": "job"}) == [5]


def test_the_management_api_shows_offsets_and_lag(broker, connection, names):
    ch = connection.channel()
    s = stream(ch, names("so-api"), count=8)
    consume(connection, s, 3, **{"x-stream-offset": "first", "x-stream-consumer-name": "etl"})
    reader = connection.channel()
    reader.basic_qos(prefetch_count=2)
    reader.basic_consume(s, lambda *a: None, arguments={"x-stream-offset": 1})  # takes 2, never acks
    connection.process_data_events(0.3)
    q = requests.get(f"{broker.api}/queues/%2F/{s}", auth=("guest", "guest"), timeout=10).json()
    assert q["type"] == "stream" and q["durable"] is True and q["messages"] == 8
    info = q["stream"]
    assert (info["first_offset"], info["last_offset"], info["next_offset"]) == (0, 7, 8)
    assert info["consumer_offsets"] == [{"name": "etl", "offset": 3, "lag": 5}]
    [consumer] = q["consumer_details"]
    assert consumer["stream_offset"] == 3 and consumer["stream_lag"] == 5  # read 1 and 2


def test_retention_removes_segments_under_a_reader(connection, names):
    """A consumer reading slowly from `first` while retention removes the segments it is in
    goes on from the new first offset: no error, offsets only grow (Warren: RabbitMQ 3.10 can
    fail a consumer that attaches while segments are deleted)."""
    ch = connection.channel()
    s = stream(ch, names("so-ret"), **{"x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 6000})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", s, b"%04d" % i + b"." * 300)
    reader = connection.channel()
    reader.basic_qos(prefetch_count=1)
    got = []
    reader.basic_consume(s, lambda c, m, p, b: got.append((m.delivery_tag, p.headers["x-stream-offset"])),
                         arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    first = got[0][1]
    for i in range(10, 200):  # the reader's segment goes
        ch.basic_publish("", s, b"%04d" % i + b"." * 300)
    headers, _ = ask(connection, s)
    assert headers["x-stream-first-offset"] > first + 5
    while got[-1][1] < 199 and time.monotonic() < deadline + 5:
        reader.basic_ack(got[-1][0])
        n = len(got)
        while len(got) == n and time.monotonic() < deadline + 5:
            connection.process_data_events(0.05)
    offsets = [o for _t, o in got]
    assert offsets[1] >= headers["x-stream-first-offset"]  # jumped past what retention removed
    assert offsets[1:] == list(range(offsets[1], 200))


# ---------------------------------------------------------------- record batches
BATCH = "x-warren-record-batch"


def batches(broker, name, count, **args):
    """Consume record batches until `count` entries came: [(delivery method, properties,
    [(offset, exchange, routing key, properties, body)], batch size in bytes)], each acked. (Prefetch 1, the
    last acked after the cancel: pika rejects a delivery still pending when a consumer is
    cancelled, and a stream refuses a reject.)"""
    records = pytest.importorskip("warren.spark.records").Records()
    connection_ = pika.BlockingConnection(broker.pika_params())
    ch = connection_.channel()
    ch.basic_qos(prefetch_count=1)
    got = []

    def on(c, m, props, body):
        got.append((m, props, list(records.decode([body]).rows()), len(body)))
        if sum(len(e) for _m, _p, e, _n in got) < count:
            c.basic_ack(m.delivery_tag)
    tag = ch.basic_consume(name, on, arguments=args)
    deadline = time.monotonic() + 10
    while sum(len(e) for _m, _p, e, _n in got) < count and time.monotonic() < deadline:
        connection_.process_data_events(0.05)
    ch.basic_cancel(tag)
    ch.basic_ack(got[-1][0].delivery_tag)
    connection_.close()
    return got


def test_record_batches_hold_the_entries_as_stored(broker, connection, names):
    """x-warren-record-batch: many entries a delivery, in the layout of warren.spark.records,
    about that many bytes each; the entries and their properties exactly as published."""
    ch = connection.channel()
    s = stream(ch, names("so-batch"))
    sent = []
    for i in range(300):
        props = pika.BasicProperties(content_type="text/plain" if i % 2 else None, message_id=f"id{i}",
                                     headers={"i": i} if i % 3 == 0 else None, delivery_mode=2 if i % 5 else None)
        body = (b"%d:" % i) * (i % 37)
        ch.basic_publish("", s, body, props)
        sent.append((props, body))
    ch.basic_publish("amq.direct", "nowhere", b"")  # (not routed: no entry)
    got = batches(broker, s, 293, **{BATCH: 1000, "x-stream-offset": 7})
    assert len(got) > 5, "1000 bytes a batch: many batches"
    seen = []
    for method, props, entries, size in got:
        assert (method.exchange, method.routing_key, method.redelivered) == ("", s, False)
        assert props.content_type == "application/vnd.warren.stream-records"
        assert props.headers["x-stream-offset"] == entries[0][0]
        assert props.headers["x-warren-records"] == len(entries) and props.headers["x-warren-record-format"] == 1
        # a batch ends with the record that takes it to its size (a record: its body and ~100 bytes)
        assert size - len(entries[-1][4]) - 150 < 1000 or len(entries) == 1
        seen += entries
    assert [e[0] for e in seen] == list(range(7, 300))
    for offset, exchange, routing_key, properties, body in seen:
        props, sent_body = sent[offset]
        assert (exchange, routing_key, body) == ("", s, sent_body)
        assert properties.message_id == props.message_id and properties.content_type == props.content_type
        assert properties.delivery_mode == props.delivery_mode
        assert (properties.headers or None) == props.headers


def test_a_record_batch_holds_at_least_one_entry(broker, connection, names):
    """An entry bigger than the batch size comes alone; a consumer at the tail gets entries
    as they are published."""
    ch = connection.channel()
    s = stream(ch, names("so-batch-big"), count=3)
    ch.basic_publish("", s, b"x" * 300_000)
    got = batches(broker, s, 4, **{BATCH: 10, "x-stream-offset": "first"})
    assert [[e[0] for e in entries] for _m, _p, entries, _n in got] == [[0], [1], [2], [3]]
    assert got[3][2][0][4] == b"x" * 300_000
    live = connection.channel()
    live.basic_qos(prefetch_count=1)
    seen = []
    records = pytest.importorskip("warren.spark.records").Records()
    live.basic_consume(s, lambda c, m, p, b: (seen.extend(records.decode([b]).offset.tolist()),
                                              c.basic_ack(m.delivery_tag)),
                       arguments={BATCH: 1 << 20, "x-stream-offset": "next"})
    connection.process_data_events(0.2)
    assert seen == []
    ch.basic_publish("", s, b"late")
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert seen == [4]


def test_a_named_record_batch_consumer_resumes_after_its_last_batch(broker, connection, names):
    ch = connection.channel()
    s = stream(ch, names("so-batch-named"), count=50)
    got = batches(broker, s, 1, **{BATCH: 1, "x-stream-offset": "first",
                                                   "x-stream-consumer-name": "bulk"})
    assert [e[0] for e in got[0][2]] == [0]
    got = batches(broker, s, 49, **{BATCH: 100, "x-stream-consumer-name": "bulk"})
    offsets = [e[0] for _m, _p, entries, _n in got for e in entries]
    assert offsets[0] == 1 and offsets == list(range(1, 1 + len(offsets)))
    headers, _ = ask(connection, s, **{"x-stream-consumer-name": "bulk"})
    assert headers["x-stream-consumer-offset"] == offsets[-1] + 1  # past the whole last batch


def test_an_unacked_record_batch_holds_no_records(broker, connection, names):
    """A consumer with a big prefetch that never acks has the broker hold no batch (their
    records went out by reference): no unacked bytes, unlike an entry-by-entry consumer's.
    Brokers with record batches say so in their capabilities."""
    assert connection._impl.server_properties["capabilities"][BATCH] is True
    ch = connection.channel()
    s = stream(ch, names("so-batch-held"), count=100)
    ch.basic_publish("", s, b"x" * 100_000)
    for args, held in (({BATCH: 1000}, False), ({}, True)):
        reader = connection.channel()
        reader.basic_qos(prefetch_count=1000)
        got = []
        reader.basic_consume(s, lambda c, m, p, b: got.append(m), arguments={"x-stream-offset": "first", **args})
        deadline, seen = time.monotonic() + 5, -1
        while seen != len(got) and time.monotonic() < deadline:  # (until all of it came)
            seen = len(got)
            connection.process_data_events(0.3)
        q = requests.get(f"{broker.api}/queues/%2F/{s}", auth=("guest", "guest"), timeout=10).json()
        assert q["messages_unacknowledged"] == len(got) > 0
        assert (q["message_bytes_unacknowledged"] > 100_000) is held, q["message_bytes_unacknowledged"]
        reader.close()


@pytest.mark.parametrize("value, shown", [(0, "0"), (-5, "-5"), ("big", "<<\"big\">>"), (True, "true"),
                                          ((16 << 20) + 1, "16777217")])
def test_a_record_batch_size_is_a_positive_byte_count(connection, names, value, shown):
    ch = connection.channel()
    s = stream(ch, names("so-batch-bad"))
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_consume(s, lambda *a: None, arguments={BATCH: value})
    assert err.value.reply_code == 406
    assert err.value.reply_text == (f"PRECONDITION_FAILED - invalid arg '{BATCH}' for queue '{s}' in vhost '/': "
                                    f"expected a byte count from 1 to 16777216, got {shown}")


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_record_batches_are_for_streams_only(connection, names, queue_type):
    ch = connection.channel()
    q = names("so-batch-" + queue_type)
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": queue_type})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_consume(q, lambda *a: None, arguments={BATCH: 1000})
    assert err.value.reply_code == 406
    assert err.value.reply_text == (f"PRECONDITION_FAILED - invalid arg '{BATCH}' for queue '{q}' in vhost '/' "
                                    f"of queue type rabbit_{queue_type}_queue")
