"""Dynamic shovels within the broker (RabbitMQ's shovel plugin, component "shovel"): the
management UI's "Move messages" (a shovel with src-delete-after queue-length that deletes
itself), shovels that keep moving, their status (/api/shovels), validation, who may do
what, and (Warren only) kill -9 and restarts mid-move.

Against RabbitMQ 3.10 with the shovel plugins:

    python tools/rabbitmq_node.py run --plugins \\
        rabbitmq_management,rabbitmq_shovel,rabbitmq_shovel_management -- \\
        python -m pytest -q tests/integration/test_shovel_move.py

Without a management API, or without the shovel plugin, the module is skipped there.
"""

from functools import partial
import os
import re
import signal
import subprocess
import time
import uuid

import pika
import pytest

from conftest import EXTERNAL

from .http_api import HttpApi, q, wait_for

MGMT = os.environ.get("WARREN_TEST_MGMT")
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT, reason="the comparison RabbitMQ node has no management plugin")

PASSWORD = "shovel-pw"


class Api(HttpApi):
    def __init__(self, base: str):
        super().__init__(base)
        self.vhosts: list[str] = []
        self.users: list[str] = []

    def vhost(self) -> str:
        name = f"shv-{uuid.uuid4().hex[:8]}"
        self.vhosts.append(name)
        self.ok("PUT", f"/vhosts/{q(name)}", {})
        self.ok("PUT", f"/permissions/{q(name)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        return name

    def user(self, tags: str, vhost: str | None) -> str:
        name = f"shv-{tags or 'none'}-{uuid.uuid4().hex[:6]}"
        self.users.append(name)
        self.ok("PUT", f"/users/{name}", {"password": PASSWORD, "tags": tags})
        if vhost is not None:
            self.ok("PUT", f"/permissions/{q(vhost)}/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
        return name

    def shovels(self, vhost: str, auth=("guest", "guest")) -> list:
        return self.ok("GET", f"/shovels/{q(vhost)}", auth=auth).json()

    def clean(self):
        for name in self.vhosts:
            r = self.call("GET", f"/parameters/shovel/{q(name)}")
            for p in r.json() if r.status_code == 200 else []:
                self.call("DELETE", f"/parameters/shovel/{q(name)}/{q(p['name'])}")
            self.call("DELETE", f"/vhosts/{q(name)}")
        for name in self.users:
            self.call("DELETE", f"/users/{name}")


wait = partial(wait_for, timeout=30.0)


@pytest.fixture
def api(broker):
    a = Api(MGMT if EXTERNAL else broker.api)
    if a.call("GET", "/shovels").status_code == 404:
        pytest.skip("the broker has no shovel plugin")
    yield a
    a.clean()


def move_value(vhost: str, src: str, dest: str, **extra) -> dict:
    """What the management UI's "Move messages" form PUTs (RabbitMQ 3.10.8's queue.ejs)."""
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": src, "src-protocol": "amqp091",
             "src-prefetch-count": 1000, "src-delete-after": "queue-length", "dest-protocol": "amqp091",
             "dest-uri": f"amqp:///{q(vhost)}", "dest-add-forward-headers": False, "ack-mode": "on-confirm",
             "dest-queue": dest, "src-consumer-args": {}}
    value.update(extra)
    return value


def put_shovel(api, vhost, name, value, auth=("guest", "guest")):
    return api.call("PUT", f"/parameters/shovel/{q(vhost)}/{q(name)}",
                    {"component": "shovel", "vhost": vhost, "name": name, "value": value}, auth)


def connect(broker, vhost):
    return pika.BlockingConnection(broker.pika_params(vhost=vhost, heartbeat=0))


def publish(ch, queue, bodies, persistent=True, headers=None):
    """Publish in one transaction (on disk when the commit returns, on both brokers)."""
    ch.tx_select()
    props = pika.BasicProperties(delivery_mode=2 if persistent else 1, headers=headers)
    for body in bodies:
        ch.basic_publish("", queue, body, props)
    ch.tx_commit()


def drain(ch, queue) -> list:
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, props))


def declare(ch, *queues, **kwargs):
    for name in queues:
        ch.queue_declare(name, durable=True, **kwargs)


def ready(ch, queue) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def gone(api, vhost, name) -> bool:
    return api.call("GET", f"/parameters/shovel/{q(vhost)}/{q(name)}").status_code == 404


# ------------------------------------------------------------------ moving
def test_move_messages_with_queue_length(api, broker):
    """The UI's move: 1,000 persistent messages from q1 to q2, in order, with their
    properties; q1 is empty and the shovel has deleted its parameter."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    bodies = [b"m%04d" % i for i in range(1000)]
    publish(ch, "q1", bodies, headers={"k": "v"})
    name = "Move from q1"
    assert put_shovel(api, vhost, name, move_value(vhost, "q1", "q2")).status_code == 201
    wait(lambda: gone(api, vhost, name), what="the shovel to delete itself")
    assert ready(ch, "q1") == 0
    moved = drain(ch, "q2")
    assert [b for b, _ in moved] == bodies
    assert all(p.delivery_mode == 2 and p.headers == {"k": "v"} for _, p in moved)
    assert api.shovels(vhost) == []
    assert api.ok("GET", f"/parameters/shovel/{q(vhost)}").json() == []
    conn.close()


def test_messages_published_during_the_move_stay(api, broker):
    """queue-length: the shovel moves as many messages as the queue held when it started;
    those published after that stay in the source queue."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    first = [b"old%04d" % i for i in range(1000)]
    publish(ch, "q1", first)
    name = "Move from q1"
    # One message in flight at a time: the move takes long enough to publish into it.
    assert put_shovel(api, vhost, name, move_value(vhost, "q1", "q2", **{"src-prefetch-count": 1})).status_code == 201
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="the shovel to run")
    late = [b"new%04d" % i for i in range(100)]
    publish(ch, "q1", late)
    moved_when_published = ready(ch, "q2")
    wait(lambda: gone(api, vhost, name), what="the shovel to delete itself")
    assert moved_when_published < len(first)  # (the late ones did arrive during the move)
    assert [b for b, _ in drain(ch, "q2")] == first
    assert [b for b, _ in drain(ch, "q1")] == late
    conn.close()


@pytest.mark.skipif(bool(EXTERNAL), reason="RabbitMQ 3.10.8's passive declare of a stream answers 0 messages (as "
                    "its shovel asks for queue-length), so its move of a stream deletes itself at once")
def test_move_from_a_stream(api, broker):
    """The UI's move from a stream queue adds src-consumer-args {"x-stream-offset": "first"}:
    the stream's messages are copied (a stream keeps them) and the shovel deletes itself."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    ch.queue_declare("s1", durable=True, arguments={"x-queue-type": "stream"})
    declare(ch, "q2")
    bodies = [b"s%02d" % i for i in range(20)]
    publish(ch, "s1", bodies)
    value = move_value(vhost, "s1", "q2", **{"src-consumer-args": {"x-stream-offset": "first"}})
    assert put_shovel(api, vhost, "Move from s1", value).status_code == 201
    wait(lambda: gone(api, vhost, "Move from s1"), what="the shovel to delete itself")
    assert [b for b, _ in drain(ch, "q2")] == bodies
    conn.close()


def test_an_empty_queue_deletes_the_shovel_at_once(api, broker):
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    assert put_shovel(api, vhost, "m", move_value(vhost, "q1", "q2")).status_code == 201
    wait(lambda: gone(api, vhost, "m"), what="the shovel to delete itself")
    conn.close()


def test_a_number_of_messages(api, broker):
    """src-delete-after N: N messages move (those there at the start or published later),
    then the shovel deletes itself."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    publish(ch, "q1", [b"a", b"b"])
    assert put_shovel(api, vhost, "n", move_value(vhost, "q1", "q2", **{"src-delete-after": 5})).status_code == 201
    wait(lambda: ready(ch, "q2") == 2, what="two messages moved")
    assert not gone(api, vhost, "n")
    publish(ch, "q1", [b"c", b"d", b"e", b"f", b"g"])
    wait(lambda: gone(api, vhost, "n"), what="the shovel to delete itself")
    assert [b for b, _ in drain(ch, "q2")] == [b"a", b"b", b"c", b"d", b"e"]
    assert [b for b, _ in drain(ch, "q1")] == [b"f", b"g"]
    conn.close()


def test_a_full_destination_refuses(api, broker):
    """The destination's length limit (reject-publish) nacks what does not fit: the shovel
    gives those back to the source; as in RabbitMQ, they count as handled for queue-length."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1")
    ch.queue_declare("q2", durable=True, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    publish(ch, "q1", [b"1", b"2", b"3", b"4", b"5"])
    assert put_shovel(api, vhost, "full", move_value(vhost, "q1", "q2")).status_code == 201
    wait(lambda: gone(api, vhost, "full"), what="the shovel to delete itself")
    assert [b for b, _ in drain(ch, "q2")] == [b"1", b"2", b"3"]
    assert [b for b, _ in drain(ch, "q1")] == [b"4", b"5"]
    conn.close()


def _status(s: dict) -> dict:
    assert isinstance(s.pop("node"), str)
    # RabbitMQ's format_ts: "~w-~2.2.0w-~2.2.0w ~w:~2.2.0w:~2.2.0w", the hour unpadded
    stamp = s.pop("timestamp")
    m = re.fullmatch(r"\d{4}-\d\d-\d\d (\d{1,2}):\d\d:\d\d", stamp)
    assert m and not (len(m.group(1)) == 2 and m.group(1).startswith("0")), stamp
    return s


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_never_keeps_moving_until_deleted(api, broker, ack_mode):
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "src", "dst")
    value = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst",
             "ack-mode": ack_mode}
    value["src-uri"] = value["dest-uri"] = f"amqp:///{q(vhost)}"
    assert put_shovel(api, vhost, "keep", value).status_code == 201
    assert put_shovel(api, vhost, "keep", value).status_code == 204  # the same again: no change
    for n in range(3):
        publish(ch, "src", [b"x%d-%d" % (n, i) for i in range(10)], persistent=n % 2 == 0)
        wait(lambda: ready(ch, "dst") == 10 * (n + 1), what=f"round {n} moved")
    [status] = wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    assert _status(status) == {
        "name": "keep", "vhost": vhost, "type": "dynamic", "state": "running", "src_uri": f"amqp:///{q(vhost)}",
        "src_protocol": "amqp091", "dest_protocol": "amqp091", "dest_uri": f"amqp:///{q(vhost)}",
        "src_queue": "src", "dest_queue": "dst"}
    assert [_status(s) for s in api.ok("GET", "/shovels").json() if s["vhost"] == vhost] == [status]
    # The shovel is the source queue's consumer (RabbitMQ: of its direct connection, user "none").
    def listed(items):  # (RabbitMQ: once its channel's statistics are in)
        return [c for c in items or [] if isinstance(c.get("channel_details"), dict) and c["channel_details"]]
    [consumer] = wait(lambda: listed(api.ok("GET", f"/queues/{q(vhost)}/src").json().get("consumer_details")),
                      what="the consumer listed")
    assert (consumer["ack_required"], consumer["prefetch_count"], consumer["channel_details"]["user"]) == (
        ack_mode != "no-ack", 0 if ack_mode == "no-ack" else 1000, "none")
    [entry] = wait(lambda: listed(api.ok("GET", f"/consumers/{q(vhost)}").json()), what="/api/consumers")
    assert (entry["queue"], entry["channel_details"]["user"]) == ({"name": "src", "vhost": vhost}, "none")
    assert api.ok("GET", f"/parameters/shovel/{q(vhost)}/keep").json() == {
        "value": value, "vhost": vhost, "component": "shovel", "name": "keep"}
    assert api.call("DELETE", f"/parameters/shovel/{q(vhost)}/keep").status_code == 204
    wait(lambda: api.shovels(vhost) == [], what="the status to go")
    publish(ch, "src", [b"after"])
    time.sleep(0.5)
    assert ready(ch, "src") == 1 and ready(ch, "dst") == 30
    conn.close()


def test_exchanges_and_forward_headers(api, broker):
    """src-exchange + key (a queue of the shovel's own, bound to it), dest-exchange + key,
    and the x-shovelled and x-shovelled-timestamp headers."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    conn = connect(broker, vhost)
    ch = conn.channel()
    ch.exchange_declare("in", "direct", durable=True)
    ch.exchange_declare("out", "direct", durable=True)
    declare(ch, "target")
    ch.queue_bind("target", "out", "to-target")
    value = {"src-uri": uri, "src-exchange": "in", "src-exchange-key": "k", "dest-uri": uri,
             "dest-exchange": "out", "dest-exchange-key": "to-target", "dest-add-forward-headers": True,
             "dest-add-timestamp-header": True}
    assert put_shovel(api, vhost, "x", value).status_code == 201
    [status] = wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    assert _status(status) == {
        "name": "x", "vhost": vhost, "type": "dynamic", "state": "running", "src_uri": uri,
        "src_protocol": "amqp091", "dest_protocol": "amqp091", "dest_uri": uri, "src_exchange": "in",
        "src_exchange_key": "k", "dest_exchange": "out", "dest_exchange_key": "to-target"}
    # The queue the shovel bound to "in" is its own, exclusive one.
    [own] = [x for x in api.ok("GET", f"/queues/{q(vhost)}").json() if x["name"] != "target"]
    assert (own["exclusive"], own["durable"]) == (True, False)
    before = int(time.time())
    ch.basic_publish("in", "k", b"routed", pika.BasicProperties(headers={"h": 1}))
    ch.basic_publish("in", "other", b"not bound")
    wait(lambda: ready(ch, "target") == 1, what="the message moved")
    [(body, props)] = drain(ch, "target")
    assert body == b"routed"
    headers = props.headers
    assert headers["h"] == 1
    assert before <= headers["x-shovelled-timestamp"] <= time.time() + 1
    [info] = headers["x-shovelled"]
    assert isinstance(info.pop("shovelled-by"), str)  # the cluster's name (pika decodes longstrs)
    assert info == {"shovel-type": "dynamic", "shovel-name": "x", "shovel-vhost": vhost, "src-uri": uri,
                    "dest-uri": uri, "src-exchange": "in", "src-exchange-key": "k", "dest-exchange": "out",
                    "dest-exchange-key": "to-target"}
    conn.close()


def test_chained_shovels_and_publish_properties(api, broker):
    """Two shovels in a row, both adding forward headers: the newest x-shovelled table first;
    the second sets properties (dest-publish-properties)."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "a", "b", "c")
    first = {"src-uri": uri, "src-queue": "a", "dest-uri": uri, "dest-queue": "b", "dest-add-forward-headers": True}
    second = {"src-uri": uri, "src-queue": "b", "dest-uri": uri, "dest-queue": "c", "dest-add-forward-headers": True,
              "dest-publish-properties": {"app_id": "mover", "priority": 3, "delivery_mode": 2,
                                          "content_type": "text/plain"}}
    assert put_shovel(api, vhost, "one", first).status_code == 201
    assert put_shovel(api, vhost, "two", second).status_code == 201
    wait(lambda: len([s for s in api.shovels(vhost) if s["state"] == "running"]) == 2, what="both running")
    ch.basic_publish("", "a", b"hop", pika.BasicProperties(app_id="origin", delivery_mode=1))
    wait(lambda: ready(ch, "c") == 1, what="two hops")
    [(body, props)] = drain(ch, "c")
    assert (body, props.app_id, props.priority, props.delivery_mode, props.content_type) == (
        b"hop", "mover", 3, 2, "text/plain")
    assert [(t["shovel-name"], t["src-queue"], t["dest-queue"]) for t in props.headers["x-shovelled"]] == [
        ("two", "b", "c"), ("one", "a", "b")]
    conn.close()


def test_a_missing_source_exchange(api, broker):
    """The binding to a missing src-exchange fails: the shovel is terminated ("needed a
    restart", RabbitMQ's reason for a channel the broker closed) and tries again after
    reconnect-delay; once the exchange exists it runs."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    value = {"src-uri": uri, "src-exchange": "later", "dest-uri": uri, "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "x", value).status_code == 201
    [status] = wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "terminated"], what="terminated")
    assert status["reason"] == '"needed a restart"'
    conn = connect(broker, vhost)
    ch = conn.channel()
    ch.exchange_declare("later", "fanout", durable=True)
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    ch.basic_publish("later", "", b"now")
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    # Only the running shovel's own queue is left of its tries.
    wait(lambda: len([x for x in api.ok("GET", f"/queues/{q(vhost)}").json() if x["name"] != "dst"]) == 1,
         what="one queue of the shovel's")
    conn.close()


@pytest.mark.skipif(bool(EXTERNAL), reason="RabbitMQ 3.10.8's shovel does not handle its destination channel's "
                    "closure (404): it stays running, the message unacked, until the next message crashes it")
def test_a_missing_destination_exchange(api, broker):
    """Publishing to a missing dest-exchange fails (404): the shovel ends ("needed a
    restart"), the message goes back to the source, and after reconnect-delay it tries again;
    once the exchange exists the message moves. A header x-shovelled that is no array is kept
    under x-invalid-headers."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "src", "dst")
    ch.basic_publish("", "src", b"waits", pika.BasicProperties(headers={"x-shovelled": "not an array"}))
    value = {"src-uri": uri, "src-queue": "src", "dest-uri": uri, "dest-exchange": "later",
             "dest-add-forward-headers": True, "reconnect-delay": 1}
    assert put_shovel(api, vhost, "x", value).status_code == 201
    [status] = wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "terminated"], what="terminated")
    assert status["reason"] == '"needed a restart"'
    ch.exchange_declare("later", "fanout", durable=True)
    ch.queue_bind("dst", "later")
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    [(body, props)] = drain(ch, "dst")
    assert body == b"waits"
    assert [t["shovel-name"] for t in props.headers["x-shovelled"]] == ["x"]
    assert props.headers["x-invalid-headers"] == {"x-shovelled": ["not an array"]}
    assert ready(ch, "src") == 0
    conn.close()


def test_missing_queues_are_declared(api, broker):
    """As rabbit_shovel_parameters:ensure_queue: a missing source or destination queue is
    declared durable, with src-queue-args / dest-queue-args."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    value = {"src-uri": uri, "src-queue": "made-src", "dest-uri": uri, "dest-queue": "made-dst",
             "dest-queue-args": {"x-max-length": 7}}
    assert put_shovel(api, vhost, "decl", value).status_code == 201
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    made = api.ok("GET", f"/queues/{q(vhost)}/made-dst").json()
    assert (made["durable"], made["arguments"]) == (True, {"x-max-length": 7})
    assert api.ok("GET", f"/queues/{q(vhost)}/made-src").json()["durable"] is True


def test_a_deleted_source_queue_is_declared_again(api, broker):
    """The source queue deleted under a shovel that never deletes itself: the shovel stops
    and, after reconnect-delay, starts again, declaring the queue again."""
    vhost = api.vhost()
    uri = f"amqp:///{q(vhost)}"
    value = {"src-uri": uri, "src-queue": "src", "dest-uri": uri, "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "again", value).status_code == 201
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    assert api.call("DELETE", f"/queues/{q(vhost)}/src").status_code == 204
    wait(lambda: api.call("GET", f"/queues/{q(vhost)}/src").status_code == 200, what="the queue declared again")
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running again")
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"still moving"])
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    conn.close()


def test_a_deleted_destination_vhost_stops_the_shovel(api, broker):
    vhost, other = api.vhost(), api.vhost()
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": "src", "dest-uri": f"amqp:///{q(other)}",
             "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "away", value).status_code == 201
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    assert api.call("DELETE", f"/vhosts/{q(other)}").status_code == 204
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] != "running"], what="not running")
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"stays"])
    time.sleep(1.5)
    assert ready(ch, "src") == 1
    assert [s["state"] for s in api.shovels(vhost)] != ["running"]
    # Once the vhost is back, the shovel connects again (RabbitMQ: "starting" till then).
    api.ok("PUT", f"/vhosts/{q(other)}", {})
    api.ok("PUT", f"/permissions/{q(other)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running again")
    wait(lambda: ready(ch, "src") == 0, what="moved")
    conn.close()


# ------------------------------------------------------------------ validation
BASE = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2"}
DROP = object()


def with_(**changes):
    value = dict(BASE)
    for key, v in changes.items():
        key = key.replace("_", "-")
        if v is DROP:
            value.pop(key, None)
        else:
            value[key] = v
    return value


# RabbitMQ 3.10.8's answers (HTML-escaped as its parameter resource gives them).
INVALID = [
    ({}, "Must specify 'src-exchange' or 'src-queue'\nKey \"dest-uri\" not found in bad\n"
         "Key \"src-uri\" not found in bad\n"),
    (with_(src_queue=DROP), "Must specify 'src-exchange' or 'src-queue'\n"),
    (with_(src_exchange="x"), "Cannot specify 'src-exchange' and 'src-queue'\n"),
    (with_(dest_exchange="x"), "Cannot specify 'dest-exchange' and 'dest-queue'\n"),
    (with_(src_uri=DROP), "Key \"src-uri\" not found in bad\n"),
    (with_(dest_uri=DROP), "Key \"dest-uri\" not found in bad\n"),
    (with_(src_uri="http://x"), "\"http://x\" not a valid URI: {{unexpected_uri_scheme,\"http\"},\"http://x\"}\n"),
    (with_(src_uri="amqp"), "\"amqp\" not a valid URI: {{unable_to_parse_uri,no_scheme},\"amqp\"}\n"),
    (with_(src_uri="amqp:////"), "\"amqp:////\" not a valid URI: {{invalid_vhost,\"/\"},\"amqp:////\"}\n"),
    (with_(src_uri=5), "src-uri should be list, actually was 5\n"),
    (with_(src_uri="amqp:///nosuchvhost"), "user \"guest\" may not connect to vhost \"nosuchvhost\"\n"),
    (with_(dest_uri="amqp:///"), "user \"guest\" may not connect to vhost \"\"\n"),
    (with_(ack_mode="x"), "ack-mode should be one of [&lt;&lt;\"no-ack\"&gt;&gt;,&lt;&lt;\"on-publish\"&gt;&gt;,"
                          "&lt;&lt;\"on-confirm\"&gt;&gt;], actually was &lt;&lt;\"x\"&gt;&gt;\n"),
    (with_(ack_mode=1), "ack-mode should be binary, actually was 1\n"),
    (with_(src_delete_after="x"), "src-delete-after should be a number greater than or equal to 0, \"never\" or "
                                  "\"queue-length\", actually was &lt;&lt;\"x\"&gt;&gt;\n"),
    (with_(src_delete_after=-1), "src-delete-after should be a number greater than or equal to 0, \"never\" or "
                                 "\"queue-length\", actually was -1\n"),
    (with_(src_delete_after=3, ack_mode="no-ack"), "Cannot specify 'no-ack' and numerical 'delete-after'\n"),
    (with_(src_prefetch_count="x"), "src-prefetch-count should be a number, actually was &lt;&lt;\"x\"&gt;&gt;\n"),
    (with_(dest_add_forward_headers="x"),
     "dest-add-forward-headers should be boolean, actually was &lt;&lt;\"x\"&gt;&gt;\n"),
    (with_(dest_add_timestamp_header=1), "dest-add-timestamp-header should be boolean, actually was 1\n"),
    (with_(dest_publish_properties={"foo": 1}),
     "Unrecognised terms [{&lt;&lt;\"foo\"&gt;&gt;,1}] in dest-publish-properties\n"),
    (with_(dest_publish_properties=5), "dest-publish-properties not a list 5\n"),
    (with_(dest_queue="a" * 256), "dest-queue should be less than 255 bytes, actually was 256\n"),
    (with_(dest_queue=5), "dest-queue should be binary, actually was 5\n"),
    (with_(src_queue=5), "src-queue should be binary, actually was 5\n"),
    (with_(zzz=1, aaa=2), "Unrecognised terms [{&lt;&lt;\"aaa\"&gt;&gt;,2},{&lt;&lt;\"zzz\"&gt;&gt;,1}] in bad\n"),
    (with_(reconnect_delay="x"), "reconnect-delay should be a number, actually was &lt;&lt;\"x\"&gt;&gt;\n"),
    (with_(dest_exchange_key=5), "dest-exchange-key should be binary, actually was 5\n"),
    (with_(src_queue_args={"x-bogus": 5}), "Unrecognised terms [{&lt;&lt;\"x-bogus\"&gt;&gt;,5}] in src-queue-args\n"),
    (with_(src_consumer_args={"x-bogus": 5}),
     "Unrecognised terms [{&lt;&lt;\"x-bogus\"&gt;&gt;,5}] in src-consumer-args\n"),
]


@pytest.mark.parametrize("value,reason", INVALID, ids=range(len(INVALID)))
def test_invalid_definitions(api, value, reason):
    r = put_shovel(api, "/", "bad", value)
    assert (r.status_code, r.json()) == (400, {"error": "bad_request", "reason": "Validation failed\n\n" + reason})
    assert gone(api, "/", "bad")


@pytest.mark.parametrize("value", [
    with_(src_prefetch_count=5), with_(prefetch_count=5), with_(delete_after="never"),
    with_(add_forward_headers=True), with_(publish_properties={}), with_(src_queue_args={"x-max-length": 5}),
    with_(src_consumer_args={"x-priority": 5}), with_(reconnect_delay=5), with_(src_delete_after=3),
    with_(dest_publish_properties={"delivery_mode": 2}), with_(src_exchange_key="k"),
    with_(src_uri=["amqp://"]), with_(src_uri="AMQP:///%2f"), with_(src_protocol="amqp091"),
])
def test_valid_definitions(api, value):
    vhost = api.vhost()  # (queues q1, q2 are declared there, not in /)

    def here(uri):
        return uri.replace("amqp://", f"amqp:///{q(vhost)}").replace("AMQP:///%2f", f"AMQP:///{q(vhost)}")
    value = {k: ([here(u) for u in v] if isinstance(v, list) else here(v)) if k.endswith("-uri") else v
             for k, v in value.items()}
    assert put_shovel(api, vhost, "good", value).status_code == 201
    assert api.call("DELETE", f"/parameters/shovel/{q(vhost)}/good").status_code == 204


@pytest.mark.skipif(bool(EXTERNAL), reason="Warren's refusals (RabbitMQ takes them, then its shovel fails)")
@pytest.mark.parametrize("value,reason", [
    (with_(src_protocol="amqp10", src_address="a"), "src-protocol amqp10: Warren's shovels speak AMQP 0-9-1 only"),
    (with_(src_prefetch_count=1.5), "src-prefetch-count should be an integer from 0 to 65535, actually was 1.5"),
    (with_(src_prefetch_count=-1), "src-prefetch-count should be an integer from 0 to 65535, actually was -1"),
    (with_(src_queue=""), "src-queue must not be empty"),
    (with_(src_uri=[]), "src-uri should name a URI, actually was []"),
    (5, "bad not a list 5"),
    (with_(src_protocol="x"), "src-protocol should be one of [&lt;&lt;\"amqp10\"&gt;&gt;,&lt;&lt;\"amqp091\"&gt;&gt;],"
                              " actually was &lt;&lt;\"x\"&gt;&gt;"),
    (with_(dest_publish_properties={"priority": 1000}), "priority should be an integer from 0 to 255, "
                                                        "actually was 1000"),
])
def test_what_warren_refuses_more_than_rabbitmq(api, value, reason):
    r = put_shovel(api, "/", "bad", value)
    assert (r.status_code, r.json()) == (400, {"error": "bad_request", "reason": "Validation failed\n\n" + reason
                                               + "\n"})


# ------------------------------------------------------------------ access
def test_who_may_do_what(api, broker):
    """Parameters: policymakers (in their vhosts) and administrators; /api/shovels:
    monitoring and administrator users, who see the shovels of their vhosts only
    (administrators too) and may delete and restart those (rabbit_shovel_mgmt)."""
    vhost = api.vhost()
    conn = connect(broker, vhost)
    declare(conn.channel(), "q1", "q2")
    conn.close()
    uri = f"amqp:///{q(vhost)}"
    value = {"src-uri": uri, "src-queue": "q1", "dest-uri": uri, "dest-queue": "q2"}
    users = {t: api.user(t, vhost) for t in ("management", "policymaker", "monitoring", "administrator", "")}
    bare_admin = api.user("administrator", None)
    as_ = {t: (u, PASSWORD) for t, u in users.items()}

    def reason(r):
        return r.status_code, (r.json().get("reason") if r.status_code == 401 else None)

    refused = (401, "User not authorised to access object")
    for tag, expected in (("management", refused), ("monitoring", refused), ("", (401, "Not management user"))):
        assert reason(put_shovel(api, vhost, "s", value, auth=as_[tag])) == expected, tag
    assert put_shovel(api, vhost, "s", value, auth=as_["policymaker"]).status_code == 201
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    for tag, expected in (("management", (401, "Not monitor user")), ("policymaker", (401, "Not monitor user")),
                          ("", (401, "Not management user"))):
        assert reason(api.call("GET", "/shovels", auth=as_[tag])) == expected, tag
        assert reason(api.call("GET", f"/shovels/{q(vhost)}", auth=as_[tag])) == expected, tag
        assert reason(api.call("DELETE", f"/shovels/vhost/{q(vhost)}/s", auth=as_[tag])) == expected, tag
    for tag in ("monitoring", "administrator"):
        assert [s["name"] for s in api.shovels(vhost, auth=as_[tag])] == ["s"], tag
        assert [s["name"] for s in api.ok("GET", "/shovels", auth=as_[tag]).json()] == ["s"], tag
        assert [s["name"] for s in api.ok("GET", f"/shovels/vhost/{q(vhost)}/s", auth=as_[tag]).json()] == ["s"]
    # An administrator without permissions in the vhost sees none of its shovels.
    assert api.ok("GET", "/shovels", auth=(bare_admin, PASSWORD)).json() == []
    assert api.call("DELETE", f"/shovels/vhost/{q(vhost)}/s", auth=(bare_admin, PASSWORD)).status_code == 404
    assert api.call("GET", f"/shovels/vhost/{q(vhost)}/nope", auth=as_["monitoring"]).status_code == 404
    assert api.call("GET", "/shovels/no-such-vhost", auth=as_["monitoring"]).status_code == 404
    # Restart, then delete, as a monitoring user.
    assert api.call("DELETE", f"/shovels/vhost/{q(vhost)}/s/restart", auth=as_["monitoring"]).status_code == 204
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running again")
    assert api.call("DELETE", f"/shovels/vhost/{q(vhost)}/s", auth=as_["monitoring"]).status_code == 204
    assert gone(api, vhost, "s")
    wait(lambda: api.shovels(vhost) == [], what="the status to go")
    # A policymaker without permissions in the URI's vhost may not point a shovel there.
    other = api.vhost()
    r = put_shovel(api, vhost, "s2", dict(value, **{"dest-uri": f"amqp:///{q(other)}"}), auth=as_["policymaker"])
    assert (r.status_code, r.json()["reason"]) == (
        400, f"Validation failed\n\nuser \"{users['policymaker']}\" may not connect to vhost \"{other}\"\n")


# ------------------------------------------------------------------ definitions
def test_definitions_export_and_import(api, broker):
    vhost = api.vhost()
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    uri = f"amqp:///{q(vhost)}"
    value = {"src-uri": uri, "src-queue": "q1", "dest-uri": uri, "dest-queue": "q2"}
    defs = {"parameters": [{"value": value, "vhost": vhost, "component": "shovel", "name": "imported"}]}
    assert api.call("POST", "/definitions", defs).status_code in (201, 204)
    wait(lambda: [s for s in api.shovels(vhost) if s["state"] == "running"], what="running")
    publish(ch, "q1", [b"via import"])
    wait(lambda: ready(ch, "q2") == 1, what="moved")
    exported = api.ok("GET", "/definitions").json()["parameters"]
    assert {"value": value, "vhost": vhost, "component": "shovel", "name": "imported"} in exported
    conn.close()


# ------------------------------------------------------------------ restarts (Warren)
def _mgmt(b) -> Api:
    return Api(b.api)


def test_a_shovel_resumes_after_a_restart(make_broker, restart_broker):
    b = make_broker()
    a = _mgmt(b)
    conn = connect(b, "/")
    declare(conn.channel(), "q1", "q2")
    conn.close()
    value = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2"}
    assert put_shovel(a, "/", "keep", value).status_code == 201
    b = restart_broker(b)
    a = _mgmt(b)
    assert a.ok("GET", "/parameters/shovel/%2F/keep").json()["value"] == value
    conn = connect(b, "/")
    ch = conn.channel()
    publish(ch, "q1", [b"after restart"])
    wait(lambda: ready(ch, "q2") == 1, what="moved after the restart")
    assert [s["state"] for s in a.shovels("/")] == ["running"]
    conn.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_kill_mid_move_loses_nothing(make_broker, restart_broker, sig):
    """ack-mode on-confirm: a broker killed while the shovel moves loses no message (some may
    be in both queues, or twice in the destination, as with RabbitMQ); the move resumes at
    the restart and completes."""
    b = make_broker()
    a = _mgmt(b)
    conn = connect(b, "/")
    ch = conn.channel()
    declare(ch, "q1", "q2")
    bodies = [b"k%05d" % i for i in range(5000)]
    for start in range(0, len(bodies), 1000):
        publish(ch, "q1", bodies[start:start + 1000])
    conn.close()
    value = move_value("/", "q1", "q2", **{"src-prefetch-count": 20})
    assert put_shovel(a, "/", "Move from q1", value).status_code == 201
    conn = connect(b, "/")
    ch = conn.channel()
    wait(lambda: ready(ch, "q2") > 0, what="the move to start")
    left = ready(ch, "q1")
    b = restart_broker(b, sig=sig)
    assert left > 1000, left  # (killed mid-move)
    a = _mgmt(b)
    wait(lambda: gone(a, "/", "Move from q1"), timeout=60, what="the move to complete after the restart")
    conn = connect(b, "/")
    ch = conn.channel()
    assert ready(ch, "q1") == 0
    moved = [body for body, _ in drain(ch, "q2")]
    assert set(moved) == set(bodies)
    conn.close()


def test_an_alarm_holds_a_shovel(make_broker):
    """During a resource alarm a shovel publishes nothing (as a blocked publisher); it moves
    once the alarm has cleared."""
    b = make_broker()
    a = _mgmt(b)

    def ctl(*args):
        r = subprocess.run(["warrenctl", "--data-dir", b.data_dir, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)

    conn = connect(b, "/")
    ch = conn.channel()
    declare(ch, "src", "dst")
    publish(ch, "src", [b"1", b"2", b"3"])
    ctl("set_vm_memory_high_watermark", "0")
    wait(lambda: a.call("GET", "/health/checks/alarms").status_code != 200, what="the alarm")
    value = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst"}
    assert put_shovel(a, "/", "held", value).status_code == 201
    wait(lambda: [s for s in a.shovels("/") if s["state"] == "running"], what="running")
    time.sleep(1)
    assert ready(ch, "dst") == 0
    ctl("set_vm_memory_high_watermark", "0.4")
    wait(lambda: ready(ch, "dst") == 3, what="moved after the alarm")
    assert [body for body, _ in drain(ch, "dst")] == [b"1", b"2", b"3"]
    conn.close()
