"""A Spark job in a process of its own, for tests/spark/test_kill.py to SIGKILL (its driver and
JVM together: the test starts it in a new session and kills the process group) or to break
the AMQP connections of (through the broker's management API). Its own local[2,4] session:
two cores, and a task may fail 3 times and run again (local[2] never retries a task).

    killable_query.py queries URI [--source STREAM OUT CHECKPOINT] [--sink QUEUE INPUT CHECKPOINT]
                              [--queue-source QUEUE OUT CHECKPOINT]
                              [--max-records N] [--files-per-trigger F] [--row-pause S] [--available-now]
        --source: readStream of STREAM (from earliest, maxRecordsPerTrigger N) -> parquet at
        OUT, columns offset, message_id, body; --sink: readStream of the JSON files in INPUT
        (message_id, body), F files a micro-batch -> writeStream.format("warren") to QUEUE
        through the default exchange; --queue-source: readStream of QUEUE (queue mode,
        maxRecordsPerTrigger N) -> parquet at OUT, columns offset, message_id, body,
        redelivered; all at once in one session if several are given
    killable_query.py retries URI STREAM QUEUE EVENTS --rows N
        once the file EVENTS.go exists: a batch read of all of STREAM, then a batch write of N
        rows (message_id w<i>, 2 s of Python UDF in all) to QUEUE; a JSON line in EVENTS
        when the session is ready and after each: what it read or wrote and how many tasks
        failed

--row-pause S: a Python UDF sleeps S seconds a row (a micro-batch of R rows takes R*S seconds
at least), so the test has a wide window between offsets/N and commits/N; the parquet file
of a batch is being written while the UDF still sleeps on the batch's last rows.

The process kills its own session (JVM and Python workers too) if its parent (the test) goes
away, or after --deadline seconds, so no JVM outlives a test that died."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time


def _kill_session() -> None:
    """SIGKILL every process of this session but this one (the JVM, and the Python workers:
    pyspark.daemon makes a process group of its own), then this one. (Only a session leader,
    as the test starts it, kills its session; else its process group.)"""
    me, session = os.getpid(), os.getsid(0)
    if session != me:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # (this one too)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == session:
                        os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
    os.kill(me, signal.SIGKILL)


def _watchdog(deadline: float) -> None:
    parent = os.getppid()
    started = time.monotonic()

    def watch() -> None:
        while os.getppid() == parent and time.monotonic() - started < deadline:
            time.sleep(0.5)
        _kill_session()

    threading.Thread(target=watch, daemon=True).start()


def _session():
    from pyspark.sql import SparkSession

    from warren.spark import register

    # (C1 only and the serial collector: a third faster to start on two busy cores, where
    # the JIT's and the collector's threads compete with the job.)
    spark = (SparkSession.builder.master("local[2,4]").appName("warren-kill-tests")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.task.maxFailures", "4").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
             # (an Arrow writer's task gets its rows 50 at a time, as they come from the UDF)
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
             # (no compaction of the file sink's log: the tests read which batch added each file)
             .config("spark.sql.streaming.fileSink.log.compactInterval", "1000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")  # "Lost task" lines: the test reads them
    register(spark)
    return spark


def _slowly(column: str, seconds: float):
    """`column` again (a string), through a Python UDF that sleeps `seconds` a row. The UDF
    pads each value to 2 KiB (trimmed again after it): a Python worker's output is buffered
    (64 KiB), so padded rows go on downstream a few dozen at a time while the UDF still
    sleeps on the rest, short ones only once the task's last row is done."""
    from pyspark.sql import functions as F

    def same(value):
        time.sleep(seconds)
        return value.ljust(2048)
    return F.rtrim(F.udf(same, "string", useArrow=False)(F.col(column).cast("string")))


def _source_query(spark, uri: str, stream: str, out: str, checkpoint: str, args):
    from pyspark.sql import functions as F

    df = (spark.readStream.format("warren").option("uri", uri).option("stream", stream)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", args.max_records).load()
          .select("offset", F.col("properties.message_id").alias("message_id"), "body"))
    if args.row_pause:
        df = df.withColumn("message_id", _slowly("message_id", args.row_pause))
    return (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
            .queryName("kill_source"))


def _queue_query(spark, uri: str, queue: str, out: str, checkpoint: str, args):
    from pyspark.sql import functions as F

    df = (spark.readStream.format("warren").option("uri", uri).option("queue", queue)
          .option("maxRecordsPerTrigger", args.max_records).load()
          .select("offset", F.col("properties.message_id").alias("message_id"), "body", "redelivered"))
    if args.row_pause:
        df = df.withColumn("message_id", _slowly("message_id", args.row_pause))
    return (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
            .queryName("kill_queue_source"))


def _sink_query(spark, uri: str, queue: str, input_: str, checkpoint: str, args):
    df = (spark.readStream.schema("message_id STRING, body STRING")
          .option("maxFilesPerTrigger", args.files_per_trigger).json(input_))
    if args.row_pause:
        df = df.withColumn("message_id", _slowly("message_id", args.row_pause))
    return (df.writeStream.format("warren").option("uri", uri).option("routingKey", queue)
            .option("checkpointLocation", checkpoint).queryName("kill_sink"))


def queries(args) -> None:
    """The source query, the sink query or both at once, until they end (AvailableNow) or the
    process is killed."""
    spark = _session()
    writers = []
    if args.source:
        writers.append(_source_query(spark, args.uri, *args.source, args))
    if args.sink:
        writers.append(_sink_query(spark, args.uri, *args.sink, args))
    if args.queue_source:
        writers.append(_queue_query(spark, args.uri, *args.queue_source, args))
    running = [(w.trigger(availableNow=True) if args.available_now else w).start() for w in writers]
    for query in running:
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"query {query.name} failed: {query.exception()}")
    spark.stop()


def _failed_tasks(sc, group: str) -> int:
    tracker = sc.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info else ()):
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info else 0
    return failed


def retries(args) -> None:
    from pyspark.sql import functions as F

    spark = _session()
    sc = spark.sparkContext

    def event(**fields) -> None:
        with open(args.events, "a") as f:
            f.write(json.dumps({**fields, "at": round(time.time(), 2)}) + "\n")

    event(phase="ready")
    go = args.events + ".go"
    while not os.path.exists(go):  # (the test publishes the stream meanwhile)
        time.sleep(0.05)

    sc.setJobGroup("read", "a batch read of the stream")
    df = spark.read.format("warren").option("uri", args.uri).option("stream", args.stream).load()
    got = df.agg(F.count("*").alias("rows"), F.countDistinct("offset").alias("offsets"),
                 F.min("offset").alias("first"), F.max("offset").alias("last"),
                 F.sum((F.col("properties.message_id") != F.col("offset").cast("string")).cast("int"))
                 .alias("wrong_ids")).first()
    event(phase="read", failed_tasks=_failed_tasks(sc, "read"), **got.asDict())

    sc.setJobGroup("write", "a batch write to the queue")
    rows = spark.range(args.rows, numPartitions=2).select(
        F.concat(F.lit("w"), F.col("id").cast("string")).alias("message_id"), F.col("id").cast("string").alias("body"))
    # Slowly: a publisher's connection is open while its task takes its rows, a second at least.
    rows = rows.withColumn("message_id", _slowly("message_id", 2 / args.rows))
    # (maxInFlight 100: a task has published some of its rows long before its last one
    # comes, however the sink holds back rows for a window; with the default 1000, the
    # committed sink published a task's 2,500 rows all at its end.)
    (rows.write.format("warren").option("uri", args.uri).option("routingKey", args.queue)
     .option("maxInFlight", 100).mode("append").save())
    event(phase="write", failed_tasks=_failed_tasks(sc, "write"), rows=args.rows)
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadline", type=float, default=300.0)
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("queries")
    p.add_argument("uri")
    p.add_argument("--source", nargs=3, metavar=("STREAM", "OUT", "CHECKPOINT"))
    p.add_argument("--sink", nargs=3, metavar=("QUEUE", "INPUT", "CHECKPOINT"))
    p.add_argument("--queue-source", nargs=3, metavar=("QUEUE", "OUT", "CHECKPOINT"))
    p.add_argument("--max-records", type=int, default=200)
    p.add_argument("--files-per-trigger", type=int, default=1)
    p.add_argument("--row-pause", type=float, default=0.0)
    p.add_argument("--available-now", action="store_true")
    p.set_defaults(run=queries)
    p = modes.add_parser("retries")
    for name in ("uri", "stream", "queue", "events"):
        p.add_argument(name)
    p.add_argument("--rows", type=int, required=True)
    p.set_defaults(run=retries)
    args = parser.parse_args()
    _watchdog(args.deadline)
    args.run(args)


if __name__ == "__main__":
    main()
