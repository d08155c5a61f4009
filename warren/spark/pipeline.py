"""`warren pipeline`: one command for each of the seeds' dead-letter advice, on Spark.

    warren pipeline dlq-audit (--stream DLQ | --queue DLQ [--stream]) --output PATH
    warren pipeline replay (--input PATH | --stream DLQ) [--where SQL] [--to-exchange X]
    warren pipeline prepare

`dlq-audit` reads a dead-letter stream (a DLX bound to a stream: Warren appends every dead
letter there with its x-death), or drains a dead-letter queue (acking each dead letter once
the batch that holds it is in the table: warren.spark.queue_source), into a parquet or Delta
table (warren.spark.delta) with the death columns flattened, as an
AvailableNow streaming query with a checkpoint, so a second run appends only the dead letters
that came since; it prints a progress line per micro-batch and a summary by reason and source
queue. `replay` republishes selected dead letters, with confirms, to the exchange and routing
key they first died from (or to the exchange given), keeping their message ids; it is a
checkpointed AvailableNow query too, its checkpoint named by what it selects and where it
sends it, so the same replay run again republishes nothing twice, and another selection from
the same table starts from its beginning (the dead letters both select are sent again, with
the same message ids).

Both run on local[*] unless --master says otherwise; on a local master, Spark's Python
processes run this environment's Python unless the user named one (warren.spark.interpreter).
`prepare` makes the class archive the driver's JVM of every later Spark session built with
warren.spark.fast_start() maps (once per Spark and JVM: warren.spark.class_archive), for a
faster cold start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

AUDIT_COLUMNS = ("body", "source", "offset", "exchange", "routing_key", "headers", "properties", "message_id",
                 "reason", "queue", "death_exchange", "death_routing_keys", "death_count", "last_reason",
                 "first_death_time", "last_death_time")


# The source's and sink's TLS options (warren.spark.connection), for an amqps:// --uri.
TLS_FLAGS = {"cacertfile": "CA certificates to trust the broker by (PEM; default: the system's)",
             "certfile": "client certificate (PEM), for EXTERNAL or a broker that asks for one",
             "keyfile": "the client certificate's key (PEM)",
             "verify": "verify_peer (default) or verify_none"}


def add_parser(sub: Any) -> None:
    pipeline = sub.add_parser("pipeline", help="Spark jobs for dead letters (needs the spark extra)")
    jobs = pipeline.add_subparsers(dest="job", required=True)
    jobs.add_parser("prepare", help="make the class archive that starts Spark's driver faster (once per Spark and JVM)")
    for name, text in (("dlq-audit", "read a dead-letter stream into a table, dead-letter details flattened"),
                       ("replay", "republish selected dead letters where they first died from")):
        job = jobs.add_parser(name, help=text)
        job.add_argument("--uri", default="amqp://guest:guest@localhost:5672/%2F",
                         help="the broker (amqp://user:password@host:port/vhost, or amqps://)")
        for option, text in TLS_FLAGS.items():
            job.add_argument(f"--{option}", default=None, help=text,
                             choices=["verify_peer", "verify_none"] if option == "verify" else None)
        job.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        job.add_argument("--checkpoint", default=None,
                         help="Spark checkpoint directory (default: beside the output or input)")
        if name == "dlq-audit":
            # (--stream NAME, or --queue NAME --stream as the issue writes it: the queue is a stream)
            job.add_argument("--stream", nargs="?", const=True, metavar="NAME",
                             help="the dead-letter stream (or, with --queue NAME: that queue is a stream, read)")
            job.add_argument("--queue", help="a dead-letter queue, drained")
            job.add_argument("--output", required=True, help="where the table goes")
            job.add_argument("--format", default="parquet", choices=["parquet", "delta"],
                             help="table format (delta: written with delta-rs, no Delta jar needed)")
            job.add_argument("--batch", type=int, default=None,
                             help="rows per micro-batch (default 100,000 from a stream, 10,000 from a queue)")
        else:
            source = job.add_mutually_exclusive_group(required=True)
            source.add_argument("--input", help="a parquet table written by dlq-audit")
            source.add_argument("--stream", help="a dead-letter stream")
            job.add_argument("--where", default=None, help="SQL condition on the audit columns (e.g. reason = 'expired')")
            job.add_argument("--to-exchange", default=None,
                             help="publish here (with each message's original routing key) instead")
            job.add_argument("--routing-key", default=None, help="publish with this routing key instead")


def run(args: argparse.Namespace) -> int:
    if args.job == "dlq-audit":
        if args.stream is True:  # --queue NAME --stream: that queue is a stream, read
            args.stream, args.queue = args.queue, None
        if bool(args.stream) == bool(args.queue):
            print("warren pipeline dlq-audit: one of --stream NAME, --queue NAME or --queue NAME --stream",
                  file=sys.stderr)
            return 2
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("warren pipeline: needs the spark extra: pip install -e '.[spark]' (and Java 17)", file=sys.stderr)
        return 2
    from . import fast_start, interpreter, register

    if args.job == "prepare":
        from .class_archive import prepare

        path, what = prepare()
        print(f"warren pipeline prepare: {path or 'no class archive'}: {what}")
        return 0 if path else 1
    python = interpreter.for_session(args.master, os.environ)
    if python:  # (read as the JVM and the SparkContext start: not python3 on PATH, which may lack warren)
        os.environ[interpreter.ENV] = python
    builder = SparkSession.builder.master(args.master).appName(f"warren pipeline {args.job}").config(
        "spark.ui.enabled", "false")
    for key, value in fast_start().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        return dlq_audit(spark, args) if args.job == "dlq-audit" else replay(spark, args)
    finally:
        spark.stop()


def flattened(df: Any) -> Any:
    """The source's rows with the dead-letter details as columns: the first death's reason,
    queue, exchange and routing keys (what the message was before it ever died), how many
    times it died, the newest death's reason, and the first and last death times. A message
    without x-death (published to the dead-letter queue or stream directly: a manual republish,
    a shovel, another tool), or whose x-death holds nothing readable (warren.spark.rows.deaths),
    has null death columns, but for the first death's reason, queue and exchange from
    x-first-death-* headers if it has them; a death without a readable count counts once, and a
    sum past a long is null."""
    from pyspark.sql import functions as F

    # (try_: Spark 4 runs with ANSI SQL, where an index out of an array's bounds or an overflow
    # fails the whole query)
    oldest = F.try_element_at("death", F.lit(-1))
    times = F.transform("death", lambda d: d["time"])
    return df.select(
        "body", "source", "offset", "exchange", "routing_key", "headers", "properties",
        F.col("properties.message_id").alias("message_id"),
        F.coalesce(F.col("headers")["x-first-death-reason"], oldest["reason"]).alias("reason"),
        F.coalesce(F.col("headers")["x-first-death-queue"], oldest["queue"]).alias("queue"),
        F.coalesce(F.col("headers")["x-first-death-exchange"], oldest["exchange"]).alias("death_exchange"),
        oldest["routing_keys"].alias("death_routing_keys"),
        F.when(F.size("death") > 0, F.aggregate(
            "death", F.lit(0).cast("bigint"),
            lambda acc, d: F.try_add(acc, F.coalesce(d["count"], F.lit(1).cast("bigint"))))).alias("death_count"),
        F.try_element_at("death", F.lit(1))["reason"].alias("last_reason"),
        F.array_min(times).alias("first_death_time"), F.array_max(times).alias("last_death_time"))


def _progress(query: Any, started: float, seen: set) -> None:
    for p in query.recentProgress:
        if p["batchId"] in seen or not p["numInputRows"]:
            continue
        seen.add(p["batchId"])
        rows = sum(q["numInputRows"] for q in query.recentProgress if q["batchId"] in seen)
        print(f"batch {p['batchId']}: {p['numInputRows']} rows ({rows} in all, "
              f"{rows / max(time.monotonic() - started, 1e-9):,.0f} rows/s)", flush=True)


def _await(query: Any) -> None:
    started, seen = time.monotonic(), set[int]()
    while query.isActive:
        query.awaitTermination(1)
        _progress(query, started, seen)
    _progress(query, started, seen)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def _broker(reader_or_writer: Any, args: argparse.Namespace) -> Any:
    """The `warren` format with the broker's address and the TLS options given."""
    out = reader_or_writer.format("warren").option("uri", args.uri)
    for option in TLS_FLAGS:
        if getattr(args, option, None) is not None:
            out = out.option(option, getattr(args, option))
    return out


def dlq_audit(spark: Any, args: argparse.Namespace) -> int:
    reader = _broker(spark.readStream, args)
    if args.queue:
        reader = reader.option("queue", args.queue).option("maxRecordsPerTrigger", args.batch or 10_000)
    else:
        reader = (reader.option("stream", args.stream).option("startingOffsets", "earliest")
                  .option("maxRecordsPerTrigger", args.batch or 100_000))
    source = reader.load()
    checkpoint = args.checkpoint or args.output.rstrip("/") + ".checkpoint"
    rows = flattened(source).writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if args.format == "delta":
        from .delta import DeltaBatchWriter, read_table

        app_id = f"warren dlq-audit {os.path.abspath(checkpoint)}"
        _await(rows.foreachBatch(DeltaBatchWriter(args.output, app_id)).start())
        found = read_table(args.output)
        if found is None:
            print(f"0 dead letters in {args.output}: no table written (nothing to audit)")
            return 0
        table = spark.createDataFrame(found.select(["reason", "queue"]))
    else:
        _await(rows.format("parquet").option("path", args.output).start())
        table = spark.read.parquet(args.output)
    print(f"{table.count()} dead letters in {args.output}; by reason and source queue:")
    for row in table.groupBy("reason", "queue").count().orderBy("reason", "queue").collect():
        print(f"  {row['reason'] or '-'}\t{row['queue'] or '-'}\t{row['count']}")
    return 0


def replay(spark: Any, args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    checkpoints = (args.input.rstrip("/") if args.input else args.stream) + ".replay-checkpoints"
    earlier = checkpoints[:-1]  # (one checkpoint for every selection, before they were named)
    if args.checkpoint is None and os.path.isdir(earlier):
        print(f"warren pipeline replay: {earlier} is an earlier replay's checkpoint, for every selection: "
              f"resume it with --checkpoint {earlier}, or remove it", file=sys.stderr)
        return 2
    checkpoint = args.checkpoint or os.path.join(checkpoints, _selection(args))
    if args.input:
        if os.path.isdir(os.path.join(args.input, "_delta_log")):
            print("warren pipeline replay: --input reads a parquet table; a Delta table has no streaming "
                  "source without the Delta jar (use --stream, or dlq-audit --format parquet)", file=sys.stderr)
            return 2
        schema = spark.read.parquet(args.input).schema
        rows = spark.readStream.schema(schema).parquet(args.input)
    else:
        rows = flattened(_broker(spark.readStream, args).option("stream", args.stream)
                         .option("startingOffsets", "earliest").load())
    resumed = os.path.isdir(os.path.join(checkpoint, "commits"))
    if args.where:
        rows = rows.where(args.where)
    rows = rows.observe("replay", F.count(F.lit(1)).alias("rows"))
    exchange = F.lit(args.to_exchange) if args.to_exchange is not None else F.coalesce("death_exchange", "exchange")
    key = (F.lit(args.routing_key) if args.routing_key is not None
           else F.coalesce(F.try_element_at("death_routing_keys", F.lit(1)), F.col("routing_key")))
    out = rows.select(
        "body", exchange.alias("exchange"), key.alias("routing_key"), "properties",
        # (the source's headers are strings; the broker's own x- headers are not sent again)
        F.map_filter("headers", lambda k, v: ~k.startswith("x-")).alias("headers"),
        F.coalesce("message_id", F.concat(F.lit("replay:"), "source", F.lit(":"), F.col("offset").cast("string")))
         .alias("message_id"))
    query = (_broker(out.writeStream, args).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    _await(query)
    sent = sum(p.observedMetrics["replay"]["rows"] for p in query.recentProgress if "replay" in p.observedMetrics)
    print(f"replayed {sent} dead letters ({'resumed from' if resumed else 'new'} checkpoint {checkpoint})", flush=True)
    return 0


def _selection(args: argparse.Namespace) -> str:
    """The name of a replay's default checkpoint: what it selects and where it sends it."""
    chosen = json.dumps([args.where, args.to_exchange, args.routing_key])
    return "replay-" + hashlib.sha256(chosen.encode()).hexdigest()[:16]
