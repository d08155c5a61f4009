"""A replicated quorum queue under the faults other than a leader's kill -9 (which
test_quorum_faults.py does): its leader cut off by a network partition (from everything, or
from its followers only, still reaching etcd), etcd losing its majority, every node restarted
in turn under load, and a follower catching up 100,000 messages before it has to lead. Each
ends with the total-queue check (total_queue.py): no confirmed message lost, nothing
unexpected, duplicates only of unconfirmed publishes or redeliveries."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import uuid

import pika
import pytest
import requests

from conftest import free_port, start_broker
from crash.links import Netns

from .conftest import cluster_conf, dist_lines
from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import nodes, wait_for
from .test_metadata_faults import netns  # noqa: F401  (the fixture)
from .total_queue import (AUTH, QQ, Batch, Consumer, Publisher, check, leader, online, publish_windows, read_all,
                          records)

NAMES = [f"warren-{n}@localhost" for n in "abc"]


def declare(node, queue: str) -> None:
    """The quorum queue, declared through `node` (its leader: the declaring node)."""
    connection = pika.BlockingConnection(node.pika_params())
    connection.channel().queue_declare(queue, durable=True, arguments=QQ)
    connection.close()


def no_tracebacks(*brokers) -> None:
    for broker in brokers:
        assert "Traceback" not in broker.log(), broker.log()[-3000:]


def listed(broker, queue: str) -> dict | None:
    """The queue's node and state as `broker` lists it (GET /api/queues/%2F)."""
    try:
        answer = requests.get(f"{broker.api}/queues/%2F", auth=AUTH, timeout=5)
    except requests.RequestException:
        return None
    return next(({"node": q["node"], "state": q["state"]} for q in answer.json() if q["name"] == queue), None)


def in_sync(endpoint: str, prefix: str) -> list[str]:
    """The one queue's ISR, as its record in etcd has it (every member: no record yet)."""
    found = records(endpoint, prefix)
    return sorted(found[0]["isr"]) if found else sorted(NAMES)


def all_online(brokers, queue: str) -> bool:
    return all(online(broker, queue) == sorted(NAMES) for broker in brokers)


# ------------------------------------------------------------------ a partition
class PartitionedCluster:
    """Three nodes on one etcd cluster: a and b in this network namespace, c in `netns`, cut
    off from a, b and this namespace's clients by netns.cut(), and from etcd too unless
    `etcd_apart` (then c reaches etcd over a second veth pair that is never cut). Every node's
    node links listen on an address both namespaces reach; each node also takes AMQP on
    127.0.0.1 of its own namespace (a client thread inside the namespace reaches c there
    while it is cut off)."""

    def __init__(self, make_etcd, netns: Netns, etcd_apart: bool):  # noqa: F811
        self.netns = netns
        self.etcd = make_etcd(3, everywhere=True)
        self.prefix = "t-" + uuid.uuid4().hex[:10]
        self.brokers: list = []
        path = netns.add_path() if etcd_apart else None
        etcd_from_c = [f"{(path or netns).root_addr}:{m.client_port}" for m in self.etcd.members]
        self.a = self._start(NAMES[0], netns.root_addr, self.etcd.endpoints)
        self.b = self._start(NAMES[1], netns.root_addr, self.etcd.endpoints)
        # (c's API on the path that stays, if there is one)
        self.c = self._start(NAMES[2], netns.ns_addr, etcd_from_c, api=(path or netns).ns_addr)

    def _start(self, name: str, address: str, endpoints: list[str], api: str | None = None):
        inside = api is not None
        conf = cluster_conf(endpoints, self.prefix, "loopback_users = none",
                            *((f"management.tcp.ip = {api}",) if inside else ()), *dist_lines(free_port()))
        # (the first address is the node links' and the one the others dial)
        broker = start_broker("--node-name", name, "--config", conf, "--host", address, "--host", "127.0.0.1",
                              "--prometheus-port", "0", wait=False,
                              preexec_fn=self.netns.enter if inside else None)
        self.brokers.append(broker)
        broker.name = name
        if inside:
            broker.host, broker.api_host = address, api
        deadline = time.monotonic() + 20
        while True:
            assert broker.proc.poll() is None, broker.log()
            try:
                socket.create_connection((broker.host, broker.port), timeout=0.2).close()
                return broker
            except OSError:
                assert time.monotonic() < deadline, broker.log()
                time.sleep(0.05)

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop(signal.SIGKILL)


def publishers_around(a, b, c, netns: Netns, queue: str) -> tuple[Publisher, Publisher]:  # noqa: F811
    """Publishers to `queue`, started and confirming: through a and b (outside), and from
    inside c's namespace through c. (The inside one's publishes are not mandatory: one c cannot
    get to the queue's leader must wait for it, never be confirmed as if it had been routed
    nowhere.)"""
    outside = Publisher([a, b], queue)
    inside = Publisher([c], queue, base=10_000_000, enter=netns.enter, mandatory=False,
                       params=lambda _: pika.ConnectionParameters(
                           "127.0.0.1", c.port, credentials=pika.PlainCredentials("guest", "guest"),
                           socket_timeout=5, blocked_connection_timeout=5))
    outside.start()
    inside.start()
    wait_for(lambda: len(outside.confirmed) > 50 and len(inside.confirmed) > 50, timeout=20,
             what="confirms through every node")
    return outside, inside


def partition_the_leader(make_etcd, netns: Netns, etcd_apart: bool) -> None:  # noqa: F811
    """c leads the queue; publishers go through a and b (outside) and, from inside c's
    namespace, through c; c is cut off for 14 s (past its lease, and past the silence that ends
    a node link), then healed."""
    cluster = PartitionedCluster(make_etcd, netns, etcd_apart)
    a, b, c = cluster.a, cluster.b, cluster.c
    try:
        for broker in (a, b, c):
            wait_for(lambda: nodes(broker) == dict.fromkeys(NAMES, True), timeout=20, what="three running")
        declare(c, "qq-cut")
        wait_for(lambda: all_online((a, b, c), "qq-cut") and leader(a, "qq-cut") == c.name, what="c leading")
        outside, inside = publishers_around(a, b, c, netns, "qq-cut")
        cut = time.monotonic()
        netns.cut()
        severed = time.monotonic()  # (`ip` took a while: the link is down from here at the latest)
        try:
            wait_for(lambda: leader(a, "qq-cut") in (a.name, b.name), timeout=20, what="a new leader")
            elected = time.monotonic()
            wait_for(lambda: outside.last_confirm > elected, timeout=15, what="confirms again through a and b")
            if etcd_apart:
                # c, still running for the others, learns of its successor from etcd: it
                # follows (its queue a stand-in), and what it could not commit waits to be
                # sent to the new leader, out of its reach.
                new_leader = leader(a, "qq-cut")
                # (its API lists the queue as down: its leader is out of reach)
                wait_for(lambda: listed(c, "qq-cut") == {"node": new_leader, "state": "down"}, timeout=10,
                         what="c stepping down while cut off")
            time.sleep(max(0.0, cut + 14 - time.monotonic()))
            assert nodes(a)[c.name] == etcd_apart  # (running, for the others, only while its lease is renewed)
        finally:
            healed = time.monotonic()
            netns.heal()
        new_leader = leader(a, "qq-cut")
        assert leader(b, "qq-cut") == new_leader
        # c, cut off, confirmed nothing it was sent once cut: its followers never got it.
        # (What it was sent before may be confirmed later: its followers had acknowledged it,
        # and its own fsync, or the confirm, came late on a loaded machine.)
        alone = sum(1 for sent, confirmed in zip(inside.confirmed_sends, inside.confirm_times)
                    if severed <= sent and confirmed < healed)
        assert alone == 0, f"c confirmed {alone} publishes while cut off"
        # Nor did it nack one: what c held unconfirmed, as the leader deposed or through its
        # stand-in, waited to go to the new leader, as RabbitMQ's quorum queue client resends
        # its pending publishes to the next leader (RESEND_FOR: 30 s, the cut is 14 s).
        told = [why for t, why in inside.failures if cut <= t]
        assert not told, f"c's publisher was told while cut off: {told[:3]}"
        # Healed: c follows the new leader (its queue a stand-in), and takes publishes again.
        wait_for(lambda: leader(c, "qq-cut") == new_leader and all_online((a, b, c), "qq-cut"), timeout=30,
                 what="c following the new leader")
        wait_for(lambda: inside.last_confirm > healed and outside.last_confirm > healed + 1, timeout=30,
                 what="confirms through c again")
        outside.finish()
        inside.finish()
        outcome = check([outside, inside], read_all(a, "qq-cut"), at_least=200)
        print(f"{outcome}; new leader {new_leader} confirmed {elected - cut:.1f} s after the cut;"
              f" c's publisher while cut off: {[why for t, why in inside.failures if cut <= t][:3]}")
        no_tracebacks(a, b, c)
    finally:
        cluster.stop()


def test_a_partitioned_leader_is_replaced_confirms_nothing_alone_and_rejoins_as_a_follower(make_etcd, netns):  # noqa: F811
    partition_the_leader(make_etcd, netns, etcd_apart=False)


def test_a_leader_that_reaches_etcd_but_not_its_followers_is_replaced_and_steps_down(make_etcd, netns):  # noqa: F811
    partition_the_leader(make_etcd, netns, etcd_apart=True)


# ------------------------------------------------------------------ etcd's majority lost
def test_confirms_go_on_while_etcd_has_lost_its_majority_and_nothing_is_lost(make_etcd, make_node):
    """Two of etcd's three members stopped (SIGSTOP) for longer than a node's lease: the
    leader and its followers stay linked, and commits need only them, so publishes keep being
    confirmed (an election, or a change of the ISR, would wait for etcd)."""
    etcd = make_etcd(3)
    a, b, c = (make_node(name, on=etcd) for name in NAMES)
    for broker in (a, b, c):
        wait_for(lambda: nodes(broker) == dict.fromkeys(NAMES, True), timeout=20, what="three running")
    declare(a, "qq-etcd")
    wait_for(lambda: all_online((a, b, c), "qq-etcd"), what="every member online")
    publisher = Publisher([a, b, c], "qq-etcd")
    publisher.start()
    wait_for(lambda: len(publisher.confirmed) > 50, timeout=20, what="confirms flowing")
    stopped = etcd.members[1:]
    for member in stopped:
        member.signal(signal.SIGSTOP)
    lost_at = time.monotonic()
    try:
        time.sleep(8)  # (past the nodes' 5 s leases)
    finally:
        for member in stopped:
            member.signal(signal.SIGCONT)
    back = time.monotonic()
    during = publisher.confirms_between(lost_at + 1, back)
    etcd.wait_healthy()
    wait_for(lambda: publisher.last_confirm > back + 2, timeout=20, what="confirms once etcd is back")
    wait_for(lambda: all(nodes(broker) == dict.fromkeys(NAMES, True) for broker in (a, b, c)), timeout=20,
             what="three running again")
    publisher.finish()
    outcome = check([publisher], read_all(a, "qq-etcd"), at_least=200)
    print(f"{outcome}; {during} confirmed while etcd had no majority")
    assert during > 50, f"only {during} confirms in the 7 s without etcd's majority"
    assert leader(b, "qq-etcd") == a.name  # (nobody was elected)
    no_tracebacks(a, b, c)


# ------------------------------------------------------------------ rolling restart
def test_a_rolling_restart_under_load_loses_nothing(three, make_node, etcd):  # noqa: F811
    """Every node stopped (SIGTERM) and started again on its data, one after the other, the
    leader first, while a publisher and a consumer go on through all three; the next waits
    until the last is running and in sync again."""
    nodes_ = list(three)
    declare(nodes_[0], "qq-rolling")
    wait_for(lambda: all_online(nodes_, "qq-rolling"), what="every member online")
    publisher = Publisher(nodes_, "qq-rolling")
    consumer = Consumer(nodes_, "qq-rolling")
    publisher.start()
    wait_for(lambda: len(publisher.confirmed) > 200, timeout=20, what="confirms flowing")
    consumer.start()
    stalls = []
    try:
        for i in range(3):
            wait_for(lambda: sum(consumer.got.values()) > 0, timeout=20, what="the consumer taking messages")
            old = nodes_[i]
            stopped = time.monotonic()
            old.proc.send_signal(signal.SIGTERM)
            assert old.proc.wait(20) == 0, old.log()[-3000:]
            no_tracebacks(old)
            nodes_[i] = make_node(old.name, data_dir=old.data_dir, port=old.port, dist_port=old.dist_port)
            wait_for(lambda: all_online(nodes_, "qq-rolling"), timeout=30, what=f"{old.name} running again")
            wait_for(lambda: in_sync(etcd.endpoints[0], make_node.prefix) == sorted(NAMES), timeout=30,
                     what=f"{old.name} in sync again")
            got_before = sum(consumer.got.values())
            wait_for(lambda: publisher.last_confirm > time.monotonic() - 0.3, timeout=30, what="confirms again")
            times = [stopped, *(t for t in publisher.confirm_times if t > stopped)]
            stalls.append(max(later - earlier for earlier, later in zip(times, times[1:])))
            wait_for(lambda: sum(consumer.got.values()) > got_before, timeout=30, what="deliveries again")
    finally:
        publisher.finish()
        consumer.finish()
    outcome = check([publisher], read_all(nodes_[0], "qq-rolling"), consumers=(consumer,), at_least=500)
    print(f"{outcome}; {sum(consumer.got.values())} consumed meanwhile "
          f"({sum(consumer.redelivered.values())} redelivered); longest wait for a confirm from each stop on: "
          f"{', '.join(f'{s:.1f} s' for s in stalls)}")
    no_tracebacks(*nodes_)


# ------------------------------------------------------------------ catching up
CATCH_UP = 100_000


@pytest.mark.timeout(180)
def test_a_follower_catches_up_100k_messages_then_leads_with_all_of_them(make_node, etcd):
    """A follower killed (-9) while 100,000 confirmed messages are published, started again:
    it catches up and is in the ISR again (the queue's record in etcd); then the leader is
    killed, the caught-up follower (first of the ISR by name) leads, and every confirmed
    message is there."""
    a, b, c = (make_node(name) for name in NAMES)
    for broker in (a, b, c):
        wait_for(lambda: nodes(broker) == dict.fromkeys(NAMES, True), timeout=20, what="three running")
    declare(a, "qq-catch-up")
    wait_for(lambda: all_online((a, b, c), "qq-catch-up"), what="every member online")
    batch = Batch()
    asyncio.run(publish_windows(a.url, "qq-catch-up", range(1000), batch))
    assert len(batch.confirmed) == 1000
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait()
    started = time.monotonic()
    asyncio.run(publish_windows(a.url, "qq-catch-up", range(1000, 1000 + CATCH_UP), batch))
    published = time.monotonic()
    assert len(batch.confirmed) == 1000 + CATCH_UP, f"{1000 + CATCH_UP - len(batch.confirmed)} not confirmed"
    [record] = records(etcd.endpoints[0], make_node.prefix)
    assert record["leader"] == a.name and b.name not in record["isr"], record
    b = make_node(b.name, data_dir=b.data_dir, port=b.port, dist_port=b.dist_port)
    back = time.monotonic()
    wait_for(lambda: b.name in records(etcd.endpoints[0], make_node.prefix)[0]["isr"], timeout=60,
             what="b in the ISR again")
    caught_up = time.monotonic()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    wait_for(lambda: leader(c, "qq-catch-up") == b.name, timeout=20, what="b leading")
    outcome = check([batch], read_all(b, "qq-catch-up"), at_least=1000 + CATCH_UP)
    print(f"{outcome}; published {CATCH_UP} in {published - started:.1f} s, b caught up in "
          f"{caught_up - back:.1f} s")
    no_tracebacks(b, c)

