"""Runtime parameters over the management API, as RabbitMQ 3.10 with only the management
plugin: /api/parameters[/component[/vhost[/name]]] (the core's components: vhost-limits,
operator_policy, and policy for reading) and /api/global-parameters[/name], in definitions
and across a restart. Components no plugin registers are refused exactly as RabbitMQ refuses
them; shovels are tests/integration/test_shovel_move.py's, federation upstreams
tests/integration/test_federation.py's.

Against RabbitMQ: `python tools/rabbitmq_node.py run --plugins rabbitmq_management -- python
-m pytest -q tests/integration/test_parameters.py`; without its management API (CI's node)
the module is skipped.
"""

import os
import uuid

import pytest

from conftest import EXTERNAL, RABBITMQ

from .http_api import HttpApi, q

MGMT = os.environ.get("WARREN_TEST_MGMT")
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT,
                                reason="the comparison RabbitMQ node has no management plugin")


class Api(HttpApi):
    def __init__(self, base: str):
        super().__init__(base)
        self.vhosts: list[str] = []
        self.globals: list[str] = []

    def error(self, method, path, body, status, reason, error="bad_request"):
        r = self.call(method, path, body)
        assert (r.status_code, r.json()) == (status, {"error": error, "reason": reason}), (method, path)

    def vhost(self) -> str:
        name = f"par-{uuid.uuid4().hex[:8]}"
        self.vhosts.append(name)
        self.ok("PUT", f"/vhosts/{q(name)}", {})
        return name

    def clean(self):
        for name in self.vhosts:
            self.call("DELETE", f"/vhosts/{q(name)}")
        for name in self.globals:
            self.call("DELETE", f"/global-parameters/{q(name)}")


@pytest.fixture
def api(broker):
    a = Api(MGMT if EXTERNAL else broker.api)
    yield a
    a.clean()


# --------------------------------------------------------------- vhost parameters
@pytest.mark.parametrize("component,value", [
    ("no-such-component", {"a": 1}),
])
def test_unknown_components_are_refused(api, component, value):
    vhost = api.vhost()
    v = q(vhost)
    api.error("PUT", f"/parameters/{component}/{v}/p", {"value": value}, 400,
              f"Validation failed\n\ncomponent {component} not found\n")
    # Nothing stored: nothing to list, read or delete.
    assert api.ok("GET", f"/parameters/{component}").json() == []
    assert api.ok("GET", f"/parameters/{component}/{v}").json() == []
    assert api.call("GET", f"/parameters/{component}/{v}/p").status_code == 404
    assert api.call("DELETE", f"/parameters/{component}/{v}/p").status_code == 404
    # An import holding one fails, as in RabbitMQ (which adds where).
    api.error("POST", "/definitions", {"parameters": [
        {"component": component, "vhost": vhost, "name": "p", "value": value}]}, 400,
        f"Validation failed\n\ncomponent {component} not found\n ({vhost}/{component}/p)")
    assert api.ok("GET", f"/parameters/{component}/{v}").json() == []


def test_vhost_limits_parameter(api):
    vhost = api.vhost()
    v = q(vhost)
    path = f"/parameters/vhost-limits/{v}/limits"
    assert api.ok("PUT", path, {"value": {"max-queues": 5}}).status_code == 201
    assert api.ok("PUT", path, {"value": {"max-queues": 1, "max-connections": 2}}).status_code == 204
    expected = {"value": {"max-connections": 2, "max-queues": 1}, "vhost": vhost, "component": "vhost-limits",
                "name": "limits"}
    assert api.ok("GET", path).json() == expected
    assert expected in api.ok("GET", "/parameters").json()
    assert api.ok("GET", f"/parameters/vhost-limits/{v}").json() == [expected]
    assert api.ok("GET", f"/vhost-limits/{v}").json() == [{"vhost": vhost, "value": {"max-connections": 2,
                                                                                     "max-queues": 1}}]
    # RabbitMQ's validation texts, HTML-escaped by this resource.
    for value, reason in (
            (5, "limits not a list 5"),
            ("x", 'limits not a list &lt;&lt;"x"&gt;&gt;'),
            ([1, 2], "Unrecognised terms [1,2] in limits"),
            ({"max-queues": 1, "zz": 3, "yy": "q"},
             'Unrecognised terms [{&lt;&lt;"yy"&gt;&gt;,&lt;&lt;"q"&gt;&gt;},{&lt;&lt;"zz"&gt;&gt;,3}] in limits'),
            ({"max-queues": 1.5, "max-connections": "2"},
             "max-queues should be a number, actually was 1.5\n"
             'max-connections should be a number, actually was &lt;&lt;"2"&gt;&gt;')):
        api.error("PUT", path, {"value": value}, 400, f"Validation failed\n\n{reason}\n")
    api.error("PUT", path, {}, 400, "[{key_missing,value}]")
    api.error("PUT", "/parameters/vhost-limits/no-such-vhost/limits", {"value": {}}, 404, "vhost_not_found",
              "not_found")
    assert api.ok("GET", path).json() == expected  # unchanged by the refusals
    assert api.ok("DELETE", path).status_code == 204
    assert api.call("GET", path).status_code == 404
    assert api.ok("GET", f"/vhost-limits/{v}").json() == []


def test_vhost_limits_under_another_name(api):
    """RabbitMQ stores a vhost-limits parameter named other than "limits", answers 500 and
    never reads it; Warren refuses it."""
    if RABBITMQ:
        pytest.skip("RabbitMQ answers 500 and keeps it")
    vhost = api.vhost()
    api.error("PUT", f"/parameters/vhost-limits/{q(vhost)}/other", {"value": {"max-queues": 1}}, 400,
              "Validation failed\n\nvhost limits must be named 'limits', not 'other'\n")
    assert api.ok("GET", f"/parameters/vhost-limits/{q(vhost)}").json() == []


def test_operator_policy_parameter(api):
    vhost = api.vhost()
    v = q(vhost)
    path = f"/parameters/operator_policy/{v}/op"
    api.error("PUT", path, {"value": {"pattern": "^a", "definition": {"max-length": 1}}}, 400,
              'Validation failed\n\nKey "priority" not found in op\n')
    api.error("PUT", path, {"value": {"priority": 0}}, 400,
              'Validation failed\n\nKey "definition" not found in op\nKey "pattern" not found in op\n')
    api.error("PUT", path, {"value": {"pattern": "^a", "definition": {"max-length": 1}, "priority": 0, "x": 1}},
              400, 'Validation failed\n\nUnrecognised terms [{&lt;&lt;"x"&gt;&gt;,1}] in op\n')
    value = {"pattern": "^a", "definition": {"max-length": 1}, "priority": 0, "apply-to": "queues"}
    assert api.ok("PUT", path, {"value": value}).status_code == 201
    assert api.ok("PUT", path, {"value": {**value, "priority": 2}}).status_code == 204
    assert api.ok("GET", path).json() == {"value": {**value, "priority": 2}, "vhost": vhost,
                                          "component": "operator_policy", "name": "op"}
    assert api.ok("GET", f"/operator-policies/{v}/op").json() == {
        "vhost": vhost, "name": "op", "pattern": "^a", "apply-to": "queues", "definition": {"max-length": 1},
        "priority": 2}
    assert api.ok("DELETE", path).status_code == 204
    assert api.call("GET", f"/operator-policies/{v}/op").status_code == 404
    assert api.call("DELETE", path).status_code == 404


def test_policies_are_read_not_set_as_parameters(api):
    vhost = api.vhost()
    v = q(vhost)
    api.ok("PUT", f"/policies/{v}/p", {"pattern": "^a", "definition": {"max-length": 1}})
    expected = {"value": {"pattern": "^a", "definition": {"max-length": 1}, "priority": 0, "apply-to": "all"},
                "vhost": vhost, "component": "policy", "name": "p"}
    assert api.ok("GET", f"/parameters/policy/{v}/p").json() == expected
    assert api.ok("GET", f"/parameters/policy/{v}").json() == [expected]
    assert [p for p in api.ok("GET", "/parameters").json() if p["vhost"] == vhost] == []
    api.error("PUT", f"/parameters/policy/{v}/p", {"value": expected["value"]}, 400,
              "policies may not be set using this method")
    r = api.call("DELETE", f"/parameters/policy/{v}/p")
    assert r.status_code == (500 if RABBITMQ else 400), r.text  # RabbitMQ crashes
    if not RABBITMQ:
        assert r.json() == {"error": "bad_request", "reason": "policies may not be cleared using this method"}
    assert api.ok("GET", f"/policies/{v}/p").json()["name"] == "p"


def test_missing_vhost(api):
    assert api.call("GET", "/parameters/vhost-limits/no-such-vhost").status_code == 404
    assert api.call("GET", "/parameters/vhost-limits/no-such-vhost/limits").status_code == 404


# -------------------------------------------------------------- global parameters
def test_global_parameters(api):
    name = f"g-{uuid.uuid4().hex[:8]}"
    api.globals.append(name)
    path = f"/global-parameters/{name}"
    assert api.ok("PUT", path, {"value": {"a": [1, 2]}}).status_code == 201
    assert api.ok("GET", path).json() == {"value": {"a": [1, 2]}, "name": name}
    for value in ("text", 5, None, [1]):  # any JSON value
        assert api.ok("PUT", path, {"value": value}).status_code == 204
        assert api.ok("GET", path).json()["value"] == value
    assert {"name": name, "value": [1]} in api.ok("GET", "/global-parameters").json()
    api.error("PUT", path, {"name": name}, 400, "[{key_missing,value}]")
    assert api.ok("DELETE", path).status_code == 204
    assert api.call("GET", path).status_code == 404
    assert api.call("DELETE", path).status_code == 404


def test_cluster_name_is_a_global_parameter(api):
    original = api.ok("GET", "/cluster-name").json()["name"]
    try:
        assert api.ok("PUT", "/global-parameters/cluster_name", {"value": "par-cluster"}).status_code in (201, 204)
        assert api.ok("GET", "/cluster-name").json() == {"name": "par-cluster"}
        api.ok("PUT", "/cluster-name", {"name": "par-cluster-2"})
        assert api.ok("GET", "/global-parameters/cluster_name").json() == {"value": "par-cluster-2",
                                                                           "name": "cluster_name"}
        assert {"name": "cluster_name", "value": "par-cluster-2"} in api.ok("GET", "/global-parameters").json()
        if not RABBITMQ:
            # RabbitMQ stores a name that is not a string and then refuses every AMQP client.
            api.error("PUT", "/global-parameters/cluster_name", {"value": 5}, 400, "cluster_name must be a string")
            # As PUT /api/cluster-name: a lone surrogate is not a name connections can be told.
            api.error("PUT", "/global-parameters/cluster_name", {"value": "\ud800"}, 400,
                      "cluster_name must be valid unicode")
        # Cleared: back to the node's own name.
        assert api.ok("DELETE", "/global-parameters/cluster_name").status_code == 204
        assert api.ok("GET", "/cluster-name").json()["name"] != "par-cluster-2"
        assert api.call("GET", "/global-parameters/cluster_name").status_code == 404
    finally:
        api.ok("PUT", "/cluster-name", {"name": original})


def test_global_parameters_in_definitions(api):
    name = f"g-{uuid.uuid4().hex[:8]}"
    api.globals.append(name)
    api.ok("POST", "/definitions", {"global_parameters": [{"name": name, "value": {"k": "v"}}]})
    assert api.ok("GET", f"/global-parameters/{name}").json() == {"value": {"k": "v"}, "name": name}
    assert {"name": name, "value": {"k": "v"}} in api.ok("GET", "/definitions").json()["global_parameters"]


# ------------------------------------------------------------------ who may do what
def test_access_by_tag(api):
    """RabbitMQ's rules: parameters are for policymakers in their vhosts (lists filtered to
    them), global parameters for policymakers; management and monitoring users are refused."""
    vhost, other = api.vhost(), api.vhost()
    users = {}
    for tag in ("management", "policymaker", "monitoring"):
        users[tag] = f"par-{tag}-{uuid.uuid4().hex[:6]}"
        api.ok("PUT", f"/users/{users[tag]}", {"password": "pw", "tags": tag})
        api.ok("PUT", f"/permissions/{q(vhost)}/{users[tag]}", {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        for v in (vhost, other):
            api.ok("PUT", f"/parameters/vhost-limits/{q(v)}/limits", {"value": {"max-queues": 9}})
        refused = {"error": "not_authorised", "reason": "User not authorised to access object"}
        for tag in ("management", "monitoring"):
            auth = (users[tag], "pw")
            for method, path in (("GET", "/parameters"), ("GET", f"/parameters/vhost-limits/{q(vhost)}/limits"),
                                 ("PUT", f"/parameters/vhost-limits/{q(vhost)}/limits"),
                                 ("GET", "/global-parameters"), ("PUT", "/global-parameters/x")):
                r = api.call(method, path, {"value": {}}, auth=auth)
                assert (r.status_code, r.json()) == (401, refused), (tag, method, path)
        auth = (users["policymaker"], "pw")
        listed = api.call("GET", "/parameters/vhost-limits", auth=auth).json()
        assert [p["vhost"] for p in listed if p["vhost"] in (vhost, other)] == [vhost]
        r = api.call("PUT", f"/parameters/vhost-limits/{q(vhost)}/limits", {"value": {"max-queues": 3}}, auth=auth)
        assert r.status_code == 204
        r = api.call("GET", f"/parameters/vhost-limits/{q(other)}/limits", auth=auth)
        assert (r.status_code, r.json()) == (401, refused)
        name = f"g-{uuid.uuid4().hex[:8]}"
        api.globals.append(name)
        assert api.call("PUT", f"/global-parameters/{name}", {"value": 1}, auth=auth).status_code == 201
        assert api.call("DELETE", f"/global-parameters/{name}", auth=auth).status_code == 204
    finally:
        for user in users.values():
            api.call("DELETE", f"/users/{user}")


# ------------------------------------------------------------------ across a restart
def test_parameters_survive_restart(make_broker, restart_broker):
    b = make_broker()
    api = Api(b.api)
    api.ok("PUT", "/vhosts/pv", {})
    api.ok("PUT", "/parameters/vhost-limits/pv/limits", {"value": {"max-queues": 3}})
    api.ok("PUT", "/parameters/operator_policy/pv/op", {"value": {"pattern": "^a", "definition": {"max-length": 1},
                                                                  "priority": 1}})
    api.ok("PUT", "/global-parameters/g1", {"value": {"k": [1, "v"]}})
    api.ok("PUT", "/global-parameters/g2", {"value": None})
    api.ok("PUT", "/global-parameters/cluster_name", {"value": "restarted"})
    b = restart_broker(b)
    api = Api(b.api)
    assert api.ok("GET", "/parameters/vhost-limits/pv/limits").json()["value"] == {"max-queues": 3}
    assert api.ok("GET", "/parameters/operator_policy/pv/op").json()["value"]["priority"] == 1
    permanent_id = api.ok("GET", "/global-parameters/internal_cluster_id").json()["value"]
    assert api.ok("GET", "/global-parameters").json() == [
        {"name": "cluster_name", "value": "restarted"}, {"name": "g1", "value": {"k": [1, "v"]}},
        {"name": "g2", "value": None}, {"name": "internal_cluster_id", "value": permanent_id}]
    assert api.ok("GET", "/cluster-name").json() == {"name": "restarted"}
    # Clearing survives too.
    api.ok("DELETE", "/global-parameters/g1")
    api.ok("DELETE", "/parameters/vhost-limits/pv/limits")
    api.ok("DELETE", "/global-parameters/cluster_name")
    b = restart_broker(b)
    api = Api(b.api)
    assert api.ok("GET", "/global-parameters").json() == [
        {"name": "g2", "value": None}, {"name": "internal_cluster_id", "value": permanent_id}]
    assert api.ok("GET", "/parameters/vhost-limits").json() == []
    assert api.ok("GET", "/cluster-name").json() == {"name": "warren@localhost"}
