"""The `warren` Spark format on local[2] against a real `warren server`: exact ranges in batch
reads (the off-by-ones), streaming into parquet with maxRecordsPerTrigger (exact counts per
micro-batch), a restart from the checkpoint, Trigger.AvailableNow ending while messages keep
arriving, data loss, and the sink publishing with confirms and deterministic message ids."""

import json
import subprocess
import sys
import threading
import time

import pika
import pytest

from .conftest import get_all, uri

MIB = 1 << 20


def stream(broker, name, count=0, first=0, **args):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream", **args})
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(message_id=str(i), headers={"i": i}))
    conn.close()
    return name


def reader(spark, broker, name, **options):
    r = spark.read.format("warren").option("uri", uri(broker)).option("stream", name)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_reads_give_exact_ranges(spark, broker, uid):
    s = stream(broker, f"sp-range-{uid}", 500)
    df = reader(spark, broker, s, startingOffsets=f'{{"streams": {{"{s}": 100}}}}',
                endingOffsets=f'{{"streams": {{"{s}": 400}}}}', minPartitions=3, maxRecordsPerPartition=70)
    assert df.rdd.getNumPartitions() == 6  # 300 entries, at most 70 each: 5, rounded up to a multiple of 3
    rows = df.select("offset", "body", "source", "exchange", "routing_key", "redelivered",
                     "properties.message_id", "headers").collect()
    assert sorted(r.offset for r in rows) == list(range(100, 400))
    first = min(rows, key=lambda r: r.offset)
    assert (first.body, first.source, first.exchange, first.routing_key, first.redelivered, first.message_id) == (
        b"m100", s, "", s, False, "100")
    # the message's own headers: the broker's x-stream-offset annotation is the offset column
    assert first.headers == {"i": "100"}
    everything = reader(spark, broker, s)
    # minPartitions defaults to the session's default parallelism (local[2]: 2)
    assert spark.sparkContext.defaultParallelism == 2 and everything.rdd.getNumPartitions() == 2
    assert sorted(r.offset for r in everything.select("offset").collect()) == list(range(500))


def _run(spark, broker, name, out, checkpoint, **options):
    df = spark.readStream.format("warren").option("uri", uri(broker)).option("stream", name)
    for k, v in options.items():
        df = df.option(k, v)
    query = (df.load().select("offset", "body").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the AvailableNow query did not end"
    assert query.exception() is None, query.exception()
    return query


def test_streaming_into_parquet_exactly_once(spark, broker, uid, tmp_path):
    s = stream(broker, f"sp-stream-{uid}", 250)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = _run(spark, broker, s, out, checkpoint, startingOffsets="earliest", maxRecordsPerTrigger=100)
    counts = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert counts == [100, 100, 50]  # AvailableNow honours the source's limit
    assert json.loads(query.lastProgress["sources"][0]["latestOffset"]) == {"streams": {s: 250}}
    stream(broker, s, 30, first=250)
    _run(spark, broker, s, out, checkpoint, startingOffsets="earliest", maxRecordsPerTrigger=100)
    rows = spark.read.parquet(out).collect()
    assert sorted(r.offset for r in rows) == list(range(280))  # resumed from the checkpoint
    assert sorted(r.body for r in rows) == sorted(b"m%d" % i for i in range(280))


def test_available_now_ends_while_messages_keep_coming(spark, broker, uid, tmp_path):
    s = stream(broker, f"sp-busy-{uid}", 200)
    stop = threading.Event()
    published = []

    def keep_publishing():
        conn = pika.BlockingConnection(broker.pika_params())
        ch = conn.channel()
        ch.confirm_delivery()
        i = 200
        while not stop.is_set():
            ch.basic_publish("", s, b"m%d" % i)
            published.append(i)
            i += 1
            time.sleep(0.002)
        conn.close()

    publisher = threading.Thread(target=keep_publishing)
    publisher.start()
    try:
        out = str(tmp_path / "out")
        query = _run(spark, broker, s, out, str(tmp_path / "cp"), startingOffsets="earliest", maxRecordsPerTrigger=150)
    finally:
        stop.set()
        publisher.join(10)
    offsets = sorted(r.offset for r in spark.read.parquet(out).collect())
    assert offsets[:200] == list(range(200)) and offsets == list(range(len(offsets)))
    # it stopped at the tail it saw at its start (at or before the tail the first micro-batch
    # reported), while the tail it reported went on past it (the lag in lastProgress)
    batches = [p["sources"][0] for p in query.recentProgress if p["numInputRows"]]
    tails = [json.loads(b["latestOffset"])["streams"][s] for b in batches]
    end = json.loads(batches[-1]["endOffset"])["streams"][s]
    assert len(batches) >= 2 and end == len(offsets) <= tails[0] < tails[-1]
    assert len(offsets) < 200 + len(published)


def test_the_password_is_not_in_plans_or_progress(spark, broker, uid, tmp_path):
    s = stream(broker, f"sp-secret-{uid}", 5)
    secret = uri(broker).split("@")[0]  # amqp://user:password
    df = reader(spark, broker, s)
    assert df.count() == 5 and secret not in df._jdf.queryExecution().toString()
    query = _run(spark, broker, s, str(tmp_path / "out"), str(tmp_path / "cp"), startingOffsets="earliest")
    assert query.recentProgress and all(secret not in p.json for p in query.recentProgress)


def test_data_loss_fails_or_is_skipped(spark, broker, uid):
    s = stream(broker, f"sp-loss-{uid}", 100, **{"x-stream-max-segment-size-bytes": 2000,
                                                  "x-max-length-bytes": 4000})
    gone = f'{{"streams": {{"{s}": 0}}}}'
    with pytest.raises(Exception, match="are gone"):
        reader(spark, broker, s, startingOffsets=gone).collect()
    rows = sorted(reader(spark, broker, s, startingOffsets=gone, failOnDataLoss="false").select("offset", "body")
                  .collect())
    kept = [int(r.body[1:]) for r in rows]  # (RabbitMQ's offsets skip one at each segment roll)
    assert rows and rows[0].offset > 0 and kept[0] > 0 and kept == list(range(kept[0], 100))


def _queue_contents(broker, queue):
    return [(body, props.message_id, props.headers) for _m, props, body in get_all(broker, queue)]


def test_the_sink_publishes_every_row_with_confirms(spark, broker, uid):
    q = f"sp-sink-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(q)
    conn.close()
    df = spark.createDataFrame([(b"x%d" % i, {"k": str(i)}) for i in range(300)], "body BINARY, headers MAP<STRING,STRING>")
    (df.repartition(3).write.format("warren").option("uri", uri(broker)).option("routingKey", q)
     .option("maxInFlight", 50).option("writeId", "job1").mode("append").save())
    got = _queue_contents(broker, q)
    assert sorted(b for b, _, _ in got) == sorted(b"x%d" % i for i in range(300))
    ids = {m for _, m, _ in got}
    assert len(ids) == 300 and all(m.startswith("job1:") for m in ids)
    assert all(h["k"] == b.decode()[1:] for b, _, h in got)


def test_a_batch_write_has_one_id_for_all_its_tasks(spark, broker, uid):
    """Without writeId the ids' prefix is drawn once per write, on the driver: every task of a
    write shares it (on any executor), the next write has another; the exchange option routes."""
    q, x = f"sp-sink-ids-{uid}", f"sp-sink-x-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.exchange_declare(x, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k")
    conn.close()
    df = spark.createDataFrame([(b"x%d" % i,) for i in range(60)], "body BINARY").repartition(3)
    prefixes = []
    for _ in range(2):
        df.write.format("warren").option("uri", uri(broker)).option("exchange", x).option("routingKey", "k") \
            .mode("append").save()
        ids = [m for _, m, _ in _queue_contents(broker, q)]
        assert len(ids) == 60 == len(set(ids))
        assert len({m.split(":")[2] for m in ids}) == 3  # three partitions: three tasks
        prefixes.append({m.split(":")[0] for m in ids})
    assert len(prefixes[0]) == len(prefixes[1]) == 1 and prefixes[0] != prefixes[1]


def test_mandatory_is_true_or_false(spark, broker, uid):
    df = spark.createDataFrame([(b"x",)], "body BINARY")
    with pytest.raises(Exception, match="mandatory is true or false, not 'yes'"):
        (df.write.format("warren").option("uri", uri(broker)).option("routingKey", f"sp-nowhere-{uid}")
         .option("mandatory", "yes").mode("append").save())


def test_register_refuses_speculation():
    """In a Spark of its own (the session's is started): spark.speculation on is refused."""
    code = ("from pyspark.sql import SparkSession; from warren.spark import register\n"
            "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
            ".config('spark.speculation', 'true').getOrCreate()\n"
            "try:\n    register(spark)\nexcept ValueError as err:\n    print('refused:', err)\n"
            "finally:\n    spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "refused: the warren sink needs spark.speculation=false" in done.stdout, done.stderr[-3000:]


def test_a_broker_that_stops_confirming_fails_the_write(spark, uid):
    """A Warren of its own with its memory alarm on blocks the sink's connection: no confirm
    comes, and the write fails after confirmTimeout; with the alarm cleared it goes through."""
    from tests.conftest import EXTERNAL, start_broker
    from tests.warrenctl_path import WARRENCTL
    if EXTERNAL:
        pytest.skip("raises an alarm on a Warren of its own")
    broker = start_broker()
    ctl = [WARRENCTL or "warrenctl", "--data-dir", broker.data_dir]
    try:
        q = f"sp-blocked-{uid}"
        conn = pika.BlockingConnection(broker.pika_params())
        conn.channel().queue_declare(q)
        conn.close()
        subprocess.run([*ctl, "set_vm_memory_high_watermark", "0"], check=True, capture_output=True, timeout=60)
        df = spark.createDataFrame([(b"x%d" % i,) for i in range(50)], "body BINARY").coalesce(1)
        write = (df.write.format("warren").option("uri", uri(broker)).option("routingKey", q)
                 .option("confirmTimeout", "2").mode("append"))
        with pytest.raises(Exception, match="no confirm within 2 s"):
            write.save()
        subprocess.run([*ctl, "set_vm_memory_high_watermark", "0.4"], check=True, capture_output=True, timeout=60)
        write.save()
        assert {b for _m, _p, b in get_all(broker, q)} == {b"x%d" % i for i in range(50)}
    finally:
        broker.stop()


def test_an_unroutable_mandatory_row_fails_the_write(spark, broker, uid):
    df = spark.createDataFrame([(b"lost",)], "body BINARY")
    with pytest.raises(Exception, match="publish failed|Return|NO_ROUTE"):
        (df.write.format("warren").option("uri", uri(broker)).option("routingKey", f"sp-nowhere-{uid}")
         .option("mandatory", "true").mode("append").save())


def test_a_stream_copied_into_a_queue(spark, broker, uid, tmp_path):
    """readStream from a stream, writeStream to a queue: every entry once, with ids naming
    the query, the batch, the partition and the row."""
    s = stream(broker, f"sp-copy-{uid}", 120)
    q = f"sp-copy-q-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(q)
    conn.close()
    query = (spark.readStream.format("warren").option("uri", uri(broker)).option("stream", s)
             .option("startingOffsets", "earliest").load().select("body")
             .writeStream.format("warren").option("uri", uri(broker)).option("routingKey", q)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(240) and query.exception() is None
    got = _queue_contents(broker, q)
    assert sorted(b for b, _, _ in got) == sorted(b"m%d" % i for i in range(120))
    assert all(m.startswith(query.id + ":0:") for _, m, _ in got)
