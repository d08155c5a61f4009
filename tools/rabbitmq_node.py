#!/usr/bin/env python3
"""Start and stop a private RabbitMQ node as the current user (standard library only).

The node gets everything of its own, so it neither needs nor touches a system-wide
node, /var/lib/rabbitmq or ~/.erlang.cookie, and several can run side by side:

- HOME is a fresh temporary directory holding a new .erlang.cookie, so
  rabbitmq-server and rabbitmqctl agree on the cookie (also when run as root);
- its own epmd on a free port (ERL_EPMD_PORT), run in the foreground as our child;
- free ports for AMQP (on 127.0.0.1) and Erlang distribution;
- mnesia, log, pid file, plugins file (no plugins unless asked for) and config paths
  in the temp dir; the broker runs with its default configuration (user guest/guest).

conf=["key = value", ...] (command line: --conf "key = value", repeatable) adds lines to
the node's rabbitmq.conf, e.g. a TLS listener and its ssl_options.*.

With plugins=["rabbitmq_management"] (command line: --plugins rabbitmq_management) the
management plugin also runs, on a free port of 127.0.0.1: node.mgmt_port, node.mgmt_api
("http://127.0.0.1:PORT/api"); `run` then also sets WARREN_TEST_MGMT to that URL. With
rabbitmq_prometheus its metrics endpoint is on a free port of 127.0.0.1 too (not the plugin's
15692, which a Warren on the machine may hold): node.prometheus_port, and `run` sets
WARREN_TEST_PROMETHEUS=127.0.0.1:PORT.

Every process is started in its own process group and is killed at the end, also on
errors; if the Python process itself is SIGKILLed, a small watchdog process kills
them and removes the temp dirs.

As a library (bench/run.py uses it):

    with RabbitMQNode() as node:            # start() ... stop()
        connect(node.host, node.port)
        node.ctl("list_queues")             # rabbitmqctl -n <node> list_queues

Crash tests kill the node as a crash would and start it again on the same ports and data
(tests/crash):

    node.kill()                             # kill -9 of the node's OS processes
    node.restart()                          # the same node, ports and mnesia dir again
    node.send_signal(signal.SIGSTOP)        # ... and SIGCONT: a node that hangs

A cluster (RabbitMQCluster): nodes rabbit-a@localhost, rabbit-b@localhost, ... sharing one
HOME (cookie) and one epmd, each with its own ports and directory, joined as an operator
would (stop_app, join_cluster rabbit-a@localhost, start_app); every node is a RabbitMQNode,
so the crashes above, and node.shutdown() (`rabbitmqctl stop`, kept for restart()), hit
one node while the others go on:

    with RabbitMQCluster(3, plugins=["rabbitmq_management"]) as cluster:
        a, b, c = cluster.nodes
        a.kill(); ...; a.restart()          # it rejoins the cluster

ports=f (f(n) gives n free ports) picks the node's ports instead of the kernel's ephemeral
ones: a test restarting a killed node uses ports no outgoing connection can take meanwhile.
host="ADDRESS" makes it listen on another local address than 127.0.0.1 (e.g. one that a
network namespace reaches; with conf=["loopback_users = none"] guest may log in from there).

As a command, to run the tests against RabbitMQ:

    python3 tools/rabbitmq_node.py run -- python3 -m pytest -q tests/integration

starts a node, runs the command with WARREN_TEST_BROKER=host:port and
WARREN_TEST_RABBITMQCTL (a rabbitmqctl command line for that node) set, stops the
node and exits with the command's status. With --plugins rabbitmq_management also
WARREN_TEST_MGMT=http://127.0.0.1:PORT/api (the management API of that node); with
--plugins rabbitmq_prometheus WARREN_TEST_PROMETHEUS=127.0.0.1:PORT (its metrics endpoint).

    python3 tools/rabbitmq_node.py cluster --nodes 3 [--plugins ...] -- CMD

does the same with a cluster, setting WARREN_TEST_CLUSTER=host:port,host:port,... (each node's
AMQP), WARREN_TEST_CLUSTER_NODES=rabbit-a@localhost,... (node names), with the management
plugin WARREN_TEST_CLUSTER_MGMT=host:port,... (each node's management API), and the
single-node variables for the first node.
"""

from __future__ import annotations

import argparse
import atexit
import os
import secrets
import shlex
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

__all__ = [
    "RabbitMQNode", "RabbitMQCluster", "RabbitMQNodeError", "spawn", "kill_tree", "forget",
    "kill_all_children", "watchdog_send", "free_port", "free_ports", "port_open",
    "amqp_probe", "default_rabbitmq_bin",
]


def _log(msg: str) -> None:
    print(f"[rabbitmq-node {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# process bookkeeping

_CHILDREN: dict[int, subprocess.Popen] = {}  # pid -> process (own process group)

# A sidecar that SIGKILLs every process group we registered (and removes our
# temp dirs) if this process dies without cleaning up, e.g. when it is
# SIGKILLed: it reads "+pgid"/"-pgid"/"d+path"/"d-path" lines on stdin and acts
# when stdin reaches EOF without a final "done".
_WATCHDOG_CODE = r"""
import os, shutil, signal, sys, time
groups, dirs = set(), set()
for line in sys.stdin:
    line = line.rstrip("\n")
    if line == "done":
        sys.exit(0)
    if line[:2] == "d+":
        dirs.add(line[2:])
    elif line[:2] == "d-":
        dirs.discard(line[2:])
    elif line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
time.sleep(0.5)
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""
_watchdog: subprocess.Popen | None = None


def watchdog_send(msg: str) -> None:
    """Tell the watchdog about a process group ("+pgid"/"-pgid") or a temp dir
    ("d+path"/"d-path") to clean up if we die; starts it on first use."""
    global _watchdog
    try:
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG_CODE], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, text=True)
        _watchdog.stdin.write(msg + "\n")
        _watchdog.stdin.flush()
    except OSError:
        pass


def _watchdog_stop() -> None:
    global _watchdog
    if _watchdog is not None and _watchdog.poll() is None:
        try:
            _watchdog.stdin.write("done\n")
            _watchdog.stdin.close()
            _watchdog.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    _watchdog = None


def spawn(argv, *, env=None, cwd=None, stdout=None, stderr=None) -> subprocess.Popen:
    """Start a child in its own process group so the whole tree can be killed."""
    p = subprocess.Popen(
        [str(a) for a in argv], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=stdout, stderr=stderr, start_new_session=True)
    _CHILDREN[p.pid] = p
    watchdog_send(f"+{p.pid}")
    return p


def kill_tree(p: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after `grace` seconds."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # the leader may be gone while other members of its group linger
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    forget(p)


def forget(p: subprocess.Popen) -> None:
    """Stop tracking a child that has been reaped (or killed) by other means."""
    if _CHILDREN.pop(p.pid, None) is not None:
        watchdog_send(f"-{p.pid}")


def kill_all_children() -> None:
    """Kill every child started with spawn() and stop the watchdog."""
    for p in list(_CHILDREN.values()):
        kill_tree(p, grace=2.0)
    _watchdog_stop()


# --------------------------------------------------------------------------
# ports


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct currently free TCP ports (all held open while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def amqp_probe(port: int, host: str = "127.0.0.1") -> bytes | None:
    """Send an AMQP 0-9-1 protocol header; return the first frame's payload if
    the answer is a method frame (connection.start), else None."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.settimeout(2.0)
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = b""
            while len(data) < 7:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
            if data[0] != 1:
                return None
            size = int.from_bytes(data[3:7], "big")
            while len(data) < 7 + size:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data[7:7 + size]
    except OSError:
        return None


def _server_version(start_payload: bytes | None) -> str:
    """The "version" server property from a connection.start payload."""
    key = b"\x07versionS"
    i = (start_payload or b"").find(key)
    if i < 0:
        return "?"
    i += len(key)
    n = int.from_bytes(start_payload[i:i + 4], "big")
    return start_payload[i + 4:i + 4 + n].decode("utf-8", "replace")


def default_rabbitmq_bin(name: str) -> str:
    """The real script (not Debian's /usr/sbin wrapper, which switches to the
    rabbitmq user when run as root and so would not see our HOME/cookie)."""
    cand = f"/usr/lib/rabbitmq/bin/{name}"
    if os.path.exists(cand):
        return cand
    return shutil.which(name) or name


def write_cookie(home: str) -> None:
    """A new random .erlang.cookie in `home`: rabbitmq-server and rabbitmqctl both read
    $HOME/.erlang.cookie, so with HOME=home they agree (also when run as root) and
    neither /root nor /var/lib/rabbitmq is touched."""
    cookie = "".join(secrets.choice(string.ascii_uppercase) for _ in range(20))
    cookie_path = os.path.join(home, ".erlang.cookie")
    with open(cookie_path, "w") as f:
        f.write(cookie)
    os.chmod(cookie_path, 0o400)


def start_epmd(port: int, env: dict[str, str]) -> subprocess.Popen:
    """Our own epmd on a private port, in the foreground, so it is our child (erl would
    otherwise daemonize one that outlives us); returns once it listens."""
    epmd = shutil.which("epmd") or "epmd"
    try:
        proc = spawn([epmd, "-port", str(port)], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        raise RabbitMQNodeError(f"could not start epmd ({epmd}): {e}") from e
    deadline = time.monotonic() + 10
    while not port_open(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tree(proc, grace=1.0)
            raise RabbitMQNodeError(f"could not start epmd on port {port}")
        time.sleep(0.05)
    return proc


def _discard(directory: str, keep: bool, log) -> None:
    """A node's (or cluster's) temporary directory: removed (and the watchdog told), or kept."""
    if keep:
        log(f"rabbitmq: kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)
        watchdog_send(f"d-{directory}")


# --------------------------------------------------------------------------
# the node


class RabbitMQNodeError(Exception):
    pass


class RabbitMQNode:
    """A private RabbitMQ node: own node name, ports, epmd, cookie and dirs.

    start() returns once the node answers AMQP on (host, port) and rabbitmqctl
    can reach it; stop() stops it with `rabbitmqctl stop`, kills whatever is
    left and removes the temp dir (unless keep_tmp). Both may be called again.
    """

    host = "127.0.0.1"

    def __init__(self, nodename: str | None = None, *, server: str | None = None,
                 rabbitmqctl: str | None = None, start_timeout: float = 60.0,
                 keep_tmp: bool = False, tmp_prefix: str = "rabbitmq-node-",
                 plugins: list[str] | tuple[str, ...] = (), conf: list[str] | tuple[str, ...] = (),
                 ports: Callable[[int], list[int]] = free_ports, host: str | None = None,
                 home: str | None = None, epmd_port: int = 0, log=_log):
        self.nodename = nodename or f"warren-test-{os.getpid()}@localhost"
        self.server = server or default_rabbitmq_bin("rabbitmq-server")
        self.rabbitmqctl = rabbitmqctl or default_rabbitmq_bin("rabbitmqctl")
        self.start_timeout = start_timeout
        self.keep_tmp = keep_tmp
        self.tmp_prefix = tmp_prefix
        self.log = log
        self.plugins = list(plugins)
        self.conf = list(conf)  # extra rabbitmq.conf lines
        self.ports = ports  # n -> n free ports, for the node's
        if host is not None:  # where it listens (AMQP and its HTTP plugins) and is reached
            self.host = host
        # A cluster's nodes share one HOME (so one .erlang.cookie) and one running epmd:
        # given, the node makes neither of its own.
        self.shared_home = home
        self.shared_epmd_port = epmd_port
        self.port = 0
        self.mgmt_port = 0  # the management plugin's HTTP port, if it is enabled
        self.prometheus_port = 0  # the rabbitmq_prometheus plugin's, if it is enabled
        self.dist_port = 0
        self.epmd_port = 0
        self.version = "?"
        self.tmp: str | None = None
        self.logfile = ""
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.epmd: subprocess.Popen | None = None

    # -- state

    @property
    def pid(self) -> int | None:
        """pid (and process group id) of the rabbitmq-server process."""
        return self.proc.pid if self.proc else None

    @property
    def mgmt_api(self) -> str | None:
        """Base URL of the management HTTP API, if the management plugin runs."""
        return f"http://{self.host}:{self.mgmt_port}/api" if self.mgmt_port else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 15) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    # -- rabbitmqctl

    @property
    def ctl_env(self) -> dict[str, str]:
        """The environment rabbitmqctl needs to reach the node: our HOME (for
        the cookie), our epmd port, our (empty) rabbitmq-env.conf and our enabled
        plugins file (rabbitmqctl finds the plugins' commands, e.g. shovel_status, there)."""
        return {k: self.env[k] for k in ("HOME", "ERL_EPMD_PORT", "RABBITMQ_CONF_ENV_FILE",
                                         "RABBITMQ_ENABLED_PLUGINS_FILE")}

    @property
    def ctl_argv(self) -> list[str]:
        """A self-contained rabbitmqctl command line for this node, usable from
        any environment (`env VAR=... rabbitmqctl -n NODE`)."""
        return ["env", *(f"{k}={v}" for k, v in self.ctl_env.items()),
                self.rabbitmqctl, "-n", self.nodename]

    @property
    def ctl_command(self) -> str:
        """ctl_argv as one shell-quoted string (for WARREN_TEST_RABBITMQCTL)."""
        return shlex.join(self.ctl_argv)

    def ctl(self, *args, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run `rabbitmqctl -n NODE ARGS...`; returns the CompletedProcess
        (text stdout/stderr); raises RabbitMQNodeError if check and it fails."""
        argv = [self.rabbitmqctl, "-n", self.nodename, *map(str, args)]
        try:
            r = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout,
                               start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RabbitMQNodeError(f"rabbitmqctl {' '.join(map(str, args))}: {e}") from e
        if check and r.returncode != 0:
            raise RabbitMQNodeError(f"rabbitmqctl {' '.join(map(str, args))} exited with "
                                    f"{r.returncode}: {(r.stderr or r.stdout).strip()}")
        return r

    # -- start / stop

    def start(self) -> "RabbitMQNode":
        if self.alive():
            return self
        try:
            self._start_once()
        except RabbitMQNodeError as e:
            # The only usual transient cause is a port taken between choosing
            # and binding it: the server then exits early. Retry once with
            # fresh ports; a timeout is not retried.
            if self.proc is None or self.proc.poll() is None:
                self.stop()
                raise
            self.log(f"rabbitmq: start failed, retrying with fresh ports: {str(e).splitlines()[0]}")
            self.stop()
            try:
                self._start_once()
            except RabbitMQNodeError:
                self.stop()
                raise
        return self

    def _start_once(self) -> None:
        t = self.tmp = tempfile.mkdtemp(prefix=self.tmp_prefix)
        if not self.keep_tmp:
            watchdog_send(f"d+{t}")
        mgmt = "rabbitmq_management" in self.plugins
        self.port, self.dist_port, self.epmd_port, mgmt_port, prometheus_port = self.ports(5)
        if self.shared_epmd_port:
            self.epmd_port = self.shared_epmd_port
        self.mgmt_port = mgmt_port if mgmt else 0
        self.prometheus_port = prometheus_port if "rabbitmq_prometheus" in self.plugins else 0
        self.logfile = os.path.join(t, "rabbitmq-server.out")
        # Own cookie in our own HOME (a cluster's node: the cluster's HOME and cookie)
        if self.shared_home is None:
            write_cookie(t)
        with open(os.path.join(t, "enabled_plugins"), "w") as f:
            f.write(f"[{','.join(self.plugins)}].\n")
        conf = list(self.conf)
        if self.mgmt_port:
            conf[:0] = [f"management.tcp.ip = {self.host}", f"management.tcp.port = {self.mgmt_port}"]
        if self.prometheus_port:
            conf[:0] = [f"prometheus.tcp.ip = {self.host}", f"prometheus.tcp.port = {self.prometheus_port}"]
        if conf:
            with open(os.path.join(t, "rabbitmq.conf"), "w") as f:
                f.write("".join(line + "\n" for line in conf))
        open(os.path.join(t, "rabbitmq-env.conf"), "w").close()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": self.shared_home or t,
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": os.path.join(t, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(t, "log"),
            "RABBITMQ_PID_FILE": os.path.join(t, "rabbitmq.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(t, "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": os.path.join(t, "plugins-expand"),
            "RABBITMQ_CONFIG_FILE": os.path.join(t, "rabbitmq"),  # absent: defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(t, "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": os.path.join(t, "rabbitmq-env.conf"),
        })
        self.env = env
        if not self.shared_epmd_port:
            self.epmd = start_epmd(self.epmd_port, env)
        self.log(f"rabbitmq: starting node {self.nodename} on {self.host}:{self.port} "
                 f"(dist {self.dist_port}, epmd {self.epmd_port}, dir {t}"
                 + (f", management {self.mgmt_port}" if self.mgmt_port else "")
                 + (f", prometheus {self.prometheus_port}" if self.prometheus_port else "") + ")")
        self._run_server()

    def _run_server(self) -> None:
        self._launch()
        self._wait_ready()
        self.log(f"rabbitmq: ready (RabbitMQ {self.version}, pid {self.proc.pid})")

    def _launch(self) -> None:
        try:
            with open(self.logfile, "ab") as lf:
                self.proc = spawn([self.server], env=self.env, cwd=self.tmp, stdout=lf, stderr=lf)
        except OSError as e:
            raise RabbitMQNodeError(f"could not run {self.server}: {e}") from e

    # -- crashes (tests/crash)

    def send_signal(self, sig: int) -> None:
        """Send `sig` to every OS process of the node (the server's process group: beam and
        its port programs; not epmd), e.g. SIGSTOP, then SIGCONT."""
        if not self.alive():
            raise RabbitMQNodeError("the node is not running")
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9 of the node, as a crash: no shutdown, nothing flushed. Its epmd, ports and
        directory stay for restart()."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        forget(self.proc)
        self.proc = None
        self.log("rabbitmq: killed (SIGKILL)")

    def shutdown(self, timeout: float = 60.0) -> None:
        """`rabbitmqctl stop`, as an operator stops a node: a clean shutdown. Its epmd,
        ports and directory stay for restart() (stop() instead also removes them)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            raise RabbitMQNodeError("the node is not running")
        self.ctl("stop", timeout=timeout)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RabbitMQNodeError(f"the node did not exit within {timeout:.0f} s of rabbitmqctl stop") from e
        forget(proc)
        self.proc = None
        self.log("rabbitmq: stopped (rabbitmqctl stop), kept for restart()")

    def restart(self) -> "RabbitMQNode":
        """Start the node again after kill() or shutdown() (or after it died): the same name,
        ports, cookie and mnesia directory, so it recovers what it had (and, in a cluster,
        rejoins it)."""
        if self.alive():
            raise RabbitMQNodeError("the node is still running")
        if not self.tmp or (self.epmd is None and not self.shared_epmd_port):
            raise RabbitMQNodeError("the node was never started, or was stopped: start() it")
        if self.proc is not None:
            forget(self.proc)
            self.proc = None
        self.log(f"rabbitmq: restarting node {self.nodename} on {self.host}:{self.port}")
        self._run_server()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RabbitMQNodeError(
                    f"rabbitmq-server exited with status {self.proc.returncode} during "
                    f"start-up; last log lines:\n{self.log_tail()}")
            if port_open(self.port, self.host):
                start = amqp_probe(self.port, self.host)
                if start is not None:
                    self.version = _server_version(start)
                    break
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(
                    f"rabbitmq-server did not answer AMQP on port {self.port} within "
                    f"{self.start_timeout:.0f} s; last log lines:\n{self.log_tail()}")
            time.sleep(0.2)
        # Also proves that rabbitmqctl reaches the node (cookie, epmd).
        self.ctl("await_startup", "--timeout", str(max(5, int(deadline - time.monotonic()))),
                 timeout=max(10.0, deadline - time.monotonic() + 10))
        self._wait_listeners(deadline)

    def _wait_listeners(self, deadline: float) -> None:
        """Wait until the HTTP plugins listen (a moment after the broker is up)."""
        for plugin, port in (("management", self.mgmt_port), ("rabbitmq_prometheus", self.prometheus_port)):
            while port and not port_open(port, self.host):
                if time.monotonic() > deadline:
                    raise RabbitMQNodeError(
                        f"the {plugin} plugin did not listen on port {port} within "
                        f"{self.start_timeout:.0f} s; last log lines:\n{self.log_tail()}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.ctl("stop", check=False, timeout=30)
            except RabbitMQNodeError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            kill_tree(self.proc, grace=5.0)
            self.proc = None
        if self.epmd is not None:
            kill_tree(self.epmd, grace=2.0)
            self.epmd = None
        if self.tmp:
            _discard(self.tmp, self.keep_tmp, self.log)
            self.tmp = None

    def __enter__(self) -> "RabbitMQNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------
# the cluster


class RabbitMQCluster:
    """Private RabbitMQ nodes clustered together: one HOME (so one cookie) and one epmd for
    all, each node with its own name (rabbit-a@localhost, rabbit-b@localhost, ...), AMQP,
    distribution and plugin ports and directory. The nodes start side by side; the second
    and later then `rabbitmqctl stop_app`, `join_cluster` the first, `start_app`, as an
    operator forms a cluster. Each node is a RabbitMQNode: node.kill(), node.shutdown(),
    node.restart(), node.send_signal(SIGSTOP/SIGCONT) act on that node alone.
    """

    host = "127.0.0.1"

    def __init__(self, size: int = 3, *, name_prefix: str = "rabbit", start_timeout: float = 90.0,
                 keep_tmp: bool = False, plugins: list[str] | tuple[str, ...] = (),
                 conf: list[str] | tuple[str, ...] = (), ports: Callable[[int], list[int]] = free_ports,
                 server: str | None = None, rabbitmqctl: str | None = None, log=_log):
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.size = size
        self.name_prefix = name_prefix
        self.start_timeout = start_timeout
        self.keep_tmp = keep_tmp
        self.plugins = list(plugins)
        self.conf = list(conf)
        self.ports = ports
        self.server = server
        self.rabbitmqctl = rabbitmqctl
        self.log = log
        self.home: str | None = None
        self.epmd_port = 0
        self.epmd: subprocess.Popen | None = None
        self.nodes: list[RabbitMQNode] = []

    def __getitem__(self, i: int) -> RabbitMQNode:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def nodenames(self) -> list[str]:
        return [n.nodename for n in self.nodes]

    @property
    def amqp_addresses(self) -> list[str]:
        return [f"{n.host}:{n.port}" for n in self.nodes]

    @property
    def mgmt_apis(self) -> list[str]:
        """The management API base URLs, one per node (empty without the plugin)."""
        return [n.mgmt_api for n in self.nodes if n.mgmt_api]

    def start(self) -> "RabbitMQCluster":
        if self.nodes:
            return self
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        home = self.home = tempfile.mkdtemp(prefix="rabbitmq-cluster-")
        if not self.keep_tmp:
            watchdog_send(f"d+{home}")  # (also starts the watchdog before the threads below)
        write_cookie(home)
        self.epmd_port = self.ports(1)[0]
        self.epmd = start_epmd(self.epmd_port, {**os.environ, "HOME": home})
        self.nodes = [
            RabbitMQNode(f"{self.name_prefix}-{string.ascii_lowercase[i]}@localhost",
                         server=self.server, rabbitmqctl=self.rabbitmqctl,
                         start_timeout=self.start_timeout, keep_tmp=self.keep_tmp,
                         tmp_prefix=f"rabbitmq-{self.name_prefix}-{string.ascii_lowercase[i]}-",
                         plugins=self.plugins, conf=self.conf, ports=self.ports,
                         home=home, epmd_port=self.epmd_port, log=self.log)
            for i in range(self.size)]
        # Side by side: each start mostly waits for its Erlang VM to boot.
        errors: list[BaseException] = []

        def start(node: RabbitMQNode) -> None:
            try:
                node.start()
            except BaseException as e:  # (re-raised below, in the caller's thread)
                errors.append(e)

        threads = [threading.Thread(target=start, args=(n,), daemon=True) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.nodename)
            node.ctl("start_app", timeout=self.start_timeout)
            node.ctl("await_startup", "--timeout", str(int(self.start_timeout)),
                     timeout=self.start_timeout + 10)
            node._wait_listeners(time.monotonic() + self.start_timeout)
            self.log(f"rabbitmq: {node.nodename} joined {first.nodename}")
        first.ctl("await_online_nodes", str(self.size), "--timeout", str(int(self.start_timeout)),
                  timeout=self.start_timeout + 10)
        self.log(f"rabbitmq: cluster of {self.size} ready: " + ", ".join(
            f"{n.nodename} on {n.host}:{n.port}" for n in self.nodes))

    def stop(self) -> None:
        """Stop every node (removing its directory) and the shared epmd and HOME."""
        for node in self.nodes:
            if node.alive():  # a node left SIGSTOPped would not answer `rabbitmqctl stop`
                node.send_signal(signal.SIGCONT)
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        if self.epmd is not None:
            kill_tree(self.epmd, grace=2.0)
            self.epmd = None
        if self.home:
            _discard(self.home, self.keep_tmp, self.log)
            self.home = None

    def __enter__(self) -> "RabbitMQCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------
# command line


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum, frame):
    raise _Interrupted(f"signal {signum}")


def _run(args) -> int:
    node = RabbitMQNode(args.nodename, server=args.rabbitmq_server,
                        rabbitmqctl=args.rabbitmqctl, start_timeout=args.start_timeout,
                        keep_tmp=args.keep_tmp, plugins=args.plugins, conf=args.conf)

    def environ() -> dict[str, str]:
        env = {"WARREN_TEST_BROKER": f"{node.host}:{node.port}",
               "WARREN_TEST_RABBITMQCTL": node.ctl_command}
        if node.mgmt_api:
            env["WARREN_TEST_MGMT"] = node.mgmt_api
        if node.prometheus_port:
            env["WARREN_TEST_PROMETHEUS"] = f"{node.host}:{node.prometheus_port}"
        return env

    def died() -> str | None:
        return None if node.alive() else f"RabbitMQ node died during the run; last log lines:\n{node.log_tail()}"

    return _run_command(args.cmd, node.start, node.stop, environ, died,
                        lambda: f"RabbitMQ {node.version} at {node.host}:{node.port}")


def _run_cluster(args) -> int:
    cluster = RabbitMQCluster(args.nodes, name_prefix=args.name_prefix, server=args.rabbitmq_server,
                              rabbitmqctl=args.rabbitmqctl, start_timeout=args.start_timeout,
                              keep_tmp=args.keep_tmp, plugins=args.plugins, conf=args.conf)

    def environ() -> dict[str, str]:
        first = cluster[0]
        env = {"WARREN_TEST_CLUSTER": ",".join(cluster.amqp_addresses),
               "WARREN_TEST_CLUSTER_NODES": ",".join(cluster.nodenames),
               "WARREN_TEST_BROKER": f"{first.host}:{first.port}",
               "WARREN_TEST_RABBITMQCTL": first.ctl_command}
        if first.mgmt_api:
            env["WARREN_TEST_CLUSTER_MGMT"] = ",".join(f"{n.host}:{n.mgmt_port}" for n in cluster.nodes)
            env["WARREN_TEST_MGMT"] = first.mgmt_api
        if first.prometheus_port:
            env["WARREN_TEST_PROMETHEUS"] = f"{first.host}:{first.prometheus_port}"
        return env

    def died() -> str | None:
        # (the command may have killed or stopped nodes itself: only say so)
        gone = [n.nodename for n in cluster.nodes if not n.alive()]
        return f"RabbitMQ nodes not running at the end of the run: {', '.join(gone)}" if gone else None

    return _run_command(args.cmd, cluster.start, cluster.stop, environ, died,
                        lambda: f"a RabbitMQ {cluster[0].version} cluster of {len(cluster)} nodes")


def _run_command(cmd: list[str], start: Callable[[], object], stop: Callable[[], None],
                 environ: Callable[[], dict[str, str]], died: Callable[[], str | None],
                 describe: Callable[[], str]) -> int:
    """Start the broker(s), run CMD with environ() added to its environment, stop them,
    return CMD's exit status."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        _log("no command given (usage: rabbitmq_node.py run|cluster [options] -- CMD...)")
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    atexit.register(kill_all_children)
    proc = None
    try:
        try:
            start()
        except RabbitMQNodeError as e:
            _log(f"could not start RabbitMQ: {e}")
            return 2
        env = dict(os.environ)
        extra = environ()
        env.update(extra)
        _log(f"running against {describe()}: {shlex.join(cmd)}")
        for k, v in extra.items():
            _log(f"  {k}={v}")
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as e:
            _log(f"could not run {cmd[0]}: {e}")
            return 127
        rc = proc.wait()
        why = died()
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
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish stopping the node(s)
        stop()
        kill_all_children()
        _log("rabbitmq: stopped")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run a private RabbitMQ node, or a cluster of them.")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="start a node, run CMD with WARREN_TEST_BROKER and "
                    "WARREN_TEST_RABBITMQCTL set for it, stop the node, exit with CMD's status",
        usage="%(prog)s [options] -- CMD...")
    run.add_argument("--nodename", default=None,
                     help="node name (default warren-test-<pid>@localhost)")
    cluster = sub.add_parser(
        "cluster", help="start a cluster of nodes (joined with rabbitmqctl join_cluster), run CMD "
                        "with WARREN_TEST_CLUSTER (AMQP host:port of each node), WARREN_TEST_CLUSTER_NODES "
                        "(node names), WARREN_TEST_CLUSTER_MGMT (management host:port of each, with "
                        "the plugin) and the first node's WARREN_TEST_BROKER, WARREN_TEST_RABBITMQCTL "
                        "set, stop the nodes, exit with CMD's status",
        usage="%(prog)s [--nodes N] [options] -- CMD...")
    cluster.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    cluster.add_argument("--name-prefix", default="rabbit",
                         help="node names are PREFIX-a@localhost, PREFIX-b@localhost, ... (default rabbit)")
    for p, timeout in ((run, 60.0), (cluster, 90.0)):
        p.add_argument("--rabbitmq-server", default=None,
                       help="rabbitmq-server script (default /usr/lib/rabbitmq/bin/rabbitmq-server)")
        p.add_argument("--rabbitmqctl", default=None,
                       help="rabbitmqctl script (default /usr/lib/rabbitmq/bin/rabbitmqctl)")
        p.add_argument("--start-timeout", type=float, default=timeout,
                       help=f"seconds to wait for a node to start (default {timeout:.0f})")
        p.add_argument("--keep-tmp", action="store_true",
                       help="keep the temporary directories (data, logs)")
        p.add_argument("--plugins", default=[], type=lambda v: [p for p in v.split(",") if p],
                       help="comma-separated plugins to enable, e.g. rabbitmq_management "
                            "(default none); with it, WARREN_TEST_MGMT is set too (with "
                            "rabbitmq_prometheus, WARREN_TEST_PROMETHEUS)")
        p.add_argument("--conf", default=[], action="append", metavar="'KEY = VALUE'",
                       help="a line for the node's rabbitmq.conf (repeatable), e.g. "
                            "'listeners.ssl.default = 5671'")
        p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run")
    args = ap.parse_args(argv)
    return _run_cluster(args) if args.command == "cluster" else _run(args)


if __name__ == "__main__":
    sys.exit(main())
