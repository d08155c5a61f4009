"""Definitions at scale (issue 17): the time to import N durable queues, each bound to a
direct exchange, through the management API (POST /api/definitions), and the time a
restarted broker takes to recover them from its data directory (start to accepting AMQP
connections, to the first answer of the API, and the recovery alone as the broker logs it: a
start's fixed cost, ~1 s and noisy, is most of a restart with 10k queues). Warren only: RabbitMQ's import of 100k
bindings is in the topology scenario's declare and bind times.

    python3 bench/definitions.py [--sizes 0,10k,100k] [--repeat 3]

Standard library only, as run.py."""

import argparse
import base64
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def definitions(n: int) -> dict:
    queues = [{"name": f"q{i}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
              for i in range(n)]
    bindings = [{"source": "bx", "vhost": "/", "destination": f"q{i}", "destination_type": "queue",
                 "routing_key": f"k{i}", "arguments": {}} for i in range(n)]
    return {"exchanges": [{"name": "bx", "vhost": "/", "type": "direct", "durable": True,
                           "auto_delete": False, "internal": False, "arguments": {}}],
            "queues": queues, "bindings": bindings}


class Warren:
    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(data_dir, "bench.log")

    def start(self) -> tuple[float, float]:
        """Start; (seconds until AMQP connections are accepted, until the API answers)."""
        self.port, self.mgmt = free_port(), free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO_DIR))
        t0 = time.monotonic()
        with open(self.log, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "warren", "server", "--port", str(self.port), "--data-dir", self.data_dir,
                 "--management-port", str(self.mgmt)], env=env, cwd=self.data_dir, stdout=log,
                stderr=subprocess.STDOUT)
        amqp = None
        while True:
            if amqp is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                    amqp = time.monotonic() - t0
                except OSError:
                    pass
            if amqp is not None:
                try:
                    self.api("GET", "/overview")
                    return amqp, time.monotonic() - t0
                except OSError:
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError("warren exited during start-up")
            time.sleep(0.01)

    def api(self, method: str, path: str, body: bytes | None = None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.mgmt}/api{path}", data=body, method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.read()

    def recovery(self) -> float:
        """Seconds the last start took to recover the saved definitions, from its log."""
        with open(self.log) as f:
            found = re.findall(r"recovered definitions from .* in ([0-9.]+) s", f.read())
        return float(found[-1])

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(60)


def measure(n: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="warren-defs-")
    try:
        body = json.dumps(definitions(n)).encode()
        w = Warren(tmp)
        w.start()
        t0 = time.monotonic()
        w.api("POST", "/definitions", body)
        imported = time.monotonic() - t0
        queues = len(json.loads(w.api("GET", "/queues?columns=name")))
        assert queues == n, f"{queues} queues after importing {n}"
        w.stop()
        amqp, api = w.start()
        recovery = w.recovery()
        bound = len(json.loads(w.api("GET", "/exchanges/%2F/bx/bindings/source")))
        assert bound == n, f"{bound} bindings recovered of {n}"
        w.stop()
        return {"import": imported, "recover_amqp": amqp, "recover_api": api, "recovery": recovery}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def size(text: str) -> int:
    text = text.lower()
    return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,10k,100k")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [size(s) for s in args.sizes.split(",")]
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for r in range(args.repeat):
        for n in sizes:
            m = measure(n)
            runs[n].append(m)
            print(f"[defs] run {r + 1}: {n:,} queues and bindings: import {m['import']:.2f} s, restart to AMQP "
                  f"{m['recover_amqp']:.2f} s, to the API {m['recover_api']:.2f} s, recovery {m['recovery']:.2f} s",
                  flush=True)
    print("\n| queues + bindings | import, s | restart to AMQP, s | restart to API, s | recovery (logged), s |")
    print("|---:|---:|---:|---:|---:|")
    med = {n: {k: statistics.median(m[k] for m in runs[n]) for k in runs[n][0]} for n in sizes}
    for n in sizes:
        print(f"| {n:,} | {med[n]['import']:.2f} | {med[n]['recover_amqp']:.2f} | {med[n]['recover_api']:.2f} "
              f"| {med[n]['recovery']:.2f} |")
    # With size 0 among the sizes, restarts are compared less an empty broker's start.
    base = med[0] if 0 in med else {"import": 0.0, "recover_amqp": 0.0, "recover_api": 0.0, "recovery": 0.0}
    grown = [n for n in sizes if n]
    for a, b in zip(grown, grown[1:]):
        ratio = [(med[b][k] - base[k]) / (med[a][k] - base[k])
                 for k in ("import", "recover_amqp", "recover_api", "recovery")]
        print(f"| {b:,} / {a:,} time{' (less an empty start)' if 0 in med else ''} | "
              + " | ".join(f"{r:.1f}x" for r in ratio) + " |")


if __name__ == "__main__":
    main()
