#!/usr/bin/env python3
"""Benchmark Warren against RabbitMQ on the same machine, in the same run.

Starts each broker under test on free loopback ports, drives it with the C load
generator (bench/loadgen, see loadgen.c), and prints a Markdown table with the
Warren figure, the RabbitMQ figure and the ratio Warren/RabbitMQ per metric.

Standard library only. See bench/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import http.client
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
LOADGEN = BENCH_DIR / "loadgen"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Process bookkeeping (own process groups, watchdog) and the private RabbitMQ
# node live in tools/rabbitmq_node.py, shared with the test runner.
sys.path.insert(0, str(REPO_DIR / "tools"))
from rabbitmq_node import (RabbitMQNode, RabbitMQNodeError, amqp_probe,  # noqa: E402
                           forget as _forget, free_port, kill_all_children, kill_tree,
                           port_open, spawn, watchdog_send as _watchdog_send)

# --------------------------------------------------------------------------
# logging / process bookkeeping


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    pass


def wait_rusage(p: subprocess.Popen, timeout: float) -> tuple[int | None, float]:
    """Wait for a child up to `timeout` s; return (exit status or None, CPU s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped
            return p.returncode, 0.0
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            _forget(p)
            return p.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() >= deadline:
            return None, 0.0
        time.sleep(0.02)


def group_cpu_seconds(pgid: int | None) -> float:
    """utime+stime (all threads) of the live processes in a process group, in
    seconds. Brokers are started as group leaders, so this covers e.g. the
    Erlang VM that rabbitmq-server exec's into, and any helper processes."""
    if not pgid:
        return 0.0
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / CLK_TCK


def group_pids(pgid: int | None) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    if not pgid:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def proc_comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def vmrss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class RSSSampler:
    """Samples the broker's resident set size (sum of VmRSS over broker.rss_pids())
    every `interval` s in a thread, and keeps the peak and last value per phase."""

    def __init__(self, broker: "Broker", interval: float = 0.1):
        self.broker = broker
        self.interval = interval
        self.phase: str | None = None
        self.peak: dict[str, int] = {}   # phase -> KiB
        self.last: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self._pids: list[int] = []
        self._pids_at = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> "RSSSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def set_phase(self, phase: str | None) -> None:
        with self._lock:
            self.phase = phase
            self._pids_at = 0.0  # the broker may have been restarted: look again
        if phase is not None:
            self.sample()

    def peak_mb(self, *phases: str) -> float | None:
        vals = [self.peak[p] for p in phases if p in self.peak]
        return max(vals) / 1024 if vals else None

    def sample(self) -> None:
        with self._lock:
            phase = self.phase
            if phase is None:
                return
            now = time.monotonic()
            if now - self._pids_at > 0.5:
                self._pids = self.broker.rss_pids()
                self._pids_at = now
            total = sum(vmrss_kib(pid) for pid in self._pids)
            if total:
                self.peak[phase] = max(self.peak.get(phase, 0), total)
                self.last[phase] = total
                self.samples[phase] = self.samples.get(phase, 0) + 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def as_dict(self) -> dict:
        return {"peak_kib": dict(self.peak), "last_kib": dict(self.last),
                "samples": dict(self.samples), "interval_s": self.interval}


# --------------------------------------------------------------------------
# brokers


class BrokerError(Exception):
    pass


class Broker:
    name = "broker"

    def __init__(self, args):
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None
        self.logfile = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"{self.name} exited with status {self.proc.returncode} "
                                  f"during start-up; last log lines:\n{self.log_tail()}")
            if port_open(self.port) and amqp_probe(self.port) is not None:
                return
            time.sleep(0.2)
        raise BrokerError(f"{self.name} did not answer AMQP on port {self.port} within "
                          f"{timeout:.0f} s; last log lines:\n{self.log_tail()}")

    def log_tail(self, n: int = 15) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def alarm_lines(self, n: int = 5) -> str:
        """The last resource-alarm lines of its log (both brokers log "... resource limit
        alarm set/cleared ..."): a publisher that got no confirm may simply be blocked."""
        try:
            with open(self.logfile, errors="replace") as f:
                lines = [line for line in f if "alarm" in line]
        except OSError:
            return ""
        return "".join(lines[-n:])

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    # -- the management HTTP API (links between brokers, 13)

    def _api_connection(self, timeout: float) -> http.client.HTTPConnection:
        raise NotImplementedError

    def _api_headers(self) -> dict[str, str]:
        return {}

    def api(self, method: str, path: str, body=None, timeout: float = 30.0):
        """One request to the management API (path below /api); returns the decoded JSON
        answer (None if empty). RunError for a non-2xx answer, with the broker's reason."""
        conn = self._api_connection(timeout)
        headers = {**self._api_headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, "/api" + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise RunError(f"{self.name}: {method} /api{path}: {e}") from e
        finally:
            conn.close()
        if not 200 <= resp.status < 300:
            raise RunError(f"{self.name}: {method} /api{path}: HTTP {resp.status}: "
                           f"{raw.decode(errors='replace').strip()[:300]}")
        return json.loads(raw) if raw.strip() else None

    # -- for the recovery scenario: stop hard or cleanly, start again on the same data

    def rss_pids(self) -> list[int]:
        """The processes whose RSS counts as the broker's."""
        return group_pids(self.pid)

    def term_pid(self) -> int | None:
        """The process that gets SIGTERM for a clean stop."""
        return self.pid

    def _set_proc(self, p: subprocess.Popen | None) -> None:
        self.proc = p

    def kill_broker(self, sig: int, timeout: float = 120.0) -> float:
        """SIGTERM (clean stop) or SIGKILL the broker; wait until every process of its
        group is gone. Returns the seconds that took. Keeps the data dir."""
        p = self.proc
        if p is None or p.poll() is not None:
            raise RunError(f"{self.name} is not running")
        t0 = time.monotonic()
        try:
            if sig == signal.SIGKILL:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                os.kill(self.term_pid() or p.pid, sig)
        except ProcessLookupError:
            pass
        deadline = t0 + timeout
        while p.poll() is None or group_pids(p.pid):
            if time.monotonic() > deadline:
                kill_tree(p, grace=0)
                self._set_proc(None)
                raise RunError(f"{self.name} did not exit within {timeout:.0f} s of signal {sig}")
            time.sleep(0.005)
        elapsed = time.monotonic() - t0
        _forget(p)
        self._set_proc(None)
        return elapsed

    def respawn(self) -> None:
        """Start the broker again on the same data dir and port; does not wait."""
        raise NotImplementedError

    def wait_ready(self) -> None:
        self._wait_ready(self.args.start_timeout)

    def make_tmp(self, prefix: str) -> str:
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        if not self.args.keep_tmp:
            _watchdog_send(f"d+{self.tmp}")
        return self.tmp

    def cleanup_tmp(self) -> None:
        if self.tmp and not self.args.keep_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            _watchdog_send(f"d-{self.tmp}")
        elif self.tmp:
            log(f"{self.name}: kept {self.tmp}")
        self.tmp = None


class Warren(Broker):
    name = "warren"

    def start(self) -> None:
        self.make_tmp("warren-bench-")
        self.port = free_port()
        data_dir = self.data_dir = os.path.join(self.tmp, "data")
        self.logfile = os.path.join(self.tmp, "warren.log")
        fmt = {"port": self.port, "data_dir": data_dir, "python": sys.executable}
        if self.args.warren_cmd:
            argv = [a.format(**fmt) for a in shlex.split(self.args.warren_cmd)]
        else:
            argv = [sys.executable, "-m", "warren", "server", "--port", str(self.port),
                    "--data-dir", data_dir, "--management-port", "0"]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_DIR) + (os.pathsep + env["PYTHONPATH"]
                                             if env.get("PYTHONPATH") else "")
        self._argv, self._env = argv, env
        log(f"{self.name}: starting on port {self.port}: {' '.join(argv)}")
        self.respawn()
        self._wait_ready(self.args.start_timeout)
        log(f"{self.name}: ready (pid {self.proc.pid})")

    def respawn(self) -> None:
        with open(self.logfile, "ab") as lf:
            # Not in the repository: `python -m` puts the working directory first on sys.path,
            # which would shadow a --warren-cmd that runs another tree through PYTHONPATH.
            self.proc = spawn(self._argv, env=self._env, cwd=self.tmp, stdout=lf, stderr=lf)

    def stop(self) -> None:
        if self.proc:
            kill_tree(self.proc, grace=10.0)  # SIGTERM = clean shutdown
            self.proc = None

    def _api_connection(self, timeout: float) -> http.client.HTTPConnection:
        # The API on warrenctl's control socket in the data dir (warren.cli.local): there
        # even with --management-port 0, and trusted without a user.
        return _UnixHTTPConnection(os.path.join(self.data_dir, "warren-ctl.sock"), timeout)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class RabbitMQ(Broker):
    """A private RabbitMQ node (tools/rabbitmq_node.py): own node name, ports,
    epmd, cookie and dirs."""

    name = "rabbitmq"

    def __init__(self, args, nodename: str | None = None, plugins: tuple[str, ...] = ()):
        super().__init__(args)
        self.node = RabbitMQNode(
            nodename or args.rabbitmq_nodename, server=args.rabbitmq_server,
            rabbitmqctl=args.rabbitmqctl, start_timeout=args.start_timeout,
            keep_tmp=args.keep_tmp, tmp_prefix="rabbitmq-bench-", plugins=plugins, log=log)

    def start(self) -> None:
        try:
            self.node.start()
        except RabbitMQNodeError as e:
            raise BrokerError(str(e)) from e
        finally:
            self.proc, self.port = self.node.proc, self.node.port
            self.tmp, self.logfile = self.node.tmp, self.node.logfile

    def stop(self) -> None:
        self.node.stop()  # also removes (or keeps, with --keep-tmp) its temp dir
        self.proc = None

    def cleanup_tmp(self) -> None:
        self.tmp = None  # done by stop()

    def _beam_pids(self) -> list[int]:
        return [pid for pid in group_pids(self.pid) if proc_comm(pid) == "beam.smp"]

    def rss_pids(self) -> list[int]:
        # rabbitmq-server is a shell script that runs the Erlang VM (beam.smp) as a child;
        # the shell and erl_child_setup are a few MB and not counted.
        return self._beam_pids()

    def term_pid(self) -> int | None:
        beams = self._beam_pids()
        return beams[0] if beams else self.pid

    def _set_proc(self, p) -> None:
        self.proc = self.node.proc = p

    def respawn(self) -> None:
        """Start the same node again (same name, ports, epmd, cookie, mnesia dir)."""
        n = self.node
        with open(n.logfile, "ab") as lf:
            self._set_proc(spawn([n.server], env=n.env, cwd=n.tmp, stdout=lf, stderr=lf))

    def wait_ready(self) -> None:
        try:
            self.node._wait_ready()  # AMQP answers and rabbitmqctl await_startup
        except RabbitMQNodeError as e:
            raise RunError(str(e)) from e

    def _api_connection(self, timeout: float) -> http.client.HTTPConnection:
        if not self.node.mgmt_port:
            raise RunError(f"{self.name}: the node runs without the management plugin")
        return http.client.HTTPConnection(self.node.host, self.node.mgmt_port, timeout=timeout)

    def _api_headers(self) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


# --------------------------------------------------------------------------
# load generator


class RunError(Exception):
    pass


def loadgen(port: int, role: str, *opts) -> list[str]:
    return [str(LOADGEN), role, "--host", "127.0.0.1", "--port", str(port), *map(str, opts)]


def run_setup(port: int, *opts, timeout: float = 60) -> None:
    r = subprocess.run(loadgen(port, "setup", "--quiet", *opts), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RunError(f"setup {' '.join(map(str, opts))} failed: {r.stderr.strip()}")


@dataclass
class Scenario:
    key: str
    title: str
    description: str
    size: int = 16
    confirm: bool = False
    window: int = 1000
    persistent: bool = False
    durable: bool = False
    prefetch: int = 0
    ack_every: int = 0  # 0 = auto-ack
    fanout: int = 0     # number of queues bound to a fanout exchange (0 = direct to one queue)
    rate: float = 0.0   # publish rate limit, msg/s (latency scenario)
    latency: bool = False
    default: bool = True
    kind: str = "flow"  # flow (1-5), backlog (6), recovery (7), a scaling kind (8-11),
                        # or streams (12)


SCENARIOS: list[Scenario] = [
    Scenario("1", "16 B transient, 1 pub / 1 cons, auto-ack",
             "Raw throughput: one publisher without confirms, one auto-ack consumer.",
             size=16),
    Scenario("2", "1 KiB, confirms (window 1000), manual ack (multiple/50, prefetch 200)",
             "Reliable-delivery throughput: publisher confirms with at most 1000 unconfirmed, "
             "consumer prefetch 200 acking with multiple=true every 50 messages.",
             size=1024, confirm=True, window=1000, prefetch=200, ack_every=50),
    Scenario("3", "fanout to 4 queues, 4 consumers, 16 B transient, auto-ack",
             "Routing fan-out: one publisher to a fanout exchange bound to 4 queues, "
             "one auto-ack consumer per queue.",
             size=16, fanout=4),
    Scenario("4", "latency at 1000 msg/s, 16 B, confirms, auto-ack",
             "Latency at a fixed 1000 msg/s: end-to-end (publish to delivery) and "
             "confirm (publish to basic.ack) percentiles.",
             size=16, confirm=True, window=1000, rate=1000, latency=True),
    Scenario("5", "1 KiB persistent to durable queue, confirms (window 1000), manual ack "
                  "(multiple/50, prefetch 200)",
             "Like 2 but persistent messages to a durable queue (exercises the store).",
             size=1024, confirm=True, window=1000, prefetch=200, ack_every=50,
             persistent=True, durable=True),
    Scenario("6", "backlog: {n} × 16 B persistent into a durable queue (confirms, window "
                  "1000, no consumer), then drain (prefetch 1000, manual ack multiple/100)",
             "Deep queue: publish the backlog with nobody consuming, then drain it with "
             "one consumer; rates and the broker's peak RSS in each phase.",
             size=16, confirm=True, window=1000, prefetch=1000, ack_every=100,
             persistent=True, durable=True, kind="backlog"),
    Scenario("7", "recovery: restart with {n} × 16 B persistent messages in a durable queue",
             "Load the backlog as in 6, stop the broker with SIGTERM, restart it on the "
             "same data, then SIGKILL and restart again; time until passive queue.declare "
             "reports every message. Then drain and check every message came back.",
             size=16, confirm=True, window=1000, prefetch=1000, ack_every=100,
             persistent=True, durable=True, kind="recovery"),
    # Scaling (issue 17): not in the default set; `--scenario scaling` runs all four.
    Scenario("8", "topology: {sizes} queues declared, bound to a direct exchange, deleted "
                  "({window})",
             "Queue declare, bind and delete bursts at growing sizes, pipelined: time per "
             "phase and how it grows with the number of queues.",
             kind="topology", default=False),
    Scenario("9", "topic exchange, {sizes} bindings, 16 B, confirms (window 1000), "
                  "a new routing key per message",
             "Binding set-up time, and confirmed publish rate with a new id-carrying key per "
             "message that matches 1 binding, one that matches none, and a repeated key.",
             size=16, confirm=True, window=1000, kind="topic", default=False),
    Scenario("10", "headers exchange, {sizes} bindings (x-match=all, 2 pairs), 16 B, "
                   "confirms (window 1000)",
             "Binding set-up time and confirmed publish rate with headers matching 1 binding.",
             size=16, confirm=True, kind="headers", default=False),
    Scenario("11", "{sizes} bodies, transient and persistent, confirms, manual ack",
             "Big bodies: consume MB/s and the broker's peak RSS, transient and persistent.",
             confirm=True, kind="bodies", default=False),
    # Stream queues: not in the default set (it writes 2 × N KiB per broker).
    Scenario("12", "streams: {n} × 1 KiB persistent (confirms, window 1000) into a durable "
                   "classic queue and a stream; 1 consumer drains / reads from first, then "
                   "10 read the stream from offsets i·N/10 (prefetch 1000, manual ack "
                   "multiple/100)",
             "Stream queues against a classic queue: confirmed publish and read rates, "
             "and the broker's peak RSS with 1 and with 10 readers of the same stream.",
             size=1024, confirm=True, window=1000, prefetch=1000, ack_every=100,
             persistent=True, durable=True, kind="streams", default=False),
    # Links between two brokers of the same kind: not in the default set (they need a
    # second broker, and RabbitMQ's shovel, federation and management plugins).
    Scenario("13a", "shovel: {n} × 1 KiB persistent moved from a durable queue on A to one "
                    "on B (ack-mode on-confirm, default prefetch), by a shovel on A, then "
                    "by one on B",
             "A dynamic shovel between two brokers on this machine: time from creating it "
             "until the destination queue holds the whole backlog; each broker's CPU.",
             size=1024, confirm=True, window=1000, prefetch=1000, ack_every=100,
             persistent=True, durable=True, kind="shovel", default=False),
    Scenario("13b", "federation: {n} × 1 KiB persistent published (confirms, window 1000) "
                    "to direct exchange fed.x on A, federated to fed.x on B, to a durable "
                    "queue there",
             "An exchange federation link from A (upstream) to B: time from the first publish "
             "on A until B's queue holds every message; each broker's CPU.",
             size=1024, confirm=True, window=1000, prefetch=1000, ack_every=100,
             persistent=True, durable=True, kind="federation", default=False),
]
SCENARIO_ALIASES = {"throughput": "1", "confirms": "2", "fanout": "3", "latency": "4",
                    "persistent": "5", "backlog": "6", "recovery": "7",
                    "topology": "8", "topic": "9", "headers": "10", "bodies": "11",
                    "bigbody": "11", "streams": "12", "stream": "12",
                    "shovel": "13a", "shovels": "13a", "federation": "13b"}
SCENARIO_GROUPS = {"scaling": ["8", "9", "10", "11"], "links": ["13a", "13b"],
                   "13": ["13a", "13b"]}
DEFAULT_BACKLOG = 1_000_000
DEFAULT_LINK_BACKLOG = 100_000
LINK_KINDS = ("shovel", "federation")


def backlog_count(args, kind: str = "") -> int:
    default = DEFAULT_LINK_BACKLOG if kind in LINK_KINDS else DEFAULT_BACKLOG
    return args.backlog_count or args.count or default


def fmt_count(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


def scenario_title(sc: Scenario, args) -> str:
    title = sc.title.replace("{n}", fmt_count(backlog_count(args, sc.kind)))
    sizes = {"topology": args.topology_sizes, "topic": args.topic_bindings,
             "headers": args.headers_bindings}.get(sc.kind)
    if sc.kind == "bodies":
        title = title.replace("{sizes}", " / ".join(fmt_bytes(n) for n in args.body_sizes))
    elif sizes:
        title = title.replace("{sizes}", " / ".join(fmt_count(n) for n in sizes))
    window = ("one request at a time" if args.bulk_window <= 1
              else f"{args.bulk_window} requests in flight")
    if args.topology_durable:
        window = "durable, " + window
    return title.replace("{window}", window)


def run_scenario(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    """Run one scenario once against one broker; return a result dict."""
    port = broker.port
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    workdir = tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp)
    nq = sc.fanout or 1
    queues = [f"{tag}.q{i}" for i in range(nq)]
    exchange = f"{tag}.fanout" if sc.fanout else ""

    setup_opts = []
    for q in queues:
        setup_opts += ["--queue", q]
    if sc.durable:
        setup_opts.append("--durable")
    if exchange:
        setup_opts += ["--exchange", exchange, "--exchange-type", "fanout", "--bind"]
    run_setup(port, *setup_opts)

    pub_seconds = args.seconds if not args.count else 0
    if sc.latency:
        count = args.latency_count or 0
        pub_seconds = args.seconds if not count else 0
    else:
        count = args.count or 0
    # The consumer stops on the publisher's end marker; its own deadline only
    # bounds a broken or hopelessly slow broker.
    est = pub_seconds if pub_seconds else max(10.0, count / 20000.0)
    cons_deadline = est * 3 + 30
    pub_timeout = est * 3 + 60
    ps = ProcSet(workdir)
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no}
    try:
        cons = []
        for i, q in enumerate(queues):
            ready = os.path.join(workdir, f"ready{i}")
            copts = ["--queue", q, "--seconds", f"{cons_deadline:.0f}",
                     "--idle-timeout", str(args.idle_timeout), "--ready-file", ready]
            if sc.prefetch:
                copts += ["--prefetch", sc.prefetch]
            if sc.ack_every:
                copts += ["--ack-every", sc.ack_every]
            else:
                copts.append("--auto-ack")
            cons.append((ps.start(f"cons{i}", port, "consume", *copts), ready))
        deadline = time.monotonic() + 20
        for (p, _out, err), ready in cons:
            while not os.path.exists(ready):
                if p.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    raise RunError(f"consumer did not start: {err.read().strip()}")
                time.sleep(0.02)

        popts = ["--size", sc.size]
        if exchange:
            popts += ["--exchange", exchange, "--routing-key", ""]
        else:
            popts += ["--routing-key", queues[0]]
        if pub_seconds:
            popts += ["--seconds", pub_seconds]
        if count:
            popts += ["--count", count]
        if sc.confirm:
            popts += ["--confirm", "--window", sc.window]
        if sc.persistent:
            popts.append("--persistent")
        if sc.rate:
            popts += ["--rate", sc.rate]
        cpu0 = group_cpu_seconds(broker.pid)
        t0 = time.monotonic()
        # exit 3 = finished but with unconfirmed messages: still a result
        pub, pub_cpu = ps.finish(ps.start("pub", port, "publish", *popts), pub_timeout,
                                 f"{broker.name}: publisher", ok_codes=(0, 3), broker=broker)

        cons_results = []
        cons_cpu = 0.0
        for handle, _ in cons:
            remaining = max(1.0, cons_deadline + 15 - (time.monotonic() - t0))
            result_json, ccpu = ps.finish(handle, remaining, f"{broker.name}: consumer")
            cons_cpu += ccpu
            cons_results.append(result_json)
        wall = time.monotonic() - t0
        broker_cpu = group_cpu_seconds(broker.pid) - cpu0

        result.update(pub=pub, cons=cons_results, wall_s=wall, broker_cpu_s=broker_cpu,
                      loadgen_cpu_s=pub_cpu + cons_cpu)
        result["metrics"] = extract_metrics(sc, pub, cons_results, broker_cpu)
        result["integrity"] = {
            "missing": sum(c["missing"] for c in cons_results),
            "duplicates": sum(c["duplicates"] for c in cons_results),
            "nacked": pub.get("nacked", 0),
            "unconfirmed": pub.get("unconfirmed", 0),
            "marker_missing": sum(0 if c["marker_seen"] else 1 for c in cons_results),
            "stop_reasons": sorted({c["stop_reason"] for c in cons_results}),
        }
        return result
    finally:
        ps.close(keep=True)  # the workdir goes below, after the queues are deleted
        try:
            del_opts = []
            for q in queues:
                del_opts += ["--queue", q]
            if exchange:
                del_opts += ["--exchange", exchange]
            if broker.alive():
                run_setup(port, "--delete", *del_opts, timeout=30)
        except (RunError, subprocess.TimeoutExpired) as e:
            log(f"{broker.name}: cleanup failed: {e}")
        if not args.keep_tmp:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------
# durability scenarios: backlog (6) and recovery (7)


class ProcSet:
    """Load generator processes and their output files, cleaned up together."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.files = []

    def start(self, name: str, port: int, role: str, *opts):
        out = open(os.path.join(self.workdir, f"{name}.json"), "w+")
        err = open(os.path.join(self.workdir, f"{name}.err"), "w+")
        self.files += [out, err]
        p = spawn(loadgen(port, role, *opts), stdout=out, stderr=err)
        self.procs.append(p)
        return p, out, err

    def finish(self, handle, timeout: float, what: str, ok_codes=(0,),
               broker: "Broker | None" = None) -> tuple[dict, float]:
        """Wait for a started loadgen; return (its JSON result, its CPU seconds). With
        `broker` (a publisher), a run that gave up waiting for confirms, or for the broker
        to read, also logs the broker's resource-alarm lines and the end of its log."""
        p, out, err = handle
        rc, cpu = wait_rusage(p, timeout)
        if rc is None:
            kill_tree(p)
            raise RunError(f"{what} did not finish within {timeout:.0f} s")
        out.seek(0)
        err.seek(0)
        text, etext = out.read().strip(), err.read().strip()
        if rc not in ok_codes or not text:
            raise RunError(f"{what} failed (exit {rc}): {etext or text}")
        if etext:
            log(f"{what}: {etext}")
        res = json.loads(text.splitlines()[-1])
        if broker is not None and (res.get("confirm_timed_out") or res.get("send_stuck")):
            log(f"{what}: gave up waiting for the broker; {broker.name}'s alarm lines:\n"
                f"{broker.alarm_lines() or '  (none)'}\nand the end of its log:\n{broker.log_tail(10)}")
        return res, cpu

    def close(self, keep: bool) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_tree(p, grace=2.0)
            _forget(p)
        for f in self.files:
            f.close()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def backlog_publish(ps: ProcSet, broker: Broker, sc: Scenario, queue: str, n: int,
                    name: str = "pub", exchange: str = "") -> tuple[dict, float, float]:
    """Publish n persistent messages (plus the end marker) with confirms, nobody
    consuming (to `queue`, or to `exchange` with `queue` as the routing key). Returns
    (publisher JSON, loadgen CPU s, broker CPU s)."""
    popts = ["--routing-key", queue, "--size", sc.size, "--count", n,
             "--confirm", "--window", sc.window, "--persistent", "--confirm-timeout", 120]
    if exchange:
        popts += ["--exchange", exchange]
    cpu0 = group_cpu_seconds(broker.pid)
    h = ps.start(name, broker.port, "publish", *popts)
    pub, cpu = ps.finish(h, 120 + n / 2000.0, f"{broker.name}: publisher", ok_codes=(0, 3),
                         broker=broker)
    if pub.get("nacked") or pub.get("unconfirmed"):
        log(f"{broker.name}: publisher: {pub.get('nacked')} nacked, "
            f"{pub.get('unconfirmed')} unconfirmed")
    return pub, cpu, group_cpu_seconds(broker.pid) - cpu0


def backlog_drain(ps: ProcSet, broker: Broker, sc: Scenario, queue: str, n: int, args,
                  name: str = "cons") -> tuple[dict, float, float]:
    """Consume the queue until the end marker. Returns (consumer JSON, loadgen CPU s,
    broker CPU s)."""
    deadline = 120 + n / 1000.0
    copts = ["--queue", queue, "--prefetch", sc.prefetch, "--seconds", f"{deadline:.0f}",
             "--idle-timeout", max(args.idle_timeout, 60.0), "--grace", 2]
    copts += ["--ack-every", sc.ack_every] if sc.ack_every else ["--auto-ack"]
    cpu0 = group_cpu_seconds(broker.pid)
    h = ps.start(name, broker.port, "consume", *copts)
    cons, cpu = ps.finish(h, deadline + 30, f"{broker.name}: consumer")
    return cons, cpu, group_cpu_seconds(broker.pid) - cpu0


def integrity_of(pub: dict, cons: dict) -> dict:
    return {
        "missing": cons["missing"], "duplicates": cons["duplicates"],
        "nacked": pub.get("nacked", 0), "unconfirmed": pub.get("unconfirmed", 0),
        "marker_missing": 0 if cons["marker_seen"] else 1,
        "stop_reasons": [cons["stop_reason"]],
        "redelivered": cons.get("redelivered", 0),
    }


def _us_per_msg(cpu_s: float, n: int):
    return cpu_s / n * 1e6 if n else None


def run_backlog(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    n = backlog_count(args)
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    queue = f"{tag}.q0"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    sampler = RSSSampler(broker, args.rss_interval).start()
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no, "count": n}
    t0 = time.monotonic()
    try:
        run_setup(broker.port, "--queue", queue, "--durable")
        sampler.set_phase("idle")
        time.sleep(0.3)
        sampler.set_phase("publish")
        log(f"{broker.name}: publishing {n:,} messages")
        pub, pub_cpu, broker_pub_cpu = backlog_publish(ps, broker, sc, queue, n)
        sampler.set_phase("drain")
        log(f"{broker.name}: published at {pub['rate']:,.0f} msg/s "
            f"(peak RSS {sampler.peak_mb('publish') or 0:.0f} MB); draining")
        cons, cons_cpu, broker_drain_cpu = backlog_drain(ps, broker, sc, queue, n, args)
        sampler.set_phase(None)
        m = {
            "publish_rate": pub["rate"],
            "drain_rate": cons["rate"],
            "rss_publish_mb": sampler.peak_mb("publish"),
            "rss_drain_mb": sampler.peak_mb("drain"),
            "broker_cpu_us_per_msg_published": _us_per_msg(broker_pub_cpu, pub["sent"]),
            "broker_cpu_us_per_msg_drained": _us_per_msg(broker_drain_cpu, cons["received"]),
        }
        result.update(pub=pub, cons=[cons], metrics=m, integrity=integrity_of(pub, cons),
                      rss=sampler.as_dict(), wall_s=time.monotonic() - t0,
                      broker_cpu_s=broker_pub_cpu + broker_drain_cpu,
                      loadgen_cpu_s=pub_cpu + cons_cpu)
        return result
    finally:
        sampler.stop()
        ps.close(args.keep_tmp)
        cleanup_queue(broker, queue)


def cleanup_queue(broker: Broker, queue: str) -> None:
    try:
        if broker.alive():
            run_setup(broker.port, "--delete", "--queue", queue, timeout=120)
    except (RunError, subprocess.TimeoutExpired) as e:
        log(f"{broker.name}: cleanup failed: {e}")


def restart_and_count(ps: ProcSet, broker: Broker, sig: int, queue: str, expect: int,
                      sampler: RSSSampler, phase: str, timeout: float) -> dict:
    """Stop the broker with `sig`, start it again on the same data and poll a passive
    queue.declare until it reports `expect` messages. Times are from the restart."""
    sampler.set_phase(None)
    stop_s = broker.kill_broker(sig)
    log(f"{broker.name}: {signal.Signals(sig).name}: exited after {stop_s:.2f} s; restarting")
    t0 = time.monotonic_ns()
    broker.respawn()
    sampler.set_phase(phase)
    h = ps.start(f"count-{phase}", broker.port, "count", "--queue", queue,
                 "--count", expect, "--seconds", f"{timeout:.0f}", "--connect-timeout", 2)
    p = h[0]
    while p.poll() is None:
        if not broker.alive():
            kill_tree(p)
            raise RunError(f"{broker.name} exited during recovery; last log lines:\n"
                           f"{broker.log_tail()}")
        time.sleep(0.05)
    info, _ = ps.finish(h, 5, f"{broker.name}: count", ok_codes=(0, 1))
    if not info["reached"]:
        raise RunError(f"{broker.name}: after restart the queue had {info['message_count']} "
                       f"messages after {timeout:.0f} s, expected {expect}")
    broker.wait_ready()
    sampler.set_phase(None)
    res = {
        "signal": signal.Signals(sig).name, "stop_s": stop_s,
        "login_s": (info["t_connect_ns"] - t0) / 1e9,
        "ready_s": (info["t_done_ns"] - t0) / 1e9,
        "message_count": info["message_count"], "count_poll": info,
        "rss_peak_mb": sampler.peak_mb(phase),
    }
    log(f"{broker.name}: after {res['signal']}: AMQP login after {res['login_s']:.2f} s, "
        f"{info['message_count']:,} messages after {res['ready_s']:.2f} s "
        f"(peak RSS {res['rss_peak_mb'] or 0:.0f} MB)")
    return res


def run_recovery(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    n = backlog_count(args)
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    queue = f"{tag}.q0"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    sampler = RSSSampler(broker, args.rss_interval).start()
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no, "count": n}
    timeout = 120 + n / 2000.0
    t0 = time.monotonic()
    try:
        run_setup(broker.port, "--queue", queue, "--durable")
        # Baseline: how long a restart takes with the (durable) queue empty.
        empty = restart_and_count(ps, broker, signal.SIGTERM, queue, 0, sampler,
                                  "restart-empty", timeout)
        log(f"{broker.name}: publishing {n:,} messages")
        sampler.set_phase("publish")
        pub, pub_cpu, _ = backlog_publish(ps, broker, sc, queue, n)
        expect = n + 1  # and the end marker
        term = restart_and_count(ps, broker, signal.SIGTERM, queue, expect, sampler,
                                 "restart-term", timeout)
        kill = restart_and_count(ps, broker, signal.SIGKILL, queue, expect, sampler,
                                 "restart-kill", timeout)
        log(f"{broker.name}: draining after the restarts")
        sampler.set_phase("drain")
        cons, cons_cpu, drain_cpu = backlog_drain(ps, broker, sc, queue, n, args)
        sampler.set_phase(None)
        m = {
            "publish_rate": pub["rate"],
            "restart_empty_s": empty["ready_s"],
            "stop_term_s": term["stop_s"],
            "restart_term_s": term["ready_s"],
            "restart_kill_s": kill["ready_s"],
            "rss_recovery_mb": sampler.peak_mb("restart-term", "restart-kill"),
            "drain_rate": cons["rate"],
        }
        result.update(pub=pub, cons=[cons], restarts={"empty": empty, "term": term,
                                                      "kill": kill},
                      metrics=m, integrity=integrity_of(pub, cons), rss=sampler.as_dict(),
                      wall_s=time.monotonic() - t0, broker_cpu_s=drain_cpu,
                      loadgen_cpu_s=pub_cpu + cons_cpu)
        return result
    finally:
        sampler.stop()
        ps.close(args.keep_tmp)
        cleanup_queue(broker, queue)


# --------------------------------------------------------------------------
# scaling scenarios (issue 17): topology (8), topic (9), headers (10), bodies (11)
#
# Each runs all its sizes on one broker. Every bulk phase is bounded by
# --scaling-timeout; a phase that runs out is reported as "timeout", the broker
# (which may still be busy with it) is restarted on a fresh data dir, and the
# rest of that scenario (later phases, larger sizes) is reported as "skipped".
# Publish phases are bounded by --seconds (plus the wait for the last confirms).

TIMEOUT = "timeout"
SKIPPED = "skipped"  # not run: a smaller size or an earlier phase timed out
# labels of the per-size metrics: key -> (label, higher is better)
DYN_METRICS: dict[str, tuple[str, bool]] = {}


def _metric(m: dict, key: str, value, label: str, higher: bool) -> None:
    DYN_METRICS.setdefault(key, (label, higher))
    m[key] = value


def fmt_bytes(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def parse_sizes(text: str) -> list[int]:
    """'1k,10k,100000' or '64k,1m,16m' -> [1000, 10000, 100000]; k/m are 1000 for
    counts, see parse_bytes for byte sizes."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part:
            mult = {"k": 1000, "m": 1000_000}.get(part[-1], 1)
            out.append(int(float(part.rstrip("km")) * mult))
    return out


def parse_bytes(text: str) -> list[int]:
    """'64k,1m,16m' -> binary sizes [65536, 1048576, 16777216]."""
    out = []
    for part in text.split(","):
        part = part.strip().lower().removesuffix("ib").removesuffix("b")
        if part:
            mult = {"k": 1 << 10, "m": 1 << 20}.get(part[-1], 1)
            out.append(int(float(part.rstrip("km")) * mult))
    return out


class PhaseTimeout(Exception):
    pass


def reset_broker(broker: Broker, why: str) -> None:
    """Replace a broker that may still be busy (a timed-out phase) by a fresh one."""
    log(f"{broker.name}: {why}; restarting it on a fresh data dir")
    broker.stop()
    broker.cleanup_tmp()
    try:
        broker.start()
    except BrokerError as e:
        raise RunError(f"restart failed: {e}") from e


def run_bulk(ps: ProcSet, broker: Broker, args, name: str, *opts) -> dict:
    """One `loadgen bulk` phase; returns its JSON. Raises PhaseTimeout."""
    limit = args.scaling_timeout
    h = ps.start(name, broker.port, "bulk", "--seconds", limit, "--window",
                 args.bulk_window, *opts)
    res, _ = ps.finish(h, limit + 30, f"{broker.name}: {name}", ok_codes=(0, 4))
    if res["timed_out"]:
        raise PhaseTimeout(name)
    return res


def _ratio_metrics(m: dict, sizes: list[int], what: str, key: str, higher: bool) -> None:
    """`what` time (or rate) at each size divided by the one at the size before."""
    for a, b in zip(sizes, sizes[1:]):
        va, vb = m.get(f"{key}_{a}"), m.get(f"{key}_{b}")
        rk = f"{key}_ratio_{b}_{a}"
        v: float | str | None
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va > 0:
            v = vb / va
        else:
            v = next((x for x in (TIMEOUT, SKIPPED) if x in (va, vb)), None)
        _metric(m, rk, v, f"{what}: {fmt_count(b)} / {fmt_count(a)}", higher)


def run_topology(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    exchange = f"{tag}.direct"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no}
    m: dict = {}
    raw: dict = {}
    sizes = args.topology_sizes
    phases = [("declare", "declare {n} queues: s"), ("bind", "bind {n} queues: s"),
              ("delete", "delete {n} queues (with their bindings): s")]
    timed_out = False
    t0 = time.monotonic()
    try:
        run_setup(broker.port, "--exchange", exchange, "--exchange-type", "direct",
                  *(["--durable"] if args.topology_durable else []))
        for n in sizes:
            qt = f"{tag}.n{n}.q{{seq}}"
            for op, label in phases:
                key = f"topology_{op}_s_{n}"
                lab = label.format(n=fmt_count(n))
                if timed_out:
                    _metric(m, key, SKIPPED, lab, False)
                    continue
                opts = ["--ops", op, "--queue-template", qt, "--count", n]
                if op == "bind":
                    opts += ["--exchange", exchange]
                if args.topology_durable:
                    opts.append("--durable")
                try:
                    res = run_bulk(ps, broker, args, f"{op}-{n}", *opts)
                except PhaseTimeout:
                    timed_out = True
                    _metric(m, key, TIMEOUT, lab, False)
                    reset_broker(broker, f"{op} of {n:,} queues took over "
                                         f"{args.scaling_timeout:.0f} s")
                    continue
                raw[key] = res
                _metric(m, key, res["phases"][0]["elapsed_s"], lab, False)
                log(f"{broker.name}: {op} {n:,} queues: {m[key]:.3f} s")
        for op, _ in phases:
            _ratio_metrics(m, sizes, f"{op} time", f"topology_{op}_s", False)
        result.update(metrics=m, bulk=raw, wall_s=time.monotonic() - t0)
        return result
    finally:
        ps.close(args.keep_tmp)
        if broker.alive() and not timed_out:
            try:
                run_setup(broker.port, "--delete", "--exchange", exchange, timeout=60)
            except (RunError, subprocess.TimeoutExpired) as e:
                log(f"{broker.name}: cleanup failed: {e}")


def wait_consumer_ready(handle, ready: str) -> None:
    """Wait (20 s at most) until a loadgen consumer has written its ready file."""
    deadline = time.monotonic() + 20
    while not os.path.exists(ready):
        if handle[0].poll() is not None or time.monotonic() > deadline:
            handle[2].seek(0)
            raise RunError(f"consumer did not start: {handle[2].read().strip()}")
        time.sleep(0.02)


def publish_phase(ps: ProcSet, broker: Broker, args, name: str, popts: list,
                  consume_queue: str | None) -> tuple[dict, dict | None]:
    """Publish for --seconds with confirms (window 1000); with consume_queue, an
    auto-ack consumer on it checks that every message arrives exactly once."""
    est = args.seconds
    cons_deadline = est * 3 + 30
    handle = None
    if consume_queue:
        ready = os.path.join(ps.workdir, f"{name}.ready")
        handle = ps.start(f"{name}-cons", broker.port, "consume", "--queue", consume_queue,
                          "--auto-ack", "--seconds", f"{cons_deadline:.0f}",
                          "--idle-timeout", max(args.idle_timeout, 60.0),
                          "--ready-file", ready)
        wait_consumer_ready(handle, ready)
    pub, _ = ps.finish(ps.start(name, broker.port, "publish", "--seconds", est,
                                "--confirm", "--window", 1000, "--confirm-timeout", 60,
                                *popts),
                       est * 3 + 120, f"{broker.name}: {name}", ok_codes=(0, 3), broker=broker)
    cons = None
    if handle:
        cons, _ = ps.finish(handle, cons_deadline + 15, f"{broker.name}: {name} consumer")
    return pub, cons


def confirmed_rate(pub: dict) -> float:
    """Confirmed messages per second, up to the last confirm."""
    return pub.get("acked", 0) / pub["elapsed_s"] if pub["elapsed_s"] else 0.0


class Integrity:
    """Sums the exactly-once checks of the publish phases of one scenario run."""

    def __init__(self):
        self.d = {"missing": 0, "duplicates": 0, "nacked": 0, "unconfirmed": 0,
                  "marker_missing": 0, "stop_reasons": [], "redelivered": 0,
                  "unexpected": 0, "offset_errors": 0}
        self.any = False

    def add(self, pub: dict | None, cons: dict | None) -> None:
        """A publisher's and/or a consumer's checks (either may be None)."""
        self.any = True
        if pub:
            self.d["nacked"] += pub.get("nacked", 0)
            self.d["unconfirmed"] += pub.get("unconfirmed", 0)
        if cons:
            for k in ("missing", "duplicates", "redelivered", "unexpected"):
                self.d[k] += cons.get(k, 0)
            # --check-offsets: a wrong or missing x-stream-offset header
            self.d["offset_errors"] += cons.get("offset_errors", 0) + cons.get("no_offset", 0)
            self.d["marker_missing"] += 0 if cons["marker_seen"] else 1
            if cons["stop_reason"] not in self.d["stop_reasons"]:
                self.d["stop_reasons"].append(cons["stop_reason"])

    def misrouted(self, n: int) -> None:
        """n messages arrived where none should have: counted as duplicates."""
        self.d["duplicates"] += n


def queue_depth(broker: Broker, queue: str) -> int:
    r = subprocess.run(loadgen(broker.port, "count", "--queue", queue),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RunError(f"count {queue} failed: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])["message_count"]


def run_exchange_scaling(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    """Scenarios 9 (topic) and 10 (headers): for each binding count, bind them all
    (to one queue), then publish with confirms."""
    topic = sc.kind == "topic"
    sizes = args.topic_bindings if topic else args.headers_bindings
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no}
    m: dict = {}
    pubs: dict = {}
    integ = Integrity()
    timed_out = False
    t0 = time.monotonic()
    if topic:
        phases = [("match1", "new key per message, 1 match"),
                  ("nomatch", "new key per message, no match"),
                  ("repeated", "same key every time, 1 match")]
    else:
        phases = [("match1", "new headers per message, 1 match")]
    current: tuple[str, str] | None = None
    try:
        for n in sizes:
            nl = fmt_count(n)
            bind_key = f"{sc.kind}_bind_s_{n}"
            bind_label = f"set up {nl} {'topic' if topic else 'headers'} bindings: s"
            keys = [(f"{sc.kind}_{ph}_rate_{n}", f"{nl} bindings, {lab}: confirmed publish msg/s")
                    for ph, lab in phases]
            if timed_out:
                _metric(m, bind_key, SKIPPED, bind_label, False)
                for k, lab in keys:
                    _metric(m, k, SKIPPED, lab, True)
                continue
            exchange, queue = f"{tag}.x{n}", f"{tag}.x{n}.q"
            current = (exchange, queue)
            run_setup(broker.port, "--exchange", exchange, "--exchange-type",
                      "topic" if topic else "headers", "--queue", queue)
            if topic:
                # three shapes of pattern, n/3 of each; binding i uses shape i % 3
                # with index i // 3, so a.b{k}.* exists for k < per_shape
                bopts = ["--key-template", "a.b{seq}.*", "--key-template", "a.#.u{seq}",
                         "--key-template", "*.c{seq}.#"]
            else:
                g = math.gcd(n, 100)  # 100 unless n is not a multiple of 100
                bopts = ["--bind-arg", "x-match=all", "--bind-arg", f"h1=v{{seq%{g}}}",
                         "--bind-arg", "h2=id{seq}"]
            try:
                res = run_bulk(ps, broker, args, f"bind-{n}", "--ops", "bind", "--queue",
                               queue, "--exchange", exchange, "--count", n, *bopts)
                _metric(m, bind_key, res["phases"][0]["elapsed_s"], bind_label, False)
                log(f"{broker.name}: {n:,} bindings set up in {m[bind_key]:.3f} s")
            except PhaseTimeout:
                timed_out = True
                _metric(m, bind_key, TIMEOUT, bind_label, False)
                for k, lab in keys:
                    _metric(m, k, SKIPPED, lab, True)
                reset_broker(broker, f"setting up {n:,} bindings took over "
                                     f"{args.scaling_timeout:.0f} s")
                current = None
                continue
            per_shape = (n + 2) // 3
            for (ph, _), (k, lab) in zip(phases, keys):
                popts: list = ["--exchange", exchange]
                cq: str | None = queue
                if not topic:
                    # binding j has h1=v{j%g}, h2=id{j}; message seq carries
                    # h1=v{seq%g}, h2=id{seq%n} (and an extra msg-id): it matches
                    # binding seq % n and no other, since g divides n
                    g = math.gcd(n, 100)
                    popts += ["--header", f"h1=v{{seq%{g}}}", "--header", f"h2=id{{seq%{n}}}",
                              "--header", "msg-id={seq}"]
                elif ph == "match1":
                    # a.b{k}.* matches; u-ids from 10^7 up match no a.#.u{i}
                    popts += ["--key-template", f"a.b{{seq%{per_shape}}}.u{{seq+10000000}}"]
                elif ph == "nomatch":
                    popts += ["--key-template", "a.b{seq+10000000}.u{seq+10000000}",
                              "--no-marker"]
                    cq = None
                else:
                    # the issue's example key; a.#.u123456 exists only past 370k bindings
                    uid = 123456 if per_shape <= 123456 else 10_000_017
                    popts += ["--routing-key", f"a.b{min(17, per_shape - 1)}.u{uid}"]
                log(f"{broker.name}: {n:,} bindings, {ph}: publishing for {args.seconds:g} s")
                pub, cons = publish_phase(ps, broker, args, f"{ph}-{n}", popts, cq)
                integ.add(pub, cons)
                if cq is None:
                    stray = queue_depth(broker, queue)
                    if stray:
                        log(f"{broker.name}: {stray} messages routed that match no binding")
                        integ.misrouted(stray)
                pubs[k] = {"pub": pub, "cons": cons}
                _metric(m, k, confirmed_rate(pub), lab, True)
                log(f"{broker.name}: {ph}: {m[k]:,.0f} msg/s confirmed"
                    + (f", {cons['received']:,} delivered" if cons else ""))
            cleanup_exchange(broker, exchange, queue, args)
            current = None
        if len(sizes) > 1:
            _ratio_metrics(m, sizes, "binding set-up time", f"{sc.kind}_bind_s", False)
            for ph, lab in phases:
                _ratio_metrics(m, sizes, f"{lab}: rate", f"{sc.kind}_{ph}_rate", True)
        result.update(metrics=m, runs=pubs, wall_s=time.monotonic() - t0)
        if integ.any:
            result["integrity"] = integ.d
        return result
    finally:
        ps.close(args.keep_tmp)
        if current and broker.alive():
            cleanup_exchange(broker, *current, args)


def cleanup_exchange(broker: Broker, exchange: str, queue: str, args) -> None:
    """Delete the queue and exchange with all their bindings; restart the broker if
    that is not done within --scaling-timeout."""
    try:
        run_setup(broker.port, "--delete", "--queue", queue, "--exchange", exchange,
                  timeout=args.scaling_timeout)
    except (RunError, subprocess.TimeoutExpired) as e:
        log(f"{broker.name}: cleanup failed: {e}")
        reset_broker(broker, "cleanup did not finish")


def body_flow(size: int) -> tuple[int, int, int]:
    """(confirm window, prefetch, ack every) for a body size: about 64 MiB
    unconfirmed and 32 MiB unacked at most, and scenario 2's 1000/200/50 for
    small bodies."""
    window = max(2, min(1000, (64 << 20) // size))
    prefetch = max(2, min(200, (32 << 20) // size))
    return window, prefetch, max(1, prefetch // 4)


def run_bodies(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    sampler = RSSSampler(broker, args.rss_interval).start()
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no}
    m: dict = {}
    runs: dict = {}
    integ = Integrity()
    t0 = time.monotonic()
    queue = None
    try:
        for size in args.body_sizes:
            for persistent in (False, True):
                mode = "persistent" if persistent else "transient"
                name = f"{fmt_bytes(size).replace(' ', '')}-{mode}"
                queue = f"{tag}.{name}"
                window, prefetch, ack_every = body_flow(size)
                run_setup(broker.port, "--queue", queue,
                          *(["--durable"] if persistent else []))
                ready = os.path.join(ps.workdir, f"{name}.ready")
                cons_deadline = args.seconds * 3 + 60
                ch = ps.start(f"{name}-cons", broker.port, "consume", "--queue", queue,
                              "--prefetch", prefetch, "--ack-every", ack_every,
                              "--seconds", f"{cons_deadline:.0f}",
                              "--idle-timeout", max(args.idle_timeout, 60.0),
                              "--ready-file", ready)
                wait_consumer_ready(ch, ready)
                sampler.set_phase(name)
                log(f"{broker.name}: {fmt_bytes(size)} {mode}: publishing for "
                    f"{args.seconds:g} s (window {window}, prefetch {prefetch})")
                popts = ["--routing-key", queue, "--size", size, "--seconds", args.seconds,
                         "--confirm", "--window", window, "--confirm-timeout", 120]
                if persistent:
                    popts.append("--persistent")
                pub, _ = ps.finish(ps.start(f"{name}-pub", broker.port, "publish", *popts),
                                   args.seconds * 3 + 180, f"{broker.name}: {name} publisher",
                                   ok_codes=(0, 3), broker=broker)
                cons, _ = ps.finish(ch, cons_deadline + 15, f"{broker.name}: {name} consumer")
                sampler.set_phase(None)
                integ.add(pub, cons)
                label = f"{fmt_bytes(size)} {mode}"
                span = cons["span_s"]
                _metric(m, f"consume_mbs_{name}", cons["bytes"] / span / 1e6 if span else None,
                        f"{label}: consume MB/s", True)
                _metric(m, f"publish_mbs_{name}",
                        confirmed_rate(pub) * size / 1e6, f"{label}: confirmed publish MB/s",
                        True)
                _metric(m, f"rss_mb_{name}", sampler.peak_mb(name),
                        f"{label}: broker peak RSS MB", False)
                runs[name] = {"pub": pub, "cons": cons}
                log(f"{broker.name}: {label}: consume {m[f'consume_mbs_{name}'] or 0:,.0f} MB/s, "
                    f"peak RSS {m[f'rss_mb_{name}'] or 0:,.0f} MB")
                cleanup_queue(broker, queue)
                queue = None
        result.update(metrics=m, runs=runs, integrity=integ.d, rss=sampler.as_dict(),
                      wall_s=time.monotonic() - t0)
        return result
    finally:
        sampler.stop()
        ps.close(args.keep_tmp)
        if queue:
            cleanup_queue(broker, queue)


# --------------------------------------------------------------------------
# stream queues (12)
#
# On each broker: N × 1 KiB persistent messages with confirms into a durable classic
# queue, drained by one consumer; the same into a stream (x-queue-type=stream), read by
# one consumer from `first`; then 10 consumers at once on the same stream, consumer i
# from the numeric offset i·N/10. Every consumer checks that it got exactly the
# messages it should: the stream was empty, so message seq is at offset seq and the
# end marker at offset N; a consumer from offset K expects K..N-1 and the marker
# (loadgen consume --expect-from K), and every delivery's x-stream-offset header must
# equal its sequence number (--check-offsets).

STREAM_READERS = 10


def start_reader(ps: ProcSet, broker: Broker, sc: Scenario, queue: str, deadline: float,
                 args, name: str, *extra):
    """Start a consumer as backlog_drain's (prefetch, ack every, bounds) with extra
    options; returns its ProcSet handle."""
    copts = ["--queue", queue, "--prefetch", sc.prefetch, "--ack-every", sc.ack_every,
             "--seconds", f"{deadline:.0f}", "--idle-timeout", max(args.idle_timeout, 60.0),
             "--grace", 2, *extra]
    return ps.start(name, broker.port, "consume", *copts)


def _span_rate(cons: list[dict]) -> float | None:
    """Deliveries of several consumers together, divided by the time from the first
    delivery of any to the last delivery of any."""
    firsts = [c["t_first_ns"] for c in cons if c.get("t_first_ns")]
    lasts = [c["t_last_ns"] for c in cons if c.get("t_last_ns")]
    if not firsts or not lasts or max(lasts) <= min(firsts):
        return None
    return sum(c["received"] for c in cons) / ((max(lasts) - min(firsts)) / 1e9)


def _div(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def run_streams(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    n = backlog_count(args)
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    classic, stream = f"{tag}.classic", f"{tag}.stream"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=broker.tmp))
    sampler = RSSSampler(broker, args.rss_interval).start()
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no, "count": n}
    integ = Integrity()
    cpu: dict[str, float] = {}
    lg_cpu = 0.0
    queues = [classic]
    t0 = time.monotonic()
    try:
        # a. durable classic queue: publish with nobody consuming, then drain
        run_setup(broker.port, "--queue", classic, "--durable")
        sampler.set_phase("classic-publish")
        log(f"{broker.name}: classic queue: publishing {n:,} messages")
        cpub, c1, cpu["classic_publish"] = backlog_publish(ps, broker, sc, classic, n,
                                                           "classic-pub")
        sampler.set_phase("classic-drain")
        log(f"{broker.name}: classic queue: published at {cpub['rate']:,.0f} msg/s; draining")
        ccons, c2, cpu["classic_drain"] = backlog_drain(ps, broker, sc, classic, n, args,
                                                        "classic-cons")
        sampler.set_phase(None)
        lg_cpu += c1 + c2
        integ.add(cpub, ccons)
        log(f"{broker.name}: classic queue: drained at {ccons['rate']:,.0f} msg/s")
        cleanup_queue(broker, classic)
        queues = [stream]

        # Offsets equal sequence numbers only where a stream's offsets have no gaps: RabbitMQ
        # spends one offset on a tracking chunk at every segment roll (osiris), so there the
        # consumers are checked for exactly-once delivery only, not for offsets and ranges.
        exact = ["--check-offsets"] if broker.name == "warren" else []

        # b. stream: publish, then one consumer from first to the end
        run_setup(broker.port, "--queue", stream, "--durable", "--queue-type", "stream")
        sampler.set_phase("stream-publish")
        log(f"{broker.name}: stream: publishing {n:,} messages")
        spub, c1, cpu["stream_publish"] = backlog_publish(ps, broker, sc, stream, n,
                                                          "stream-pub")
        sampler.set_phase("stream-read")
        log(f"{broker.name}: stream: published at {spub['rate']:,.0f} msg/s; "
            f"reading from first")
        deadline = 120 + n / 1000.0
        cpu0 = group_cpu_seconds(broker.pid)
        h = start_reader(ps, broker, sc, stream, deadline, args, "stream-read",
                         "--stream-offset", "first", *exact)
        scons, c2 = ps.finish(h, deadline + 30, f"{broker.name}: stream consumer")
        cpu["stream_read"] = group_cpu_seconds(broker.pid) - cpu0
        sampler.set_phase(None)
        lg_cpu += c1 + c2
        integ.add(spub, scons)
        log(f"{broker.name}: stream: 1 consumer read at {scons['rate']:,.0f} msg/s "
            f"(peak RSS {sampler.peak_mb('stream-read') or 0:.0f} MB)")

        # c. 10 consumers at once, consumer i from offset i·N/10 to the end
        starts = [i * n // STREAM_READERS for i in range(STREAM_READERS)]
        total = sum(n - k for k in starts)
        deadline = 120 + total / 1000.0
        log(f"{broker.name}: stream: {STREAM_READERS} consumers from offsets "
            f"{', '.join(f'{k:,}' for k in starts)} ({total:,} deliveries)")
        sampler.set_phase("stream-read10")
        cpu0 = group_cpu_seconds(broker.pid)
        t_c = time.monotonic()
        handles = [start_reader(ps, broker, sc, stream, deadline, args, f"stream-read10-{i}",
                                "--stream-offset", k, *(["--expect-from", k, *exact] if exact else []))
                   for i, k in enumerate(starts)]
        cons10 = []
        for i, h in enumerate(handles):
            remaining = max(1.0, deadline + 30 - (time.monotonic() - t_c))
            c, c3 = ps.finish(h, remaining, f"{broker.name}: stream consumer {i}")
            lg_cpu += c3
            cons10.append(c)
            integ.add(None, c)
        cpu["stream_read10"] = group_cpu_seconds(broker.pid) - cpu0
        sampler.set_phase(None)
        rate10 = _span_rate(cons10)
        log(f"{broker.name}: stream: {STREAM_READERS} consumers read {rate10 or 0:,.0f} msg/s "
            f"together (peak RSS {sampler.peak_mb('stream-read10') or 0:.0f} MB)")

        rss1, rss10 = sampler.peak_mb("stream-read"), sampler.peak_mb("stream-read10")
        m = {
            "s12_classic_publish_rate": cpub["rate"],
            "s12_classic_drain_rate": ccons["rate"],
            "s12_stream_publish_rate": spub["rate"],
            "s12_stream_read_rate": scons["rate"],
            "s12_stream_read10_rate": rate10,
            "s12_publish_stream_classic": _div(spub["rate"], cpub["rate"]),
            "s12_read_stream_classic": _div(scons["rate"], ccons["rate"]),
            "s12_rss_read_mb": rss1,
            "s12_rss_read10_mb": rss10,
            "s12_rss_read10_read": _div(rss10, rss1),
        }
        result.update(pub=[cpub, spub], cons=[ccons, scons, *cons10], metrics=m,
                      integrity=integ.d, rss=sampler.as_dict(), broker_cpu_phases_s=cpu,
                      wall_s=time.monotonic() - t0, broker_cpu_s=sum(cpu.values()),
                      loadgen_cpu_s=lg_cpu)
        return result
    finally:
        sampler.stop()
        ps.close(args.keep_tmp)
        for q in queues:  # queue.delete works on streams too
            cleanup_queue(broker, q)


# --------------------------------------------------------------------------
# links between two brokers (13): a dynamic shovel (a) and an exchange federation link (b)
#
# Broker A is the one under test in the main loop; B, its peer, is a second broker of the
# same kind, started on first use and kept for the rest of the invocation (PEERS). Links
# are created through each broker's management API (Warren: on its control socket; RabbitMQ:
# the management plugin, which run.py enables with the shovel and federation plugins when
# a scenario of 13 is selected). A loadgen `count` on B polls the destination queue's
# depth every 10 ms; the time is from creating the shovel (a) or from starting the
# publisher (b) until the queue holds every message and the end marker. Then B's queue is
# drained by a checking consumer, as in 6.

LINK_PLUGINS = ("rabbitmq_management", "rabbitmq_shovel", "rabbitmq_shovel_management",
                "rabbitmq_federation", "rabbitmq_federation_management")
PEERS: dict[str, Broker] = {}  # broker name -> its peer B
FED_EXCHANGE = "fed.x"


def peer_of(broker: Broker, args) -> Broker:
    """Broker B for `broker` (A): started on first use, restarted if it died."""
    peer = PEERS.get(broker.name)
    if peer is not None and peer.alive():
        return peer
    if peer is not None:
        log(f"{broker.name} B: died; last log lines:\n{peer.log_tail()}restarting it")
        peer.stop()
        peer.cleanup_tmp()
    if isinstance(broker, RabbitMQ):
        node, _, host = args.rabbitmq_nodename.partition("@")
        peer = RabbitMQ(args, nodename=f"{node}-b@{host or 'localhost'}", plugins=LINK_PLUGINS)
    else:
        peer = Warren(args)
    peer.name = f"{broker.name} B"
    PEERS[broker.name] = peer
    try:
        peer.start()
    except BrokerError as e:
        peer.stop()
        peer.cleanup_tmp()
        del PEERS[broker.name]
        raise RunError(f"the second broker did not start: {e}") from e
    return peer


def stop_peers() -> None:
    for peer in PEERS.values():
        try:
            peer.stop()
        except Exception as e:  # never leave a broker behind
            log(f"{peer.name}: stop failed: {e}")
        peer.cleanup_tmp()
    PEERS.clear()


def amqp_uri(broker: Broker) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}/%2f"


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def finish_depth(ps: ProcSet, h, brokers: list[Broker], what: str) -> dict:
    """Wait for a started loadgen `count` (it bounds itself with --seconds), watching that
    no broker dies meanwhile; returns its JSON."""
    p = h[0]
    while p.poll() is None:
        for b in brokers:
            if not b.alive():
                kill_tree(p)
                raise RunError(f"{b.name} exited during {what}; last log lines:\n{b.log_tail()}")
        time.sleep(0.02)
    info, _ = ps.finish(h, 5, what, ok_codes=(0, 1))
    return info


def link_move(ps: ProcSet, a: Broker, b: Broker, queue: str, n: int, start, what: str,
              status=None) -> tuple[float, float, float]:
    """Poll B's queue until it holds n messages and the end marker, after calling
    start() (which creates the link or publishes). Returns (seconds from the call to
    start() until then, A's and B's CPU seconds meanwhile). On a timeout, status()
    (the link's state on the broker that runs it) goes into the error."""
    timeout = 120 + n / 1000.0
    h = ps.start(f"{what}-count", b.port, "count", "--queue", queue, "--count", n + 1,
                 "--seconds", f"{timeout:.0f}", "--connect-timeout", 2)
    cpu_a, cpu_b = group_cpu_seconds(a.pid), group_cpu_seconds(b.pid)
    t0 = time.monotonic_ns()
    start()
    info = finish_depth(ps, h, [a, b], what)
    cpu_a, cpu_b = group_cpu_seconds(a.pid) - cpu_a, group_cpu_seconds(b.pid) - cpu_b
    if not info["reached"]:
        state = ""
        if status is not None:
            try:
                state = f"; link status: {json.dumps(status())[:500]}"
            except RunError as e:
                state = f"; link status unknown: {e}"
        raise RunError(f"{what}: B's queue had {info['message_count']:,} of {n + 1:,} "
                       f"messages after {timeout:.0f} s{state}")
    return (info["t_done_ns"] - t0) / 1e9, cpu_a, cpu_b


def check_drain(ps: ProcSet, broker: Broker, sc: Scenario, queue: str, n: int, args,
                name: str, pub: dict, integ: Integrity) -> dict:
    """Drain the destination queue with a checking consumer (every message exactly once)."""
    cons, _, _ = backlog_drain(ps, broker, sc, queue, n, args, name)
    integ.add(pub, cons)
    log(f"{broker.name}: {name}: {cons['received']:,} delivered, missing {cons['missing']}, "
        f"duplicates {cons['duplicates']}")
    return cons


def run_shovel(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    n = backlog_count(args, sc.kind)
    a = broker
    b = peer_of(broker, args)
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    queue = f"{tag}.q"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=a.tmp))
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no, "count": n}
    integ = Integrity()
    m: dict = {}
    raw: dict = {}
    shovels: list[tuple[Broker, str]] = []  # created and not yet deleted
    t0 = time.monotonic()
    try:
        for x in (a, b):
            run_setup(x.port, "--queue", queue, "--durable")
        # push: the shovel runs on A (source local, destination B); pull: it runs on B
        for variant, host, src, dest in (("push", a, "amqp://", amqp_uri(b)),
                                         ("pull", b, amqp_uri(a), "amqp://")):
            log(f"{a.name}: {variant}: publishing {n:,} messages to A")
            pub, _, _ = backlog_publish(ps, a, sc, queue, n, f"{variant}-pub")
            name = f"{tag}.{variant}"
            value = {"src-protocol": "amqp091", "src-uri": src, "src-queue": queue,
                     "dest-protocol": "amqp091", "dest-uri": dest, "dest-queue": queue,
                     "ack-mode": "on-confirm"}
            path = f"/parameters/shovel/%2F/{_q(name)}"

            def create(host=host, path=path, name=name, value=value):
                host.api("PUT", path, {"component": "shovel", "vhost": "/", "name": name,
                                       "value": value})
                shovels.append((host, path))

            def status(host=host):
                return host.api("GET", "/shovels/%2F")

            log(f"{a.name}: {variant}: shovel on {'A' if host is a else 'B'} moving them to B")
            secs, cpu_a, cpu_b = link_move(ps, a, b, queue, n, create, f"{variant}", status)
            host.api("DELETE", path)
            shovels.remove((host, path))
            rate = n / secs
            log(f"{a.name}: {variant}: {n:,} messages in {secs:.2f} s ({rate:,.0f} msg/s), "
                f"CPU A {cpu_a:.1f} s, B {cpu_b:.1f} s")
            cons = check_drain(ps, b, sc, queue, n, args, f"{variant}-cons", pub, integ)
            left = queue_depth(a, queue)
            if left:
                log(f"{a.name}: {variant}: {left} messages left on A after the move")
                integ.misrouted(left)
            raw[variant] = {"pub": pub, "cons": cons, "seconds": secs,
                            "broker_cpu_s": {"A": cpu_a, "B": cpu_b}}
            m[f"s13_{variant}_rate"] = rate
            m[f"s13_{variant}_cpu_a_s"] = cpu_a
            m[f"s13_{variant}_cpu_b_s"] = cpu_b
        result.update(metrics=m, moves=raw, integrity=integ.d, wall_s=time.monotonic() - t0,
                      broker_cpu_s=sum(v["broker_cpu_s"]["A"] + v["broker_cpu_s"]["B"]
                                       for v in raw.values()))
        return result
    finally:
        ps.close(args.keep_tmp)
        for host, path in shovels:
            try:
                if host.alive():
                    host.api("DELETE", path)
            except RunError as e:
                log(f"{host.name}: cleanup failed: {e}")
        for x in (a, b):
            cleanup_queue(x, queue)


def run_federation(sc: Scenario, broker: Broker, args, run_no: int) -> dict:
    n = backlog_count(args, sc.kind)
    a = broker
    b = peer_of(broker, args)
    tag = f"bench.s{sc.key}.{os.getpid()}.{run_no}"
    queue = f"{tag}.q"  # on B, bound to fed.x with its name as the key
    upstream, policy = f"{tag}.upstream", f"{tag}.policy"
    ps = ProcSet(tempfile.mkdtemp(prefix=f"bench-s{sc.key}-", dir=a.tmp))
    result: dict = {"scenario": sc.key, "broker": broker.name, "run": run_no, "count": n}
    integ = Integrity()
    made: list[str] = []  # API paths on B to delete afterwards
    t0 = time.monotonic()
    try:
        run_setup(a.port, "--exchange", FED_EXCHANGE, "--exchange-type", "direct", "--durable")
        run_setup(b.port, "--exchange", FED_EXCHANGE, "--exchange-type", "direct", "--durable",
                  "--queue", queue, "--bind")
        path = f"/parameters/federation-upstream/%2F/{_q(upstream)}"
        b.api("PUT", path, {"component": "federation-upstream", "vhost": "/", "name": upstream,
                            "value": {"uri": amqp_uri(a)}})
        made.append(path)
        path = f"/policies/%2F/{_q(policy)}"
        b.api("PUT", path, {"pattern": "^" + FED_EXCHANGE.replace(".", "\\.") + "$",
                            "apply-to": "exchanges",
                            "definition": {"federation-upstream": upstream}})
        made.append(path)
        # The link must be running, and the binding on B known upstream, before the
        # timed publish: wait for the status, then for one probe message to arrive.
        deadline = time.monotonic() + 60
        links: list = []
        while not any(link.get("exchange") == FED_EXCHANGE and link.get("status") == "running"
                      for link in links):
            if time.monotonic() > deadline:
                raise RunError(f"the federation link did not run within 60 s: "
                               f"{json.dumps(links)[:500]}")
            time.sleep(0.2)
            links = b.api("GET", "/federation-links/%2F") or []
        probe = ps.start("probe", a.port, "publish", "--exchange", FED_EXCHANGE,
                         "--routing-key", queue, "--size", sc.size, "--count", 1,
                         "--no-marker", "--confirm", "--persistent")
        ps.finish(probe, 60, f"{a.name}: probe publisher")
        info = finish_depth(ps, ps.start("probe-count", b.port, "count", "--queue", queue,
                                         "--count", 1, "--seconds", 60),
                            [a, b], "the probe")
        if not info["reached"]:
            raise RunError("a probe message published on A did not reach B's queue in 60 s")
        run_setup(b.port, "--queue", queue, "--durable", "--purge")

        log(f"{a.name}: federation: publishing {n:,} messages to {FED_EXCHANGE} on A")
        pubs: list[dict] = []

        def publish():
            pubs.append(backlog_publish(ps, a, sc, queue, n, "pub", exchange=FED_EXCHANGE)[0])

        secs, cpu_a, cpu_b = link_move(ps, a, b, queue, n, publish, "federation",
                                       lambda: b.api("GET", "/federation-links/%2F"))
        pub = pubs[0]
        rate = n / secs
        log(f"{a.name}: federation: published on A at {pub['rate']:,.0f} msg/s; all on B "
            f"after {secs:.2f} s ({rate:,.0f} msg/s), CPU A {cpu_a:.1f} s, B {cpu_b:.1f} s")
        cons = check_drain(ps, b, sc, queue, n, args, "cons", pub, integ)
        m = {"s13_fed_rate": rate, "s13_fed_publish_rate": pub["rate"],
             "s13_fed_cpu_a_s": cpu_a, "s13_fed_cpu_b_s": cpu_b}
        result.update(metrics=m, pub=pub, cons=[cons], seconds=secs,
                      broker_cpu_s=cpu_a + cpu_b, integrity=integ.d,
                      wall_s=time.monotonic() - t0)
        return result
    finally:
        ps.close(args.keep_tmp)
        for path in reversed(made):
            try:
                if b.alive():
                    b.api("DELETE", path)
            except RunError as e:
                log(f"{b.name}: cleanup failed: {e}")
        for x, opts in ((a, ()), (b, ("--queue", queue))):
            try:
                if x.alive():
                    run_setup(x.port, "--delete", "--exchange", FED_EXCHANGE, *opts, timeout=60)
            except (RunError, subprocess.TimeoutExpired) as e:
                log(f"{x.name}: cleanup failed: {e}")


RUNNERS = {"flow": run_scenario, "backlog": run_backlog, "recovery": run_recovery,
           "topology": run_topology, "topic": run_exchange_scaling,
           "headers": run_exchange_scaling, "bodies": run_bodies, "streams": run_streams,
           "shovel": run_shovel, "federation": run_federation}


# metric name, unit, higher-is-better
METRICS = {
    "publish_rate": ("publish msg/s", True),
    "consume_rate": ("consume msg/s", True),
    "consume_rate_total": ("consume msg/s, all queues together", True),
    "broker_cpu_us_per_msg": ("broker CPU µs per message delivered", False),
    "e2e_p50_us": ("end-to-end p50 µs", False),
    "e2e_p99_us": ("end-to-end p99 µs", False),
    "confirm_p50_us": ("confirm p50 µs", False),
    "confirm_p99_us": ("confirm p99 µs", False),
    "achieved_rate": ("achieved publish msg/s", True),
    # backlog / recovery
    "drain_rate": ("drain msg/s", True),
    "rss_publish_mb": ("broker peak RSS MB while publishing", False),
    "rss_drain_mb": ("broker peak RSS MB while draining", False),
    "broker_cpu_us_per_msg_published": ("broker CPU µs per message published", False),
    "broker_cpu_us_per_msg_drained": ("broker CPU µs per message drained", False),
    "restart_empty_s": ("restart with the queue empty: s until it answers (baseline)", False),
    "stop_term_s": ("SIGTERM: s until the broker has exited", False),
    "restart_term_s": ("restart after SIGTERM: s until every message is back", False),
    "restart_kill_s": ("restart after SIGKILL: s until every message is back", False),
    "rss_recovery_mb": ("broker peak RSS MB during the restarts", False),
    # streams (12)
    "s12_classic_publish_rate": ("a. classic queue: confirmed publish msg/s", True),
    "s12_classic_drain_rate": ("a. classic queue: drain msg/s, 1 consumer", True),
    "s12_stream_publish_rate": ("b. stream: confirmed publish msg/s", True),
    "s12_stream_read_rate": ("b. stream: read msg/s, 1 consumer from first", True),
    "s12_stream_read10_rate": ("c. stream: read msg/s, 10 consumers from offsets i·N/10, "
                               "together", True),
    "s12_publish_stream_classic": ("publish msg/s, stream / classic", True),
    "s12_read_stream_classic": ("read msg/s, stream (1 consumer) / classic drain", True),
    "s12_rss_read_mb": ("b. broker peak RSS MB, 1 stream consumer", False),
    "s12_rss_read10_mb": ("c. broker peak RSS MB, 10 stream consumers", False),
    "s12_rss_read10_read": ("peak RSS, 10 stream consumers / 1", False),
    # links (13)
    "s13_push_rate": ("shovel on A (pushing to B): msg/s until B holds them all", True),
    "s13_push_cpu_a_s": ("shovel on A: CPU s of A", False),
    "s13_push_cpu_b_s": ("shovel on A: CPU s of B", False),
    "s13_pull_rate": ("shovel on B (pulling from A): msg/s until B holds them all", True),
    "s13_pull_cpu_a_s": ("shovel on B: CPU s of A", False),
    "s13_pull_cpu_b_s": ("shovel on B: CPU s of B", False),
    "s13_fed_rate": ("msg/s from the first publish on A until B holds them all", True),
    "s13_fed_publish_rate": ("confirmed publish msg/s on A", True),
    "s13_fed_cpu_a_s": ("CPU s of A (upstream)", False),
    "s13_fed_cpu_b_s": ("CPU s of B (downstream, runs the link)", False),
}


def extract_metrics(sc: Scenario, pub: dict, cons: list[dict], broker_cpu: float) -> dict:
    m: dict[str, float] = {}
    delivered = sum(c["received"] for c in cons)
    if sc.latency:
        lat = cons[0].get("latency") or {}
        conf = pub.get("confirm_latency") or {}
        m["e2e_p50_us"] = lat.get("p50_us")
        m["e2e_p99_us"] = lat.get("p99_us")
        m["confirm_p50_us"] = conf.get("p50_us")
        m["confirm_p99_us"] = conf.get("p99_us")
        m["achieved_rate"] = pub["rate"]
        return m
    m["publish_rate"] = pub["rate"]
    if len(cons) > 1:
        m["consume_rate_total"] = sum(c["rate"] for c in cons)
    else:
        m["consume_rate"] = cons[0]["rate"]
    if delivered:
        m["broker_cpu_us_per_msg"] = broker_cpu / delivered * 1e6
    return m


# --------------------------------------------------------------------------
# reporting


def fmt_num(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def median_metric(results: list[dict], key: str):
    vals = [r["metrics"][key] for r in results
            if "metrics" in r and r["metrics"].get(key) is not None]
    nums = [v for v in vals if not isinstance(v, str)]
    if nums:
        return statistics.median(nums)
    return vals[0] if vals else None  # e.g. "timeout"


def integrity_text(results: list[dict]) -> str:
    ok = [r for r in results if "integrity" in r]
    failed = [r for r in results if "error" in r]
    if not ok and failed:
        return "FAILED"
    if not ok:
        return "n/a"
    miss = sum(r["integrity"]["missing"] for r in ok)
    dup = sum(r["integrity"]["duplicates"] for r in ok)
    extra = []
    nack = sum(r["integrity"]["nacked"] + r["integrity"]["unconfirmed"] for r in ok)
    if nack:
        extra.append(f"{nack} nack/unconfirmed")
    redelivered = sum(r["integrity"].get("redelivered", 0) for r in ok)
    if redelivered:
        extra.append(f"{redelivered} redelivered")
    unexpected = sum(r["integrity"].get("unexpected", 0) for r in ok)
    if unexpected:
        extra.append(f"{unexpected} before the start offset")
    offset_errors = sum(r["integrity"].get("offset_errors", 0) for r in ok)
    if offset_errors:
        extra.append(f"{offset_errors} wrong/missing x-stream-offset")
    if any(r["integrity"]["marker_missing"] for r in ok):
        extra.append("end marker lost")
    reasons = {x for r in ok for x in r["integrity"]["stop_reasons"]} - {"complete", "grace"}
    if reasons:
        extra.append("consumer stopped by " + "/".join(sorted(reasons)))
    if failed:
        extra.append(f"{len(failed)} run(s) failed")
    s = f"{miss} / {dup}"
    return s + (" (" + ", ".join(extra) + ")" if extra else "")


def render_table(scenarios: list[Scenario], targets: list[str], results: list[dict],
                 args) -> str:
    names = {"warren": "Warren", "rabbitmq": "RabbitMQ"}
    cols = [names[t] for t in targets]
    both = "warren" in targets and "rabbitmq" in targets
    header = ["Scenario", "Metric"] + cols + (["Warren/RabbitMQ"] if both else [])
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|"]
    for sc in scenarios:
        per = {t: [r for r in results if r["scenario"] == sc.key and r["broker"] == t]
               for t in targets}
        keys: list[str] = []
        for t in targets:
            for r in per[t]:
                for k in r.get("metrics", {}):
                    if k not in keys:
                        keys.append(k)
        if not any(per[t] for t in targets):
            continue  # not run (interrupted)
        first = True
        for k in list(METRICS) + [k for k in keys if k not in METRICS]:
            if k not in keys:
                continue
            label, higher = METRICS.get(k) or DYN_METRICS.get(k, (k, True))
            label += " (higher is better)" if higher else " (lower is better)"
            vals = {t: median_metric(per[t], k) for t in targets}
            cells = [f"{sc.key}. {scenario_title(sc, args)}" if first else "", label]
            for t in targets:
                if vals[t] is not None:
                    cells.append(fmt_num(vals[t]))
                elif any("error" in r for r in per[t]):
                    cells.append("FAILED")
                else:
                    cells.append("n/a")
            if both:
                w, r = vals["warren"], vals["rabbitmq"]
                num = isinstance(w, (int, float)) and isinstance(r, (int, float))
                cells.append(f"{w / r:.2f}" if num and r else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
            first = False
        if sc.kind == "topology":
            continue  # no messages, nothing to check
        cells = [f"{sc.key}. {scenario_title(sc, args)}" if first else "",
                 "missing / duplicate msgs"]
        cells += [integrity_text(per[t]) for t in targets]
        if both:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Benchmark Warren against RabbitMQ (same machine, same run).")
    ap.add_argument("--target", choices=["warren", "rabbitmq", "both"], default="both")
    ap.add_argument("--scenario", action="append", default=[],
                    help="scenario(s) to run: 1-12, 13a, 13b or throughput,confirms,fanout,"
                         "latency,persistent,backlog,recovery,topology,topic,headers,"
                         "bodies,streams,shovel,federation, 'scaling' (8-11), 'links' or "
                         "13 (13a and 13b) or 'all'; comma-separated or repeated "
                         "(default: 1-7)")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="publish duration per scenario and broker (default 10)")
    ap.add_argument("--count", type=int, default=0,
                    help="publish this many messages instead of --seconds "
                         "(throughput scenarios)")
    ap.add_argument("--backlog-count", type=int, default=0,
                    help="messages in the backlog and recovery scenarios 6 and 7, "
                         "in the queue and stream of scenario 12 "
                         f"(default: --count if given, else {DEFAULT_BACKLOG:,}) and "
                         f"moved between the brokers of 13 (default {DEFAULT_LINK_BACKLOG:,})")
    ap.add_argument("--rss-interval", type=float, default=0.1,
                    help="seconds between broker RSS samples in scenarios 6, 7, 11 "
                         "and 12 (default 0.1)")
    ap.add_argument("--latency-count", type=int, default=0,
                    help="messages for the latency scenario instead of --seconds")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per scenario and broker, alternating brokers; the table "
                         "shows medians (default 1)")
    ap.add_argument("--idle-timeout", type=float, default=10.0,
                    help="consumer gives up after this long without a delivery")
    ap.add_argument("--start-timeout", type=float, default=60.0,
                    help="seconds to wait for a broker to accept connections")
    ap.add_argument("--pause", type=float, default=1.0,
                    help="settle time between runs, seconds")
    ap.add_argument("--warren-cmd", default=None,
                    help="command to start Warren; {port}, {data_dir} and {python} are "
                         "substituted (default: python -m warren server --port {port} "
                         "--data-dir {data_dir})")
    ap.add_argument("--rabbitmq-server", default=None,
                    help="rabbitmq-server script (default /usr/lib/rabbitmq/bin/rabbitmq-server)")
    ap.add_argument("--rabbitmqctl", default=None)
    ap.add_argument("--rabbitmq-nodename", default="bench@localhost")
    ap.add_argument("--json", metavar="FILE", help="also write all raw results to FILE")
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep broker data dirs and logs")
    ap.add_argument("--no-build", action="store_true", help="do not run make first")
    g = ap.add_argument_group("scaling scenarios 8-11 (--scenario scaling)")
    g.add_argument("--topology-sizes", type=parse_sizes, default=parse_sizes("1k,10k,100k"),
                   metavar="N,N", help="scenario 8: queue counts (default 1k,10k,100k)")
    g.add_argument("--topology-durable", action="store_true",
                   help="scenario 8: durable queues and exchange (default transient)")
    g.add_argument("--bulk-window", type=int, default=1000,
                   help="declare/bind/delete requests in flight in 8-10 (default 1000; "
                        "1 = one RPC at a time)")
    g.add_argument("--topic-bindings", type=parse_sizes, default=parse_sizes("10k,100k"),
                   metavar="N,N", help="scenario 9: binding counts (default 10k,100k)")
    g.add_argument("--headers-bindings", type=parse_sizes, default=parse_sizes("10k"),
                   metavar="N,N", help="scenario 10: binding counts (default 10k)")
    g.add_argument("--body-sizes", type=parse_bytes, default=parse_bytes("64k,1m,16m"),
                   metavar="S,S", help="scenario 11: body sizes (default 64k,1m,16m = KiB/MiB)")
    g.add_argument("--scaling-timeout", type=float, default=900.0,
                   help="seconds allowed for each bulk phase (declare, bind, delete, "
                        "binding set-up, clean-up) in 8-10; beyond it the phase is "
                        "reported as timeout and the broker restarted (default 900)")
    return ap.parse_args(argv)


def select_scenarios(spec: list[str]) -> list[Scenario]:
    if not spec:
        return [s for s in SCENARIOS if s.default]
    keys: list[str] = []
    for item in spec:
        for part in item.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part == "all":
                keys += [s.key for s in SCENARIOS]
                continue
            if part in SCENARIO_GROUPS:
                keys += SCENARIO_GROUPS[part]
                continue
            part = SCENARIO_ALIASES.get(part, part.lstrip("s"))
            if part not in {s.key for s in SCENARIOS}:
                raise SystemExit(f"unknown scenario {part!r}")
            keys.append(part)
    return [s for s in SCENARIOS if s.key in keys]


def _raise_interrupt(signum, frame):
    raise Interrupted(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(argv)
    scenarios = select_scenarios(args.scenario)
    targets = ["warren", "rabbitmq"] if args.target == "both" else [args.target]

    if not args.no_build:
        r = subprocess.run(["make", "-s", "-C", str(BENCH_DIR), "loadgen"],
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            log("building loadgen failed")
            return 2
    if not os.access(LOADGEN, os.X_OK):
        log(f"{LOADGEN} missing; run make -C bench")
        return 2

    # explicit, in case SIGINT was ignored by whoever started us
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    atexit.register(kill_all_children)

    brokers: dict[str, Broker] = {}
    errors: dict[str, str] = {}
    results: list[dict] = []
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]
    exit_code = 0
    try:
        # Scenario 13 creates shovels and federation links through the management API.
        plugins = LINK_PLUGINS if any(s.kind in LINK_KINDS for s in scenarios) else ()
        for t in targets:
            b = Warren(args) if t == "warren" else RabbitMQ(args, plugins=plugins)
            try:
                b.start()
                brokers[t] = b
            except (BrokerError, OSError) as e:
                log(f"{t}: failed to start: {e}")
                errors[t] = str(e).splitlines()[0]
                b.stop()
                b.cleanup_tmp()
        if not brokers:
            log("no broker could be started")
            return 1

        for sc in scenarios:
            for rep in range(args.repeat):
                order = targets if rep % 2 == 0 else list(reversed(targets))
                for t in order:
                    b = brokers.get(t)
                    if b is None:
                        continue
                    if not b.alive():
                        log(f"{t}: broker died; last log lines:\n{b.log_tail()}"
                            f"restarting {t}")
                        b.stop()
                        b.cleanup_tmp()
                        try:
                            b.start()
                        except BrokerError as e:
                            log(f"{t}: restart failed: {e}")
                            results.append({"scenario": sc.key, "broker": t, "run": rep,
                                            "error": "broker down"})
                            continue
                    log(f"{t}: scenario {sc.key} ({scenario_title(sc, args)}), run {rep + 1}/{args.repeat}")
                    try:
                        res = RUNNERS[sc.kind](sc, b, args, rep)
                        log(f"{t}: scenario {sc.key}: " + summary(res))
                    except (RunError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
                        msg = str(e)
                        log(f"{t}: scenario {sc.key} FAILED: {msg}")
                        if not b.alive():
                            msg += " (broker exited)"
                        res = {"scenario": sc.key, "broker": t, "run": rep, "error": msg}
                        exit_code = 1
                    results.append(res)
                    time.sleep(args.pause)
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"interrupted ({str(e) or 'Ctrl-C'}); stopping brokers")
        exit_code = 130
    finally:
        for b in brokers.values():
            try:
                b.stop()
            except Exception as e:  # never leave a broker behind
                log(f"{b.name}: stop failed: {e}")
            b.cleanup_tmp()
        stop_peers()
        kill_all_children()

    if exit_code == 130 and not results:
        return exit_code
    print()
    backlogs = sorted({backlog_count(args, s.kind) for s in scenarios
                       if s.kind in ("backlog", "recovery", "streams", *LINK_KINDS)})
    backlog = (f", backlog {' / '.join(f'{n:,}' for n in backlogs)} msgs" if backlogs else "")
    print(f"Warren vs RabbitMQ — {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"{'%g s' % args.seconds if not args.count else '%d msgs' % args.count} per run"
          f"{backlog}, "
          f"{args.repeat} run(s) per scenario and broker (median), "
          f"total {time.monotonic() - t_start:.0f} s, load average {load_start:.2f} before "
          f"and {os.getloadavg()[0]:.2f} after the run")
    print()
    print(render_table(scenarios, targets, results, args))
    for t, e in errors.items():
        print(f"\n{t}: not measured: {e}")
    failures = [r for r in results if "error" in r]
    for r in failures:
        print(f"\n{r['broker']} scenario {r['scenario']} run {r['run'] + 1} failed: {r['error']}")
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "errors": errors, "results": results}, f, indent=1)
    return exit_code or (1 if errors else 0)


def summary(res: dict) -> str:
    m = res["metrics"]
    parts = [f"{(METRICS.get(k) or DYN_METRICS.get(k, (k, True)))[0]}={fmt_num(v)}"
             for k, v in m.items()]
    i = res.get("integrity")
    if i:
        parts.append(f"missing={i['missing']} dup={i['duplicates']}")
        if set(i["stop_reasons"]) - {"complete"}:
            parts.append("consumer stop: " + "/".join(i["stop_reasons"]))
    parts.append(f"loadgen cpu={res.get('loadgen_cpu_s', 0):.1f}s "
                 f"broker cpu={res.get('broker_cpu_s', 0):.1f}s wall={res.get('wall_s', 0):.1f}s")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
