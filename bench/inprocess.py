#!/usr/bin/env python3
"""The broker's publish and deliver paths in one process, without sockets or a loop: client
frames fed to a session Connection over the unit tests' fake transport (tests/unit/
fake_transport.py), timed in CPU time, or counted in instructions under callgrind, which the
machine's load does not move:

    python3 bench/inprocess.py publish [--persistent] [-n N]     # µs of CPU a message
    python3 bench/inprocess.py deliver [-n N]
    PYTHONPATH=TREE python3 bench/inprocess.py ...                # another tree's code
    python3 bench/inprocess.py publish --persistent --instructions   # instructions a message:
        # two runs under `valgrind --tool=callgrind` (N and 2N messages), the difference / N

publish: 16 B messages in confirm mode into a durable queue with no consumer, in reads of 100
messages, the persister's fsync thread never run (the confirms wait; only the publish path
counts). deliver: 16 B transient messages published on one channel and delivered to a consumer
on another (prefetch 200), acked with multiple every 50.
"""

import argparse
import gc
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "unit"))


def _frames(ch: int, persistent: bool) -> bytes:
    from pamqp import body, commands, frame, header
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    return (frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), ch)
            + frame.marshal(header.ContentHeader(0, 16, props), ch) + frame.marshal(body.ContentBody(b"x" * 16), ch))


def publish(n: int, persistent: bool) -> float:
    from pamqp import commands
    from fake_transport import Client
    from warren.broker.broker import Broker
    from warren.store.persister import Persister
    broker = Broker.with_defaults()
    broker.persister = Persister(tempfile.mkdtemp(prefix="warren-bench-"), run_in_thread=lambda job, done: None)
    c = Client(broker)
    c.open_channel(1)
    c.call(1, commands.Queue.Declare(queue="q", durable=True))
    c.call(1, commands.Confirm.Select())
    chunk = _frames(1, persistent) * 100
    gc.collect()
    t0 = time.process_time()
    for _ in range(n // 100):
        c.conn.data_received(chunk)
        c.transport.run_scheduled()
    return (time.process_time() - t0) / n * 1e6


def deliver(n: int) -> float:
    from pamqp import commands, frame
    from fake_transport import Client
    from warren.broker.broker import Broker
    c = Client(Broker.with_defaults())
    c.open_channel(1)
    c.open_channel(2)
    c.call(1, commands.Queue.Declare(queue="q"))
    c.call(2, commands.Basic.Qos(prefetch_count=200))
    c.call(2, commands.Basic.Consume(queue="q", consumer_tag="t"))
    chunk = _frames(1, False) * 50
    conn, transport = c.conn, c.transport
    gc.collect()
    t0 = time.process_time()
    for tag in range(50, n + 1, 50):
        conn.data_received(chunk)
        transport.run_scheduled()
        conn.data_received(frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=True), 2))
        transport.run_scheduled()
        transport.data.clear()
    return (time.process_time() - t0) / n * 1e6


def _instructions(args, n: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
           args.path, "-n", str(n), "--once"] + (["--persistent"] if args.persistent else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", choices=("publish", "deliver"))
    ap.add_argument("--persistent", action="store_true", help="publish: persistent messages")
    ap.add_argument("-n", type=int, default=0, help="messages (default 200,000; 20,000 with --instructions)")
    ap.add_argument("--instructions", action="store_true", help="instructions a message, under callgrind")
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.instructions:
        n = args.n or 20_000
        per = (_instructions(args, 2 * n) - _instructions(args, n)) / n
        print(f"{args.path}{' persistent' if args.persistent else ''}: {per:,.0f} instructions a message")
        return
    n = args.n or 200_000
    run = (lambda: publish(n, args.persistent)) if args.path == "publish" else (lambda: deliver(n))
    if args.once:
        run()
        return
    best = min(run() for _ in range(3))
    print(f"{args.path}{' persistent' if args.persistent else ''}: {best:.2f} µs of CPU a message (best of 3)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
