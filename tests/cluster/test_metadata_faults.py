"""Definitions on every node, under faults: three clients change metadata through three nodes
(each declares uniquely named exchanges and deletes some it declared) while a node is killed
with -9 and restarted, a node is stopped (SIGSTOP) for longer than its lease, etcd's members
are killed in turn, and the third node's network is cut (it runs in a network namespace of
its own). Then the checker: every change a client had acknowledged (declare-ok, delete-ok) is
on every node (lost: 0), nothing is there that no client asked for (unexpected: 0), no deleted
exchange came back, and the three nodes agree. A change whose answer never came (the
connection died meanwhile) may have happened or not."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pika
import pika.exceptions
import pytest
import requests

from conftest import free_port, start_broker
from crash.links import Netns, netns_unavailable

from .conftest import cluster_conf, dist_lines
from .test_membership import wait_for

AUTH = ("guest", "guest")
ERRORS = (pika.exceptions.AMQPError, OSError)


class Client(threading.Thread):
    """Declares x-LABEL-N for N = 0, 1, ... through one node, and deletes every third one it
    declared, until told to stop; reconnects after any failure."""

    def __init__(self, label: str, host: str, port: int):
        super().__init__(daemon=True)
        self.label, self.host, self.port = label, host, port
        self.acked: set[str] = set()      # declare-ok received
        self.deleted: set[str] = set()    # delete-ok received
        self.doomed: set[str] = set()     # every name a delete was sent for (it may have happened)
        self.attempted: set[str] = set()  # every name a declare was sent for
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        channel = None
        while not self.stopping.is_set():
            try:
                if channel is None:
                    params = pika.ConnectionParameters(self.host, self.port, "/", pika.PlainCredentials(*AUTH),
                                                       heartbeat=5, socket_timeout=3, stack_timeout=5,
                                                       blocked_connection_timeout=30)
                    channel = pika.BlockingConnection(params).channel()
                name = f"x-{self.label}-{n}"
                self.attempted.add(name)
                channel.exchange_declare(name, "fanout", durable=True)
                self.acked.add(name)
                n += 1
                if n % 3 == 0:
                    victim = f"x-{self.label}-{n - 2}"
                    self.doomed.add(victim)
                    channel.exchange_delete(victim)
                    self.deleted.add(victim)
            except ERRORS:
                self.failures += 1
                n += 1  # the name's fate is unknown: never used again
                try:
                    if channel is not None:
                        channel.connection.close()
                except ERRORS:
                    pass
                channel = None
                time.sleep(0.2)


def exchanges(host: str, port: int) -> set[str]:
    answer = requests.get(f"http://{host}:{port}/api/exchanges/%2F", auth=AUTH, timeout=10)
    answer.raise_for_status()
    return {x["name"] for x in answer.json() if x["name"].startswith("x-")}


@pytest.fixture
def netns():
    why = netns_unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    ns = Netns().create()
    yield ns
    ns.close()


def start_in(netns: Netns, name: str, conf: str, data_dir: str | None = None, port: int | None = None,
             mgmt_port: int | None = None):
    """A node in the namespace: AMQP and its API on the namespace's address."""
    node = start_broker("--node-name", name, "--config", conf, "--host", netns.ns_addr, "--prometheus-port", "0",
                        *(("--management-port", str(mgmt_port)) if mgmt_port else ()),
                        wait=False, preexec_fn=netns.enter, data_dir=data_dir, port=port)
    deadline = time.monotonic() + 20
    while True:
        assert node.proc.poll() is None, node.log()
        try:
            socket.create_connection((netns.ns_addr, node.port), timeout=0.2).close()
            return node
        except OSError:
            assert time.monotonic() < deadline, node.log()
            time.sleep(0.05)


def test_acknowledged_changes_survive_kills_stops_and_a_partition(make_node, make_etcd, netns):
    etcd = make_etcd(3, everywhere=True)
    a = make_node("warren-a@localhost", on=etcd)
    b = make_node("warren-b@localhost", on=etcd)
    # The third node reaches etcd over the veth pair, and is reached there.
    conf = cluster_conf([f"{netns.root_addr}:{m.client_port}" for m in etcd.members], make_node.prefix,
                        "loopback_users = none", f"management.tcp.ip = {netns.ns_addr}", *dist_lines(free_port()))
    c = start_in(netns, "warren-c@localhost", conf)
    try:
        where = {"a": ("127.0.0.1", a.port, a.mgmt_port), "b": ("127.0.0.1", b.port, b.mgmt_port),
                 "c": (netns.ns_addr, c.port, c.mgmt_port)}
        clients = [Client(label, host, port) for label, (host, port, _) in where.items()]
        for client in clients:
            client.start()
        time.sleep(2)
        # kill -9 of a node, back 2 s later on its port and data.
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        time.sleep(2)
        b = make_node("warren-b@localhost", on=etcd, data_dir=b.data_dir, port=b.port)
        where["b"] = ("127.0.0.1", b.port, b.mgmt_port)
        time.sleep(2)
        # SIGSTOP of a node for longer than its lease.
        a.proc.send_signal(signal.SIGSTOP)
        time.sleep(7)
        a.proc.send_signal(signal.SIGCONT)
        time.sleep(2)
        # etcd's members killed in turn, each back before the next.
        for member in etcd.members:
            member.kill()
            time.sleep(2)
            etcd.restart(member)
            etcd.wait_healthy()
        time.sleep(1)
        # The third node cut off (from etcd and from its client) for 6 s.
        netns.cut()
        time.sleep(6)
        netns.heal()
        time.sleep(4)
        for client in clients:
            client.stopping.set()
        for client in clients:
            client.join(30)
        # The nodes agree, once each has applied what the log holds.
        views = {}

        def agreed():
            views.update({label: exchanges(host, mgmt) for label, (host, _, mgmt) in where.items()})
            return views["a"] == views["b"] == views["c"]
        wait_for(agreed, timeout=20, what="the three nodes to agree")
        final = views["a"]
        acked = set().union(*(cl.acked for cl in clients))
        deleted = set().union(*(cl.deleted for cl in clients))
        attempted = set().union(*(cl.attempted for cl in clients))
        doomed = set().union(*(cl.doomed for cl in clients))
        lost = (acked - doomed) - final  # a delete that had no answer may have happened
        assert acked - doomed, "some declares were never followed by a delete"
        unexpected = final - attempted
        resurrected = deleted & final
        assert (len(lost), len(unexpected), len(resurrected)) == (0, 0, 0), (lost, unexpected, resurrected)
        assert all(len(cl.acked) > 20 for cl in clients), [len(cl.acked) for cl in clients]
        assert clients[1].failures > 0, "the kill reached b's client"  # (a's waits out its stop)
        for node in (a, b, c):
            assert "Traceback" not in node.log(), node.log()[-3000:]
    finally:
        c.stop(signal.SIGKILL)
