"""How long a quorum queue's new leader takes to rebuild its queue from its replica log
(ReplicatedQueueStore.recover, the replay at every takeover): N enqueued 1 KiB messages,
written through the persister, read back by a log opened again as after a restart.

    python bench/replica_replay.py [--messages N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from warren.store.persister import Persister  # noqa: E402
from warren.store.replica_log import ReplicaLog  # noqa: E402
from warren.store.replicated import _ENQUEUE, ENQUEUE, ReplicatedQueueStore  # noqa: E402

ROUTE = b"\x00\x01q"  # (exchange "", routing key "q")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="warren-replay-")
    try:
        persister = Persister(directory)
        log = ReplicaLog(persister, os.path.join(directory, "replica"), 64 << 20)
        body = b"x" * 1024
        for n in range(args.messages):
            log.append(1, ENQUEUE, _ENQUEUE.pack(n + 1, 0, -1, len(ROUTE), 0) + ROUTE, body)
            if n % 1000 == 999:
                persister.flush()
        persister.sync_now()
        reopened = ReplicaLog(Persister(directory), os.path.join(directory, "replica"), 64 << 20)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            store = ReplicatedQueueStore.recover(reopened, 2)
            times.append((time.perf_counter() - started) * 1000)
            assert len(store) == args.messages
        times.sort()
        print(f"replay of {args.messages:,} enqueued messages: median {times[len(times) // 2]:.0f} ms "
              f"(min {times[0]:.0f}, max {times[-1]:.0f}, {args.repeat} runs)")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
