"""`warren server --config FILE` in both of RabbitMQ's formats: each setting has its effect on
a real broker (listener, management port, default user/vhost/tags/permissions on the first
boot, what connection.tune offers, message size, handshake timeout, loopback users, log level,
queue window); a bad file stops the server with exit status 2 and a message naming the file,
line and key; command-line flags win over the file.

Warren-only: each test starts its own broker."""

import glob
import os
import shutil
import socket
import subprocess
import sys
import time

import pika
import pytest
import requests
from pamqp import commands

from conftest import EXTERNAL, BrokerProcess, channel_error, free_port, scratch_dir
from rawamqp import RawClient

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="starts its own Warren brokers")

LOGIN_REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                 "For details see the broker logfile.")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def launch():
    """Start `warren server --config FILE [args]` without the fixture's --host/--port/
    --management-port, so the file's listener and management settings apply; waits until
    host:port accepts connections."""
    started = []

    def start(config, *args, host="127.0.0.1", port, mgmt_port=None, data_dir=None):
        data_dir = data_dir or scratch_dir("warren-config-")
        log_path = os.path.join(data_dir, "broker.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "warren", "server", "--data-dir", data_dir,
                                     "--config", config, *args], stdout=log, stderr=subprocess.STDOUT)
        b = BrokerProcess(host, port, proc, data_dir, log_path, mgmt_port)
        started.append(b)
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"broker exited with {proc.returncode}:\n{b.log()}")
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                return b
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker did not start:\n{b.log()}") from None
                time.sleep(0.05)

    yield start
    for b in started:
        b.stop()


def refused(host, port) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def management_answers(host, port):
    """The management API (and not something else) serves host:port: without credentials it
    answers 401 as RabbitMQ's does."""
    r = requests.get(f"http://{host}:{port}/api/overview", timeout=5)
    assert (r.status_code, r.content) == (401, b"")
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def tune_of(b, user="guest", password="guest"):
    """The connection.tune the broker sends after login."""
    with RawClient(b.host, b.port) as raw:
        raw.start_handshake()
        raw.login(user, password)
        tune = raw.expect(commands.Connection.Tune, 0)
        return tune.channel_max, tune.frame_max, tune.heartbeat


def login_refused(host, port, user="guest", password="guest") -> bool:
    """True if the broker refuses the login (403 with RabbitMQ's text), False if it tunes."""
    with RawClient(host, port) as raw:
        raw.start_handshake()
        raw.login(user, password)
        frame = raw.read_frame()
        if isinstance(frame.value, commands.Connection.Tune):
            return False
        assert isinstance(frame.value, commands.Connection.Close), frame
        assert (frame.value.reply_code, frame.value.reply_text) == (403, LOGIN_REFUSED)
        return True


def non_loopback_ip():
    """An address of this host that is not loopback (None if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


# ------------------------------------------------------------------ listener, management

def test_new_style_listener_and_management_port(launch, tmp_path):
    port, mgmt = free_port(), free_port()
    config = write(tmp_path, "rabbitmq.conf", f"# Warren\nlisteners.tcp.default = {port}\n"
                                              f"management.tcp.port = {mgmt}\n")
    b = launch(config, port=port)
    conn = pika.BlockingConnection(b.pika_params())
    assert conn.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    conn.close()
    management_answers("127.0.0.1", mgmt)


def test_erlang_listener_and_management_port(launch, tmp_path):
    port, mgmt = free_port(), free_port()
    config = write(tmp_path, "rabbitmq.config",
                   f'%% classic\n[{{rabbit, [{{tcp_listeners, [{{"127.0.0.1", {port}}}]}}]}},\n'
                   f" {{rabbitmq_management, [{{listener, [{{port, {mgmt}}}]}}]}}].\n")
    b = launch(config, port=port)
    conn = pika.BlockingConnection(b.pika_params())
    assert conn.is_open
    conn.close()
    management_answers("127.0.0.1", mgmt)


def test_listener_and_management_addresses_from_the_file(launch, tmp_path):
    port, mgmt = free_port(), free_port()
    config = write(tmp_path, "rabbitmq.conf", f"listeners.tcp.default = 127.0.0.2:{port}\n"
                                              f"management.tcp.port = {mgmt}\nmanagement.tcp.ip = 127.0.0.2\n")
    launch(config, host="127.0.0.2", port=port)
    assert tune_of(BrokerProcess("127.0.0.2", port)) == (2047, 131072, 60)
    assert refused("127.0.0.1", port)
    management_answers("127.0.0.2", mgmt)
    assert refused("127.0.0.1", mgmt)


def test_flags_override_the_file(launch, tmp_path):
    file_port, file_mgmt, port, mgmt = free_port(), free_port(), free_port(), free_port()
    config = write(tmp_path, "rabbitmq.conf", f"listeners.tcp.default = 127.0.0.2:{file_port}\n"
                                              f"management.tcp.port = {file_mgmt}\nheartbeat = 20\n")
    b = launch(config, "--host", "127.0.0.1", "--port", str(port), "--management-port", str(mgmt), port=port)
    assert tune_of(b) == (2047, 131072, 20)  # what the flags do not set still comes from the file
    assert refused("127.0.0.2", file_port) and refused("127.0.0.1", file_port) and refused("127.0.0.2", port)
    management_answers("127.0.0.1", mgmt)
    assert refused("127.0.0.1", file_mgmt)


def test_management_port_zero_disables_the_api(launch, tmp_path):
    port = free_port()
    config = write(tmp_path, "rabbitmq.conf", f"listeners.tcp.default = {port}\nmanagement.tcp.port = 0\n")
    b = launch(config, port=port)
    deadline = time.monotonic() + 10  # (its socket accepts a moment before the line is written)
    while "Warren listening for AMQP" not in b.log():
        assert time.monotonic() < deadline, b.log()
        time.sleep(0.05)
    assert "management API listening" not in b.log()


# ------------------------------------------------------------------ connection.tune, limits

@pytest.mark.parametrize("name, text", [
    ("rabbitmq.conf", "heartbeat = 17\nframe_max = 64KB\nchannel_max = 99\n"),
    ("rabbitmq.config", "[{rabbit, [{heartbeat, 17}, {frame_max, 65536}, {channel_max, 99}]}].\n"),
], ids=["new-style", "erlang"])
def test_tune_offers_the_configured_limits(make_broker, tmp_path, name, text):
    b = make_broker("--config", write(tmp_path, name, text))
    assert tune_of(b) == (99, 65536, 17)
    # pika takes the offer: the connection heartbeats at 17 s and frames stay within 64 KiB.
    conn = pika.BlockingConnection(b.pika_params())
    try:
        assert (conn._impl.params.heartbeat, conn._impl.params.frame_max, conn._impl.params.channel_max) == (
            17, 65536, 99)
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = os.urandom(200_000)  # split into frames of at most 64 KiB
        ch.basic_publish("", q, body)
        assert ch.basic_get(q, auto_ack=True)[2] == body
    finally:
        conn.close()


def test_max_message_size_from_an_erlang_file(make_broker, tmp_path):
    b = make_broker("--config", write(tmp_path, "rabbitmq.config", "[{rabbit, [{max_message_size, 5000}]}].\n"))
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"x" * 5000)
        assert ch.basic_get(q, auto_ack=True)[2] == b"x" * 5000
        channel_error(lambda: ch.basic_publish("", q, b"x" * 5001), 406,
                      "PRECONDITION_FAILED - message size 5001 is larger than configured max size 5000")
    finally:
        conn.close()


def test_max_message_size_with_a_unit(make_broker, tmp_path):
    b = make_broker("--config", write(tmp_path, "rabbitmq.conf", "max_message_size = 4KiB\n"))
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        channel_error(lambda: ch.basic_publish("", q, b"x" * 4097), 406,
                      "PRECONDITION_FAILED - message size 4097 is larger than configured max size 4096")
    finally:
        conn.close()


@pytest.mark.parametrize("name, text", [
    ("rabbitmq.conf", "management.http.max_body_size = 300\n"),
    ("advanced.config", "[{rabbitmq_management, [{max_http_body_size, 300}]}].\n"),
], ids=["new-style", "erlang"])
def test_management_body_limit(make_broker, tmp_path, uid, name, text):
    """The API reads a request body of up to the limit and refuses a bigger one with RabbitMQ's
    400 (test_mgmt_body_limit.py has the rest)."""
    b = make_broker("--config", write(tmp_path, name, text))
    body = b'{"durable": false}'

    def put(queue, size):
        return requests.put(f"{b.api}/queues/%2F/{queue}", data=body + b" " * (size - len(body)),
                            auth=("guest", "guest"), headers={"Content-Type": "application/json"}, timeout=10)

    assert put(f"at-{uid}", 300).status_code == 201
    r = put(f"past-{uid}", 301)
    assert (r.status_code, r.json()) == (400, {"error": "bad_request",
                                               "reason": "Exceeded HTTP request body size limit"})


def test_handshake_timeout(make_broker, tmp_path):
    b = make_broker("--config", write(tmp_path, "rabbitmq.conf", "handshake_timeout = 300\n"))
    with RawClient(b.host, b.port) as raw:
        began = time.monotonic()
        assert raw.expect_eof(timeout=5) == b""  # a client that says nothing is dropped
        assert 0.25 <= time.monotonic() - began < 3
    with RawClient(b.host, b.port) as raw:  # one that completes the handshake in time stays
        raw.handshake()
        time.sleep(0.5)
        assert not raw.is_closed(0.1)


# ------------------------------------------------------------------ default user, vhost, permissions

def test_default_user_vhost_tags_and_permissions_on_first_boot(make_broker, tmp_path, uid):
    vhost = f"vh-{uid}"
    config = write(tmp_path, "rabbitmq.conf", "\n".join([
        "default_user = alice", "default_pass = wonder land", f"default_vhost = {vhost}",
        "default_user_tags.monitoring = true",
        "default_permissions.configure = ^alice-", "default_permissions.write = .*",
        "default_permissions.read = .*", ""]))
    b = make_broker("--config", config)
    assert login_refused(b.host, b.port, "guest", "guest")  # no guest on this node
    assert login_refused(b.host, b.port, "alice", "wrong")
    conn = pika.BlockingConnection(b.pika_params("alice", "wonder land", vhost))
    try:
        ch = conn.channel()
        ch.queue_declare(f"alice-{uid}", exclusive=True)
        channel_error(lambda: ch.queue_declare(f"bob-{uid}"), 403,
                      f"ACCESS_REFUSED - configure access to queue 'bob-{uid}' in vhost '{vhost}' "
                      "refused for user 'alice'")
    finally:
        conn.close()
    # Tagged monitoring (not administrator): the management API lets alice read, not manage users.
    api = f"http://127.0.0.1:{b.mgmt_port}/api"
    r = requests.get(f"{api}/whoami", auth=("alice", "wonder land"), timeout=5)
    assert (r.status_code, r.json()) == (200, {"name": "alice", "tags": ["monitoring"]})
    r = requests.put(f"{api}/users/config-test-{uid}", json={"password": "x", "tags": ""},
                     auth=("alice", "wonder land"), timeout=5)
    assert (r.status_code, r.json()) == (401, {"error": "not_authorised", "reason": "Not administrator user"})
    # The defaults are created on the first boot only: a restart with other ones keeps alice.
    b.stop()
    other = write(tmp_path, "other.conf", "default_user = bob\ndefault_pass = bob\n")
    b = make_broker("--config", other, data_dir=b.data_dir)
    assert login_refused(b.host, b.port, "bob", "bob")
    conn = pika.BlockingConnection(b.pika_params("alice", "wonder land", vhost))
    assert conn.is_open
    conn.close()


def test_erlang_defaults_and_the_permissions_order(make_broker, tmp_path, uid):
    # The classic default_permissions list is [Configure, Write, Read].
    config = write(tmp_path, "rabbitmq.config", "\n".join([
        "[{rabbit, [",
        '  {default_user, <<"carol">>}, {default_pass, <<"c4rol">>}, {default_vhost, <<"cv">>},',
        "  {default_user_tags, [administrator]},",
        '  {default_permissions, [<<".*">>, <<"^w-">>, <<"^r-">>]}',
        "]}].", ""]))
    b = make_broker("--config", config)
    conn = pika.BlockingConnection(b.pika_params("carol", "c4rol", "cv"))
    try:
        ch = conn.channel()
        for name in (f"w-{uid}", f"r-{uid}"):
            ch.exchange_declare(name, "fanout")
            ch.queue_declare(name)
        ch.basic_publish(f"w-{uid}", "", b"ok")
        channel_error(lambda: ch.basic_publish(f"r-{uid}", "", b"no") or ch.queue_declare(f"w-{uid}", passive=True),
                      403, f"ACCESS_REFUSED - write access to exchange 'r-{uid}' in vhost 'cv' refused for user "
                           "'carol'")
        ch = conn.channel()
        assert ch.basic_get(f"r-{uid}", auto_ack=True) == (None, None, None)
        channel_error(lambda: ch.basic_get(f"w-{uid}"), 403,
                      f"ACCESS_REFUSED - read access to queue 'w-{uid}' in vhost 'cv' refused for user 'carol'")
    finally:
        conn.close()
    r = requests.get(f"http://127.0.0.1:{b.mgmt_port}/api/config-test-{uid}/x", auth=("carol", "c4rol"), timeout=5)
    assert r.status_code == 404  # administrator


# ------------------------------------------------------------------ loopback users

@pytest.mark.parametrize("name, text, guest_refused", [
    ("none.conf", "", True),  # RabbitMQ's default: guest only from loopback
    ("guest-false.conf", "loopback_users.guest = false\n", False),
    ("none-keyword.conf", "loopback_users = none\n", False),
    ("others.conf", "loopback_users.alice = true\n", False),  # only the listed users are restricted
    ("guest-true.conf", "loopback_users.guest = true\n", True),
    ("empty.config", "[{rabbit, [{loopback_users, []}]}].\n", False),
    ("guest.config", '[{rabbit, [{loopback_users, [<<"guest">>]}]}].\n', True),
])
def test_loopback_users(make_broker, tmp_path, name, text, guest_refused):
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback address")
    b = make_broker("--config", write(tmp_path, name, text or "# nothing\n"), "--host", "0.0.0.0")
    assert not login_refused("127.0.0.1", b.port)  # from loopback, always
    assert login_refused(ip, b.port) is guest_refused


# ------------------------------------------------------------------ log level, queue window

def test_log_level_from_the_file_and_the_flag(make_broker, tmp_path):
    config = write(tmp_path, "rabbitmq.conf", "log.console.level = warning\n")
    quiet = make_broker("--config", config)
    assert quiet.log() == ""  # the INFO lines ("Warren listening ...") are not logged
    loud = make_broker("--config", config, "--log-level", "info")
    assert "[info] <warren.server> Warren listening for AMQP 0-9-1 on 127.0.0.1:" in loud.log()
    debug = make_broker("--config", write(tmp_path, "debug.config",
                                          "[{rabbit, [{log, [{console, [{level, debug}]}]}]}].\n"))
    assert "[info] <warren.server> Warren listening for AMQP 0-9-1 on 127.0.0.1:" in debug.log()


def _paged_files(b):
    return glob.glob(os.path.join(b.data_dir, "paging", "*", "*.seg"))


@pytest.mark.parametrize("args, pages", [((), True), (("--queue-window", "100000"), False)],
                         ids=["file", "flag-overrides"])
def test_queue_window_from_the_file(make_broker, tmp_path, args, pages):
    b = make_broker("--config", write(tmp_path, "rabbitmq.conf", "warren.queue_window = 100\n"), *args)
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        for i in range(600):
            ch.basic_publish("", q, b"%04d" % i + b"~" * 2000)
        assert ch.queue_declare(q, passive=True).method.message_count == 600
        # Beyond a window of 100 messages the queue pages to disk.
        assert bool(_paged_files(b)) is pages
        assert ch.basic_get(q, auto_ack=True)[2].startswith(b"0000")
    finally:
        conn.close()


# ------------------------------------------------------------------ bad files

@pytest.mark.parametrize("name, text, message", [
    ("rabbitmq.conf", "heartbeat = 30\nhearbeat = 30\n", "{path}:2: hearbeat: unknown key (did you mean heartbeat?)"),
    ("rabbitmq.conf", "# limits\n\ndisk_free_limit.absolute = 2 GB\n",
     "{path}:3: disk_free_limit.absolute: expected an integer number of bytes or one with a unit: 500MB, "
     "500MiB, 4Gi, 10GB, 2TB, got '2 GB'"),
    ("rabbitmq.conf", "vm_memory_high_watermark.absolute = 4Tb\nvm_memory_high_watermark.relative = -2.0\n",
     "{path}:2: vm_memory_high_watermark.relative: expected a non-negative float such as 0.4, got -2.0"),
    ("rabbitmq.conf", "frame_max = lots\n",
     "{path}:1: frame_max: expected an integer number of bytes, or one with KB, MB or GB (powers of 1024), "
     "got 'lots'"),
    ("rabbitmq.config", "[{rabbit, [\n  {heartbeat, 30}\n  {channel_max, 10}]}].\n",
     "{path}:3: syntax error: expected ',' or ']' but found '{{'"),
    ("rabbitmq.config", "[{rabbit, [\n  {disk_free_limit, {mem_relative, -1.0}}]}].\n",
     "{path}:2: rabbit.disk_free_limit: expected a non-negative float, got -1.0"),
    ("rabbitmq.conf", "management.http.max_body_size = 10MB\n",
     "{path}:1: management.http.max_body_size: expected a number of bytes (an integer such as 10000000, "
     "no unit), got '10MB'"),
    ("rabbitmq.conf", "management.http.max_body_size = -1\n",
     "{path}:1: management.http.max_body_size: expected a non-negative number of bytes such as 10000000, got -1"),
    ("advanced.config", "[{rabbitmq_management, [{max_http_body_size, \"20000000\"}]}].\n",
     '{path}:1: rabbitmq_management.max_http_body_size: expected an integer, got "20000000"'),
    ("rabbitmq.config", "[{rabbit, [{vm_memory_high_watermark, {absolute, \"1.5GB\"}}]}].\n",
     "{path}:1: rabbit.vm_memory_high_watermark: expected an integer number of bytes or one with a unit: "
     "500MB, 500MiB, 4Gi, 10GB, 2TB, got '1.5GB'"),
])
def test_a_bad_file_stops_the_server(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    result = subprocess.run([sys.executable, "-m", "warren", "server", "--config", path, "--data-dir",
                             str(tmp_path / "data"), "--port", str(free_port()), "--management-port", "0"],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", "warren: " + message.format(path=path) + "\n")


def test_every_bad_line_is_reported(tmp_path):
    path = write(tmp_path, "rabbitmq.conf", "heartbeat = x\nchannel_max = 10\nloopback_users.guest = maybe\n")
    result = subprocess.run([sys.executable, "-m", "warren", "server", "--config", path, "--data-dir",
                             str(tmp_path / "data"), "--management-port", "0"],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (2, f"warren: {path}:1: heartbeat: expected an integer, got 'x'\n"
                                                     f"warren: {path}:3: loopback_users.guest: expected true or "
                                                     "false, got 'maybe'\n")


def test_a_missing_file_stops_the_server(tmp_path):
    path = str(tmp_path / "nowhere.conf")
    result = subprocess.run([sys.executable, "-m", "warren", "server", "--config", path, "--data-dir",
                             str(tmp_path / "data"), "--management-port", "0"],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (
        2, f"warren: cannot read config file {path}: No such file or directory\n")


# ------------------------------------------------------------------ --help

def test_help_lists_every_flag():
    warren = shutil.which("warren")
    cmd = [warren] if warren else [sys.executable, "-m", "warren"]
    result = subprocess.run([*cmd, "server", "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == ""
    from warren.cli.main import build_parser
    server = build_parser()._subparsers._group_actions[0].choices["server"]
    flags = [f for action in server._actions for f in action.option_strings if f.startswith("--")]
    assert set(flags) >= {"--host", "--port", "--data-dir", "--config", "--management-port", "--queue-window",
                          "--definitions", "--log-level", "--help"}
    for flag in flags:
        assert flag in result.stdout
    assert "the flags here override its settings" in " ".join(result.stdout.split())
