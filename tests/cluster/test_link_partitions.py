"""A dynamic shovel whose member is cut off by a network partition, from everything: etcd and
the other two members (test_quorum_partitions.py's PartitionedCluster: c in a network namespace
of its own). RabbitMQ runs a dynamic shovel on one node of its cluster and starts it on another
when that node is gone; Warren's member stops it once its lease (5 s) can have expired, and
another member claims it (warren/cluster/link_owners.py). Healed, the cut-off member has lost
it: every member lists it once, on the other; with ack-mode on-confirm nothing the source
confirmed is lost, and a message arrives twice only if the shovel held it unacked at the cut
(at most its src-prefetch-count).

Warren only: the test runs a Warren node in a network namespace; RabbitMQ's cluster
(WARREN_TEST_RABBITMQ_CLUSTER=1) is not cut this way, so there is no RabbitMQ variant."""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.request

from .members import wait_for
from .test_links import declare, depth, drained, elsewhere, poll, publishing, put_shovel, shovel_once, shovel_value
from .test_membership import nodes
from .test_metadata_faults import netns  # noqa: F401  (the fixture)
from .test_quorum_partitions import NAMES, PartitionedCluster, no_tracebacks
from .test_stream_partitions import Reached

TAKEOVER = 10.0  # seconds for a majority member to run the cut-off member's shovel (its lease: 5 s)


def holder(cluster: PartitionedCluster, link: str) -> str | None:
    """The member holding the link's key in etcd (link_owners.py; None: nobody), read over
    etcd's JSON gateway."""
    key = f"/warren/{cluster.prefix}/clusters/default/links/{link}".encode()
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    with urllib.request.urlopen(f"http://{cluster.etcd.endpoints[0]}/v3/kv/range", body, timeout=5) as response:
        kvs = json.load(response).get("kvs", [])
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def test_a_shovels_member_cut_off_hands_it_over_and_nothing_confirmed_is_lost(make_etcd, netns):  # noqa: F811
    """The shovel "move" from the quorum queue src (led by a) to dest (led by b), run by c;
    a publisher confirms into src through a and b; c is cut off for 12 s (past its lease, and
    past the silence that ends a node link), then healed. (Whichever member claims a new
    shovel first runs it: a and b are paused, SIGSTOP, for the moment it is set through c.)"""
    cluster = PartitionedCluster(make_etcd, netns, etcd_apart=False)
    a, b, c = members = [Reached(broker) for broker in (cluster.a, cluster.b, cluster.c)]
    try:
        for member in members:
            wait_for(lambda: nodes(member) == dict.fromkeys(NAMES, True), timeout=20, what="three running")
        declare(a, "/", "src")
        declare(b, "/", "dest")
        paused = (cluster.a, cluster.b)
        for broker in paused:
            broker.proc.send_signal(signal.SIGSTOP)
        try:
            put_shovel(c, "/", "move", shovel_value("/", "src", "dest"))
            wait_for(lambda: holder(cluster, "shovel/%2F/move") == c.name, timeout=3, what="c claiming the shovel")
        finally:
            for broker in paused:
                broker.proc.send_signal(signal.SIGCONT)
        assert poll(lambda: shovel_once(members, "/", "move"), 20,
                    "the shovel listed once, running, by each member") == c.name
        publisher = publishing([a, b], "/")
        try:
            cut = time.monotonic()
            netns.cut()
            try:
                now = poll(lambda: elsewhere(shovel_once([a, b], "/", "move"), c.name), TAKEOVER,
                           "the shovel running on a or b")
                took = time.monotonic() - cut
                moved = depth(a, "/", "dest")
                wait_for(lambda: depth(a, "/", "dest") > moved + 100, timeout=10, what="the shovel moving on")
                time.sleep(max(0.0, cut + 12 - time.monotonic()))
            finally:
                netns.heal()
            assert poll(lambda: shovel_once(members, "/", "move"), 15,
                        "the shovel listed once by every member after healing") == now
            time.sleep(2)
            assert shovel_once(members, "/", "move")[0] == now, "not listed once, 2 s later"
        finally:
            publisher.stop.set()
        print(f"\n{c.name} cut off: the shovel on {now} after {took:.1f} s; {drained(publisher, a, '/')}")
        no_tracebacks(*cluster.brokers)
    finally:
        cluster.stop()
