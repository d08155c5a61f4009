"""Topic permissions, as RabbitMQ 3.10 enforces them: on topic exchanges only, the `write`
regex against the routing key of basic.publish, the `read` regex against the binding key of
queue.bind/unbind and exchange.bind/unbind (source exchange); "{username}" and "{vhost}" in a
pattern stand for the user's and the vhost's names; an empty pattern matches only the empty
key; an exchange without a topic permission for the user is not restricted.

The AMQP tests run against Warren and, with WARREN_TEST_BROKER and WARREN_TEST_RABBITMQCTL
(to import the users and topic permissions), against RabbitMQ. Warren's refusals name the
permission ("write access to topic 'k' in exchange 'x' ...", the wording of RabbitMQ 3.12+ and
of Warren's other refusals); RabbitMQ 3.10 leaves it out ("access to topic ..."). The API
tests need a management API: Warren's, or RabbitMQ's with WARREN_TEST_MGMT (run them with
`python tools/rabbitmq_node.py run --plugins rabbitmq_management -- python -m pytest
tests/integration/test_topic_permissions.py`). The restart tests are Warren's only.
"""

import os
import signal
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, RABBITMQ, RUN_ID, DefinitionsBroker, channel_error, password_hash

MGMT = os.environ.get("WARREN_TEST_MGMT")
SUFFIX = RUN_ID[:6]
VHOST = f"topic-perm-{SUFFIX}"
USER, PASSWORD = f"tp.user-{SUFFIX}", "tp-secret"
MGMT_USER = f"tp-mgmt-{SUFFIX}"  # tagged management: no access to these admin-only routes
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def _definitions() -> dict:
    def user(name, tags):
        return {"name": name, "password_hash": password_hash(PASSWORD),
                "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": tags}

    def exchange(name, type_):
        return {"name": name, "vhost": VHOST, "type": type_, "durable": True, "auto_delete": False,
                "internal": False, "arguments": {}}

    def topic(exchange_name, write, read):
        return {"user": USER, "vhost": VHOST, "exchange": exchange_name, "write": write, "read": read}

    return {
        "users": [user(MGMT_USER, "management"), user(USER, "management")],
        "vhosts": [{"name": VHOST}],
        "permissions": [{"user": USER, "vhost": VHOST, **FULL}, {"user": MGMT_USER, "vhost": VHOST, **FULL}],
        "topic_permissions": [
            topic("amq.topic", r"^a\.", r"^c\."),
            topic("t.vars", r"^{username}\.", r"^{vhost}\."),
            topic("t.empty", "", ""),
            topic("d.direct", "^never$", "^never$"),  # not a topic exchange: never applies
        ],
        "exchanges": [exchange("t.vars", "topic"), exchange("t.empty", "topic"), exchange("t.free", "topic"),
                      exchange("d.direct", "direct"), exchange("f.dest", "fanout")],
        "queues": [{"name": "q", "vhost": VHOST, "durable": True, "auto_delete": False, "arguments": {}}],
    }


def refused(what: str, routing_key: str, exchange: str) -> str:
    if RABBITMQ:  # RabbitMQ 3.10's wording
        return (f"ACCESS_REFUSED - access to topic '{routing_key}' in exchange '{exchange}' in vhost '{VHOST}' "
                f"refused for user '{USER}'")
    return (f"ACCESS_REFUSED - {what} access to topic '{routing_key}' in exchange '{exchange}' in vhost "
            f"'{VHOST}' refused for user '{USER}'")


@pytest.fixture(scope="module")
def topic_broker():
    b = DefinitionsBroker(_definitions())
    yield b
    b.stop()


@pytest.fixture(scope="module")
def conn(topic_broker):
    c = pika.BlockingConnection(topic_broker.broker.pika_params(USER, PASSWORD, VHOST))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def attempt(conn):
    """attempt(fn) runs fn(channel) on a fresh channel; None on success, else the (code, text)
    of the channel.close it caused (the connection stays open)."""

    def run(fn):
        ch = conn.channel()
        try:
            fn(ch)
            # A round trip, so that a refused publish has closed the channel by now.
            ch.queue_declare("q", passive=True)
        except pika.exceptions.ChannelClosedByBroker as err:
            assert conn.is_open
            return err.reply_code, err.reply_text
        ch.close()
        return None

    return run


def publish(exchange, routing_key):
    return lambda ch: ch.basic_publish(exchange, routing_key, b"m")


def bind(exchange, routing_key):
    return lambda ch: ch.queue_bind("q", exchange, routing_key)


# ------------------------------------------------------------------ AMQP
def test_publish_checks_the_routing_key_against_write(attempt):
    assert attempt(publish("amq.topic", "a.1")) is None
    assert attempt(publish("amq.topic", "b.1")) == (403, refused("write", "b.1", "amq.topic"))
    # A regex search, as re:run: anchors only where the pattern has them.
    assert attempt(publish("amq.topic", "xa.1")) == (403, refused("write", "xa.1", "amq.topic"))


def test_confirmed_publish_is_refused_before_it_is_routed(conn, topic_broker):
    ch = conn.channel()
    ch.queue_purge("q")
    ch.queue_bind("q", "amq.topic", "c.#")
    ch.confirm_delivery()
    channel_error(lambda: ch.basic_publish("amq.topic", "c.1", b"refused"), 403, refused("write", "c.1", "amq.topic"))
    ch = conn.channel()
    ch.basic_publish("amq.topic", "a.c", b"allowed")  # routes nowhere (no binding matches)
    assert ch.queue_declare("q", passive=True).method.message_count == 0
    ch.queue_unbind("q", "amq.topic", "c.#")
    ch.close()


def test_bind_and_unbind_check_the_binding_key_against_read(attempt):
    assert attempt(bind("amq.topic", "c.x")) is None
    assert attempt(bind("amq.topic", "a.x")) == (403, refused("read", "a.x", "amq.topic"))
    assert attempt(lambda ch: ch.queue_unbind("q", "amq.topic", "c.x")) is None
    # unbind is checked too, also for a binding that does not exist
    assert attempt(lambda ch: ch.queue_unbind("q", "amq.topic", "a.x")) == (403, refused("read", "a.x", "amq.topic"))


def test_exchange_bind_checks_the_source(attempt):
    assert attempt(lambda ch: ch.exchange_bind("f.dest", "amq.topic", "c.1")) is None
    assert attempt(lambda ch: ch.exchange_bind("f.dest", "amq.topic", "z")) == (403, refused("read", "z", "amq.topic"))
    assert attempt(lambda ch: ch.exchange_unbind("f.dest", "amq.topic", "z")) == (
        403, refused("read", "z", "amq.topic"))
    assert attempt(lambda ch: ch.exchange_unbind("f.dest", "amq.topic", "c.1")) is None


def test_username_and_vhost_variables(attempt):
    assert attempt(publish("t.vars", f"{USER}.x")) is None
    assert attempt(publish("t.vars", "other.x")) == (403, refused("write", "other.x", "t.vars"))
    assert attempt(bind("t.vars", f"{VHOST}.#")) is None
    assert attempt(bind("t.vars", f"{USER}.#")) == (403, refused("read", f"{USER}.#", "t.vars"))
    assert attempt(lambda ch: ch.queue_unbind("q", "t.vars", f"{VHOST}.#")) is None


def test_empty_pattern_allows_only_the_empty_key(attempt):
    assert attempt(publish("t.empty", "")) is None
    assert attempt(publish("t.empty", "k")) == (403, refused("write", "k", "t.empty"))
    assert attempt(bind("t.empty", "")) is None
    assert attempt(bind("t.empty", "#")) == (403, refused("read", "#", "t.empty"))


def test_only_topic_exchanges_and_only_those_named(attempt):
    # d.direct has a topic permission, but it is a direct exchange
    assert attempt(publish("d.direct", "anything")) is None
    assert attempt(bind("d.direct", "anything")) is None
    # t.free is a topic exchange without a topic permission for the user
    assert attempt(publish("t.free", "anything")) is None
    assert attempt(bind("t.free", "anything")) is None


def test_missing_source_is_not_found_not_refused(attempt):
    assert attempt(bind("t.missing", "z")) == (404, f"NOT_FOUND - no exchange 't.missing' in vhost '{VHOST}'")
    assert attempt(publish("t.missing", "z")) == (404, f"NOT_FOUND - no exchange 't.missing' in vhost '{VHOST}'")


# ------------------------------------------------------------------ HTTP
needs_api = pytest.mark.skipif(bool(EXTERNAL) and not MGMT, reason="needs the management API")


def q(name: str) -> str:
    return quote(name, safe="")


@pytest.fixture(scope="module")
def api(topic_broker):
    base = MGMT or topic_broker.broker.api

    def call(method, path, body=None, user="guest", password="guest"):
        return requests.request(method, base + path, json=body, auth=(user, password), timeout=30)

    return call


@needs_api
def test_api_lists(api):
    listed = api("GET", "/topic-permissions").json()
    mine = [p for p in listed if p["vhost"] == VHOST]
    assert {(p["exchange"], p["write"], p["read"]) for p in mine} == {
        ("amq.topic", r"^a\.", r"^c\."), ("t.vars", r"^{username}\.", r"^{vhost}\."), ("t.empty", "", ""),
        ("d.direct", "^never$", "^never$")}
    assert all(list(p) == ["user", "vhost", "exchange", "write", "read"] for p in mine)
    by_user = api("GET", f"/users/{q(USER)}/topic-permissions").json()
    assert sorted(by_user, key=lambda p: p["exchange"]) == sorted(mine, key=lambda p: p["exchange"])
    by_vhost = api("GET", f"/vhosts/{q(VHOST)}/topic-permissions").json()
    assert all(list(p) == ["vhost", "user", "exchange", "write", "read"] for p in by_vhost)
    assert sorted(by_vhost, key=lambda p: p["exchange"]) == sorted(
        ({"vhost": p["vhost"], **p} for p in mine), key=lambda p: p["exchange"])
    one = api("GET", f"/topic-permissions/{q(VHOST)}/{q(USER)}")
    assert one.status_code == 200 and sorted(one.json(), key=lambda p: p["exchange"]) == sorted(
        mine, key=lambda p: p["exchange"])
    # with an exchange in the path, still all of them
    assert sorted(api("GET", f"/topic-permissions/{q(VHOST)}/{q(USER)}/amq.topic").json(),
                  key=lambda p: p["exchange"]) == sorted(mine, key=lambda p: p["exchange"])
    for path in (f"/users/nobody-{SUFFIX}/topic-permissions", f"/vhosts/nowhere-{SUFFIX}/topic-permissions",
                 f"/topic-permissions/nowhere-{SUFFIX}/{q(USER)}", f"/topic-permissions/{q(VHOST)}/nobody-{SUFFIX}",
                 f"/topic-permissions/{q(VHOST)}/{q(MGMT_USER)}", f"/topic-permissions/{q(VHOST)}"):
        r = api("GET", path)
        assert (r.status_code, r.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"}), path


@needs_api
def test_api_put_and_delete(api, topic_broker):
    path = f"/topic-permissions/{q(VHOST)}/{q(MGMT_USER)}"
    body = {"exchange": "t.free", "write": "^w", "read": "^r"}
    assert api("PUT", path, body).status_code == 201  # the user had none in the vhost
    assert api("PUT", path, {**body, "read": "^rr"}).status_code == 204
    # the exchange comes from the body, also when the path names one
    assert api("PUT", path + "/ignored", {**body, "exchange": "t.empty"}).status_code == 204
    got = sorted(api("GET", path).json(), key=lambda p: p["exchange"])
    assert got == [{"user": MGMT_USER, "vhost": VHOST, "exchange": "t.empty", "write": "^w", "read": "^r"},
                   {"user": MGMT_USER, "vhost": VHOST, "exchange": "t.free", "write": "^w", "read": "^rr"}]
    # enforced at once, for new and open channels
    other = pika.BlockingConnection(topic_broker.broker.pika_params(MGMT_USER, PASSWORD, VHOST))
    try:
        ch = other.channel()
        ch.basic_publish("t.free", "w.1", b"m")
        ch.queue_bind("q", "t.free", "rr.1")
        code, _ = channel_error(lambda: ch.queue_bind("q", "t.free", "w.1"))
        assert code == 403
        # deleting one exchange's permission lifts it
        assert api("DELETE", path + "/t.free").status_code == 204
        ch = other.channel()
        ch.queue_bind("q", "t.free", "w.1")
        ch.queue_unbind("q", "t.free", "w.1")
        ch.queue_unbind("q", "t.free", "rr.1")
        # an exchange without one: 204 while the user has any in the vhost
        assert api("DELETE", path + "/t.none").status_code == 204
        assert [p["exchange"] for p in api("GET", path).json()] == ["t.empty"]
        # all of them
        assert api("DELETE", path).status_code == 204
        assert api("DELETE", path).status_code == 404
        assert api("DELETE", path + "/t.empty").status_code == 404
        assert api("GET", path).status_code == 404
        ch.basic_publish("t.empty", "anything", b"m")
        ch.queue_declare("q", passive=True)
    finally:
        other.close()


@needs_api
def test_api_put_errors(api):
    path = f"/topic-permissions/{q(VHOST)}/{q(MGMT_USER)}"
    ok = {"exchange": "t.free", "write": "", "read": ""}

    def put(p, body):
        r = api("PUT", p, body)
        return r.status_code, r.json()

    assert put(f"/topic-permissions/nowhere-{SUFFIX}/{q(MGMT_USER)}", ok) == (
        400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert put(f"/topic-permissions/{q(VHOST)}/nobody-{SUFFIX}", ok) == (
        400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert put(path, {"exchange": "x", "write": ""}) == (400, {"error": "bad_request", "reason": "[{key_missing,read}]"})
    assert put(path, {"write": "", "read": ""}) == (400, {"error": "bad_request", "reason": "[{key_missing,exchange}]"})
    status, body = put(path, {**ok, "write": "("})
    assert status == 400 and body["reason"][:2] == ["invalid_regexp", "("]
    assert api("GET", path).status_code == 404  # nothing was set


@needs_api
def test_api_is_for_administrators(api):
    for method, path in (("GET", "/topic-permissions"), ("GET", f"/topic-permissions/{q(VHOST)}/{q(USER)}"),
                         ("PUT", f"/topic-permissions/{q(VHOST)}/{q(USER)}"),
                         ("DELETE", f"/topic-permissions/{q(VHOST)}/{q(USER)}/amq.topic"),
                         ("GET", f"/users/{q(USER)}/topic-permissions"),
                         ("GET", f"/vhosts/{q(VHOST)}/topic-permissions")):
        r = api(method, path, {"exchange": "amq.topic", "write": "", "read": ""} if method == "PUT" else None,
                user=MGMT_USER, password=PASSWORD)
        assert (r.status_code, r.json()) == (401, {"error": "not_authorised", "reason": "Not administrator user"}), path
    assert len(api("GET", f"/topic-permissions/{q(VHOST)}/{q(USER)}").json()) == 4  # nothing changed


@needs_api
def test_http_publish_and_bind_are_checked(api):
    """The API's publish and bindings go through the same checks: a refused publish is a 400
    with the channel error, a refused binding a 401 "Access refused." (as RabbitMQ)."""
    def as_user(method, path, body):
        return api(method, path, body, user=USER, password=PASSWORD)

    vh = q(VHOST)
    publish = {"properties": {}, "routing_key": "b.1", "payload": "x", "payload_encoding": "string"}
    r = as_user("POST", f"/exchanges/{vh}/amq.topic/publish", publish)
    assert (r.status_code, r.json()) == (400, {"error": "bad_request",
                                               "reason": "403 " + refused("write", "b.1", "amq.topic")})
    r = as_user("POST", f"/exchanges/{vh}/amq.topic/publish", {**publish, "routing_key": "a.1"})
    assert (r.status_code, r.json()) == (200, {"routed": False})
    for path in (f"/bindings/{vh}/e/amq.topic/q/q", f"/bindings/{vh}/e/amq.topic/e/f.dest"):
        r = as_user("POST", path, {"routing_key": "a.1"})
        assert (r.status_code, r.json()) == (401, {"error": "not_authorised", "reason": "Access refused."}), path
    assert as_user("POST", f"/bindings/{vh}/e/amq.topic/q/q", {"routing_key": "c.1"}).status_code == 201
    assert as_user("DELETE", f"/bindings/{vh}/e/amq.topic/q/q/c.1", None).status_code == 204


# ------------------------------------------------------------------ Warren: durability
def _user_and_vhost(api, user, vhost):
    assert api("PUT", f"/vhosts/{q(vhost)}", {}).status_code == 201
    assert api("PUT", f"/users/{q(user)}", {"password": PASSWORD, "tags": ""}).status_code == 201
    assert api("PUT", f"/permissions/{q(vhost)}/{q(user)}", FULL).status_code == 201


def _caller(broker):
    def call(method, path, body=None):
        return requests.request(method, broker.api + path, json=body, auth=("guest", "guest"), timeout=30)
    return call


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_topic_permissions_survive_restart(make_broker, restart_broker, sig):
    b = make_broker()
    api = _caller(b)
    _user_and_vhost(api, "u1", "v1")
    _user_and_vhost(api, "u2", "v2")
    for user, vhost in (("u1", "v1"), ("u2", "v2"), ("guest", "v1"), ("guest", "v2")):
        assert api("PUT", f"/topic-permissions/{vhost}/{user}",
                   {"exchange": "amq.topic", "write": "^{username}$", "read": "^r"}).status_code == 201
    assert api("PUT", "/topic-permissions/v1/u1", {"exchange": "x2", "write": "", "read": ""}).status_code == 204
    assert api("DELETE", "/topic-permissions/v1/u1/x2").status_code == 204
    assert api("DELETE", "/users/u2").status_code == 204  # takes its topic permissions along
    assert api("DELETE", "/vhosts/v2").status_code == 204  # and so does a vhost
    expected = [{"user": "guest", "vhost": "v1", "exchange": "amq.topic", "write": "^{username}$", "read": "^r"},
                {"user": "u1", "vhost": "v1", "exchange": "amq.topic", "write": "^{username}$", "read": "^r"}]
    assert api("GET", "/topic-permissions").json() == expected
    b = restart_broker(b, sig=sig)
    api = _caller(b)
    assert api("GET", "/topic-permissions").json() == expected
    assert sorted(api("GET", "/definitions").json()["topic_permissions"], key=lambda p: p["user"]) == expected
    # and enforced after the restart
    ch = pika.BlockingConnection(b.pika_params("u1", PASSWORD, "v1")).channel()
    ch.basic_publish("amq.topic", "u1", b"m")
    channel_error(lambda: (ch.basic_publish("amq.topic", "u2", b"m"), ch.queue_declare("", exclusive=True)), 403,
                  "ACCESS_REFUSED - write access to topic 'u2' in exchange 'amq.topic' in vhost 'v1' refused for user "
                  "'u1'")
    # recreating the user or the vhost does not bring old topic permissions back
    _user_and_vhost(api, "u2", "v2")
    assert api("GET", "/topic-permissions/v2/u2").status_code == 404
