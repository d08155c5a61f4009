"""warrenctl with rabbitmqctl's authority: run without --host/--port/--user on the broker's
machine, it talks to the broker through the control socket in the broker's data directory
and may do anything there, as rabbitmqctl may on its node (purge or delete a queue in a vhost
where no user it knows has permissions). With --host/--port/--user it stays an HTTP client
with a user.

warrenctl finds the data directory as the broker does: --data-dir, else $WARREN_DATA_DIR,
else ~/.local/share/warren. The tests start a broker with --data-dir DIR and run warrenctl
with WARREN_DATA_DIR=DIR and no flags, as a user with that variable set would.

Warren-only (the control socket is Warren's counterpart of the Erlang cookie).
"""

import json
import os
import socket
import stat
import subprocess

import pika
import pytest

from conftest import EXTERNAL, start_broker
from warrenctl_path import WARRENCTL


pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="Warren's control socket: starts its own broker")


def run_ctl(*args, data_dir=None, input=None):
    """warrenctl as a user on the broker's machine runs it: no flags naming a broker."""
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    env = {k: v for k, v in os.environ.items() if k not in ("WARRENCTL_HOST", "WARRENCTL_PORT")}
    if data_dir is not None:
        env["WARREN_DATA_DIR"] = data_dir
    return subprocess.run([WARRENCTL, *args], capture_output=True, text=True, timeout=60, env=env, input=input)


@pytest.fixture(scope="module")
def broker():
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture
def local(broker):
    def ctl(*args, code=0, input=None):
        ctl.verbs.update(a for a in args if not a.startswith("-"))  # (and arguments: a superset)
        r = run_ctl(*args, data_dir=broker.data_dir, input=input)
        assert r.returncode == code, r
        assert "Traceback" not in r.stderr
        if code == 0:
            assert r.stderr == "", r
        return r.stdout
    ctl.verbs = set()
    return ctl


@pytest.fixture
def guarded_vhost(broker, local, uid):
    """A vhost where guest has no permissions, with queue q holding 3 messages, declared by
    alice, who has permissions there (and is the only one)."""
    vhost, user = f"v-{uid}", f"alice-{uid}"
    local("add_vhost", vhost)
    local("add_user", user, "pw")
    local("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    conn = pika.BlockingConnection(broker.pika_params(user=user, password="pw", vhost=vhost))
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    for i in range(3):
        ch.basic_publish("", "q", b"m%d" % i)
    conn.close()
    yield vhost, user
    run_ctl("delete_vhost", vhost, data_dir=broker.data_dir)
    run_ctl("delete_user", user, data_dir=broker.data_dir)


def test_purge_and_delete_queue_where_guest_has_no_permissions(broker, local, guarded_vhost):
    vhost, _ = guarded_vhost
    assert local("list_permissions", "-p", vhost, "-q").splitlines()[1:] == [f"{guarded_vhost[1]}\t.*\t.*\t.*"]
    # Over HTTP as guest (what warrenctl did before the control socket): refused.
    r = run_ctl("--port", str(broker.mgmt_port), "purge_queue", "-p", vhost, "q")
    assert r.returncode == 77 and "authentication failed for user 'guest'" in r.stderr, r

    assert local("-q", "list_queues", "-p", vhost, "name", "messages").splitlines()[1:] == ["q\t3"]
    assert local("purge_queue", "-p", vhost, "q") == f"Purging queue 'q' in vhost '{vhost}' ...\n"
    assert local("-q", "list_queues", "-p", vhost, "name", "messages").splitlines()[1:] == ["q\t0"]
    assert local("delete_queue", "-p", vhost, "q").splitlines() == [
        f"Deleting queue 'q' on vhost '{vhost}' ...", "Queue was successfully deleted with 0 ready messages"]
    assert local("-q", "list_queues", "-p", vhost).splitlines()[1:] == []
    # And the errors stay rabbitmqctl's.
    r = run_ctl("delete_queue", "-p", vhost, "q", data_dir=broker.data_dir)
    assert r.returncode == 64 and r.stderr.strip() == "Error:\nQueue not found", r


def test_every_verb_without_flags(broker, local, guarded_vhost, uid, tmp_path):
    vhost, user = guarded_vhost
    conn = pika.BlockingConnection(broker.pika_params(user=user, password="pw", vhost=vhost))
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "topic")
    ch.queue_bind("q", f"x-{uid}", "a.#")
    ch.basic_consume("q", lambda *a: None, consumer_tag=f"c-{uid}")
    ch.queue_declare("q2")
    ch.basic_publish("", "q2", b"x")
    try:
        local("purge_queue", "-p", vhost, "q2")
        local("delete_queue", "-p", vhost, "q2")
        assert "q\t3" in local("list_queues", "-p", vhost, "name", "messages")
        assert f"x-{uid}\ttopic" in local("list_exchanges", "-p", vhost)
        assert f"x-{uid}\texchange\tq\tqueue\ta.#" in local("list_bindings", "-p", vhost)
        assert f"c-{uid}" in local("list_consumers", "-p", vhost)
        assert user in local("list_connections", "user")
        assert user in local("list_channels", "user")
        name = [line.split("\t")[1] for line in local("-q", "list_connections", "user", "name").splitlines()
                if line.startswith(user + "\t")][0]
        assert f"{user}\t[]" in local("list_users")
        assert vhost in local("list_vhosts").splitlines()
        assert f"{vhost}\t.*\t.*\t.*" in local("list_user_permissions", user)
        assert "Status of node" in local("status")
        node = json.loads(local("cluster_status", "--formatter", "json"))["running_nodes"][0]
        local("forget_cluster_node", node, code=69)  # a node alone: itself runs (tests/cluster: a cluster)
        local("set_policy", "-p", vhost, "p", "^q$", '{"alternate-exchange":"ae"}', "--apply-to", "queues")
        assert "\tp\t^q$\tqueues" in local("list_policies", "-p", vhost)
        local("clear_policy", "-p", vhost, "p")
        local("set_operator_policy", "-p", vhost, "op", "^q$", '{"max-length":10}', "--apply-to", "queues")
        assert "\top\t^q$" in local("list_operator_policies", "-p", vhost)
        local("clear_operator_policy", "-p", vhost, "op")
        local("set_user_tags", user, "monitoring")
        local("change_password", user, "pw2")
        local("close_connection", name, "bye")
        defs = json.loads(local("export_definitions", "-"))
        path = tmp_path / "defs.json"
        path.write_text(json.dumps(defs))
        assert local("import_definitions", str(path)).endswith("Successfully imported definitions.\n")
        local("set_topic_permissions", "-p", vhost, user, f"x-{uid}", "^a", "^b")
        assert f"{user}\tx-{uid}\t^a\t^b" in local("list_topic_permissions", "-p", vhost)
        assert f"{vhost}\tx-{uid}\t^a\t^b" in local("list_user_topic_permissions", user)
        local("clear_topic_permissions", "-p", vhost, user)
        local("set_vhost_limits", "-p", vhost, '{"max-queues": 100}')
        assert local("-q", "list_vhost_limits", "-p", vhost) == '{"max-queues":100}\n'
        assert f'{vhost}\t{{"max-queues":100}}' in local("list_vhost_limits", "--global")
        local("clear_vhost_limits", "-p", vhost)
        local("set_vhost_missing_exchange", "-p", vhost, f"x-{uid}")  # Warren's capture exchange
        assert f"{vhost}\tx-{uid}" in local("list_vhosts", "name", "missing_exchange")
        local("clear_vhost_missing_exchange", "-p", vhost)
        local("set_user_limits", user, '{"max-channels": 10}')
        assert local("-q", "list_user_limits", "--user", user) == '{"max-channels":10}\n'
        local("clear_user_limits", user, "all")
        local("set_parameter", "-p", vhost, "vhost-limits", "limits", '{"max-connections": 5}')
        assert 'vhost-limits\tlimits\t{"max-connections":5}' in local("list_parameters", "-p", vhost)
        local("clear_parameter", "-p", vhost, "vhost-limits", "limits")
        shovel = f"s-{uid}"  # (the shovel plugin's verbs: tests/integration/test_ctl_shovels.py)
        local("set_parameter", "-p", vhost, "shovel", shovel, json.dumps(
            {"src-uri": f"amqp:///{vhost}", "src-queue": f"sq-{uid}", "dest-uri": f"amqp:///{vhost}",
             "dest-queue": f"dq-{uid}"}))
        assert f"\t{shovel}\t" in local("shovel_status")
        local("restart_shovel", "-p", vhost, shovel)
        local("delete_shovel", "-p", vhost, shovel)
        assert f"\t{shovel}\t" not in local("shovel_status")
        # (the federation plugin's verbs: tests/integration/test_federation_links.py)
        assert "Listing federation links" in local("federation_status")
        local("restart_federation_link", "nope", code=69)  # ("Link with the given ID was not found")
        local("set_global_parameter", f"g-{uid}", '"x"')
        assert f'g-{uid}\t"x"' in local("list_global_parameters")
        local("clear_global_parameter", f"g-{uid}")
        local("set_cluster_name", f"c-{uid}")
        local("set_vm_memory_high_watermark", "0.4")
        local("set_disk_free_limit", "50MB")
        assert f'cluster_name\t"c-{uid}"' in local("list_global_parameters")
        queue_verbs_on_a_node_alone(broker, local, uid)
        local("clear_permissions", "-p", vhost, user)
        assert local("-q", "list_permissions", "-p", vhost).splitlines()[1:] == []
        assert local("help", "purge_queue").startswith("Usage")
    finally:
        if conn.is_open:
            try:
                conn.close()
            except pika.exceptions.AMQPError:
                pass
    # The control socket is nobody: it is never given permissions (rabbitmqctl's add_vhost
    # grants none) and appears nowhere in the definitions.
    local("add_vhost", f"w-{uid}")
    assert local("-q", "list_permissions", "-p", f"w-{uid}").splitlines()[1:] == []
    assert "rmq-cli" not in local("export_definitions", "-")
    local("delete_vhost", f"w-{uid}")
    local("delete_user", user)
    # Every verb warrenctl has was run above, through the socket.
    help_lines = local("help").split("Available commands:")[1].split("Global options")[0].splitlines()
    verbs = {line.split()[0] for line in help_lines if line.strip()}
    assert len(verbs) > 40 and verbs <= local.verbs, verbs - local.verbs


def queue_verbs_on_a_node_alone(broker, local, uid):
    """rabbitmq-queues' verbs on a node alone, whose quorum queues have one member, this node:
    RabbitMQ 3.10's answers on a single node (checked there), but quorum_status, refused (such
    a queue keeps no replicated log)."""
    qq = f"qq-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(qq, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    out = run_ctl("add_member", qq, "rabbit@nowhere", data_dir=broker.data_dir)
    assert (out.returncode, out.stdout, out.stderr) == (
        69, f"Adding a replica for queue {qq} on node rabbit@nowhere...\n", "Error:\nnode_not_running\n"), out
    local.verbs.add("add_member")
    assert local("delete_member", qq, "zz@x") == f"Removing a replica of queue {qq} on node zz@x...\n"
    assert local("shrink", "zz@x") == "Shrinking quorum queues on zz@x...\n\n"
    assert local("grow", "zz@x", "all") == "Growing all quorum queues on zz@x...\n\n"
    assert local("rebalance", "classic") == (
        "Re-balancing leaders of classic queues...\n┌────────┐\n│ Output │\n├────────┤\n│ []     │\n└────────┘\n")
    out = local("check_if_node_is_quorum_critical")
    assert out.endswith(" seems to be the only one in a single node cluster, the check does not apply\n"), out
    assert json.loads(local("check_if_node_is_quorum_critical", "--formatter", "json")) == {
        "message": "Target node seems to be the only one in a single node cluster, the check does not apply",
        "result": "ok"}
    out = run_ctl("quorum_status", qq, data_dir=broker.data_dir)
    assert out.returncode == 69 and out.stderr.startswith(f"Error:\nqueue '{qq}' in vhost '/' has a single member"), out
    local.verbs.add("quorum_status")
    node = out.stdout.split(" on node ")[1].split(" ...")[0]
    out = run_ctl("delete_member", qq, node, data_dir=broker.data_dir)
    assert (out.returncode, out.stderr) == (69, "Error:\nlast_node\n"), out
    # rabbitmq-streams' verbs: a stream alone has one replica too.
    sq = f"sq-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(sq, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    out = run_ctl("add_replica", sq, "rabbit@nowhere", data_dir=broker.data_dir)
    assert (out.returncode, out.stdout, out.stderr) == (
        69, f"Adding a replica for queue {sq} on node rabbit@nowhere...\n", "Error:\nnode_not_running\n"), out
    out = run_ctl("delete_replica", sq, node, data_dir=broker.data_dir)
    assert (out.returncode, out.stdout, out.stderr) == (
        69, f"Removing a replica of queue {sq} on node {node}...\n",
        "Error:\nCannot delete the last member of a stream\n"), out
    local.verbs.update(("add_replica", "delete_replica"))


def test_control_socket_is_the_brokers_users_only(broker):
    path = os.path.join(broker.data_dir, "warren-ctl.sock")
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    # Nothing else is left in the data dir by the way it was made.
    assert not [n for n in os.listdir(broker.data_dir) if n.startswith(".wc")]


def test_remote_style_invocations_use_http_with_a_user(broker, local):
    r = run_ctl("--user", "guest", "--password", "bad", "list_queues", data_dir=broker.data_dir)
    # --user alone means the API over TCP: 127.0.0.1:15672 here, where this broker is not.
    assert r.returncode in (69, 77) and "127.0.0.1:15672" in r.stderr, r
    r = run_ctl("--port", str(broker.mgmt_port), "--user", "guest", "--password", "bad", "list_queues",
                data_dir=broker.data_dir)
    assert r.returncode == 77, r
    assert r.stderr.startswith(f"Error: authentication failed for user 'guest' at 127.0.0.1:{broker.mgmt_port}")
    # A request on the socket with bad credentials is still trusted: it never looks at them.
    assert local("list_vhosts")


def test_socket_lifecycle_and_fallback(tmp_path):
    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    path = os.path.join(data_dir, "warren-ctl.sock")
    # A stale socket, as a SIGKILLed broker leaves it: warrenctl falls back to the API on
    # 127.0.0.1:15672 (not this broker's port, so it fails there) ...
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    r = run_ctl("list_vhosts", data_dir=data_dir)
    assert r.returncode in (69, 77) and "127.0.0.1:15672" in r.stderr and "Traceback" not in r.stderr, r
    # ... and the broker replaces it at start,
    b = start_broker(data_dir=data_dir)
    try:
        r = run_ctl("-q", "list_vhosts", data_dir=data_dir)
        assert (r.returncode, r.stdout) == (0, "name\n/\n"), r
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        b.stop()
    # ... and removes it at stop.
    assert not os.path.exists(path)
    r = run_ctl("list_vhosts", data_dir=data_dir)
    assert r.returncode in (69, 77) and "127.0.0.1:15672" in r.stderr, r
    # --data-dir names another broker's directory, as WARREN_DATA_DIR does.
    b = start_broker(data_dir=data_dir)
    try:
        r = run_ctl("--data-dir", data_dir, "-q", "list_vhosts", data_dir=str(tmp_path))
        assert (r.returncode, r.stdout) == (0, "name\n/\n"), r
    finally:
        b.stop()


def test_control_socket_without_the_tcp_api(make_broker):
    """rabbitmqctl needs no management plugin: warrenctl works with the API's port off."""
    b = make_broker("--management-port", "0")
    r = run_ctl("-q", "list_vhosts", data_dir=b.data_dir)
    assert (r.returncode, r.stdout) == (0, "name\n/\n"), r
    r = run_ctl("status", data_dir=b.data_dir)
    assert r.returncode == 0 and f"port: {b.port}, protocol: amqp" in r.stdout, r
    assert "protocol: http" not in r.stdout
