"""The `warren` source's queue mode on local[2] against a real `warren server`: a drain with
Trigger.AvailableNow in batches of exactly maxRecordsPerTrigger, a second drain that reads
nothing; a query stopped before Spark told the source its last batch was committed (the
messages come back, and are acked on sight, not read again); a batch planned but not
committed before a stop rebuilt from the same messages; batch reads refused."""

import os
import time

import pika
import pytest

from .conftest import uri


def queue(broker, name, count):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(message_id=str(i), delivery_mode=2))
    conn.close()
    return name


def ready(broker, name):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()


def settled(broker, name, count):
    """Whether the queue has `count` ready messages within 10 s (a stopped query's consumer
    closes in its own time)."""
    deadline = time.monotonic() + 10
    while ready(broker, name) != count and time.monotonic() < deadline:
        time.sleep(0.1)
    return ready(broker, name) == count


def start(spark, broker, name, out, checkpoint, trigger, **options):
    df = spark.readStream.format("warren").option("uri", uri(broker)).option("queue", name)
    for k, v in options.items():
        df = df.option(k, v)
    return (df.load().select("offset", "body", "redelivered", "properties.message_id").writeStream
            .format("parquet").option("path", out).option("checkpointLocation", checkpoint)
            .trigger(**trigger).start())


def drain(spark, broker, name, out, checkpoint, **options):
    query = start(spark, broker, name, out, checkpoint, {"availableNow": True}, **options)
    assert query.awaitTermination(240), "the AvailableNow drain did not end"
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def stopped_after_first_batch(spark, broker, name, out, checkpoint, **options):
    """A query whose second trigger is an hour away, stopped once its first batch is
    committed: Spark has not told the source (it would when planning the next batch)."""
    query = start(spark, broker, name, out, checkpoint, {"processingTime": "1 hour"}, **options)
    commits = os.path.join(checkpoint, "commits", "0")
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(commits) and query.exception() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.exists(commits), query.exception()
    finally:
        query.stop()
    return query


def test_a_drain_reads_everything_once_and_a_second_drain_nothing(spark, broker, uid, tmp_path):
    q = queue(broker, f"sq-drain-{uid}", 250)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    assert drain(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100) == [100, 100, 50]
    assert ready(broker, q) == 0
    assert drain(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100) == []
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.message_id) for r in rows) == list(range(250))
    assert sorted(r.offset for r in rows) == list(range(250))  # positions in the query
    assert not any(r.redelivered for r in rows)


def test_a_run_stopped_before_the_source_heard_of_its_commit(spark, broker, uid, tmp_path):
    q = queue(broker, f"sq-lag-{uid}", 300)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    stopped_after_first_batch(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100)
    assert settled(broker, q, 300)  # nothing acked: batch 0 is back, redelivered
    assert drain(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100) == [100, 100]
    assert ready(broker, q) == 0
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.message_id) for r in rows) == list(range(300))  # batch 0 not read twice


def test_a_batch_planned_but_not_committed_is_rebuilt_from_the_same_messages(spark, broker, uid, tmp_path):
    q = queue(broker, f"sq-replay-{uid}", 300)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    stopped_after_first_batch(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100)
    first = sorted(int(r.message_id) for r in spark.read.parquet(out).collect())
    # as if the driver died after planning batch 0 (offsets/0) and before committing it
    for log in (os.path.join(checkpoint, "commits"), os.path.join(out, "_spark_metadata")):
        os.remove(os.path.join(log, "0"))
        os.remove(os.path.join(log, ".0.crc"))
    assert drain(spark, broker, q, out, checkpoint, maxRecordsPerTrigger=100) == [100, 100, 100]
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.message_id) for r in rows) == list(range(300))
    again = sorted((r.offset, int(r.message_id), r.redelivered) for r in rows if r.offset < 100)
    assert [m for _o, m, _r in again] == first and all(r for _o, _m, r in again)
    assert ready(broker, q) == 0


def test_queue_mode_is_streaming_only(spark, broker, uid):
    q = queue(broker, f"sq-batch-{uid}", 1)
    with pytest.raises(Exception, match="streaming only"):
        spark.read.format("warren").option("uri", uri(broker)).option("queue", q).load().collect()
    with pytest.raises(Exception, match="exactly one of"):
        spark.read.format("warren").option("uri", uri(broker)).option("queue", q).option("stream", q).load().collect()
    assert ready(broker, q) == 1
