"""Warren's capture of publishes to missing exchanges (issue 14, warren.broker.missing_exchange):
a vhost's `missing_exchange` setting names an exchange that takes publishes to exchanges that
do not exist there, instead of RabbitMQ's channel error 404. Real pika clients, the management
API and warrenctl over real sockets; Warren only (RabbitMQ 3.10 has no such setting: it ignores
the key in a PUT /api/vhosts and in an import, so Warren's exports still import there).

Each test works in a vhost of its own on the shared broker (never "/", which other tests use)."""

import json
import signal
import subprocess

import pika
import pytest
import requests
from pika.exceptions import UnroutableError

from conftest import EXTERNAL, channel_error, get_all
from warrenctl_path import WARRENCTL

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="a Warren extension")

HEADER = "x-warren-missing-exchange"
AUTH = ("guest", "guest")


def q(name: str) -> str:
    return requests.utils.quote(name, safe="")


def api(broker, method, path, body=None, auth=AUTH):
    return requests.request(method, broker.api + path, json=body, auth=auth, timeout=10)


def setting(broker, vhost):
    got = api(broker, "GET", f"/vhosts/{q(vhost)}")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body.get("missing_exchange") == body["metadata"].get("missing_exchange")
    return body.get("missing_exchange")


def put_setting(broker, vhost, value, auth=AUTH):
    return api(broker, "PUT", f"/vhosts/{q(vhost)}", {"missing_exchange": value}, auth)


@pytest.fixture
def vhost(broker, uid):
    """A fresh vhost (guest has full permissions there), deleted after the test."""
    name = f"capture-{uid}"
    assert api(broker, "PUT", f"/vhosts/{q(name)}", {}).status_code == 201
    yield name
    api(broker, "DELETE", f"/vhosts/{q(name)}")


def connect(broker, vhost, user="guest", password="guest"):
    return pika.BlockingConnection(broker.pika_params(user, password, vhost))


@pytest.fixture
def conn(broker, vhost):
    c = connect(broker, vhost)
    yield c
    if c.is_open:
        c.close()


def capture_setup(ch, exchange="capture", queue="captured", type_name="fanout", durable=False, internal=False):
    ch.exchange_declare(exchange, type_name, durable=durable, internal=internal)
    ch.queue_declare(queue, durable=durable)
    ch.queue_bind(queue, exchange, "#" if type_name == "topic" else "")


def publish_json(routing_key="k", payload="x", properties=None):
    return {"routing_key": routing_key, "properties": properties or {}, "payload": payload,
            "payload_encoding": "string"}


# ------------------------------------------------------------------ off by default
def test_unset_a_missing_exchange_is_rabbitmqs_404(broker, vhost, conn):
    assert setting(broker, vhost) is None
    exported = api(broker, "GET", "/definitions").json()
    assert [v for v in exported["vhosts"] if v["name"] == vhost] == [{"name": vhost}]  # RabbitMQ 3.10.8's shape
    ch = conn.channel()
    ch.confirm_delivery()
    channel_error(lambda: ch.basic_publish("nope", "k", b"x"), 404,
                  f"NOT_FOUND - no exchange 'nope' in vhost '{vhost}'")
    got = api(broker, "POST", f"/exchanges/{q(vhost)}/nope/publish", publish_json())
    assert (got.status_code, got.json()["reason"]) == (400, f"404 NOT_FOUND - no exchange 'nope' in vhost '{vhost}'")


# ------------------------------------------------------------------ capture over AMQP
def test_capture_confirmed_with_the_header_and_the_channel_stays_open(broker, vhost, conn):
    ch = conn.channel()
    capture_setup(ch)
    assert put_setting(broker, vhost, "capture").status_code == 204
    assert setting(broker, vhost) == "capture"
    ch.confirm_delivery()
    props = pika.BasicProperties(content_type="application/json", headers={"trace": "t1", "n": 7},
                                 message_id="m-1", correlation_id="c-1", priority=4, app_id="orders-svc")
    ch.basic_publish("orders", "order.created", b'{"id": 1}', props, mandatory=True)  # confirmed: no raise
    ch.basic_publish("invoices", "inv", b"plain")  # no headers of its own
    [(m1, p1, b1), (m2, p2, b2)] = get_all(ch, "captured")  # the same channel: still open
    assert (m1.exchange, m1.routing_key, b1) == ("capture", "order.created", b'{"id": 1}')
    assert p1.headers == {"trace": "t1", "n": 7, HEADER: "orders"}
    assert (p1.content_type, p1.message_id, p1.correlation_id, p1.priority, p1.app_id) == (
        "application/json", "m-1", "c-1", 4, "orders-svc")
    assert (m2.exchange, m2.routing_key, b2, p2.headers) == ("capture", "inv", b"plain", {HEADER: "invoices"})
    stats = api(broker, "GET", f"/exchanges/{q(vhost)}/capture").json()
    assert stats["message_stats"]["publish_in"] == 2


def test_unroutable_capture_returns_as_a_publish_to_the_capture_exchange(broker, vhost, conn):
    ch = conn.channel()
    ch.exchange_declare("capture", "direct")  # nothing bound
    assert put_setting(broker, vhost, "capture").status_code == 204
    returned = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append((method, props, body)))
    ch.confirm_delivery()
    with pytest.raises(UnroutableError):
        ch.basic_publish("nope", "k", b"lost?", mandatory=True)
    conn.process_data_events(0)
    [(method, props, body)] = returned
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key, body) == (
        312, "NO_ROUTE", "capture", "k", b"lost?")
    assert props.headers == {HEADER: "nope"}
    ch.basic_publish("nope", "k", b"dropped")  # not mandatory: dropped as any unroutable publish
    assert ch.is_open


def test_capture_exchange_missing_is_the_usual_404(broker, vhost, conn):
    assert put_setting(broker, vhost, "not-declared-yet").status_code == 204
    ch = conn.channel()
    channel_error(lambda: ch.basic_publish("nope", "k", b"x") or ch.queue_declare("", exclusive=True),
                  404, f"NOT_FOUND - no exchange 'nope' in vhost '{vhost}'")
    assert "capture exchange 'not-declared-yet' of vhost" in broker.log()
    ch = conn.channel()
    capture_setup(ch, "not-declared-yet")  # declared afterwards: captures from then on
    ch.confirm_delivery()
    ch.basic_publish("nope", "k", b"x")
    assert [p.headers for _, p, _ in get_all(ch, "captured")] == [{HEADER: "nope"}]


def test_default_and_amq_exchanges_are_never_missing(broker, vhost, conn):
    ch = conn.channel()
    capture_setup(ch)
    assert put_setting(broker, vhost, "capture").status_code == 204
    ch.confirm_delivery()
    ch.basic_publish("", "no-such-queue", b"x")  # a missing queue: dropped, as ever
    ch.basic_publish("amq.direct", "k", b"x")
    channel_error(lambda: ch.basic_publish("amq.nope", "k", b"x"), 404,
                  f"NOT_FOUND - no exchange 'amq.nope' in vhost '{vhost}'")
    assert get_all(conn.channel(), "captured") == []


def test_publisher_needs_write_on_the_name_it_used_and_nothing_on_the_capture(broker, vhost, uid):
    user = f"cap-writer-{uid}"
    assert api(broker, "PUT", f"/users/{user}", {"password": "pw", "tags": ""}).status_code == 201
    try:
        assert api(broker, "PUT", f"/permissions/{q(vhost)}/{user}",
                   {"configure": "", "write": "^app\\.", "read": ""}).status_code == 201
        with connect(broker, vhost) as admin:
            capture_setup(admin.channel(), internal=True)  # internal: nobody publishes to it directly
        assert put_setting(broker, vhost, "capture").status_code == 204
        c = connect(broker, vhost, user, "pw")
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("app.gone", "k", b"x")  # write on "app.gone": captured
        channel_error(lambda: ch.basic_publish("other", "k", b"x"), 403,
                      f"ACCESS_REFUSED - write access to exchange 'other' in vhost '{vhost}' refused for user '{user}'")
        ch = c.channel()
        ch.confirm_delivery()
        channel_error(lambda: ch.basic_publish("capture", "k", b"x"), 403,
                      f"ACCESS_REFUSED - write access to exchange 'capture' in vhost '{vhost}' "
                      f"refused for user '{user}'")
        c.close()
        with connect(broker, vhost) as admin:
            assert [p.headers for _, p, _ in get_all(admin.channel(), "captured")] == [{HEADER: "app.gone"}]
    finally:
        api(broker, "DELETE", f"/users/{user}")


def test_captured_in_a_transaction_at_commit(broker, vhost, conn):
    ch = conn.channel()
    capture_setup(ch)
    assert put_setting(broker, vhost, "capture").status_code == 204
    ch.tx_select()
    ch.basic_publish("nope", "k", b"in-tx")
    assert get_all(conn.channel(), "captured") == []
    ch.tx_commit()
    assert [b for _, _, b in get_all(ch, "captured")] == [b"in-tx"]


def test_clearing_the_setting_brings_the_404_back(broker, vhost, conn):
    ch = conn.channel()
    capture_setup(ch)
    assert put_setting(broker, vhost, "capture").status_code == 204
    ch.basic_publish("nope", "k", b"x")
    assert put_setting(broker, vhost, None).status_code == 204
    assert setting(broker, vhost) is None
    channel_error(lambda: ch.basic_publish("nope", "k", b"x") or ch.queue_declare("", exclusive=True), 404,
                  f"NOT_FOUND - no exchange 'nope' in vhost '{vhost}'")


# ------------------------------------------------------------------ HTTP publish
def test_http_publish_is_captured_too(broker, vhost, conn):
    ch = conn.channel()
    capture_setup(ch)
    assert put_setting(broker, vhost, "capture").status_code == 204
    got = api(broker, "POST", f"/exchanges/{q(vhost)}/nope/publish",
              publish_json("rk", "over-http", {"headers": {"h": "v"}}))
    assert (got.status_code, got.json()) == (200, {"routed": True})
    [(method, props, body)] = get_all(ch, "captured")
    assert (method.exchange, method.routing_key, body, props.headers) == (
        "capture", "rk", b"over-http", {"h": "v", HEADER: "nope"})
    ch.queue_unbind("captured", "capture", "")
    got = api(broker, "POST", f"/exchanges/{q(vhost)}/nope/publish", publish_json())
    assert (got.status_code, got.json()) == (200, {"routed": False})  # as a publish to the capture exchange


# ------------------------------------------------------------------ the setting over HTTP
@pytest.mark.parametrize("value, reason", [
    (5, "missing_exchange must be an exchange name (a string)"),
    (["capture"], "missing_exchange must be an exchange name (a string)"),
    ("x" * 256, "not a valid exchange name: longer than 255 bytes"),
    ("amq.capture", "missing_exchange 'amq.capture' is not a valid exchange name: the prefix 'amq.' is reserved"),
])
def test_invalid_values_are_refused_and_change_nothing(broker, vhost, uid, value, reason):
    assert put_setting(broker, vhost, "capture").status_code == 204
    got = put_setting(broker, vhost, value)
    assert got.status_code == 400 and got.json()["error"] == "bad_request" and reason in got.json()["reason"]
    assert setting(broker, vhost) == "capture"
    got = api(broker, "PUT", f"/vhosts/{q(vhost)}", {"metadata": {"missing_exchange": value}})
    assert got.status_code == 400 and reason in got.json()["reason"]
    new = f"capture-new-{uid}"  # a create with a bad value creates nothing
    assert put_setting(broker, new, value).status_code == 400
    assert api(broker, "GET", f"/vhosts/{q(new)}").status_code == 404


def test_set_in_metadata_at_creation_and_cleared_with_an_empty_name(broker, uid):
    name = f"capture-meta-{uid}"
    try:
        got = api(broker, "PUT", f"/vhosts/{q(name)}",
                  {"description": "d", "metadata": {"missing_exchange": "amq.fanout"}})
        assert got.status_code == 201
        assert setting(broker, name) == "amq.fanout"
        listed = [v for v in api(broker, "GET", "/vhosts").json() if v["name"] == name]
        assert listed[0]["missing_exchange"] == "amq.fanout" and listed[0]["description"] == "d"
        assert api(broker, "PUT", f"/vhosts/{q(name)}", {"description": "e"}).status_code == 204  # kept
        assert setting(broker, name) == "amq.fanout"
        assert put_setting(broker, name, "").status_code == 204
        assert setting(broker, name) is None
        assert "missing_exchange" not in api(broker, "GET", f"/vhosts/{q(name)}").json()
    finally:
        api(broker, "DELETE", f"/vhosts/{q(name)}")


def test_only_administrators_may_set_it(broker, vhost, uid):
    users = {tag: f"cap-{tag}-{uid}" for tag in ("management", "policymaker", "monitoring", "administrator")}
    try:
        for tag, user in users.items():
            assert api(broker, "PUT", f"/users/{user}", {"password": "pw", "tags": tag}).status_code == 201
            assert api(broker, "PUT", f"/permissions/{q(vhost)}/{user}",
                       {"configure": ".*", "write": ".*", "read": ".*"}).status_code == 201
        for tag in ("management", "policymaker", "monitoring"):
            got = put_setting(broker, vhost, "capture", auth=(users[tag], "pw"))
            assert (got.status_code, got.json()) == (
                401, {"error": "not_authorised", "reason": "Not administrator user"})
            got = api(broker, "GET", f"/vhosts/{q(vhost)}", auth=(users[tag], "pw"))
            assert (got.status_code, got.json()["reason"]) == (401, "Not administrator user")
            assert setting(broker, vhost) is None
        none = f"cap-none-{uid}"
        assert api(broker, "PUT", f"/users/{none}", {"password": "pw", "tags": ""}).status_code == 201
        users["none"] = none
        got = put_setting(broker, vhost, "capture", auth=(none, "pw"))
        assert (got.status_code, got.json()["reason"]) == (401, "Not management user")
        assert put_setting(broker, vhost, "capture", auth=(users["administrator"], "pw")).status_code == 204
        assert setting(broker, vhost) == "capture"
    finally:
        for user in users.values():
            api(broker, "DELETE", f"/users/{user}")


# ------------------------------------------------------------------ durability and definitions
def test_the_setting_and_captured_messages_survive_a_restart(make_broker, restart_broker):
    b = make_broker()
    assert api(b, "PUT", "/vhosts/kept", {"missing_exchange": "capture"}).status_code == 201
    with connect(b, "kept") as c:
        ch = c.channel()
        capture_setup(ch, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("gone", "k", b"persistent", pika.BasicProperties(delivery_mode=2))
    b = restart_broker(b, sig=signal.SIGKILL)  # the PUT's answer and the confirm came after the fsync
    assert setting(b, "kept") == "capture"
    with connect(b, "kept") as c:
        ch = c.channel()
        [(method, props, body)] = get_all(ch, "captured")
        assert (method.exchange, body, props.headers) == ("capture", b"persistent", {HEADER: "gone"})
        ch.basic_publish("gone-again", "k", b"after")  # still capturing
        assert [p.headers for _, p, _ in get_all(ch, "captured")] == [{HEADER: "gone-again"}]
    assert api(b, "PUT", "/vhosts/kept", {"missing_exchange": None}).status_code == 204
    b = restart_broker(b, sig=signal.SIGKILL)
    assert setting(b, "kept") is None


def test_definitions_round_trip(make_broker):
    a, b = make_broker(), make_broker()
    assert api(a, "PUT", "/vhosts/v1", {"missing_exchange": "capture"}).status_code == 201
    assert api(a, "PUT", "/vhosts/v2", {}).status_code == 201
    # The API's export (RabbitMQ's lists vhosts by name only) has it beside the name, only when
    # set; warrenctl's (rabbitmqctl's shape, with metadata) in the metadata.
    exported = api(a, "GET", "/definitions").json()
    assert [v for v in exported["vhosts"] if v["name"] in ("v1", "v2")] == [
        {"name": "v1", "missing_exchange": "capture"}, {"name": "v2"}]
    assert api(b, "POST", "/definitions", exported).status_code in (200, 201, 204)
    assert (setting(b, "v1"), setting(b, "v2")) == ("capture", None)
    r = ctl(a, "export_definitions", "-")
    meta = {v["name"]: v["metadata"] for v in json.loads(r.stdout)["vhosts"]}
    assert (meta["v1"], meta["v2"]) == ({"description": "", "missing_exchange": "capture", "tags": []},
                                        {"description": "", "tags": []})
    c = make_broker()
    assert api(c, "POST", "/definitions", json.loads(r.stdout)).status_code in (200, 201, 204)
    assert (setting(c, "v1"), setting(c, "v2")) == ("capture", None)
    # A definitions file without the key (RabbitMQ's) keeps the setting; a bad one is refused.
    assert api(b, "POST", "/definitions", {"vhosts": [{"name": "v1"}]}).status_code in (200, 201, 204)
    assert setting(b, "v1") == "capture"
    got = api(b, "POST", "/definitions", {"vhosts": [{"name": "v3", "metadata": {"missing_exchange": 1}}]})
    assert got.status_code == 400 and "missing_exchange must be an exchange name" in got.json()["reason"]
    assert api(b, "GET", "/vhosts/v3").status_code == 404


# ------------------------------------------------------------------ warrenctl
def ctl(broker, *args):
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    return subprocess.run([WARRENCTL, "--port", str(broker.mgmt_port), *args], capture_output=True, text=True,
                          timeout=60)


def test_warrenctl_sets_and_clears_it(broker, uid):
    name = f"capture-ctl-{uid}"
    try:
        r = ctl(broker, "add_vhost", name, "--missing-exchange", "capture")
        assert (r.returncode, r.stderr, r.stdout) == (0, "", f'Adding vhost "{name}" ...\n')
        assert setting(broker, name) == "capture"
        r = ctl(broker, "list_vhosts", "--formatter", "json", "name", "missing_exchange")
        assert {"name": name, "missing_exchange": "capture"} in json.loads(r.stdout)
        r = ctl(broker, "set_vhost_missing_exchange", "-p", name, "other")
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout == f'Setting the missing-exchange capture of vhost "{name}" to "other" ...\n'
        assert setting(broker, name) == "other"
        r = ctl(broker, "set_vhost_missing_exchange", "-p", name, "amq.nope")
        assert r.returncode == 65 and "the prefix 'amq.' is reserved" in r.stderr, r
        assert setting(broker, name) == "other"
        r = ctl(broker, "set_vhost_missing_exchange", "-p", name, "")
        assert r.returncode == 64 and "clear_vhost_missing_exchange" in r.stderr, r
        r = ctl(broker, "clear_vhost_missing_exchange", "-p", name)
        assert (r.returncode, r.stderr) == (0, ""), r
        assert setting(broker, name) is None
        r = ctl(broker, "set_vhost_missing_exchange", "-p", f"no-such-{uid}", "capture")
        assert (r.returncode, r.stderr.strip()) == (65, f"Virtual host 'no-such-{uid}' does not exist")
        assert api(broker, "GET", f"/vhosts/no-such-{uid}").status_code == 404  # not created
        bad = f"capture-ctl-bad-{uid}"
        r = ctl(broker, "add_vhost", bad, "--missing-exchange", "x" * 256)
        assert r.returncode == 65 and "longer than 255 bytes" in r.stderr, r
        assert api(broker, "GET", f"/vhosts/{bad}").status_code == 404
    finally:
        api(broker, "DELETE", f"/vhosts/{q(name)}")
