"""rabbitmq-queues' verbs on a cluster's replicated quorum queues, through real warrenctl
subprocesses on a node's control socket (warren/cluster/queue_members.py): quorum_status,
add_member, delete_member, grow, shrink, check_if_node_is_quorum_critical, with RabbitMQ 3.10's
texts and exit codes (briefs' cluster_facts e). A member added follows and holds what was
confirmed (it alone with another new member serves the queue once the old one is killed); a
member removed deletes its replica log; removing the leader moves leadership first."""

from __future__ import annotations

import glob
import json
import os
import signal

import pika
import requests

from .test_ctl_cluster import ctl
from .test_quorum_replication import drain
from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import nodes, wait_for
from .total_queue import records

QQ = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def declare(node, name: str, **arguments) -> None:
    connection = pika.BlockingConnection(node.pika_params())
    connection.channel().queue_declare(name, durable=True, arguments={**QQ, **arguments})
    connection.close()


def publish(node, name: str, bodies) -> None:
    connection = pika.BlockingConnection(node.pika_params())
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", name, body, PERSISTENT)
    connection.close()


def status(node, name: str) -> dict[str, dict]:
    out = ctl(node, "quorum_status", name, "--formatter", "json")
    assert out.returncode == 0, out
    return {row["Node Name"]: row for row in json.loads(out.stdout)}


def record(make_node, etcd, name: str) -> dict:
    """The queue's record in etcd (the test's cluster has one replicated queue of that name)."""
    found = records(etcd.endpoints[0], make_node.prefix)
    assert len(found) <= 1, found
    return found[0] if found else {}


def replica_dirs(node) -> list[str]:
    return glob.glob(os.path.join(node.data_dir, "replicas", "*"))


def test_add_member_then_the_old_member_killed_keeps_what_was_confirmed(three, make_node, etcd):  # noqa: F811
    a, b, c = three
    declare(a, "qq.grow", **{"x-quorum-initial-group-size": 1})
    publish(a, "qq.grow", [b"m%d" % n for n in range(50)])
    assert replica_dirs(b) == [] and replica_dirs(c) == []

    out = ctl(a, "add_member", "qq.grow", b.name)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Adding a replica for queue qq.grow on node {b.name}...\n",
                                                        ""), out
    out = ctl(b, "add_member", "qq.grow", c.name)  # (through a node that is no member yet)
    assert out.returncode == 0, out
    again = ctl(a, "add_member", "qq.grow", c.name)  # already a member: no error, as RabbitMQ
    assert (again.returncode, again.stderr) == (0, ""), again
    wait_for(lambda: set(record(make_node, etcd, "qq.grow").get("isr", [])) == {a.name, b.name, c.name},
             timeout=15, what="both new members in sync")
    rows = status(c, "qq.grow")
    assert [rows[n]["Raft State"] for n in (a.name, b.name, c.name)] == ["leader", "follower", "follower"], rows
    assert rows[b.name]["Log Index"] == rows[a.name]["Log Index"] == rows[a.name]["Commit Index"], rows
    assert replica_dirs(b) and replica_dirs(c)

    a.proc.send_signal(signal.SIGKILL)  # the only old member: what was confirmed is on b and c alone
    a.proc.wait()
    wait_for(lambda: record(make_node, etcd, "qq.grow").get("leader") in (b.name, c.name), timeout=15,
             what="a new leader among the new members")
    got = drain(b, "qq.grow")
    assert got == [b"m%d" % n for n in range(50)]


def test_delete_member_removes_its_log_and_moves_leadership_off_a_removed_leader(three, make_node, etcd):  # noqa: F811
    a, b, c = three
    declare(a, "qq.shrink")
    publish(a, "qq.shrink", [b"x%d" % n for n in range(10)])
    wait_for(lambda: len(replica_dirs(c)) == 1, what="c's replica")
    wait_for(lambda: set(record(make_node, etcd, "qq.shrink").get("isr", [a.name, b.name, c.name]))
             == {a.name, b.name, c.name}, what="all in sync")

    out = ctl(b, "delete_member", "qq.shrink", c.name)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Removing a replica of queue qq.shrink on node {c.name}...\n",
                                                        ""), out
    wait_for(lambda: replica_dirs(c) == [], what="c's replica log deleted")
    assert record(make_node, etcd, "qq.shrink")["members"] == [a.name, b.name]
    for node in (a, b, c):
        wait_for(lambda: [len(q.get("members", [])) for q in node_queues(node)] == [2], what="members seen everywhere")
    out = ctl(a, "delete_member", "qq.shrink", c.name)  # not a member: no error, as RabbitMQ
    assert (out.returncode, out.stderr) == (0, ""), out

    # The leader itself: leadership moves to the other member first, nothing is lost.
    out = ctl(c, "delete_member", "qq.shrink", a.name)
    assert out.returncode == 0, out
    wait_for(lambda: record(make_node, etcd, "qq.shrink").get("leader") == b.name, what="b leading")
    wait_for(lambda: replica_dirs(a) == [], what="a's replica log deleted")
    assert drain(c, "qq.shrink") == [b"x%d" % n for n in range(10)]
    out = ctl(a, "delete_member", "qq.shrink", b.name)
    assert (out.returncode, out.stderr) == (69, "Error:\nlast_node\n"), out


def node_queues(node) -> list[dict]:
    return requests.get(f"{node.api}/queues/%2F", auth=("guest", "guest"), timeout=5).json()


def test_the_verbs_refusals_are_rabbitmqs(three):  # noqa: F811
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("cq", durable=True)
    connection.close()
    declare(a, "qq.r")
    for verb in ("add_member", "delete_member"):
        out = ctl(a, verb, "nope", b.name)
        assert (out.returncode, out.stderr) == (69, "Error:\nnot_found\n"), out
        out = ctl(a, verb, "cq", b.name)
        assert (out.returncode, out.stderr) == (69, "Error:\nCannot add members to a classic queue\n"), out
        out = ctl(a, verb, "--vhost", "novhost", "qq.r", b.name)
        assert (out.returncode, out.stderr) == (69, "Error:\nnot_found\n"), out
    out = ctl(a, "add_member", "qq.r", "warren-zzz@localhost")
    assert (out.returncode, out.stderr) == (69, "Error:\nnode_not_running\n"), out
    out = ctl(a, "delete_member", "qq.r", "warren-zzz@localhost")  # never a member: ok
    assert (out.returncode, out.stderr) == (0, ""), out
    out = ctl(a, "quorum_status", "nope")
    assert (out.returncode, out.stderr) == (69, "Error:\nnot_found\n"), out
    out = ctl(a, "quorum_status", "cq")
    assert (out.returncode, out.stderr) == (69, "Error:\nCannot get quorum status of a classic queue\n"), out
    out = ctl(a, "grow", c.name, "bogus")
    assert out.returncode == 64 and out.stderr.startswith(
        "Error (argument validation): \"strategy 'bogus' is not recognised.\"\nArguments given:\n"), out
    out = ctl(a, "quorum_status", "qq.r")
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert lines[0] == f"Status of quorum queue qq.r on node {a.name} ..."
    assert lines[1].startswith("┌") and "│ Node Name" in lines[2] and "│ Raft State │ Log Index │" in lines[2], out
    assert any(f"│ {a.name} │ leader " in line for line in lines), out


def test_grow_shrink_and_quorum_critical(three, make_node, etcd):  # noqa: F811
    a, b, c = three
    declare(a, "qq.two", **{"x-quorum-initial-group-size": 2})   # [a, b]
    declare(a, "qq.one", **{"x-quorum-initial-group-size": 1})   # [a]
    declare(a, "qq.three")                                        # [a, b, c]
    out = ctl(a, "check_if_node_is_quorum_critical")
    assert out.returncode == 69, out
    assert out.stdout == f"Checking if node {a.name} is critical for quorum of any quorum queues ...\n", out
    assert sorted(out.stderr.splitlines()) == [f"queue '{n}' in vhost '/' would lose quorum if node {a.name} is stopped"
                                               for n in ("qq.one", "qq.two")], out
    out = ctl(c, "check_if_node_is_quorum_critical", "--formatter", "json")
    assert (out.returncode, json.loads(out.stdout)) == (0, {"result": "ok"}), out

    out = ctl(a, "grow", c.name, "even", "--queue-pattern", "^qq\\.")
    assert out.returncode == 0, out
    assert out.stdout == f"Growing even quorum queues on {c.name}...\nvhost\tname\tsize\tresult\n/\tqq.two\t3\tok\n", out
    out = ctl(a, "grow", c.name, "all", "--formatter", "json")
    assert (out.returncode, json.loads(out.stdout)) == (0, [{"vhost": "/", "name": "qq.one", "size": 2,
                                                             "result": "ok"}]), out
    out = ctl(a, "grow", c.name, "all")  # nothing left to grow: the banner and an empty line
    assert (out.returncode, out.stdout) == (0, f"Growing all quorum queues on {c.name}...\n\n"), out
    out = ctl(a, "grow", "warren-zzz@localhost", "all")
    assert (out.returncode, out.stdout) == (0, "Growing all quorum queues on warren-zzz@localhost...\n\n"), out

    wait_for(lambda: ctl(b, "check_if_node_is_quorum_critical").returncode == 0, timeout=15,
             what="qq.one's two members (a, c) without b, the others with three")
    out = ctl(b, "shrink", c.name)
    assert out.returncode == 0, out
    assert sorted(out.stdout.splitlines()[2:]) == ["/\tqq.one\t1\tok", "/\tqq.three\t2\tok", "/\tqq.two\t2\tok"], out
    wait_for(lambda: replica_dirs(c) == [], what="c's replicas deleted")
    out = ctl(b, "shrink", a.name, "--errors-only")
    assert out.returncode == 0, out
    assert out.stdout.splitlines()[1:] == ["vhost\tname\tsize\tresult",
                                           "/\tqq.one\t1\terror: the last node cannot be removed"], out


def test_the_verbs_routes_are_the_control_sockets_alone(three):  # noqa: F811
    """RabbitMQ's API has no routes for these verbs (its CLI calls the node over Erlang
    distribution): Warren's are warrenctl's on the control socket; no user over TCP passes,
    an administrator neither."""
    a, _, _ = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-socket", durable=True, arguments=QQ)
    connection.close()
    refused = {"error": "not_authorised", "reason": "Only warrenctl on the node's control socket may do this"}
    for method, path in [("GET", "/quorum-queues/%2F/qq-socket/status"), ("HEAD", "/quorum-queues/%2F/qq-socket/status"),
                         ("PUT", f"/quorum-queues/%2F/qq-socket/members/{a.name}"),
                         ("DELETE", f"/quorum-queues/%2F/qq-socket/members/{a.name}"),
                         ("POST", "/quorum-queues/grow"), ("POST", "/quorum-queues/shrink")]:
        answer = requests.request(method, a.api + path, auth=("guest", "guest"), timeout=5,
                                  json={"node": a.name, "strategy": "all"} if method == "POST" else None)
        assert answer.status_code == 401, (method, path, answer.status_code)
        if method != "HEAD":
            assert answer.json() == refused, (method, path)


def test_forget_cluster_node_takes_the_node_out_of_quorum_queues(three):  # noqa: F811
    """As RabbitMQ's: a forgotten node is no member of any quorum queue after (those it led
    are led by another), and nothing confirmed is lost."""
    a, b, c = three
    connection = pika.BlockingConnection(c.pika_params())  # (c leads it: client-local)
    channel = connection.channel()
    channel.queue_declare("qq-forgotten", durable=True, arguments=QQ)
    channel.confirm_delivery()
    for n in range(10):
        channel.basic_publish("", "qq-forgotten", str(n).encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    c.stop(signal.SIGTERM)
    wait_for(lambda: nodes(a)[c.name] is False, timeout=10, what="c stopped")
    out = ctl(a, "forget_cluster_node", c.name)
    assert out.returncode == 0, out
    # (Led by a or b: the more up to date of the two, a on a tie.)
    for node in (a, b):
        wait_for(lambda: [(q["members"], q.get("leader") in (a.name, b.name))
                          for q in node_queues(node) if q["name"] == "qq-forgotten"]
                 == [([a.name, b.name], True)], timeout=15, what=f"{node.name}: c out of the members")
    assert sorted(int(body) for body in drain(b, "qq-forgotten")) == list(range(10))
