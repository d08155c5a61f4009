"""`warren local-cluster`: one etcd and three Warren nodes on this machine, as a newcomer runs
it (ports 0: free ones, so the test takes no fixed port); the nodes form one cluster (a
vhost made on the first is on the third), and Ctrl-C (SIGINT) stops everything, leaving no
process behind. Its refusals: no etcd binary, a port in use."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest
import requests

from conftest import EXTERNAL, scratch_dir
from .etcd_cluster import require_etcd
from .test_membership import nodes, wait_for

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="starts its own Warren nodes")

NODE_LINE = re.compile(r"^(warren-\d+@localhost): AMQP amqp://guest:guest@127\.0\.0\.1:(\d+)/, "
                       r"management http://127\.0\.0\.1:(\d+)/ \(data and log in (\S+)\)$")


def local_cluster(*args: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warren", "local-cluster", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def processes_under(directory: str) -> set[int]:
    """The pids of the processes whose command line names `directory` (etcd and the nodes)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if directory.encode() in f.read():
                        found.add(int(entry))
            except OSError:
                pass
    return found


class Api:
    def __init__(self, port: int):
        self.api = f"http://127.0.0.1:{port}/api"


def test_three_nodes_form_a_cluster_and_ctrl_c_stops_them_all():
    require_etcd()
    directory = scratch_dir("warren-local-cluster-")
    proc = local_cluster("--nodes", "3", "--base-port", "0", "--management-base-port", "0", "--data-dir", directory)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "Ctrl-C stops them all" in line:
                ready.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "\n".join(lines)
        found = [m.groups() for m in map(NODE_LINE.match, lines) if m]
        assert [name for name, *_ in found] == ["warren-1@localhost", "warren-2@localhost", "warren-3@localhost"]
        assert all(where == os.path.join(directory, name.split("@")[0]) for name, _, _, where in found)
        apis = [Api(int(management)) for _, _, management, _ in found]
        names = [name for name, *_ in found]
        for api in apis:
            wait_for(lambda: nodes(api) == dict.fromkeys(names, True), timeout=20, what="three running")
        for _, amqp, _, _ in found:
            socket.create_connection(("127.0.0.1", int(amqp)), timeout=5).close()
        made = requests.put(apis[0].api + "/vhosts/tried", json={}, auth=("guest", "guest"), timeout=10)
        assert made.status_code == 201, made.text
        wait_for(lambda: requests.get(apis[2].api + "/vhosts/tried", auth=("guest", "guest"), timeout=5).ok,
                 what="the vhost on node 3")
        assert len(processes_under(directory) - {proc.pid}) == 4  # etcd and three nodes
    except BaseException:
        proc.kill()
        raise
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    reader.join(5)
    assert lines[-2:] == ["stopping the nodes, then etcd ...", "stopped"]
    assert processes_under(directory) == set()
    # Each node stopped cleanly (SIGTERM), etcd after them.
    for name, *_ in found:
        log = open(os.path.join(directory, name.split("@")[0], "warren.log")).read()
        assert "shutting down" in log


def test_without_etcd_it_says_what_to_install():
    env = {**os.environ, "PATH": "/nonexistent"}
    proc = local_cluster("--data-dir", scratch_dir("warren-local-cluster-"), env=env)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "etcd" in out and "apt-get install etcd-server" in out


def test_a_port_in_use_is_refused_before_anything_starts():
    require_etcd()
    directory = scratch_dir("warren-local-cluster-")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = local_cluster("--nodes", "1", "--base-port", "0", "--management-base-port", str(port),
                             "--data-dir", directory)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert out == (f"warren local-cluster: port {port}, the management port of warren-1@localhost "
                   "(--management-base-port), is in use on 127.0.0.1\n")
    assert processes_under(directory) == set()
