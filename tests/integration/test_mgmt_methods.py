"""Management HTTP API: how methods and paths are routed, as RabbitMQ 3.10.8's cowboy routes
them, and /api/overview's listeners. Against RabbitMQ with its management plugin:

    python tools/rabbitmq_node.py run --plugins rabbitmq_management -- \\
        python -m pytest -q tests/integration/test_mgmt_methods.py

- A method cowboy does not know (TRACE, PROPFIND, FOO, ...) gets an empty 501, on any path,
  before authentication; one it knows but the path lacks (PATCH) gets the empty 405.
- A fixed path is its own resource: GET, PUT or DELETE on /api/users/bulk-delete is a 405
  (Allow: POST, OPTIONS), not the user "bulk-delete"; PUT on /api/users/without-permissions
  is a 405 too.
- /api/overview lists every address the broker listens on for AMQP (Warren-only part: its
  default is both loopbacks).
"""

import os
import socket
import subprocess

import pytest
import requests

from conftest import EXTERNAL, RABBITMQ, start_broker
from warrenctl_path import WARRENCTL

MGMT = os.environ.get("WARREN_TEST_MGMT")
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT,
                                reason="the comparison RabbitMQ node has no management plugin")
ADMIN = ("guest", "guest")


@pytest.fixture(scope="module")
def api():
    if MGMT:
        yield MGMT
        return
    b = start_broker()
    yield b.api
    b.stop()


def call(api, method, path, auth=ADMIN, **kw):
    return requests.request(method, api + path, auth=auth, timeout=30, **kw)


@pytest.mark.parametrize("method", ["TRACE", "PROPFIND", "MKCOL", "SEARCH"])
@pytest.mark.parametrize("path", ["/overview", "/queues", "/no-such-path"])
def test_unknown_method_is_501(api, method, path):
    for auth in (ADMIN, None):
        r = call(api, method, path, auth=auth)
        assert (r.status_code, r.content) == (501, b""), (method, path, r.headers)


@pytest.mark.xfail(not RABBITMQ, strict=True,
                   reason="aiohttp's HTTP parser refuses a method it does not know (FOO) with a "
                          "400 before the application sees the request")
def test_made_up_method_is_501(api):
    r = call(api, "FOO", "/overview")
    assert (r.status_code, r.content) == (501, b"")


def test_known_method_the_path_lacks_is_405(api):
    r = call(api, "PATCH", "/overview", auth=None)
    assert (r.status_code, r.content, r.headers["Allow"]) == (405, b"", "HEAD, GET, OPTIONS")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_bulk_delete_is_post_only(api, method):
    for auth in (ADMIN, None):  # before authentication, as every 405
        r = call(api, method, "/users/bulk-delete", auth=auth, json={"tags": ""} if method == "PUT" else None)
        assert (r.status_code, r.content, r.headers["Allow"]) == (405, b"", "POST, OPTIONS"), r.text
    assert call(api, "OPTIONS", "/users/bulk-delete").headers["Allow"] == "POST, OPTIONS"
    # ... and made no user of that name.
    assert all(u["name"] != "bulk-delete" for u in call(api, "GET", "/users").json())


@pytest.mark.parametrize("method", ["PUT", "DELETE", "POST"])
def test_without_permissions_is_get_only(api, method):
    r = call(api, method, "/users/without-permissions", json={"tags": ""} if method == "PUT" else None)
    assert (r.status_code, r.headers["Allow"]) == (405, "HEAD, GET, OPTIONS"), r.text
    assert call(api, "GET", "/users/without-permissions").status_code == 200


def test_bulk_delete_still_deletes(api):
    for name in ("bd-a", "bd-b"):
        assert call(api, "PUT", f"/users/{name}", json={"password": "x", "tags": ""}).status_code in (201, 204)
    assert call(api, "POST", "/users/bulk-delete", json={"users": ["bd-a", "bd-b"]}).status_code == 204
    assert call(api, "GET", "/users/bd-a").status_code == 404


def test_overview_lists_the_amqp_listener(api):
    listeners = call(api, "GET", "/overview").json()["listeners"]
    amqp = [entry for entry in listeners if entry["protocol"] == "amqp"]
    assert amqp and all(isinstance(entry["port"], int) and entry["ip_address"] for entry in amqp)
    assert [entry for entry in listeners if entry["protocol"] == "http"]


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_overview_lists_every_amqp_address(make_broker):
    """One entry per address, as RabbitMQ lists one per listener (Warren listens on both
    loopbacks by default, or on every --host)."""
    b = make_broker(pass_host=False)
    listeners = requests.get(b.api + "/overview", auth=ADMIN, timeout=30).json()["listeners"]
    amqp = sorted((entry["ip_address"], entry["port"]) for entry in listeners if entry["protocol"] == "amqp")
    expected = [("127.0.0.1", b.port)] + ([("::1", b.port)] if _has_ipv6_loopback() else [])
    assert amqp == sorted(expected)
    http = [(entry["ip_address"], entry["port"]) for entry in listeners if entry["protocol"] == "http"]
    assert http == [("127.0.0.1", b.mgmt_port)]
    # The same over warrenctl's control socket (where the request's own socket has no port).
    r = subprocess.run([WARRENCTL, "status"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "WARREN_DATA_DIR": b.data_dir})
    assert r.returncode == 0, r
    assert f"Interface: 127.0.0.1, port: {b.port}, protocol: amqp" in r.stdout
    assert f"Interface: 127.0.0.1, port: {b.mgmt_port}, protocol: http" in r.stdout
