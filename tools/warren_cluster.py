#!/usr/bin/env python3
"""Run a command against a private three-node Warren cluster (standard library only).

    python3 tools/warren_cluster.py run -- python3 -m pytest -q tests/integration

starts three etcd members (Debian's etcd-server binary, no service) and three Warren nodes,
warren-1@localhost ..., that cluster through them, each with its own data directory and free
loopback ports for AMQP, the management API, Prometheus and its node links (the distribution
port). In front of them a round-robin TCP proxy on a free loopback port sends each new AMQP
connection to the next node, so a test's publisher, consumer and second connection land on
different nodes and its queues live on whichever node the declaring connection reached: what a
client of a cluster behind a load balancer sees.

CMD runs with, as `tools/rabbitmq_node.py run` sets them for a RabbitMQ node:

- WARREN_TEST_BROKER=127.0.0.1:PROXYPORT (the proxy),
- WARREN_TEST_MGMT=http://127.0.0.1:PORT/api and WARREN_TEST_PROMETHEUS=127.0.0.1:PORT (the
  first node's API and metrics endpoint),
- WARREN_TEST_RABBITMQCTL (warrenctl on the first node, through its control socket),

and, as `rabbitmq_node.py cluster` sets them, WARREN_TEST_CLUSTER (each node's AMQP host:port),
WARREN_TEST_CLUSTER_NODES and WARREN_TEST_CLUSTER_MGMT; and WARREN_TEST_WARREN_CLUSTER=1, with
which tests/conftest.py skips the tests marked `not_on_warren_cluster` (what a Warren cluster
refuses for now, or what needs one node's process).

Everything stops afterwards (the nodes with SIGTERM, then etcd), also on errors and Ctrl-C;
should this process be SIGKILLed, rabbitmq_node.py's watchdog kills the process groups and
removes the temporary directory. --keep-tmp keeps it: each node's log is warren-N/warren.log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR / "tools"))

from rabbitmq_node import (amqp_probe, free_ports, kill_all_children, kill_tree, port_open,  # noqa: E402
                           spawn, watchdog_send)

NODES = 3
START_TIMEOUT = 90.0  # seconds for etcd, then every node, to answer and see the others


def _log(msg: str) -> None:
    print(f"[warren-cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ClusterError(Exception):
    pass


class Node:
    def __init__(self, index: int, directory: str, ports: list[int]):
        self.name = f"warren-{index}@localhost"
        self.directory = directory
        self.amqp_port, self.mgmt_port, self.prometheus_port, self.dist_port = ports
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "warren.log")

    def tail(self, size: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - size))
                return f.read().decode(errors="replace")
        except OSError as err:
            return f"(no log: {err.strerror})"


class WarrenCluster:
    """Three etcd members and three Warren nodes in one temporary directory."""

    def __init__(self, keep_tmp: bool = False):
        self.keep_tmp = keep_tmp
        self.tmp = tempfile.mkdtemp(prefix="warren-cluster-")
        if not keep_tmp:
            watchdog_send(f"d+{self.tmp}")
        self.etcd: list[subprocess.Popen] = []
        self.etcd_clients: list[int] = []
        self.nodes: list[Node] = []

    def start(self) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise ClusterError("needs etcd on the PATH (Debian: apt-get install etcd-server)")
        ports = free_ports(2 * NODES + 4 * NODES)
        clients, peers = ports[:NODES], ports[NODES:2 * NODES]
        self.etcd_clients = clients
        initial = ",".join(f"e{i}=http://127.0.0.1:{peers[i]}" for i in range(NODES))
        for i in range(NODES):
            d = os.path.join(self.tmp, f"etcd-{i}")
            os.makedirs(d)
            client, peer = f"http://127.0.0.1:{clients[i]}", f"http://127.0.0.1:{peers[i]}"
            with open(os.path.join(d, "etcd.log"), "ab") as log:
                self.etcd.append(spawn(
                    [etcd, "--name", f"e{i}", "--data-dir", os.path.join(d, "data"),
                     "--listen-client-urls", client, "--advertise-client-urls", client,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", initial, "--initial-cluster-state", "new",
                     "--initial-cluster-token", os.path.basename(self.tmp)],
                    stdout=log, stderr=log))
        self._wait("etcd", lambda: all(_etcd_healthy(c) for c in clients))
        rest = ports[2 * NODES:]
        for i in range(NODES):
            node = Node(i + 1, os.path.join(self.tmp, f"warren-{i + 1}"), rest[4 * i:4 * i + 4])
            os.makedirs(node.directory)
            conf = os.path.join(node.directory, "rabbitmq.conf")
            with open(conf, "w") as f:
                f.write("cluster_formation.peer_discovery_backend = etcd\n")
                for j, c in enumerate(clients, 1):
                    f.write(f"cluster_formation.etcd.endpoints.{j} = 127.0.0.1:{c}\n")
                f.write(f"distribution.listener.port_range.min = {node.dist_port}\n"
                        f"distribution.listener.port_range.max = {node.dist_port}\n")
            with open(node.log_path, "ab") as log:
                node.proc = spawn(
                    [sys.executable, "-m", "warren", "server", "--node-name", node.name, "--config", conf,
                     "--data-dir", node.directory, "--host", "127.0.0.1", "--port", node.amqp_port,
                     "--management-port", node.mgmt_port, "--prometheus-port", node.prometheus_port],
                    cwd=node.directory, stdout=log, stderr=log)
            self.nodes.append(node)
        for node in self.nodes:
            self._wait(node.name, lambda: (amqp_probe(node.amqp_port) is not None and port_open(node.mgmt_port)
                                           and self._sees_all(node)))

    def _sees_all(self, node: Node) -> bool:
        """The node lists every member as running."""
        try:
            with urllib.request.urlopen(_api_request(node.mgmt_port, "/api/nodes"), timeout=2) as r:
                listed = json.load(r)
        except (OSError, ValueError):
            return False
        names = {n.name for n in self.nodes}
        return names <= {n["name"] for n in listed if n.get("running")}

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise ClusterError(f"{node.name} exited with {node.proc.returncode}:\n{node.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready after {START_TIMEOUT:.0f} s (logs in {self.tmp}; "
                                   "--keep-tmp keeps them)")
            time.sleep(0.2)

    def died(self) -> str | None:
        dead = [f"{n.name} exited with {n.proc.returncode} meanwhile:\n{n.tail()}"
                for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
        return "\n".join(dead) or None

    def stop(self) -> None:
        for node in self.nodes:  # SIGTERM: each leaves the running set at once
            if node.proc is not None:
                kill_tree(node.proc, grace=15.0)
        for proc in self.etcd:
            kill_tree(proc, grace=5.0)
        self.nodes, self.etcd = [], []
        if self.keep_tmp:
            _log(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
            watchdog_send(f"d-{self.tmp}")


def _api_request(port: int, path: str) -> urllib.request.Request:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    return request


def _etcd_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return json.load(r).get("health") == "true"
    except (OSError, ValueError):
        return False


class RoundRobinProxy:
    """A TCP proxy on a free loopback port, in a thread of its own: each new connection goes to
    the next node's AMQP port in turn, its bytes copied both ways until either side closes."""

    def __init__(self, ports: list[int]):
        self.ports = ports
        self.port = 0
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="round-robin-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10) or not self.port:
            raise ClusterError("the proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        port = self.ports[self._next % len(self.ports)]
        self._next += 1
        try:
            node_reader, node_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(_pipe(client_reader, node_writer), _pipe(node_reader, client_writer))
        finally:
            node_writer.close()
            client_writer.close()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error, then half-close (a peer's FIN passes on) or close."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum, frame):
    raise _Interrupted(signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        _log("no command given (usage: warren_cluster.py run [options] -- CMD...)")
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    cluster = WarrenCluster(keep_tmp=args.keep_tmp)
    proxy: RoundRobinProxy | None = None
    proc = None
    try:
        try:
            cluster.start()
            proxy = RoundRobinProxy([n.amqp_port for n in cluster.nodes])
            proxy.start()
        except ClusterError as e:
            _log(f"could not start the cluster: {e}")
            return 2
        first = cluster.nodes[0]
        warrenctl = os.path.join(os.path.dirname(sys.executable), "warrenctl")
        extra = {
            "WARREN_TEST_BROKER": f"127.0.0.1:{proxy.port}",
            "WARREN_TEST_MGMT": f"http://127.0.0.1:{first.mgmt_port}/api",
            "WARREN_TEST_PROMETHEUS": f"127.0.0.1:{first.prometheus_port}",
            "WARREN_TEST_CLUSTER": ",".join(f"127.0.0.1:{n.amqp_port}" for n in cluster.nodes),
            "WARREN_TEST_CLUSTER_NODES": ",".join(n.name for n in cluster.nodes),
            "WARREN_TEST_CLUSTER_MGMT": ",".join(f"127.0.0.1:{n.mgmt_port}" for n in cluster.nodes),
            "WARREN_TEST_WARREN_CLUSTER": "1",
        }
        if os.access(warrenctl, os.X_OK):
            extra["WARREN_TEST_RABBITMQCTL"] = shlex.join([warrenctl, "--data-dir", first.directory])
        env = dict(os.environ)
        env.update(extra)
        _log(f"running against {', '.join(n.name for n in cluster.nodes)} (logs in {cluster.tmp}): "
             f"{shlex.join(cmd)}")
        for k, v in extra.items():
            _log(f"  {k}={v}")
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as e:
            _log(f"could not run {cmd[0]}: {e}")
            return 127
        rc = proc.wait()
        why = cluster.died()
        if why:
            _log(why)
        return 128 - rc if rc < 0 else rc
    except (KeyboardInterrupt, _Interrupted) as e:
        _log(f"interrupted ({str(e) or 'Ctrl-C'}); stopping")
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish stopping the cluster
        if proxy is not None:
            proxy.stop()
        cluster.stop()
        kill_all_children()
        _log("stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a command against a private three-node Warren cluster.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="start etcd, three Warren nodes and a round-robin proxy, run CMD with "
                                   "WARREN_TEST_BROKER set to the proxy, stop them, exit with CMD's status",
                       usage="%(prog)s [--keep-tmp] -- CMD...")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory (data, logs)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
