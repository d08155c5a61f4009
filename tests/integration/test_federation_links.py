"""Federation between two Warren brokers (Warren only: each test starts its own two brokers;
tests/integration/test_federation.py describes RabbitMQ's behaviour on one node, upstream and
downstream in two vhosts): exchange federation both ways without echoes (cycle detection by
cluster name and vhost), max-hops over a chain, a queue link that pulls only for a consumer,
the upstream's resources cleaned up when the policy goes, who may see and restart links, and
warrenctl's federation verbs."""

from functools import partial
import subprocess
import time
import uuid

import pika
import pytest
import requests

from warrenctl_path import WARRENCTL

from .http_api import wait_for

PASSWORD = "fed-pw"


wait = partial(wait_for, timeout=10.0)


class Node:
    """One broker with its management API, named (cluster_name) for cycle detection."""

    def __init__(self, broker, name):
        self.broker = broker
        self.name = name
        self.call("PUT", "/global-parameters/cluster_name", {"value": name}, ok=(201, 204))

    def call(self, method, path, body=None, auth=("guest", "guest"), ok=None):
        r = requests.request(method, self.broker.api + path, json=body, auth=auth, timeout=10)
        if ok is not None:
            assert r.status_code in ok, (method, path, r.status_code, r.text)
        return r

    def channel(self):
        return pika.BlockingConnection(self.broker.pika_params()).channel()

    @property
    def uri(self):
        return f"amqp://guest:guest@127.0.0.1:{self.broker.port}"

    def upstream(self, name, other, **keys):
        self.call("PUT", f"/parameters/federation-upstream/%2F/{name}", {"value": {"uri": other.uri, **keys}},
                  ok=(201, 204))

    def policy(self, name, pattern, definition, apply_to="exchanges"):
        self.call("PUT", f"/policies/%2F/{name}", {"pattern": pattern, "apply-to": apply_to,
                                                   "definition": definition}, ok=(201, 204))

    def links(self, auth=("guest", "guest")):
        return self.call("GET", "/federation-links", auth=auth, ok=(200,)).json()

    def running(self, count=1):
        return wait(lambda: [link for link in self.links() if link["status"] == "running"]
                    if len([link for link in self.links() if link["status"] == "running"]) >= count else None,
                    what=f"{count} running link(s) on {self.name}")


@pytest.fixture
def two(make_broker):
    return Node(make_broker(), "up-node"), Node(make_broker(), "down-node")


def drain(ch, queue, expected, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        got.append((body, props))
    return got


def test_exchange_federation_between_two_brokers(two):
    up, down = two
    x = f"fx-{uuid.uuid4().hex[:6]}"
    dch = down.channel()
    dch.exchange_declare(x, "direct", durable=True)
    dch.queue_declare("fq", durable=True)
    dch.queue_bind("fq", x, "k")
    down.upstream("u", up, **{"max-hops": 2})
    down.policy("fed", f"^{x}$", {"federation-upstream": "u"})
    [link] = down.running()
    assert (link["type"], link["exchange"], link["upstream_exchange"], link["upstream"]) == ("exchange", x, x, "u")
    assert link["uri"] == f"amqp://127.0.0.1:{up.broker.port}"  # (no credentials)
    assert link["local_connection"] == "Federation link (upstream: u, policy: fed)"
    # Upstream: the exchange (declared like the downstream one), the link's queue bound through
    # the internal x-federation-upstream exchange with the downstream binding and x-bound-from.
    queue = "federation: " + x + " -> down-node"
    wait(lambda: up.call("GET", f"/queues/%2F/{requests.utils.quote(queue, safe='')}").status_code == 200,
         what="the upstream queue")
    info = up.call("GET", f"/queues/%2F/{requests.utils.quote(queue, safe='')}", ok=(200,)).json()
    assert (info["durable"], info["arguments"]) == (True, {"x-internal-purpose": "federation"})
    assert up.call("GET", f"/exchanges/%2F/{x}", ok=(200,)).json()["type"] == "direct"
    internal = wait(lambda: [b for b in up.call("GET", "/bindings/%2F", ok=(200,)).json()
                             if b["source"] == x and b["routing_key"] == "k"], what="the mirrored binding")
    [b] = internal
    assert b["destination"] == queue + " B"
    assert b["arguments"]["x-bound-from"] == [{"cluster-name": "down-node", "vhost": "/", "exchange": f"/:{x} B",
                                               "hops": 2}]
    ix = up.call("GET", f"/exchanges/%2F/{requests.utils.quote(queue + ' B', safe='')}", ok=(200,)).json()
    assert (ix["type"], ix["internal"], ix["auto_delete"], ix["arguments"]) == (
        "x-federation-upstream", True, True,
        {"x-max-hops": 2, "x-downstream-name": "down-node", "x-downstream-vhost": "/",
         "x-internal-purpose": "federation"})
    # Messages published upstream arrive downstream, x-received-from first in their headers.
    uch = up.channel()
    uch.confirm_delivery()
    for i in range(50):
        uch.basic_publish(x, "k", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2, user_id="guest"))
    uch.basic_publish(x, "other", b"not bound downstream")
    got = drain(dch, "fq", 50)
    assert [body for body, _ in got] == [f"m{i}".encode() for i in range(50)]
    props = got[0][1]
    assert props.headers["x-received-from"] == [{
        "uri": f"amqp://127.0.0.1:{up.broker.port}", "exchange": x, "redelivered": False,
        "cluster-name": "up-node", "vhost": "/"}]
    assert props.user_id is None  # (trust-user-id false)
    assert dch.basic_get("fq", auto_ack=True)[0] is None
    # An unbind downstream is mirrored upstream; the policy gone, the link cleans up.
    dch.queue_unbind("fq", x, "k")
    wait(lambda: not [b for b in up.call("GET", "/bindings/%2F", ok=(200,)).json() if b["source"] == x],
         what="the unbind upstream")
    down.call("DELETE", "/policies/%2F/fed", ok=(204,))
    wait(lambda: down.links() == [], what="the link to stop")
    wait(lambda: up.call("GET", f"/queues/%2F/{requests.utils.quote(queue, safe='')}").status_code == 404,
         what="the upstream queue to go")


def test_both_ways_without_echoes(two):
    """A and B federate the same exchange from each other: a message published on either
    arrives on the other once, never back (its own cluster name in x-received-from)."""
    a, b = two
    x = "both"
    chans = {}
    for node, other in ((a, b), (b, a)):
        ch = chans[node.name] = node.channel()
        ch.exchange_declare(x, "fanout", durable=True)
        ch.queue_declare("seen", durable=True)
        ch.queue_bind("seen", x)
        node.upstream("peer", other, **{"max-hops": 5})
        node.policy("fed", f"^{x}$", {"federation-upstream-set": "all"})
    a.running()
    b.running()
    # Each side's binding reached the other (the internal exchanges' bindings), then publish.
    time.sleep(0.5)
    chans["up-node"].basic_publish(x, "", b"from-a")
    chans["down-node"].basic_publish(x, "", b"from-b")
    got_a = drain(chans["up-node"], "seen", 2)
    got_b = drain(chans["down-node"], "seen", 2)
    assert sorted(body for body, _ in got_a) == [b"from-a", b"from-b"]
    assert sorted(body for body, _ in got_b) == [b"from-a", b"from-b"]
    time.sleep(0.5)  # (an echo would have come back by now)
    assert chans["up-node"].basic_get("seen", auto_ack=True)[0] is None
    assert chans["down-node"].basic_get("seen", auto_ack=True)[0] is None


def test_queue_federation_pulls_only_for_a_consumer(two):
    up, down = two
    uch, dch = up.channel(), down.channel()
    uch.queue_declare("work", durable=True)
    for i in range(20):
        uch.basic_publish("", "work", f"j{i}".encode(), pika.BasicProperties(delivery_mode=2))
    dch.queue_declare("work", durable=True)
    down.upstream("u", up)
    down.policy("fq", "^work$", {"federation-upstream": "u"}, apply_to="queues")
    [link] = down.running()
    assert (link["type"], link["queue"], link["upstream_queue"]) == ("queue", "work", "work")
    time.sleep(0.5)  # no consumer downstream: nothing moves
    assert dch.queue_declare("work", passive=True).method.message_count == 0
    assert uch.queue_declare("work", passive=True).method.message_count == 20
    got = []
    dch.basic_qos(prefetch_count=5)
    dch.basic_consume("work", lambda ch, m, p, body: (got.append((body, p)), ch.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + 10
    while len(got) < 20 and time.monotonic() < deadline:
        dch.connection.process_data_events(0.05)
    assert sorted(body for body, _ in got) == sorted(f"j{i}".encode() for i in range(20))
    headers = got[0][1].headers
    assert headers["x-original-exchange"] == "" and headers["x-original-routing-key"] == "work"
    [entry] = headers["x-received-from"]
    assert (entry["queue"], entry["visit-count"], entry["redelivered"]) == ("work", 1, False)
    assert uch.queue_declare("work", passive=True).method.message_count == 0


def test_who_may_see_links(two):
    """/api/federation-links: monitoring and administrator users (rabbit_federation_mgmt's
    is_authorized_monitor), who see the links of the vhosts they may use; others 401."""
    up, down = two
    down.channel().exchange_declare("wx", "topic", durable=True)
    down.upstream("u", up)
    down.policy("fed", "^wx$", {"federation-upstream": "u"})
    [link] = down.running()
    users = {}
    for tag in ("management", "policymaker", "monitoring", "administrator", ""):
        name = f"fed-{tag or 'none'}-{uuid.uuid4().hex[:4]}"
        down.call("PUT", f"/users/{name}", {"password": PASSWORD, "tags": tag}, ok=(201, 204))
        down.call("PUT", f"/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"}, ok=(201, 204))
        users[tag] = (name, PASSWORD)
    paths = ["/federation-links", "/federation-links/%2F", "/federation-links/state/down",
             "/federation-links/%2F/state/down"]
    restart = f"/federation-links/vhost/%2F/{link['id']}/{link['node']}/restart"
    for tag, reason in (("management", "Not monitor user"), ("policymaker", "Not monitor user"),
                        ("", "Not management user")):
        for path in paths:
            r = down.call("GET", path, auth=users[tag])
            assert (r.status_code, r.json()["reason"]) == (401, reason), (tag, path)
        r = down.call("DELETE", restart, auth=users[tag])
        assert (r.status_code, r.json()["reason"]) == (401, reason), tag
    for tag in ("monitoring", "administrator"):
        assert [entry["id"] for entry in down.links(auth=users[tag])] == [link["id"]]
        assert down.call("GET", "/federation-links/state/down", auth=users[tag], ok=(200,)).json() == []
    assert down.call("DELETE", f"/federation-links/vhost/%2F/nope/{link['node']}/restart",
                     auth=users["monitoring"]).status_code == 404
    assert down.call("DELETE", restart, auth=users["monitoring"]).status_code == 204
    down.running()


def test_warrenctl_federation_status_and_restart(two):
    up, down = two
    down.channel().exchange_declare("cx", "fanout", durable=True)
    down.upstream("u", up)
    down.policy("fed", "^cx$", {"federation-upstream": "u"})
    [link] = down.running()
    ctl = [WARRENCTL, "--data-dir", down.broker.data_dir]

    def run(*args):
        return subprocess.run([*ctl, *args], capture_output=True, text=True, timeout=30)
    r = run("federation_status", "--formatter", "json")
    assert r.returncode == 0, r.stderr
    import json
    [row] = json.loads(r.stdout)
    assert (row["exchange"], row["upstream"], row["status"], row["type"], row["queue"]) == ("cx", "u", "running",
                                                                                          "exchange", "")
    assert run("federation_status", "--only-down", "--formatter", "json").stdout.strip() in ("[]", "")
    r = run("restart_federation_link", link["id"])
    assert r.returncode == 0, r.stderr
    down.running()
    r = run("restart_federation_link", "nope")
    assert r.returncode == 69 and "Link with the given ID was not found" in r.stderr


def test_links_come_back_after_a_kill(two, restart_broker):
    """The downstream broker (where links run) is killed and started again: its links start
    from its definitions, and what was published upstream meanwhile (in the link's durable
    queue there) arrives; nothing confirmed upstream is lost."""
    import signal
    up, down = two
    dch = down.channel()
    dch.exchange_declare("kx", "direct", durable=True)
    dch.queue_declare("kq", durable=True)
    dch.queue_bind("kq", "kx", "k")
    down.upstream("u", up)
    down.policy("fed", "^kx$", {"federation-upstream": "u"})
    down.running()
    uch = up.channel()
    uch.confirm_delivery()
    wait(lambda: [b for b in up.call("GET", "/bindings/%2F", ok=(200,)).json() if b["source"] == "kx"],
         what="the binding upstream")
    for i in range(100):
        uch.basic_publish("kx", "k", f"a{i}".encode(), pika.BasicProperties(delivery_mode=2))
    down_broker = restart_broker(down.broker, sig=signal.SIGKILL)
    for i in range(100):  # (published while the downstream restarts: they wait upstream)
        uch.basic_publish("kx", "k", f"b{i}".encode(), pika.BasicProperties(delivery_mode=2))
    down = Node(down_broker, "down-node")
    down.running()
    expected = {f"a{i}".encode() for i in range(100)} | {f"b{i}".encode() for i in range(100)}
    ch, got = down.channel(), set()

    def all_there():
        while (m := ch.basic_get("kq", auto_ack=True))[0] is not None:
            got.add(m[2])
        return expected <= got
    wait(all_there, timeout=20, what="every message (duplicates allowed)")
    assert got == expected
