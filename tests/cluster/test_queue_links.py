"""Classic queues across a cluster's nodes, the basics: a queue declared through one node is
published to through a second and consumed through a third, with confirms and acks."""

from __future__ import annotations

import signal
import threading
import time

import pika
import pytest
import requests

from .test_ctl_cluster import ctl
from .test_membership import wait_for

AUTH = pika.PlainCredentials("guest", "guest")


def connect(node) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, "/", AUTH)).channel()


def test_publish_through_one_node_consume_through_another(make_node):
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    c = make_node("warren-c@localhost")
    ca, cb, cc = connect(a), connect(b), connect(c)
    ca.queue_declare("q", durable=True)
    cb.queue_bind("q", "amq.direct", "k")
    cb.confirm_delivery()
    for i in range(20):
        cb.basic_publish("amq.direct", "k", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    assert cc.queue_declare("q", passive=True).method.message_count == 20
    got = []
    for _ in range(20):
        method, props, body = next(cc.consume("q", inactivity_timeout=5))
        assert method is not None
        assert (method.exchange, method.routing_key) == ("amq.direct", "k")
        got.append(body.decode())
        cc.basic_ack(method.delivery_tag)
    cc.cancel()
    assert got == [f"m{i}" for i in range(20)]
    assert ca.queue_declare("q", passive=True).method.message_count == 0
    # get, purge and delete through other nodes
    cb.basic_publish("", "q", b"x", pika.BasicProperties(delivery_mode=2))
    method, _, body = cc.basic_get("q")
    assert body == b"x" and method.message_count == 0
    cc.basic_nack(method.delivery_tag, requeue=True)
    # (the nack goes to a over c's link, the get over b's: the get may reach a first)
    got_back = []
    wait_for(lambda: got_back.append(cb.basic_get("q", auto_ack=True)) or got_back[-1][2] is not None,
             timeout=5, what="the nacked message back in the queue")
    method, _, body = got_back[-1]
    assert body == b"x" and method.redelivered
    cb.basic_publish("", "q", b"y")
    assert cc.queue_purge("q").method.message_count == 1
    cb.basic_publish("", "q", b"z")
    assert cb.queue_delete("q").method.message_count == 1
    for ch in (ca, cb, cc):
        try:
            ch.queue_declare("q", passive=True)
            raise AssertionError("still there")
        except pika.exceptions.ChannelClosedByBroker as err:
            assert err.reply_code == 404



def api(node, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, f"http://127.0.0.1:{node.mgmt_port}/api{path}", auth=("guest", "guest"),
                            timeout=10, **kwargs)


def test_the_api_of_another_node_gets_purges_and_deletes_the_queue(make_node):
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    ca = connect(a)
    ca.queue_declare("q", durable=True)
    ca.confirm_delivery()
    for i in range(3):
        ca.basic_publish("", "q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    got = api(b, "POST", "/queues/%2F/q/get", json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert got.status_code == 200, got.text
    assert [(m["payload"], m["message_count"]) for m in got.json()] == [("m0", 2)]
    requeued = api(b, "POST", "/queues/%2F/q/get", json={"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert [m["payload"] for m in requeued.json()] == ["m1", "m2"]
    assert ca.queue_declare("q", passive=True).method.message_count == 2  # (requeued)
    wait_for(lambda: api(b, "GET", "/overview").json()["queue_totals"]["messages"] == 2,
             what="b's totals to count a's queue")
    assert api(b, "DELETE", "/queues/%2F/q/contents").status_code == 204
    assert ca.queue_declare("q", passive=True).method.message_count == 0
    assert api(b, "DELETE", "/queues/%2F/q").status_code == 204
    assert api(b, "GET", "/queues/%2F/q").status_code == 404  # (b has applied the deletion)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ca.queue_declare("q", passive=True)
    assert closed.value.reply_code == 404


def test_a_dead_nodes_transient_and_exclusive_queues_go_with_it(make_node):
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    ca = connect(a)
    ca.queue_declare("durable", durable=True)
    ca.queue_declare("transient")
    ca.queue_declare("exclusive", exclusive=True)
    assert names(b) == {"durable", "exclusive", "transient"}
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    wait_for(lambda: names(b) == {"durable"}, timeout=20, what="the transient and exclusive queues to go")
    [shown] = [q for q in api(b, "GET", "/queues").json() if q["name"] == "durable"]
    assert shown["state"] == "down"
    # rabbitmqctl's listing: the down queue's type is its module, --offline/--online split them.
    connect(b).queue_declare("up", durable=True)
    listed = ctl(b, "-q", "list_queues", "name", "type", "state", "--offline").stdout
    assert listed.splitlines()[1:] == ["durable\trabbit_classic_queue\tdown"], listed
    listed = ctl(b, "-q", "list_queues", "name", "type", "state", "--online").stdout
    assert listed.splitlines()[1:] == ["up\tclassic\trunning"], listed


def names(node) -> set[str]:
    return {q["name"] for q in api(node, "GET", "/queues").json()}


def rss_mib(node) -> float:
    with open(f"/proc/{node.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_publisher_into_a_stalled_home_is_held_not_buffered(make_node):
    """The home stops reading (SIGSTOP): the link to it fills, and the publisher on the other
    node is held back (its connection in flow) instead of that node buffering what it sends."""
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    connect(a).queue_declare("q", durable=True)  # (a transient one goes once a's lease runs out)
    before = rss_mib(b)
    stop, sent = threading.Event(), [0]
    a.proc.send_signal(signal.SIGSTOP)
    try:
        publisher = flood(b, "q", stop, sent)
        time.sleep(4)
        states = [c["state"] for c in api(b, "GET", "/connections").json()]
        assert states == ["flow"], states
        assert rss_mib(b) - before < 120, (rss_mib(b) - before, sent)
    finally:
        stop.set()
        a.proc.send_signal(signal.SIGCONT)
    publisher.join(30)
    assert not publisher.is_alive()
    wait_for(lambda: connect(b).queue_declare("q", passive=True).method.message_count == sent[0], timeout=30,
             what="every message in the queue once its home runs again")


def test_a_message_for_two_queues_of_one_home_reaches_both(make_node):
    """Routed through b to two queues that live on a (sent to a once, for both)."""
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    ca = connect(a)
    for name in ("q1", "q2"):
        ca.queue_declare(name, durable=True)
        ca.queue_bind(name, "amq.fanout")
    cb = connect(b)
    cb.confirm_delivery()
    for i in range(10):
        cb.basic_publish("amq.fanout", "", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    for name in ("q1", "q2"):
        bodies = [ca.basic_get(name, auto_ack=True)[2] for _ in range(10)]
        assert bodies == [f"m{i}".encode() for i in range(10)], name
        assert ca.queue_declare(name, passive=True).method.message_count == 0


def test_an_exclusive_queue_is_gone_once_its_connection_is_closed(make_node):
    """close-ok waits for its exclusive queues' deletion through the cluster's log: on its node
    they are gone at once (404), on another as soon as that node has applied the change."""
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    for i in range(5):
        ca = connect(a)
        ca.queue_declare(f"excl-{i}", exclusive=True)
        ca.connection.close()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            connect(a).queue_declare(f"excl-{i}", passive=True)
        assert closed.value.reply_code == 404, closed.value
        wait_for(lambda: refused(b, f"excl-{i}") == 404, timeout=5, what="the queue gone on b")


def refused(node, name: str) -> int | None:
    """The reply code of a passive declare of `name` through `node` (None: it exists)."""
    try:
        connect(node).queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as err:
        return err.reply_code
    return None


def flood(node, queue: str, stop: threading.Event, sent: list) -> threading.Thread:
    """A thread publishing 64 KiB messages into `queue` through `node` until `stop` (counted in
    sent[0]); each publish blocks while the node reads nothing from the publisher."""
    def publish() -> None:
        channel = connect(node)
        body = b"x" * 65536
        while not stop.is_set():
            channel.basic_publish("", queue, body)
            sent[0] += 1
        channel.connection.close()
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    return thread


def home_count(node) -> int:
    """The ready count of "q" as its home node (`node`) has it now."""
    return api(node, "GET", "/queues/%2F/q").json()["messages_ready"]


def test_an_alarm_on_the_home_holds_a_publisher_on_another_node(make_node):
    """A resource alarm on the home blocks the publisher on the other node (as every node's
    publishers, test_alarms.py) and the home reads nothing from the link meanwhile; once the
    alarm clears the publisher goes on and loses nothing."""
    a = make_node("warren-a@localhost")
    b = make_node("warren-b@localhost")
    connect(a).queue_declare("q", durable=True)
    ctl(a, "set_vm_memory_high_watermark", "0.0")
    stop, sent = threading.Event(), [0]
    publisher = flood(b, "q", stop, sent)
    try:
        wait_for(lambda: [c["state"] for c in api(b, "GET", "/connections").json()] == ["blocked"], timeout=15,
                 what="the publisher on b held back")
        # a reads nothing from the link meanwhile: its queue does not grow
        held = home_count(a)
        time.sleep(1.5)
        assert home_count(a) == held
    finally:
        stop.set()
        ctl(a, "set_vm_memory_high_watermark", "0.4")
    publisher.join(30)
    assert not publisher.is_alive()
    wait_for(lambda: connect(b).queue_declare("q", passive=True).method.message_count == sent[0], timeout=30,
             what="every message in the queue once the alarm has cleared")
