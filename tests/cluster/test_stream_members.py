"""rabbitmq-streams' add_replica and delete_replica on a cluster's replicated streams, through
real warrenctl subprocesses on a node's control socket (warren/cluster/queue_members.py,
warren/cluster/replicas.py), with RabbitMQ 3.10's texts and exit codes: a replica added holds
every message the stream had and serves consumers on its node; a replica deleted leaves its
node a stand-in (its consumers cancelled, new ones refused) and its log deleted; deleting the
leader's replica moves leadership first, and nothing confirmed is lost."""

from __future__ import annotations

import glob
import os

import requests

import pytest

from . import test_ctl_cluster
from .members import AUTH, RABBITMQ, wait_for
from .test_stream_replication import consume_refusal, no_replica, publish, read

# (RabbitMQ's CLI is rabbitmq-streams over Erlang distribution: its texts, exit codes and
# behaviour are in the brief these tests were written from, checked on a RabbitMQ 3.10 cluster.)
pytestmark = pytest.mark.skipif(RABBITMQ, reason="warrenctl's verbs, on Warren's control socket")

STREAM = {"x-queue-type": "stream"}


def ctl(member, *args):
    return test_ctl_cluster.ctl(member.node, *args)


def declare(node, name: str, size: int | None = None) -> None:
    connection = node.connect()
    arguments = {**STREAM, **({"x-initial-cluster-size": size} if size else {})}
    connection.channel().queue_declare(name, durable=True, arguments=arguments)
    connection.close()


def shown(node, name: str) -> dict:
    answer = requests.get(f"{node.api}/queues/%2F/{name}", auth=AUTH, timeout=10)
    return answer.json() if answer.ok else {}


def replica_dirs(node) -> list[str]:
    return glob.glob(os.path.join(node.node.data_dir, "replicas", "*"))


def test_add_replica_copies_the_stream_and_serves_its_node(members):
    a, b, c = members
    declare(a, "s.grow", size=1)
    bodies = [b"m%d" % n for n in range(50)]
    publish(a, "s.grow", bodies)
    assert consume_refusal(b, "s.grow") == no_replica("s.grow")

    out = ctl(a, "add_replica", "s.grow", b.name)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Adding a replica for queue s.grow on node {b.name}...\n",
                                                        ""), out
    again = ctl(b, "add_replica", "s.grow", b.name)  # already a member
    assert (again.returncode, again.stderr) == (0, ""), again
    for node in (a, b, c):
        wait_for(lambda: sorted(shown(node, "s.grow").get("members", [])) == sorted([a.name, b.name]),
                 what=f"{node.name} listing b as a member")
    assert replica_dirs(b) and not replica_dirs(c)
    got = read(b, "s.grow", bodies[-1])
    assert got == list(enumerate(bodies))  # (the same offsets as the leader's)
    publish(c, "s.grow", [b"after"])
    assert read(b, "s.grow", b"after")[-1] == (50, b"after")


def test_delete_replica_cancels_its_readers_and_moves_a_removed_leader_first(members):
    a, b, c = members
    declare(a, "s.shrink")
    bodies = [b"x%d" % n for n in range(20)]
    publish(a, "s.shrink", bodies)
    wait_for(lambda: len(replica_dirs(c)) == 1, what="c's replica")
    assert read(c, "s.shrink", bodies[-1])[-1] == (19, bodies[-1])

    reader = c.connect()
    channel = reader.channel()
    channel.basic_qos(prefetch_count=100)
    cancels: list = []
    channel.add_on_cancel_callback(cancels.append)
    channel.basic_consume("s.shrink", lambda ch, method, props, body: ch.basic_ack(method.delivery_tag),
                          arguments={"x-stream-offset": "first"})
    out = ctl(b, "delete_replica", "s.shrink", c.name)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Removing a replica of queue s.shrink on node {c.name}...\n",
                                                        ""), out
    wait_for(lambda: reader.process_data_events(time_limit=0.1) or cancels, what="c's reader cancelled")
    reader.close()
    wait_for(lambda: replica_dirs(c) == [], what="c's replica deleted")
    assert consume_refusal(c, "s.shrink") == no_replica("s.shrink")
    out = ctl(a, "delete_replica", "s.shrink", c.name)  # no longer a member: no error
    assert (out.returncode, out.stderr) == (0, ""), out

    # The leader's own: b leads, every confirmed message is there, a holds nothing.
    out = ctl(c, "delete_replica", "s.shrink", a.name)
    assert out.returncode == 0, out
    wait_for(lambda: shown(c, "s.shrink").get("node") == b.name, what="b leading")
    wait_for(lambda: replica_dirs(a) == [], what="a's replica deleted")
    publish(a, "s.shrink", [b"after"])  # (through a node with no replica: to the leader)
    assert [body for _, body in read(b, "s.shrink", b"after")] == [*bodies, b"after"]
    out = ctl(a, "delete_replica", "s.shrink", b.name)
    assert (out.returncode, out.stderr) == (69, "Error:\nCannot delete the last member of a stream\n"), out


def test_the_verbs_refusals_are_rabbitmqs(members):
    a, b, _ = members
    connection = a.connect()
    connection.channel().queue_declare("cq.r", durable=True)
    connection.channel().queue_declare("qq.r", durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    declare(a, "s.r", size=1)
    for verb, words in (("add_replica", "add replicas to"), ("delete_replica", "delete replicas from")):
        for queue in ("nope", "s.r"):
            out = ctl(a, verb, *(("--vhost", "novhost") if queue == "s.r" else ()), queue, b.name)
            assert (out.returncode, out.stderr) == (69, "Error:\nnot_found\n"), out
        out = ctl(a, verb, "cq.r", b.name)
        assert (out.returncode, out.stderr) == (69, f"Error:\nCannot {words} a classic queue\n"), out
        out = ctl(a, verb, "qq.r", b.name)
        assert (out.returncode, out.stderr) == (69, f"Error:\nCannot {words} a quorum queue\n"), out
        out = ctl(a, verb, "s.r", "warren-zzz@localhost")  # (asked before whether it is a member)
        assert (out.returncode, out.stderr) == (69, "Error:\nnode_not_running\n"), out
    refused = {"error": "not_authorised", "reason": "Only warrenctl on the node's control socket may do this"}
    for method in ("PUT", "DELETE"):  # (the verbs' routes: the control socket's alone)
        answer = requests.request(method, f"{a.api}/stream-replicas/%2F/s.r/{b.name}", auth=AUTH, timeout=5)
        assert (answer.status_code, answer.json()) == (401, refused), method
