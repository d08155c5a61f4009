"""Vhost limits (max-connections, max-queues) and user limits (max-connections, max-channels):
the management API's /api/vhost-limits and /api/user-limits, and their enforcement over AMQP
with RabbitMQ 3.10's codes and texts (raw frames, tests/rawamqp.py).

The AMQP tests also run against RabbitMQ: the limits are set over its management API
(WARREN_TEST_MGMT, `tools/rabbitmq_node.py run --plugins rabbitmq_management`) or with
rabbitmqctl (WARREN_TEST_RABBITMQCTL); with neither they skip. The API tests need the API.
"""

import json
import os
import shlex
import subprocess
import time
import uuid
from urllib.parse import quote

import pytest
import requests
from pamqp import commands

from conftest import EXTERNAL
from rawamqp import connect, dial

MGMT = os.environ.get("WARREN_TEST_MGMT")
CTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
PASSWORD = "limits-pw"


def q(name: str) -> str:
    return quote(name, safe="")


class Admin:
    """Users, vhosts and limits set up over the management API (Warren's, or RabbitMQ's with
    WARREN_TEST_MGMT) or, for a RabbitMQ without it, with rabbitmqctl."""

    def __init__(self, broker):
        self.broker = broker
        self.api = broker.api if not EXTERNAL else MGMT
        self.ctl = shlex.split(CTL) if EXTERNAL and not MGMT and CTL else None
        if self.api is None and self.ctl is None:
            pytest.skip("needs the management API or rabbitmqctl to set limits")
        self.vhosts: list[str] = []
        self.users: list[str] = []

    def http(self, method, path, body=None, expect=(200, 201, 204)):
        r = requests.request(method, self.api + path, json=body, auth=("guest", "guest"), timeout=30)
        assert r.status_code in expect, (method, path, r.status_code, r.text)
        return r

    def run(self, *args):
        subprocess.run([*self.ctl, *args], check=True, capture_output=True, timeout=60)

    def vhost(self) -> str:
        """A new vhost where guest has full permissions."""
        name = f"lim-{uuid.uuid4().hex[:8]}"
        self.vhosts.append(name)
        if self.api:
            self.http("PUT", f"/vhosts/{q(name)}", {})
            self.http("PUT", f"/permissions/{q(name)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        else:
            self.run("add_vhost", name)
            self.run("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        return name

    def user(self, *vhosts: str) -> str:
        """A new user with full permissions in `vhosts`."""
        name = f"lim-{uuid.uuid4().hex[:8]}"
        self.users.append(name)
        if self.api:
            self.http("PUT", f"/users/{q(name)}", {"password": PASSWORD, "tags": ""})
        else:
            self.run("add_user", name, PASSWORD)
        for vhost in vhosts:
            if self.api:
                self.http("PUT", f"/permissions/{q(vhost)}/{q(name)}", {"configure": ".*", "write": ".*", "read": ".*"})
            else:
                self.run("set_permissions", "-p", vhost, name, ".*", ".*", ".*")
        return name

    def vhost_limits(self, vhost: str, limits: dict) -> None:
        if self.api:
            self.http("PUT", f"/parameters/vhost-limits/{q(vhost)}/limits", {"value": limits})
        else:
            self.run("set_vhost_limits", "-p", vhost, json.dumps(limits))

    def user_limits(self, user: str, limits: dict) -> None:
        if self.api:
            for name, value in limits.items():
                self.http("PUT", f"/user-limits/{q(user)}/{name}", {"value": value})
        else:
            self.run("set_user_limits", user, json.dumps(limits))

    def clean(self) -> None:
        for name in self.users:
            if self.api:
                self.http("DELETE", f"/users/{q(name)}", expect=(204, 404))
            else:
                subprocess.run([*self.ctl, "delete_user", name], capture_output=True, timeout=60)
        for name in self.vhosts:
            if self.api:
                self.http("DELETE", f"/vhosts/{q(name)}", expect=(204, 404))
            else:
                subprocess.run([*self.ctl, "delete_vhost", name], capture_output=True, timeout=60)


@pytest.fixture
def admin(broker):
    a = Admin(broker)
    yield a
    a.clean()


def refused_open(broker, code, text, user="guest", password="guest", vhost="/"):
    """Open `vhost` as `user` and expect connection.close (code, text) for connection.open."""
    c = dial(broker)
    try:
        c.handshake(user=user, password=password, open_vhost=False)
        c.send_method(0, commands.Connection.Open(virtual_host=vhost))
        c.expect_connection_close(code, text, 10, 40)
    finally:
        c.close()


def settle() -> None:
    """RabbitMQ tracks connections and channels asynchronously: let it catch up before a
    test counts on them (Warren counts synchronously)."""
    if EXTERNAL:
        time.sleep(1.5)


def eventually(fn, timeout=10.0):
    """fn() until it stops raising (RabbitMQ counts connections asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (AssertionError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ----------------------------------------------------------------------- vhost limits
def test_vhost_max_connections(broker, admin):
    vhost = admin.vhost()
    other = admin.user(vhost)
    stranger = admin.user()  # no permissions in the vhost
    admin.vhost_limits(vhost, {"max-connections": 1})
    first = eventually(lambda: connect(broker, vhost=vhost))
    try:
        text = f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '%s': connection limit (1) is reached"
        eventually(lambda: refused_open(broker, 530, text % "guest", vhost=vhost))
        refused_open(broker, 530, text % other, other, PASSWORD, vhost)
        # The limit is checked before the vhost access: a user without permissions is told so too.
        refused_open(broker, 530, text % stranger, stranger, PASSWORD, vhost)
    finally:
        first.close()
    # Its connection gone, there is room again.
    eventually(lambda: connect(broker, vhost=vhost).close())


def test_vhost_max_connections_zero_and_negative(broker, admin):
    vhost = admin.vhost()
    admin.vhost_limits(vhost, {"max-connections": 0})
    text = f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (0) is reached"
    eventually(lambda: refused_open(broker, 530, text, vhost=vhost))
    admin.vhost_limits(vhost, {"max-connections": -1})  # negative: no limit
    clients = [eventually(lambda: connect(broker, vhost=vhost)) for _ in range(3)]
    for c in clients:
        c.close()


def test_vhost_max_queues(broker, admin):
    vhost = admin.vhost()
    admin.vhost_limits(vhost, {"max-queues": 2})
    c = eventually(lambda: connect(broker, vhost=vhost))
    try:
        c.open_channel(1)
        for name in ("q1", "q1", "q2", "q2"):  # a redeclare is no new queue
            c.send_method(1, commands.Queue.Declare(queue=name))
            c.expect(commands.Queue.DeclareOk, 1)
        c.send_method(1, commands.Queue.Declare(queue="q3"))
        c.expect_channel_close(1, 406, f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost "
                                       f"'{vhost}' (2) is reached", 50, 10)
        # Passive declares and other operations are not limited.
        c.open_channel(2)
        c.send_method(2, commands.Queue.Declare(queue="q1", passive=True))
        c.expect(commands.Queue.DeclareOk, 2)
        # Server-named and exclusive queues count too.
        c.send_method(2, commands.Queue.Declare(queue="", exclusive=True))
        close = c.expect(commands.Channel.Close, 2)
        assert close.reply_code == 406 and close.reply_text.startswith(
            "PRECONDITION_FAILED - cannot declare queue 'amq.gen-"), close.reply_text
        assert close.reply_text.endswith(f"': queue limit in vhost '{vhost}' (2) is reached")
        c.send_method(2, commands.Channel.CloseOk())
        # A deleted queue makes room.
        c.open_channel(3)
        c.send_method(3, commands.Queue.Delete(queue="q2"))
        c.expect(commands.Queue.DeleteOk, 3)
        c.send_method(3, commands.Queue.Declare(queue="q3"))
        c.expect(commands.Queue.DeclareOk, 3)
    finally:
        c.close()


def test_vhost_max_queues_zero(broker, admin):
    vhost = admin.vhost()
    admin.vhost_limits(vhost, {"max-queues": 0})
    c = eventually(lambda: connect(broker, vhost=vhost))
    try:
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue="q"))
        c.expect_channel_close(1, 406, f"PRECONDITION_FAILED - cannot declare queue 'q': queue limit in vhost "
                                       f"'{vhost}' (0) is reached", 50, 10)
    finally:
        c.close()


def test_max_queues_over_http(broker, admin):
    if admin.api is None:
        pytest.skip("needs the management API")
    vhost = admin.vhost()
    admin.vhost_limits(vhost, {"max-queues": 1})
    admin.http("PUT", f"/queues/{q(vhost)}/a", {"durable": True})
    r = admin.http("PUT", f"/queues/{q(vhost)}/b", {"durable": True}, expect=(400,))
    assert r.json() == {"error": "bad_request",
                        "reason": f"cannot declare queue 'b': queue limit in vhost '{vhost}' (1) is reached"}
    admin.http("PUT", f"/queues/{q(vhost)}/a", {"durable": True})  # the existing one: fine
    # An import checks its new queues against the limit first, and applies nothing if over.
    r = admin.http("POST", f"/definitions/{q(vhost)}", {"queues": [
        {"name": "c", "durable": True, "auto_delete": False, "arguments": {}}]}, expect=(400,))
    assert r.json()["reason"] == (f'Adding 1 queue(s) to virtual host "{vhost}" would exceed the limit of 1 '
                                  "queue(s).\n\nThis virtual host currently has 1 queue(s) defined.\n\n"
                                  "Import aborted!")
    admin.http("GET", f"/queues/{q(vhost)}/c", expect=(404,))


# ------------------------------------------------------------------------ user limits
def test_user_max_connections(broker, admin):
    vhost = admin.vhost()
    user = admin.user("/", vhost)
    admin.user_limits(user, {"max-connections": 1})
    first = eventually(lambda: connect(broker, user=user, password=PASSWORD))
    try:
        text = f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached"
        # Whatever the vhost: the limit is the user's.
        eventually(lambda: refused_open(broker, 530, text, user, PASSWORD, vhost))
        # A vhost that does not exist is reported first, as RabbitMQ does.
        refused_open(broker, 530, "NOT_ALLOWED - vhost no-such-vhost not found", user, PASSWORD, "no-such-vhost")
        # Other users are not limited.
        connect(broker).close()
    finally:
        first.close()
    eventually(lambda: connect(broker, user=user, password=PASSWORD).close())


def test_vhost_limit_before_user_limit(broker, admin):
    vhost = admin.vhost()
    user = admin.user(vhost)
    admin.vhost_limits(vhost, {"max-connections": 0})
    admin.user_limits(user, {"max-connections": 0})
    eventually(lambda: refused_open(
        broker, 530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': connection limit (0) "
                     "is reached", user, PASSWORD, vhost))
    refused_open(broker, 530, f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (0) "
                              "is reached", user, PASSWORD, "/")


def test_user_max_channels(broker, admin):
    user = admin.user("/")
    admin.user_limits(user, {"max-channels": 2})
    a = eventually(lambda: connect(broker, user=user, password=PASSWORD))
    b = connect(broker, user=user, password=PASSWORD)
    try:
        # Counted over all the user's connections.
        a.open_channel(1)
        b.open_channel(1)
        settle()
        # A channel closed makes room.
        b.send_method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        b.expect(commands.Channel.CloseOk, 1)
        settle()
        b.open_channel(2)
        settle()
        a.send_method(2, commands.Channel.Open())
        a.expect_connection_close(530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
                                       "the maximum allowed user limit of (2)", 0, 0)
        # Another user is not limited.
        with connect(broker) as c:
            c.open_channel(1)
            c.open_channel(2)
            c.open_channel(3)
    finally:
        a.close()
        b.close()


def test_user_max_channels_after_a_password_change(broker, admin):
    """A limit set after the user changed (new password: a new user record in Warren) holds
    for the connections it opened before."""
    user = admin.user("/")
    a = eventually(lambda: connect(broker, user=user, password=PASSWORD))
    try:
        if admin.api:
            admin.http("PUT", f"/users/{q(user)}", {"password": "changed", "tags": ""})
        else:
            admin.run("change_password", user, "changed")
        admin.user_limits(user, {"max-channels": 1})
        settle()
        a.open_channel(1)
        settle()
        a.send_method(2, commands.Channel.Open())
        a.expect_connection_close(530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
                                       "the maximum allowed user limit of (1)", 0, 0)
    finally:
        a.close()


def test_user_max_channels_zero(broker, admin):
    user = admin.user("/")
    admin.user_limits(user, {"max-channels": 0})
    c = eventually(lambda: connect(broker, user=user, password=PASSWORD))
    try:
        c.send_method(1, commands.Channel.Open())
        c.expect_connection_close(530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
                                       "the maximum allowed user limit of (0)", 0, 0)
    finally:
        c.close()


# ------------------------------------------------------------------------------- API
@pytest.fixture
def api(broker, admin):
    if admin.api is None:
        pytest.skip("needs the management API")
    return admin


def test_vhost_limits_api(api):
    vhost = api.vhost()
    v = q(vhost)
    assert api.http("GET", f"/vhost-limits/{v}").json() == []
    assert api.http("PUT", f"/vhost-limits/{v}/max-queues", {"value": 10}).status_code == 204
    assert api.http("PUT", f"/vhost-limits/{v}/max-connections", {"value": -1}).status_code == 204
    assert api.http("GET", f"/vhost-limits/{v}").json() == [
        {"vhost": vhost, "value": {"max-connections": -1, "max-queues": 10}}]
    assert {"vhost": vhost, "value": {"max-connections": -1, "max-queues": 10}} in api.http(
        "GET", "/vhost-limits").json()
    # The same limits are the vhost's "limits" runtime parameter.
    assert api.http("GET", f"/parameters/vhost-limits/{v}/limits").json() == {
        "value": {"max-connections": -1, "max-queues": 10}, "vhost": vhost, "component": "vhost-limits",
        "name": "limits"}
    for body, reason in (
            ({"value": "5"}, 'max-queues should be a number, actually was <<"5">>'),
            ({"value": 5.5}, "max-queues should be a number, actually was 5.5"),
            ({"value": True}, "max-queues should be a number, actually was true"),
            ({"value": None}, "max-queues should be a number, actually was null"),
            ({"value": [1]}, "max-queues should be a number, actually was [1]")):
        r = api.http("PUT", f"/vhost-limits/{v}/max-queues", body, expect=(400,))
        assert r.json() == {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"}, body
    r = api.http("PUT", f"/vhost-limits/{v}/max-channels", {"value": 5}, expect=(400,))
    assert r.json()["reason"] == 'Validation failed\n\nUnrecognised terms [{<<"max-channels">>,5}] in limits\n'
    r = api.http("PUT", f"/vhost-limits/{v}/max-queues", {}, expect=(400,))
    assert r.json()["reason"] == "[{key_missing,value}]"
    r = api.http("PUT", "/vhost-limits/no-such-vhost/max-queues", {"value": 1}, expect=(404,))
    assert r.json() == {"error": "not_found", "reason": "vhost_not_found"}
    api.http("GET", "/vhost-limits/no-such-vhost", expect=(404,))
    # Clearing: one at a time, a missing one is fine; the parameter stays, empty.
    assert api.http("DELETE", f"/vhost-limits/{v}/max-queues").status_code == 204
    assert api.http("DELETE", f"/vhost-limits/{v}/max-queues").status_code == 204
    assert api.http("DELETE", f"/vhost-limits/{v}/max-connections").status_code == 204
    assert api.http("GET", f"/vhost-limits/{v}").json() == []
    assert api.http("GET", f"/parameters/vhost-limits/{v}").json() == [
        {"value": [], "vhost": vhost, "component": "vhost-limits", "name": "limits"}]


def test_user_limits_api(api):
    user = api.user()
    u = q(user)
    assert api.http("GET", f"/user-limits/{u}").json() == []
    assert api.http("PUT", f"/user-limits/{u}/max-channels", {"value": 0}).status_code == 204
    assert api.http("PUT", f"/user-limits/{u}/max-connections", {"value": 7}).status_code == 204
    expected = {"user": user, "value": {"max-channels": 0, "max-connections": 7}}
    assert api.http("GET", f"/user-limits/{u}").json() == [expected]
    assert expected in api.http("GET", "/user-limits").json()
    assert api.http("GET", f"/users/{u}").json()["limits"] == expected["value"]
    r = api.http("PUT", f"/user-limits/{u}/max-channels", {"value": "5"}, expect=(400,))
    assert r.json() == {"error": "bad_request", "reason": 'max-channels should be a number, actually was <<"5">>'}
    r = api.http("PUT", f"/user-limits/{u}/max-queues", {"value": 1}, expect=(400,))
    assert r.json()["reason"] == 'Unrecognised terms [{<<"max-queues">>,1}] in user-limits'
    r = api.http("PUT", "/user-limits/no-such-user/max-channels", {"value": 1}, expect=(400,))
    assert r.json() == {"error": "bad_request", "reason": ["no_such_user", "no-such-user"]}
    api.http("GET", "/user-limits/no-such-user", expect=(404,))
    # A new password keeps the limits; "limits" in a PUT merges.
    api.http("PUT", f"/users/{u}", {"password": "other", "tags": "", "limits": {"max-channels": 9}})
    assert api.http("GET", f"/user-limits/{u}").json() == [
        {"user": user, "value": {"max-channels": 9, "max-connections": 7}}]
    assert api.http("DELETE", f"/user-limits/{u}/max-channels").status_code == 204
    assert api.http("DELETE", f"/user-limits/{u}/max-channels").status_code == 204
    assert api.http("DELETE", f"/user-limits/{u}/max-connections").status_code == 204
    assert api.http("GET", f"/user-limits/{u}").json() == []
    assert api.http("GET", f"/users/{u}").json()["limits"] == {}


def test_limits_in_definitions(api):
    vhost = api.vhost()
    user = api.user()
    api.http("PUT", f"/vhost-limits/{q(vhost)}/max-queues", {"value": 4})
    api.http("PUT", f"/user-limits/{q(user)}/max-connections", {"value": 3})
    defs = api.http("GET", "/definitions").json()
    assert {"value": {"max-queues": 4}, "vhost": vhost, "component": "vhost-limits", "name": "limits"} \
        in defs["parameters"]
    assert next(u for u in defs["users"] if u["name"] == user)["limits"] == {"max-connections": 3}
    assert api.http("GET", f"/definitions/{q(vhost)}").json()["parameters"] == [
        {"value": {"max-queues": 4}, "vhost": vhost, "component": "vhost-limits", "name": "limits"}]
    # Imported back: a user's limits merge with its own.
    imported = dict(next(u for u in defs["users"] if u["name"] == user), limits={"max-channels": 2})
    api.http("POST", "/definitions", {"users": [imported], "parameters": [
        {"value": {"max-connections": 1}, "vhost": vhost, "component": "vhost-limits", "name": "limits"}]})
    assert api.http("GET", f"/user-limits/{q(user)}").json() == [
        {"user": user, "value": {"max-channels": 2, "max-connections": 3}}]
    assert api.http("GET", f"/vhost-limits/{q(vhost)}").json() == [{"vhost": vhost, "value": {"max-connections": 1}}]


# ------------------------------------------------------------------ across a restart
def test_limits_survive_restart(make_broker, restart_broker):
    b = make_broker()
    auth = ("guest", "guest")

    def call(method, path, body=None):
        r = requests.request(method, b.api + path, json=body, auth=auth, timeout=30)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r

    call("PUT", "/vhosts/lv", {})
    call("PUT", "/vhost-limits/lv/max-queues", {"value": 1})
    call("PUT", "/vhost-limits/lv/max-connections", {"value": 1})
    call("PUT", "/users/lu", {"password": PASSWORD, "tags": ""})
    call("PUT", "/permissions/lv/lu", {"configure": ".*", "write": ".*", "read": ".*"})
    call("PUT", "/user-limits/lu/max-channels", {"value": 1})
    b = restart_broker(b)
    assert requests.get(b.api + "/vhost-limits/lv", auth=auth, timeout=30).json() == [
        {"vhost": "lv", "value": {"max-connections": 1, "max-queues": 1}}]
    assert requests.get(b.api + "/user-limits/lu", auth=auth, timeout=30).json() == [
        {"user": "lu", "value": {"max-channels": 1}}]
    # And enforced.
    c = connect(b, user="lu", password=PASSWORD, vhost="lv")
    try:
        refused_open(b, 530, "NOT_ALLOWED - access to vhost 'lv' refused for user 'guest': connection limit (1) "
                             "is reached", vhost="lv")
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue="a"))
        c.expect(commands.Queue.DeclareOk, 1)
        c.send_method(1, commands.Queue.Declare(queue="b"))
        c.expect_channel_close(1, 406, "PRECONDITION_FAILED - cannot declare queue 'b': queue limit in vhost 'lv' "
                                       "(1) is reached", 50, 10)
        c.open_channel(2)
        c.send_method(3, commands.Channel.Open())
        c.expect_connection_close(530, "NOT_ALLOWED - number of channels opened for user 'lu' has reached the "
                                       "maximum allowed user limit of (1)", 0, 0)
    finally:
        c.close()
    # Clearing survives too (the journal records the empty parameter and the user's limits).
    call("DELETE", "/vhost-limits/lv/max-queues")
    call("DELETE", "/vhost-limits/lv/max-connections")
    call("DELETE", "/user-limits/lu/max-channels")
    b = restart_broker(b)
    assert requests.get(b.api + "/vhost-limits/lv", auth=auth, timeout=30).json() == []
    assert requests.get(b.api + "/user-limits/lu", auth=auth, timeout=30).json() == []


def test_methods_as_rabbitmq(api):
    """RabbitMQ's limits resources answer no HEAD (405, before authentication), and a single
    limit only PUT and DELETE."""
    vhost = api.vhost()
    for path, allow in (("/vhost-limits", "GET, OPTIONS"), (f"/vhost-limits/{q(vhost)}", "GET, OPTIONS"),
                        ("/user-limits", "GET, OPTIONS"), ("/user-limits/guest", "GET, OPTIONS")):
        r = requests.head(api.api + path, timeout=30)
        assert (r.status_code, r.headers.get("Allow")) == (405, allow), path
    r = requests.get(api.api + f"/vhost-limits/{q(vhost)}/max-queues", auth=("guest", "guest"), timeout=30)
    assert (r.status_code, r.headers.get("Allow")) == (405, "PUT, DELETE, OPTIONS")


def test_who_sees_and_sets_limits(api):
    """Vhost limits: listed for the vhosts a user has permissions in (monitoring users: all),
    set by administrators only; user limits: everyone's, to any management user."""
    mine, other = api.vhost(), api.vhost()
    for v in (mine, other):
        api.http("PUT", f"/vhost-limits/{q(v)}/max-queues", {"value": 50})
    mgmt, mon = api.user(mine), api.user(mine)
    api.http("PUT", f"/users/{q(mgmt)}", {"password": PASSWORD, "tags": "management"})
    api.http("PUT", f"/users/{q(mon)}", {"password": PASSWORD, "tags": "monitoring"})
    api.http("PUT", f"/user-limits/{q(mon)}/max-channels", {"value": 5})

    def call(user, method, path, body=None):
        return requests.request(method, api.api + path, json=body, auth=(user, PASSWORD), timeout=30)

    seen = {item["vhost"] for item in call(mgmt, "GET", "/vhost-limits").json()}
    assert mine in seen and other not in seen
    assert call(mgmt, "GET", f"/vhost-limits/{q(other)}").json() == {
        "error": "not_authorised", "reason": "User not authorised to access virtual host"}
    seen = {item["vhost"] for item in call(mon, "GET", "/vhost-limits").json()}
    assert {mine, other} <= seen
    assert call(mon, "GET", f"/vhost-limits/{q(other)}").json() == [{"vhost": other, "value": {"max-queues": 50}}]
    for user in (mgmt, mon):
        r = call(user, "PUT", f"/vhost-limits/{q(mine)}/max-queues", {"value": 1})
        assert (r.status_code, r.json()["reason"]) == (401, "Not administrator user")
        r = call(user, "PUT", f"/user-limits/{q(user)}/max-channels", {"value": 1})
        assert (r.status_code, r.json()["reason"]) == (401, "Not administrator user")
    assert {"user": mon, "value": {"max-channels": 5}} in call(mgmt, "GET", "/user-limits").json()
