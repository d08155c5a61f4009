"""An etcd cluster for the clustering tests: Debian's etcd-server binary run as members on
loopback ports (no service, own temp dirs), each of which a test may kill -9, stop and start
again. CI installs etcd-server; without the binary the tests skip, unless
WARREN_REQUIRE_ETCD is set (CI sets it: they must run there)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import free_port, scratch_dir

ETCD = shutil.which("etcd")


def require_etcd() -> None:
    if ETCD is None:
        if os.environ.get("WARREN_REQUIRE_ETCD"):
            pytest.fail("WARREN_REQUIRE_ETCD is set but there is no etcd binary (apt-get install etcd-server)")
        pytest.skip("needs etcd (Debian's etcd-server)")


class Member:
    def __init__(self, name: str, directory: str, client_port: int, peer_port: int):
        self.name = name
        self.directory = directory
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, token: str, state: str = "new", everywhere: bool = False) -> None:
        """everywhere: clients reach it on every address of this namespace (a node in a network
        namespace reaches it at the veth pair's address here)."""
        log = open(os.path.join(self.directory, "etcd.log"), "ab")
        listen = f"http://0.0.0.0:{self.client_port}" if everywhere else f"http://{self.endpoint}"
        self.proc = subprocess.Popen(
            [ETCD, "--name", self.name, "--data-dir", os.path.join(self.directory, "data"),
             "--listen-client-urls", listen, "--advertise-client-urls", f"http://{self.endpoint}",
             "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
             "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", token,
             # Short elections, as a test's faults should be detected in about a second.
             "--heartbeat-interval", "100", "--election-timeout", "1000"],
            stdout=log, stderr=subprocess.STDOUT)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as response:
                return json.load(response).get("health") == "true"
        except (OSError, ValueError):
            return False


class EtcdCluster:
    """`size` members, started and healthy."""

    def __init__(self, size: int = 3, everywhere: bool = False):
        require_etcd()
        self.everywhere = everywhere
        self.directory = scratch_dir("warren-etcd-")
        self.members = []
        for i in range(size):
            directory = os.path.join(self.directory, f"m{i}")
            os.makedirs(directory)
            self.members.append(Member(f"m{i}", directory, free_port(), free_port()))
        self.token = os.path.basename(self.directory)
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.start(self.initial, self.token, everywhere=everywhere)
        self.wait_healthy()

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def wait_healthy(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not all(m.healthy() for m in self.members if m.proc is not None and m.proc.poll() is None):
            if time.monotonic() > deadline:
                logs = "\n".join(open(os.path.join(m.directory, "etcd.log")).read()[-2000:] for m in self.members)
                raise RuntimeError(f"etcd did not become healthy:\n{logs}")
            time.sleep(0.1)

    def restart(self, member: Member) -> None:
        member.start(self.initial, self.token, state="existing", everywhere=self.everywhere)

    def stop(self) -> None:
        for member in self.members:
            member.signal(signal.SIGCONT)
            member.kill()
