"""Quorum queues replicated over the node links (warren/cluster/replicas.py): declared through
one node (its leader, RabbitMQ's client-local), with replicas on the other members; a publish
is confirmed once a majority of the replicas and every in-sync one hold it on disk; used
through any node."""

from __future__ import annotations

import glob
import os
import signal
import time
import threading

import pika
import pytest
import requests

from .test_ctl_cluster import ctl
from .test_definitions import linked, three  # noqa: F401  (the fixture)
from .test_membership import wait_for
from .total_queue import records

QQ = {"x-queue-type": "quorum"}


def replica_bytes(node) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(node.data_dir, "replicas", "*", "*.seg")))


def test_a_quorum_queue_is_replicated_and_used_through_every_node(three):  # noqa: F811
    a, b, c = three
    declarer = pika.BlockingConnection(a.pika_params())
    declarer.channel().queue_declare("qq", durable=True, arguments=QQ)
    publisher = pika.BlockingConnection(b.pika_params())
    out = publisher.channel()
    out.confirm_delivery()
    for n in range(100):
        out.basic_publish("", "qq", str(n).encode(), pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: replica_bytes(b) > 1000 and replica_bytes(c) > 1000, timeout=5, what="the replicas written")
    consumer = pika.BlockingConnection(c.pika_params())
    got = []
    for method, _, body in consumer.channel().consume("qq", auto_ack=True, inactivity_timeout=5):
        if method is None:
            break
        got.append(int(body))
        if len(got) == 100:
            break
    assert got == list(range(100))
    for connection in (declarer, publisher, consumer):
        connection.close()


def test_a_publish_is_confirmed_only_once_a_follower_has_it(three):  # noqa: F811
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-held", durable=True, arguments=QQ)
    channel.confirm_delivery()
    channel.basic_publish("", "qq-held", b"before", pika.BasicProperties(delivery_mode=2))  # (links up)
    for node in (b, c):
        node.proc.send_signal(signal.SIGSTOP)
    confirmed = threading.Event()
    try:
        def publish() -> None:
            other = pika.BlockingConnection(a.pika_params())
            ch = other.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "qq-held", b"held", pika.BasicProperties(delivery_mode=2))
            confirmed.set()
            other.close()
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        assert not confirmed.wait(1.5), "confirmed with no follower awake"
    finally:
        for node in (b, c):
            node.proc.send_signal(signal.SIGCONT)
    assert confirmed.wait(10), "not confirmed once the followers were back"
    connection.close()


def publish_confirmed(node, queue: str, bodies, deadline: float) -> None:
    """Publish each body with confirms through `node`, again until it is confirmed."""
    pending = list(bodies)
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} publishes never confirmed"
        try:
            connection = pika.BlockingConnection(node.pika_params())
            channel = connection.channel()
            channel.confirm_delivery()
            while pending:
                channel.basic_publish("", queue, pending[0], pika.BasicProperties(delivery_mode=2), mandatory=True)
                pending.pop(0)
            connection.close()
        except (pika.exceptions.AMQPError, pika.exceptions.NackError, pika.exceptions.UnroutableError):
            time.sleep(0.2)


def test_the_leaders_death_loses_no_confirmed_message(three):  # noqa: F811
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-failover", durable=True, arguments=QQ)
    connection.close()
    deadline = time.monotonic() + 60
    publish_confirmed(b, "qq-failover", [f"before-{n}".encode() for n in range(200)], deadline)
    a.proc.send_signal(signal.SIGKILL)
    started = time.monotonic()
    publish_confirmed(b, "qq-failover", [f"after-{n}".encode() for n in range(200)], deadline)
    assert time.monotonic() - started < 20
    got = []
    consumer = pika.BlockingConnection(c.pika_params())
    channel = consumer.channel()
    while True:
        method, _, body = channel.basic_get("qq-failover", auto_ack=True)
        if method is None:
            break
        got.append(body)
    consumer.close()
    expected = {f"before-{n}".encode() for n in range(200)} | {f"after-{n}".encode() for n in range(200)}
    assert not expected - set(got), f"lost: {sorted(expected - set(got))[:10]}"
    assert not set(got) - expected
    assert sum("leader now (epoch 2)" in node.log() for node in (b, c)) == 1


def drain(node, queue: str) -> list[bytes]:
    connection = pika.BlockingConnection(node.pika_params())
    channel = connection.channel()
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    connection.close()
    return got


def test_restarted_members_follow_whoever_leads(three, make_node):  # noqa: F811
    """A follower restarted catches up; a leader killed and restarted follows the one elected
    meanwhile (etcd's record wins over what its own tables said); nothing confirmed is lost."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-restart", durable=True, arguments=QQ)
    connection.close()
    deadline = time.monotonic() + 90
    publish_confirmed(a, "qq-restart", [f"one-{n}".encode() for n in range(50)], deadline)
    b.stop(signal.SIGTERM)
    b = make_node(b.name, data_dir=b.data_dir, port=b.port, dist_port=b.dist_port)
    publish_confirmed(c, "qq-restart", [f"two-{n}".encode() for n in range(50)], deadline)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    publish_confirmed(c, "qq-restart", [f"three-{n}".encode() for n in range(50)], deadline)
    a = make_node(a.name, data_dir=a.data_dir, port=a.port, dist_port=a.dist_port)
    wait_for(lambda: "following" in a.log(), timeout=15, what="a following the new leader")
    publish_confirmed(a, "qq-restart", [f"four-{n}".encode() for n in range(50)], deadline)
    got = drain(a, "qq-restart")
    expected = {f"{round_}-{n}".encode() for round_ in ("one", "two", "three", "four") for n in range(50)}
    assert not expected - set(got), f"lost: {sorted(expected - set(got))[:10]}"
    assert not set(got) - expected


def test_a_whole_cluster_killed_comes_back_with_its_leader_in_a_new_epoch(three, make_node, etcd):  # noqa: F811
    """Every node killed (the followers first: the record still names the leader), then all
    started again: the leader leads again only in a new epoch of its own, once a majority
    reported (it may have lost entries of its old epoch that its followers hold), and nothing
    confirmed is lost."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-all-killed", durable=True, arguments=QQ)
    connection.close()
    deadline = time.monotonic() + 90
    publish_confirmed(a, "qq-all-killed", [f"before-{n}".encode() for n in range(100)], deadline)
    for node in (b, c, a):
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
    assert [r.get("leader") for r in records(etcd.endpoints[0], make_node.prefix)] in ([], [a.name])
    a, b, c = (make_node(n.name, data_dir=n.data_dir, port=n.port, dist_port=n.dist_port) for n in (a, b, c))
    wait_for(lambda: [(r["leader"], r["epoch"]) for r in records(etcd.endpoints[0], make_node.prefix)]
             == [(a.name, 2)], timeout=20, what="a leading in epoch 2")
    publish_confirmed(b, "qq-all-killed", [f"after-{n}".encode() for n in range(100)], deadline)
    got = drain(c, "qq-all-killed")
    expected = {f"{when}-{n}".encode() for when in ("before", "after") for n in range(100)}
    assert not expected - set(got), f"lost: {sorted(expected - set(got))[:10]}"
    assert sorted(got) == sorted(expected)


def test_the_api_shows_leader_members_and_online(three):  # noqa: F811
    a, b, c = three
    connection = pika.BlockingConnection(b.pika_params())
    connection.channel().queue_declare("qq-api", durable=True, arguments=QQ)
    connection.close()
    for node in (a, b, c):
        q = requests.get(f"{node.api}/queues/%2F/qq-api", auth=("guest", "guest"), timeout=30).json()
        assert (q["type"], q["leader"], q["node"]) == ("quorum", b.name, b.name)
        assert q["members"][0] == b.name and sorted(q["members"]) == sorted(n.name for n in (a, b, c))
        assert sorted(q["online"]) == sorted(q["members"])
    listed = ctl(a, "list_queues", "name", "type", "leader", "members", "online", "--no-table-headers", "--quiet")
    assert listed.returncode == 0, listed
    row = next(line for line in listed.stdout.splitlines() if line.startswith("qq-api"))
    assert row.split("\t")[:3] == ["qq-api", "quorum", b.name] and a.name in row.split("\t")[4], row
    c.proc.send_signal(signal.SIGKILL)
    wait_for(lambda: c.name not in requests.get(f"{a.api}/queues/%2F/qq-api", auth=("guest", "guest"),
                                                timeout=30).json()["online"], timeout=15, what="c offline")


def segments(node) -> int:
    return len(glob.glob(os.path.join(node.data_dir, "replicas", "*", "*.seg")))


def test_the_logs_release_what_no_live_message_needs(make_node, monkeypatch):
    """Segments below the oldest live message go, on the leader and its followers; a follower
    that was away meanwhile starts again where the leader's log starts, and takes over."""
    monkeypatch.setenv("WARREN_REPLICA_SEGMENT_BYTES", "20000")  # (the nodes' environment)
    a, b, c = (make_node(f"warren-{x}@localhost") for x in "abc")
    wait_for(lambda: len(requests.get(f"{a.api}/nodes", auth=("guest", "guest"), timeout=30).json()) == 3
             and all(n["running"] for n in requests.get(f"{a.api}/nodes", auth=("guest", "guest"), timeout=30).json()),
             what="three running")
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-release", durable=True, arguments=QQ)
    channel.confirm_delivery()
    deadline = time.monotonic() + 60
    publish_confirmed(a, "qq-release", [b"x" * 1000 for _ in range(200)], deadline)
    wait_for(lambda: segments(b) > 5 and segments(c) > 5, timeout=10, what="segments on the followers")
    c.stop(signal.SIGTERM)
    assert len(drain(a, "qq-release")) == 200
    publish_confirmed(a, "qq-release", [b"live"], deadline)
    wait_for(lambda: segments(a) <= 2 and segments(b) <= 2, timeout=10, what="the released segments gone")
    c = make_node(c.name, data_dir=c.data_dir, port=c.port, dist_port=c.dist_port)
    wait_for(lambda: segments(c) <= 2, timeout=20, what="c starting again where the leader's log starts")
    connection.close()
    a.proc.send_signal(signal.SIGKILL)
    got: list[bytes] = []

    def taken_over() -> bool:
        try:
            got.extend(drain(b, "qq-release"))
            return True
        except pika.exceptions.ChannelClosedByBroker:  # (the home-down 404 until one is elected)
            return False
    wait_for(taken_over, timeout=20, what="a new leader")
    assert got == [b"live"]


def test_a_publish_between_two_leaders_is_held_for_the_next(three):  # noqa: F811
    """Right after the leader's kill -9 (before the next is elected) a confirmed publish through
    another node is routed to the queue, held for the next leader and confirmed by it, as
    RabbitMQ's channel holds it: never returned as unroutable, never nacked, in the queue once."""
    a, b, c = three
    connection = pika.BlockingConnection(c.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-between", durable=True, arguments=QQ)
    channel.confirm_delivery()
    channel.basic_publish("", "qq-between", b"before", pika.BasicProperties(delivery_mode=2), mandatory=True)
    declarer = pika.BlockingConnection(a.pika_params())  # (a leads it: the declare's node)
    declarer.channel().queue_declare("qq-between-a", durable=True, arguments=QQ)
    declarer.close()
    outcome: list[str] = []

    def publish() -> None:
        try:
            channel.basic_publish("", "qq-between-a", b"between", pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)
            outcome.append("confirmed")
        except pika.exceptions.NackError:
            outcome.append("nacked")
        except pika.exceptions.UnroutableError:
            outcome.append("returned")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    time.sleep(0.02)  # (c's link to a is down; no election before LINK_GRACE, 0.1 s)
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome == ["confirmed"], f"answered {outcome or 'never'}"
    bodies = []
    for method, _, body in channel.consume("qq-between-a", auto_ack=True, inactivity_timeout=2):
        if method is None:
            break
        bodies.append(body)
    assert bodies == [b"between"]
    connection.close()


def test_the_balanced_leader_locator_spreads_leaders(three):  # noqa: F811
    """x-queue-leader-locator=balanced (and a policy's queue-leader-locator, which wins over
    it) leads each new queue from the running member leading fewest; client-local (the
    default) from the declaring node."""
    a, b, c = three
    linked(a, b)
    linked(a, c)
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    for n in range(3):
        channel.queue_declare(f"qq-balanced-{n}", durable=True,
                              arguments={**QQ, "x-queue-leader-locator": "balanced"})
    channel.queue_declare("qq-local", durable=True, arguments=QQ)
    assert requests.put(f"{a.api}/policies/%2F/spread", auth=("guest", "guest"), timeout=5, json={
        "pattern": "^qq-policy", "apply-to": "queues", "definition": {"queue-leader-locator": "balanced"}}).ok
    channel.queue_declare("qq-policy", durable=True, arguments={**QQ, "x-queue-leader-locator": "client-local"})
    connection.close()
    leaders = [wait_for(lambda: requests.get(f"{b.api}/queues/%2F/qq-balanced-{n}", auth=("guest", "guest"),
                                             timeout=5).json().get("leader"), timeout=10, what="the queue on b")
               for n in range(3)]
    assert sorted(leaders) == sorted(node.name for node in three)
    assert requests.get(f"{c.api}/queues/%2F/qq-local", auth=("guest", "guest"), timeout=5).json()["leader"] == a.name
    # a leads two now, b and c one each: the policy's balanced picks b or c
    assert requests.get(f"{c.api}/queues/%2F/qq-policy", auth=("guest", "guest"), timeout=5).json()["leader"] != a.name
    # used through the declaring node as any other
    publish_confirmed(a, "qq-balanced-1", [b"x"], time.monotonic() + 20)
    assert drain(c, "qq-balanced-1") == [b"x"]


@pytest.mark.parametrize("how", ["consume", "get"])
def test_a_consume_or_get_between_two_leaders_waits_for_the_next(three, how):  # noqa: F811
    """Right after the leader's kill -9 (before the next is elected) a basic.consume or
    basic.get through another node waits for the next leader and is answered by it, as
    RabbitMQ's quorum queue client waits: no 404 for a home node that is down."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-waits", durable=True, arguments=QQ)  # (a leads it: the declare's node)
    channel.confirm_delivery()
    for body in (b"m0", b"m1"):
        channel.basic_publish("", "qq-waits", body, pika.BasicProperties(delivery_mode=2))
    connection.close()
    on_c = pika.BlockingConnection(c.pika_params(socket_timeout=10)).channel()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    time.sleep(0.02)  # (c's link to a is down; no election before LINK_GRACE, 0.1 s)
    if how == "get":
        method, _, body = on_c.basic_get("qq-waits", auto_ack=True)
        assert body == b"m0" and method.message_count == 1
    else:
        got = []
        for method, _, body in on_c.consume("qq-waits", auto_ack=True, inactivity_timeout=3):
            if method is None:
                break
            got.append(body)
        assert got == [b"m0", b"m1"]
    on_c.connection.close()
