"""`warren local-cluster`: a cluster to try on one machine, in the foreground.

One etcd member (Debian's etcd-server binary) and N Warren nodes, warren-1@localhost ...,
each a `warren server` with its own data directory and generated rabbitmq.conf joining the
cluster through that etcd (cluster_formation.peer_discovery_backend = etcd), as separate
machines would. Node i listens for AMQP on base-port + i - 1 and for the management API on
management-base-port + i - 1; a port of 0 lets the kernel choose free ones (what the tests
use). Everything lives under --data-dir, so a second run finds the same cluster.

Ctrl-C (SIGINT) or SIGTERM stops it all cleanly: SIGTERM to every node (each leaves the
cluster's running set at once), then to etcd. The children run in their own process groups,
so a terminal's Ctrl-C reaches this supervisor only and the order holds; should the
supervisor die, the kernel sends them SIGTERM (Linux's parent-death signal).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from .local import DEFAULT_DATA_DIR

DEFAULT_DIR = os.path.join(os.path.dirname(DEFAULT_DATA_DIR), "warren-local-cluster")
START_TIMEOUT = 60.0  # seconds for etcd and every node to answer
STOP_TIMEOUT = 15.0   # seconds a process has after SIGTERM before SIGKILL
ETCD_MISSING = ("warren local-cluster: the etcd binary is not on PATH; install it "
                "(Debian, Ubuntu: apt-get install etcd-server)")


class LocalClusterError(Exception):
    """Ends the command before the cluster runs: the message goes to stderr, exit 1."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("local-cluster", help="run a cluster of Warren nodes and one etcd on this machine, "
                                                  "to try clustering (Ctrl-C stops it all)")
    parser.add_argument("--nodes", type=_positive, default=3, help="how many Warren nodes (default 3)")
    parser.add_argument("--base-port", type=_port, default=5672,
                        help="AMQP port of the first node, the next ones +1, +2 ... (default 5672; 0: free ports)")
    parser.add_argument("--management-base-port", type=_port, default=15672,
                        help="management API port of the first node, the next ones +1 ... (default 15672; "
                             "0: free ports)")
    parser.add_argument("--etcd-port", type=_port, default=0,
                        help="etcd's client port (default 0: a free one)")
    parser.add_argument("--data-dir", default=DEFAULT_DIR,
                        help=f"where etcd's and every node's data go (default {DEFAULT_DIR})")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of nodes from 1, got '{text}'")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got '{text}'")
    return value


@dataclass
class Node:
    name: str
    directory: str
    amqp_port: int
    management_port: int
    dist_port: int = 0  # its node links' (RabbitMQ's AMQP port + 20000 where that is a port)
    proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "warren.log")


def run(args: argparse.Namespace) -> int:
    etcd_binary = shutil.which("etcd")
    if etcd_binary is None:
        print(ETCD_MISSING, file=sys.stderr)
        return 1
    directory = os.path.abspath(args.data_dir)
    processes: list[subprocess.Popen] = []
    # Ctrl-C and SIGTERM stop it all, also while starting (even where a shell's `&` ignores SIGINT).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_signal)
    try:
        nodes = _plan(args, directory)
        etcd_port = args.etcd_port or _free_port()
        _check_free([(etcd_port, "etcd's client port (--etcd-port)")])
        endpoint = f"127.0.0.1:{etcd_port}"
        etcd = _start_etcd(etcd_binary, os.path.join(directory, "etcd"), f"http://{endpoint}")
        processes.append(etcd)
        for node in nodes:
            node.proc = _start_node(node, endpoint)
            processes.append(node.proc)
        _wait_ready(nodes, etcd, f"http://{endpoint}", directory)
    except LocalClusterError as err:
        print(f"warren local-cluster: {err}", file=sys.stderr)
        _stop(processes)
        return 1
    except _Stop:
        _stop(processes)
        return 130
    try:
        print(f"etcd: {endpoint} (data and log in {os.path.join(directory, 'etcd')})", flush=True)
        for node in nodes:
            print(f"{node.name}: AMQP amqp://guest:guest@127.0.0.1:{node.amqp_port}/, management "
                  f"http://127.0.0.1:{node.management_port}/ (data and log in {node.directory})", flush=True)
        print(f"warrenctl on a node: WARREN_DATA_DIR={nodes[0].directory} warrenctl cluster_status", flush=True)
        print(f"A cluster of {len(nodes)} nodes runs; Ctrl-C stops them all.", flush=True)
        _watch(nodes, etcd)
    except _Stop:
        pass
    print("stopping the nodes, then etcd ...", flush=True)
    _stop(processes)
    print("stopped", flush=True)
    return 0


def _plan(args: argparse.Namespace, directory: str) -> list[Node]:
    """Every node's name, directory and ports; the ports checked free."""
    count = args.nodes
    amqp = [args.base_port + i if args.base_port else 0 for i in range(count)]
    management = [args.management_base_port + i if args.management_base_port else 0 for i in range(count)]
    if max(amqp + management) > 65535:
        raise LocalClusterError(f"{count} nodes from ports {args.base_port} and {args.management_base_port} "
                                "go past 65535: choose lower --base-port and --management-base-port")
    wanted = [p for p in amqp + management if p]
    if len(set(wanted)) != len(wanted):
        raise LocalClusterError("the AMQP and management port ranges overlap: choose other --base-port and "
                                "--management-base-port")
    nodes = [Node(f"warren-{i + 1}@localhost", os.path.join(directory, f"warren-{i + 1}"), a, m)
             for i, (a, m) in enumerate(zip(amqp, management))]
    _check_free([(n.amqp_port, f"the AMQP port of {n.name} (--base-port)") for n in nodes if n.amqp_port] +
                [(n.management_port, f"the management port of {n.name} (--management-base-port)")
                 for n in nodes if n.management_port])
    taken = set(wanted)
    for node in nodes:  # 0: ports the kernel gives, none twice
        # The node links' port: RabbitMQ's default (the AMQP port + 20000) with --base-port,
        # checked free as the others; one the kernel gives with free ports.
        given = node.amqp_port + 20000 if node.amqp_port and node.amqp_port + 20000 < 65536 else 0
        if given and given not in taken:
            _check_free([(given, f"the node links' port of {node.name} (--base-port + 20000)")])
            node.dist_port = given
            taken.add(given)
        node.amqp_port = node.amqp_port or _fresh_port(taken)
        node.management_port = node.management_port or _fresh_port(taken)
        node.dist_port = node.dist_port or _fresh_port(taken)
    try:
        for node in nodes:
            os.makedirs(node.directory, exist_ok=True)
    except OSError as err:
        raise LocalClusterError(f"cannot create {err.filename}: {err.strerror}") from None
    return nodes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fresh_port(taken: set[int]) -> int:
    while True:
        port = _free_port()
        if port not in taken:
            taken.add(port)
            return port


def _check_free(ports: list[tuple[int, str]]) -> None:
    """Each port can be bound on 127.0.0.1 (and ::1, where the machine has IPv6): the nodes
    listen on both loopbacks."""
    for port, what in ports:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue  # no IPv6 here
            try:
                sock.bind((host, port))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise LocalClusterError(f"port {port}, {what}, is in use on {host}") from None
                if err.errno != errno.EADDRNOTAVAIL:  # (::1 not configured)
                    raise LocalClusterError(f"cannot listen on {host}:{port}, {what}: {err.strerror}") from None
            finally:
                sock.close()


def _die_with_parent() -> None:
    """In the child: its own process group (a terminal's Ctrl-C is the supervisor's to handle),
    and SIGTERM should the supervisor die (Linux's PR_SET_PDEATHSIG)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawn(argv: list[str], log_path: str) -> subprocess.Popen:
    try:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
    except OSError as err:
        raise LocalClusterError(f"cannot start {argv[0]}: {err.strerror}") from None


def _start_etcd(binary: str, directory: str, client: str) -> subprocess.Popen:
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise LocalClusterError(f"cannot create {err.filename}: {err.strerror}") from None
    peer = f"http://127.0.0.1:{_free_port()}"
    return _spawn([binary, "--name", "local-cluster", "--data-dir", os.path.join(directory, "data"),
                   "--listen-client-urls", client, "--advertise-client-urls", client,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", f"local-cluster={peer}"],
                  os.path.join(directory, "etcd.log"))


def _start_node(node: Node, etcd: str) -> subprocess.Popen:
    conf = os.path.join(node.directory, "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write("# Written by warren local-cluster at every start.\n"
                "cluster_formation.peer_discovery_backend = etcd\n"
                f"cluster_formation.etcd.endpoints.1 = {etcd}\n"
                f"distribution.listener.port_range.min = {node.dist_port}\n"
                f"distribution.listener.port_range.max = {node.dist_port}\n")
    return _spawn([sys.executable, "-m", "warren", "server", "--node-name", node.name, "--config", conf,
                   "--data-dir", node.directory, "--port", str(node.amqp_port),
                   "--management-port", str(node.management_port), "--prometheus-port", "0"],
                  node.log_path)


def _wait_ready(nodes: list[Node], etcd: subprocess.Popen, etcd_url: str, directory: str) -> None:
    """etcd answers its health check, every node its AMQP and management ports."""
    deadline = time.monotonic() + START_TIMEOUT
    etcd_log = os.path.join(directory, "etcd", "etcd.log")
    waiting = list(nodes)
    etcd_ready = False
    while waiting or not etcd_ready:
        if etcd.poll() is not None:
            raise LocalClusterError(f"etcd exited with code {etcd.returncode}:\n{_tail(etcd_log)}")
        for node in list(waiting):
            assert node.proc is not None
            if node.proc.poll() is not None:
                raise LocalClusterError(f"{node.name} exited with code {node.proc.returncode}:\n"
                                        f"{_tail(node.log_path)}")
            if _accepts(node.amqp_port) and _accepts(node.management_port):
                waiting.remove(node)
        etcd_ready = etcd_ready or _etcd_healthy(etcd_url)
        if time.monotonic() > deadline:
            late = [n.name for n in waiting] + ([] if etcd_ready else ["etcd"])
            raise LocalClusterError(f"not ready after {START_TIMEOUT:.0f} s: {', '.join(late)} (see the logs in "
                                    f"{directory})")
        time.sleep(0.2)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
            return b'"health":"true"' in answer.read().replace(b" ", b"")
    except OSError:
        return False


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace").rstrip()
    except OSError as err:
        return f"(no log: {err.strerror})"


class _Stop(Exception):
    """Ctrl-C or SIGTERM to the supervisor."""


def _stop_signal(signum, frame):
    raise _Stop()


def _watch(nodes: list[Node], etcd: subprocess.Popen) -> None:
    """Until Ctrl-C or SIGTERM (_Stop): say when a node or etcd exits on its own (the others go on)."""
    reported: set[int] = set()
    while True:
        for name, proc, log in [(n.name, n.proc, n.log_path) for n in nodes] + [("etcd", etcd, "")]:
            assert proc is not None
            if proc.poll() is not None and proc.pid not in reported:
                reported.add(proc.pid)
                where = f" (log: {log})" if log else ""
                print(f"{name} exited with code {proc.returncode}{where}", file=sys.stderr, flush=True)
        time.sleep(0.5)


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to the nodes, then to etcd (started first), each group given STOP_TIMEOUT
    before SIGKILL. Signals meanwhile are ignored: half a stop would leave orphans."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    for group in (processes[1:], processes[:1]):
        for proc in group:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in group:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
