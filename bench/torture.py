#!/usr/bin/env python3
"""kill -9 torture at a bigger scale than CI's tests/crash/test_torture.py (same harness,
tests/crash/torture.py): publishers with confirms and a consumer with manual acks run while a
Warren broker is SIGKILLed at random moments and restarted on the same data dir; at the end
the queue is drained and the run is checked (see the harness for what is checked).

    python3 bench/torture.py --kills 100
    python3 bench/torture.py --duration 300 --size 4096 --seed 1234 --verbose

Exit status 0 when every check holds, 1 otherwise (the problems and the seed are printed).
"""

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from conftest import free_port, start_broker  # noqa: E402
from crash.torture import Settings, run  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=None,
                   help="SIGKILLs to deliver (default 50; with --duration: at most this many)")
    p.add_argument("--duration", type=float, default=None, help="seconds to keep killing the broker")
    p.add_argument("--size", type=int, default=1024, help="message body size in bytes (default 1024)")
    p.add_argument("--min-pause", type=float, default=0.2, help="shortest time between a restart and a kill (s)")
    p.add_argument("--max-pause", type=float, default=1.5, help="longest time between a restart and a kill (s)")
    p.add_argument("--rate", type=float, default=3000, help="new messages/s per publisher, 0 for no limit")
    p.add_argument("--queue-window", type=int, default=None,
                   help="the broker's --queue-window (small values make the queue page to disk)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed for the kill schedule and client choices")
    p.add_argument("--data-dir", default=None, help="data dir to use (default: a fresh temporary one, removed "
                                                     "after a successful run)")
    p.add_argument("--verbose", action="store_true", help="print a line at every kill")
    args = p.parse_args(argv)

    kills = args.kills if args.kills is not None else (0 if args.duration else 50)
    settings = Settings(kills=kills, duration=args.duration, min_pause=args.min_pause, max_pause=args.max_pause,
                        size=args.size, rate=args.rate, seed=args.seed, settle_timeout=300, verbose=args.verbose)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="warren-torture-")
    port = free_port()
    extra = ("--queue-window", str(args.queue_window)) if args.queue_window else ()
    brokers = []

    def start():
        brokers.append(start_broker(*extra, data_dir=data_dir, port=port))
        return brokers[-1]

    try:
        result = run(settings, start)
    finally:
        for b in brokers:
            b.stop()
    print(result.summary())
    if result.problems:
        print(f"FAILED ({len(result.problems)} problems; data dir and broker logs kept in {data_dir}):")
        for line in result.problems:
            print("  " + line)
        return 1
    print("OK")
    if not args.data_dir:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
