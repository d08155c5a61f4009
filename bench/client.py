#!/usr/bin/env python3
"""warren.client's ReliablePublisher against raw aio-pika confirm-mode publishing (issue 14).

    python bench/client.py [--messages 20000] [--window 1000,100] [--size 1024] [--repeat 3]
                           [--baseline DIR]

Starts Warren (`python -m warren server`, default configuration, a fresh data dir) and a
private RabbitMQ 3.10 node on free loopback ports (bench/run.py's broker classes), then, on
each broker, publishes --messages persistent messages of --size bytes to a durable queue with
at most W unconfirmed at a time, W from --window, three ways:

  raw      aio-pika: a channel with publisher_confirms=True, W tasks each awaiting
           `default_exchange.publish(Message(body, delivery_mode=PERSISTENT), routing_key=q)`
           in a loop (every publish returns once confirmed);
  reliable warren.client.ReliablePublisher(url, max_in_flight=W): W tasks each awaiting
           `publish(body, routing_key=q)` in a loop (returns once confirmed);
  outbox   the same with outbox=<a fresh SQLite file>: W tasks each awaiting publish() (returns
           once the row is committed), then flush() (returns once every row was confirmed and
           deleted); the time includes the flush.

The clock starts after the connection is open and one warm-up message went through, and stops
when the last publish returned (raw, reliable) or flush() returned (outbox). Every run checks
that the queue holds all the messages, then deletes the queue. Each run is a fresh Python
process (the client CPU time per message is that process's, its SQLite threads included).
Runs are interleaved (for each round: every broker, every window, raw / reliable / outbox) and
repeated --repeat times; the table shows medians and each rate as a ratio of raw aio-pika on
the same broker with the same window (issue 14's goal: at least 0.8).

--baseline DIR also measures the reliable and outbox publishers of the `warren` package in DIR
(an older checkout: `git worktree add /tmp/base <commit>`), in the same rounds, as rows
"reliable (baseline)" and "outbox (baseline)": before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent

WAYS = ("raw", "reliable", "outbox")


# --------------------------------------------------------------------------
# one run, in a child process: `client.py --child '{"way": ..., ...}'` prints a JSON line


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads: the outbox's SQLite ones too
    return ru.ru_utime + ru.ru_stime


async def in_windows(publish_one, n: int, window: int) -> None:
    """n calls of publish_one() with at most `window` awaiting at once: `window` tasks that
    each publish until n were started."""
    started = itertools.count()

    async def worker() -> None:
        while next(started) < n:
            await publish_one()

    await asyncio.gather(*(worker() for _ in range(window)))


async def run_raw(url: str, queue: str, n: int, window: int, body: bytes) -> float:
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange

        async def publish_one() -> None:
            await exchange.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                                   routing_key=queue)

        await publish_one()  # warm-up
        t0 = time.perf_counter()
        await in_windows(publish_one, n, window)
        return time.perf_counter() - t0


async def run_reliable(url: str, queue: str, n: int, window: int, body: bytes,
                       outbox: str | None) -> float:
    from warren.client import ReliablePublisher

    async with ReliablePublisher(url, max_in_flight=window, outbox=outbox) as pub:
        async def publish_one() -> None:
            await pub.publish(body, routing_key=queue)

        await publish_one()  # warm-up: connection and channel open
        await pub.flush()
        t0 = time.perf_counter()
        await in_windows(publish_one, n, window)
        await pub.flush()
        return time.perf_counter() - t0


async def child(spec: dict) -> dict:
    import aio_pika  # both imported before the CPU time is taken
    import warren.client

    url, way, n, window = spec["url"], spec["way"], spec["messages"], spec["window"]
    body = os.urandom(spec["size"])
    cpu0 = cpu_seconds()
    if way == "raw":
        elapsed = await run_raw(url, spec["queue"], n, window, body)
    else:
        elapsed = await run_reliable(url, spec["queue"], n, window, body, spec.get("outbox"))
    cpu = cpu_seconds() - cpu0
    return {"seconds": elapsed, "rate": n / elapsed, "cpu_us_per_msg": cpu / (n + 1) * 1e6,
            "client": os.path.dirname(os.path.dirname(warren.client.__file__)),
            "aio_pika": aio_pika.__version__}


# --------------------------------------------------------------------------
# the orchestrator


async def prepare(url: str, queue: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await channel.declare_queue(queue, durable=True)


async def count_and_delete(url: str, queue: str) -> int:
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True, passive=True)
        count = q.declaration_result.message_count or 0
        await channel.queue_delete(queue)
        return count


def measure(broker, way: str, n: int, window: int, size: int, tmp: str,
            baseline: str | None = None) -> dict:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    queue = f"bench-client-{way}-{window}"
    asyncio.run(prepare(url, queue))
    spec = {"url": url, "queue": queue, "way": way, "messages": n, "window": window, "size": size}
    if way == "outbox":
        spec["outbox"] = os.path.join(tempfile.mkdtemp(dir=tmp), "outbox.db")  # a fresh one
    env = dict(os.environ)
    path = [baseline] if baseline else []
    env["PYTHONPATH"] = os.pathsep.join([*path, str(REPO_DIR), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{broker.name} {way} W={window} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if baseline and not result["client"].startswith(os.path.abspath(baseline)):
        raise RuntimeError(f"--baseline: the child imported warren.client from {result['client']}")
    count = asyncio.run(count_and_delete(url, queue))
    if count != n + 1:  # + the warm-up message
        raise RuntimeError(f"{broker.name} {way} W={window}: {count} messages in the queue, "
                           f"expected {n + 1}")
    return {"broker": broker.name, "way": way + (" (baseline)" if baseline else ""),
            "window": window, "messages": n, "size": size, **result}


def windows(text: str) -> list[int]:
    return [int(w) for w in text.split(",") if w.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000, help="messages per run (default 20,000)")
    ap.add_argument("--window", type=windows, default=[1000, 100],
                    help="unconfirmed messages at most, comma-separated list (default 1000,100)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each scenario (default 3); medians")
    ap.add_argument("--target", choices=["warren", "rabbitmq", "both"], default="both")
    ap.add_argument("--way", action="append", choices=WAYS, help="measure only these (repeatable)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also measure the reliable and outbox publishers of the warren package in DIR")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figures to FILE")
    ap.add_argument("--warren-cmd", default=None,
                    help="how to start Warren, as in bench/run.py: {port}, {data_dir} and {python} "
                         "are substituted (default: {python} -m warren server --port {port} "
                         "--data-dir {data_dir} --management-port 0)")
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(json.loads(args.child)))))
        return 0

    sys.path.insert(0, str(BENCH_DIR))
    from run import BrokerError, RabbitMQ, Warren, kill_all_children, log

    ways = args.way or list(WAYS)
    runs = [(way, None) for way in ways]
    if args.baseline:
        args.baseline = os.path.abspath(args.baseline)
        if not os.path.isdir(os.path.join(args.baseline, "warren", "client")):
            ap.error(f"--baseline: no warren/client in {args.baseline}")
        runs += [(way, args.baseline) for way in ways if way != "raw"]
    broker_args = SimpleNamespace(warren_cmd=args.warren_cmd, start_timeout=args.start_timeout,
                                  keep_tmp=args.keep_tmp, rabbitmq_nodename=None,
                                  rabbitmq_server=None, rabbitmqctl=None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    targets = ["warren", "rabbitmq"] if args.target == "both" else [args.target]
    brokers = []
    results: list[dict] = []
    tmp = tempfile.mkdtemp(prefix="bench-client-")
    try:
        for t in targets:
            b = Warren(broker_args) if t == "warren" else RabbitMQ(broker_args)
            brokers.append(b)
            b.start()
        for round_ in range(args.repeat):
            for b in brokers:
                for w in args.window:
                    for way, baseline in runs:
                        r = measure(b, way, args.messages, w, args.size, tmp, baseline)
                        r["round"] = round_
                        results.append(r)
                        log(f"round {round_ + 1}/{args.repeat} {b.name} W={w} {r['way']}: "
                            f"{r['rate']:,.0f} msg/s, client CPU {r['cpu_us_per_msg']:.0f} µs/msg")
    except BrokerError as e:
        log(str(e))
        return 1
    finally:
        for b in brokers:
            b.stop()
            b.cleanup_tmp()
        kill_all_children()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(results, brokers, [way + (" (baseline)" if base else "") for way, base in runs], args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def print_table(results: list[dict], brokers, ways: list[str], args) -> None:
    def median(broker: str, way: str, w: int, key: str) -> float:
        return statistics.median(r[key] for r in results
                                 if (r["broker"], r["way"], r["window"]) == (broker, way, w))

    print(f"\n{args.messages:,} persistent messages × {args.size} B to a durable queue, "
          f"medians of {args.repeat} runs, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print("| Broker | W | publisher | msg/s | client CPU µs/msg | / raw aio-pika |")
    print("|---|---:|---|---:|---:|---:|")
    for b in brokers:
        for w in args.window:
            raw = median(b.name, "raw", w, "rate") if "raw" in ways else None
            for way in ways:
                rate = median(b.name, way, w, "rate")
                ratio = f"{rate / raw:.2f}" if raw else ""
                print(f"| {b.name} | {w} | {way} | {rate:,.0f} | "
                      f"{median(b.name, way, w, 'cpu_us_per_msg'):.0f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
