"""Management HTTP API: PUT /api/cluster-name, 405 and OPTIONS answers, and
/api/healthchecks/node (also with amqpstorm's trailing slash), as RabbitMQ 3.10.8. Against
RabbitMQ with its management plugin:

    python tools/rabbitmq_node.py run --plugins rabbitmq_management -- \\
        python -m pytest -q tests/integration/test_mgmt_gaps.py

(WARREN_TEST_MGMT is the node's API). Against a RabbitMQ node without it (WARREN_TEST_BROKER
only) the module is skipped.
"""

import os

import pika
import pytest
import requests
from amqpstorm.management import ManagementApi

from conftest import EXTERNAL, RABBITMQ, RUN_ID, BrokerProcess, start_broker

MGMT = os.environ.get("WARREN_TEST_MGMT")
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT,
                                reason="the comparison RabbitMQ node has no management plugin")

ADMIN = ("guest", "guest")
SUFFIX = RUN_ID[:6]


class Target:
    """The broker under test: its AMQP address and its API."""

    def __init__(self, broker: BrokerProcess, api: str):
        self.broker = broker
        self.api = api

    def call(self, method, path, json=None, auth=ADMIN, **kw):
        return requests.request(method, self.api + path, json=json, auth=auth, timeout=30, **kw)

    def announced_cluster_name(self) -> str:
        """cluster_name in connection.start's server properties of a new connection."""
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            self.broker.host, self.broker.port, credentials=pika.PlainCredentials(*ADMIN), heartbeat=0))
        try:
            return conn._impl.server_properties["cluster_name"]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def target():
    """A broker of this module's own (the cluster name it changes is broker-wide)."""
    if MGMT:
        host, port = EXTERNAL.rsplit(":", 1)
        yield Target(BrokerProcess(host, int(port)), MGMT)
        return
    b = start_broker()
    yield Target(b, b.api)
    b.stop()


@pytest.fixture
def cluster_name(target):
    """The cluster name before the test, set back after it."""
    before = target.call("GET", "/cluster-name").json()["name"]
    yield before
    assert target.call("PUT", "/cluster-name", {"name": before}).status_code == 204


@pytest.fixture(scope="module")
def users(target):
    """Users tagged monitoring, management and none, with a shared password."""
    made = {tag: f"gaps-{tag or 'none'}-{SUFFIX}" for tag in ("monitoring", "management", "")}
    for tag, name in made.items():
        assert target.call("PUT", f"/users/{name}", {"password": "pw", "tags": tag}).status_code == 201
    yield {tag: (name, "pw") for tag, name in made.items()}
    for name in made.values():
        target.call("DELETE", f"/users/{name}")


def _assert_error(r, status, reason):
    assert (r.status_code, r.json()) == (status, {"error": "bad_request", "reason": reason}), r.text


# ------------------------------------------------------------ PUT /api/cluster-name
def test_put_cluster_name(target, cluster_name):
    for name in (f"gaps-{SUFFIX}", f"gaps ünï/{SUFFIX}", ""):
        r = target.call("PUT", "/cluster-name", {"name": name, "ignored": 1})
        assert (r.status_code, r.content) == (204, b""), r.text
        assert target.call("GET", "/cluster-name").json() == {"name": name}
        assert target.call("GET", "/overview").json()["cluster_name"] == name
        assert target.announced_cluster_name() == name
    # Setting the same name again: 204 as well.
    assert target.call("PUT", "/cluster-name", {"name": ""}).status_code == 204


def test_put_cluster_name_refused(target, cluster_name):
    missing = "[{key_missing,name}]"
    _assert_error(target.call("PUT", "/cluster-name", {}), 400, missing)
    _assert_error(target.call("PUT", "/cluster-name", data=b""), 400, missing)
    _assert_error(target.call("PUT", "/cluster-name", data=b"not json"), 400, "not_json")
    _assert_error(target.call("PUT", "/cluster-name", data=b'["name"]'), 400, "not_json")
    for value in (5, None, {"a": 1}):
        r = target.call("PUT", "/cluster-name", {"name": value})
        if RABBITMQ:
            assert r.status_code == 500, r.text  # RabbitMQ crashes; Warren answers 400
        else:
            _assert_error(r, 400, "name must be a string")
    if not RABBITMQ:
        _assert_error(target.call("PUT", "/cluster-name", data=b'{"name": "\\ud800"}'), 400,
                      "name must be valid unicode")
    assert target.call("GET", "/cluster-name").json() == {"name": cluster_name}


def test_put_cluster_name_administrators_only(target, users, cluster_name):
    for tag, reason in (("monitoring", "Not administrator user"), ("management", "Not administrator user"),
                        ("", "Not management user")):
        r = target.call("PUT", "/cluster-name", {"name": "nope"}, auth=users[tag])
        assert (r.status_code, r.json()) == (401, {"error": "not_authorised", "reason": reason}), tag
        assert "WWW-Authenticate" not in r.headers
        assert target.call("GET", "/cluster-name", auth=users[tag]).status_code == (401 if tag == "" else 200)
    r = target.call("PUT", "/cluster-name", {"name": "nope"}, auth=None)
    assert (r.status_code, r.content) == (401, b"") and "WWW-Authenticate" in r.headers
    assert target.call("GET", "/cluster-name").json() == {"name": cluster_name}


def test_cluster_name_in_definitions(target, cluster_name):
    """A global parameter: exported, and set by an import (as RabbitMQ's import does)."""
    name = f"imported-{SUFFIX}"
    r = target.call("POST", "/definitions", {"global_parameters": [{"name": "cluster_name", "value": name}]})
    assert r.status_code == 204, r.text
    assert target.call("GET", "/cluster-name").json() == {"name": name}
    assert target.announced_cluster_name() == name
    exported = target.call("GET", "/definitions").json()["global_parameters"]
    assert {"name": "cluster_name", "value": name} in exported


def test_cluster_name_survives_restart(make_broker, restart_broker):
    b = make_broker()
    api = Target(b, b.api)
    # never set: not exported (the one global parameter is the permanent id, made at the first start)
    assert [p["name"] for p in api.call("GET", "/definitions").json()["global_parameters"]] == ["internal_cluster_id"]
    assert api.call("PUT", "/cluster-name", {"name": f"kept-{SUFFIX}"}).status_code == 204
    b = restart_broker(b)
    api = Target(b, b.api)
    assert api.call("GET", "/cluster-name").json() == {"name": f"kept-{SUFFIX}"}
    assert api.announced_cluster_name() == f"kept-{SUFFIX}"


# ------------------------------------------------------------ 405 and OPTIONS
# path, a method it does not serve, RabbitMQ's Allow header
NOT_ALLOWED = [
    ("/overview", "DELETE", "HEAD, GET, OPTIONS"),
    ("/cluster-name", "POST", "HEAD, GET, PUT, OPTIONS"),
    ("/healthchecks/node", "PUT", "HEAD, GET, OPTIONS"),
    ("/queues/%2F/gaps-q", "POST", "HEAD, GET, PUT, DELETE, OPTIONS"),
    ("/queues/%2F/gaps-q/contents", "GET", "DELETE, OPTIONS"),
    ("/queues/%2F/gaps-q/get", "DELETE", "POST, OPTIONS"),
    ("/exchanges/%2F/gaps-x/publish", "PATCH", "POST, OPTIONS"),
    ("/bindings/%2F/e/gaps-x/q/gaps-q", "PUT", "HEAD, GET, POST, OPTIONS"),
    ("/bindings/%2F/e/gaps-x/q/gaps-q/k", "POST", "HEAD, GET, DELETE, OPTIONS"),
    ("/definitions", "PUT", "HEAD, GET, POST, OPTIONS"),
    ("/users/bulk-delete", "PATCH", "POST, OPTIONS"),
]


@pytest.mark.parametrize("path,method,allow", NOT_ALLOWED, ids=[f"{m} {p}" for p, m, _ in NOT_ALLOWED])
def test_method_not_allowed(target, users, path, method, allow):
    """An empty 405 with the path's methods in Allow, before authentication."""
    for auth in (ADMIN, None, users[""]):
        r = target.call(method, path, auth=auth)
        assert (r.status_code, r.content, r.headers.get("Allow")) == (405, b"", allow), (auth, r.text)
        assert "Content-Type" not in r.headers and "WWW-Authenticate" not in r.headers


@pytest.mark.parametrize("path,method,allow", NOT_ALLOWED[:4], ids=[p for p, _, _ in NOT_ALLOWED[:4]])
def test_options(target, path, method, allow):
    """OPTIONS answers the Allow list (200, empty), with or without credentials."""
    for auth in (ADMIN, None):
        r = target.call("OPTIONS", path, auth=auth)
        assert (r.status_code, r.content, r.headers.get("Allow")) == (200, b"", allow), (auth, r.text)


# ------------------------------------------------------------ /api/healthchecks/node
def test_healthchecks_node(target, users):
    for path in ("/healthchecks/node", "/healthchecks/node/"):
        for auth in (ADMIN, users["monitoring"], users["management"]):
            r = target.call("GET", path, auth=auth)
            assert (r.status_code, r.json()) == (200, {"status": "ok"}), (path, auth)
        r = target.call("GET", path, auth=users[""])
        assert (r.status_code, r.json()) == (401, {"error": "not_authorised", "reason": "Not management user"})
        assert target.call("GET", path, auth=None).status_code == 401


def test_healthchecks_with_amqpstorm(target, users):
    """amqpstorm's healthchecks.get() asks for /api/healthchecks/node/ (a trailing slash,
    which RabbitMQ's router ignores)."""
    base = target.api[:-len("/api")]
    assert ManagementApi(base, *ADMIN).healthchecks.get() == {"status": "ok"}
    assert ManagementApi(base, *users["management"]).healthchecks.get() == {"status": "ok"}


def test_trailing_slash(target):
    """One trailing slash names the same resource (RabbitMQ's router); two do not."""
    assert target.call("GET", "/queues/%2F/").status_code == 200
    assert target.call("GET", "/cluster-name/").json() == target.call("GET", "/cluster-name").json()
    assert target.call("GET", "/vhosts/%2F/").json()["name"] == "/"
    r = target.call("GET", "/healthchecks/node//")
    assert (r.status_code, r.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"})
