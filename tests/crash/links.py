"""What the fault tests of links between brokers (shovels, federation) share: a publisher that
publishes uniquely numbered messages with confirms through the faults, a collector that drains
the destination until every confirmed message is there, the checker that counts what was lost,
unexpected, duplicated or damaged, a network namespace whose link to this one a test cuts
(a partition) and heals, and a Warren broker the test kills, stops or cuts off (WarrenProcess).

Brokers are addressed as (host, port), guest/guest, vhost "/": a broker killed and restarted
comes back on the same port, so a publisher or collector just reconnects.
"""

from __future__ import annotations

import collections
import ctypes
import ipaddress
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import pika
import pika.exceptions

from conftest import free_port, scratch_dir

logging.getLogger("pika").setLevel(logging.CRITICAL)  # every refused reconnect is logged otherwise

BODY_SIZE = 1024
# What a dead, stopped or unreachable broker raises at a client (pika's errors, or the socket's).
CONNECTION_ERRORS = (pika.exceptions.AMQPError, OSError)


def params(host: str, port: int, **kwargs) -> pika.ConnectionParameters:
    """guest/guest on vhost "/", with short timeouts: a client of a stopped or partitioned
    broker gives up within seconds, and the caller retries."""
    kwargs.setdefault("heartbeat", 5)
    kwargs.setdefault("socket_timeout", 3)
    kwargs.setdefault("stack_timeout", 5)
    kwargs.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters(host, port, "/", pika.PlainCredentials("guest", "guest"), **kwargs)


def amqp_uri(host: str, port: int, **query) -> str:
    """The URI a link uses to reach a broker (query: e.g. heartbeat=2)."""
    tail = "&".join(f"{k}={v}" for k, v in query.items())
    return f"amqp://guest:guest@{host}:{port}/%2f" + (f"?{tail}" if tail else "")


def payload(message_id: str) -> bytes:
    """The body published with a message id: BODY_SIZE bytes that the checker can verify."""
    head = message_id.encode() + b":"
    return (head * (BODY_SIZE // len(head) + 1))[:BODY_SIZE]


def connect(host: str, port: int, timeout: float) -> pika.BlockingConnection:
    """A connection, retried until `timeout` seconds have passed (the broker may be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(params(host, port))
        except CONNECTION_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def declare(host: str, port: int, *queues: str) -> None:
    """Durable queues, declared before the link starts."""
    with pika.BlockingConnection(params(host, port)) as conn:
        ch = conn.channel()
        for queue in queues:
            ch.queue_declare(queue, durable=True)


def depth(host: str, port: int, queue: str) -> int:
    """The queue's ready messages (queue.declare-ok's message_count)."""
    with pika.BlockingConnection(params(host, port)) as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def wait_depth(host: str, port: int, queue: str, at_least: int, timeout: float) -> int:
    """Wait until the queue holds `at_least` ready messages (the link is moving them)."""
    deadline = time.monotonic() + timeout
    while True:
        got = depth(host, port, queue)
        if got >= at_least:
            return got
        assert time.monotonic() < deadline, f"{queue} got {got} messages in {timeout} s, not {at_least}"
        time.sleep(0.05)


class ConfirmedPublisher(threading.Thread):
    """Publishes `count` persistent messages, each with a unique message_id and its payload(),
    to a queue (default exchange), waiting for each one's confirm, at most `rate` a second.
    A connection that dies (the broker was killed, stopped, cut off) is opened again and the
    publisher goes on with the next id: the one in flight is in `attempted`, not `confirmed`.
    Gives up `timeout` seconds after its start."""

    def __init__(self, host: str, port: int, queue: str, count: int, *, rate: float | None = None,
                 timeout: float = 90.0, exchange: str = ""):
        super().__init__(name=f"publisher to {exchange or queue}", daemon=True)
        self.host, self.port, self.queue, self.count = host, port, queue, count
        self.exchange = exchange  # (then `queue` is the routing key)
        self.rate, self.timeout = rate, timeout
        self.prefix = uuid.uuid4().hex[:8]
        self.attempted: list[str] = []
        self.confirmed: list[str] = []
        self.nacked: list[str] = []
        self.connections = 0  # how many it opened (1 + reconnections)

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        started = time.monotonic()
        i = 0
        while i < self.count and time.monotonic() < deadline:
            try:
                conn = pika.BlockingConnection(params(self.host, self.port))
            except CONNECTION_ERRORS:
                time.sleep(0.1)
                continue
            self.connections += 1
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                while i < self.count:
                    if self.rate:
                        time.sleep(max(0.0, started + i / self.rate - time.monotonic()))
                    message_id = f"{self.prefix}-{i:07d}"
                    i += 1
                    self.attempted.append(message_id)
                    try:
                        # (not mandatory: a message an exchange routes nowhere is confirmed
                        # all the same, and then lost)
                        ch.basic_publish(self.exchange, self.queue, payload(message_id),
                                         pika.BasicProperties(delivery_mode=2, message_id=message_id))
                    except pika.exceptions.NackError:
                        self.nacked.append(message_id)
                        continue
                    self.confirmed.append(message_id)
                conn.close()
            except CONNECTION_ERRORS:
                pass  # reconnect, and go on with the next id


@dataclass
class Collected:
    """What a destination queue gave: (message_id, body) of every message, in order, and
    what was left behind when the collector stopped."""

    messages: list[tuple[str | None, bytes]] = field(default_factory=list)
    missing: int = 0            # confirmed ids that had not arrived when it stopped
    source_left: int | None = None  # ready messages still in the source queue then
    seconds: float = 0.0


def collect(dest: tuple[str, int], queue: str, confirmed: list[str], *,
            source: tuple[str, int, str] | None = None, timeout: float = 45.0,
            settle: float = 1.0) -> Collected:
    """Drain `queue` (auto-ack) until every confirmed message id has arrived and the source
    queue (host, port, queue) is empty, then for `settle` seconds more (late duplicates), or
    until `timeout` seconds have passed. Run it once the faults are over."""
    start = time.monotonic()
    deadline = start + timeout
    wanted = set(confirmed)
    got = Collected()
    seen: set[str | None] = set()

    def source_left() -> int | None:
        try:
            return depth(*source) if source else 0
        except CONNECTION_ERRORS:
            return None

    settle_until = None
    with connect(*dest, timeout) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.25):
            if method is not None:
                got.messages.append((props.message_id, body))
                seen.add(props.message_id)
                continue
            now = time.monotonic()
            if settle_until is not None:
                if now >= settle_until:
                    break
            elif wanted <= seen and source_left() == 0:
                settle_until = now + settle
            elif now > deadline:
                break
        ch.cancel()
    got.source_left = source_left()
    got.missing = len(wanted - seen)
    got.seconds = time.monotonic() - start
    return got


@dataclass
class Tally:
    """The checker's counts. lost: confirmed by the source but never arrived; unexpected:
    arrived but never published (or without a message id); duplicated: copies beyond the
    first, by id; damaged: arrived with another body than the one published."""

    published: int
    confirmed: int
    received: int
    lost: list[str]
    unexpected: list[str | None]
    duplicated: dict[str, int]
    damaged: list[str]
    source_left: int | None = None

    def __str__(self) -> str:
        extra = self.duplicated_copies
        return (f"{self.published} published, {self.confirmed} confirmed, {self.received} received: "
                f"{len(self.lost)} lost, {len(self.unexpected)} unexpected, {extra} duplicated "
                f"({len(self.duplicated)} ids), {len(self.damaged)} damaged"
                + (f"; {self.source_left} still in the source" if self.source_left else ""))

    @property
    def duplicated_copies(self) -> int:
        return sum(self.duplicated.values())

    def check(self) -> None:
        """lost, unexpected and damaged must be 0; duplicates are allowed (at least once)."""
        assert not self.lost and not self.unexpected and not self.damaged, (
            f"{self}; lost e.g. {sorted(self.lost)[:5]}, unexpected e.g. {self.unexpected[:5]}, "
            f"damaged e.g. {self.damaged[:5]}")


def tally(publisher: ConfirmedPublisher, collected: Collected) -> Tally:
    attempted = set(publisher.attempted)
    counts = collections.Counter(message_id for message_id, _ in collected.messages)
    damaged = sorted({message_id for message_id, body in collected.messages
                      if message_id in attempted and body != payload(message_id)})
    return Tally(
        published=len(publisher.attempted), confirmed=len(publisher.confirmed),
        received=len(collected.messages),
        lost=sorted(set(publisher.confirmed) - set(counts)),
        unexpected=[message_id for message_id in counts if message_id not in attempted],
        duplicated={message_id: n - 1 for message_id, n in counts.items() if n > 1},
        damaged=damaged, source_left=collected.source_left)


# ------------------------------------------------------------------ partitions
_CLONE_NEWNET = 0x40000000


def netns_unavailable() -> str | None:
    """Why this process cannot make network namespaces (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


class Netns:
    """A network namespace joined to this one by a veth pair, both ends up: a process started
    in it (preexec_fn=netns.enter) listens on ns_addr, which this namespace reaches over the
    pair, and reaches this namespace at root_addr (an address of this namespace, so its own
    processes reach it locally, not over the pair).

    cut() takes the namespace's end of the pair down: nothing crosses any more, in either
    direction, and nobody is told: packets from here are dropped without an answer (the peer's
    carrier is gone), the namespace has no route out. heal() brings it up again: connections
    whose ends are still alive carry on."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(100)}"
        self.name = f"warren-part-{tag}"
        self.root_dev, self.ns_dev = f"wpr{tag}", f"wpn{tag}"  # (15 characters at most)
        self.root_addr, self.ns_addr = self._free_subnet()
        self.made = False
        self.paths: list[Path] = []

    @staticmethod
    def _free_subnet() -> tuple[str, str]:
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        while True:
            net = ipaddress.ip_network(f"10.231.{random.randrange(256)}.{4 * random.randrange(64)}/30")
            root, ns = list(net.hosts())
            if f" {root}/" not in used and f" {ns}/" not in used:
                return str(root), str(ns)

    def _ip(self, *args: str, ns: bool = False) -> None:
        argv = ["ip", *(("-n", self.name) if ns else ()), *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def create(self) -> "Netns":
        self._ip("netns", "add", self.name)
        self.made = True
        self._ip("link", "add", self.root_dev, "type", "veth", "peer", "name", self.ns_dev, "netns", self.name)
        self._ip("addr", "add", f"{self.root_addr}/30", "dev", self.root_dev)
        self._ip("link", "set", self.root_dev, "up")
        self._ip("addr", "add", f"{self.ns_addr}/30", "dev", self.ns_dev, ns=True)
        self._ip("link", "set", "lo", "up", ns=True)
        self.heal()
        return self

    def enter(self) -> None:
        """preexec_fn of a process to run in the namespace (setns(2) before exec)."""
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def cut(self) -> None:
        self._ip("link", "set", self.ns_dev, "down", ns=True)

    def heal(self) -> None:
        self._ip("link", "set", self.ns_dev, "up", ns=True)

    def add_path(self) -> "Path":
        """Another veth pair into the namespace, with addresses of its own, cut and healed on
        its own: what a process in the namespace reaches at its root_addr stays reachable
        while the first pair is cut (a partial partition)."""
        path = Path(self, f"{self.root_dev}b", f"{self.ns_dev}b")
        self.paths.append(path)
        return path

    def close(self) -> None:
        """Remove the pairs and the namespace (kill the processes in it first)."""
        if not self.made:
            return
        for path in self.paths:
            subprocess.run(["ip", "link", "del", path.root_dev], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.root_dev], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        self.made = False


class Path:
    """A further veth pair into a Netns (Netns.add_path)."""

    def __init__(self, netns: Netns, root_dev: str, ns_dev: str):
        self.netns, self.root_dev, self.ns_dev = netns, root_dev, ns_dev
        self.root_addr, self.ns_addr = netns._free_subnet()
        ip = netns._ip
        ip("link", "add", root_dev, "type", "veth", "peer", "name", ns_dev, "netns", netns.name)
        ip("addr", "add", f"{self.root_addr}/30", "dev", root_dev)
        ip("link", "set", root_dev, "up")
        ip("addr", "add", f"{self.ns_addr}/30", "dev", ns_dev, ns=True)
        self.heal()

    def cut(self) -> None:
        self.netns._ip("link", "set", self.ns_dev, "down", ns=True)

    def heal(self) -> None:
        self.netns._ip("link", "set", self.ns_dev, "up", ns=True)


# ------------------------------------------------------------------ a Warren broker
def suite_ports(n: int) -> list[int]:
    """The test suite's ports (below the kernel's ephemeral range, conftest.free_port), so that
    no client's connection takes a killed node's port before it is restarted."""
    return [free_port() for _ in range(n)]


class WarrenProcess:
    """A Warren broker that a scenario kills (and restarts on its port and data dir), stops and
    continues. host: where the test and the other broker reach it. In a network namespace
    (netns), or also listening on addresses of the veth pair (listen), it takes guest's logins
    from there, and its management API listens on host."""

    def __init__(self, make_broker, *, host: str = "127.0.0.1", netns: Netns | None = None,
                 listen: tuple[str, ...] = ()):
        self.make_broker = make_broker
        self.host = host
        self.netns = netns
        self.args: tuple[str, ...] = ()
        if netns is not None or listen:
            conf = os.path.join(scratch_dir("warren-link-"), "warren.conf")
            with open(conf, "w") as f:
                f.write(f"loopback_users = none\nmanagement.tcp.ip = {host}\nprometheus.tcp.port = 0\n")
            addresses = (host,) if netns is not None else ("127.0.0.1", *listen)
            self.args = ("--config", conf, *(a for address in addresses for a in ("--host", address)))
        self.b = self._start()

    def _start(self, **kwargs):
        if self.netns is None:
            return self.make_broker(*self.args, **kwargs)
        b = self.make_broker(*self.args, wait=False, preexec_fn=self.netns.enter, **kwargs)
        deadline = time.monotonic() + 15
        while True:  # (start_broker's wait looks for it on 127.0.0.1, of this namespace)
            assert b.proc.poll() is None, b.log()
            try:
                socket.create_connection((self.host, b.port), timeout=0.2).close()
                return b
            except OSError:
                assert time.monotonic() < deadline, f"the broker in the namespace did not listen:\n{b.log()}"
                time.sleep(0.05)

    @property
    def port(self) -> int:
        return self.b.port

    def kill(self) -> None:
        self.b.proc.send_signal(signal.SIGKILL)
        self.b.proc.wait()

    def restart(self) -> None:
        self.b = self._start(data_dir=self.b.data_dir, port=self.b.port)

    def send_signal(self, sig: int) -> None:
        self.b.proc.send_signal(sig)

    def check_log(self) -> None:
        assert "Traceback" not in self.b.log(), self.b.log()[-3000:]

    def log_tail(self) -> str:
        return "".join(self.b.log().splitlines(keepends=True)[-40:])


# ------------------------------------------------------------------ the faults
def kill9(broker):
    """A fault: kill -9 the broker, then start it again on its port and data."""
    def fault():
        broker.kill()
        time.sleep(0.5)  # (the links notice)
        broker.restart()
    return fault


def stop(broker, pause: float):
    """A fault: SIGSTOP the broker for `pause` seconds, then SIGCONT."""
    def fault():
        broker.send_signal(signal.SIGSTOP)
        try:
            time.sleep(pause)
        finally:
            broker.send_signal(signal.SIGCONT)
    return fault


def partition(netns: Netns, pause: float):
    """A fault: cut the namespace's link for `pause` seconds, then heal it."""
    def fault():
        netns.cut()
        try:
            time.sleep(pause)
        finally:
            netns.heal()
    return fault
