"""Management HTTP API: /api/connections, /api/channels, /api/consumers (and their per-vhost
and per-connection forms), closing a connection with DELETE.

Expected shapes, codes and texts are RabbitMQ 3.10.8's, taken from a node with the
management plugin (the comparison node of the suite has none: Warren only)."""

import json
import time
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, password_hash, start_broker

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the comparison RabbitMQ node has no management plugin")

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}

DEFINITIONS = {
    "users": [{"name": "mon", "password_hash": password_hash("mon-secret"),
               "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "monitoring"},
              {"name": "worker", "password_hash": password_hash("worker-secret"),
               "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""}],
    "vhosts": [{"name": "/"}, {"name": "v-conn"}],
    "permissions": [{"user": "worker", "vhost": "v-conn", "configure": ".*", "write": ".*", "read": ".*"}],
}


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory):
    path = tmp_path_factory.mktemp("defs") / "definitions.json"
    path.write_text(json.dumps(DEFINITIONS))
    b = start_broker("--definitions", str(path))
    yield b
    b.stop()


def q(name: str) -> str:
    return quote(name, safe="")


def get(broker, path, auth=("guest", "guest")):
    return requests.get(broker.api + path, auth=auth, timeout=10)


def ok_json(response):
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()


def local_port(conn) -> int:
    """The client side port of a pika BlockingConnection."""
    return conn._impl._transport._sock.getsockname()[1]


def name_of(broker, conn) -> str:
    return f"127.0.0.1:{local_port(conn)} -> 127.0.0.1:{broker.port}"


@pytest.fixture
def open_conn(mgmt):
    conns = []

    def make(**kwargs):
        c = pika.BlockingConnection(mgmt.pika_params(**kwargs))
        conns.append(c)
        return c

    yield make
    for c in conns:
        if c.is_open:
            c.close()


# --------------------------------------------------------------- connections
def test_connection_fields(mgmt, open_conn, uid):
    before = time.time()
    conn = open_conn(heartbeat=30, client_properties={"connection_name": f"app-{uid}"})
    conn.channel()
    conn.channel()
    name = name_of(mgmt, conn)
    listed = ok_json(get(mgmt, "/connections"))
    mine = [c for c in listed if c["name"] == name]
    assert len(mine) == 1
    c = mine[0]
    expected = {
        "name": name, "vhost": "/", "user": "guest", "user_who_performed_action": "guest", "state": "running",
        "channels": 2, "peer_host": "127.0.0.1", "peer_port": local_port(conn), "host": "127.0.0.1",
        "port": mgmt.port, "protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN", "timeout": 30,
        "frame_max": 131072, "channel_max": 2047, "type": "network", "ssl": False, "node": "warren@localhost",
        "user_provided_name": f"app-{uid}", "last_blocked_by": "none", "last_blocked_age": "infinity",
        "send_pend": 0,
    }
    assert {k: c[k] for k in expected} == expected
    assert c["client_properties"]["connection_name"] == f"app-{uid}"
    assert c["client_properties"]["product"] == "Pika Python Client Library"
    assert c["client_properties"]["capabilities"]["publisher_confirms"] is True
    assert before * 1000 - 1000 <= c["connected_at"] <= time.time() * 1000 + 1000
    for field in ("recv_oct", "send_oct", "recv_cnt", "send_cnt"):
        assert isinstance(c[field], int) and c[field] > 0, field
    assert c["recv_oct_details"] == {"rate": 0.0} or c["recv_oct_details"]["rate"] >= 0
    # One connection by name: the same object.
    one = ok_json(get(mgmt, "/connections/" + q(name)))
    assert {k: one[k] for k in expected} == expected


def test_connection_without_provided_name(mgmt, open_conn):
    conn = open_conn()
    c = ok_json(get(mgmt, "/connections/" + q(name_of(mgmt, conn))))
    assert "user_provided_name" not in c  # as RabbitMQ: only when the client names it
    assert c["timeout"] == 60  # pika takes the server's heartbeat


def test_traffic_counters_grow(mgmt, open_conn, uid):
    conn = open_conn()
    ch = conn.channel()
    name = name_of(mgmt, conn)
    first = ok_json(get(mgmt, "/connections/" + q(name)))
    ch.queue_declare(f"oct-{uid}", auto_delete=True, exclusive=True)
    ch.basic_publish("", f"oct-{uid}", b"x" * 5000)
    ch.basic_get(f"oct-{uid}", auto_ack=True)
    second = ok_json(get(mgmt, "/connections/" + q(name)))
    assert second["recv_oct"] >= first["recv_oct"] + 5000
    assert second["send_oct"] >= first["send_oct"] + 5000
    assert second["recv_cnt"] > first["recv_cnt"] and second["send_cnt"] > first["send_cnt"]


def test_connection_not_found(mgmt):
    for path in ("/connections/" + q("127.0.0.1:1 -> 127.0.0.1:2"), "/connections/nope/channels"):
        r = get(mgmt, path)
        assert r.status_code == 404 and r.json() == NOT_FOUND
    r = requests.delete(mgmt.api + "/connections/nope", auth=("guest", "guest"), timeout=10)
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_vhost_connections(mgmt, open_conn):
    default = open_conn()
    other = open_conn(user="worker", password="worker-secret", vhost="v-conn")
    in_default = [c["name"] for c in ok_json(get(mgmt, "/vhosts/%2F/connections"))]
    in_other = ok_json(get(mgmt, "/vhosts/v-conn/connections"))
    assert name_of(mgmt, default) in in_default and name_of(mgmt, other) not in in_default
    assert [c["name"] for c in in_other] == [name_of(mgmt, other)]
    assert (in_other[0]["user"], in_other[0]["vhost"]) == ("worker", "v-conn")
    r = get(mgmt, "/vhosts/nope/connections")
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_connections_sorted_and_columns(mgmt, open_conn):
    a, b = open_conn(), open_conn()
    listed = ok_json(get(mgmt, "/connections?columns=name,vhost,client_properties.product"))
    names = [c["name"] for c in listed]
    assert names == sorted(names)
    assert name_of(mgmt, a) in names and name_of(mgmt, b) in names
    for c in listed:
        assert set(c) == {"name", "vhost", "client_properties"}
        assert c["client_properties"] == {"product": "Pika Python Client Library"}
    page = ok_json(get(mgmt, "/connections?page=1&page_size=1&columns=name"))
    assert page["page"] == 1 and page["page_size"] == 1 and page["item_count"] == 1
    assert page["total_count"] == page["filtered_count"] == len(listed) == page["page_count"]
    assert page["items"] == [{"name": names[0]}]


def test_delete_connection_with_reason(mgmt, open_conn):
    conn = open_conn()
    name = name_of(mgmt, conn)
    r = requests.delete(mgmt.api + "/connections/" + q(name), auth=("guest", "guest"),
                        headers={"X-Reason": "maintenance window"}, timeout=10)
    assert r.status_code == 204 and r.text == ""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel()
        conn.process_data_events(2)
    assert (info.value.reply_code, info.value.reply_text) == (320, "CONNECTION_FORCED - maintenance window")
    r = get(mgmt, "/connections/" + q(name))
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_delete_connection_default_reason(mgmt, open_conn, uid):
    conn = open_conn()
    ch = conn.channel()
    ch.queue_declare(f"del-{uid}", exclusive=True)
    r = requests.delete(mgmt.api + "/connections/" + q(name_of(mgmt, conn)), auth=("guest", "guest"), timeout=10)
    assert r.status_code == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(2)
        conn.channel()
    assert (info.value.reply_code, info.value.reply_text) == (320, "CONNECTION_FORCED - Closed via management plugin")
    # Its exclusive queue went with it.
    other = open_conn()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.channel().queue_declare(f"del-{uid}", passive=True)
    assert info.value.reply_code == 404


def test_monitoring_user_cannot_close_connections(mgmt, open_conn):
    conn = open_conn()
    name = name_of(mgmt, conn)
    assert name in [c["name"] for c in ok_json(get(mgmt, "/connections", auth=("mon", "mon-secret")))]
    r = requests.delete(mgmt.api + "/connections/" + q(name), auth=("mon", "mon-secret"), timeout=10)
    assert r.status_code == 401
    assert r.json()["error"] == "not_authorised"
    conn.process_data_events(0.2)
    assert conn.is_open
    conn.channel().close()


# ------------------------------------------------------------------ channels
def test_channels(mgmt, open_conn, uid):
    conn = open_conn()
    cname = name_of(mgmt, conn)
    ch1 = conn.channel()
    ch1.confirm_delivery()
    ch1.queue_declare(f"chq-{uid}", exclusive=True)
    for _ in range(3):
        ch1.basic_publish("", f"chq-{uid}", b"abc")
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=5, global_qos=True)
    ch2.tx_select()
    ch2.basic_publish("", f"chq-{uid}", b"uncommitted")
    ch3 = conn.channel()
    ch3.basic_qos(prefetch_count=2)
    got = []
    ch3.basic_consume(f"chq-{uid}", lambda c, m, p, b: got.append(m), consumer_tag=f"tag-{uid}")
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got) == 2

    listed = ok_json(get(mgmt, "/connections/" + q(cname) + "/channels"))
    assert [c["name"] for c in listed] == [f"{cname} (1)", f"{cname} (2)", f"{cname} (3)"]
    assert [c["number"] for c in listed] == [1, 2, 3]
    by_number = {c["number"]: c for c in listed}
    one, two, three = by_number[1], by_number[2], by_number[3]
    assert one["connection_details"] == {"name": cname, "peer_host": "127.0.0.1", "peer_port": local_port(conn)}
    assert (one["vhost"], one["user"], one["node"], one["state"]) == ("/", "guest", "warren@localhost", "running")
    assert (one["confirm"], one["transactional"], one["messages_unconfirmed"]) == (True, False, 0)
    assert one["message_stats"]["publish"] == 3 and one["message_stats"]["confirm"] == 3
    assert (two["transactional"], two["confirm"]) == (True, False)
    assert (two["prefetch_count"], two["global_prefetch_count"]) == (0, 5)
    assert two["messages_uncommitted"] == 1
    assert (three["prefetch_count"], three["global_prefetch_count"]) == (2, 0)
    assert (three["consumer_count"], three["messages_unacknowledged"]) == (1, 2)
    assert three["message_stats"]["deliver"] == 2 and three["message_stats"]["deliver_get"] == 2
    assert three["message_stats"]["publish"] == 0

    ch3.basic_ack(got[0].delivery_tag)
    ch3.basic_ack(got[1].delivery_tag)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    detail = ok_json(get(mgmt, "/channels/" + q(f"{cname} (3)")))
    assert detail["message_stats"]["ack"] == 2 and detail["message_stats"]["deliver"] == 3
    assert detail["messages_unacknowledged"] == 1
    assert [c["consumer_tag"] for c in detail["consumer_details"]] == [f"tag-{uid}"]
    assert detail["consumer_details"][0]["queue"] == {"name": f"chq-{uid}", "vhost": "/"}

    # In the lists of all channels and of the vhost's.
    assert f"{cname} (2)" in [c["name"] for c in ok_json(get(mgmt, "/channels"))]
    assert f"{cname} (2)" in [c["name"] for c in ok_json(get(mgmt, "/vhosts/%2F/channels"))]
    assert f"{cname} (2)" not in [c["name"] for c in ok_json(get(mgmt, "/vhosts/v-conn/channels"))]

    ch2.close()
    r = get(mgmt, "/channels/" + q(f"{cname} (2)"))
    assert r.status_code == 404 and r.json() == NOT_FOUND


def test_channel_not_found(mgmt):
    r = get(mgmt, "/channels/" + q("127.0.0.1:1 -> 127.0.0.1:2 (1)"))
    assert r.status_code == 404 and r.json() == NOT_FOUND


# ----------------------------------------------------------------- consumers
def test_consumers(mgmt, open_conn, uid):
    conn = open_conn()
    cname = name_of(mgmt, conn)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=4)
    ch.queue_declare(f"cons-{uid}", exclusive=True)
    ch.basic_consume(f"cons-{uid}", lambda *a: None, consumer_tag=f"acked-{uid}",
                     arguments={"x-priority": 3})
    ch2 = conn.channel()
    ch2.queue_declare(f"cons2-{uid}", exclusive=True)
    ch2.basic_consume(f"cons2-{uid}", lambda *a: None, auto_ack=True, exclusive=True,
                      consumer_tag=f"noack-{uid}")
    other = open_conn(user="worker", password="worker-secret", vhost="v-conn")
    och = other.channel()
    och.queue_declare(f"cons3-{uid}", exclusive=True)
    och.basic_consume(f"cons3-{uid}", lambda *a: None, consumer_tag=f"other-{uid}")

    everyone = {c["consumer_tag"]: c for c in ok_json(get(mgmt, "/consumers"))}
    assert {f"acked-{uid}", f"noack-{uid}", f"other-{uid}"} <= set(everyone)
    acked = everyone[f"acked-{uid}"]
    assert acked == {
        "consumer_tag": f"acked-{uid}",
        "queue": {"name": f"cons-{uid}", "vhost": "/"},
        "channel_details": {"connection_name": cname, "name": f"{cname} (1)", "node": "warren@localhost",
                            "number": 1, "peer_host": "127.0.0.1", "peer_port": local_port(conn),
                            "user": "guest"},
        "ack_required": True, "exclusive": False, "prefetch_count": 4, "arguments": {"x-priority": 3},
        "active": True, "activity_status": "up",
    }
    noack = everyone[f"noack-{uid}"]
    assert (noack["ack_required"], noack["exclusive"], noack["prefetch_count"]) == (False, True, 0)
    assert noack["channel_details"]["number"] == 2

    in_default = {c["consumer_tag"] for c in ok_json(get(mgmt, "/consumers/%2F"))}
    in_other = [c["consumer_tag"] for c in ok_json(get(mgmt, "/consumers/v-conn"))]
    assert {f"acked-{uid}", f"noack-{uid}"} <= in_default and f"other-{uid}" not in in_default
    assert in_other == [f"other-{uid}"]
    r = get(mgmt, "/consumers/nope")
    assert r.status_code == 404 and r.json() == NOT_FOUND

    ch.basic_cancel(f"acked-{uid}")
    assert f"acked-{uid}" not in {c["consumer_tag"] for c in ok_json(get(mgmt, "/consumers"))}
