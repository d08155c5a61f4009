"""Importing definitions into a cluster (POST /api/definitions[/VHOST], warrenctl
import_definitions) through any node: everything is on every node, through the cluster's log
a batch at a time; a classic queue lives on the importing node; a bad file fails as it fails
on a node alone, with what came before its first bad definition imported everywhere; what a
cluster cannot do yet refuses the whole file; a node down meanwhile has it all once back."""

from __future__ import annotations

import base64
import json
import signal
import urllib.request

import pika
import pytest
import requests

from .test_definitions import AUTH, get, three  # noqa: F401 (a fixture)
from .test_membership import wait_for

DEFINITIONS = {
    "vhosts": [{"name": "imp"}],
    "users": [{"name": "importer", "password": "secret", "tags": "", "limits": {"max-connections": 7}}],
    "permissions": [{"user": "importer", "vhost": "imp", "configure": ".*", "write": ".*", "read": ".*"}],
    "topic_permissions": [{"user": "importer", "vhost": "imp", "exchange": "amq.topic", "write": "w", "read": "r"}],
    "policies": [{"vhost": "imp", "name": "cap", "pattern": "^capped", "apply-to": "queues",
                  "definition": {"max-length": 2}, "priority": 0}],
    "parameters": [{"vhost": "imp", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 50}}],
    "global_parameters": [{"name": "colour", "value": "green"}],
    "exchanges": [{"name": "orders", "vhost": "imp", "type": "topic", "durable": True, "auto_delete": False,
                   "internal": False, "arguments": {}}],
    "queues": [{"name": "capped", "vhost": "imp", "durable": True, "auto_delete": False, "arguments": {}},
               {"name": "ttl", "vhost": "imp", "durable": True, "auto_delete": False,
                "arguments": {"x-message-ttl": 60000}}],
    "bindings": [{"source": "orders", "vhost": "imp", "destination": "capped", "destination_type": "queue",
                  "routing_key": "o.#", "arguments": {}}],
}


def post(node, body, path: str = "/definitions") -> requests.Response:
    return requests.post(node.api + path, json=body, auth=AUTH, timeout=60)


def shown(node) -> dict:
    """What the node's export shows of the definitions the tests import (not the defaults)."""
    data = get(node, "/definitions")
    return {"vhosts": sorted(v["name"] for v in data["vhosts"]),
            "users": sorted((u["name"], json.dumps(u["limits"])) for u in data["users"]),
            "permissions": sorted((p["user"], p["vhost"]) for p in data["permissions"]),
            "topic_permissions": sorted((p["user"], p["vhost"]) for p in data["topic_permissions"]),
            "policies": sorted((p["vhost"], p["name"]) for p in data["policies"]),
            "parameters": sorted((p["vhost"], p["component"]) for p in data["parameters"]),
            "global_parameters": sorted(p["name"] for p in data["global_parameters"]
                                        if p["name"] not in ("internal_cluster_id",)),
            "exchanges": sorted((x["vhost"], x["name"], x["type"]) for x in data["exchanges"]),
            "queues": sorted((q["vhost"], q["name"], json.dumps(q["arguments"])) for q in data["queues"]),
            "bindings": sorted((b["vhost"], b["source"], b["destination"], b["routing_key"]) for b in data["bindings"])}


def test_an_import_through_one_node_is_on_every_node(three):
    a, b, c = three
    assert post(b, DEFINITIONS).status_code == 204
    # Answered once b has applied it: a and c have it within moments.
    expected = shown(b)
    assert ("imp", "capped", "{}") in expected["queues"] and ("importer", '{"max-connections": 7}') in expected["users"]
    for node in (a, c):
        wait_for(lambda: shown(node) == expected, timeout=2, what=f"the import on {node.name}")
    for node in three:
        queues = {q["name"]: q for q in get(node, "/queues/imp")}
        # Classic queues live on the importing node, as RabbitMQ's import declares them there.
        assert {name: q["node"] for name, q in queues.items()} == {"capped": b.name, "ttl": b.name}
        assert queues["capped"]["policy"] == "cap"
        assert get(node, "/users/importer/permissions")[0]["vhost"] == "imp"
    # The imported user logs in on c, publishes to the imported exchange, and the policy caps
    # the queue on its home (b); a consumer on a reads what is left.
    connection = pika.BlockingConnection(c.pika_params(user="importer", password="secret", vhost="imp"))
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(4):
        channel.basic_publish("orders", "o.new", str(n).encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    connection = pika.BlockingConnection(a.pika_params(user="importer", password="secret", vhost="imp"))
    channel = connection.channel()
    assert channel.queue_declare("capped", passive=True).method.message_count == 2
    bodies = [channel.basic_get("capped", auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"2", b"3"]
    connection.close()


def test_importing_the_same_file_again_changes_nothing(three):
    """Existing exchanges and queues are kept as they are, as RabbitMQ's import keeps them."""
    a, b, c = three
    assert post(a, DEFINITIONS).status_code == 204
    before = shown(a)
    assert post(c, DEFINITIONS).status_code == 204
    for node in three:
        wait_for(lambda: shown(node) == before, timeout=2, what=f"the same on {node.name}")
        assert {q["name"]: q["node"] for q in get(node, "/queues/imp")} == {"capped": a.name, "ttl": a.name}


# A file whose third queue is refused (its x-max-length is not a number): what comes before it
# is imported, nothing after it, as on a node alone (and RabbitMQ).
HALF_BAD = {
    "vhosts": [{"name": "half"}],
    "exchanges": [{"name": "x1", "vhost": "half", "type": "fanout"}],
    "queues": [{"name": "good1", "vhost": "half", "arguments": {}},
               {"name": "good2", "vhost": "half", "arguments": {"x-max-length": 10}},
               {"name": "bad", "vhost": "half", "arguments": {"x-max-length": "ten"}},
               {"name": "after", "vhost": "half", "arguments": {}}],
    "bindings": [{"source": "x1", "vhost": "half", "destination": "good1", "destination_type": "queue"}],
}

# Files that fail at other points: a binding to a queue that does not exist (refused when
# applied, not when checked), a user with a bad limit, a vhost's max-queues passed (the whole
# file is refused before anything is imported).
BAD_FILES = {
    "half": HALF_BAD,
    "missing-queue": {"vhosts": [{"name": "nq"}], "exchanges": [{"name": "x", "vhost": "nq", "type": "direct"}],
                      "queues": [{"name": "q", "vhost": "nq"}],
                      "bindings": [{"source": "x", "vhost": "nq", "destination": "q", "destination_type": "queue",
                                    "routing_key": "a"},
                                   {"source": "x", "vhost": "nq", "destination": "nope",
                                    "destination_type": "queue", "routing_key": "b"},
                                   {"source": "x", "vhost": "nq", "destination": "q", "destination_type": "queue",
                                    "routing_key": "c"}]},
    "user-limit": {"users": [{"name": "u1", "password": "p"},
                             {"name": "u2", "password": "p", "limits": {"max-connections": "many"}},
                             {"name": "u3", "password": "p"}]},
    "max-queues": {"vhosts": [{"name": "lim"}], "queues": [{"name": "l1", "vhost": "/"}, {"name": "l2", "vhost": "/"}]},
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file_fails_as_on_a_node_alone(three, make_broker, name):
    """The same answer and the same definitions afterwards as a node alone, on every node."""
    a, b, c = three
    alone = make_broker()
    if name == "max-queues":
        for node in (alone, b):
            assert requests.put(node.api + "/vhost-limits/%2F/max-queues", json={"value": 1}, auth=AUTH,
                                timeout=30).status_code == 204
    answer, alone_answer = post(b, BAD_FILES[name]), post(alone, BAD_FILES[name])
    assert alone_answer.status_code == 400
    assert (answer.status_code, answer.json()) == (400, alone_answer.json())
    expected = shown(alone)
    expected["global_parameters"] = shown(b)["global_parameters"]  # (a cluster has its own name)
    for node in three:
        wait_for(lambda: shown(node) == expected, timeout=2, what=f"the same definitions on {node.name}")


def test_shovels_and_federation_are_imported_as_every_other_definition(three):
    """(They run on one member each: tests/cluster/test_links.py.)"""
    a, b, c = three
    answer = post(c, {
        "queues": [{"name": "a", "vhost": "/", "durable": True, "arguments": {}},
                   {"name": "b", "vhost": "/", "durable": True, "arguments": {}}],
        "parameters": [{"vhost": "/", "component": "shovel", "name": "sh", "value": {
                            "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}},
                       {"vhost": "/", "component": "federation-upstream", "name": "up",
                        "value": {"uri": "amqp://elsewhere"}}],
        "policies": [{"vhost": "/", "name": "fed", "pattern": "^f", "definition": {"federation-upstream-set": "all"}}],
    })
    assert answer.status_code in (200, 201, 204), answer.text
    for node in three:
        wait_for(lambda: sorted((p["component"], p["name"]) for p in get(node, "/parameters")) == [
            ("federation-upstream", "up"), ("shovel", "sh")], timeout=2, what=f"the parameters on {node.name}")
        assert [p["name"] for p in get(node, "/policies")] == ["fed"]


def test_quorum_queues_imported_are_placed_and_replicated_as_a_declare_on_the_importing_node(three):
    a, b, c = three
    answer = post(b, {"queues": [
        {"name": "qq.imp", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "quorum"}},
        {"name": "qq.two", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "quorum", "x-quorum-initial-group-size": 2}}]})
    assert answer.status_code == 204, answer.text
    for node in three:
        wait_for(lambda: {q["name"]: (q.get("leader"), sorted(q.get("members", []))) for q in get(node, "/queues")}
                 == {"qq.imp": (b.name, sorted([a.name, b.name, c.name])), "qq.two": (b.name, sorted([b.name, a.name]))},
                 timeout=5, what=f"the imported quorum queues led by b on {node.name}")
    assert get(b, "/queues/%2F/qq.two")["members"][0] == b.name  # (placement: the importing node first)
    publisher = pika.BlockingConnection(a.pika_params())
    channel = publisher.channel()
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", "qq.imp", str(n).encode(), pika.BasicProperties(delivery_mode=2))
    publisher.close()
    b.proc.send_signal(signal.SIGKILL)  # its leader: the replicas made by the import take over
    b.proc.wait()
    wait_for(lambda: leader(c, "qq.imp") in (a.name, c.name), timeout=15, what="a new leader of the imported queue")
    consumer = pika.BlockingConnection(c.pika_params())
    channel = consumer.channel()
    got = []
    while True:
        method, _, body = channel.basic_get("qq.imp", auto_ack=True)
        if method is None:
            break
        got.append(int(body))
    consumer.close()
    assert got == list(range(20))


def leader(node, queue: str) -> str | None:
    answer = requests.get(f"{node.api}/queues/%2F/{queue}", auth=AUTH, timeout=5)
    return answer.json().get("leader") if answer.ok else None


def test_a_vhost_import_through_one_node(three):
    a, b, c = three
    assert requests.put(a.api + "/vhosts/scoped", auth=AUTH, timeout=30).status_code == 201
    body = {"exchanges": [{"name": "sx", "type": "direct"}], "queues": [{"name": "sq", "arguments": {}}],
            "bindings": [{"source": "sx", "destination": "sq", "destination_type": "queue", "routing_key": "k"}]}
    assert post(c, body, "/definitions/scoped").status_code == 204
    for node in three:
        wait_for(lambda: [(x["source"], x["destination"]) for x in get(node, "/bindings/scoped")
                          if x["source"]] == [("sx", "sq")], timeout=2, what=f"the binding on {node.name}")
        assert [(q["name"], q["node"]) for q in get(node, "/queues/scoped")] == [("sq", c.name)]


def _log_entries(etcd_endpoint: str, prefix: str) -> int:
    """How many entries the cluster's metadata log has had (the version of its key)."""
    key = f"/warren/{prefix}/clusters/default/metadata/log".encode()
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    with urllib.request.urlopen(f"http://{etcd_endpoint}/v3/kv/range", body, timeout=5) as response:
        return int(json.load(response)["kvs"][0]["version"])


def test_a_big_import_takes_a_few_log_entries_and_a_node_down_meanwhile_gets_it(three, make_node, etcd):
    """3,000 exchanges, queues and bindings in a handful of the log's entries (not one each);
    a node stopped during the import has them all once back."""
    a, b, c = three
    c.stop(signal.SIGTERM)
    big = {"exchanges": [{"name": f"x{n}", "vhost": "/", "type": "direct"} for n in range(1000)],
           "queues": [{"name": f"q{n}", "vhost": "/", "durable": True, "arguments": {}} for n in range(1000)],
           "bindings": [{"source": f"x{n}", "vhost": "/", "destination": f"q{n}", "destination_type": "queue",
                         "routing_key": str(n)} for n in range(1000)]}
    before = _log_entries(etcd.endpoints[0], make_node.prefix)
    assert post(a, big).status_code == 204
    assert _log_entries(etcd.endpoints[0], make_node.prefix) - before == 3  # exchanges, queues, bindings
    back = make_node(c.name, data_dir=c.data_dir, port=c.port, dist_port=c.dist_port)
    expected = shown(a)
    assert len(expected["bindings"]) == 1000
    # (The node that was down gets the three entries in one message of etcd's watch.)
    for node in (b, back):
        wait_for(lambda: shown(node) == expected, timeout=10, what=f"the import on {node.name}")
    # q999 lives on a: published through the node that was down, read through b.
    connection = pika.BlockingConnection(back.pika_params())
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("x999", "999", b"late", pika.BasicProperties(delivery_mode=2))
    connection.close()
    connection = pika.BlockingConnection(b.pika_params())
    assert connection.channel().basic_get("q999", auto_ack=True)[2] == b"late"
    connection.close()


def test_warrenctl_imports_through_a_node(three, tmp_path):
    """rabbitmqctl's import_definitions, on a node's machine (its control socket): the same
    import; a refused file gives rabbitmqctl's exit code and the reason."""
    from .test_ctl_cluster import ctl
    a, b, c = three
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps({"vhosts": [{"name": "by-ctl"}], "queues": [{"name": "cq", "vhost": "by-ctl"}]}))
    result = ctl(c, "import_definitions", str(path))
    assert result.returncode == 0, result.stderr
    assert "Successfully imported definitions." in result.stdout
    for node in three:
        wait_for(lambda: [(q["name"], q["node"]) for q in get(node, "/queues/by-ctl")] == [("cq", c.name)],
                 timeout=2, what=f"the queue on {node.name}")
    path.write_text(json.dumps({"parameters": [{"vhost": "by-ctl", "component": "federation-upstream", "name": "up",
                                                "value": {"uri": "amqp://elsewhere"}}]}))
    result = ctl(a, "import_definitions", str(path))
    assert result.returncode == 0, result.stderr
    for node in three:
        wait_for(lambda: [p["name"] for p in get(node, "/parameters/federation-upstream/by-ctl")] == ["up"],
                 timeout=2, what=f"the upstream on {node.name}")
