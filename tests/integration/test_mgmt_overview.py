"""Management HTTP API: /api/overview, /api/nodes, /api/whoami, health checks, the
aliveness test, message counters and rates, and who may use the API.

Expected shapes, codes and texts are RabbitMQ 3.10.8's, taken from a node with the
management plugin (the comparison node of the suite has none: Warren only)."""

import os
import time
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, password_hash, start_broker

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the comparison RabbitMQ node has no management plugin")

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
STATS_INTERVAL = 0.3  # WARREN_STATS_INTERVAL of the broker under test (RabbitMQ: 5 s)
RATE_COUNTERS = ("ack", "confirm", "deliver", "deliver_get", "deliver_no_ack", "drop_unroutable", "get",
                 "get_empty", "get_no_ack", "publish", "redeliver", "return_unroutable")


def _user(name, password, tags):
    return {"name": name, "password_hash": password_hash(password),
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": tags}


DEFINITIONS = {
    "users": [_user("mon", "mon-secret", "monitoring"), _user("plain", "plain-secret", ""),
              _user("admin2", "admin2-secret", "administrator")],
    "vhosts": [{"name": "/"}, {"name": "v-overview"}],
    "permissions": [
        {"user": "plain", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "guest", "vhost": "v-overview", "configure": ".*", "write": ".*", "read": ".*"},
        # admin2 may only touch its own queues: the aliveness test needs more.
        {"user": "admin2", "vhost": "/", "configure": "^own-", "write": ".*", "read": ".*"},
    ],
}


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory):
    """A broker of our own (exact counters), sampling its stats every STATS_INTERVAL s."""
    import json
    path = tmp_path_factory.mktemp("defs") / "definitions.json"
    path.write_text(json.dumps(DEFINITIONS))
    old = os.environ.get("WARREN_STATS_INTERVAL")
    os.environ["WARREN_STATS_INTERVAL"] = str(STATS_INTERVAL)
    try:
        b = start_broker("--definitions", str(path))
    finally:
        if old is None:
            del os.environ["WARREN_STATS_INTERVAL"]
        else:
            os.environ["WARREN_STATS_INTERVAL"] = old
    yield b
    b.stop()


def get(broker, path, auth=("guest", "guest"), **kw):
    return requests.get(broker.api + path, auth=auth, timeout=10, **kw)


def ok_json(response):
    assert response.status_code == 200, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/json")
    return response.json()


def overview(broker):
    return ok_json(get(broker, "/overview"))


def wait_for(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# ------------------------------------------------------------------ overview
def test_overview_shape(mgmt):
    data = overview(mgmt)
    assert data["management_version"] == "3.10.8"
    assert data["rabbitmq_version"] == "3.10.8"
    assert data["product_name"] == "Warren"
    import warren
    assert data["product_version"] == warren.__version__
    assert data["warren_version"] == warren.__version__
    assert data["node"] == "warren@localhost"
    assert data["cluster_name"] == "warren@localhost"
    assert data["rates_mode"] == "basic"
    assert data["disable_stats"] is False
    assert [t["name"] for t in data["exchange_types"]] == ["direct", "fanout", "headers", "topic",
                                                            "x-consistent-hash", "x-federation-upstream"]
    assert data["exchange_types"][0] == {"name": "direct", "enabled": True,
                                         "description": "AMQP direct exchange, as per the AMQP specification"}
    amqp = [listener for listener in data["listeners"] if listener["protocol"] == "amqp"]
    assert [(listener["node"], listener["ip_address"], listener["port"]) for listener in amqp] == [
        ("warren@localhost", "127.0.0.1", mgmt.port)]
    http = [listener for listener in data["listeners"] if listener["protocol"] == "http"]
    assert [listener["port"] for listener in http] == [mgmt.mgmt_port]
    assert data["contexts"] == [{"description": "RabbitMQ Management", "ip": "127.0.0.1",
                                 "node": "warren@localhost", "path": "/", "port": str(mgmt.mgmt_port),
                                 "ssl_opts": []}]
    assert set(data["object_totals"]) == {"connections", "channels", "exchanges", "queues", "consumers"}
    assert set(data["queue_totals"]) == {"messages", "messages_details", "messages_ready",
                                         "messages_ready_details", "messages_unacknowledged",
                                         "messages_unacknowledged_details"}
    stats = data["message_stats"]
    for counter in RATE_COUNTERS:
        assert isinstance(stats[counter], int), counter
        assert isinstance(stats[counter + "_details"]["rate"], float), counter


def test_object_totals(mgmt, uid):
    before = overview(mgmt)["object_totals"]
    # Two vhosts, each with RabbitMQ's 7 exchanges ("" and the amq.* ones).
    assert before["exchanges"] == 14
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        ch1, ch2 = conn.channel(), conn.channel()
        ch1.queue_declare(f"tot-{uid}-a", exclusive=True)
        ch1.queue_declare(f"tot-{uid}-b", exclusive=True)
        ch1.exchange_declare(f"tot-{uid}-x", "fanout", auto_delete=True)
        ch2.basic_consume(f"tot-{uid}-a", lambda *a: None)
        during = overview(mgmt)["object_totals"]
        assert during == {"connections": before["connections"] + 1, "channels": before["channels"] + 2,
                          "queues": before["queues"] + 2, "exchanges": before["exchanges"] + 1,
                          "consumers": before["consumers"] + 1}
        ch1.exchange_delete(f"tot-{uid}-x")
    finally:
        conn.close()
    assert overview(mgmt)["object_totals"] == before


def test_message_counters_and_queue_totals(mgmt, uid):
    """Every counter of the overview's message_stats, exactly; totals survive closed channels."""
    before = overview(mgmt)
    qname = f"cnt-{uid}"
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(qname)
        for i in range(5):
            ch.basic_publish("", qname, b"x" * 10)
        ch.basic_publish("amq.direct", "nowhere", b"dropped")                  # drop_unroutable
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.direct", "nowhere", b"returned", mandatory=True)  # return_unroutable
        method, _, _ = ch.basic_get(qname)                                      # get
        ch.basic_ack(method.delivery_tag)                                       # ack
        ch.basic_get(qname, auto_ack=True)                                      # get_no_ack
        method, _, _ = ch.basic_get(qname)                                      # get, then requeued
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = ch.basic_get(qname)                                      # get + redeliver
        assert method.redelivered
        ch.basic_reject(method.delivery_tag, requeue=False)
        mid = overview(mgmt)
        assert mid["queue_totals"]["messages"] == before["queue_totals"]["messages"] + 2
        assert mid["queue_totals"]["messages_ready"] == before["queue_totals"]["messages_ready"] + 2
        ch2 = conn.channel()
        ch2.basic_qos(prefetch_count=1)
        got = []
        ch2.basic_consume(qname, lambda c, m, p, b: got.append(m))              # deliver
        ch3 = conn.channel()
        ch3.basic_consume(qname, lambda c, m, p, b: got.append(m), auto_ack=True)  # deliver_no_ack
        wait_for(lambda: (conn.process_data_events(0.05), len(got) == 2)[1], what="two deliveries")
        ch.basic_get(qname)                                                     # get_empty
        mid = overview(mgmt)
        assert mid["queue_totals"]["messages_unacknowledged"] == before["queue_totals"]["messages_unacknowledged"] + 1
        ch.queue_delete(qname)
    finally:
        conn.close()
    after = overview(mgmt)
    delta = {k: after["message_stats"][k] - before["message_stats"][k] for k in RATE_COUNTERS}
    assert delta == {"publish": 7, "confirm": 7, "drop_unroutable": 1, "return_unroutable": 1,
                     "get": 3, "get_no_ack": 1, "get_empty": 1, "ack": 1, "redeliver": 1,
                     "deliver": 1, "deliver_no_ack": 1, "deliver_get": 6}
    assert after["queue_totals"]["messages"] == before["queue_totals"]["messages"]


def test_rates(mgmt, uid):
    """Rates are counter growth per second over the last sample (every STATS_INTERVAL s here)."""
    qname = f"rate-{uid}"
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(qname, auto_delete=True)
        ch.basic_consume(qname, lambda *a: None, auto_ack=True)
        name = None
        deadline = time.monotonic() + 10
        while True:
            for _ in range(200):
                ch.basic_publish("", qname, b"rate")
            conn.process_data_events(0)
            data = overview(mgmt)
            stats = data["message_stats"]
            if stats["publish_details"]["rate"] > 0 and stats["deliver_no_ack_details"]["rate"] > 0:
                break
            assert time.monotonic() < deadline, stats
        assert stats["deliver_get_details"]["rate"] > 0
        channels = ok_json(get(mgmt, "/channels"))
        mine = [c for c in channels if c["consumer_count"] == 1 and c["message_stats"]["publish"] > 0]
        assert len(mine) == 1
        name = mine[0]["name"]
        for _ in range(20):
            for _ in range(200):
                ch.basic_publish("", qname, b"rate")
            conn.process_data_events(0)
            info = ok_json(get(mgmt, "/channels/" + quote(name, safe="")))
            conn_info = ok_json(get(mgmt, "/connections/" + quote(info["connection_details"]["name"], safe="")))
            if info["message_stats"]["publish_details"]["rate"] > 0 and conn_info["recv_oct_details"]["rate"] > 0:
                break
            time.sleep(STATS_INTERVAL / 2)
        else:
            raise AssertionError(f"no channel/connection rates: {info}, {conn_info}")
        assert conn_info["send_oct_details"]["rate"] > 0
        # The queue's and the exchange's rates (their JSON takes them from the same sampler).
        for _ in range(20):
            for _ in range(200):
                ch.basic_publish("", qname, b"rate")
            conn.process_data_events(0)
            queue = ok_json(get(mgmt, "/queues/%2F/" + qname))["message_stats"]
            exchange = ok_json(get(mgmt, "/exchanges/%2F/amq.default"))["message_stats"]
            if (queue["publish_details"]["rate"] > 0 and queue["deliver_no_ack_details"]["rate"] > 0
                    and exchange["publish_in_details"]["rate"] > 0 and exchange["publish_out_details"]["rate"] > 0):
                break
            time.sleep(STATS_INTERVAL / 2)
        else:
            raise AssertionError(f"no queue/exchange rates: {queue}, {exchange}")
        assert queue["deliver_get_details"]["rate"] > 0
        # Stop publishing: after a couple of samples the rates are back to 0.
        conn.process_data_events(0.1)
        wait_for(lambda: overview(mgmt)["message_stats"]["publish_details"]["rate"] == 0.0,
                 timeout=10 * STATS_INTERVAL + 2, what="the publish rate to drop to 0")
    finally:
        conn.close()


def test_a_new_queue_counts_from_zero(mgmt, uid):
    """What a queue did before its first stats sample shows in its first rates: it counted
    from zero when it was made (the web UI's chart of a queue published to at once)."""
    qname = f"fresh-{uid}"
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(qname, auto_delete=True)
        for _ in range(10):
            ch.basic_publish("", qname, b"first")
        seen = []

        def published():
            seen.append(ok_json(get(mgmt, "/queues/%2F/" + qname))["message_stats"]["publish_details"]["rate"])
            return seen[-1] > 0
        wait_for(published, timeout=10 * STATS_INTERVAL, what=f"a publish rate (rates seen: {seen})")
    finally:
        conn.close()


def test_overview_columns(mgmt):
    data = ok_json(get(mgmt, "/overview?columns=node,object_totals.queues,message_stats.publish_details"))
    assert set(data) == {"node", "object_totals", "message_stats"}
    assert data["node"] == "warren@localhost"
    assert set(data["object_totals"]) == {"queues"}
    assert set(data["message_stats"]) == {"publish_details"}
    assert set(data["message_stats"]["publish_details"]) == {"rate"}


# --------------------------------------------------------------------- nodes
def test_nodes(mgmt):
    nodes = ok_json(get(mgmt, "/nodes"))
    assert len(nodes) == 1
    node = nodes[0]
    assert node["name"] == "warren@localhost"
    assert node["running"] is True
    assert node["type"] == "disc"
    assert node["mem_alarm"] is False and node["disk_free_alarm"] is False
    assert node["disk_free_limit"] == 50_000_000  # RabbitMQ's default
    assert node["mem_calculation_strategy"] == "rss"
    for field in ("mem_used", "mem_limit", "disk_free", "fd_used", "fd_total", "sockets_used", "uptime",
                  "processors"):
        assert isinstance(node[field], int) and node[field] > 0 or field == "sockets_used", (field, node[field])
    assert node["mem_used"] < node["mem_limit"]
    assert node["os_pid"] == str(mgmt.proc.pid)
    assert node["partitions"] == []
    assert {m["name"] for m in node["auth_mechanisms"]} == {"PLAIN", "AMQPLAIN"}
    one = ok_json(get(mgmt, "/nodes/warren@localhost"))
    assert one["name"] == "warren@localhost"
    assert one["uptime"] >= node["uptime"]
    r = get(mgmt, "/nodes/rabbit@elsewhere")
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_node_sockets_used_counts_connections(mgmt):
    before = ok_json(get(mgmt, "/nodes"))[0]["sockets_used"]
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        assert ok_json(get(mgmt, "/nodes"))[0]["sockets_used"] == before + 1
    finally:
        conn.close()


# ------------------------------------------------------------ whoami and auth
def test_whoami(mgmt):
    assert ok_json(get(mgmt, "/whoami")) == {"name": "guest", "tags": ["administrator"]}
    assert ok_json(get(mgmt, "/whoami", auth=("mon", "mon-secret"))) == {"name": "mon", "tags": ["monitoring"]}


def test_cluster_name(mgmt):
    assert ok_json(get(mgmt, "/cluster-name")) == {"name": "warren@localhost"}


@pytest.mark.parametrize("path", ["/overview", "/nodes", "/whoami", "/connections", "/channels", "/consumers",
                                  "/healthchecks/node", "/health/checks/alarms", "/aliveness-test/%2F"])
def test_no_credentials(mgmt, path):
    r = requests.get(mgmt.api + path, timeout=10)
    assert r.status_code == 401
    assert r.text == ""  # RabbitMQ answers without a body
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


@pytest.mark.parametrize("auth", [("guest", "wrong"), ("nobody", "guest"), ("mon", "")])
def test_wrong_credentials(mgmt, auth):
    r = get(mgmt, "/overview", auth=auth)
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorized", "reason": "Login failed"}  # sic: RabbitMQ's spelling
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


@pytest.mark.parametrize("path", ["/overview", "/nodes", "/whoami", "/connections", "/healthchecks/node"])
def test_user_without_management_tags(mgmt, path):
    r = get(mgmt, path, auth=("plain", "plain-secret"))
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorised", "reason": "Not management user"}


@pytest.mark.parametrize("path", ["/overview", "/nodes", "/nodes/warren@localhost", "/connections", "/channels",
                                  "/consumers", "/healthchecks/node", "/health/checks/alarms"])
def test_monitoring_user_may_read(mgmt, path):
    ok_json(get(mgmt, path, auth=("mon", "mon-secret")))


# ------------------------------------------------------------- health checks
@pytest.mark.parametrize("path", ["/healthchecks/node", "/healthchecks/node/warren@localhost",
                                  "/health/checks/alarms", "/healthchecks/alarms", "/health/checks/local-alarms",
                                  "/health/checks/virtual-hosts", "/health/checks/certificate-expiration/1/days"])
def test_health_ok(mgmt, path):
    assert ok_json(get(mgmt, path)) == {"status": "ok"}


def test_health_single_node_checks(mgmt):
    for path in ("/health/checks/node-is-quorum-critical", "/health/checks/node-is-mirror-sync-critical"):
        assert ok_json(get(mgmt, path)) == {"status": "ok", "reason": "single node cluster"}


def test_health_unknown_node(mgmt):
    r = get(mgmt, "/healthchecks/node/rabbit@elsewhere")
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_health_listeners(mgmt):
    assert ok_json(get(mgmt, f"/health/checks/port-listener/{mgmt.port}")) == {"status": "ok", "port": mgmt.port}
    assert ok_json(get(mgmt, "/health/checks/protocol-listener/amqp")) == {"status": "ok", "protocol": "amqp"}
    r = get(mgmt, "/health/checks/port-listener/1")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "failed" and body["reason"] == "No active listener" and body["missing"] == 1
    assert mgmt.port in body["ports"]
    r = get(mgmt, "/health/checks/protocol-listener/mqtt")
    assert r.status_code == 503
    body = r.json()
    assert (body["status"], body["reason"], body["missing"]) == ("failed", "No active listener", "mqtt")
    assert "amqp" in body["protocols"]
    r = get(mgmt, "/health/checks/port-listener/abc")
    assert r.status_code == 400 and r.json() == {"error": "bad_request", "reason": "Invalid port"}
    r = get(mgmt, "/health/checks/certificate-expiration/1/fortnights")
    assert r.status_code == 400 and r.json() == {
        "error": "bad_request", "reason": "Time unit not recognised. Supported units: days, weeks, months, years."}


def test_aliveness_test(mgmt):
    assert ok_json(get(mgmt, "/aliveness-test/%2F")) == {"status": "ok"}
    assert ok_json(get(mgmt, "/aliveness-test/%2F")) == {"status": "ok"}  # again: the queue exists now
    assert ok_json(get(mgmt, "/aliveness-test/v-overview")) == {"status": "ok"}
    # It leaves the aliveness-test queue behind, empty, as RabbitMQ does.
    conn = pika.BlockingConnection(mgmt.pika_params())
    try:
        ok = conn.channel().queue_declare("aliveness-test", passive=True)
        assert ok.method.message_count == 0 and ok.method.consumer_count == 0
    finally:
        conn.close()


def test_aliveness_test_errors(mgmt):
    r = get(mgmt, "/aliveness-test/no-such-vhost")
    assert r.status_code == 404 and r.json() == NOT_FOUND
    # A monitoring user without permissions on the vhost, as RabbitMQ says it.
    r = get(mgmt, "/aliveness-test/%2F", auth=("mon", "mon-secret"))
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
    # An administrator whose permissions do not cover the aliveness-test queue: refused, as
    # RabbitMQ 3.10.8 answers (401 with its channel's error; it leaves out "configure").
    r = get(mgmt, "/aliveness-test/%2F", auth=("admin2", "admin2-secret"))
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorised", "reason": "ACCESS_REFUSED - configure access to queue "
                        "'aliveness-test' in vhost '/' refused for user 'admin2'"}
