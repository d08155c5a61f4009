"""A replicated stream whose leader is cut off by a network partition, from everything: etcd
and the other two nodes (test_quorum_partitions.py's PartitionedCluster: c in a network
namespace of its own). As RabbitMQ 3.10's streams (osiris) confirm a publish once a majority
of the replicas wrote it, the cut-off leader confirms nothing it is sent; the majority side
elects a new leader once the old one's lease (5 s) is gone and confirms again; healed, the old
leader follows, its unreplicated tail dropped: every replica read from "first" holds the same
messages at the same offsets, every confirmed one among them (the total-queue check).

Warren only: the test runs a Warren node in a network namespace; RabbitMQ's cluster
(WARREN_TEST_RABBITMQ_CLUSTER=1) is not cut this way, so there is no RabbitMQ variant."""

from __future__ import annotations

import time

import requests

from .members import Member, wait_for
from .test_membership import nodes
from .test_metadata_faults import netns  # noqa: F401  (the fixture)
from .test_quorum_partitions import NAMES, PartitionedCluster, no_tracebacks, publishers_around
from .test_stream_faults import ids
from .test_stream_replication import STREAM, publish, read, shown
from .total_queue import check


class Reached(Member):
    """A PartitionedCluster's node behind members.py's interface (what read, publish and
    shown take): its name, and where this namespace reaches its AMQP port and API."""

    def __init__(self, broker) -> None:
        self.name, self.host, self.port, self.api = broker.name, broker.host, broker.port, broker.api


def placed(member: Member, stream: str) -> tuple[str | None, list[str]]:
    """(leader's node, sorted online members) of the stream as `member`'s API shows it
    ((None, []): no answer)."""
    try:
        answer = shown(member, stream)
    except requests.RequestException:
        return None, []
    return answer.get("node"), sorted(answer.get("online", []))


def test_a_partitioned_stream_leader_is_replaced_confirms_nothing_alone_and_rejoins_as_a_follower(
        make_etcd, netns):  # noqa: F811
    """c declares (and so leads) the stream; publishers confirm through a and b (outside) and,
    from inside c's namespace, through c; c is cut off for 14 s (past its lease, and past the
    silence that ends a node link), then healed."""
    cluster = PartitionedCluster(make_etcd, netns, etcd_apart=False)
    a, b, c = (Reached(broker) for broker in (cluster.a, cluster.b, cluster.c))
    try:
        for member in (a, b, c):
            wait_for(lambda: nodes(member) == dict.fromkeys(NAMES, True), timeout=20, what="three running")
        connection = c.connect()
        connection.channel().queue_declare("sq-cut", durable=True, arguments=STREAM)
        connection.close()
        wait_for(lambda: all(placed(m, "sq-cut") == (c.name, NAMES) for m in (a, b, c)), timeout=20,
                 what="c leading, every replica online")
        outside, inside = publishers_around(a, b, c, netns, "sq-cut")
        cut = time.monotonic()
        netns.cut()
        severed = time.monotonic()  # (`ip` took a while: the link is down from here at the latest)
        try:
            wait_for(lambda: placed(a, "sq-cut")[0] in (a.name, b.name), timeout=20, what="a new leader")
            elected = time.monotonic()
            wait_for(lambda: outside.last_confirm > elected, timeout=15, what="confirms again through a and b")
            time.sleep(max(0.0, cut + 14 - time.monotonic()))
        finally:
            healed = time.monotonic()
            netns.heal()
        new_leader = placed(a, "sq-cut")[0]
        assert placed(b, "sq-cut")[0] == new_leader
        wait_for(lambda: all(placed(m, "sq-cut") == (new_leader, NAMES) for m in (a, b, c)), timeout=30,
                 what="c following the new leader")
        wait_for(lambda: inside.last_confirm > healed and outside.last_confirm > healed + 1, timeout=30,
                 what="confirms through c again")
        outside.finish()
        inside.finish()
        # c, cut off, confirmed nothing it was sent once cut: no other replica could have it.
        # (What it was sent before may be confirmed later: the followers had written it.)
        sends = list(zip(inside.confirmed_sends, inside.confirm_times))
        alone = sum(1 for sent, confirmed in sends if severed <= sent and confirmed < healed)
        assert alone == 0, f"c confirmed {alone} publishes while cut off"
        publish(a, "sq-cut", [b"end"])
        reads = {m.name: read(m, "sq-cut", b"end", timeout=60) for m in (a, b, c)}
        first = reads[a.name]
        for name, got in reads.items():
            assert [offset for offset, _ in got] == list(range(len(got))), f"{name}'s offsets have gaps"
            assert got == first, f"{name} holds other messages at some offsets than {a.name}"
        outcome = check([outside, inside], ids(first), at_least=200)
        print(f"{outcome}; new leader {new_leader} {elected - cut:.1f} s after the cut; c's publisher while "
              f"cut off: {[why for t, why in inside.failures if cut <= t][:3]}; sent to c while cut off and "
              f"confirmed after healing: {sum(1 for sent, _ in sends if severed <= sent < healed)}")
        no_tracebacks(*cluster.brokers)
    finally:
        cluster.stop()
