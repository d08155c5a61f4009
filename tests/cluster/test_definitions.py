"""Definitions on every node: vhosts, users, permissions, topic permissions, policies,
exchanges and bindings made through any node (HTTP API, AMQP) are on every node within a
second, and on a node that was stopped once it is back; concurrent conflicting changes on two
nodes end the same on all; a node cut from etcd's majority changes nothing and says why;
queues are refused on a cluster, for now, with a clear error."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid

import pika
import pika.exceptions
import pytest
import requests

from conftest import free_port, scratch_dir, start_broker

from .conftest import cluster_conf, dist_lines
from .test_membership import nodes, wait_for

AUTH = ("guest", "guest")


def get(node, path: str):
    answer = requests.get(node.api + path, auth=AUTH, timeout=30)
    answer.raise_for_status()
    return answer.json()


def put(node, path: str, body: dict | None = None) -> int:
    return requests.put(node.api + path, json=body or {}, auth=AUTH, timeout=30).status_code


def exchanges(node, vhost: str = "%2F") -> dict[str, str]:
    return {x["name"]: x["type"] for x in get(node, f"/exchanges/{vhost}") if not x["name"].startswith("amq.")
            and x["name"]}


@pytest.fixture
def three(make_node):
    started = [make_node(f"warren-{n}@localhost") for n in "abc"]
    names = {node.name: True for node in started}
    for node in started:
        wait_for(lambda: nodes(node) == names, what="three running")
    return started


def test_made_on_one_node_seen_on_all(three):
    a, b, c = three
    assert put(a, "/vhosts/shared") == 201
    assert put(b, "/users/alice", {"password": "secret", "tags": "monitoring"}) == 201
    assert put(c, "/permissions/shared/alice", {"configure": ".*", "write": ".*", "read": "^r"}) == 201
    assert put(a, "/topic-permissions/shared/alice", {"exchange": "amq.topic", "write": "w.*", "read": "r.*"}) == 201
    assert put(b, "/policies/shared/ttl", {"pattern": "^q", "definition": {"message-ttl": 1000}}) == 201
    started = time.monotonic()
    for node in three:
        wait_for(lambda: "shared" in {v["name"] for v in get(node, "/vhosts")}, timeout=1, what="the vhost")
        wait_for(lambda: any(u["name"] == "alice" and u["tags"] == ["monitoring"] for u in get(node, "/users")),
                 timeout=1, what="the user")
        wait_for(lambda: [(p["configure"], p["read"]) for p in get(node, "/users/alice/permissions")]
                 == [(".*", "^r")], timeout=1, what="the permission")
        wait_for(lambda: [p["write"] for p in get(node, "/topic-permissions/shared/alice")] == ["w.*"], timeout=1,
                 what="the topic permission")
        wait_for(lambda: [p["definition"] for p in get(node, "/policies/shared")] == [{"message-ttl": 1000}],
                 timeout=1, what="the policy")
    assert time.monotonic() - started < 3
    # alice logs in on a node she was not made on, with what was made on another.
    connection = pika.BlockingConnection(c.pika_params(user="alice", password="secret", vhost="shared"))
    connection.close()


class SlowWatch:
    """A TCP proxy to an etcd member that holds what etcd sends back DELAY seconds: a node
    behind it learns every change of the metadata log that much later than the others."""

    DELAY = 0.2

    def __init__(self, endpoint: str):
        host, _, port = endpoint.rpartition("//")[2].partition(":")
        self.target = (host, int(port))
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.endpoints = [f"127.0.0.1:{self.port}"]

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay: float) -> None:
            while data := await source.read(65536):
                if delay:
                    self.loop.call_later(delay, sink.write, data)  # (in order: later reads, later times)
                else:
                    sink.write(data)
            self.loop.call_later(delay, sink.close)
        await asyncio.gather(pump(reader, up_writer, 0), pump(up_reader, writer, self.DELAY),
                             return_exceptions=True)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_change_answered_through_one_node_is_on_every_node(make_node, etcd):
    """Read-your-writes across nodes, as in RabbitMQ (whose metadata transactions commit on
    every node): once declare-ok is back from a, b and c have the exchange, even c, which hears
    of every change from etcd 0.2 s after the others."""
    slow = SlowWatch(etcd.endpoints[0])
    try:
        a, b = make_node("warren-a@localhost"), make_node("warren-b@localhost")
        c = make_node("warren-c@localhost", on=slow)
        for node in (a, b, c):
            wait_for(lambda: nodes(node) == {n.name: True for n in (a, b, c)}, what="three running")
        wait_for(lambda: all(requests.get(n.api + "/overview", auth=AUTH, timeout=30).ok for n in (a, b, c)),
                 what="three serving")
        linked(a, b)
        linked(a, c)
        writer = pika.BlockingConnection(a.pika_params())
        readers = [pika.BlockingConnection(node.pika_params()) for node in (b, c)]
        try:
            out = writer.channel()
            ins = [reader.channel() for reader in readers]
            for n in range(5):
                out.exchange_declare(f"ryw-{n}", "fanout")
                for channel in ins:
                    channel.exchange_declare(f"ryw-{n}", passive=True)  # (a 404 closes it: the test fails)
                out.exchange_delete(f"ryw-{n}")
                assert requests.get(f"{c.api}/exchanges/%2F/ryw-{n}", auth=AUTH, timeout=30).status_code == 404
        finally:
            for connection in (writer, *readers):
                connection.close()
    finally:
        slow.stop()


def linked(node, other) -> None:
    """Wait until `node` has its node link to `other` up (a queue of other's answers through it)."""
    connection = pika.BlockingConnection(other.pika_params())
    connection.channel().queue_declare(f"probe-{other.name}", auto_delete=False)
    connection.close()

    def answers() -> bool:
        probe = pika.BlockingConnection(node.pika_params())
        try:
            probe.channel().queue_declare(f"probe-{other.name}", passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker:
            return False
        finally:
            if probe.is_open:
                probe.close()
    wait_for(answers, timeout=10, what=f"{node.name}'s link to {other.name}")


def test_a_stopped_member_holds_a_change_a_second_at_most(three):
    """A member that does not answer (SIGSTOP) holds a change's answer for at most a second,
    and not at all once its lease has run out (it is then not running)."""
    a, b, c = three
    linked(a, c)
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    try:
        c.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        channel.exchange_declare("while-c-sleeps", "fanout")
        assert 0.9 < time.monotonic() - started < 3
        wait_for(lambda: nodes(a)[c.name] is False, timeout=15, what="c's lease to run out")
        started = time.monotonic()
        channel.exchange_declare("after-its-lease", "fanout")
        assert time.monotonic() - started < 0.5
    finally:
        c.proc.send_signal(signal.SIGCONT)
        connection.close()
    wait_for(lambda: {"while-c-sleeps", "after-its-lease"} <= set(exchanges(c)), timeout=10, what="c catching up")


def test_a_queue_refused_for_its_arguments_is_on_no_node(three):
    """The declaring node refuses a queue's arguments (406): the other nodes made nothing
    either (they check the arguments as its home does)."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        connection.channel().queue_declare("bad-args", arguments={"x-max-length": "many"})
    assert refused.value.reply_code == 406
    connection.close()
    for node in (a, b, c):
        assert requests.get(f"{node.api}/queues/%2F/bad-args", auth=AUTH, timeout=30).status_code == 404, node.name


def test_exchanges_and_bindings_over_amqp(three):
    a, b, c = three
    connection = pika.BlockingConnection(b.pika_params())
    channel = connection.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.exchange_declare("audit", "fanout")
    channel.exchange_bind("audit", "orders", "eu.#")
    for node in three:
        wait_for(lambda: exchanges(node) == {"orders": "topic", "audit": "fanout"}, timeout=1, what="exchanges")
        wait_for(lambda: [(x["source"], x["destination"], x["routing_key"]) for x in get(node, "/bindings/%2F")
                          if x["source"]] == [("orders", "audit", "eu.#")], timeout=1, what="the binding")
    # An inequivalent redeclare through another node is refused as on one node.
    other = pika.BlockingConnection(c.pika_params()).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        other.exchange_declare("orders", "direct", durable=True)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == ("PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'orders' in "
                                       "vhost '/': received 'direct' but current is 'topic'")
    channel.exchange_unbind("audit", "orders", "eu.#")
    channel.exchange_delete("audit")
    for node in three:
        wait_for(lambda: exchanges(node) == {"orders": "topic"}, timeout=1, what="the deletion")
    connection.close()


def test_conflicting_declares_on_two_nodes_end_the_same_everywhere(three):
    a, b, c = three
    outcomes: dict[str, str] = {}

    def declare(node, kind: str) -> None:
        channel = pika.BlockingConnection(node.pika_params()).channel()
        try:
            for i in range(20):
                channel.exchange_declare(f"race-{i}", kind)
            outcomes[kind] = "all"
        except pika.exceptions.ChannelClosedByBroker as err:
            outcomes[kind] = str(err.reply_code)
    threads = [threading.Thread(target=declare, args=(a, "topic")), threading.Thread(target=declare, args=(b, "fanout"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()) in (["406", "all"], ["406", "406"])
    views = [exchanges(node) for node in three]
    assert views[0] == views[1] == views[2] and views[0]


def test_a_node_that_was_down_gets_what_changed_meanwhile(three, make_node):
    a, b, c = three
    assert put(a, "/vhosts/before") == 201
    wait_for(lambda: "before" in {v["name"] for v in get(c, "/vhosts")}, timeout=2, what="before on c")
    c.stop(signal.SIGTERM)
    assert put(a, "/vhosts/meanwhile") == 201
    assert requests.delete(b.api + "/vhosts/before", auth=AUTH, timeout=30).status_code == 204
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().exchange_declare("made-meanwhile", "direct", durable=True)
    connection.close()
    back = make_node(c.name, data_dir=c.data_dir, port=c.port)
    wait_for(lambda: {"meanwhile", "/"} <= {v["name"] for v in get(back, "/vhosts")}, timeout=5, what="meanwhile")
    assert "before" not in {v["name"] for v in get(back, "/vhosts")}
    assert exchanges(back) == {"made-meanwhile": "direct"}


def test_a_restarted_node_keeps_the_clusters_transient_exchanges_and_bindings(three, make_node):
    """A member's own copy of the tables holds what other nodes' clients made, transient or
    not: a restarted node routes through a transient exchange and to another node's transient
    queue as the others do (RabbitMQ's nodes keep them while any node runs)."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.exchange_declare("passing", "fanout", durable=False)
    channel.queue_declare("passing-q", durable=False)
    channel.queue_bind("passing-q", "passing")
    channel.queue_bind("passing-q", "amq.direct", routing_key="k")
    wait_for(lambda: "passing" in exchanges(c), timeout=2, what="the exchange on c")
    c.stop(signal.SIGTERM)
    back = make_node(c.name, data_dir=c.data_dir, port=c.port, dist_port=c.dist_port)
    wait_for(lambda: nodes(back) == {n.name: True for n in (a, b, back)}, what="c back")
    assert exchanges(back).get("passing") == "fanout"
    publisher = pika.BlockingConnection(back.pika_params())
    try:
        out = publisher.channel()
        out.confirm_delivery()
        out.basic_publish("passing", "", b"one", mandatory=True)
        out.basic_publish("amq.direct", "k", b"two", mandatory=True)  # (unroutable: a return, an exception)
    finally:
        publisher.close()
    wait_for(lambda: channel.queue_declare("passing-q", passive=True).method.message_count == 2, timeout=5,
             what="both messages in the queue")
    connection.close()


def test_cut_from_etcds_majority_a_node_changes_nothing(make_node, make_etcd):
    own = make_etcd(3)
    a = make_node("warren-a@localhost", on=own)
    wait_for(lambda: nodes(a) == {a.name: True}, what="a registered")
    for member in own.members[1:]:
        member.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        answer = requests.put(a.api + "/vhosts/lost", auth=AUTH, timeout=60)
        assert answer.status_code == 503
        assert answer.json() == {"error": "service_unavailable",
                                 "reason": "the cluster's metadata store (etcd) did not answer in time"}
        assert time.monotonic() - started < 30
    finally:
        for member in own.members[1:]:
            member.signal(signal.SIGCONT)
    own.wait_healthy()
    assert put(a, "/vhosts/after") == 201
    assert "after" in {v["name"] for v in get(a, "/vhosts")}


def test_limits_and_parameters_on_every_node(three):
    a, b, c = three
    assert put(a, "/vhost-limits/%2F/max-connections", {"value": 50}) == 204
    assert put(b, "/user-limits/guest/max-channels", {"value": 20}) == 204
    assert put(c, "/global-parameters/colour", {"value": "blue"}) == 201
    assert put(a, "/operator-policies/%2F/cap", {"pattern": "^x", "definition": {"max-length": 10},
                                                 "apply-to": "queues"}) == 201
    for node in three:
        wait_for(lambda: [v["value"] for v in get(node, "/vhost-limits/%2F")] == [{"max-connections": 50}],
                 timeout=1, what="the vhost limit")
        wait_for(lambda: [v["value"] for v in get(node, "/user-limits/guest")] == [{"max-channels": 20}],
                 timeout=1, what="the user limit")
        wait_for(lambda: any(p["name"] == "colour" and p["value"] == "blue" for p in get(node, "/global-parameters")),
                 timeout=1, what="the global parameter")
        wait_for(lambda: [p["name"] for p in get(node, "/operator-policies/%2F")] == ["cap"], timeout=1,
                 what="the operator policy")


def test_shovel_and_federation_definitions_set_through_one_member_are_on_every_member(three):
    """(Each shovel and link runs on one member: tests/cluster/test_links.py.)"""
    a = three[0]
    shovel = {"value": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}}
    assert requests.put(a.api + "/parameters/shovel/%2F/s", json=shovel, auth=AUTH, timeout=30).status_code == 201
    upstream = {"value": {"uri": "amqp://elsewhere"}}
    answer = requests.put(a.api + "/parameters/federation-upstream/%2F/up", json=upstream, auth=AUTH, timeout=30)
    assert answer.status_code == 201
    answer = requests.put(a.api + "/policies/%2F/fed", json={"pattern": "^f", "definition": {
        "federation-upstream-set": "all"}}, auth=AUTH, timeout=30)
    assert answer.status_code == 201
    for node in three:
        parameters = requests.get(node.api + "/parameters", auth=AUTH, timeout=30).json()
        assert sorted((p["component"], p["name"]) for p in parameters) == [("federation-upstream", "up"),
                                                                            ("shovel", "s")], node.name
        assert [p["name"] for p in requests.get(node.api + "/policies", auth=AUTH, timeout=30).json()] == ["fed"]
    requests.delete(a.api + "/parameters/shovel/%2F/s", auth=AUTH, timeout=30)


def test_a_new_member_takes_the_clusters_definitions_not_its_own_defaults(make_node):
    """As a RabbitMQ node that joins a cluster: the first node's defaults are the cluster's; a
    node that joins later makes no guest of its own (one deleted stays deleted), and every node
    has the same internal cluster id."""
    a = make_node("warren-a@localhost", "default_user = admin", "default_pass = s3cret")
    wait_for(lambda: [u["name"] for u in requests.get(a.api + "/users", auth=("admin", "s3cret")).json()] == ["admin"]
             if requests.get(a.api + "/users", auth=("admin", "s3cret")).ok else False, what="the defaults")
    b = make_node("warren-b@localhost")  # its own defaults would be guest/guest
    admin = ("admin", "s3cret")
    wait_for(lambda: requests.get(b.api + "/users", auth=admin).ok, what="b has the cluster's users")
    assert [u["name"] for u in requests.get(b.api + "/users", auth=admin).json()] == ["admin"]
    assert requests.get(b.api + "/users", auth=AUTH).status_code == 401
    ids = {requests.get(n.api + "/global-parameters/internal_cluster_id", auth=admin).json()["value"] for n in (a, b)}
    assert len(ids) == 1 and ids.pop().startswith("rabbitmq-cluster-id-")


def test_the_aliveness_test_passes_through_every_node(three):
    """It declares a queue, publishes to it and gets the message back: on a cluster too, where
    the queue lives on the first node that declared it."""
    for node in three:
        answer = requests.get(node.api + "/aliveness-test/%2F", auth=AUTH, timeout=30)
        assert answer.json() == {"status": "ok"}, node.name


def test_members_started_with_a_definitions_file_import_it_through_the_log(etcd):
    """As RabbitMQ's load_definitions: each member started with the file imports it (through
    the cluster's log, before it serves); what exists is kept, so the queue lives on the first
    member that imported it. A file that cannot be imported stops the member, as a node alone."""
    directory = scratch_dir("warren-cluster-start-")
    path = os.path.join(directory, "definitions.json")
    with open(path, "w") as f:
        f.write('{"vhosts": [{"name": "v"}], "queues": [{"name": "bootq", "vhost": "v", "durable": true}]}')
    prefix = "t-definitions-" + uuid.uuid4().hex[:8]
    started = []

    def start(name: str):
        conf = cluster_conf(etcd.endpoints, prefix, *dist_lines(free_port()))
        return start_broker("--node-name", name, "--config", conf, "--definitions", path, "--prometheus-port", "0")
    try:
        for name in ("warren-a@localhost", "warren-b@localhost"):
            started.append(start(name))
        for node in started:
            assert [(q["name"], q["node"]) for q in get(node, "/queues/v")] == [("bootq", "warren-a@localhost")]
        with open(path, "w") as f:
            f.write('{"queues": [{"name": "q", "vhost": "nowhere"}]}')
        with pytest.raises(RuntimeError, match="cannot load definitions .*: unknown vhost 'nowhere'"):
            started.append(start("warren-c@localhost"))
    finally:
        for node in started:
            node.stop(signal.SIGKILL)


def test_frames_pipelined_after_a_change_wait_for_it(three):
    """A declare with nowait and a passive declare of the same exchange, written at once: the
    passive one is handled only once the change has gone through the cluster's log (404
    otherwise)."""
    import rawamqp
    from pamqp import commands
    raw = rawamqp.connect(three[1])
    raw.open_channel(1)
    raw.send(rawamqp.frame(rawamqp.FRAME_METHOD, 1, rawamqp.method_payload(
        commands.Exchange.Declare(exchange="pipelined", exchange_type="fanout", nowait=True)))
        + rawamqp.frame(rawamqp.FRAME_METHOD, 1, rawamqp.method_payload(
            commands.Exchange.Declare(exchange="pipelined", exchange_type="fanout", passive=True))))
    raw.expect(commands.Exchange.DeclareOk, channel=1, timeout=10)
    raw.close()
