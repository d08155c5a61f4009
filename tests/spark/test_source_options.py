"""The `warren` source's options on local[2] against a real `warren server`: startingTimestamp
(the later chunks only, before startingOffsets), maxBytesPerTrigger alone and with
maxRecordsPerTrigger (a micro-batch ends at whichever comes first), the options refused
where they would do nothing (their message reaching the user), the lag reportLatestOffset
shows, and the `timestamp` and `delivery_count` columns of a stream's rows."""

import json
import math
import time

import pika
import pytest

from .conftest import uri


def is_warren(broker) -> bool:
    conn = pika.BlockingConnection(broker.pika_params())
    product = conn._impl.server_properties.get("product")
    conn.close()
    return product in ("Warren", b"Warren")


def publish(broker, name, bodies, declare=True, **properties):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    if declare:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(**properties))
    conn.close()
    return name


def read(spark, broker, **options):
    r = spark.read.format("warren").option("uri", uri(broker))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def available_now(spark, broker, tmp_path, **options):
    """An AvailableNow query into parquet: (the query, the rows it wrote)."""
    df = spark.readStream.format("warren").option("uri", uri(broker))
    for k, v in options.items():
        df = df.option(k, v)
    out = str(tmp_path / "out")
    query = (df.load().select("offset", "body").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the AvailableNow query did not end"
    assert query.exception() is None, query.exception()
    return query, spark.read.parquet(out).collect()


def batch_sizes(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def streaming_error(spark, broker, tmp_path, **options) -> str:
    """What a streaming query with these options fails with (when it starts or once it runs)."""
    df = spark.readStream.format("warren").option("uri", uri(broker))
    for k, v in options.items():
        df = df.option(k, v)
    try:
        query = (df.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "refused"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    except Exception as err:  # (AnalysisException, StreamingQueryException: the Python error inside)
        return str(err)
    return "(no error)"


def batch_error(spark, broker, **options) -> str:
    try:
        read(spark, broker, **options).collect()
    except Exception as err:
        return str(err)
    return "(no error)"


def test_starting_timestamp_reads_the_chunks_from_then_before_starting_offsets(spark, broker, uid, tmp_path):
    s = publish(broker, f"so-ts-{uid}", [b"early%d" % i for i in range(10)])
    # the consumer's timestamp is whole seconds: the later group goes in the next second
    time.sleep(math.ceil(time.time()) - time.time() + 0.05)
    since = int(time.time() * 1000)
    publish(broker, s, [b"late%d" % i for i in range(10)], declare=False)
    later = [b"late%d" % i for i in range(10)]
    rows = read(spark, broker, stream=s, startingTimestamp=since, startingOffsets="earliest").collect()
    assert sorted(r.offset for r in rows) == list(range(10, 20))  # startingOffsets gives way
    assert sorted(r.body for r in rows) == sorted(later)
    _query, streamed = available_now(spark, broker, tmp_path, stream=s, startingTimestamp=since)
    assert sorted(r.body for r in streamed) == sorted(later)
    # none yet at that time: from the tail
    future = int((time.time() + 3600) * 1000)
    assert read(spark, broker, stream=s, startingTimestamp=future, startingOffsets="earliest").count() == 0


def _byte_limit(broker, s, entries: float) -> int:
    """maxBytesPerTrigger for `entries` entries of the stream (by its average entry size, as
    the source counts)."""
    from warren.spark.source import SourceOptions, WarrenStreamReader

    average = WarrenStreamReader(SourceOptions.parse({"uri": uri(broker), "stream": s}))._average_size()
    assert average > 100  # (a stored entry: the body, its route and content header)
    return int(entries * average)


def test_max_bytes_per_trigger(spark, broker, uid, tmp_path):
    if not is_warren(broker):
        pytest.skip("maxBytesPerTrigger needs Warren's offsets request (RabbitMQ: refused)")
    s = publish(broker, f"so-bytes-{uid}", [b"%03d" % i + b"x" * 97 for i in range(120)])
    limit = _byte_limit(broker, s, 40.5)
    query, rows = available_now(spark, broker, tmp_path, stream=s, startingOffsets="earliest",
                                maxBytesPerTrigger=limit)
    assert batch_sizes(query) == [40, 40, 40]
    assert sorted(r.offset for r in rows) == list(range(120))


def test_both_limits_a_batch_ends_at_whichever_comes_first(spark, broker, uid, tmp_path):
    if not is_warren(broker):
        pytest.skip("maxBytesPerTrigger needs Warren's offsets request (RabbitMQ: refused)")
    s = publish(broker, f"so-both-{uid}", [b"%03d" % i + b"x" * 97 for i in range(100)])
    limit = _byte_limit(broker, s, 40.5)
    bytes_first, rows = available_now(spark, broker, tmp_path / "a", stream=s, startingOffsets="earliest",
                                      maxBytesPerTrigger=limit, maxRecordsPerTrigger=60)
    assert batch_sizes(bytes_first) == [40, 40, 20] and len(rows) == 100
    records_first, rows = available_now(spark, broker, tmp_path / "b", stream=s, startingOffsets="earliest",
                                        maxBytesPerTrigger=limit, maxRecordsPerTrigger=30)
    assert batch_sizes(records_first) == [30, 30, 30, 10] and len(rows) == 100


STREAM_ONLY = {"startingOffsets": "earliest", "startingTimestamp": "0", "endingOffsets": "latest",
               "failOnDataLoss": "false"}


@pytest.mark.parametrize("option", sorted(STREAM_ONLY))
def test_queue_mode_refuses_the_stream_mode_options(spark, broker, uid, tmp_path, option):
    q = f"so-queue-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"kept")
    error = streaming_error(spark, broker, tmp_path, queue=q, **{option: STREAM_ONLY[option]})
    assert (f"{option} applies to stream mode (stream=NAME) only: queue=NAME takes messages off the queue: it has "
            "no offsets to start or end at, and loses none to retention") in error
    assert ch.queue_declare(q, passive=True).method.message_count == 1  # nothing taken
    conn.close()


def test_a_source_needs_a_stream_or_a_queue(spark, broker, tmp_path):
    assert "needs exactly one of stream=NAME[,NAME...] (offsets) and queue=NAME (destructive reads): neither is " \
           "given" in streaming_error(spark, broker, tmp_path)
    assert "neither is given" in batch_error(spark, broker)


def test_ending_offsets_is_for_batch_reads_and_the_trigger_limits_for_streaming(spark, broker, uid, tmp_path):
    s = publish(broker, f"so-end-{uid}", [b"m%d" % i for i in range(10)])
    ending = json.dumps({"streams": {s: 5}})
    assert ("endingOffsets applies to batch reads (spark.read) only: a streaming query reads on as the streams grow "
            "(Trigger.AvailableNow stops at the tails it starts with)") in streaming_error(
        spark, broker, tmp_path, stream=s, startingOffsets="earliest", endingOffsets=ending)
    assert ("maxRecordsPerTrigger applies to streaming queries (spark.readStream) only: a batch read takes its "
            "whole range at once (endingOffsets bounds it)") in batch_error(spark, broker, stream=s,
                                                                             maxRecordsPerTrigger=3)
    # where they apply, they work
    assert sorted(r.offset for r in read(spark, broker, stream=s, endingOffsets=ending).collect()) == list(range(5))


def test_the_first_progress_shows_the_lag(spark, broker, uid, tmp_path):
    """reportLatestOffset: the streams' tails, ahead of a limited batch's end."""
    s = publish(broker, f"so-lag-{uid}", [b"m%d" % i for i in range(30)])
    query, rows = available_now(spark, broker, tmp_path, stream=s, startingOffsets="earliest",
                                maxRecordsPerTrigger=10)
    progress = [p["sources"][0] for p in query.recentProgress if p["numInputRows"]]
    assert [json.loads(p["endOffset"]) for p in progress] == [{"streams": {s: n}} for n in (10, 20, 30)]
    assert json.loads(progress[0]["latestOffset"]) == {"streams": {s: 30}}  # behind by 20
    assert json.loads(progress[-1]["latestOffset"]) == {"streams": {s: 30}}
    assert len(rows) == 30


def test_timestamp_and_delivery_count_of_a_streams_rows(spark, broker, uid):
    """`timestamp`: the message's timestamp property (AMQP: seconds), null without one;
    `delivery_count`: its x-delivery-count header (a quorum queue's count, kept by a copy),
    null without one: a stream never redelivers."""
    s = f"so-cols-{uid}"
    before = int(time.time())
    publish(broker, s, [b"stamped%d" % i for i in range(3)], timestamp=int(time.time()))
    after = time.time()
    publish(broker, s, [b"plain"], declare=False)
    publish(broker, s, [b"counted"], declare=False, headers={"x-delivery-count": 2})
    got = {r.body: r for r in read(spark, broker, stream=s)
           .selectExpr("body", "CAST(timestamp AS LONG) AS seconds", "delivery_count", "redelivered").collect()}
    for i in range(3):
        assert before <= got[b"stamped%d" % i].seconds <= after
        assert got[b"stamped%d" % i].delivery_count is None
    assert got[b"plain"].seconds is None and got[b"plain"].delivery_count is None
    assert got[b"counted"].delivery_count == 2 and got[b"counted"].seconds is None
    assert not any(r.redelivered for r in got.values())
