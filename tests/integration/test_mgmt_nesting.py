"""Management HTTP API: deeply nested JSON.

Every JSON body goes through one parser (warren.mgmt.resources.parse_json): a body nested too
deeply for it is a 400 bad_request, never a 500 with a RecursionError logged per request.
Arguments (of queues, exchanges, bindings, policies, message headers, imported definitions)
may nest as deeply as an AMQP field table may (warren.amqp.codec's MAX_NESTING, 1000 levels);
deeper ones are refused with 400.

RabbitMQ 3.10.8 (checked on a node with the management plugin): a body of 100,000 nested
arrays is a 400 "not_json" there too, but it parses any depth, so a queue declared with
arguments nested 5,000 (or 100,000) levels deep is created (201). Warren refuses those on
purpose, so these tests run against Warren only.
"""

import json
import sys

import pytest
import requests

from conftest import EXTERNAL

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="Warren's limits (RabbitMQ takes any depth)")

MAX_NESTING = 1000
ARGUMENTS_TOO_DEEP = {"error": "bad_request", "reason": f"arguments nested deeper than {MAX_NESTING} levels"}
TOO_DEEP = {"error": "bad_request", "reason": "JSON nested too deeply"}
DEEP = 100_000
# This client, too, encodes and decodes JSON MAX_NESTING levels deep.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * MAX_NESTING))


def nested(depth: int):
    """A JSON object nested `depth` levels deep: {"a": {"a": ... {"x": 1}}}."""
    value: dict = {"x": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def deep_text(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


@pytest.fixture(scope="module")
def api(broker):
    return broker.api


def call(api, method, path, body=None, text=None):
    data = text if text is not None else json.dumps(body) if body is not None else None
    return requests.request(method, api + path, data=data, auth=("guest", "guest"), timeout=60,
                            headers={"content-type": "application/json"})


def expect(response, status, body=None):
    assert response.status_code == status, (response.status_code, response.text[:300])
    if body is not None:
        assert response.json() == body


def test_deep_bodies_are_bad_requests(api, broker, uid):
    publish = "/exchanges/%2F/amq.default/publish"
    logged_before = len(broker.log())
    for method, path in [("PUT", f"/queues/%2F/deep-{uid}"), ("PUT", f"/exchanges/%2F/deep-{uid}"),
                         ("POST", f"/bindings/%2F/e/amq.direct/q/deep-{uid}"), ("POST", publish),
                         ("PUT", f"/policies/%2F/deep-{uid}"), ("PUT", f"/users/deep-{uid}"),
                         ("PUT", "/permissions/%2F/guest"), ("PUT", f"/vhosts/deep-{uid}"),
                         ("POST", "/users/bulk-delete"), ("POST", "/definitions"), ("POST", "/definitions/%2F"),
                         ("POST", "/queues/%2F/aliveness-test/get")]:
        expect(call(api, method, path, text=deep_text(DEEP)), 400, TOO_DEEP)
        expect(call(api, method, path, text="[" * DEEP + "]" * DEEP), 400, TOO_DEEP)
        expect(call(api, method, path, text='{"a": [1, 2'), 400)  # malformed: RabbitMQ's reason, as before
    assert "deep-" not in call(api, "GET", "/queues/%2F").text
    # Nothing logged per request (no traceback, no RecursionError).
    log = broker.log()[logged_before:]
    assert "RecursionError" not in log and "Traceback" not in log


def test_malformed_bodies_keep_rabbitmq_reasons(api, uid):
    expect(call(api, "PUT", f"/queues/%2F/bad-{uid}", text='{"durable":'), 400,
           {"error": "bad_request", "reason": "not_json"})
    expect(call(api, "POST", "/definitions", text='{"queues":'), 400,
           {"error": "bad_request", "reason": "failed_to_parse_json"})


def test_arguments_nested_up_to_the_cap(api, uid):
    """MAX_NESTING levels are taken, and shown again (lists, the queue, definitions)."""
    name = f"nest-ok-{uid}"
    args = {"x-deep": nested(MAX_NESTING - 1)}  # the arguments table itself is one level
    try:
        expect(call(api, "PUT", f"/queues/%2F/{name}", {"arguments": args}), 201)
        queue = call(api, "GET", f"/queues/%2F/{name}")
        expect(queue, 200)
        assert queue.json()["arguments"] == args
        expect(call(api, "GET", "/queues"), 200)
        exported = call(api, "GET", "/definitions")
        expect(exported, 200)
        assert [q["arguments"] for q in exported.json()["queues"] if q["name"] == name] == [args]
        # Bound with such arguments, and published with such headers.
        expect(call(api, "POST", f"/bindings/%2F/e/amq.headers/q/{name}", {"arguments": args}), 201)
        expect(call(api, "GET", f"/queues/%2F/{name}/bindings"), 200)
        r = call(api, "POST", "/exchanges/%2F/amq.default/publish",
                 {"routing_key": name, "properties": {"headers": args}, "payload": "p", "payload_encoding": "string"})
        expect(r, 200, {"routed": True})
    finally:
        call(api, "DELETE", f"/queues/%2F/{name}")


def test_arguments_nested_deeper_than_the_cap(api, uid):
    args = {"x-deep": nested(MAX_NESTING)}  # one level too many
    name = f"nest-{uid}"
    expect(call(api, "PUT", f"/queues/%2F/{name}", {"arguments": args}), 400, ARGUMENTS_TOO_DEEP)
    expect(call(api, "PUT", f"/exchanges/%2F/{name}", {"type": "headers", "arguments": args}), 400,
           ARGUMENTS_TOO_DEEP)
    expect(call(api, "PUT", f"/policies/%2F/{name}", {"pattern": "^nest-", "definition": args}), 400,
           ARGUMENTS_TOO_DEEP)
    expect(call(api, "PUT", f"/queues/%2F/{name}", {}), 201)
    try:
        expect(call(api, "POST", f"/bindings/%2F/e/amq.headers/q/{name}", {"arguments": args}), 400,
               ARGUMENTS_TOO_DEEP)
        expect(call(api, "POST", "/exchanges/%2F/amq.default/publish",
                    {"routing_key": name, "properties": {"headers": args}, "payload": "p",
                     "payload_encoding": "string"}), 400, ARGUMENTS_TOO_DEEP)
        assert call(api, "GET", f"/queues/%2F/{name}").json()["messages"] == 0
    finally:
        call(api, "DELETE", f"/queues/%2F/{name}")
    definitions = {"queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                               "arguments": args}]}
    expect(call(api, "POST", "/definitions", definitions), 400, ARGUMENTS_TOO_DEEP)
    expect(call(api, "GET", f"/queues/%2F/{name}"), 404)
    # Far deeper (RabbitMQ creates this queue): refused, never a 500.
    text = '{"arguments": {"x-deep": ' + deep_text(5000) + "}}"
    expect(call(api, "PUT", f"/queues/%2F/{name}", text=text), 400, ARGUMENTS_TOO_DEEP)
