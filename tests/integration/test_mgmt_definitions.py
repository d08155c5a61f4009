"""Management HTTP API: /api/definitions export and import, RabbitMQ's format.

A RabbitMQ 3.10 export imports into Warren, and Warren's export imports into a fresh Warren
giving the same export again."""

import copy
import json

import pika
import pytest

from conftest import EXTERNAL, password_hash
from integration.test_mgmt_resources import Api, bad, expect

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the comparison RabbitMQ node has no management plugin")

# What RabbitMQ 3.10.8's GET /api/definitions gives for a small setup (written after one,
# with topic permissions and global parameters).
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8",
    "rabbitmq_version": "3.10.8",
    "product_name": "RabbitMQ",
    "product_version": "3.10.8",
    "users": [
        {"name": "guest", "password_hash": password_hash("guest"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"], "limits": {}},
        {"name": "app", "password_hash": password_hash("s3cret"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [], "limits": {}},
        # The string form of tags of exports before 3.9.
        {"name": "ops", "password_hash": password_hash("opspw", "sha512"),
         "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": "monitoring,management"},
    ],
    "vhosts": [{"name": "/"}, {"name": "prod"}],
    "permissions": [
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "guest", "vhost": "prod", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "app", "vhost": "prod", "configure": "^app\\.", "write": ".*", "read": ".*"},
    ],
    "topic_permissions": [{"user": "app", "vhost": "prod", "exchange": "amq.topic", "write": "^a", "read": ".*"}],
    "parameters": [
        {"value": {"pattern": "^app\\.", "definition": {"max-length": 1000}, "priority": 0, "apply-to": "queues"},
         "vhost": "prod", "component": "operator_policy", "name": "cap"},
    ],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-WAwsmdUb91PfyFNKUUNxjA"},
                          {"name": "cluster_name", "value": "rabbit@example"}],
    "policies": [
        {"vhost": "prod", "name": "ae", "pattern": "^app\\.in$", "apply-to": "exchanges",
         "definition": {"alternate-exchange": "app.unrouted"}, "priority": 1},
        {"vhost": "prod", "name": "ttl", "pattern": "^app\\.", "apply-to": "queues",
         "definition": {"message-ttl": 60000, "max-length": 500}, "priority": 0},
    ],
    "queues": [
        {"name": "app.work", "vhost": "prod", "durable": True, "auto_delete": False,
         "arguments": {"x-max-priority": 5, "x-queue-mode": "lazy"}},
        {"name": "app.unrouted", "vhost": "prod", "durable": True, "auto_delete": False, "arguments": {}},
        {"name": "scratch", "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}},
    ],
    "exchanges": [
        {"name": "app.in", "vhost": "prod", "type": "topic", "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}},
        {"name": "app.unrouted", "vhost": "prod", "type": "fanout", "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}},
        {"name": "app.fan", "vhost": "prod", "type": "headers", "durable": True, "auto_delete": False,
         "internal": True, "arguments": {}},
    ],
    "bindings": [
        {"source": "app.in", "vhost": "prod", "destination": "app.work", "destination_type": "queue",
         "routing_key": "work.#", "arguments": {}},
        {"source": "app.in", "vhost": "prod", "destination": "app.fan", "destination_type": "exchange",
         "routing_key": "job.#", "arguments": {}},
        {"source": "app.fan", "vhost": "prod", "destination": "app.work", "destination_type": "queue",
         "routing_key": "", "arguments": {"x-match": "any", "kind": "job"}},
        {"source": "app.unrouted", "vhost": "prod", "destination": "app.unrouted", "destination_type": "queue",
         "routing_key": "", "arguments": {}},
    ],
}


def unordered(items) -> list:
    return sorted(json.dumps(i, sort_keys=True) for i in items)


def _import(api, data):
    return api.post("/definitions", data=json.dumps(data), headers={"content-type": "application/json"})


def test_rabbitmq_export_imports(make_broker):
    b = make_broker()
    api = Api(b)
    expect(_import(api, RABBITMQ_EXPORT), 204)
    assert api.get("/users/ops").json()["tags"] == ["monitoring", "management"]
    expect(Api(b, "ops", "opspw").get("/vhosts"), 200)  # a monitoring user may read
    assert api.get("/permissions/prod/app").json()["configure"] == "^app\\."
    assert api.get("/exchanges/prod/app.in").json()["policy"] == "ae"
    work = api.get("/queues/prod/app.work").json()
    assert (work["durable"], work["arguments"], work["policy"], work["operator_policy"]) == (
        True, {"x-max-priority": 5, "x-queue-mode": "lazy"}, "ttl", "cap")
    assert api.get("/exchanges/prod/app.fan").json()["internal"] is True
    assert api.get("/queues/%2F/scratch").json()["durable"] is False
    # The imported user logs in with the imported hash; the policy's alternate exchange works.
    conn = pika.BlockingConnection(b.pika_params(user="app", password="s3cret", vhost="prod"))
    ch = conn.channel()
    ch.basic_publish("app.in", "work.x", b"direct")
    ch.basic_publish("app.in", "other", b"to-ae")
    ch.basic_publish("app.in", "job.1", b"by-header", pika.BasicProperties(headers={"kind": "job"}))
    ch.basic_publish("app.in", "job.2", b"no-header")
    assert [ch.basic_get("app.work", auto_ack=True)[2] for _ in range(2)] == [b"direct", b"by-header"]
    assert ch.basic_get("app.work", auto_ack=True)[0] is None  # no header: the headers exchange drops it
    assert ch.basic_get("app.unrouted", auto_ack=True)[2] == b"to-ae"
    conn.close()
    exported = expect(api.get("/definitions"), 200).json()
    assert exported["policies"] == RABBITMQ_EXPORT["policies"]
    assert exported["parameters"] == RABBITMQ_EXPORT["parameters"]
    # Every global parameter is kept, as RabbitMQ keeps them (cluster_name also names the broker).
    assert (exported["topic_permissions"], exported["global_parameters"]) == (
        RABBITMQ_EXPORT["topic_permissions"], RABBITMQ_EXPORT["global_parameters"])
    assert api.get("/cluster-name").json() == {"name": "rabbit@example"}
    assert [(u["name"], u["password_hash"], u["tags"]) for u in exported["users"]] == [
        (u["name"], u["password_hash"], u["tags"] if isinstance(u["tags"], list) else u["tags"].split(","))
        for u in RABBITMQ_EXPORT["users"]]
    assert unordered(exported["bindings"]) == unordered(RABBITMQ_EXPORT["bindings"])
    assert unordered(exported["exchanges"]) == unordered(RABBITMQ_EXPORT["exchanges"])
    assert unordered(exported["queues"]) == unordered(RABBITMQ_EXPORT["queues"])
    assert exported["permissions"] == RABBITMQ_EXPORT["permissions"]


def test_export_shape(api_broker):
    b, api = api_broker
    expect(_import(api, RABBITMQ_EXPORT), 204)
    expect(api.put("/exchanges/%2F/transient-x", {"type": "fanout", "durable": False}), 201)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("exclusive-q", exclusive=True)
    response = expect(api.get("/definitions?download=defs.json"), 200)
    assert response.headers["Content-Disposition"] == "attachment; filename=defs.json"
    exported = response.json()
    # RabbitMQ 3.10.8's keys, in its order; vhosts by name only; its version, Warren's product.
    assert list(exported) == ["rabbit_version", "rabbitmq_version", "product_name", "product_version", "users",
                              "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
                              "policies", "queues", "exchanges", "bindings"]
    assert [exported[k] for k in ("rabbit_version", "rabbitmq_version", "product_name")] == ["3.10.8", "3.10.8",
                                                                                             "Warren"]
    assert exported["vhosts"] == [{"name": "/"}, {"name": "prod"}]
    names = [(x["vhost"], x["name"]) for x in exported["exchanges"]]
    assert ("/", "transient-x") in names  # transient objects are exported (not the data dir's copy)
    assert not [n for v, n in names if n == "" or n.startswith("amq.")]
    assert "exclusive-q" not in [q["name"] for q in exported["queues"]]
    conn.close()


@pytest.fixture
def api_broker(make_broker):
    b = make_broker()
    return b, Api(b)


def test_round_trip_gives_the_same_export(make_broker):
    a = make_broker()
    api = Api(a)
    expect(_import(api, RABBITMQ_EXPORT), 204)
    expect(api.put("/exchanges/prod/app.transient", {"type": "direct", "durable": False, "auto_delete": True,
                                                     "arguments": {"alternate-exchange": "app.unrouted"}}), 201)
    expect(api.put("/queues/prod/app.transient", {"durable": False, "arguments": {"x-message-ttl": 5}}), 201)
    expect(api.post("/bindings/prod/e/app.transient/q/app.transient",
                    {"routing_key": "t", "arguments": {"n": 1, "s": "x", "f": 1.5, "l": [1, "a"]}}), 201)
    expect(api.put("/vhosts/empty", {"description": "nothing here", "tags": ["a", "b"]}), 201)
    expect(api.put("/users/nopass", {"tags": "policymaker"}), 201)
    first = expect(api.get("/definitions"), 200).json()
    fresh = make_broker()
    expect(_import(Api(fresh), first), 204)
    second = expect(Api(fresh).get("/definitions"), 200).json()
    assert second == first
    # And the same bindings, properties keys included.
    assert Api(fresh).get("/bindings/prod").json() == api.get("/bindings/prod").json()


def test_vhost_definitions(api_broker):
    b, api = api_broker
    expect(_import(api, RABBITMQ_EXPORT), 204)
    exported = expect(api.get("/definitions/prod"), 200).json()
    assert list(exported) == ["rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings"]
    assert list(exported["queues"][0].items()) == [("name", "app.work"), ("durable", True), ("auto_delete", False),
                                                   ("arguments", {"x-max-priority": 5, "x-queue-mode": "lazy"})]
    assert list(exported["exchanges"][0]) == ["name", "type", "durable", "auto_delete", "internal", "arguments"]
    assert exported["bindings"][0] == {"source": "app.in", "destination": "app.work", "destination_type": "queue",
                                       "routing_key": "work.#", "arguments": {}}
    assert [p["name"] for p in exported["policies"]] == ["ae", "ttl"]
    expect(api.get("/definitions/none"), 400, {"error": "bad_request", "reason": "vhost_not_found"})
    # Into another vhost: every item lands there.
    expect(api.put("/vhosts/copy", {}), 201)
    expect(api.post("/definitions/copy", data=json.dumps(exported), headers={"content-type": "application/json"}),
           204)
    copied = api.get("/definitions/copy").json()
    assert copied["queues"] == exported["queues"] and copied["bindings"] == exported["bindings"]
    assert [(p["vhost"], p["name"]) for p in copied["policies"]] == [("copy", "ae"), ("copy", "ttl")]
    assert [(p["vhost"], p["name"]) for p in copied["parameters"]] == [("copy", "cap")]
    expect(api.post("/definitions/none", data="{}"), 400, {"error": "bad_request", "reason": "vhost_not_found"})


def test_import_as_a_form_upload(api_broker):
    b, api = api_broker
    data = {"vhosts": [{"name": "uploaded"}]}
    response = api.session.post(api.base + "/definitions", files={"file": ("defs.json", json.dumps(data))},
                                timeout=10)
    expect(response, 204)
    expect(api.get("/vhosts/uploaded"), 200)


def test_import_bad_input(api_broker):
    b, api = api_broker
    bad(api.post("/definitions", data="{not json"), "failed_to_parse_json")
    bad(api.post("/definitions", data="[]"), "failed_to_parse_json")
    bad(_import(api, {"queues": [{"name": "q", "vhost": "nowhere", "durable": True}]}), "unknown vhost 'nowhere'")
    bad(_import(api, {"policies": [{"vhost": "/", "name": "p", "pattern": "x", "definition": {"expires": 0}}]}),
        "Validation failed\n\n0 is not a valid queue expiry\n (//p)")
    bad(_import(api, {"queues": [{"vhost": "/", "durable": True}]}), "definition is missing the field 'name'")
    # What came before an error stays (as RabbitMQ's import).
    partial = {"vhosts": [{"name": "before-error"}], "queues": [{"name": "q", "vhost": "nowhere"}]}
    bad(_import(api, partial), "unknown vhost 'nowhere'")
    expect(api.get("/vhosts/before-error"), 200)


def test_imported_definitions_survive_a_restart(make_broker, restart_broker):
    b = make_broker()
    expect(_import(Api(b), RABBITMQ_EXPORT), 204)
    before = Api(b).get("/definitions").json()
    b = restart_broker(b, sig=9)
    after = Api(b).get("/definitions").json()
    durable = copy.deepcopy(before)
    durable["queues"] = [q for q in durable["queues"] if q["durable"]]  # the transient queue is gone
    assert after == durable


def test_definitions_bigger_than_a_mebibyte_import(api_broker):
    """aiohttp's default body limit of 1 MiB refused the definitions of ~5,000 queues; Warren's,
    management.http.max_body_size, is RabbitMQ's 10,000,000 bytes (test_mgmt_body_limit.py)."""
    b, api = api_broker
    n = 8000
    defs = {"queues": [{"name": f"big-import-{i}", "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {"x-queue-mode": "default"}} for i in range(n)],
            "bindings": [{"source": "amq.direct", "vhost": "/", "destination": f"big-import-{i}",
                          "destination_type": "queue", "routing_key": f"key-{i}", "arguments": {}}
                         for i in range(n)]}
    assert len(json.dumps(defs)) > 1 << 20
    expect(_import(api, defs), 204)
    names = {q["name"] for q in expect(api.get("/queues/%2F?columns=name"), 200).json()}
    assert {f"big-import-{i}" for i in range(n)} <= names
    bound = expect(api.get("/exchanges/%2F/amq.direct/bindings/source"), 200).json()
    assert len([x for x in bound if x["destination"].startswith("big-import-")]) == n
