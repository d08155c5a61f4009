#!/usr/bin/env python3
"""The Spark source and sink against direct AMQP, on one Warren broker (issue 13).

    python3 bench/spark.py [--count 1000000] [--size 1024] [--master local[2]]

Starts Warren on a free port (a fresh data dir), fills a stream with --count messages of
--size bytes (confirmed, bench/loadgen), then measures:
  - direct consume: loadgen reading the stream from `first` (prefetch 1000, ack every 100);
  - source: spark.readStream.format("warren") from `earliest` into parquet, Trigger.AvailableNow,
    rows / wall time (a fresh checkpoint; the first micro-batch's time and the per-batch
    overhead are printed too);
  - direct publish: loadgen publishing --count messages with confirms (window 1000) to a queue;
  - sink: a DataFrame of --count rows of --size bytes written with df.write.format("warren")
    to a queue, rows / wall time of the write (the queue then holds --count messages); then
    the same write again: the first write's time includes starting Spark's Python workers
    for it (seconds on a busy machine), the second's does not;
  - streaming sink: a fresh Spark streams the source's output (its bodies) from parquet into
    writeStream.format("warren") to the queue, Trigger.AvailableNow, about --per-trigger rows a
    micro-batch: rows / wall time, the rate after the first micro-batch, the first
    micro-batch's time and the per-batch overhead.
Needs the spark extra and Java 17, and `make -C bench`. Prints a Markdown table with the
source/consume and sink/publish ratios (the goal is at least 0.5 each). With --floor, a fresh
Spark also streams the source's output from parquet into parquet (no broker at all): the
cold run's floor on this machine.

On a VM whose kernel reports free pages to its host (virtio-balloon free page reporting), memory
a process frees goes back to the host at once, and the next page handed out costs a fault in the
host (~8 µs a 4 KiB page where bench/RESULTS.md's figures were taken, against ~0.3 µs for a page the
guest kept): the title says whether reporting is on. With --keep-guest-memory GIB (root), the
run turns it off (restored at the end) and first touches GIB GiB, so the memory it uses is the
guest's own. The title also says how much disk is free where the broker writes: a nearly full
disk slowed the sink's first write by a third (2026-11-28).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
# This tree's warren, in this process, Spark's Python workers and the broker (not whichever one
# is installed), so a worktree of another commit measures its own code.
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
# Spark's Python workers run this interpreter (Spark's default is whichever `python3` is first
# on PATH, which may lack the spark extra)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
LOADGEN = os.path.join(HERE, "loadgen")
# (the page order from which free blocks are reported to the host; above MAX_PAGE_ORDER, 10, none)
REPORTING_ORDER = "/sys/module/page_reporting/parameters/page_reporting_order"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadgen(port: int, *args) -> dict:
    out = subprocess.run([LOADGEN, args[0], "--port", str(port), *map(str, args[1:])],
                         capture_output=True, text=True, check=True, timeout=3600).stdout
    return json.loads(out.strip().splitlines()[-1])


def page_reporting() -> bool | None:
    """Whether this VM's kernel hands freed memory back to its host (None: it cannot)."""
    try:
        with open(REPORTING_ORDER) as f:
            return 0 <= int(f.read()) <= 10  # (-1: no reporting device yet)
    except (OSError, ValueError):
        return None


@contextmanager
def guest_memory_kept(gib: int):
    """Free page reporting off (an order above the largest: no free block qualifies) and
    `gib` GiB touched once, so the pages the host took back are the guest's again."""
    order = REPORTING_ORDER
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) >> 20
    if gib > available - 2:
        sys.exit(f"--keep-guest-memory {gib}: only {available} GiB available (touching more starts the OOM killer)")
    try:
        with open(order) as f:
            before = f.read().strip()
        with open(order, "w") as f:
            f.write("11")
        with open(order) as f:
            if f.read().strip() != "11":
                raise OSError("the kernel kept its order")
    except OSError as err:  # (a mainline kernel refuses an order above MAX_PAGE_ORDER)
        sys.exit(f"--keep-guest-memory: cannot turn free page reporting off through {order}: {err}")
    try:
        if gib:
            with mmap.mmap(-1, gib << 30) as memory:
                for at in range(0, gib << 30, mmap.PAGESIZE):
                    memory[at] = 1
        yield
    finally:
        try:
            with open(order, "w") as f:
                f.write(before)
        except OSError as err:
            print(f"could not set {order} back to {before}: {err}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-per-partition", type=int, help="maxRecordsPerPartition (default: the source's)")
    ap.add_argument("--partitions", type=int, default=2, help="minPartitions (default: local[2]'s cores)")
    ap.add_argument("--per-trigger", type=int, default=250_000, help="maxRecordsPerTrigger")
    ap.add_argument("--no-fast-start", action="store_true",
                    help="without warren.spark.fast_start() (Spark's Python daemons compile pyspark from its zip)")
    ap.add_argument("--no-class-archive", action="store_true",
                    help="without the driver's class archive (made first otherwise: warren pipeline prepare)")
    ap.add_argument("--source-only", action="store_true", help="skip the sink's measurements")
    ap.add_argument("--floor", action="store_true",
                    help="also copy the source's output, parquet to parquet, in a fresh Spark (no broker): what Spark "
                         "alone takes to move the same rows, cold")
    ap.add_argument("--keep-guest-memory", type=int, metavar="GIB",
                    help="turn the VM's free page reporting off for the run and touch GIB GiB first (root)")
    ap.add_argument("--copy-parquet", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--stream-to-queue", nargs=3, metavar=("IN", "URI", "QUEUE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.copy_parquet:
        return _copy_parquet(args, *args.copy_parquet)
    if args.stream_to_queue:
        return _stream_to_queue(args, *args.stream_to_queue)
    if args.keep_guest_memory is not None:
        with guest_memory_kept(args.keep_guest_memory):
            return _run(args)
    return _run(args)


def _run(args) -> int:
    subprocess.run(["make", "-s", "-C", HERE], check=True)
    if not (args.no_fast_start or args.no_class_archive):
        from warren.spark.class_archive import prepare
        path, what = prepare()
        print(f"class archive {path}: {what}", file=sys.stderr)
        args.no_class_archive = path is None  # (so the title says so)
    tmp = tempfile.mkdtemp(prefix="bench-spark-")
    # (a nearly full disk slows the broker's writes: on a disk that filled to 42 MB free over
    # a morning's runs the sink's first write measured 0.47-0.57 of the direct publish, with 75
    # GB free 0.66-0.77)
    args.free_disk = shutil.disk_usage(tmp).free
    if args.free_disk < (10 << 30):
        print(f"warning: {args.free_disk / 2**30:.1f} GiB free where the broker writes ({tmp}): a run writes "
              f"~{3 * args.count * args.size / 2**30:.1f} GiB, and a nearly full disk slows the broker", file=sys.stderr)
    port, mgmt = free_port(), free_port()
    broker = subprocess.Popen([sys.executable, "-m", "warren", "server", "--port", str(port), "--management-port",
                               str(mgmt), "--data-dir", os.path.join(tmp, "data")],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "broker.log"), "w"), cwd=tmp)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        n, size = args.count, args.size
        loadgen(port, "setup", "--queue", "s", "--durable", "--queue-type", "stream")
        # exactly n entries (no end marker: it would make a last micro-batch of one row, whose
        # fixed cost the source's rates would carry); the direct consume stops at the n-th
        loadgen(port, "publish", "--routing-key", "s", "--size", size, "--count", n, "--confirm", "--window", 1000,
                "--persistent", "--no-marker")
        direct = loadgen(port, "consume", "--queue", "s", "--prefetch", 1000, "--ack-every", 100, "--stream-offset",
                         "first", "--idle-timeout", 5, "--count", n)["rate"]
        from warren.spark import register
        builder = _builder(args, "bench-spark")
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        uri = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        out = os.path.join(tmp, "out")
        started = time.monotonic()
        source = (spark.readStream.format("warren").option("uri", uri).option("stream", "s")
                  .option("startingOffsets", "earliest").option("minPartitions", args.partitions)
                  .option("maxRecordsPerTrigger", args.per_trigger))
        if args.max_per_partition:
            source = source.option("maxRecordsPerPartition", args.max_per_partition)
        query = (source.load()
                 .writeStream.format("parquet").option("path", out).option("checkpointLocation", out + ".cp")
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        source_s = time.monotonic() - started
        rows = spark.read.parquet(out).count()
        source = _progress(query.recentProgress, source_s)

        floor = None
        if args.floor:  # (in a process of its own: a new session in this one reuses the warm JVM)
            spark.stop()
            floor = _fresh_spark(args, "--copy-parquet", out, os.path.join(tmp, "copy"))
            spark = builder.getOrCreate()  # (the sink's measurements' session)
            register(spark)
        if args.source_only:
            spark.stop()
            _title(args)
            _source_table(direct, rows / source_s, source, floor)
            assert rows == n, f"{rows} rows, expected {n}"
            return 0
        loadgen(port, "setup", "--queue", "q")
        publish = loadgen(port, "publish", "--routing-key", "q", "--size", size, "--count", n, "--confirm",
                          "--window", 1000)["rate"]
        loadgen(port, "setup", "--queue", "q", "--purge")
        df = spark.range(n).selectExpr(f"cast(repeat('x', {size}) as binary) as body").cache()
        df.count()
        sink_s = []
        for _ in range(2):
            loadgen(port, "setup", "--queue", "q", "--purge")
            started = time.monotonic()
            df.write.format("warren").option("uri", uri).option("routingKey", "q").mode("append").save()
            sink_s.append(time.monotonic() - started)
            queued = loadgen(port, "count", "--queue", "q")["message_count"]
            assert queued == n, f"the sink left {queued} messages in the queue, expected {n}"
        spark.stop()
        # (in a process of its own, so its first micro-batch is a cold one)
        loadgen(port, "setup", "--queue", "q", "--purge")
        stream = _fresh_spark(args, "--stream-to-queue", out, uri, "q")
        queued = loadgen(port, "count", "--queue", "q")["message_count"]
        assert queued == n == stream["rows"], f"the streaming sink left {queued} messages in the queue, expected {n}"
        rate_out, rate_again, rate_stream = n / sink_s[0], n / sink_s[1], n / stream["seconds"]
        _title(args)
        _source_table(direct, rows / source_s, source, floor)
        print(f"| direct publish with confirms, msg/s (loadgen) | {publish:,.0f} |")
        print(f"| sink: rows/s with confirms | {rate_out:,.0f} |")
        print(f"| sink / direct publish | {rate_out / publish:.2f} |")
        print(f"| sink, the same write again, rows/s | {rate_again:,.0f} |")
        print(f"| sink again / direct publish | {rate_again / publish:.2f} |")
        print(f"| streaming sink: parquet → writeStream, fresh Spark, rows/s ({stream['batches']} batches) "
              f"| {rate_stream:,.0f} |")
        print(f"| streaming sink / direct publish | {rate_stream / publish:.2f} |")
        print(f"| streaming sink after the first micro-batch, rows/s | {stream['steady']:,.0f} |")
        print(f"| streaming sink after the first micro-batch / direct publish | {stream['steady'] / publish:.2f} |")
        print(f"| streaming sink: start() to the first micro-batch, s | {stream['query_start']:.1f} |")
        print(f"| streaming sink: first micro-batch, s / rows it wrote | {stream['first']:.1f}"
              f" / {stream['first_rows']:,} |")
        print(f"| streaming sink: per-batch overhead outside addBatch, ms (median) | {stream['overhead']:,} |")
        assert rows == n, f"{rows} rows, expected {n}"
        return 0
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def _builder(args, name: str):
    """A session builder for --master, with fast_start() unless --no-fast-start."""
    from pyspark.sql import SparkSession

    from warren.spark import fast_start
    from warren.spark.class_archive import DRIVER_OPTIONS
    builder = (SparkSession.builder.master(args.master).appName(name)
               .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g"))
    settings = {} if args.no_fast_start else fast_start()
    if args.no_class_archive:
        settings.pop(DRIVER_OPTIONS, None)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


def _copy_parquet(args, src: str, dst: str) -> int:
    """The floor of a cold run: a fresh Spark streams the source's output (the same rows, the
    same schema, about the same files per micro-batch) from parquet into parquet with
    Trigger.AvailableNow. Prints its figures as JSON (_progress's, rows as read back)."""
    from warren.spark.rows import SCHEMA_DDL
    spark = _builder(args, "bench-spark-floor").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    files = [f for f in os.listdir(src) if f.endswith(".parquet")]
    per_trigger = max(1, round(len(files) * args.per_trigger / args.count))
    started = time.monotonic()
    # (the source's schema as given: reading the files' first would warm Spark's parquet reader)
    query = (spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", per_trigger).parquet(src)
             .writeStream.format("parquet").option("path", dst).option("checkpointLocation", dst + ".cp")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    rows = spark.read.parquet(dst).count()
    spark.stop()
    print(json.dumps({"seconds": seconds, **_progress(query.recentProgress, seconds), "rows": rows}))
    return 0


def _stream_to_queue(args, src: str, uri: str, queue: str) -> int:
    """The sink's micro-batches, cold: a fresh Spark streams the bodies of the source's output
    from parquet into writeStream.format("warren") (Trigger.AvailableNow, about --per-trigger
    rows a micro-batch). Prints its figures as JSON (_progress's)."""
    from warren.spark import register
    spark = _builder(args, "bench-spark-sink").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    files = [f for f in os.listdir(src) if f.endswith(".parquet")]
    per_trigger = max(1, round(len(files) * args.per_trigger / args.count))
    cp = tempfile.mkdtemp(prefix="bench-spark-sink-cp-")
    started = time.monotonic()
    query = (spark.readStream.schema("body binary").option("maxFilesPerTrigger", per_trigger).parquet(src)
             .writeStream.format("warren").option("uri", uri).option("routingKey", queue)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    spark.stop()
    shutil.rmtree(cp, ignore_errors=True)
    print(json.dumps({"seconds": seconds, **_progress(query.recentProgress, seconds)}))
    return 0


def _fresh_spark(args, *what: str) -> dict:
    """Run this script's hidden `what` (--copy-parquet, --stream-to-queue) in a new process with
    this run's Spark settings; its JSON figures."""
    flags = [flag for flag, on in (("--no-fast-start", args.no_fast_start),
                                   ("--no-class-archive", args.no_class_archive)) if on]
    return json.loads(subprocess.run(
        [sys.executable, __file__, "--master", args.master, "--per-trigger", str(args.per_trigger),
         "--count", str(args.count), *flags, *what],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])


def _progress(progress: list, seconds: float) -> dict:
    """A streaming query's figures from its recentProgress: rows, rows/s after the first
    micro-batch, the first micro-batch's seconds and rows, the median per-batch overhead outside
    addBatch (ms), and the time from start() to the first trigger (s) of a query that ran for
    `seconds`."""
    batches = [p for p in progress if p["numInputRows"]]
    if not batches:
        raise RuntimeError("the query read no rows")
    return {
        "rows": sum(p["numInputRows"] for p in batches),
        "steady": (sum(p["numInputRows"] for p in batches[1:])
                   / max(1e-9, sum(p["durationMs"]["triggerExecution"] for p in batches[1:]) / 1000)),
        "first": batches[0]["durationMs"]["triggerExecution"] / 1000,
        "first_rows": batches[0]["numInputRows"],
        "batches": len(batches),
        "overhead": sorted(p["durationMs"]["triggerExecution"] - p["durationMs"].get("addBatch", 0)
                           for p in batches)[len(batches) // 2],
        "query_start": seconds - sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000,
    }


def _title(args) -> None:
    print(f"\n{args.count:,} × {args.size} B, {args.master}, one Warren broker, {time.strftime('%Y-%m-%d %H:%M')}"
          f"{', without fast_start()' if args.no_fast_start else ''}"
          f"{', without the class archive' if args.no_class_archive else ''}"
          f"{_REPORTING[page_reporting()]}, {args.free_disk / 2**30:.0f} GiB free on the disk\n")


_REPORTING = {None: "", True: ", free page reporting on", False: ", free page reporting off"}


def _source_table(direct: float, rate_in: float, source: dict, floor: dict | None = None) -> None:
    print("| Metric | value |\n|---|---:|")
    print(f"| direct consume from `first`, msg/s (loadgen) | {direct:,.0f} |")
    print(f"| source: stream → parquet, rows/s (AvailableNow, {source['batches']} batches) | {rate_in:,.0f} |")
    print(f"| source / direct consume | {rate_in / direct:.2f} |")
    # (the first micro-batch starts Spark's Python workers and warms the JVM)
    print(f"| source after the first micro-batch, rows/s | {source['steady']:,.0f} |")
    print(f"| source after the first micro-batch / direct consume | {source['steady'] / direct:.2f} |")
    # (the query's Python runner, its start offsets)
    print(f"| source: start() to the first micro-batch, s | {source['query_start']:.1f} |")
    print(f"| source: first micro-batch, s / rows it read | {source['first']:.1f} / {source['first_rows']:,} |")
    print(f"| source: per-batch overhead outside addBatch, ms (median) | {source['overhead']:,} |")
    if floor:
        rate = floor["rows"] / floor["seconds"]
        print(f"| Spark alone: the same rows parquet → parquet, cold, rows/s | {rate:,.0f} |")
        print(f"| the same as a ratio to the direct consume | {rate / direct:.2f} |")
        print(f"| Spark alone after the first micro-batch, rows/s (ratio) | {floor['steady']:,.0f}"
              f" ({floor['steady'] / direct:.2f}) |")


if __name__ == "__main__":
    sys.exit(main())
