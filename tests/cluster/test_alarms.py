"""Resource alarms across a cluster, as a RabbitMQ 3.10.8 cluster behaves (checked on one with
tools/rabbitmq_node.py): a memory or disk alarm on any running node blocks publishers on
every node, connection.blocked's reason naming the resources in alarm anywhere ("low on disk &
memory" for memory on one node and disk on another), until the last one clears; a node that
stops running takes its alarms with it. /api/nodes through any node shows each node's own
alarms, /api/health/checks/alarms every node's, local-alarms this node's; warrenctl
cluster_status lists every running node's, status this node's.

Each publisher publishes into a queue of its own node, so only the alarm of another node can
hold it (not the node links' pause of a queue whose home is in alarm)."""

from __future__ import annotations

import json
import signal
import time

import pika
import requests

from .test_ctl_cluster import ctl
from .test_membership import nodes, wait_for

AUTH = ("guest", "guest")
HUGE_DISK_LIMIT = str(10 ** 18)  # above any disk's free space: the disk alarm rises


class Publisher:
    """A pika connection to `node` publishing into its queue `queue` (declared on that node),
    with the connection.blocked and unblocked it receives."""

    def __init__(self, node, queue: str):
        self.events: list[tuple] = []
        self.connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", node.port, credentials=pika.PlainCredentials(*AUTH), blocked_connection_timeout=60))
        self.connection.add_on_connection_blocked_callback(
            lambda _c, frame: self.events.append(("blocked", frame.method.reason)))
        self.connection.add_on_connection_unblocked_callback(lambda _c, _f: self.events.append(("unblocked",)))
        self.channel = self.connection.channel()
        self.queue = queue
        self.channel.queue_declare(queue)

    def publish(self, n: int = 1) -> None:
        for _ in range(n):
            self.channel.basic_publish("", self.queue, b"m")

    def wait_for(self, event: tuple, timeout: float = 10) -> None:
        wait_for(lambda: self.connection.process_data_events(0.05) or event in self.events, timeout=timeout,
                 what=f"{event} on the publisher (had {self.events})")

    def close(self) -> None:
        self.connection.close()


def count(node, queue: str) -> int:
    channel = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials(*AUTH))).channel()
    try:
        return channel.queue_declare(queue, passive=True).method.message_count
    finally:
        channel.connection.close()


def get(node, path: str) -> requests.Response:
    return requests.get(f"{node.api}{path}", auth=AUTH, timeout=10)


def node_alarms(node) -> dict[str, tuple[bool, bool]]:
    """/api/nodes through `node`: each running node's (mem_alarm, disk_free_alarm)."""
    return {n["name"]: (n["mem_alarm"], n["disk_free_alarm"]) for n in get(node, "/nodes").json() if n["running"]}


def ok(result):
    assert result.returncode == 0, result
    return result.stdout


def test_an_alarm_on_one_node_blocks_publishers_on_every_node(make_node):
    a, b, c = (make_node(f"warren-{x}@localhost") for x in "abc")
    names = [a.name, b.name, c.name]
    for node in (a, b, c):
        wait_for(lambda: nodes(node) == dict.fromkeys(names, True), what=f"{node.name} to list the three")
    on_c = Publisher(c, "qc")
    on_c.publish()
    try:
        ok(ctl(a, "set_vm_memory_high_watermark", "0.0"))
        # the first publish after the alarm is held, the connection blocked with a's reason
        wait_for(lambda: get(c, "/health/checks/alarms").status_code == 503, what="c to see a's alarm")
        on_c.publish(5)
        on_c.wait_for(("blocked", "low on memory"))
        time.sleep(0.5)
        assert count(c, "qc") == 1  # nothing taken while blocked
        assert on_c.events == [("blocked", "low on memory")]

        # each node's own alarms through any node; the health checks; warrenctl
        for node in (a, b, c):
            assert node_alarms(node) == {a.name: (True, False), b.name: (False, False), c.name: (False, False)}
            check = get(node, "/health/checks/alarms")
            assert check.status_code == 503
            assert check.json() == {"status": "failed", "reason": "There are alarms in effect in the cluster",
                                    "alarms": [{"node": a.name, "resource": "memory"}]}
        assert get(c, "/health/checks/local-alarms").json() == {"status": "ok"}
        assert get(a, "/health/checks/local-alarms").json()["alarms"] == [{"node": a.name, "resource": "memory"}]
        assert json.loads(ok(ctl(c, "status", "--formatter", "json")))["alarms"] == []
        assert json.loads(ok(ctl(c, "cluster_status", "--formatter", "json")))["alarms"] == [
            {"node": a.name, "resource": "memory", "type": "resource_limit"}]

        # disk on b too: a connection blocked now names both; the health checks list both
        ok(ctl(b, "set_disk_free_limit", HUGE_DISK_LIMIT))
        wait_for(lambda: len(get(c, "/health/checks/alarms").json().get("alarms", [])) == 2,
                 what="c to see b's alarm")
        on_c2 = Publisher(c, "qc2")
        on_c2.publish()
        on_c2.wait_for(("blocked", "low on disk & memory"))
        assert get(c, "/health/checks/alarms").json()["alarms"] == [{"node": a.name, "resource": "memory"},
                                                                  {"node": b.name, "resource": "disk space"}]
        assert node_alarms(c)[b.name] == (False, True)
        text = ok(ctl(c, "cluster_status"))
        assert ("Alarms\n\nMemory alarm on node warren-a@localhost\n"
                "Free disk space alarm on node warren-b@localhost\n") in text

        # a's clears: b's still holds them; b's clears: both go
        ok(ctl(a, "set_vm_memory_high_watermark", "0.4"))
        wait_for(lambda: len(get(c, "/health/checks/alarms").json().get("alarms", [])) == 1,
                 what="c to see a's alarm cleared")
        on_c.connection.process_data_events(0.3)
        assert ("unblocked",) not in on_c.events and count(c, "qc") == 1
    finally:
        ctl(a, "set_vm_memory_high_watermark", "0.4")
        ctl(b, "set_disk_free_limit", "50MB")
    on_c.wait_for(("unblocked",))
    on_c2.wait_for(("unblocked",))
    wait_for(lambda: count(c, "qc") == 6 and count(c, "qc2") == 1, what="the held publishes in the queues")
    assert get(b, "/health/checks/alarms").json() == {"status": "ok"}
    assert node_alarms(b) == dict.fromkeys(names, (False, False))
    on_c.close()
    on_c2.close()


def test_a_node_that_stops_running_takes_its_alarm_with_it(make_node):
    """A node joining sees the alarm already on; the alarmed node killed, the others' publishers
    go on once its lease has run out."""
    a = make_node("warren-a@localhost")
    ok(ctl(a, "set_vm_memory_high_watermark", "0.0"))
    b = make_node("warren-b@localhost")
    wait_for(lambda: nodes(b) == {a.name: True, b.name: True}, what="b to list both")
    on_b = Publisher(b, "qb")
    on_b.publish()
    on_b.wait_for(("blocked", "low on memory"))
    assert get(b, "/health/checks/alarms").json()["alarms"] == [{"node": a.name, "resource": "memory"}]
    a.stop(signal.SIGKILL)
    on_b.wait_for(("unblocked",), timeout=15)  # (a's running record's lease: 5 s)
    assert nodes(b)[a.name] is False
    assert get(b, "/health/checks/alarms").json() == {"status": "ok"}
    wait_for(lambda: count(b, "qb") == 1, what="the held publish in the queue")
    assert "memory resource limit alarm cleared for dead node 'warren-a@localhost'" in b.log()
    on_b.close()
