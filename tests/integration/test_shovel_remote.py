"""Shovels to and from other brokers: src-uri and dest-uri naming a host, with a user and
password and RabbitMQ's query keys (amqp_uri), and lists of URIs of redundant brokers. How
such a shovel moves messages, what /api/shovels and the other broker's /api/connections show
of it, the validation texts of bad URIs, and how a shovel whose broker is unreachable, refuses
its password or lacks its vhost waits ("starting") and runs once that is fixed.

The "other broker" is the broker under test itself, reached over TCP at its host and port with
a user of the test's own in the URI, so the module runs against one node; a port that starts
listening later is a relay to it. Where two distinct brokers are needed, the test is Warren's
only (it starts them).

Against RabbitMQ 3.10 with the shovel plugins:

    python tools/rabbitmq_node.py run --plugins \\
        rabbitmq_management,rabbitmq_shovel,rabbitmq_shovel_management -- \\
        python -m pytest -q tests/integration/test_shovel_remote.py

Without a management API, or without the shovel plugin, the module is skipped there.
"""

import signal
import socket
import threading
import time
import uuid

import pika
import pytest

from conftest import EXTERNAL, free_port

from .http_api import q
from .test_shovel_move import (MGMT, Api, _status, api, connect, declare, drain, gone, publish,  # noqa: F401
                               put_shovel, ready, wait)

pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT, reason="the comparison RabbitMQ node has no management plugin")

# Characters a URI must percent-encode, in the user's name and password.
SECRET = "p@ss:w/rd%?#"


def remote_user(api: Api, vhost: str, password: str = SECRET) -> str:
    name = f"shv-remote-{uuid.uuid4().hex[:6]}@x"
    api.users.append(name)
    api.ok("PUT", f"/users/{q(name)}", {"password": password, "tags": ""})
    api.ok("PUT", f"/permissions/{q(vhost)}/{q(name)}", {"configure": ".*", "write": ".*", "read": ".*"})
    return name


def uri(broker, user: str, vhost: str, password: str = SECRET, query: str = "", port: int | None = None) -> str:
    """An amqp URI of the broker under test, by host and port, with credentials."""
    return f"amqp://{q(user)}:{q(password)}@{broker.host}:{port or broker.port}/{q(vhost)}{query}"


def shown(broker, vhost: str, port: int | None = None) -> str:
    """The same URI as /api/shovels and x-shovelled show it: no credentials, no query."""
    return f"amqp://{broker.host}:{port or broker.port}/{q(vhost)}"


def states(api: Api, vhost: str) -> list:
    return [s["state"] for s in api.shovels(vhost)]


def running(api: Api, vhost: str) -> list:
    return [s for s in api.shovels(vhost) if s["state"] == "running"]


def shovel_connections(api: Api, name: str) -> list:
    """The network connections a shovel opened to the broker (its client-provided name).
    (RabbitMQ lists a shovel's direct connections, of amqp:// URIs, too: type "direct"; and a
    connection only once its first statistics are in, up to 5 s after it opened.)"""
    return [c for c in api.ok("GET", "/connections").json()
            if (c.get("client_properties") or {}).get("connection_name") == f"Shovel {name}"
            and c.get("type") == "network"]


class Relay:
    """A TCP port that forwards to the broker under test: a broker that can be reachable or
    not. Listens from start() until close(), which also cuts the connections it carries."""

    def __init__(self, target: tuple[str, int], port: int | None = None):
        self.target = target
        self.port = port or free_port()
        self.server: socket.socket | None = None
        self.sockets: list[socket.socket] = []

    def start(self) -> "Relay":
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen()
        self.server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.server is not None:
            try:  # (wakes the accepting thread; close() alone would not)
                self.server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.server.close()
            self.server = None
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.sockets = []


@pytest.fixture
def relay(broker):
    made: list[Relay] = []

    def make(port: int | None = None) -> Relay:
        r = Relay((broker.host, broker.port), port)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


# ------------------------------------------------------------------ moving
@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_queue_to_queue_through_uris_with_host_and_credentials(api, broker, ack_mode):
    """Both ends over TCP as a user whose name and password need percent-encoding: the
    messages move in order with their properties; the status shows the URIs without
    credentials or query, the parameter keeps them; the source queue's consumer is on the
    shovel's own connection, as that user."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    bodies = [b"r%03d" % i for i in range(50)]
    publish(ch, "q1", bodies, headers={"k": "v"})
    value = {"src-uri": uri(broker, user, vhost, query="?heartbeat=10"), "src-queue": "q1",
             "dest-uri": uri(broker, user, vhost), "dest-queue": "q2", "ack-mode": ack_mode}
    assert put_shovel(api, vhost, "remote", value).status_code == 201
    wait(lambda: ready(ch, "q2") == len(bodies), what="moved")
    moved = drain(ch, "q2")
    assert [b for b, _ in moved] == bodies
    assert all(p.delivery_mode == 2 and p.headers == {"k": "v"} for _, p in moved)
    assert ready(ch, "q1") == 0
    [status] = running(api, vhost)
    assert _status(status) == {
        "name": "remote", "vhost": vhost, "type": "dynamic", "state": "running",
        "src_uri": shown(broker, vhost), "src_protocol": "amqp091", "dest_protocol": "amqp091",
        "dest_uri": shown(broker, vhost), "src_queue": "q1", "dest_queue": "q2"}
    assert [_status(s) for s in api.ok("GET", "/shovels").json() if s["vhost"] == vhost] == [status]
    assert api.ok("GET", f"/parameters/shovel/{q(vhost)}/remote").json()["value"] == value

    def listed(items):  # (RabbitMQ: once its channel's statistics are in)
        return [c for c in items or [] if isinstance(c.get("channel_details"), dict) and c["channel_details"]]
    [consumer] = wait(lambda: listed(api.ok("GET", f"/queues/{q(vhost)}/q1").json().get("consumer_details")),
                      what="the consumer listed")
    assert (consumer["ack_required"], consumer["prefetch_count"], consumer["channel_details"]["user"]) == (
        ack_mode != "no-ack", 0 if ack_mode == "no-ack" else 1000, user)
    publish(ch, "q1", [b"more"])
    wait(lambda: ready(ch, "q2") == 1, what="a later message moved")
    conn.close()


def test_the_connections_on_the_other_broker(api, broker):
    """Each end is a connection of its own named "Shovel NAME" (client property
    connection_name), as the URI's user, in its vhost; the URI's heartbeat, channel_max and
    frame_max are what the connection negotiates. Deleting the shovel closes both."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    name = "named one"
    value = {"src-uri": uri(broker, user, vhost, query="?heartbeat=7&channel_max=3&frame_max=8192"),
             "src-queue": "q1", "dest-uri": uri(broker, user, vhost), "dest-queue": "q2"}
    assert put_shovel(api, vhost, name, value).status_code == 201
    wait(lambda: running(api, vhost), what="running")
    conns = wait(lambda: len(shovel_connections(api, name)) == 2 and shovel_connections(api, name),
                 what="two connections")
    assert sorted((c["timeout"], c["channel_max"], c["frame_max"]) for c in conns) == [
        (7, 3, 8192), (10, 2047, 131072)]
    for c in conns:
        assert (c["user"], c["vhost"], c["user_provided_name"], c["protocol"], c["type"], c["auth_mechanism"]) == (
            user, vhost, f"Shovel {name}", "AMQP 0-9-1", "network", "PLAIN")
        assert c["client_properties"]["capabilities"] == {
            "authentication_failure_close": True, "basic.nack": True, "connection.blocked": True,
            "consumer_cancel_notify": True, "exchange_exchange_bindings": True, "publisher_confirms": True}
    # The queues it declared were missing: durable, on the brokers its URIs name.
    assert api.ok("GET", f"/queues/{q(vhost)}/q1").json()["durable"] is True
    assert api.ok("GET", f"/queues/{q(vhost)}/q2").json()["durable"] is True
    assert api.call("DELETE", f"/parameters/shovel/{q(vhost)}/{q(name)}").status_code == 204
    wait(lambda: shovel_connections(api, name) == [], what="the connections closed")


def test_a_uri_without_vhost_or_credentials(api, broker):
    """amqp://HOST:PORT is the vhost "/" as guest/guest (amqp_uri's defaults), with a
    heartbeat of 10 s and channel_max 2047 (the Erlang client's)."""
    vhost = api.vhost()
    target = f"shv-remote-{uuid.uuid4().hex[:8]}"
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "src")
    publish(ch, "src", [b"to the default vhost"])
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": "src",
             "dest-uri": f"amqp://{broker.host}:{broker.port}", "dest-queue": target}
    try:
        assert put_shovel(api, vhost, "plain", value).status_code == 201
        [status] = wait(lambda: running(api, vhost), what="running")
        assert (status["src_uri"], status["dest_uri"]) == (f"amqp:///{q(vhost)}", f"amqp://{broker.host}:{broker.port}")
        other = connect(broker, "/")
        och = other.channel()
        wait(lambda: ready(och, target) == 1, what="moved to /")
        assert [b for b, _ in drain(och, target)] == [b"to the default vhost"]
        other.close()
        [c] = wait(lambda: shovel_connections(api, "plain"), what="the connection")
        assert (c["user"], c["vhost"], c["timeout"], c["channel_max"]) == ("guest", "/", 10, 2047)
    finally:
        api.call("DELETE", f"/parameters/shovel/{q(vhost)}/plain")
        api.call("DELETE", f"/queues/%2F/{q(target)}")
    conn.close()


def test_exchanges_and_forward_headers(api, broker):
    """src-exchange + key (an exclusive queue of the shovel's own on the source broker),
    dest-exchange + key; x-shovelled's src-uri and dest-uri are the connected URIs without
    credentials or query."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    conn = connect(broker, vhost)
    ch = conn.channel()
    ch.exchange_declare("in", "direct", durable=True)
    ch.exchange_declare("out", "direct", durable=True)
    declare(ch, "target")
    ch.queue_bind("target", "out", "to-target")
    value = {"src-uri": uri(broker, user, vhost, query="?heartbeat=5"), "src-exchange": "in", "src-exchange-key": "k",
             "dest-uri": [uri(broker, user, vhost)], "dest-exchange": "out", "dest-exchange-key": "to-target",
             "dest-add-forward-headers": True}
    assert put_shovel(api, vhost, "x", value).status_code == 201
    [status] = wait(lambda: running(api, vhost), what="running")
    assert _status(status) == {
        "name": "x", "vhost": vhost, "type": "dynamic", "state": "running", "src_uri": shown(broker, vhost),
        "src_protocol": "amqp091", "dest_protocol": "amqp091", "dest_uri": shown(broker, vhost),
        "src_exchange": "in", "src_exchange_key": "k", "dest_exchange": "out", "dest_exchange_key": "to-target"}
    [own] = [x for x in api.ok("GET", f"/queues/{q(vhost)}").json() if x["name"] != "target"]
    assert (own["exclusive"], own["durable"], own["name"].startswith("amq.gen-")) == (True, False, True)
    ch.basic_publish("in", "k", b"routed", pika.BasicProperties(headers={"h": 1}))
    ch.basic_publish("in", "other", b"not bound")
    wait(lambda: ready(ch, "target") == 1, what="moved")
    [(body, props)] = drain(ch, "target")
    assert body == b"routed" and props.headers["h"] == 1
    [info] = props.headers["x-shovelled"]
    assert isinstance(info.pop("shovelled-by"), str)
    assert info == {"shovel-type": "dynamic", "shovel-name": "x", "shovel-vhost": vhost,
                    "src-uri": shown(broker, vhost), "dest-uri": shown(broker, vhost), "src-exchange": "in",
                    "src-exchange-key": "k", "dest-exchange": "out", "dest-exchange-key": "to-target"}
    conn.close()


@pytest.mark.parametrize("delete_after,moved", [("queue-length", 5), (3, 3)])
def test_delete_after(api, broker, delete_after, moved):
    """src-delete-after through remote URIs: queue-length (the source's length, read on the
    source broker) or a number; then the shovel deletes itself."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    conn = connect(broker, vhost)
    ch = conn.channel()
    declare(ch, "q1", "q2")
    bodies = [b"d%d" % i for i in range(5)]
    publish(ch, "q1", bodies)
    value = {"src-uri": uri(broker, user, vhost), "src-queue": "q1", "dest-uri": uri(broker, user, vhost),
             "dest-queue": "q2", "src-delete-after": delete_after}
    assert put_shovel(api, vhost, "move", value).status_code == 201
    wait(lambda: gone(api, vhost, "move"), what="the shovel to delete itself")
    assert [b for b, _ in drain(ch, "q2")] == bodies[:moved]
    assert [b for b, _ in drain(ch, "q1")] == bodies[moved:]
    wait(lambda: api.shovels(vhost) == [] and shovel_connections(api, "move") == [], what="status and connections gone")
    conn.close()


# ------------------------------------------------------------------ unreachable, refused
def _starting(api, vhost, name) -> None:
    """The status of a shovel that cannot connect: "starting", no reason (it never ran)."""
    [status] = wait(lambda: api.shovels(vhost), what="a status")
    assert _status(status) == {"name": name, "vhost": vhost, "type": "dynamic", "state": "starting"}


def test_unreachable_until_the_port_listens(api, broker, relay):
    """Connection refused: "starting", retried every reconnect-delay; nothing is declared on
    either side until both ends connect. Once the port listens, it runs."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    later = relay()
    value = {"src-uri": uri(broker, user, vhost), "src-queue": "src",
             "dest-uri": uri(broker, user, vhost, port=later.port), "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "waits", value).status_code == 201
    _starting(api, vhost, "waits")
    time.sleep(1.5)  # (a retry or two)
    _starting(api, vhost, "waits")
    assert [x["name"] for x in api.ok("GET", f"/queues/{q(vhost)}").json()] == []
    later.start()
    [status] = wait(lambda: running(api, vhost), timeout=4, what="running once the port listens")
    assert (status["src_uri"], status["dest_uri"]) == (shown(broker, vhost), shown(broker, vhost, later.port))
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"through the relay"])
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    conn.close()


def test_a_dropped_connection_is_made_again(api, broker, relay):
    """The destination's socket cut without a close: the shovel connects again ("starting"
    while the port is closed) and moves on."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    hop = relay().start()
    value = {"src-uri": uri(broker, user, vhost), "src-queue": "src",
             "dest-uri": uri(broker, user, vhost, port=hop.port), "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "cut", value).status_code == 201
    wait(lambda: running(api, vhost), what="running")
    hop.close()
    wait(lambda: states(api, vhost) == ["starting"], timeout=4, what="starting while the port is closed")
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"waits at the source"])
    time.sleep(0.5)
    assert (ready(ch, "src"), ready(ch, "dst")) == (1, 0)
    relay(hop.port).start()
    wait(lambda: running(api, vhost), timeout=4, what="running again")
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    conn.close()


def test_a_wrong_password_until_it_is_changed(api, broker):
    vhost = api.vhost()
    user = remote_user(api, vhost, password="first")
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": "src",
             "dest-uri": uri(broker, user, vhost, password="second"), "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "pw", value).status_code == 201
    _starting(api, vhost, "pw")
    time.sleep(1.5)
    _starting(api, vhost, "pw")
    api.ok("PUT", f"/users/{q(user)}", {"password": "second", "tags": ""})
    wait(lambda: running(api, vhost), timeout=4, what="running with the new password")


def test_a_missing_vhost_until_it_exists(api, broker):
    """A network URI's vhost is not checked at validation (only a direct URI's is): the shovel
    waits, "starting", until the vhost exists and the user may use it."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    later = f"shv-later-{uuid.uuid4().hex[:6]}"
    api.vhosts.append(later)
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": "src", "dest-uri": uri(broker, user, later),
             "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "vh", value).status_code == 201
    _starting(api, vhost, "vh")
    api.ok("PUT", f"/vhosts/{q(later)}", {})
    time.sleep(1.5)  # the vhost exists, the user has no permission there yet
    _starting(api, vhost, "vh")
    api.ok("PUT", f"/permissions/{q(later)}/{q(user)}", {"configure": ".*", "write": ".*", "read": ".*"})
    [status] = wait(lambda: running(api, vhost), timeout=4, what="running")
    assert status["dest_uri"] == shown(broker, later)
    assert api.ok("GET", f"/queues/{q(later)}/dst").json()["durable"] is True


def test_a_uri_list_with_a_dead_first_entry(api, broker):
    """A list of URIs: redundant brokers, tried (in random order) until one connects; the
    status shows the one connected."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    dead = free_port()
    value = {"src-uri": [uri(broker, user, vhost, port=dead), uri(broker, user, vhost)], "src-queue": "src",
             "dest-uri": [uri(broker, user, vhost, port=dead), uri(broker, user, vhost, query="?heartbeat=9")],
             "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "list", value).status_code == 201
    [status] = wait(lambda: running(api, vhost), timeout=4, what="running")
    assert (status["src_uri"], status["dest_uri"]) == (shown(broker, vhost), shown(broker, vhost))
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"via the second"])
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    conn.close()


def test_a_closed_connection_is_made_again(api, broker):
    """The broker closes one of the shovel's connections (DELETE /api/connections/NAME): the
    shovel stops, closing the other too, starts again and goes on moving."""
    vhost = api.vhost()
    user = remote_user(api, vhost)
    value = {"src-uri": uri(broker, user, vhost), "src-queue": "src", "dest-uri": uri(broker, user, vhost),
             "dest-queue": "dst", "reconnect-delay": 1}
    assert put_shovel(api, vhost, "closed", value).status_code == 201
    wait(lambda: running(api, vhost), what="running")
    before = {c["name"] for c in wait(lambda: len(shovel_connections(api, "closed")) == 2
                                      and shovel_connections(api, "closed"), what="two connections")}
    assert api.call("DELETE", f"/connections/{q(min(before))}").status_code == 204
    wait(lambda: {c["name"] for c in shovel_connections(api, "closed")}.isdisjoint(before), what="both closed")
    conn = connect(broker, vhost)
    ch = conn.channel()
    publish(ch, "src", [b"after the close"])
    wait(lambda: ready(ch, "dst") == 1, what="moved")
    conn.close()


# ------------------------------------------------------------------ validation
BASE = {"src-uri": "amqp://", "src-queue": "q1", "dest-queue": "q2"}

# RabbitMQ 3.10.8's answers (amqp_uri's errors as ~p prints them, HTML-escaped by the API).
INVALID_URIS = [
    ('ftp://h',
     '"ftp://h" not a valid URI: {{unexpected_uri_scheme,"ftp"},"ftp://h"}'),
    ('AMQPX://h',
     '"AMQPX://h" not a valid URI: {{unexpected_uri_scheme,"amqpx"},"AMQPX://h"}'),
    ('amqp',
     '"amqp" not a valid URI: {{unable_to_parse_uri,no_scheme},"amqp"}'),
    ('amqp:',
     '"amqp:" not a valid URI: {{case_clause,undefined},"amqp:"}'),
    ('',
     '"" not a valid URI: {{unable_to_parse_uri,no_scheme},[]}'),
    ('amqp://h:0',
     '"amqp://h:0" not a valid URI: {{port_out_of_range,0},"amqp://h:0"}'),
    ('amqp://h:70000',
     '"amqp://h:70000" not a valid URI: {{port_out_of_range,70000},"amqp://h:70000"}'),
    ('amqp://:5672',
     '"amqp://:5672" not a valid URI: {port_requires_host,"amqp://:5672"}'),
    ('amqp://h/a/b',
     '"amqp://h/a/b" not a valid URI: {{invalid_vhost,"a/b"},"amqp://h/a/b"}'),
    ('amqp:///a/b',
     '"amqp:///a/b" not a valid URI: {{invalid_vhost,"a/b"},"amqp:///a/b"}'),
    ('amqp://u%zz:p@h',
     '"amqp://u%zz:p@h" not a valid URI: {{invalid_entitiy,[\'%\',122,122]},\n'
     '                                    "amqp://u%zz:p@h"}'),
    ('amqp://u%:p@h',
     '"amqp://u%:p@h" not a valid URI: {{unterminated_entity,[\'%\']},"amqp://u%:p@h"}'),
    ('amqp://h/%zz',
     '"amqp://h/%zz" not a valid URI: {{invalid_entitiy,[\'%\',122,122]},\n'
     '                                 "amqp://h/%zz"}'),
    ('amqp://[::1]x',
     '"amqp://[::1]x" not a valid URI: {{unable_to_parse_uri,\n'
     '                                   {malformed_uri,"amqp://[::1]x",\n'
     '                                    {invalid_port,"x"}}},\n'
     '                                  "amqp://[::1]x"}'),
    ('amqp://user:pw@h:0/%2f',
     '"amqp://user:pw@h:0/%2f" not a valid URI: {{port_out_of_range,0},\n'
     '                                           "amqp://user:pw@h:0/%2f"}'),
    ('amqp://h?heartbeat=abc',
     '"amqp://h?heartbeat=abc" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                            heartbeat,"abc",\n'
     '                                            [{"heartbeat","abc"}],\n'
     '                                            {not_an_integer,"abc"}},\n'
     '                                           "amqp://h?heartbeat=abc"}'),
    ('amqp://h?heartbeat=',
     '"amqp://h?heartbeat=" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                         heartbeat,[],\n'
     '                                         [{"heartbeat",[]}],\n'
     '                                         {not_an_integer,[]}},\n'
     '                                        "amqp://h?heartbeat="}'),
    ('amqp://h?heartbeat=1.5',
     '"amqp://h?heartbeat=1.5" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                            heartbeat,"1.5",\n'
     '                                            [{"heartbeat","1.5"}],\n'
     '                                            {not_an_integer,"1.5"}},\n'
     '                                           "amqp://h?heartbeat=1.5"}'),
    ('amqp://h?heartbeat=%31',
     '"amqp://h?heartbeat=%31" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                            heartbeat,"%31",\n'
     '                                            [{"heartbeat","%31"}],\n'
     '                                            {not_an_integer,"%31"}},\n'
     '                                           "amqp://h?heartbeat=%31"}'),
    ('amqp://h?channel_max=x',
     '"amqp://h?channel_max=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                            channel_max,"x",\n'
     '                                            [{"channel_max","x"}],\n'
     '                                            {not_an_integer,"x"}},\n'
     '                                           "amqp://h?channel_max=x"}'),
    ('amqp://h?frame_max=x',
     '"amqp://h?frame_max=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                          frame_max,"x",\n'
     '                                          [{"frame_max","x"}],\n'
     '                                          {not_an_integer,"x"}},\n'
     '                                         "amqp://h?frame_max=x"}'),
    ('amqp://h?connection_timeout=x',
     '"amqp://h?connection_timeout=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                   connection_timeout,"x",\n'
     '                                                   [{"connection_timeout",\n'
     '                                                     "x"}],\n'
     '                                                   {not_an_integer,"x"}},\n'
     '                                                  "amqp://h?connection_timeout=x"}'),
    ('amqp://h?heartbeat=x&channel_max=y',
     '"amqp://h?heartbeat=x&amp;channel_max=y" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                        channel_max,"y",\n'
     '                                                        [{"heartbeat","x"},\n'
     '                                                         {"channel_max","y"}],\n'
     '                                                        {not_an_integer,"y"}},\n'
     '                                                       "amqp://h?heartbeat=x&amp;channel_max=y"}'),
    ('amqp://h?heartbeat=x&heartbeat=5',
     '"amqp://h?heartbeat=x&amp;heartbeat=5" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                      heartbeat,"x",\n'
     '                                                      [{"heartbeat","x"},\n'
     '                                                       {"heartbeat","5"}],\n'
     '                                                      {not_an_integer,"x"}},\n'
     '                                                     "amqp://h?heartbeat=x&amp;heartbeat=5"}'),
    ('amqp://h?frame_max=x&zzz',
     '"amqp://h?frame_max=x&amp;zzz" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                              frame_max,"x",\n'
     '                                              [{"frame_max","x"},"zzz"],\n'
     '                                              {not_an_integer,"x"}},\n'
     '                                             "amqp://h?frame_max=x&amp;zzz"}'),
    ('amqp://h?username=x',
     '"amqp://h?username=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                         username,"x",\n'
     '                                         [{"username","x"}],\n'
     '                                         {parameter_unconfigurable_in_query,\n'
     '                                          username,"x"}},\n'
     '                                        "amqp://h?username=x"}'),
    ('amqp://h?password=&username=x',
     '"amqp://h?password=&amp;username=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                   username,"x",\n'
     '                                                   [{"password",[]},\n'
     '                                                    {"username","x"}],\n'
     '                                                   {parameter_unconfigurable_in_query,\n'
     '                                                    username,"x"}},\n'
     '                                                  "amqp://h?password=&amp;username=x"}'),
    ('amqp://h?virtual_host=x',
     '"amqp://h?virtual_host=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                             virtual_host,"x",\n'
     '                                             [{"virtual_host","x"}],\n'
     '                                             {parameter_unconfigurable_in_query,\n'
     '                                              virtual_host,"x"}},\n'
     '                                            "amqp://h?virtual_host=x"}'),
    ('amqp://h?host=x',
     '"amqp://h?host=x" not a valid URI: {{invalid_amqp_params_parameter,host,"x",\n'
     '                                     [{"host","x"}],\n'
     '                                     {parameter_unconfigurable_in_query,host,\n'
     '                                      "x"}},\n'
     '                                    "amqp://h?host=x"}'),
    ('amqp://h?port=x',
     '"amqp://h?port=x" not a valid URI: {{invalid_amqp_params_parameter,port,"x",\n'
     '                                     [{"port","x"}],\n'
     '                                     {parameter_unconfigurable_in_query,port,\n'
     '                                      "x"}},\n'
     '                                    "amqp://h?port=x"}'),
    ('amqp://h?ssl_options=x',
     '"amqp://h?ssl_options=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                            ssl_options,"x",\n'
     '                                            [{"ssl_options","x"}],\n'
     '                                            {parameter_unconfigurable_in_query,\n'
     '                                             ssl_options,"x"}},\n'
     '                                           "amqp://h?ssl_options=x"}'),
    ('amqp://h?auth_mechanisms=x',
     '"amqp://h?auth_mechanisms=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                auth_mechanisms,"x",\n'
     '                                                [{"auth_mechanisms","x"}],\n'
     '                                                {parameter_unconfigurable_in_query,\n'
     '                                                 auth_mechanisms,"x"}},\n'
     '                                               "amqp://h?auth_mechanisms=x"}'),
    ('amqp://h?client_properties=x',
     '"amqp://h?client_properties=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                                  client_properties,"x",\n'
     '                                                  [{"client_properties","x"}],\n'
     '                                                  {parameter_unconfigurable_in_query,\n'
     '                                                   client_properties,"x"}},\n'
     '                                                 "amqp://h?client_properties=x"}'),
    ('amqp://h?socket_options=x',
     '"amqp://h?socket_options=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                               socket_options,"x",\n'
     '                                               [{"socket_options","x"}],\n'
     '                                               {parameter_unconfigurable_in_query,\n'
     '                                                socket_options,"x"}},\n'
     '                                              "amqp://h?socket_options=x"}'),
    ('amqp://h?auth_mechanism=a:b:c',
     '"amqp://h?auth_mechanism=a:b:c" not a valid URI: {{not_mechanism,[a,b,c]},\n'
     '                                                  "amqp://h?auth_mechanism=a:b:c"}'),
    ('amqps://h?fail_if_no_peer_cert=maybe',
     '"amqps://h?fail_if_no_peer_cert=maybe" not a valid URI: {{invalid_ssl_parameter,\n'
     '                                                          fail_if_no_peer_cert,\n'
     '                                                          "maybe",\n'
     '                                                          [{"fail_if_no_peer_cert",\n'
     '                                                            "maybe"}],\n'
     '                                                          {require_boolean,\n'
     '                                                           maybe}},\n'
     '                                                         "amqps://h?fail_if_no_peer_cert=maybe"}'),
    ('amqps://h?depth=x',
     '"amqps://h?depth=x" not a valid URI: {{invalid_ssl_parameter,depth,"x",\n'
     '                                       [{"depth","x"}],\n'
     '                                       {not_an_integer,"x"}},\n'
     '                                      "amqps://h?depth=x"}'),
    ('amqps://h?verify=x&depth=y&cacertfile=z',
     '"amqps://h?verify=x&amp;depth=y&amp;cacertfile=z" not a valid URI: {{invalid_ssl_parameter,\n'
     '                                                             depth,"y",\n'
     '                                                             [{"verify","x"},\n'
     '                                                              {"depth","y"},\n'
     '                                                              {"cacertfile",\n'
     '                                                               "z"}],\n'
     '                                                             {not_an_integer,\n'
     '                                                              "y"}},\n'
     '                                                            "amqps://h?verify=x&amp;depth=y&amp;cacertfile=z"}'),
    ('amqps://h?heartbeat=x',
     '"amqps://h?heartbeat=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     '                                           heartbeat,"x",\n'
     '                                           [{"heartbeat","x"}],\n'
     '                                           {not_an_integer,"x"}},\n'
     '                                          "amqps://h?heartbeat=x"}'),
]


def refused(api, value) -> str:
    r = put_shovel(api, "/", "bad", value)
    if r.status_code != 400:  # (taken: not left behind for the next test)
        api.call("DELETE", "/parameters/shovel/%2F/bad")
    assert r.status_code == 400, (r.status_code, r.text)
    assert gone(api, "/", "bad")
    body = r.json()
    assert body["error"] == "bad_request" and body["reason"].startswith("Validation failed\n\n"), body
    return body["reason"][len("Validation failed\n\n"):]


@pytest.mark.parametrize("bad,reason", INVALID_URIS, ids=range(len(INVALID_URIS)))
def test_invalid_uris(api, bad, reason):
    assert refused(api, dict(BASE, **{"dest-uri": bad})) == reason + "\n"


@pytest.mark.parametrize("bad", ["amqp://h:notaport", "amqp://h:", "amqp://h:5672:5673"])
def test_a_port_that_is_not_a_number(api, bad):
    """uri_parser's list_to_integer fails: the text carries an Erlang stack trace (the
    release's own: only its frame is checked here)."""
    prefix = f'"{bad}" not a valid URI: '
    reason = refused(api, dict(BASE, **{"dest-uri": bad}))
    assert reason.startswith(f"{prefix}{{{{unable_to_parse_uri,\n"
                             f'{" " * (len(prefix) + 2)}{{malformed_uri,"{bad}",\n'
                             f"{' ' * (len(prefix) + 3)}{{'EXIT',\n"), reason
    assert reason.endswith(f'}}}}}}}},\n{" " * (len(prefix) + 1)}"{bad}"}}\n'), reason


@pytest.mark.parametrize("value,reason", [
    ({"dest-uri": ["amqp://h", "ftp://x"]}, '"ftp://x" not a valid URI: {{unexpected_uri_scheme,"ftp"},"ftp://x"}\n'),
    ({"dest-uri": ["ftp://x", "amqp://h:0"]},  # the first bad one only
     '"ftp://x" not a valid URI: {{unexpected_uri_scheme,"ftp"},"ftp://x"}\n'),
    ({"dest-uri": ["amqp://h", 5]}, "dest-uri should be list, actually was 5\n"),
    ({"src-uri": "ftp://x", "dest-uri": "amqp://h:0"},
     '"amqp://h:0" not a valid URI: {{port_out_of_range,0},"amqp://h:0"}\n'
     '"ftp://x" not a valid URI: {{unexpected_uri_scheme,"ftp"},"ftp://x"}\n'),
    ({"src-uri": ["amqp://h", ""], "dest-uri": "amqp://h/a/b", "ack-mode": "x"},
     '"amqp://h/a/b" not a valid URI: {{invalid_vhost,"a/b"},"amqp://h/a/b"}\n'
     '"" not a valid URI: {{unable_to_parse_uri,no_scheme},[]}\n'
     'ack-mode should be one of [&lt;&lt;"no-ack"&gt;&gt;,&lt;&lt;"on-publish"&gt;&gt;,&lt;&lt;"on-confirm"&gt;&gt;], '
     'actually was &lt;&lt;"x"&gt;&gt;\n'),
    ({"dest-uri": "amqp://u:p@/nosuchvhost"}, 'user "guest" may not connect to vhost "nosuchvhost"\n'),
], ids=range(6))
def test_invalid_lists_and_combinations(api, value, reason):
    assert refused(api, dict(BASE, **value)) == reason


# Accepted at validation: amqp_uri checks neither the host, the vhost, the user nor unknown
# query keys, nor TLS files and verify (those fail when the shovel connects).
VALID_URIS = [
    "amqp://127.0.0.1:{dead}", "amqp://127.0.0.1:{dead}/", "amqp://127.0.0.1:{dead}/nosuchvhost",
    "AMQP://127.0.0.1:{dead}/%2F", "amqp://u%41:p%40@127.0.0.1:{dead}/v%2Fx", "amqp://u:p:q@127.0.0.1:{dead}",
    "amqp://u@127.0.0.1:{dead}", "amqp://[::1]:{dead}", "amqp://127.0.0.1:{dead}#fragment",
    "amqp://127.0.0.1:{dead}?", "amqp://127.0.0.1:{dead}?&", "amqp://127.0.0.1:{dead}?zzz=1",
    "amqp://127.0.0.1:{dead}?a=b=c", "amqp://127.0.0.1:{dead}?heartbeat", "amqp://127.0.0.1:{dead}?heartbeat=-1",
    "amqp://127.0.0.1:{dead}?heartbeat=5&heartbeat=x", "amqp://127.0.0.1:{dead}?password=x",
    "amqp://127.0.0.1:{dead}?channel_max=1&frame_max=2&heartbeat=3&connection_timeout=4",
    "amqp://127.0.0.1:{dead}?auth_mechanism=plain&auth_mechanism=amqplain",
    "amqp://127.0.0.1:{dead}?auth_mechanism=amqp_auth_mechanisms:plain",
    "amqp://127.0.0.1:{dead}?verify=wrong&depth=x&cacertfile=/nonexistent",
    "amqps://127.0.0.1:{dead}", "AMQPS://127.0.0.1:{dead}",
    "amqps://127.0.0.1:{dead}?verify=wrong", "amqps://127.0.0.1:{dead}?cacertfile=/nonexistent",
    "amqps://127.0.0.1:{dead}?server_name_indication=disable",
    "amqps://127.0.0.1:{dead}?cacertfile=/x&certfile=/y&keyfile=/z&verify=verify_peer&fail_if_no_peer_cert=true"
    "&password=k&server_name_indication=foo&depth=3",
    ["amqp://127.0.0.1:{dead}", "amqp://127.0.0.1:{dead}/%2F"],
]


@pytest.mark.parametrize("good", VALID_URIS, ids=range(len(VALID_URIS)))
def test_valid_uris(api, good):
    vhost = api.vhost()
    dead = free_port()
    good = [u.format(dead=dead) for u in good] if isinstance(good, list) else good.format(dead=dead)
    value = {"src-uri": f"amqp:///{q(vhost)}", "src-queue": "q1", "dest-uri": good, "dest-queue": "q2"}
    assert put_shovel(api, vhost, "good", value).status_code == 201
    assert api.ok("GET", f"/parameters/shovel/{q(vhost)}/good").json()["value"] == value
    assert api.call("DELETE", f"/parameters/shovel/{q(vhost)}/good").status_code == 204


# What RabbitMQ takes at validation but Warren refuses on purpose: an auth_mechanism its links
# do not speak (RabbitMQ's shovel calls amqp_auth_mechanisms:x at connect and crashes), a URI
# list with no URI (RabbitMQ's shovel then never connects).
WARREN_REFUSES = [
    ("amqp://h?auth_mechanism=x",
     '"amqp://h?auth_mechanism=x" not a valid URI: auth_mechanism "x" is not one Warren\'s links can log in with '
     "(plain, amqplain, external, or those as amqp_auth_mechanisms:NAME)\n"),
    ("amqp://h?auth_mechanism=plain&auth_mechanism=rabbit_auth_mechanism_plain:plain",
     '"amqp://h?auth_mechanism=plain&amp;auth_mechanism=rabbit_auth_mechanism_plain:plain" not a valid URI: '
     'auth_mechanism "rabbit_auth_mechanism_plain:plain" is not one Warren\'s links can log in with '
     "(plain, amqplain, external, or those as amqp_auth_mechanisms:NAME)\n"),
    ([], "dest-uri should name a URI, actually was []\n"),
]


@pytest.mark.skipif(bool(EXTERNAL), reason="Warren's refusals (RabbitMQ takes these)")
@pytest.mark.parametrize("bad,reason", WARREN_REFUSES, ids=range(len(WARREN_REFUSES)))
def test_uris_warren_refuses(api, bad, reason):
    assert refused(api, dict(BASE, **{"dest-uri": bad})) == reason


# ------------------------------------------------------------------ two brokers (Warren)
def test_between_two_brokers(make_broker):
    """A shovel on broker A moves from A's queue to broker B's; B stops: the shovel waits
    ("starting"), the messages published meanwhile stay on A; B back on its port: they move,
    none lost (on-confirm)."""
    a, b = make_broker(), make_broker()
    api_a = Api(a.api)
    value = {"src-uri": f"amqp://guest:guest@{a.host}:{a.port}", "src-queue": "q1",
             "dest-uri": f"amqp://guest:guest@{b.host}:{b.port}", "dest-queue": "q2", "reconnect-delay": 1}
    assert put_shovel(api_a, "/", "a-to-b", value).status_code == 201
    [status] = wait(lambda: running(api_a, "/"), what="running")
    assert (status["src_uri"], status["dest_uri"]) == (f"amqp://{a.host}:{a.port}", f"amqp://{b.host}:{b.port}")
    ca = connect(a, "/")
    cha = ca.channel()
    first = [b"first%02d" % i for i in range(20)]
    publish(cha, "q1", first)
    cb = connect(b, "/")
    wait(lambda: ready(cb.channel(), "q2") == len(first), what="moved to B")
    cb.close()
    # B's confirms reach the shovel after B has the messages: stopping B before A has acked them
    # would requeue them on A (on-confirm's at-least-once), so wait for A's acks first.
    wait(lambda: api_a.ok("GET", "/queues/%2F/q1").json()["messages_unacknowledged"] == 0, what="acked on A")
    b.stop(signal.SIGTERM)
    wait(lambda: states(api_a, "/") == ["starting"], timeout=4, what="starting while B is down")
    second = [b"second%02d" % i for i in range(20)]
    publish(cha, "q1", second)
    time.sleep(0.5)
    assert ready(cha, "q1") == len(second)
    b = make_broker(data_dir=b.data_dir, port=b.port)
    wait(lambda: running(api_a, "/"), timeout=4, what="running again")
    wait(lambda: ready(cha, "q1") == 0, what="moved after B's restart")
    cb = connect(b, "/")
    assert [body for body, _ in drain(cb.channel(), "q2")] == first + second
    cb.close()
    ca.close()
