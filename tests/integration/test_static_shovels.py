"""Static shovels: those of the classic config file (`{rabbitmq_shovel, [{shovels, [...]}]}`),
as RabbitMQ 3.10.8 runs them (checked on a private node with the same advanced.config): their
declarations make the queues and bindings before they move anything, `{queue, <<>>}` is the
last queue the source declared, they move between queues of one broker and to and from
another broker, /api/shovels shows them with type "static" and no vhost (to administrators
only), they are no runtime parameters and the API neither deletes nor restarts them, a
complete transfer (delete_after) ends as terminated {shutdown,autodelete} and starts again,
and a bad definition stops the server with the line and the key.

Warren-only: each test starts its brokers with its own config file."""

from functools import partial
import json
import subprocess
import sys
import time

import pika
import pytest

from conftest import EXTERNAL, free_port
from warrenctl_path import WARRENCTL

from .http_api import HttpApi, q
from .http_api import wait_for as wait_until

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="starts its own Warren brokers")

TIMESTAMP = r"\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d"


def start(make_broker, tmp_path, shovels: str, name="rabbitmq.config"):
    """A broker whose config file has these shovels (the text inside `{shovels, [...]}`)."""
    path = tmp_path / name
    path.write_text("[{rabbitmq_shovel, [{shovels, [\n" + shovels + "\n]}]}].\n")
    return make_broker("--config", str(path))


def statuses(broker, auth=("guest", "guest")) -> dict:
    return {s["name"]: s for s in HttpApi(broker.api).ok("GET", "/shovels", auth=auth).json()}


def wait_for(broker, name, state="running", timeout=20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = statuses(broker).get(name)
        if s is not None and s["state"] == state:
            return s
        assert time.monotonic() < deadline, f"shovel {name} not {state}: {s}"
        time.sleep(0.05)


wait = partial(wait_until, timeout=20.0)


def channel(broker):
    return pika.BlockingConnection(broker.pika_params(heartbeat=0)).channel()


def ready(ch, queue) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def get_all(ch, queue, n, timeout=20.0) -> list:
    """n messages from the queue, waiting for them: (method, properties, body) each."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            assert time.monotonic() < deadline, f"{len(out)} of {n} messages in {queue}"
            time.sleep(0.05)
            continue
        out.append((method, props, body))
    return out


MOVING = """
  {moving, [
     {source, [{protocol, amqp091}, {uris, ["amqp://"]},
               {declarations, [{'queue.declare', [{queue, <<"src">>}, durable]}]},
               {queue, <<"src">>}, {prefetch_count, 10}]},
     {destination, [{protocol, amqp091}, {uris, ["amqp://"]},
                    {declarations, [{'queue.declare', [{queue, <<"dst">>}, durable,
                                                       {arguments, [{<<"x-message-ttl">>, long, 60000}]}]}]},
                    {publish_fields, [{exchange, <<"">>}, {routing_key, <<"dst">>}]},
                    {publish_properties, [{delivery_mode, 2}, {app_id, <<"shovelled">>}]},
                    {add_forward_headers, true}, {add_timestamp_header, true}]},
     {ack_mode, on_confirm}, {reconnect_delay, 5}]}"""


def test_a_static_shovel_moves_between_queues_its_declarations_made(make_broker, tmp_path):
    b = start(make_broker, tmp_path, MOVING)
    wait_for(b, "moving")
    api = HttpApi(b.api)
    dst = api.ok("GET", "/queues/%2F/dst").json()
    assert (dst["durable"], dst["arguments"]) == (True, {"x-message-ttl": 60000})
    assert api.ok("GET", "/queues/%2F/src").json()["durable"] is True
    ch = channel(b)
    ch.basic_publish("", "src", b"hello", pika.BasicProperties(headers={"a": 1}))
    (method, props, body), = get_all(ch, "dst", 1)
    assert (body, method.exchange, method.routing_key) == (b"hello", "", "dst")
    assert (props.delivery_mode, props.app_id) == (2, "shovelled")
    cluster = api.ok("GET", "/overview").json()["cluster_name"]
    # rabbit_amqp091_shovel's forward headers of a static shovel: no vhost, no endpoints.
    assert props.headers["x-shovelled"] == [{"shovelled-by": cluster, "shovel-type": "static",
                                             "shovel-name": "moving", "src-uri": "amqp://", "dest-uri": "amqp://"}]
    assert abs(props.headers["x-shovelled-timestamp"] - time.time()) < 60
    assert props.headers["a"] == 1
    assert ready(ch, "src") == 0
    # on_confirm: its consumer acks (prefetch_count 10), on the shovel's own connection.
    consumer, = [c for c in api.ok("GET", "/consumers").json() if c["queue"]["name"] == "src"]
    assert (consumer["ack_required"], consumer["prefetch_count"]) == (True, 10)
    assert consumer["channel_details"]["connection_name"] == "Shovel moving"


def test_its_status_and_what_the_api_does_not_do_with_it(make_broker, tmp_path):
    b = start(make_broker, tmp_path, MOVING + """,
  {broken, [{source, [{uris, ["amqp://"]}, {queue, <<"missing">>}]}, {destination, [{uris, ["amqp://"]}]}]}""")
    api = HttpApi(b.api)
    running = wait_for(b, "moving")
    node = api.ok("GET", "/overview").json()["node"]
    assert running.pop("timestamp")
    assert running == {"node": node, "name": "moving", "type": "static", "state": "running", "src_uri": "amqp://",
                       "src_protocol": "amqp091", "dest_protocol": "amqp091", "dest_uri": "amqp://",
                       "src_queue": "src"}
    # A source queue that does not exist: its consume fails ("needed a restart"), and it
    # tries again after reconnect_delay.
    broken = wait_for(b, "broken", "terminated")
    assert {k: v for k, v in broken.items() if k != "timestamp"} == {
        "node": node, "name": "broken", "type": "static", "state": "terminated", "reason": '"needed a restart"'}
    # No vhost: in no vhost's list, and not found under one.
    assert api.ok("GET", "/shovels/%2F").json() == []
    for method in ("GET", "DELETE"):
        for path in ("/shovels/vhost/%2F/moving", "/shovels/vhost/%2F/moving/restart"):
            api.ok(method, path, status=404)
    assert wait_for(b, "moving")
    # Not a runtime parameter.
    assert api.ok("GET", "/parameters/shovel").json() == []
    assert api.ok("GET", "/definitions").json()["parameters"] == []
    # Only administrators see it (rabbit_shovel_mgmt_util:filter_vhost_user), not a monitoring
    # user with every permission on /.
    api.ok("PUT", "/users/watcher", {"password": "w", "tags": "monitoring"})
    api.ok("PUT", "/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"})
    assert statuses(b, auth=("watcher", "w")) == {}
    api.ok("PUT", "/users/boss", {"password": "b", "tags": "administrator"})
    assert set(statuses(b, auth=("boss", "b"))) == {"moving", "broken"}


@pytest.mark.skipif(WARRENCTL is None, reason="warrenctl is not installed")
def test_warrenctl_shows_it_as_rabbitmqctl_does(make_broker, tmp_path):
    b = start(make_broker, tmp_path, MOVING)
    wait_for(b, "moving")
    r = subprocess.run([WARRENCTL, "--data-dir", b.data_dir, "shovel_status", "--formatter", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    row, = json.loads(r.stdout)
    assert row.pop("last_changed")
    # ShovelStatusCommand's row of a static shovel: no vhost.
    assert row == {"destination": "amqp://", "destination_protocol": "amqp091", "name": "moving",
                   "source": "amqp://", "source_protocol": "amqp091", "source_queue": "src", "state": "running",
                   "termination_reason": "", "type": "static"}
    r = subprocess.run([WARRENCTL, "--data-dir", b.data_dir, "delete_shovel", "moving"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 69 and "was not found" in r.stderr, r


def test_declarations_bind_a_server_named_queue_and_queue_empty_is_it(make_broker, tmp_path):
    b = start(make_broker, tmp_path, """
  {fanned, [
     {source, [{uris, ["amqp://"]},
               {declarations, [{'exchange.declare', [{exchange, <<"fx">>}, {type, <<"fanout">>}]},
                               {'queue.declare', [exclusive]},
                               {'queue.bind', [{exchange, <<"fx">>}]}]},
               {queue, <<>>}]},
     {destination, [{uris, ["amqp://"]},
                    {declarations, ['queue.declare', {'queue.declare', [{queue, <<"out">>}]}]},
                    {publish_fields, [{exchange, <<"">>}, {routing_key, <<"out">>}]}]}]}""")
    assert wait_for(b, "fanned")["src_queue"] == ""
    api = HttpApi(b.api)
    assert api.ok("GET", "/exchanges/%2F/fx").json()["type"] == "fanout"
    binding, = api.ok("GET", "/exchanges/%2F/fx/bindings/source").json()
    own = api.ok("GET", f"/queues/%2F/{q(binding['destination'])}").json()
    assert own["name"].startswith("amq.gen-") and own["exclusive"] is True
    assert binding["routing_key"] == own["name"]  # (an empty key on the last queue is its name)
    ch = channel(b)
    ch.basic_publish("fx", "any", b"fanned")
    (method, props, body), = get_all(ch, "out", 1)
    assert (body, method.routing_key) == (b"fanned", "out")
    # no_ack by default (the current format's ack_mode)
    consumer, = [c for c in api.ok("GET", "/consumers").json() if c["queue"]["name"] == own["name"]]
    assert consumer["ack_required"] is False


def test_the_exclusive_queues_it_declared_go_when_it_stops(make_broker, tmp_path):
    # A destination exchange that does not exist: the first message stops the shovel ("needed
    # a restart"), as its channel is closed; its connection's exclusive queue goes with it and
    # the next start declares another.
    b = start(make_broker, tmp_path, """
  {failing, [{source, [{uris, ["amqp://"]}, {queue, <<>>},
                       {declarations, [{'queue.declare', [exclusive]}, {'queue.bind', [{exchange, <<"amq.fanout">>}]}]}]},
             {destination, [{uris, ["amqp://"]}, {publish_fields, [{exchange, <<"nowhere">>}]}]},
             {reconnect_delay, 1}]}""")
    wait_for(b, "failing")
    api = HttpApi(b.api)

    def own() -> list:
        return [x["name"] for x in api.ok("GET", "/queues/%2F").json() if x["name"].startswith("amq.gen-")]
    first, = own()
    channel(b).basic_publish("amq.fanout", "", b"x")
    # (its first restart is at once: "terminated" is seldom seen)
    second, = wait(lambda: [n for n in own() if n != first], what="a new exclusive queue")
    assert own() == [second]
    assert "Shovel 'failing' is stopping: publishing failed with 404" in b.log()


def test_a_complete_transfer_ends_it_and_it_starts_again(make_broker, tmp_path):
    # delete_after 2: each start moves 2 messages and ends ({shutdown,autodelete}); the
    # supervisor starts it again (at once, then after reconnect_delay), as RabbitMQ's does.
    b = start(make_broker, tmp_path, """
  {counted, [{source, [{uris, ["amqp://"]}, {declarations, [{'queue.declare', [{queue, <<"cq">>}]}]},
                       {queue, <<"cq">>}, {delete_after, 2}]},
             {destination, [{uris, ["amqp://"]}, {declarations, [{'queue.declare', [{queue, <<"cd">>}]}]},
                            {publish_fields, [{routing_key, <<"cd">>}]}]},
             {ack_mode, on_confirm}, {reconnect_delay, 1}]}""")
    wait_for(b, "counted")
    ch = channel(b)
    for i in range(5):
        ch.basic_publish("", "cq", str(i).encode())
    ended = wait_for(b, "counted", "terminated")
    assert ended["reason"] == "{shutdown,autodelete}"
    assert [body for _, _, body in get_all(ch, "cd", 5)] == [b"0", b"1", b"2", b"3", b"4"]
    wait_for(b, "counted")  # (moving 1 of its 2 now)
    assert ready(ch, "cq") == 0


def test_a_static_shovel_to_and_from_another_broker(make_broker, tmp_path):
    other = make_broker()
    remote = f"amqp://guest:guest@127.0.0.1:{other.port}"
    b = start(make_broker, tmp_path, f"""
  {{push, [{{source, [{{uris, ["amqp://"]}}, {{declarations, [{{'queue.declare', [{{queue, <<"out">>}}]}}]}},
                      {{queue, <<"out">>}}]}},
          {{destination, [{{uris, ["{remote}"]}},
                          {{declarations, [{{'queue.declare', [{{queue, <<"arrived">>}}, durable]}}]}},
                          {{publish_fields, [{{exchange, <<"">>}}, {{routing_key, <<"arrived">>}}]}},
                          {{add_forward_headers, true}}]}},
          {{ack_mode, on_confirm}}]}},
  {{pull, [{{source, [{{uris, ["{remote}"]}},
                      {{declarations, [{{'exchange.declare', [{{exchange, <<"feed">>}}, {{type, <<"topic">>}}]}},
                                       {{'queue.declare', [exclusive]}},
                                       {{'queue.bind', [{{exchange, <<"feed">>}}, {{routing_key, <<"#">>}}]}}]}},
                      {{queue, <<>>}}, {{prefetch_count, 5}}]}},
          {{destination, [{{uris, ["amqp://"]}}, {{declarations, [{{'queue.declare', [{{queue, <<"pulled">>}}]}}]}},
                          {{publish_fields, [{{routing_key, <<"pulled">>}}, {{exchange, <<>>}}]}}]}},
          {{ack_mode, on_publish}}]}}""")
    push = wait_for(b, "push")
    assert push["dest_uri"] == f"amqp://127.0.0.1:{other.port}"  # (no credentials)
    wait_for(b, "pull")
    here, there = channel(b), channel(other)
    assert HttpApi(other.api).ok("GET", "/queues/%2F/arrived").json()["durable"] is True
    here.basic_publish("", "out", b"pushed")
    (_, props, body), = get_all(there, "arrived", 1)
    assert body == b"pushed"
    assert props.headers["x-shovelled"][0]["dest-uri"] == f"amqp://127.0.0.1:{other.port}"
    there.basic_publish("feed", "a.b", b"fed")
    (method, _, body), = get_all(here, "pulled", 1)
    assert (body, method.routing_key) == (b"fed", "pulled")
    # The pull's server-named queue is its connection's, named after the shovel.
    queue, = [x for x in HttpApi(other.api).ok("GET", "/queues/%2F").json() if x["name"].startswith("amq.gen-")]
    assert queue["exclusive"] is True
    connection, = [c for c in HttpApi(other.api).ok("GET", "/connections").json()
                   if c["client_properties"].get("connection_name") == "Shovel pull"]
    assert queue["owner_pid_details"]["name"] == connection["name"]


@pytest.mark.parametrize("shovels, line, key, reason", [
    ('{s1, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>},\n {prefetch_count, -1}]}, '
     '{destination, [{uris, ["amqp://"]}]}]}', 3, "rabbitmq_shovel.shovels.s1.source.prefetch_count",
     "expected an integer from 0 to 65535, got -1 (RabbitMQ: require_non_negative_integer)"),
    ('{s1, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations,\n'
     "  [{'queue.declare', [{nonsense, 1}]}]}]}, {destination, [{uris, [\"amqp://\"]}]}]}", 3,
     "rabbitmq_shovel.shovels.s1.source.declarations.'queue.declare'",
     "unknown field nonsense (RabbitMQ: unknown_fields; queue.declare has ticket, queue, passive, durable, "
     "exclusive, auto_delete, nowait, arguments)"),
    ('{s1, [{destination, [{uris, ["amqp://"]}]}, {sources, []}]}', 2, "rabbitmq_shovel.shovels.s1.destination",
     "a shovel with {destination, [...]} needs {source, [...]} too"),
    ('{s1, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}]}, {destination, [{uris, ["amqp://"]}]}]},\n{s1, []}',
     3, "rabbitmq_shovel.shovels.s1", "a second shovel of this name (RabbitMQ: duplicate_shovel_definition)"),
    ('{s1, [{source, [{protocol, amqp10}, {uris, ["amqp://"]}, {queue, <<"q">>}]}, '
     '{destination, [{uris, ["amqp://"]}]}]}', 2, "rabbitmq_shovel.shovels.s1.source.protocol",
     "amqp10 is not supported: Warren's shovels speak AMQP 0-9-1 only"),
])
def test_a_bad_static_shovel_stops_the_server(tmp_path, shovels, line, key, reason):
    # (RabbitMQ's node does not boot either: {invalid_shovel_configuration,s1,...} and the like)
    path = tmp_path / "rabbitmq.config"
    path.write_text("[{rabbitmq_shovel, [{shovels, [\n" + shovels + "\n]}]}].\n")
    result = subprocess.run([sys.executable, "-m", "warren", "server", "--config", str(path), "--data-dir",
                             str(tmp_path / "data"), "--port", str(free_port()), "--management-port", "0"],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"warren: {path}:{line}: {key}: {reason}\n")
