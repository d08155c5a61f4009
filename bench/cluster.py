#!/usr/bin/env python3
"""Metadata changes, and a classic queue used across nodes, on a three-node cluster: Warren (three
etcd members and three nodes) against RabbitMQ 3.10 (three clustered nodes,
tools/rabbitmq_node.py's RabbitMQCluster), on this machine.

    python bench/cluster.py [--phases metadata,queues] [--count 500] [--samples 200]
                            [--messages 20000 | --seconds S] [--window 500] [--prefetch 100]
                            [--ack-every 25] [--repeat 3] [--target both] [--json FILE]
                            [--keep-tmp] [--py-spy DIR]

(Needs pika: run it with the project's venv, e.g. /work/venv/bin/python bench/cluster.py; the
queues phase needs bench/loadgen: make -C bench.)

--phases metadata (the default) runs the phases below; --phases queues the classic queue's
(further below); both may be given.

Metadata phases, each run once per broker per round (the brokers alternate their order every round),
every request one RPC at a time (the client waits for the -ok before the next, as most clients
do), each client a pika BlockingConnection in its own process:

  declare x1   one client on node 2 declares --count durable direct exchanges;
  bind x1      the same client binds them exchange to exchange: exchange i to exchange i+1
               (mod count), routing key "k<i>";
  delete x1    it deletes them (their bindings go with them);
  declare x3, bind x3, delete x3
               the same with three clients at once, one per node, each --count exchanges of
               its own (3 x count in all): declares/s = all requests / time from the first
               request of any client to the last reply of any;
  propagation  --samples times: declare an exchange on node 1 and, from the moment its
               declare-ok arrives, poll node 3 with a passive exchange.declare (a 404 closes
               the channel; a new one is opened) until it answers declare-ok. The delay's
               median and p99, how many samples were visible at the first poll, and what one
               poll costs (one that finds the exchange, one that misses): the resolution.
               Then the same with the polling started when node 1's declare is sent, by a
               second connection to node 3 in a thread of its own: the delay from node 1's
               declare-ok to the reply of node 3's first poll that found the exchange (negative:
               node 3 had it before node 1 answered). The exchanges are then deleted (not timed).

Latency is one request's time from sending it to its reply, in the client. The broker CPU of a
phase is the CPU seconds of every broker process (Warren: the three nodes and, apart, the
three etcd members; RabbitMQ: the three nodes' process groups) over the phase. For Warren the
mean fsync time of etcd's write-ahead log (the member on node 1's endpoint, its /metrics) over
the run is printed too: one etcd transaction per change waits for it on a majority; and, per
phase, etcd's committed raft proposals per request: above 1 when nodes lost the race for the
log's revision and wrote their change again.

Queues (--phases queues), per round and broker, each a loadgen publisher and consumer (one
process each, bench/loadgen.c) and a durable classic queue declared through node 1 (its home):

  across       the publisher on node 2 (1 KiB persistent messages, publisher confirms, at most
               --window unconfirmed), the consumer on node 3 (manual acks, multiple=true every
               --ack-every messages, prefetch --prefetch), --messages messages (or --seconds);
  home         the same with publisher and consumer on node 1 (the baseline: no node links).

The rate is messages / time from the publisher's first publish to the consumer's last ack;
confirm latency is a publish's time to its basic.ack, delivery latency its time to its
delivery (the body carries the send time); broker CPU per message is every node's (and, for
Warren, etcd's apart), node by node too; and the nodes' write(2)-family system calls per
message (/proc/PID/io's syscw: write and writev to sockets and files, not send or sendmsg).
Every message must arrive exactly once and be confirmed. Before the first round one unmeasured
run of 1,000 messages across nodes brings the node links up. --py-spy DIR records each Warren node with py-spy during these runs (raw
stacks, one file per node and run); its sampling slows Warren, so the figures of such a run are
not comparable.

etcd runs with its defaults (heartbeat 100 ms, election 1 s, a WAL fsync per commit), each
member with its own data directory in the run's temporary directory. Warren runs from this
checkout. Progress goes to stderr, a Markdown table (medians over the rounds, each round's
figure in brackets when there are several) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO_DIR / "tools"))

from rabbitmq_node import (RabbitMQCluster, amqp_probe, free_ports, kill_all_children,  # noqa: E402
                           kill_tree, spawn, watchdog_send)
from run import (LOADGEN, ProcSet, RunError, fmt_num, group_cpu_seconds, group_pids, loadgen,  # noqa: E402
                 log, run_setup)

NODES = 3
PHASES = [("declare", 1), ("bind", 1), ("delete", 1), ("declare", 3), ("bind", 3), ("delete", 3)]


# --------------------------------------------------------------------------
# the clients, each in a child process: `cluster.py --child '{...}'` prints one JSON line


def child(spec: dict) -> dict:
    import pika
    if spec["op"] == "propagation":
        return propagation(spec)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", spec["port"]))
    ch = conn.channel()
    prefix, count = spec["prefix"], spec["count"]
    if spec["op"] == "declare":
        def request(i: int) -> None:
            ch.exchange_declare(f"{prefix}{i}", "direct", durable=True)
    elif spec["op"] == "bind":
        def request(i: int) -> None:
            ch.exchange_bind(destination=f"{prefix}{(i + 1) % count}", source=f"{prefix}{i}",
                             routing_key=f"k{i}")
    elif spec["op"] == "delete":
        def request(i: int) -> None:
            ch.exchange_delete(f"{prefix}{i}")
    else:
        raise ValueError(spec["op"])
    while time.monotonic() < spec["start_at"]:  # (the clients of one phase start together)
        time.sleep(0.001)
    latencies = []
    t_first = time.monotonic()
    for i in range(count):
        t0 = time.perf_counter()
        request(i)
        latencies.append(time.perf_counter() - t0)
    t_last = time.monotonic()
    conn.close()
    return {"t_first": t_first, "t_last": t_last, "latencies": latencies}


def propagation(spec: dict) -> dict:
    import threading
    import pika
    from pika.exceptions import ChannelClosedByBroker

    def connect(port: int):
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))

    def poll(conn, ch, name: str, t0: float):
        """Passive declares until one succeeds: (its reply time, polls, the channel, misses' time)."""
        n, missed_s = 0, 0.0
        while True:
            n += 1
            tp = time.perf_counter()
            try:
                ch.exchange_declare(name, passive=True)
                return time.perf_counter(), n, ch, missed_s
            except ChannelClosedByBroker as err:
                if err.reply_code != 404:
                    raise
                missed_s += time.perf_counter() - tp
                ch = conn.channel()
            if time.perf_counter() - t0 > 30:
                raise RuntimeError(f"{name} not visible on the reader's node after 30 s")

    writer, reader = connect(spec["port"]), connect(spec["reader_port"])
    wch, rch = writer.channel(), reader.channel()
    names = [f"{spec['prefix']}{i}" for i in range(spec["count"])]
    # After: the first poll of node 3 goes out once node 1's declare-ok is in.
    delays, polls, missed, missed_s = [], [], 0, 0.0
    for name in names:
        wch.exchange_declare(name, "direct", durable=True)
        t_ok = time.perf_counter()
        t_vis, n, rch, m_s = poll(reader, rch, name, t_ok)
        delays.append(t_vis - t_ok)
        polls.append(n)
        missed, missed_s = missed + n - 1, missed_s + m_s
    hits = []  # a poll that finds the exchange: the resolution of the above
    for name in names:
        tp = time.perf_counter()
        rch.exchange_declare(name, passive=True)
        hits.append(time.perf_counter() - tp)
    for name in names:
        wch.exchange_delete(name)
    # Meanwhile: a second connection to node 3 polls from the moment node 1's declare goes out,
    # in a thread of its own; the delay is from node 1's declare-ok to the reply of node 3's
    # first poll that found it (negative: seen on node 3 before node 1 answered).
    poller = connect(spec["reader_port"])
    pch = poller.channel()
    go, seen = threading.Event(), threading.Event()
    box: dict = {}

    def run_poller() -> None:
        nonlocal pch
        while True:
            go.wait()
            go.clear()
            if box.get("stop"):
                return
            box["t_vis"], _, pch, _ = poll(poller, pch, box["name"], time.perf_counter())
            seen.set()

    thread = threading.Thread(target=run_poller, daemon=True)
    thread.start()
    overlap = []
    for name in names:
        box["name"] = name + ".c"
        seen.clear()
        go.set()
        wch.exchange_declare(box["name"], "direct", durable=True)
        t_ok = time.perf_counter()
        if not seen.wait(35):
            raise RuntimeError(f"{box['name']} not visible on the reader's node after 35 s")
        overlap.append(box["t_vis"] - t_ok)
    box["stop"] = True
    go.set()
    thread.join(5)
    for name in names:
        wch.exchange_delete(name + ".c")
    for conn in (writer, reader, poller):
        conn.close()
    return {"delays": delays, "polls": polls, "missed_poll_s": missed_s / missed if missed else None,
            "hit_poll_s": statistics.median(hits), "overlap": overlap}


def run_children(specs: list[dict], timeout: float) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, __file__, "--child", json.dumps(s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in specs]
    out = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"client exited with {p.returncode}: {stderr.strip()[-800:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


# --------------------------------------------------------------------------
# the clusters


def group_writes(pgid: int | None) -> int:
    """write(2)-family system calls (write, writev, pwrite: sockets and files alike; not send
    or sendmsg) made so far by the live processes of a process group (/proc/PID/io)."""
    total = 0
    for pid in group_pids(pgid):
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("syscw:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total



class WarrenCluster:
    name = "warren"

    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="warren-cluster-bench-")
        if not args.keep_tmp:
            watchdog_send(f"d+{self.tmp}")
        self.etcd: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.etcd_client: list[int] = []
        self.names = [f"warren-{i + 1}@localhost" for i in range(NODES)]
        self._spawns: list[tuple[list[str], dict, str]] = []  # each node's argv, env, directory

    def start(self) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("needs etcd (Debian's etcd-server)")
        ports = free_ports(5 * NODES)
        clients, peers, self.ports = ports[:NODES], ports[NODES:2 * NODES], ports[2 * NODES:3 * NODES]
        dist = ports[3 * NODES:4 * NODES]  # the node links' ports (the default, AMQP + 20000, may not be one)
        # The management API only when asked for (bench/cluster_import.py): off, it costs nothing.
        self.mgmt = ports[4 * NODES:] if getattr(self.args, "mgmt", False) else [0] * NODES
        self.etcd_client = clients
        initial = ",".join(f"e{i}=http://127.0.0.1:{peers[i]}" for i in range(NODES))
        for i in range(NODES):
            d = os.path.join(self.tmp, f"etcd-{i}")
            os.makedirs(d)
            client = f"http://127.0.0.1:{clients[i]}"
            with open(os.path.join(d, "etcd.log"), "ab") as lf:
                # etcd's defaults otherwise: nothing tuned.
                self.etcd.append(spawn(
                    [etcd, "--name", f"e{i}", "--data-dir", os.path.join(d, "data"),
                     "--listen-client-urls", client, "--advertise-client-urls", client,
                     "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                     "--initial-cluster", initial, "--initial-cluster-state", "new",
                     "--initial-cluster-token", os.path.basename(self.tmp)],
                    stdout=lf, stderr=lf))
        deadline = time.monotonic() + 30
        while not all(self._etcd_healthy(c) for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not become healthy in 30 s")
            time.sleep(0.1)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for i in range(NODES):
            d = os.path.join(self.tmp, f"warren-{i + 1}")
            os.makedirs(d)
            conf = os.path.join(d, "rabbitmq.conf")
            with open(conf, "w") as f:
                f.write("cluster_formation.peer_discovery_backend = etcd\n")
                for j, c in enumerate(clients, 1):
                    f.write(f"cluster_formation.etcd.endpoints.{j} = 127.0.0.1:{c}\n")
                f.write(f"distribution.listener.port_range.min = {dist[i]}\n"
                        f"distribution.listener.port_range.max = {dist[i]}\n")
            argv = [sys.executable, "-m", "warren", "server", "--node-name", self.names[i],
                    "--config", conf, "--data-dir", os.path.join(d, "data"), "--port", str(self.ports[i]),
                    "--management-port", str(self.mgmt[i]), "--prometheus-port", "0"]
            self._spawns.append((argv, env, d))
            self.nodes.append(self._spawn(i))
        for i in range(NODES):
            self._wait_node(i)
        log(f"warren: etcd on {clients}, nodes on {self.ports}")

    def _spawn(self, i: int) -> subprocess.Popen:
        argv, env, d = self._spawns[i]
        with open(os.path.join(d, "warren.log"), "ab") as lf:
            return spawn(argv, env=env, cwd=d, stdout=lf, stderr=lf)

    def _wait_node(self, i: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while amqp_probe(self.ports[i]) is None:
            if self.nodes[i].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"warren-{i + 1} did not start; see {self.tmp}")
            time.sleep(0.2)

    def api(self, i: int) -> str:
        """Node i's management API (needs args.mgmt)."""
        return f"http://127.0.0.1:{self.mgmt[i]}/api"

    def kill(self, i: int) -> None:
        """kill -9 of node i's process group, as a crash; restart(i) starts it again."""
        try:
            os.killpg(self.nodes[i].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.nodes[i].wait(30)

    def restart(self, i: int) -> None:
        """Node i again after kill(i): the same name, ports, configuration and data."""
        self.nodes[i] = self._spawn(i)
        self._wait_node(i)

    @staticmethod
    def _etcd_healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                return json.load(r).get("health") == "true"
        except (OSError, ValueError):
            return False

    def cpu(self) -> dict[str, float]:
        return {"broker": sum(group_cpu_seconds(p.pid) for p in self.nodes),
                "etcd": sum(group_cpu_seconds(p.pid) for p in self.etcd)}

    def node_cpu(self) -> list[float]:
        return [group_cpu_seconds(p.pid) for p in self.nodes]

    def node_writes(self) -> list[int]:
        return [group_writes(p.pid) for p in self.nodes]

    def node_pids(self) -> list[int]:
        return [p.pid for p in self.nodes]

    def etcd_metric(self, name: str) -> float:
        """One of etcd's metrics now (member 0's /metrics)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_client[0]}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        return 0.0

    def fsync(self) -> tuple[float, int]:
        """etcd's WAL fsync seconds and count so far (member 0)."""
        return (self.etcd_metric("etcd_disk_wal_fsync_duration_seconds_sum"),
                int(self.etcd_metric("etcd_disk_wal_fsync_duration_seconds_count")))

    def proposals(self) -> float:
        """Raft proposals etcd has committed: a change that lost the race for the log's
        revision (its transaction's compare failed) and was written again counts twice."""
        return self.etcd_metric("etcd_server_proposals_committed_total")

    def stop(self) -> None:
        for p in self.nodes:
            kill_tree(p, grace=10.0)
        for p in self.etcd:
            kill_tree(p, grace=5.0)
        self.nodes, self.etcd = [], []
        if self.args.keep_tmp:
            log(f"warren: kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
            watchdog_send(f"d-{self.tmp}")


class RabbitCluster:
    name = "rabbitmq"

    def __init__(self, args):
        self.cluster = RabbitMQCluster(NODES, name_prefix="bench", keep_tmp=args.keep_tmp, log=log,
                                       plugins=["rabbitmq_management"] if getattr(args, "mgmt", False) else [])
        self.ports: list[int] = []

    def start(self) -> None:
        self.cluster.start()
        self.ports = [n.port for n in self.cluster.nodes]
        self.names = self.cluster.nodenames

    def api(self, i: int) -> str:
        return self.cluster.nodes[i].mgmt_api

    def kill(self, i: int) -> None:
        self.cluster.nodes[i].kill()

    def restart(self, i: int) -> None:
        self.cluster.nodes[i].restart()

    def cpu(self) -> dict[str, float]:
        return {"broker": sum(group_cpu_seconds(n.pid) for n in self.cluster.nodes)}

    def node_cpu(self) -> list[float]:
        return [group_cpu_seconds(n.pid) for n in self.cluster.nodes]

    def node_writes(self) -> list[int]:
        return [group_writes(n.pid) for n in self.cluster.nodes]

    def node_pids(self) -> list[int]:
        return []

    def fsync(self) -> None:
        return None

    def proposals(self) -> None:
        return None

    def stop(self) -> None:
        self.cluster.stop()


# --------------------------------------------------------------------------
# one round on one cluster


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def measure(cluster, args, round_no: int) -> dict:
    metrics: dict[str, float | None] = {}
    prefix = f"bench.r{round_no}."
    for op, clients in PHASES:
        nodes = [1] if clients == 1 else list(range(NODES))  # one client: node 2
        cpu0, proposals0 = cluster.cpu(), cluster.proposals()
        start_at = time.monotonic() + 3.0  # the clients' imports and connections first
        specs = [{"op": op, "port": cluster.ports[n], "prefix": f"{prefix}c{clients}.n{n}.",
                  "count": args.count, "start_at": start_at} for n in nodes]
        res = run_children(specs, timeout=args.timeout)
        cpu1, proposals1 = cluster.cpu(), cluster.proposals()
        span = max(r["t_last"] for r in res) - min(r["t_first"] for r in res)
        lat = [x for r in res for x in r["latencies"]]
        key = f"{op}_x{clients}"
        metrics[f"{key}_rate"] = len(lat) / span
        metrics[f"{key}_p50_ms"] = pct(lat, 0.5) * 1e3
        metrics[f"{key}_p99_ms"] = pct(lat, 0.99) * 1e3
        # (CPU over the phase, from before the clients start: the 3 s wait costs nothing)
        metrics[f"{key}_cpu_ms"] = (cpu1["broker"] - cpu0["broker"]) * 1e3 / len(lat)
        if "etcd" in cpu0:
            metrics[f"{key}_etcd_cpu_ms"] = (cpu1["etcd"] - cpu0["etcd"]) * 1e3 / len(lat)
        if proposals0 is not None:
            metrics[f"{key}_proposals"] = (proposals1 - proposals0) / len(lat)
        log(f"{cluster.name} round {round_no + 1}: {op} x{clients}: {metrics[f'{key}_rate']:.0f}/s, "
            f"p50 {metrics[f'{key}_p50_ms']:.2f} ms, p99 {metrics[f'{key}_p99_ms']:.2f} ms")
    res = run_children([{"op": "propagation", "port": cluster.ports[0], "reader_port": cluster.ports[2],
                         "prefix": f"{prefix}p.", "count": args.samples}], timeout=args.timeout)[0]
    d = res["delays"]
    metrics["prop_p50_ms"] = statistics.median(d) * 1e3
    metrics["prop_p99_ms"] = pct(d, 0.99) * 1e3
    metrics["prop_first_poll"] = sum(1 for n in res["polls"] if n == 1) / len(d)
    metrics["prop_miss_ms"] = res["missed_poll_s"] * 1e3 if res["missed_poll_s"] else None
    metrics["prop_hit_ms"] = res["hit_poll_s"] * 1e3
    metrics["prop_overlap_p50_ms"] = statistics.median(res["overlap"]) * 1e3
    metrics["prop_overlap_p99_ms"] = pct(res["overlap"], 0.99) * 1e3
    log(f"{cluster.name} round {round_no + 1}: propagation p50 {metrics['prop_p50_ms']:.2f} ms, "
        f"p99 {metrics['prop_p99_ms']:.2f} ms, {metrics['prop_first_poll']:.0%} at the first poll")
    return {"metrics": metrics, "raw_propagation": res}


# --------------------------------------------------------------------------
# classic queues across nodes (--phases queues): loadgen clients, one process per role

# (placement, the queue's home, the publisher's node, the consumer's node; 0-based)
PLACEMENTS = [("across", 0, 1, 2), ("home", 0, 0, 0)]


def measure_queues(cluster, args, round_no: int) -> dict:
    metrics: dict[str, float | None] = {}
    raw: dict[str, dict] = {}
    for placement, home, pub_node, cons_node in PLACEMENTS:
        m, r = queue_run(cluster, args, f"bench.r{round_no}.q.{placement}", home, pub_node, cons_node,
                         profile_tag=f"r{round_no + 1}-{placement}")
        metrics.update({f"q_{placement}_{k}": v for k, v in m.items()})
        raw[placement] = r
        log(f"{cluster.name} round {round_no + 1}: queue {placement}: {m['rate']:.0f} msg/s end to end, "
            f"confirm p50 {m['confirm_p50_ms']:.2f} ms, delivery p50 {m['delivery_p50_ms']:.2f} ms, "
            f"broker CPU {m['cpu_us']:.0f} µs/msg")
    return {"metrics": metrics, "raw_queues": raw}


def queue_run(cluster, args, queue: str, home: int, pub_node: int, cons_node: int,
              profile_tag: str, queue_type: str = "classic") -> tuple[dict, dict]:
    """One durable queue (of `queue_type`) declared through `home`, a confirming publisher on
    `pub_node`, a manually acking consumer on `cons_node`: (figures, the clients' JSON)."""
    ports = cluster.ports
    workdir = tempfile.mkdtemp(prefix="cluster-bench-q-")
    ps = ProcSet(workdir)
    profilers: list[subprocess.Popen] = []
    try:
        run_setup(ports[home], "--queue", queue, "--durable",
                  *(("--queue-type", queue_type) if queue_type != "classic" else ()))
        # every node the clients use has the queue (on Warren it reaches them through the log)
        for n in {pub_node, cons_node} - {home}:
            r = subprocess.run(loadgen(ports[n], "count", "--queue", queue, "--seconds", 10),
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise RunError(f"{queue} not on node {n + 1} after 10 s: {r.stderr.strip()}")
        est = args.seconds if args.seconds else max(10.0, args.messages / 1000.0)
        ready = os.path.join(workdir, "ready")
        cons = ps.start("cons", ports[cons_node], "consume", "--queue", queue,
                        "--prefetch", args.prefetch, "--ack-every", args.ack_every,
                        "--seconds", f"{est * 3 + 60:.0f}", "--idle-timeout", 30, "--grace", 2,
                        "--ready-file", ready)
        deadline = time.monotonic() + 20
        while not os.path.exists(ready):
            if cons[0].poll() is not None or time.monotonic() > deadline:
                cons[2].seek(0)
                raise RunError(f"consumer did not start: {cons[2].read().strip()}")
            time.sleep(0.02)
        if args.py_spy and cluster.node_pids():
            os.makedirs(args.py_spy, exist_ok=True)
            for i, pid in enumerate(cluster.node_pids(), 1):
                out = os.path.join(args.py_spy, f"{cluster.name}-{profile_tag}-node{i}.txt")
                profilers.append(spawn([args.py_spy_bin, "record", "--pid", pid, "--nonblocking", "--format", "raw",
                                        "--rate", 250, "--output", out], stdout=subprocess.DEVNULL,
                                       stderr=open(out + ".log", "w")))
            time.sleep(1.0)  # (py-spy attaches)
        popts = ["--routing-key", queue, "--size", 1024, "--persistent", "--confirm",
                 "--window", args.window, "--confirm-timeout", 120]
        popts += ["--seconds", args.seconds] if args.seconds else ["--count", args.messages]
        cpu0, nodes0, writes0 = cluster.cpu(), cluster.node_cpu(), cluster.node_writes()
        pub, _ = ps.finish(ps.start("pub", ports[pub_node], "publish", *popts), est * 3 + 60,
                           f"{cluster.name}: publisher")
        con, _ = ps.finish(cons, est * 3 + 90, f"{cluster.name}: consumer")
        cpu1, nodes1, writes1 = cluster.cpu(), cluster.node_cpu(), cluster.node_writes()
        for p in profilers:  # py-spy writes its file on SIGINT
            os.killpg(p.pid, signal.SIGINT)
        for p in profilers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                log("py-spy did not stop in 30 s")
            kill_tree(p, grace=1.0)
        profilers = []
        bad = {k: con[k] for k in ("missing", "duplicates", "redelivered") if con[k]}
        bad.update({k: pub[k] for k in ("nacked", "unconfirmed") if pub[k]})
        if bad or not con["marker_seen"]:
            raise RunError(f"{cluster.name} {queue}: lost, repeated or unconfirmed messages: {bad}, "
                           f"marker seen: {con['marker_seen']}")
        n = con["unique"]
        span = (con["t_end_ns"] - pub["t_start_ns"]) / 1e9
        conf, lat = pub["confirm_latency"], con["latency"]
        m: dict[str, float | None] = {
            "rate": n / span, "publish_rate": pub["rate"], "messages": n,
            "confirm_p50_ms": conf["p50_us"] / 1e3, "confirm_p99_ms": conf["p99_us"] / 1e3,
            "delivery_p50_ms": lat["p50_us"] / 1e3, "delivery_p99_ms": lat["p99_us"] / 1e3,
            "cpu_us": (cpu1["broker"] - cpu0["broker"]) / n * 1e6}
        for i in range(NODES):
            m[f"cpu_node{i + 1}_us"] = (nodes1[i] - nodes0[i]) / n * 1e6
        m["writes"] = (sum(writes1) - sum(writes0)) / n
        for i in range(NODES):
            m[f"writes_node{i + 1}"] = (writes1[i] - writes0[i]) / n
        if "etcd" in cpu0:
            m["etcd_cpu_us"] = (cpu1["etcd"] - cpu0["etcd"]) / n * 1e6
        return m, {"publish": pub, "consume": con}
    finally:
        for p in profilers:
            kill_tree(p, grace=5.0)
        ps.close(keep=True)
        try:
            run_setup(ports[home], "--delete", "--queue", queue, timeout=60)
        except (RunError, subprocess.TimeoutExpired) as err:
            log(f"{cluster.name}: deleting {queue}: {err}")
        if not args.keep_tmp:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------
# the table

ROWS = []
for _op, _c in PHASES:
    _k = f"{_op}_x{_c}"
    _what = {"declare": "exchange.declare", "bind": "exchange.bind (exchange to exchange)",
             "delete": "exchange.delete"}[_op]
    _who = "1 client on node 2" if _c == 1 else "3 clients, one per node"
    ROWS += [(f"{_k}_rate", f"{_what}, {_who}: per s", True),
             (f"{_k}_p50_ms", f"{_what}, {_who}: p50 ms", False),
             (f"{_k}_p99_ms", f"{_what}, {_who}: p99 ms", False),
             (f"{_k}_cpu_ms", f"{_what}, {_who}: broker CPU ms per request", False),
             (f"{_k}_etcd_cpu_ms", f"{_what}, {_who}: etcd CPU ms per request", False),
             (f"{_k}_proposals", f"{_what}, {_who}: etcd proposals per request", False)]
for _pl, _who in (("across", "declared on node 1, publisher on node 2, consumer on node 3"),
                  ("home", "declared on node 1, publisher and consumer on node 1")):
    _q = f"classic queue, {_who}"
    ROWS += [(f"q_{_pl}_rate", f"{_q}: msg/s end to end (first publish to last ack)", True),
             (f"q_{_pl}_publish_rate", f"{_q}: msg/s confirmed (the publisher's own)", True),
             (f"q_{_pl}_confirm_p50_ms", f"{_q}: confirm latency p50 ms", False),
             (f"q_{_pl}_confirm_p99_ms", f"{_q}: confirm latency p99 ms", False),
             (f"q_{_pl}_delivery_p50_ms", f"{_q}: publish to delivery p50 ms", False),
             (f"q_{_pl}_delivery_p99_ms", f"{_q}: publish to delivery p99 ms", False),
             (f"q_{_pl}_cpu_us", f"{_q}: broker CPU µs per message (all nodes)", False)]
    ROWS += [(f"q_{_pl}_cpu_node{_i}_us", f"{_q}: of which node {_i}", False) for _i in range(1, NODES + 1)]
    ROWS += [(f"q_{_pl}_etcd_cpu_us", f"{_q}: etcd CPU µs per message", False),
             (f"q_{_pl}_writes", f"{_q}: write(2)-family system calls per message (all nodes)", False)]
    ROWS += [(f"q_{_pl}_writes_node{_i}", f"{_q}: of which node {_i}", False) for _i in range(1, NODES + 1)]
ROWS += [("prop_p50_ms", "propagation node 1 -> node 3, polled after declare-ok: p50 ms", False),
         ("prop_p99_ms", "propagation node 1 -> node 3, polled after declare-ok: p99 ms", False),
         ("prop_first_poll", "propagation: share visible at the first poll", True),
         ("prop_hit_ms", "propagation: one poll that finds it (passive declare), p50 ms", False),
         ("prop_miss_ms", "propagation: one poll that misses (404, new channel), mean ms", False),
         ("prop_overlap_p50_ms", "propagation, polled from the declare's send: declare-ok to seen, p50 ms",
          False),
         ("prop_overlap_p99_ms", "propagation, polled from the declare's send: declare-ok to seen, p99 ms",
          False)]


def cell(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    med = statistics.median(vals)
    if len(vals) == 1:
        return fmt_num(med)
    return f"{fmt_num(med)} ({' / '.join(fmt_num(v) for v in vals)})"


def render(results: dict[str, list[dict]]) -> str:
    targets = [t for t in ("warren", "rabbitmq") if t in results]
    head = ["Metric"] + [{"warren": "Warren", "rabbitmq": "RabbitMQ 3.10.8"}[t] for t in targets]
    if len(targets) == 2:
        head.append("Warren/RabbitMQ")
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for key, label, _higher in ROWS:
        cols = {t: [r["metrics"].get(key) for r in results[t]] for t in targets}
        if not any(v is not None for vs in cols.values() for v in vs):
            continue
        row = [label] + [cell(cols[t]) for t in targets]
        if len(targets) == 2:
            w = [v for v in cols["warren"] if v is not None]
            r = [v for v in cols["rabbitmq"] if v is not None]
            # (no ratio of a delay that may be negative)
            row.append(fmt_num(statistics.median(w) / statistics.median(r))
                       if w and r and statistics.median(w) > 0 and statistics.median(r) > 0 else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=["warren", "rabbitmq", "both"], default="both")
    ap.add_argument("--count", type=int, default=500, help="exchanges per client and phase (default 500)")
    ap.add_argument("--samples", type=int, default=200, help="propagation samples (default 200)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the brokers alternate their order")
    ap.add_argument("--timeout", type=float, default=600, help="bound on each phase, s (default 600)")
    ap.add_argument("--phases", default="metadata",
                    help="comma-separated: metadata (exchanges, propagation), queues (a classic queue "
                         "across nodes and on its home); default metadata")
    ap.add_argument("--messages", type=int, default=20000,
                    help="queues: messages per run (default 20,000)")
    ap.add_argument("--seconds", type=float, default=0,
                    help="queues: publish for this many seconds instead of --messages")
    ap.add_argument("--window", type=int, default=500,
                    help="queues: unconfirmed publishes at most (default 500)")
    ap.add_argument("--prefetch", type=int, default=100, help="queues: the consumer's prefetch (default 100)")
    ap.add_argument("--ack-every", type=int, default=25,
                    help="queues: the consumer acks with multiple=true every N messages (default 25)")
    ap.add_argument("--py-spy", metavar="DIR",
                    help="queues: record each Warren node with py-spy (raw stacks) into DIR; the "
                         "sampling slows Warren, so take figures from a run without it")
    ap.add_argument("--json", help="also write every round's figures to this file")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the clusters' directories and logs")
    args = ap.parse_args()
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not phases or phases - {"metadata", "queues"}:
        ap.error(f"--phases: metadata and/or queues, not {args.phases!r}")
    if "queues" in phases:  # (built as run.py builds it: a stale binary lacks what this reads)
        subprocess.run(["make", "-s", "-C", os.path.dirname(LOADGEN), "loadgen"], stdin=subprocess.DEVNULL)
        if not os.access(LOADGEN, os.X_OK):
            ap.error(f"{LOADGEN} missing; run make -C bench")
    if args.py_spy:  # (on PATH, or in the venv running this)
        args.py_spy_bin = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if args.py_spy_bin is None:
            ap.error("--py-spy: no py-spy on PATH nor next to this Python")
    targets = ["warren", "rabbitmq"] if args.target == "both" else [args.target]
    kinds = {"warren": WarrenCluster, "rabbitmq": RabbitCluster}
    clusters = {t: kinds[t](args) for t in targets}  # (each makes its directory at once)
    results: dict[str, list[dict]] = {t: [] for t in targets}
    fsync: tuple[float, int] | None = None
    try:
        for t in targets:
            clusters[t].start()
        if "warren" in targets:
            fsync = clusters["warren"].fsync()
        for t in targets:  # every node answers and sees the others' changes
            run_children([{"op": "propagation", "port": clusters[t].ports[0], "reader_port": port,
                           "prefix": f"bench.warmup.{i}.", "count": 5}
                          for i, port in enumerate(clusters[t].ports[1:])], timeout=120)
        if "queues" in phases:  # the node links up and the clients' code warm, not measured
            warm = argparse.Namespace(**{**vars(args), "messages": 1000, "seconds": 0, "py_spy": None})
            for t in targets:
                queue_run(clusters[t], warm, "bench.warmup.q", 0, 1, 2, "warmup")
        for round_no in range(args.repeat):
            order = targets if round_no % 2 == 0 else list(reversed(targets))
            for t in order:
                res: dict = {"metrics": {}}
                if "metadata" in phases:
                    res = measure(clusters[t], args, round_no)
                if "queues" in phases:
                    q = measure_queues(clusters[t], args, round_no)
                    res["metrics"].update(q.pop("metrics"))
                    res.update(q)
                results[t].append(res)
        if "warren" in targets and fsync is not None:
            s1, n1 = clusters["warren"].fsync()
            fsync = (s1 - fsync[0], n1 - fsync[1])
    finally:
        for t in targets:
            try:
                clusters[t].stop()
            except Exception as err:  # (the other is still stopped)
                log(f"{t}: stop: {err}")
        kill_all_children()
    print()
    what = []
    if "metadata" in phases:
        what.append(f"{args.count} exchanges per client and phase, {args.samples} propagation samples")
    if "queues" in phases:
        what.append((f"{args.seconds:g} s" if args.seconds else f"{args.messages:,} messages")
                    + f" of 1 KiB persistent per queue run (confirm window {args.window}, prefetch "
                    f"{args.prefetch}, acks multiple every {args.ack_every})")
    print(f"{'; '.join(what)}; {args.repeat} round(s); medians, each round in brackets")
    print()
    print(render(results))
    if fsync and fsync[1]:
        print(f"\netcd member e0: {fsync[1]} WAL fsyncs, mean {fsync[0] / fsync[1] * 1e3:.2f} ms")
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results,
                       "etcd_fsync": fsync}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
