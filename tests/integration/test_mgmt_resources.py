"""Management HTTP API: exchanges, queues, bindings, vhosts, users, permissions, policies.

The expected status codes, JSON shapes and reason texts are RabbitMQ 3.10.8's, taken from a
node with the management plugin (the comparison node of the test suite has none, so these
tests run against Warren only)."""

import base64
import time
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, password_hash

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the comparison RabbitMQ node has no management plugin")

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
ACCESS_REFUSED = {"error": "not_authorised", "reason": "Access refused."}
VHOST_NOT_FOUND = {"error": "not_found", "reason": "vhost_not_found"}
LOCKED = ("cannot obtain exclusive access to locked queue '{}' in vhost '/'. It could be originally declared "
          "on another connection or the exclusive property value does not match that of the original "
          "declaration.")


def q(name: str) -> str:
    return quote(name, safe="")


class Api:
    """requests against broker.api as one user."""

    def __init__(self, broker, user="guest", password="guest"):
        self.base = broker.api
        self.session = requests.Session()
        self.session.auth = (user, password)

    def call(self, method, path, json=None, data=None, **kw):
        return self.session.request(method, self.base + path, json=json, data=data, timeout=10, **kw)

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def put(self, path, json=None, **kw):
        return self.call("PUT", path, json=json, **kw)

    def post(self, path, json=None, **kw):
        return self.call("POST", path, json=json, **kw)

    def delete(self, path, **kw):
        return self.call("DELETE", path, **kw)


def expect(response, status, body=None):
    assert response.status_code == status, (response.status_code, response.text)
    if body is not None:
        assert response.json() == body
    return response


def bad(response, reason):
    expect(response, 400, {"error": "bad_request", "reason": reason})


@pytest.fixture
def api(broker):
    return Api(broker)


@pytest.fixture
def cleanup(api):
    """cleanup(path) deletes the object at path after the test."""
    paths = []
    yield paths.append
    for path in reversed(paths):
        api.delete(path)


# ------------------------------------------------------------------ exchanges
def test_exchange_declare_get_list_delete(api, uid, cleanup):
    path = f"/exchanges/%2F/mx-{uid}"
    cleanup(path)
    expect(api.put(path, {"type": "topic", "durable": True, "arguments": {"alternate-exchange": "ae"}}), 201)
    expect(api.put(path, {"type": "topic", "durable": True, "arguments": {"alternate-exchange": "ae"}}), 204)
    got = expect(api.get(path), 200).json()
    assert {k: got[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")} == {
        "name": f"mx-{uid}", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {"alternate-exchange": "ae"}}
    assert got["incoming"] == [] and got["outgoing"] == []
    assert "policy" not in got
    assert got["message_stats"]["publish_in"] == 0
    names = [x["name"] for x in expect(api.get("/exchanges/%2F"), 200).json()]
    assert names == sorted(names) and f"mx-{uid}" in names and "" in names and "amq.rabbitmq.trace" in names
    assert f"mx-{uid}" in [x["name"] for x in api.get("/exchanges").json() if x["vhost"] == "/"]
    expect(api.delete(path), 204)
    expect(api.get(path), 404, NOT_FOUND)
    expect(api.delete(path), 404, NOT_FOUND)


def test_exchange_defaults_are_rabbitmqs(api, uid, cleanup):
    path = f"/exchanges/%2F/mx-{uid}"
    cleanup(path)
    expect(api.put(path, {}), 201)
    got = api.get(path).json()
    assert (got["type"], got["durable"], got["auto_delete"], got["internal"]) == ("direct", False, False, False)


def test_exchange_redeclare_must_be_equivalent(api, uid, cleanup):
    path = f"/exchanges/%2F/mx-{uid}"
    cleanup(path)
    expect(api.put(path, {"type": "direct", "durable": True}), 201)
    bad(api.put(path, {"type": "fanout", "durable": True}),
        f"inequivalent arg 'type' for exchange 'mx-{uid}' in vhost '/': received 'fanout' but current is 'direct'")
    bad(api.put(path, {"type": "direct", "durable": False}),
        f"inequivalent arg 'durable' for exchange 'mx-{uid}' in vhost '/': received 'false' but current is 'true'")
    bad(api.put("/exchanges/%2F/amq.direct", {"type": "direct"}),
        "inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': received 'false' but current is 'true'")
    expect(api.put("/exchanges/%2F/amq.direct", {"type": "direct", "durable": True}), 204)


def test_exchange_reserved_names(api, uid):
    expect(api.put(f"/exchanges/%2F/amq.x-{uid}", {"type": "direct"}), 401, ACCESS_REFUSED)
    expect(api.put("/exchanges/%2F/amq.default", {"type": "direct", "durable": True}), 401, ACCESS_REFUSED)
    expect(api.delete("/exchanges/%2F/amq.direct"), 401, ACCESS_REFUSED)
    expect(api.delete(f"/exchanges/%2F/amq.none-{uid}"), 404, NOT_FOUND)  # missing comes first
    expect(api.delete("/exchanges/%2F/amq.default"), 401, ACCESS_REFUSED)
    default = expect(api.get("/exchanges/%2F/amq.default"), 200).json()
    assert (default["name"], default["type"], default["durable"]) == ("", "direct", True)
    assert api.get("/exchanges/%2F/amq.direct").json()["name"] == "amq.direct"


def test_exchange_bad_input(api, uid, cleanup):
    path = f"/exchanges/%2F/mx-{uid}"
    cleanup(path)
    bad(api.put(path, {"type": f"no-such-type-{uid}"}), f"unknown exchange type 'no-such-type-{uid}'")
    bad(api.put(path, data="garbage", headers={"content-type": "application/json"}), "not_json")
    bad(api.put(path, data="[1]", headers={"content-type": "application/json"}), "not_json")
    bad(api.put(path, {"type": "direct", "durable": "abc"}), ["not_boolean", "abc"])
    bad(api.put(path, {"type": "direct", "arguments": {"a": None}}), "null_not_allowed")
    # JSON integers are RabbitMQ's 'long' field type.
    bad(api.put(path, {"type": "direct", "arguments": {"alternate-exchange": 5}}),
        f"invalid type 'long' for arg 'alternate-exchange' in exchange 'mx-{uid}' in vhost '/'")
    expect(api.get(path), 404, NOT_FOUND)
    expect(api.put(f"/exchanges/nov-{uid}/x", {"type": "direct"}), 404, VHOST_NOT_FOUND)
    expect(api.get(f"/exchanges/nov-{uid}/x"), 404, NOT_FOUND)
    expect(api.get(f"/exchanges/nov-{uid}"), 404, NOT_FOUND)


def test_exchange_delete_if_unused(api, uid, cleanup):
    x, x2 = f"/exchanges/%2F/mx-{uid}", f"/exchanges/%2F/mx2-{uid}"
    cleanup(x)
    cleanup(x2)
    expect(api.put(x, {"type": "fanout"}), 201)
    expect(api.put(x2, {"type": "fanout"}), 201)
    expect(api.post(f"/bindings/%2F/e/mx-{uid}/e/mx2-{uid}", {}), 201)
    bad(api.delete(x + "?if-unused=true"), f"exchange 'mx-{uid}' in vhost '/' in use")
    expect(api.delete(x2), 204)  # its bindings go with it
    expect(api.delete(x + "?if-unused=true"), 204)


def test_exchange_bindings_source_and_destination(api, uid, cleanup):
    for name in (f"mx-{uid}", f"mx2-{uid}"):
        cleanup(f"/exchanges/%2F/{name}")
        expect(api.put(f"/exchanges/%2F/{name}", {"type": "direct"}), 201)
    cleanup(f"/queues/%2F/mq-{uid}")
    expect(api.put(f"/queues/%2F/mq-{uid}", {}), 201)
    expect(api.post(f"/bindings/%2F/e/mx-{uid}/q/mq-{uid}", {"routing_key": "k1"}), 201)
    expect(api.post(f"/bindings/%2F/e/mx-{uid}/e/mx2-{uid}", {}), 201)
    source = expect(api.get(f"/exchanges/%2F/mx-{uid}/bindings/source"), 200).json()
    assert source == [
        {"source": f"mx-{uid}", "vhost": "/", "destination": f"mq-{uid}", "destination_type": "queue",
         "routing_key": "k1", "arguments": {}, "properties_key": "k1"},
        {"source": f"mx-{uid}", "vhost": "/", "destination": f"mx2-{uid}", "destination_type": "exchange",
         "routing_key": "", "arguments": {}, "properties_key": "~"}]
    assert api.get(f"/exchanges/%2F/mx2-{uid}/bindings/destination").json() == source[1:]
    assert api.get(f"/exchanges/%2F/mx2-{uid}/bindings/source").json() == []
    # RabbitMQ answers an empty list for a missing exchange.
    assert expect(api.get(f"/exchanges/%2F/none-{uid}/bindings/source"), 200).json() == []


# -------------------------------------------------------------------- publish
def test_publish_routes_and_reports_routed(api, broker, uid, cleanup, channel):
    queue = f"mq-{uid}"
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    props = {"content_type": "text/plain", "delivery_mode": 2, "priority": 3, "correlation_id": "c",
             "reply_to": "r", "expiration": "60000", "message_id": "m1", "timestamp": 1700000000, "type": "t",
             "app_id": "a", "headers": {"s": "x", "n": 7, "b": True, "l": [1, "a"], "t": {"k": "v"}}}
    body = {"properties": props, "routing_key": queue, "payload": "hello", "payload_encoding": "string"}
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})
    body = {"properties": {}, "routing_key": queue, "payload": base64.b64encode(b"\x00\xff").decode(),
            "payload_encoding": "base64"}
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})
    body["routing_key"] = f"nowhere-{uid}"
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": False})
    method, properties, payload = channel.basic_get(queue, auto_ack=True)
    assert (method.exchange, method.routing_key, payload) == ("", queue, b"hello")
    assert (properties.content_type, properties.delivery_mode, properties.priority, properties.correlation_id,
            properties.reply_to, properties.expiration, properties.message_id, properties.timestamp,
            properties.type, properties.app_id) == ("text/plain", 2, 3, "c", "r", "60000", "m1", 1700000000,
                                                    "t", "a")
    assert properties.headers == {"s": "x", "n": 7, "b": True, "l": [1, "a"], "t": {"k": "v"}}
    assert channel.basic_get(queue, auto_ack=True)[2] == b"\x00\xff"


def test_publish_reaches_a_consumer(api, uid, connection, channel):
    queue = channel.queue_declare(f"mq-{uid}", exclusive=True).method.queue
    got = []
    channel.basic_consume(queue, lambda ch, m, p, b: got.append(b), auto_ack=True)
    body = {"properties": {}, "routing_key": queue, "payload": "to-consumer", "payload_encoding": "string"}
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})
    deadline = time.monotonic() + 3
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"to-consumer"]


def test_publish_bad_input(api, uid):
    url = "/exchanges/%2F/amq.default/publish"
    bad(api.post(url, {}), "[{key_missing,routing_key},\n {key_missing,properties},\n {key_missing,payload},\n"
                           " {key_missing,payload_encoding}]")
    bad(api.post(url, {"payload_encoding": "string"}),
        "[{key_missing,routing_key},{key_missing,properties},{key_missing,payload}]")
    ok = {"properties": {}, "routing_key": "", "payload": "x", "payload_encoding": "string"}
    bad(api.post(url, {**ok, "payload_encoding": "base64", "payload": "!!"}), ["not_base64", "!!"])
    bad(api.post(url, {**ok, "payload_encoding": "zzz"}), ["unsupported_encoding", "zzz"])
    bad(api.post(url, {**ok, "payload": 5}), "payload_not_string")
    bad(api.post(url, {**ok, "properties": {"delivery_mode": "x"}}), ["not_int", "delivery_mode"])
    bad(api.post(url, {**ok, "properties": {"headers": {"a": None}}}), "null_not_allowed")
    bad(api.post(url, {**ok, "properties": {"user_id": "bob"}}),
        "406 PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user was 'guest'")
    bad(api.post(f"/exchanges/%2F/none-{uid}/publish", ok), f"404 NOT_FOUND - no exchange 'none-{uid}' in vhost '/'")
    bad(api.post("/exchanges/%2F/amq.rabbitmq.trace/publish", ok),
        "403 ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace' in vhost '/'")
    expect(api.post(url, {**ok, "properties": {"unknown-property": 1}}), 200, {"routed": False})


def test_published_persistent_message_survives_restart(make_broker, restart_broker):
    b = make_broker()
    api = Api(b)
    expect(api.put("/queues/%2F/durable-q", {"durable": True}), 201)
    body = {"properties": {"delivery_mode": 2}, "routing_key": "durable-q", "payload": "kept",
            "payload_encoding": "string"}
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})
    b = restart_broker(b, sig=9)  # the 200 came after the fsync: even a kill keeps it
    got = expect(Api(b).post("/queues/%2F/durable-q/get",
                             {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"}), 200).json()
    assert [(m["payload"], m["properties"]) for m in got] == [("kept", {"delivery_mode": 2})]


# --------------------------------------------------------------------- queues
def test_queue_declare_get_list_delete(api, uid, cleanup):
    path = f"/queues/%2F/mq-{uid}"
    cleanup(path)
    expect(api.put(path, {"durable": True, "arguments": {"x-max-length": 10, "x-message-ttl": 60000}}), 201)
    expect(api.put(path, {"durable": True, "arguments": {"x-max-length": 10, "x-message-ttl": 60000}}), 204)
    got = expect(api.get(path), 200).json()
    assert {k: got[k] for k in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type", "state",
                                "policy", "consumers", "messages", "messages_ready", "messages_unacknowledged",
                                "exclusive_consumer_tag", "consumer_details")} == {
        "name": f"mq-{uid}", "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
        "arguments": {"x-max-length": 10, "x-message-ttl": 60000}, "type": "classic", "state": "running",
        "policy": None, "consumers": 0, "messages": 0, "messages_ready": 0, "messages_unacknowledged": 0,
        "exclusive_consumer_tag": None, "consumer_details": []}
    assert got["message_stats"]["publish"] == 0 and got["messages_details"] == {"rate": 0.0}
    listed = [x for x in expect(api.get("/queues/%2F"), 200).json() if x["name"] == f"mq-{uid}"]
    assert len(listed) == 1 and listed[0]["durable"] is True
    assert f"mq-{uid}" in [x["name"] for x in api.get("/queues").json()]
    expect(api.delete(path), 204)
    expect(api.get(path), 404, NOT_FOUND)
    expect(api.delete(path), 404, NOT_FOUND)


def test_queue_declare_errors(api, uid, cleanup):
    path = f"/queues/%2F/mq-{uid}"
    cleanup(path)
    expect(api.put(path, {"durable": True}), 201)
    bad(api.put(path, {"durable": False}),
        f"inequivalent arg 'durable' for queue 'mq-{uid}' in vhost '/': received 'false' but current is 'true'")
    bad(api.put(f"/queues/%2F/mq2-{uid}", {"arguments": {"x-max-priority": "a"}}),
        f"invalid arg 'x-max-priority' for queue 'mq2-{uid}' in vhost '/': \"expected integer, got longstr\"")
    expect(api.put(f"/queues/%2F/amq.q-{uid}", {}), 401, ACCESS_REFUSED)
    bad(api.put(f"/queues/%2F/mq2-{uid}", {"arguments": {"x-dead-letter-exchange": 5}}),
        f"invalid type 'long' for arg 'x-dead-letter-exchange' in queue 'mq2-{uid}' in vhost '/'")
    expect(api.put(f"/queues/nov-{uid}/q", {}), 404, VHOST_NOT_FOUND)
    bad(api.put(path, data="{", headers={"content-type": "application/json"}), "not_json")
    bad(api.put(f"/queues/%2F/mq3-{uid}", {"durable": False, "arguments": {"x-queue-type": "quorum"}}),
        f"invalid property 'non-durable' for queue 'mq3-{uid}' in vhost '/'")


def test_queue_depths_and_consumers(api, uid, connection, channel):
    name = channel.queue_declare(f"mq-{uid}", exclusive=True).method.queue
    for i in range(3):
        channel.basic_publish("", name, b"abc")
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(name, lambda *a: None, consumer_tag=f"ctag-{uid}", exclusive=True)
    deadline = time.monotonic() + 3
    got = {}
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
        got = api.get(f"/queues/%2F/{name}").json()
        if got["messages_unacknowledged"] == 1:
            break
    assert (got["messages"], got["messages_ready"], got["messages_unacknowledged"], got["consumers"],
            got["exclusive"], got["exclusive_consumer_tag"]) == (3, 2, 1, 1, True, f"ctag-{uid}")
    assert (got["message_bytes"], got["message_bytes_ready"], got["message_bytes_unacknowledged"]) == (9, 6, 3)
    assert got["message_stats"]["publish"] == 3 and got["message_stats"]["deliver"] == 1
    [consumer] = got["consumer_details"]
    assert (consumer["consumer_tag"], consumer["exclusive"], consumer["ack_required"], consumer["prefetch_count"],
            consumer["queue"]) == (f"ctag-{uid}", True, True, 1, {"name": name, "vhost": "/"})


def _publish(api, queue, *payloads, properties=None):
    for p in payloads:
        body = {"properties": properties or {}, "routing_key": queue, "payload": p, "payload_encoding": "string"}
        expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})


def _get(api, queue, count, ackmode, encoding="auto", **extra):
    return expect(api.post(f"/queues/%2F/{queue}/get", {"count": count, "ackmode": ackmode,
                                                         "encoding": encoding, **extra}), 200).json()


def test_queue_get_ackmodes(api, uid, cleanup):
    queue = f"mq-{uid}"
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    _publish(api, queue, "one", "two", properties={"headers": {"h": 1}, "delivery_mode": 1})
    got = _get(api, queue, 5, "ack_requeue_true")
    assert got == [
        {"payload_bytes": 3, "redelivered": False, "exchange": "", "routing_key": queue, "message_count": 1,
         "properties": {"headers": {"h": 1}, "delivery_mode": 1}, "payload": "one", "payload_encoding": "string"},
        {"payload_bytes": 3, "redelivered": False, "exchange": "", "routing_key": queue, "message_count": 0,
         "properties": {"headers": {"h": 1}, "delivery_mode": 1}, "payload": "two", "payload_encoding": "string"}]
    # Requeued in place, and marked redelivered.
    got = _get(api, queue, 5, "reject_requeue_true", encoding="base64")
    assert [(m["payload"], m["payload_encoding"], m["redelivered"]) for m in got] == [
        ("b25l", "base64", True), ("dHdv", "base64", True)]
    got = _get(api, queue, 1, "ack_requeue_false", truncate=2)
    assert [(m["payload"], m["payload_bytes"], m["message_count"]) for m in got] == [("on", 3, 1)]
    got = _get(api, queue, 1, "reject_requeue_false")
    assert [m["payload"] for m in got] == ["two"]
    assert _get(api, queue, 1, "ack_requeue_true") == []
    assert api.get(f"/queues/%2F/{queue}").json()["messages"] == 0


def test_queue_get_binary_payload_is_base64_in_auto_mode(api, uid, cleanup):
    queue = f"mq-{uid}"
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    body = {"properties": {}, "routing_key": queue, "payload": base64.b64encode(b"\xff\x00").decode(),
            "payload_encoding": "base64"}
    expect(api.post("/exchanges/%2F/amq.default/publish", body), 200, {"routed": True})
    [m] = _get(api, queue, 1, "ack_requeue_false")
    assert (m["payload"], m["payload_encoding"], m["payload_bytes"]) == ("/wA=", "base64", 2)


def test_queue_get_bad_input(api, uid, cleanup):
    queue = f"mq-{uid}"
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    url = f"/queues/%2F/{queue}/get"
    bad(api.post(url, {}), "[{key_missing,ackmode},{key_missing,count},{key_missing,encoding}]")
    bad(api.post(url, {"count": 1, "ackmode": "ack_requeue_true"}), "[{key_missing,encoding}]")
    bad(api.post(url, {"count": "a", "ackmode": "ack_requeue_true", "encoding": "auto"}), ["not_integer", "a"])
    bad(api.post(url, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "xx"}),
        "Unsupported encoding. Please use auto or base64.")
    expect(api.post(f"/queues/%2F/none-{uid}/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}),
           404, {"error": "not_found", "reason": f"NOT_FOUND - no queue 'none-{uid}' in vhost '/'"})


def test_queue_purge_and_conditional_delete(api, uid, cleanup, connection):
    queue = f"mq-{uid}"
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    _publish(api, queue, "a", "b")
    bad(api.delete(f"/queues/%2F/{queue}?if-empty=true"), f"queue '{queue}' in vhost '/' not empty")
    expect(api.delete(f"/queues/%2F/{queue}/contents"), 204)
    assert api.get(f"/queues/%2F/{queue}").json()["messages"] == 0
    expect(api.delete(f"/queues/%2F/none-{uid}/contents"), 404, NOT_FOUND)
    ch = connection.channel()
    ch.basic_consume(queue, lambda *a: None)
    bad(api.delete(f"/queues/%2F/{queue}?if-unused=true"), f"queue '{queue}' in vhost '/' in use")
    expect(api.delete(f"/queues/%2F/{queue}?if-empty=true"), 204)


def test_exclusive_queue_is_locked_for_the_api(api, uid, channel):
    name = channel.queue_declare(f"mq-{uid}", exclusive=True).method.queue
    got = expect(api.get(f"/queues/%2F/{name}"), 200).json()
    assert got["exclusive"] is True and got["owner_pid_details"]["peer_host"] == "127.0.0.1"
    bad(api.post(f"/queues/%2F/{name}/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}),
        "405 RESOURCE_LOCKED - " + LOCKED.format(name))
    bad(api.delete(f"/queues/%2F/{name}/contents"), LOCKED.format(name))
    bad(api.delete(f"/queues/%2F/{name}"), LOCKED.format(name))
    bad(api.put(f"/queues/%2F/{name}", {}), LOCKED.format(name))
    bad(api.post(f"/bindings/%2F/e/amq.direct/q/{name}", {"routing_key": "k"}), LOCKED.format(name))
    channel.queue_declare(name, passive=True)  # still there


# ------------------------------------------------------------------- bindings
def test_binding_create_get_delete_by_properties_key(api, uid, cleanup, channel):
    x, queue = f"mx-{uid}", f"mq-{uid}"
    cleanup(f"/exchanges/%2F/{x}")
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/exchanges/%2F/{x}", {"type": "direct"}), 201)
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    base = f"/bindings/%2F/e/{x}/q/{queue}"
    # Locations and properties keys as RabbitMQ 3.10 computes them (the hash is Erlang's phash2).
    cases = [({"routing_key": "k1"}, "k1", "k1"),
             ({}, "~", "~"),
             ({"routing_key": "k2", "arguments": {"a": 1}}, "k2~Ajat_Q", "k2~Ajat_Q"),
             ({"arguments": {"x": 1}}, "~9nmLZQ", "~9nmLZQ"),
             ({"routing_key": "k", "arguments": {"s": "str", "f": 1.5, "b": True, "t": {"n": 1}, "l": [1, "x"],
                                                 "neg": -5, "big": 123456789012}}, "k~z3HqDA", "k~z3HqDA"),
             ({"routing_key": "a b/c~d_e.f*+é%"}, "a+b%2Fc%7Ed_e.f%2A%2B%C3%A9%25",
              "a%2Bb%252Fc%257Ed_e.f%252A%252B%25C3%25A9%2525")]
    for body, key, location in cases:
        response = expect(api.post(base, body), 201)
        assert response.headers["Location"] == f"{queue}/{location}"
    listed = expect(api.get(base), 200).json()
    assert sorted(b["properties_key"] for b in listed) == sorted(key for _, key, _ in cases)
    for body, key, _ in cases:
        got = expect(api.get(f"{base}/{q(key)}"), 200).json()
        assert got == {"source": x, "vhost": "/", "destination": queue, "destination_type": "queue",
                       "routing_key": body.get("routing_key", ""), "arguments": body.get("arguments", {}),
                       "properties_key": key}
    expect(api.get(f"{base}/~zzzzzz"), 404, NOT_FOUND)
    expect(api.get(f"{base}/nokey"), 404, NOT_FOUND)
    channel.basic_publish(x, "k1", b"routed")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"routed"
    expect(api.delete(f"{base}/k1"), 204)
    expect(api.delete(f"{base}/k1"), 404, NOT_FOUND)
    expect(api.get(f"{base}/k1"), 404, NOT_FOUND)
    channel.basic_publish(x, "k1", b"not routed")
    assert channel.basic_get(queue, auto_ack=True)[0] is None


def test_binding_errors(api, uid, cleanup):
    x, queue = f"mx-{uid}", f"mq-{uid}"
    cleanup(f"/exchanges/%2F/{x}")
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/exchanges/%2F/{x}", {"type": "direct"}), 201)
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    expect(api.post(f"/bindings/%2F/e/none-{uid}/q/{queue}", {}), 404,
           {"error": "not_found", "reason": f"no exchange 'none-{uid}' in vhost '/'"})
    expect(api.post(f"/bindings/%2F/e/{x}/q/none-{uid}", {}), 404,
           {"error": "not_found", "reason": f"no queue 'none-{uid}' in vhost '/'"})
    expect(api.post(f"/bindings/%2F/e/amq.default/q/{queue}", {"routing_key": "a"}), 401, ACCESS_REFUSED)
    expect(api.post(f"/bindings/nov-{uid}/e/{x}/q/{queue}", {}), 404, VHOST_NOT_FOUND)
    bad(api.post(f"/bindings/%2F/e/amq.headers/q/{queue}", {"arguments": {"x-match": "bogus"}}),
        "Invalid x-match field value <<\"bogus\">>; expected all, any, all-with-x, or any-with-x")
    assert expect(api.get(f"/bindings/%2F/e/{x}/q/none-{uid}"), 200).json() == []
    # The implicit binding to the default exchange is listed but cannot be removed.
    implicit = {"source": "", "vhost": "/", "destination": queue, "destination_type": "queue",
                "routing_key": queue, "arguments": {}, "properties_key": queue}
    assert expect(api.get(f"/bindings/%2F/e/amq.default/q/{queue}/{queue}"), 200).json() == implicit
    expect(api.delete(f"/bindings/%2F/e/amq.default/q/{queue}/{queue}"), 401, ACCESS_REFUSED)
    assert api.get(f"/queues/%2F/{queue}/bindings").json() == [implicit]
    assert implicit in api.get("/bindings/%2F").json() and implicit in api.get("/bindings").json()


def test_exchange_to_exchange_binding_routes(api, uid, cleanup, channel):
    source, dest, queue = f"mx-{uid}", f"mx2-{uid}", f"mq-{uid}"
    for name, kind in ((source, "topic"), (dest, "fanout")):
        cleanup(f"/exchanges/%2F/{name}")
        expect(api.put(f"/exchanges/%2F/{name}", {"type": kind}), 201)
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    expect(api.post(f"/bindings/%2F/e/{dest}/q/{queue}", {}), 201)
    response = expect(api.post(f"/bindings/%2F/e/{source}/e/{dest}", {"routing_key": "a.*"}), 201)
    assert response.headers["Location"] == f"{dest}/a.%252A"
    body = {"properties": {}, "routing_key": "a.b", "payload": "via-e2e", "payload_encoding": "string"}
    expect(api.post(f"/exchanges/%2F/{source}/publish", body), 200, {"routed": True})
    assert channel.basic_get(queue, auto_ack=True)[2] == b"via-e2e"
    expect(api.delete(f"/bindings/%2F/e/{source}/e/{dest}/a.%252A"), 204)
    expect(api.post(f"/exchanges/%2F/{source}/publish", body), 200, {"routed": False})


# --------------------------------------------------------------------- vhosts
def test_vhost_lifecycle(api, broker, uid):
    name = f"mv-{uid}"
    expect(api.put(f"/vhosts/{name}", {"description": "d", "tags": "a,b"}), 201)
    try:
        got = expect(api.get(f"/vhosts/{name}"), 200).json()
        assert {k: got[k] for k in ("name", "description", "tags", "metadata", "tracing")} == {
            "name": name, "description": "d", "tags": ["a", "b"], "metadata": {"description": "d", "tags": ["a", "b"]},
            "tracing": False}
        # Whoever creates a vhost over the API may use it.
        assert expect(api.get(f"/vhosts/{name}/permissions"), 200).json() == [
            {"user": "guest", "vhost": name, "configure": ".*", "write": ".*", "read": ".*"}]
        expect(api.put(f"/vhosts/{name}", {"description": "e", "tags": ["x"]}), 204)
        assert api.get(f"/vhosts/{name}").json()["metadata"] == {"description": "e", "tags": ["x"]}
        assert name in [v["name"] for v in expect(api.get("/vhosts"), 200).json()]
        conn = pika.BlockingConnection(broker.pika_params(vhost=name))
        ch = conn.channel()
        ch.queue_declare("in-doomed-vhost")
        expect(api.delete(f"/vhosts/{name}"), 204)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            for _ in range(40):
                conn.process_data_events(time_limit=0.05)
        assert (err.value.reply_code, err.value.reply_text) == (320, f"CONNECTION_FORCED - vhost '{name}' is deleted")
        expect(api.get(f"/vhosts/{name}"), 404, NOT_FOUND)
        expect(api.get(f"/vhosts/{name}/permissions"), 404, NOT_FOUND)
        expect(api.delete(f"/vhosts/{name}"), 404, NOT_FOUND)
        assert [p for p in api.get("/permissions").json() if p["vhost"] == name] == []
    finally:
        api.delete(f"/vhosts/{name}")


def test_names_with_slashes_and_other_characters_in_paths(api, broker, uid):
    vhost, queue, x = f"v/{uid} é", f"q/{uid} %2F", f"x/{uid}+~"
    expect(api.put(f"/vhosts/{q(vhost)}", {}), 201)
    try:
        expect(api.put(f"/queues/{q(vhost)}/{q(queue)}", {}), 201)
        expect(api.put(f"/exchanges/{q(vhost)}/{q(x)}", {"type": "direct"}), 201)
        response = expect(api.post(f"/bindings/{q(vhost)}/e/{q(x)}/q/{q(queue)}", {"routing_key": "r/k"}), 201)
        # Relative to the request's path, as RabbitMQ computes it (here they differ from the vhost on).
        assert response.headers["Location"] == "../../../../" + "/".join(
            quote(p, safe="~").replace("%20", "+") for p in (vhost, "e", x, "q", queue, "r%2Fk"))
        assert api.get(f"/queues/{q(vhost)}/{q(queue)}").json()["name"] == queue
        assert api.get(f"/exchanges/{q(vhost)}/{q(x)}").json()["name"] == x
        assert [b["properties_key"] for b in api.get(f"/bindings/{q(vhost)}/e/{q(x)}/q/{q(queue)}").json()] == [
            "r%2Fk"]
        body = {"properties": {}, "routing_key": "r/k", "payload": "p", "payload_encoding": "string"}
        expect(api.post(f"/exchanges/{q(vhost)}/{q(x)}/publish", body), 200, {"routed": True})
        conn = pika.BlockingConnection(broker.pika_params(vhost=vhost))
        assert conn.channel().basic_get(queue, auto_ack=True)[2] == b"p"
        conn.close()
        expect(api.delete(f"/bindings/{q(vhost)}/e/{q(x)}/q/{q(queue)}/{q('r%2Fk')}"), 204)
        expect(api.delete(f"/queues/{q(vhost)}/{q(queue)}"), 204)
    finally:
        api.delete(f"/vhosts/{q(vhost)}")


# ---------------------------------------------------------------------- users
def test_user_lifecycle(api, broker, uid):
    name = f"mu-{uid}"
    try:
        expect(api.put(f"/users/{name}", {"password": "p1", "tags": "administrator, monitoring"}), 201)
        got = expect(api.get(f"/users/{name}"), 200).json()
        assert (got["name"], got["tags"], got["hashing_algorithm"], got["limits"]) == (
            name, ["administrator", "monitoring"], "rabbit_password_hashing_sha256", {})
        assert name in [u["name"] for u in expect(api.get("/users/without-permissions"), 200).json()]
        expect(Api(broker, name, "p1").get("/users"), 200)  # an administrator now
        expect(api.put(f"/users/{name}", {"password": "p2", "tags": ["management"]}), 204)
        expect(Api(broker, name, "p1").get("/users"), 401, {"error": "not_authorized", "reason": "Login failed"})
        expect(api.put(f"/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"}), 201)
        assert expect(api.get(f"/users/{name}/permissions"), 200).json() == [
            {"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]
        assert name not in [u["name"] for u in api.get("/users/without-permissions").json()]
        conn = pika.BlockingConnection(broker.pika_params(user=name, password="p2"))
        expect(api.delete(f"/users/{name}"), 204)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            for _ in range(40):
                conn.process_data_events(time_limit=0.05)
        assert (err.value.reply_code, err.value.reply_text) == (320, f"CONNECTION_FORCED - user '{name}' is deleted")
        expect(api.get(f"/users/{name}"), 404, NOT_FOUND)
        expect(api.delete(f"/users/{name}"), 404, NOT_FOUND)
        expect(api.get(f"/users/{name}/permissions"), 404, NOT_FOUND)
        assert [p for p in api.get("/permissions").json() if p["user"] == name] == []
    finally:
        api.delete(f"/users/{name}")


def test_user_password_hash_and_bad_input(api, broker, uid):
    name = f"mu-{uid}"
    try:
        hashed = password_hash("secret", "sha512")
        expect(api.put(f"/users/{name}", {"password_hash": hashed, "tags": "",
                                          "hashing_algorithm": "rabbit_password_hashing_sha512"}), 201)
        expect(api.put(f"/permissions/%2F/{name}", {"configure": "", "write": "", "read": ""}), 201)
        assert api.get(f"/users/{name}").json()["password_hash"] == hashed
        pika.BlockingConnection(broker.pika_params(user=name, password="secret")).close()
        bad(api.put(f"/users/{name}", {"tags": "", "password": "a", "password_hash": hashed}),
            "both_password_and_password_hash_are_provided")
        bad(api.put(f"/users/{name}", {"password": "a"}), "tags_not_present")
        bad(api.put(f"/users/{name}", {"password_hash": "abc", "tags": ""}), ["not_base64", "abc"])
        bad(api.put(f"/users/{name}", data="{", headers={"content-type": "application/json"}), "not_json")
        # Replacing a user without a password leaves it without one (as RabbitMQ).
        expect(api.put(f"/users/{name}", {"tags": "x"}), 204)
        assert (api.get(f"/users/{name}").json()["password_hash"], api.get(f"/users/{name}").json()["tags"]) == (
            "", ["x"])
        # An empty password never logs in, even when it is the one set.
        expect(api.put(f"/users/{name}", {"password": "", "tags": ""}), 204)
        assert api.get(f"/users/{name}").json()["password_hash"] != ""
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(broker.pika_params(user=name, password=""))
    finally:
        api.delete(f"/users/{name}")


def test_users_bulk_delete(api, uid):
    names = [f"mb{i}-{uid}" for i in range(3)]
    for name in names:
        expect(api.put(f"/users/{name}", {"password": "p", "tags": ""}), 201)
    try:
        bad(api.post("/users/bulk-delete", {}), "[{key_missing,users}]")
        expect(api.post("/users/bulk-delete", {"users": names[:2]}), 204)
        assert [api.get(f"/users/{n}").status_code for n in names] == [404, 404, 200]
        # An unknown name stops there; those before it are gone (as RabbitMQ).
        bad(api.post("/users/bulk-delete", {"users": [names[2], f"none-{uid}"]}), ["no_such_user", f"none-{uid}"])
        expect(api.get(f"/users/{names[2]}"), 404)
    finally:
        for name in names:
            api.delete(f"/users/{name}")


# ---------------------------------------------------------------- permissions
def test_permissions_crud_and_effect(api, broker, uid):
    name = f"mp-{uid}"
    expect(api.put(f"/users/{name}", {"password": "p", "tags": ""}), 201)
    try:
        path = f"/permissions/%2F/{name}"
        expect(api.get(path), 404, NOT_FOUND)
        expect(api.put(path, {"configure": f"^mine-{uid}", "write": ".*", "read": ".*"}), 201)
        expect(api.put(path, {"configure": f"^mine-{uid}$", "write": ".*", "read": ".*"}), 204)
        assert expect(api.get(path), 200).json() == {"user": name, "vhost": "/", "configure": f"^mine-{uid}$",
                                                      "write": ".*", "read": ".*"}
        assert {"user": name, "vhost": "/", "configure": f"^mine-{uid}$", "write": ".*", "read": ".*"} in \
            api.get("/permissions").json()
        conn = pika.BlockingConnection(broker.pika_params(user=name, password="p"))
        ch = conn.channel()
        ch.queue_declare(f"mine-{uid}", exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(f"other-{uid}", exclusive=True)
        assert err.value.reply_code == 403
        conn.close()
        bad(api.put(path, {"write": "", "read": ""}), "[{key_missing,configure}]")
        invalid = api.put(path, {"configure": "(", "write": "", "read": ""})
        assert invalid.status_code == 400 and invalid.json()["reason"][:2] == ["invalid_regexp", "("]
        bad(api.put(f"/permissions/nov-{uid}/{name}", {"configure": "", "write": "", "read": ""}),
            "vhost_or_user_not_found")
        bad(api.put(f"/permissions/%2F/none-{uid}", {"configure": "", "write": "", "read": ""}),
            "vhost_or_user_not_found")
        expect(api.delete(path), 204)
        expect(api.delete(path), 404, NOT_FOUND)
    finally:
        api.delete(f"/users/{name}")


def test_administrator_needs_vhost_permissions_to_change_things(api, broker, uid):
    name = f"madm-{uid}"
    expect(api.put(f"/users/{name}", {"password": "p", "tags": "administrator"}), 201)
    try:
        admin = Api(broker, name, "p")
        expect(admin.put(f"/queues/%2F/mq-{uid}", {}), 401, ACCESS_REFUSED)
        expect(admin.get("/queues/%2F"), 200)  # reading needs no vhost permissions
        expect(api.put(f"/permissions/%2F/{name}", {"configure": "^nothing", "write": "", "read": ""}), 201)
        expect(admin.put(f"/queues/%2F/mq-{uid}", {}), 401, ACCESS_REFUSED)
        expect(admin.put(f"/queues/%2F/nothing-{uid}", {}), 201)
        expect(admin.delete(f"/queues/%2F/nothing-{uid}"), 204)
        bad(admin.post("/exchanges/%2F/amq.default/publish",
                       {"properties": {}, "routing_key": "x", "payload": "", "payload_encoding": "string"}),
            f"403 ACCESS_REFUSED - write access to exchange 'amq.default' in vhost '/' refused for user '{name}'")
    finally:
        api.delete(f"/users/{name}")


# ------------------------------------------------------------------- policies
def test_policy_crud(api, uid):
    path = f"/policies/%2F/mp-{uid}"
    body = {"pattern": f"^mpx-{uid}", "definition": {"max-length": 5}, "priority": 1, "apply-to": "queues"}
    expect(api.put(path, body), 201)
    try:
        expect(api.put(path, {**body, "priority": 2}), 204)
        expected = {"vhost": "/", "name": f"mp-{uid}", "pattern": f"^mpx-{uid}", "apply-to": "queues",
                    "definition": {"max-length": 5}, "priority": 2}
        assert expect(api.get(path), 200).json() == expected
        assert expected in api.get("/policies").json() and expected in api.get("/policies/%2F").json()
        expect(api.put(f"/policies/%2F/mp2-{uid}", {"pattern": "x", "definition": {"expires": 1000}}), 201)
        assert api.get(f"/policies/%2F/mp2-{uid}").json() == {
            "vhost": "/", "name": f"mp2-{uid}", "pattern": "x", "apply-to": "all", "definition": {"expires": 1000},
            "priority": 0}
        expect(api.delete(f"/policies/%2F/mp2-{uid}"), 204)
        expect(api.delete(path), 204)
        expect(api.get(path), 404, NOT_FOUND)
        expect(api.delete(path), 404, NOT_FOUND)
        expect(api.put(f"/policies/nov-{uid}/p", body), 404, VHOST_NOT_FOUND)
        expect(api.get(f"/policies/nov-{uid}"), 404, NOT_FOUND)
    finally:
        api.delete(path)


def test_policy_validation_as_rabbitmq(api, uid):
    path = f"/policies/%2F/mp-{uid}"
    failed = "Validation failed\n\n"
    bad(api.put(path, {"definition": {"max-length": 5}}), "[{key_missing,pattern}]")
    bad(api.put(path, {"pattern": "a"}), "[{key_missing,definition}]")
    bad(api.put(path, {"pattern": "a", "definition": {}}), failed + "no policy provided\n")
    # /api/policies HTML-escapes its validation errors (RabbitMQ 3.10 does; operator policies do not).
    bad(api.put(path, {"pattern": "a", "definition": {"message-ttl": "a"}}),
        failed + "&lt;&lt;\"a\"&gt;&gt; is not a valid message TTL\n")
    bad(api.put(path, {"pattern": "a", "definition": {"max-length": -1, "message-ttl": "a"}}),
        failed + "-1 is not a valid maximum length\n")
    bad(api.put(path, {"pattern": "a", "definition": {"expires": 0}}), failed + "0 is not a valid queue expiry\n")
    bad(api.put(path, {"pattern": "a", "definition": {"alternate-exchange": 1}}),
        failed + "1 is not a valid alternate exchange name\n")
    bad(api.put(path, {"pattern": "a", "definition": {"queue-mode": "x"}}),
        failed + "&lt;&lt;\"x\"&gt;&gt; is not a valid queue-mode value\n")
    bad(api.put(path, {"pattern": "a", "definition": {"zbogus": 1, "another": "a"}}),
        failed + "[{&lt;&lt;\"another\"&gt;&gt;,&lt;&lt;\"a\"&gt;&gt;},{&lt;&lt;\"zbogus\"&gt;&gt;,1}] "
                 "are not recognised policy settings\n")
    bad(api.put(path, {"pattern": "a", "definition": {"max-length": 1}, "apply-to": "bogus"}),
        failed + "apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'\n")
    bad(api.put(path, {"pattern": "a", "definition": {"max-length": 1}, "priority": "x"}),
        failed + "priority should be a number, actually was &lt;&lt;\"x\"&gt;&gt;\n")
    bad(api.put(path, {"pattern": 5, "definition": {"max-length": 1}}),
        failed + "pattern should be a binary but was 5\n")
    reason = api.put(path, {"pattern": "(", "definition": {"max-length": 1}}).json()["reason"]
    assert reason.startswith(failed + "pattern should be regular expression but is invalid: ")
    expect(api.get(path), 404, NOT_FOUND)


def test_operator_policy_crud_and_validation(api, uid):
    path = f"/operator-policies/%2F/mop-{uid}"
    failed = "Validation failed\n\n"
    bad(api.put(path, {"pattern": "a", "definition": {"alternate-exchange": "a"}}),
        failed + "[{<<\"alternate-exchange\">>,<<\"a\">>}] are not recognised policy settings\n")
    bad(api.put(path, {"pattern": "a", "definition": {"message-ttl": -1}}), failed + "-1 is not a valid message TTL\n")
    expect(api.put(path, {"pattern": f"^mopq-{uid}", "definition": {"max-length": 1, "expires": 60000}}), 201)
    try:
        expected = {"vhost": "/", "name": f"mop-{uid}", "pattern": f"^mopq-{uid}", "apply-to": "all",
                    "definition": {"max-length": 1, "expires": 60000}, "priority": 0}
        assert expect(api.get(path), 200).json() == expected
        assert expected in api.get("/operator-policies").json()
        assert f"mop-{uid}" not in [p["name"] for p in api.get("/policies").json()]
        expect(api.put(f"/queues/%2F/mopq-{uid}", {}), 201)
        got = api.get(f"/queues/%2F/mopq-{uid}").json()
        assert (got["policy"], got["operator_policy"]) == (None, f"mop-{uid}")
        expect(api.delete(path), 204)
        expect(api.get(path), 404, NOT_FOUND)
    finally:
        api.delete(path)
        api.delete(f"/queues/%2F/mopq-{uid}")


def test_policy_attaches_to_exchanges_and_queues_and_gives_an_alternate_exchange(api, uid, channel, cleanup):
    x, ae, other_ae, queue, ae_queue, other_queue = (f"mpx-{uid}", f"mpae-{uid}", f"mpae2-{uid}", f"mpq-{uid}",
                                                     f"mpaeq-{uid}", f"mpae2q-{uid}")
    for name in (ae, other_ae):
        cleanup(f"/exchanges/%2F/{name}")
        expect(api.put(f"/exchanges/%2F/{name}", {"type": "fanout"}), 201)
    for name, exchange in ((ae_queue, ae), (other_queue, other_ae)):
        cleanup(f"/queues/%2F/{name}")
        expect(api.put(f"/queues/%2F/{name}", {}), 201)
        expect(api.post(f"/bindings/%2F/e/{exchange}/q/{name}", {}), 201)
    cleanup(f"/exchanges/%2F/{x}")
    expect(api.put(f"/exchanges/%2F/{x}", {"type": "direct"}), 201)
    policy = f"/policies/%2F/mpol-{uid}"
    cleanup(policy)
    expect(api.put(policy, {"pattern": f"^mp(x|q)-{uid}$", "definition": {"alternate-exchange": ae},
                            "apply-to": "exchanges"}), 201)
    assert api.get(f"/exchanges/%2F/{x}").json()["policy"] == f"mpol-{uid}"
    channel.basic_publish(x, "unroutable", b"to-ae")
    assert channel.basic_get(ae_queue, auto_ack=True)[2] == b"to-ae"
    # A queue declared later gets its policy; apply-to exchanges leaves queues out.
    cleanup(f"/queues/%2F/{queue}")
    expect(api.put(f"/queues/%2F/{queue}", {}), 201)
    assert api.get(f"/queues/%2F/{queue}").json()["policy"] is None
    expect(api.put(policy, {"pattern": f"^mp(x|q)-{uid}$", "definition": {"alternate-exchange": ae}}), 204)
    assert api.get(f"/queues/%2F/{queue}").json()["policy"] == f"mpol-{uid}"
    # A higher priority policy wins.
    policy2 = f"/policies/%2F/mpol2-{uid}"
    cleanup(policy2)
    expect(api.put(policy2, {"pattern": f"^mpx-{uid}$", "definition": {"alternate-exchange": other_ae},
                             "priority": 5}), 201)
    assert api.get(f"/exchanges/%2F/{x}").json()["policy"] == f"mpol2-{uid}"
    channel.basic_publish(x, "unroutable", b"to-other-ae")
    assert channel.basic_get(other_queue, auto_ack=True)[2] == b"to-other-ae"
    expect(api.delete(policy2), 204)
    # The alternate-exchange argument beats a policy.
    x2 = f"mpx2-{uid}"
    cleanup(f"/exchanges/%2F/{x2}")
    expect(api.put(f"/exchanges/%2F/{x2}", {"type": "direct", "arguments": {"alternate-exchange": other_ae}}), 201)
    expect(api.put(policy, {"pattern": "^mpx", "definition": {"alternate-exchange": ae}}), 204)
    assert api.get(f"/exchanges/%2F/{x2}").json()["policy"] == f"mpol-{uid}"
    channel.basic_publish(x2, "unroutable", b"argument-wins")
    assert channel.basic_get(other_queue, auto_ack=True)[2] == b"argument-wins"
    assert channel.basic_get(ae_queue, auto_ack=True)[0] is None
    # Without the policy the exchange has no alternate exchange again.
    expect(api.delete(policy), 204)
    assert "policy" not in api.get(f"/exchanges/%2F/{x}").json()
    channel.basic_publish(x, "unroutable", b"dropped")
    assert channel.basic_get(ae_queue, auto_ack=True)[0] is None


# ---------------------------------------------------------------- list options
def test_list_columns_sort_and_pages(api, uid, cleanup):
    for i in range(3):
        cleanup(f"/queues/%2F/ml{i}-{uid}")
        expect(api.put(f"/queues/%2F/ml{i}-{uid}", {"durable": i == 1}), 201)
    got = api.get("/queues/%2F?columns=name,durable&sort=name&sort_reverse=true").json()
    assert [i for i in got if i["name"].endswith(uid)] == [{"name": f"ml{i}-{uid}", "durable": i == 1}
                                                          for i in (2, 1, 0)]
    assert got == sorted(got, key=lambda i: i["name"], reverse=True) and set(got[0]) == {"name", "durable"}
    page = expect(api.get(f"/queues/%2F?page=2&page_size=2&name=-{uid}&columns=name"), 200).json()
    assert page == {"filtered_count": 3, "item_count": 1, "items": [{"name": f"ml2-{uid}"}], "page": 2,
                    "page_count": 2, "page_size": 2, "total_count": page["total_count"]}
    assert page["total_count"] >= 3
    got = api.get(f"/queues/%2F?page=1&columns=name,message_stats.publish&name=^ml0-{uid}$&use_regex=true").json()
    assert got["items"] == [{"name": f"ml0-{uid}", "message_stats": {"publish": 0}}]


def test_pages_of_queues_are_slices_of_the_whole_list(api, broker, uid, cleanup):
    """Pages in every order concatenate to the unpaged list (Warren shapes only the page's
    queues when it sorts by name or vhost); a user sees only the vhosts they may use."""
    vhost = f"pg-{uid}"
    cleanup(f"/vhosts/{vhost}")
    expect(api.put(f"/vhosts/{vhost}"), 201)
    assert api.put(f"/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    names = [f"pg{i:02d}-{uid}" for i in range(7)]
    for i, name in enumerate(names):
        where = "%2F" if i % 2 else vhost
        cleanup(f"/queues/{where}/{name}")
        kind = {"durable": True, "arguments": {"x-queue-type": "stream"}} if i == 3 else {"durable": False}
        expect(api.put(f"/queues/{where}/{name}", kind), 201)
    user = f"pgu-{uid}"
    cleanup(f"/users/{user}")
    expect(api.put(f"/users/{user}", {"password": "pw", "tags": "management"}), 201)
    expect(api.put(f"/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"}), 201)
    for who, seen in ((api, names), (Api(broker, user, "pw"), names[1::2])):
        for order in ("", "&sort=name", "&sort=vhost", "&sort=name&sort_reverse=true", "&sort=type", "&sort=messages"):
            whole = [(q["vhost"], q["name"]) for q in expect(who.get(f"/queues?columns=name,vhost{order}"), 200).json()
                     if q["name"].endswith(f"-{uid}")]
            assert sorted(n for _, n in whole) == sorted(seen)
            paged, page = [], 1
            while True:
                got = expect(who.get(f"/queues?page={page}&page_size=3&name=-{uid}{order}"), 200).json()
                assert got["filtered_count"] == len(seen) and got["item_count"] == len(got["items"])
                assert all("messages" in q and "arguments" in q for q in got["items"])  # whole queues
                paged += [(q["vhost"], q["name"]) for q in got["items"]]
                if page == got["page_count"]:
                    break
                page += 1
            assert paged == whole, order


# ---------------------------------------------------------------- persistence
def test_api_state_survives_a_restart(make_broker, restart_broker):
    b = make_broker()
    api = Api(b)
    expect(api.put("/vhosts/kept", {"description": "kept vhost", "tags": "t1"}), 201)
    expect(api.put("/users/keeper", {"password": "pw", "tags": "monitoring"}), 201)
    expect(api.put("/permissions/kept/keeper", {"configure": "^c", "write": "^w", "read": "^r"}), 201)
    expect(api.put("/policies/kept/pol", {"pattern": "^x", "definition": {"alternate-exchange": "ae"},
                                          "priority": 3, "apply-to": "exchanges"}), 201)
    expect(api.put("/operator-policies/kept/opol", {"pattern": "^q", "definition": {"max-length": 9}}), 201)
    expect(api.put("/exchanges/kept/x1", {"type": "topic", "durable": True}), 201)
    expect(api.put("/exchanges/kept/transient", {"type": "topic", "durable": False}), 201)
    expect(api.put("/queues/kept/q1", {"durable": True, "arguments": {"x-max-length": 3}}), 201)
    expect(api.post("/bindings/kept/e/x1/q/q1", {"routing_key": "a.#", "arguments": {"k": "v"}}), 201)
    b = restart_broker(b, sig=9)  # every answer came after the write: a kill loses nothing
    api = Api(b)
    assert api.get("/vhosts/kept").json()["metadata"] == {"description": "kept vhost", "tags": ["t1"]}
    assert api.get("/users/keeper").json()["tags"] == ["monitoring"]
    expect(Api(b, "keeper", "pw").get("/vhosts"), 200)
    assert api.get("/permissions/kept/keeper").json() == {"user": "keeper", "vhost": "kept", "configure": "^c",
                                                          "write": "^w", "read": "^r"}
    assert api.get("/policies/kept/pol").json() == {"vhost": "kept", "name": "pol", "pattern": "^x",
                                                    "apply-to": "exchanges",
                                                    "definition": {"alternate-exchange": "ae"}, "priority": 3}
    assert api.get("/operator-policies/kept/opol").json()["definition"] == {"max-length": 9}
    assert api.get("/exchanges/kept/x1").json()["policy"] == "pol"
    expect(api.get("/exchanges/kept/transient"), 404)
    assert api.get("/queues/kept/q1").json()["arguments"] == {"x-max-length": 3}
    assert api.get("/queues/kept/q1").json()["operator_policy"] == "opol"
    assert [b["properties_key"] for b in api.get("/bindings/kept/e/x1/q/q1").json()] == ["a.%23~8IXMRA"]
    expect(api.delete("/policies/kept/pol"), 204)
    expect(api.delete("/users/keeper"), 204)
    b = restart_broker(b, sig=9)
    api = Api(b)
    expect(api.get("/policies/kept/pol"), 404)
    expect(api.get("/users/keeper"), 404)
    expect(api.get("/permissions/kept/keeper"), 404)
    expect(api.get("/vhosts/kept"), 200)
