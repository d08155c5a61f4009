"""warrenctl, the rabbitmqctl of Warren: the installed command run as a subprocess against a
real broker's management API, checking its output (rabbitmqctl 3.10's informational lines,
columns and table format), its exit codes and that its changes take effect for AMQP clients.

Warren-only by default (a Warren broker per module; the definitions round trip starts its
own). To check warrenctl and these tests against RabbitMQ's management plugin, set
WARREN_TEST_BROKER=host:amqp_port and WARREN_TEST_MGMT_PORT=its management port (RabbitMQ's
statistics lag by a few seconds, so listings are polled).
"""

import json
import os
import socket
import subprocess
import time

import pika
import pytest

from conftest import EXTERNAL, BrokerProcess, free_port, start_broker
from warrenctl_path import WARRENCTL

MGMT_PORT = os.environ.get("WARREN_TEST_MGMT_PORT")
ANY_ACCESS = (".*", ".*", ".*")


@pytest.fixture(scope="module")
def ctl_broker():
    if EXTERNAL:
        if not MGMT_PORT:
            pytest.skip("needs a management API: set WARREN_TEST_MGMT_PORT with WARREN_TEST_BROKER")
        host, port = EXTERNAL.rsplit(":", 1)
        yield BrokerProcess(host, int(port), mgmt_port=int(MGMT_PORT))
        return
    b = start_broker()
    yield b
    b.stop()


def ctl(broker_or_port, *args, input=None, user=None, password=None):
    """Run the installed warrenctl; returns the CompletedProcess (text)."""
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    port = broker_or_port if isinstance(broker_or_port, int) else broker_or_port.mgmt_port
    cmd = [WARRENCTL, "--port", str(port)]
    if user is not None:
        cmd += ["--user", user, "--password", password]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, input=input)


def ok(broker, *args, **kw) -> str:
    r = ctl(broker, *args, **kw)
    assert (r.returncode, r.stderr) == (0, ""), r
    return r.stdout


def fails(broker, code, *args, **kw):
    r = ctl(broker, *args, **kw)
    assert r.returncode == code, r
    assert "Traceback" not in r.stderr + r.stdout
    return r


def eventually(check, timeout=None):
    """check() until it returns a true value (statistics lag on RabbitMQ; Warren's are live)."""
    deadline = time.monotonic() + (timeout or (15 if EXTERNAL else 3))
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got
            return got
        time.sleep(0.2)


def lines(out: str) -> list:
    return out.splitlines()


def rows(broker, *args) -> list:
    """The table rows of a listing (no informational line, no header), as lists of cells."""
    return [line.split("\t") for line in lines(ok(broker, *args, "--silent")) if line]


def connect(broker, user="guest", password="guest", vhost="/", **kw):
    return pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.port, virtual_host=vhost, credentials=pika.PlainCredentials(user, password), **kw))


def local_port(conn) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def connection_name(broker, conn) -> str:
    return f"127.0.0.1:{local_port(conn)} -> 127.0.0.1:{broker.port}"


@pytest.fixture
def amqp(ctl_broker):
    conn = connect(ctl_broker)
    yield conn
    if conn.is_open:
        conn.close()


# --- listings ---------------------------------------------------------------------------------

def test_list_queues_default_columns_and_output_options(ctl_broker, amqp, uid):
    ch = amqp.channel()
    ch.confirm_delivery()
    name = f"ctl-q-{uid}"
    ch.queue_declare(name, arguments={"x-max-length": 10})
    try:
        for _ in range(2):
            ch.basic_publish("", name, b"m")
        out = eventually(lambda: (lambda o: o if f"{name}\t2" in lines(o) else None)(ok(ctl_broker, "list_queues")))
        assert lines(out)[:3] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ...", "name\tmessages"]
        # Chosen columns, in the order given, values in rabbitmqctl's style.
        assert [f"{name}\t2\t0\tfalse\tfalse\tfalse\t[{{\"x-max-length\",10}}]"] == [
            line for line in lines(ok(ctl_broker, "list_queues", "name", "messages_ready", "messages_unacknowledged",
                                      "durable", "auto_delete", "exclusive", "arguments"))
            if line.startswith(name + "\t")]
        quiet = lines(ok(ctl_broker, "-q", "list_queues"))
        assert quiet[0] == "name\tmessages" and f"{name}\t2" in quiet
        no_headers = lines(ok(ctl_broker, "list_queues", "--no-table-headers"))
        assert no_headers[:2] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ..."]
        assert "name\tmessages" not in no_headers and f"{name}\t2" in no_headers
        assert [name, "2"] in rows(ctl_broker, "list_queues")
        listed = json.loads(ok(ctl_broker, "list_queues", "--formatter", "json"))
        assert {"name": name, "messages": 2} in listed
        listed = json.loads(ok(ctl_broker, "list_queues", "name", "durable", "arguments", "--formatter=json"))
        assert {"name": name, "durable": False, "arguments": {"x-max-length": 10}} in listed
    finally:
        ch.queue_delete(name)


def test_list_exchanges_and_bindings(ctl_broker, amqp, uid):
    ch = amqp.channel()
    ex, name = f"ctl-x-{uid}", f"ctl-bq-{uid}"
    ch.exchange_declare(ex, "topic")
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, ex, "a.#")
    ch.queue_bind(name, "amq.headers", "", arguments={"x-match": "all", "a": 1})
    try:
        out = lines(ok(ctl_broker, "list_exchanges"))
        assert out[:2] == ["Listing exchanges for vhost / ...", "name\ttype"]
        for row in (f"{ex}\ttopic", "\tdirect", "amq.direct\tdirect", "amq.fanout\tfanout", "amq.headers\theaders",
                    "amq.match\theaders", "amq.topic\ttopic"):
            assert row in out
        assert [ex, "topic", "false", "false", "false", "[]"] in rows(
            ctl_broker, "list_exchanges", "name", "type", "durable", "auto_delete", "internal", "arguments")
        out = lines(ok(ctl_broker, "list_bindings"))
        assert out[:2] == ["Listing bindings for vhost /...",
                           "source_name\tsource_kind\tdestination_name\tdestination_kind\trouting_key\targuments"]
        mine = sorted(line for line in out if f"\t{name}\t" in line)
        assert mine == sorted([f"\texchange\t{name}\tqueue\t{name}\t[]",
                               f"{ex}\texchange\t{name}\tqueue\ta.#\t[]",
                               f'amq.headers\texchange\t{name}\tqueue\t\t[{{"a",1}},{{"x-match","all"}}]'])
        assert {"source_name": ex, "routing_key": "a.#"} in json.loads(
            ok(ctl_broker, "list_bindings", "source_name", "routing_key", "--formatter", "json"))
    finally:
        ch.exchange_delete(ex)


def test_list_connections_channels_and_consumers(ctl_broker, amqp, uid):
    conn_name = connection_name(ctl_broker, amqp)
    port = local_port(amqp)
    ch = amqp.channel()
    ch.basic_qos(prefetch_count=7)
    name = ch.queue_declare(f"ctl-cq-{uid}", exclusive=True).method.queue
    ch.basic_consume(name, lambda *a: None, consumer_tag=f"ctag-{uid}")

    out = eventually(lambda: (lambda o: o if f"guest\t127.0.0.1\t{port}\trunning" in o else None)(
        lines(ok(ctl_broker, "list_connections"))))
    assert out[:2] == ["Listing connections ...", "user\tpeer_host\tpeer_port\tstate"]
    assert [conn_name, "guest", "/", "running"] in rows(ctl_broker, "list_connections", "name", "user", "vhost",
                                                       "state")
    # The flow-control columns the issue names (empty until alarms exist on RabbitMQ 3.10's API).
    assert any(r[0] == conn_name and r[1] == "running"
               for r in rows(ctl_broker, "list_connections", "name", "state", "last_blocked_by",
                             "last_blocked_age"))

    out = lines(ok(ctl_broker, "list_channels"))
    assert out[:2] == ["Listing channels ...", "pid\tuser\tconsumer_count\tmessages_unacknowledged"]
    eventually(lambda: [f"{conn_name} (1)", conn_name, "1", "guest", "/", "7", "1", "false", "false"] in rows(
        ctl_broker, "list_channels", "name", "connection", "number", "user", "vhost", "prefetch_count",
        "consumer_count", "confirm", "transactional"))

    out = lines(ok(ctl_broker, "list_consumers"))
    assert out[:2] == ["Listing consumers in vhost / ...",
                       "queue_name\tchannel_pid\tconsumer_tag\tack_required\tprefetch_count\tactive\targuments"]
    assert f"{name}\t{conn_name} (1)\tctag-{uid}\ttrue\t7\ttrue\t[]" in out
    listed = json.loads(ok(ctl_broker, "list_consumers", "--formatter", "json", "queue_name", "consumer_tag"))
    assert {"queue_name": name, "consumer_tag": f"ctag-{uid}"} in listed


def test_list_vhosts_users_and_permissions(ctl_broker):
    assert lines(ok(ctl_broker, "list_vhosts"))[:2] == ["Listing vhosts ...", "name"]
    assert ["/"] in rows(ctl_broker, "list_vhosts")
    out = lines(ok(ctl_broker, "list_users"))
    assert out[:2] == ["Listing users ...", "user\ttags"]
    assert "guest\t[administrator]" in out
    assert {"user": "guest", "tags": ["administrator"]} in json.loads(ok(ctl_broker, "list_users", "--formatter",
                                                                         "json"))
    out = lines(ok(ctl_broker, "list_permissions"))
    assert out[:2] == ['Listing permissions for vhost "/" ...', "user\tconfigure\twrite\tread"]
    assert "guest\t.*\t.*\t.*" in out
    out = lines(ok(ctl_broker, "list_user_permissions", "guest"))
    assert out[:2] == ['Listing permissions for user "guest" ...', "vhost\tconfigure\twrite\tread"]
    assert "/\t.*\t.*\t.*" in out


def test_status(ctl_broker):
    out = lines(ok(ctl_broker, "status"))
    assert out[0].startswith("Status of node ") and out[0].endswith(" ...")
    for section in ("Runtime", "Alarms", "Memory", "File Descriptors", "Free Disk Space", "Totals", "Listeners"):
        assert section in out
    assert any(line.startswith("Connection count: ") for line in out)
    assert any(line.startswith("Queue count: ") for line in out)
    assert any(line.startswith("Virtual host count: ") for line in out)
    status = json.loads(ok(ctl_broker, "status", "--formatter", "json"))
    assert status["totals"]["virtual_host_count"] >= 1
    assert status["alarms"] == []
    assert any(lst.get("port") == ctl_broker.port and lst.get("protocol") == "amqp" for lst in status["listeners"])


# --- users, vhosts, permissions ------------------------------------------------------------

def assert_login_refused(broker, user, password, vhost="/"):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, user, password, vhost)


def assert_vhost_refused(broker, user, password, vhost):
    """Authenticated, but the vhost is refused: 530 (pika reports it as a probable access denial)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        connect(broker, user, password, vhost)
    assert f'(530) "NOT_ALLOWED - access to vhost \'{vhost}\' refused for user \'{user}\'"' in str(err.value)


def test_user_lifecycle_takes_effect(ctl_broker, uid):
    user = f"ctl-user-{uid}"
    out = ok(ctl_broker, "add_user", user, "pw-one")
    assert lines(out) == [f'Adding user "{user}" ...',
                          "Done. Don't forget to grant the user permissions to some virtual hosts! "
                          "See 'warrenctl help set_permissions' to learn more."]
    try:
        assert f"{user}\t[]" in lines(ok(ctl_broker, "list_users"))
        assert_vhost_refused(ctl_broker, user, "pw-one", "/")  # authenticated, but no permissions yet
        assert ok(ctl_broker, "set_permissions", user, *ANY_ACCESS) == \
            f'Setting permissions for user "{user}" in vhost "/" ...\n'
        assert [user, ".*", ".*", ".*"] in rows(ctl_broker, "list_permissions")
        connect(ctl_broker, user, "pw-one").close()

        r = fails(ctl_broker, 70, "add_user", user, "other")
        assert (r.stdout, r.stderr) == (f'Adding user "{user}" ...\n', f'Error:\nUser "{user}" already exists\n')

        assert ok(ctl_broker, "change_password", user, "pw-two") == f'Changing password for user "{user}" ...\n'
        assert_login_refused(ctl_broker, user, "pw-one")
        connect(ctl_broker, user, "pw-two").close()

        # Tags: administrator opens the management API (and so warrenctl) to the user; setting
        # tags keeps the password.
        assert ok(ctl_broker, "set_user_tags", user, "administrator", "monitoring") == \
            f'Setting tags for user "{user}" to [administrator, monitoring] ...\n'
        assert f"{user}\t[administrator, monitoring]" in lines(ok(ctl_broker, "list_users"))
        assert f"{user}\t[administrator, monitoring]" in lines(ok(ctl_broker, "list_users", user=user,
                                                                  password="pw-two"))
        connect(ctl_broker, user, "pw-two").close()
        assert ok(ctl_broker, "set_user_tags", user) == f'Setting tags for user "{user}" to [] ...\n'
        r = fails(ctl_broker, 77, "list_users", user=user, password="pw-two")
        assert r.stdout == "" and "authentication failed" in r.stderr and f"'{user}'" in r.stderr
        connect(ctl_broker, user, "pw-two").close()
    finally:
        out = ok(ctl_broker, "delete_user", user)
    assert out == f'Deleting user "{user}" ...\n'
    assert_login_refused(ctl_broker, user, "pw-two")
    assert f"{user}\t[]" not in lines(ok(ctl_broker, "list_users"))
    for args in (("delete_user", user), ("change_password", user, "x"), ("set_user_tags", user, "monitoring")):
        r = fails(ctl_broker, 67, *args)
        assert r.stderr == f'Error:\nUser "{user}" does not exist\n'


def test_add_user_reads_the_password_from_stdin(ctl_broker, uid):
    user = f"ctl-stdin-{uid}"
    ok(ctl_broker, "add_user", user, input="from-stdin\n")
    try:
        ok(ctl_broker, "set_permissions", user, *ANY_ACCESS)
        connect(ctl_broker, user, "from-stdin").close()
    finally:
        ok(ctl_broker, "delete_user", user)
    r = fails(ctl_broker, 65, "add_user", f"ctl-nopw-{uid}", input="")
    assert r.stderr == "Error:\nPassword is not provided via argument or stdin\n"


def test_vhosts_and_permissions_take_effect(ctl_broker, uid):
    vhost, user = f"ctl-vh-{uid}", f"ctl-vu-{uid}"
    assert ok(ctl_broker, "add_vhost", vhost) == f'Adding vhost "{vhost}" ...\n'
    ok(ctl_broker, "add_user", user, "pw")
    try:
        assert [vhost] in rows(ctl_broker, "list_vhosts")
        assert_vhost_refused(ctl_broker, user, "pw", vhost)
        assert ok(ctl_broker, "set_permissions", "-p", vhost, user, "^cfg-", ".*", ".*") == \
            f'Setting permissions for user "{user}" in vhost "{vhost}" ...\n'
        assert rows(ctl_broker, "list_permissions", "--vhost", vhost) == [[user, "^cfg-", ".*", ".*"]]
        assert [vhost, "^cfg-", ".*", ".*"] in rows(ctl_broker, "list_user_permissions", user)
        conn = connect(ctl_broker, user, "pw", vhost)
        ch = conn.channel()
        ch.queue_declare(f"cfg-{uid}", exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().queue_declare(f"other-{uid}", exclusive=True)
        assert err.value.reply_code == 403
        conn.close()
        assert ok(ctl_broker, "clear_permissions", "-p", vhost, user) == \
            f'Clearing permissions for user "{user}" in vhost "{vhost}" ...\n'
        assert rows(ctl_broker, "list_permissions", "-p", vhost) == []
        assert_vhost_refused(ctl_broker, user, "pw", vhost)
    finally:
        ok(ctl_broker, "delete_user", user)
        out = ok(ctl_broker, "delete_vhost", vhost)
    assert out == f'Deleting vhost "{vhost}" ...\n'
    assert [vhost] not in rows(ctl_broker, "list_vhosts")
    r = fails(ctl_broker, 65, "delete_vhost", vhost)
    assert (r.stdout, r.stderr) == (f'Deleting vhost "{vhost}" ...\n', f"Virtual host '{vhost}' does not exist\n")
    for verb in ("list_queues", "list_exchanges", "list_bindings", "list_consumers", "list_permissions",
                 "list_policies"):
        r = fails(ctl_broker, 65, verb, "-p", vhost)
        assert r.stderr == f"Virtual host '{vhost}' does not exist\n"
    r = fails(ctl_broker, 70, "set_permissions", "-p", vhost, "guest", *ANY_ACCESS)
    assert r.stderr == f"Error:\nVirtual host {vhost} does not exist\n"
    r = fails(ctl_broker, 67, "set_permissions", f"nobody-{uid}", *ANY_ACCESS)
    assert r.stderr == f"Error:\nUser nobody-{uid} does not exist\n"


# --- policies -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["policy", "operator_policy"])
def test_policies(ctl_broker, uid, kind):
    name = f"ctl-{kind}-{uid}"
    what = {"policy": "policy", "operator_policy": "operator policy override"}[kind]
    listing = {"policy": "policies", "operator_policy": "operator policy overrides"}[kind]
    cleared = {"policy": "policy", "operator_policy": "operator policy"}[kind]
    r = fails(ctl_broker, 69, f"set_{kind}", name, "^nothing-", '{"max-length": 1')
    assert r.stderr == "Error:\nJSON decoding error. Reason: badarg\n"  # (rabbitmqctl 3.10.8's)
    r = fails(ctl_broker, 64, f"set_{kind}", name, "^nothing-", '{"max-length":1}', "--apply-to", "topics")
    assert "--apply-to must be one of queues, exchanges, all" in r.stderr
    r = fails(ctl_broker, 64, f"set_{kind}", name, "^nothing-", '{"max-length":1}', "--priority", "high")
    assert "--priority must be an integer" in r.stderr
    assert [r for r in rows(ctl_broker, f"list_{kind.replace('policy', 'policies')}") if r[1] == name] == []

    out = ok(ctl_broker, f"set_{kind}", name, f"^ctl-{uid}-", '{"max-length": 10}', "--priority", "5",
             "--apply-to", "queues")
    assert out == (f'Setting {what} "{name}" for pattern "^ctl-{uid}-" to "{{"max-length": 10}}" with priority '
                   f'"5" for vhost "/" ...\n')
    verb = f"list_{kind.replace('policy', 'policies')}"
    out = lines(ok(ctl_broker, verb))
    assert out[:2] == [f'Listing {listing} for vhost "/" ...', "vhost\tname\tpattern\tapply-to\tdefinition\tpriority"]
    assert f'/\t{name}\t^ctl-{uid}-\tqueues\t{{"max-length":10}}\t5' in out
    assert {"vhost": "/", "name": name, "pattern": f"^ctl-{uid}-", "apply-to": "queues",
            "definition": '{"max-length":10}', "priority": 5} in json.loads(ok(ctl_broker, verb, "--formatter", "json"))

    assert ok(ctl_broker, f"clear_{kind}", name) == f'Clearing {cleared} "{name}" on vhost "/" ...\n'
    assert [r for r in rows(ctl_broker, verb) if r[1] == name] == []
    r = fails(ctl_broker, 70, f"clear_{kind}", name)
    assert r.stderr == "Error:\nParameter does not exist\n"


# --- queues and connections -----------------------------------------------------------------

def test_purge_and_delete_queue(ctl_broker, amqp, uid):
    ch = amqp.channel()
    ch.confirm_delivery()
    name = f"ctl-pq-{uid}"
    ch.queue_declare(name)
    for _ in range(3):
        ch.basic_publish("", name, b"m")
    assert ok(ctl_broker, "purge_queue", name) == f"Purging queue '{name}' in vhost '/' ...\n"
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    for _ in range(2):
        ch.basic_publish("", name, b"m")
    r = fails(ctl_broker, 64, "delete_queue", name, "--if-empty")
    assert (r.stdout, r.stderr) == (f"Deleting queue '{name}' on vhost '/' if queue is empty ...\n",
                                    "Error:\nQueue is not empty\n")
    consumer = amqp.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(name, lambda *a: None)
    r = fails(ctl_broker, 64, "delete_queue", "-u", name)
    assert (r.stdout, r.stderr) == (f"Deleting queue '{name}' on vhost '/' if queue is unused ...\n",
                                    "Error:\nQueue is in use\n")
    consumer.close()
    assert ch.queue_declare(name, passive=True).method.message_count == 2
    eventually(lambda: [name, "2"] in rows(ctl_broker, "list_queues", "name", "messages_ready"))
    out = ok(ctl_broker, "delete_queue", name)
    assert out == f"Deleting queue '{name}' on vhost '/' ...\nQueue was successfully deleted with 2 ready messages\n"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(name, passive=True)
    assert err.value.reply_code == 404
    r = fails(ctl_broker, 64, "delete_queue", name)
    assert r.stderr == "Error:\nQueue not found\n"
    r = fails(ctl_broker, 70, "purge_queue", name)
    assert (r.stdout, r.stderr) == (f"Purging queue '{name}' in vhost '/' ...\n", "Error:\nQueue not found\n")


def test_close_connection(ctl_broker, uid):
    conn = connect(ctl_broker, client_properties={"connection_name": f"ctl-{uid}"})
    name = connection_name(ctl_broker, conn)
    eventually(lambda: [name] in rows(ctl_broker, "list_connections", "name"))
    out = ok(ctl_broker, "close_connection", name, "go away")
    assert out == f"Closing connection {name}, reason: go away...\n"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    assert (err.value.reply_code, err.value.reply_text) == (320, "CONNECTION_FORCED - go away")
    r = fails(ctl_broker, 70, "close_connection", name, "again")
    assert r.stderr.startswith(f"Error:\nConnection '{name}' not found")


# --- definitions ----------------------------------------------------------------------------

def test_export_then_import_into_a_fresh_broker(make_broker, tmp_path, uid):
    source = make_broker()
    vhost, user = f"defs-vh-{uid}", f"defs-user-{uid}"
    ok(source, "add_vhost", vhost)
    ok(source, "add_user", user, "defs-pw")
    ok(source, "set_user_tags", user, "monitoring")
    ok(source, "set_permissions", "-p", vhost, user, "^q", ".*", ".*")
    ok(source, "set_policy", "-p", vhost, "defs-policy", "^q", '{"max-length": 5}', "--apply-to", "queues")
    ok(source, "set_permissions", "-p", vhost, "guest", *ANY_ACCESS)
    conn = connect(source, vhost=vhost)
    ch = conn.channel()
    ch.exchange_declare("defs-x", "topic", durable=True)
    ch.queue_declare("q-durable", durable=True, arguments={"x-max-length": 100})
    ch.queue_bind("q-durable", "defs-x", "a.*")
    conn.close()

    path = tmp_path / "defs.json"
    assert ok(source, "export_definitions", str(path)) == f'Exporting definitions in JSON to a file at "{path}" ...\n'
    exported = json.loads(path.read_text())
    assert json.loads(ok(source, "export_definitions", "-")) == exported
    exported_user = next(u for u in exported["users"] if u["name"] == user)
    assert exported_user["tags"] in (["monitoring"], "monitoring")  # RabbitMQ 3.10: a list; older: a string
    assert {"user": user, "vhost": vhost, "configure": "^q", "write": ".*", "read": ".*"} in exported["permissions"]
    assert {"vhost": vhost, "name": "defs-policy", "pattern": "^q", "apply-to": "queues",
            "definition": {"max-length": 5}, "priority": 0} in exported["policies"]
    assert any(q["name"] == "q-durable" and q["vhost"] == vhost for q in exported["queues"])

    target = make_broker()
    out = ok(target, "import_definitions", str(path))
    assert lines(out)[0] == f'Importing definitions in JSON from a file at "{path}" ...'
    assert json.loads(ok(target, "export_definitions", "-")) == exported
    # The imported user logs in with its password, with its permissions.
    conn = connect(target, user, "defs-pw", vhost)
    assert conn.channel().queue_declare("q-durable", passive=True).method.message_count == 0
    conn.close()

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = fails(target, 65, "import_definitions", str(bad))
    assert r.stderr.startswith("Error:\nFailed to deserialise input (format: JSON)")
    r = fails(target, 65, "import_definitions", str(tmp_path / "missing.json"))
    assert r.stderr == f"Error (argument validation): Bad argument: File {tmp_path / 'missing.json'} does not exist\n"
    r = fails(target, 65, "export_definitions", str(tmp_path / "no-dir" / "x.json"))
    assert r.stderr == f"Error (argument validation): Bad argument: Directory {tmp_path / 'no-dir'} does not exist\n"


# --- usage and connection errors ------------------------------------------------------------

def test_usage_errors(ctl_broker):
    r = fails(ctl_broker, 64, "frobnicate")
    assert r.stdout == "" and "Command 'frobnicate' not found." in r.stderr and "warrenctl help" in r.stderr
    r = fails(ctl_broker, 64, "list_queue")
    assert "Did you mean 'list_queues'?" in r.stderr
    r = fails(ctl_broker, 64, "list_queues", "bogus")
    assert r.stderr.startswith("Error (argument validation): Info key(s) bogus are not supported")
    r = fails(ctl_broker, 64, "delete_queue")
    assert r.stderr.startswith("Error (argument validation): not enough arguments.")
    r = fails(ctl_broker, 64, "delete_user", "a", "b")
    assert r.stderr.startswith("Error (argument validation): too many arguments.")
    r = fails(ctl_broker, 64, "list_queues", "--if-empty")
    assert r.stderr.startswith("Error (argument validation): Invalid options for this command:\n--if-empty")
    r = fails(ctl_broker, 64, "list_queues", "--formatter", "xml")
    assert "formatter 'xml' is not supported" in r.stderr
    r = fails(ctl_broker, 64)
    assert "Usage" in r.stderr and "list_queues" in r.stderr
    help_text = ok(ctl_broker, "help", "set_policy")
    assert "set_policy [--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>]" in help_text


def test_unreachable_broker_and_bad_credentials(ctl_broker):
    port = free_port()  # nothing listens there
    r = fails(port, 69, "list_queues")
    assert r.stdout == ""
    assert r.stderr.startswith(f"Error: unable to connect to the Warren management API at 127.0.0.1:{port}: "
                               "connection refused.")
    r = fails(ctl_broker.port, 69, "list_users")  # the AMQP port does not speak HTTP
    assert r.stdout == "" and f"127.0.0.1:{ctl_broker.port}" in r.stderr
    r = fails(ctl_broker, 77, "list_users", user="guest", password="wrong")
    assert r.stdout == ""
    assert r.stderr.startswith(f"Error: authentication failed for user 'guest' at 127.0.0.1:{ctl_broker.mgmt_port}")
    with socket.socket() as s:  # a port that accepts and hangs up: still no traceback
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = ctl(s.getsockname()[1], "-t", "1", "list_users")
    assert r.returncode == 69 and "Traceback" not in r.stderr
