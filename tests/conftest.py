"""Test fixtures: a real `warren server` subprocess on a free loopback port.

Set WARREN_TEST_BROKER=host:port to run the same tests against another broker (for
example a local RabbitMQ) to compare behaviour; tests that need to start their own
broker are skipped then.
"""

import base64
import functools
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

EXTERNAL = os.environ.get("WARREN_TEST_BROKER")
# WARREN_TEST_BROKER is a three-node Warren cluster (tools/warren_cluster.py): the tests marked
# not_on_warren_cluster("why") skip, and only there.
WARREN_CLUSTER = bool(EXTERNAL) and os.environ.get("WARREN_TEST_WARREN_CLUSTER") == "1"
# The broker under test is RabbitMQ: where Warren deliberately answers otherwise (its wording,
# a close where RabbitMQ drops the socket), a test expects RabbitMQ's answer.
RABBITMQ = bool(EXTERNAL) and not WARREN_CLUSTER
# Unique per run, the same in every pytest-xdist worker: names built from it at import time
# end up in test ids, which the workers' collections must agree on.
RUN_ID = (os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex)[:8]


# With pytest-xdist (`-n 3`, the README's command) tests are handed out by module (a module's
# fixtures are made once, on one worker), and the Spark and kill -9 suites form one unit that
# runs on one worker, one test after another: never two Spark JVMs or crash loops at once on
# CI's 2 cores. (xdist's own --dist loadgroup ignores xdist_group marks under pytest 9.) Not
# their modules that start no JVM and time no fault (damaged files, a scripted fake broker):
# they are ordinary modules. The unit, the longest by far, goes out first: the other workers
# share out the rest meanwhile, with no tail where they wait for the unit alone.
_HEAVY = ("tests/spark/", "tests/crash/")
_NOT_HEAVY = ("tests/crash/test_corruption.py", "tests/spark/test_sink_wire.py")


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModulesHeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "heavy" if path.startswith(_HEAVY) and path not in _NOT_HEAVY else path

        def _assign_work_unit(self, node) -> None:
            if "heavy" in self.workqueue:
                self.workqueue.move_to_end("heavy", last=False)
            super()._assign_work_unit(node)

    return ModulesHeavyTogether(config, log)


# Test brokers' ports come from below the kernel's ephemeral range (32768-60999 by default),
# one slice per pytest-xdist worker, handed out in turn: the port of a broker killed and about
# to be restarted (tests/crash) is never given to another worker's broker or taken by a
# client's outgoing connection in between.
_PORTS = (10000, 32000)


def _port_slice() -> tuple[int, int]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = (_PORTS[1] - _PORTS[0]) // max(1, workers)
    return _PORTS[0] + index * size, _PORTS[0] + (index + 1) * size


# Shared by this file's two module objects (pytest's `conftest` and `tests.conftest`, which
# some tests import): one cursor, so they never both hand out a port not yet bound.
_port_cursor: list[int] = sys.modules.setdefault("_warren_test_port_cursor", [])  # type: ignore[arg-type]


# Directories the run made for brokers (data dirs with their logs, definitions files): removed
# when the session ends, so that runs don't pile up in /tmp (one session's left 25 GB there).
# WARREN_KEEP_TEST_DIRS=1 keeps them for a look afterwards.
_scratch_dirs: list[str] = sys.modules.setdefault("_warren_test_scratch_dirs", [])  # type: ignore[arg-type]


def process_memory(pid: int, field: str = "VmRSS") -> int:
    """A process's resident set (VmRSS) or its peak (VmHWM), in bytes, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


def scratch_dir(prefix: str) -> str:
    """A new temp directory, removed at the end of the test session."""
    directory = tempfile.mkdtemp(prefix=prefix)
    _scratch_dirs.append(directory)
    return directory


def pytest_collection_modifyitems(config, items):
    if not WARREN_CLUSTER:
        return
    for item in items:
        marker = item.get_closest_marker("not_on_warren_cluster")
        if marker is not None:
            why = marker.args[0] if marker.args else marker.kwargs["reason"]
            item.add_marker(pytest.mark.skip(reason=f"not on a Warren cluster: {why}"))


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("WARREN_KEEP_TEST_DIRS"):
        return
    while _scratch_dirs:
        shutil.rmtree(_scratch_dirs.pop(), ignore_errors=True)


def free_port() -> int:
    low, high = _port_slice()
    if not _port_cursor:
        _port_cursor.append(low + os.getpid() % (high - low))
    for _ in range(high - low):
        port = _port_cursor[0]
        _port_cursor[0] = low + (port + 1 - low) % (high - low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


class BrokerProcess:
    """A running broker under test."""

    def __init__(self, host, port, proc=None, data_dir=None, log_path=None, mgmt_port=None):
        self.host = host
        self.port = port
        self.mgmt_port = mgmt_port  # the management HTTP API's port
        self.api_host = "127.0.0.1"  # where it listens (another address for a broker in a network namespace)
        self.proc = proc
        self.data_dir = data_dir
        self.log_path = log_path

    @property
    def api(self) -> str:
        """Base URL of the management HTTP API."""
        return f"http://{self.api_host}:{self.mgmt_port}/api"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    def pika_params(self, user="guest", password="guest", vhost="/", **kwargs):
        """pika connection parameters for this broker (kwargs: any others pika takes)."""
        import pika
        kwargs.setdefault("credentials", pika.PlainCredentials(user, password))
        kwargs.setdefault("virtual_host", vhost)
        return pika.ConnectionParameters(self.host, self.port, **kwargs)

    def log(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_broker(*extra_args, data_dir=None, port=None, wait=True, preexec_fn=None,
                 rlimit_fsize=None, pass_host=True, default_prometheus=False, start_timeout=15.0,
                 _retries=2) -> BrokerProcess:
    """Start `python -m warren server` and wait until it accepts connections.
    preexec_fn runs in the child before exec; rlimit_fsize sets its RLIMIT_FSIZE (bytes);
    pass_host=False leaves out `--host 127.0.0.1` (the broker's default addresses apply), as
    does a --host in extra_args (--host is repeatable: the test's own must not add to it).
    Prometheus metrics are off unless extra_args (the flag, or a config file) say, or
    default_prometheus (15692, as a broker started without either): test brokers don't all
    try to bind 15692. start_timeout: seconds it may take to listen."""
    again = functools.partial(start_broker, *extra_args, data_dir=data_dir, port=port, wait=wait,
                              preexec_fn=preexec_fn, rlimit_fsize=rlimit_fsize, pass_host=pass_host,
                              default_prometheus=default_prometheus, start_timeout=start_timeout,
                              _retries=_retries - 1)
    if rlimit_fsize is not None:
        inner = preexec_fn

        def preexec_fn():
            import resource
            resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, rlimit_fsize))
            if inner is not None:
                inner()
    port = port or free_port()
    data_dir = data_dir or scratch_dir("warren-test-")
    log_path = os.path.join(data_dir, f"broker-{port}.log")
    log = open(log_path, "ab")
    mgmt_port = None
    if "--management-port" not in extra_args:
        mgmt_port = free_port()
        extra_args = (*extra_args, "--management-port", str(mgmt_port))
    if not ({"--prometheus-port", "--config"} & set(extra_args) or default_prometheus):
        extra_args = (*extra_args, "--prometheus-port", "0")
    pass_host = pass_host and "--host" not in extra_args
    cmd = [sys.executable, "-m", "warren", "server", *(("--host", "127.0.0.1") if pass_host else ()),
           "--port", str(port), "--data-dir", data_dir, *extra_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
    broker = BrokerProcess("127.0.0.1", port, proc, data_dir, log_path, mgmt_port)
    if wait:
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if (mgmt_port is not None and _retries > 0
                        and f"{mgmt_port}): address already in use" in broker.log()[-2000:]):
                    # free_port()'s management port was taken before the broker bound it
                    # (a client's ephemeral port, seen once in CI's kill -9 torture): another
                    return again()
                raise RuntimeError(f"broker exited with {proc.returncode}:\n{broker.log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return broker
            except OSError:
                time.sleep(0.05)
        broker.stop()
        raise RuntimeError(f"broker did not start:\n{broker.log()}")
    return broker


# Brokers with extra users, vhosts and permissions (RabbitMQ definitions JSON).

def password_hash(password: str, algorithm: str = "sha256", salt: bytes = b"\x8a\x1e\x07\x33") -> str:
    """RabbitMQ's stored password hash, base64(salt + H(salt + password)), computed here
    independently of Warren."""
    digest = getattr(hashlib, algorithm)(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


class DefinitionsBroker:
    """Where a test finds a broker loaded with `definitions`: a fresh `warren server
    --definitions FILE`, or, when WARREN_TEST_BROKER points at RabbitMQ and
    WARREN_TEST_RABBITMQCTL holds a rabbitmqctl command line for that node, the same
    definitions imported there (on a Warren cluster, made through its API) and removed again
    by stop()."""

    def __init__(self, definitions: dict):
        self.definitions = definitions
        self.external = bool(EXTERNAL)
        directory = scratch_dir("warren-defs-")
        os.chmod(directory, 0o755)
        path = os.path.join(directory, "definitions.json")
        with open(path, "w") as f:
            json.dump(definitions, f)
        os.chmod(path, 0o644)
        if not EXTERNAL:
            self.broker = start_broker("--definitions", path)
            return
        ctl = os.environ.get("WARREN_TEST_RABBITMQCTL")
        if not ctl:
            pytest.skip("needs its own users and vhosts: set WARREN_TEST_RABBITMQCTL to import them")
        self.ctl = shlex.split(ctl)
        host, port = EXTERNAL.rsplit(":", 1)
        self.broker = BrokerProcess(host, int(port))
        subprocess.run([*self.ctl, "import_definitions", path], check=True, capture_output=True, timeout=60)
        # The import is asynchronous: wait until the last user can log in.
        user = definitions["users"][-1]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            listed = subprocess.run([*self.ctl, "list_users", "-q"], capture_output=True, text=True, timeout=60)
            if any(line.split("\t")[0] == user["name"] for line in listed.stdout.splitlines()):
                break
            time.sleep(0.2)

    def stop(self) -> None:
        if not self.external:
            self.broker.stop()
            return
        for user in self.definitions.get("users", []):
            subprocess.run([*self.ctl, "delete_user", user["name"]], capture_output=True, timeout=60)
        for vhost in self.definitions.get("vhosts", []):
            if vhost["name"] != "/":
                subprocess.run([*self.ctl, "delete_vhost", vhost["name"]], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def broker():
    """One broker shared by the tests that only need a running broker."""
    if EXTERNAL:
        host, port = EXTERNAL.rsplit(":", 1)
        yield BrokerProcess(host, int(port))
        return
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture
def make_broker():
    """Start brokers with custom arguments; they are stopped after the test."""
    if EXTERNAL:
        pytest.skip("needs to start its own Warren broker")
    started = []

    def make(*args, **kwargs):
        b = start_broker(*args, **kwargs)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop(signal.SIGKILL)


@pytest.fixture
def uid() -> str:
    """A unique suffix for names, so tests sharing a broker never collide."""
    return uuid.uuid4().hex[:10]


def _pika_connection(broker):
    import pika
    conn = pika.BlockingConnection(broker.pika_params())
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def connection(broker):
    yield from _pika_connection(broker)


@pytest.fixture
def other_connection(broker):
    """A second pika connection (for exclusivity and cross-connection checks)."""
    yield from _pika_connection(broker)


@pytest.fixture
def channel(connection):
    return connection.channel()


@pytest.fixture
def names(broker, uid):
    """names(label) gives a unique exchange/queue name; whatever exchanges and queues carry
    these names are deleted after the test (so a shared RabbitMQ stays clean)."""
    import pika
    made = []

    def name(label):
        n = f"{label}-{uid}"
        made.append(n)
        return n

    yield name
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    for n in made:
        ch.exchange_delete(n)
        try:
            ch.queue_delete(n)
        except pika.exceptions.ChannelClosedByBroker:  # exclusive to the test's connection
            ch = conn.channel()
    conn.close()


# --------------------------------------------------------------------------------------
# Helpers for tests that use pika's BlockingConnection.

def _closed_by_broker(exception, fn, code, text):
    with pytest.raises(exception) as err:
        fn()
    got = (err.value.reply_code, err.value.reply_text)
    if code is not None:
        assert got == (code, text)
    return got


def channel_error(fn, code=None, text=None):
    """fn() must make the broker close the channel; returns (reply_code, reply_text), which
    must be (code, text) when those are given."""
    import pika
    return _closed_by_broker(pika.exceptions.ChannelClosedByBroker, fn, code, text)


def connection_error(fn, code=None, text=None):
    """fn() must make the broker close the connection; as channel_error."""
    import pika
    return _closed_by_broker(pika.exceptions.ConnectionClosedByBroker, fn, code, text)


def queue(ch, name="") -> str:
    """Declare an exclusive queue (server-named by default); returns its name."""
    return ch.queue_declare(name, exclusive=True).method.queue


def get_all(ch, queue_name) -> list:
    """Every ready message of a queue, taken with no-ack basic.gets, as (method, properties,
    body). (basic.get after publishes on the same channel sees them: RabbitMQ keeps a
    channel's order.)"""
    got = []
    while True:
        method, props, body = ch.basic_get(queue_name, auto_ack=True)
        if method is None:
            return got
        got.append((method, props, body))


def drain(ch, queue_name) -> list:
    """The bodies of every ready message of a queue (see get_all)."""
    return [body for _, _, body in get_all(ch, queue_name)]


def drain_redelivered(ch, queue_name) -> list:
    """(body, redelivered) of every ready message of a queue (see get_all)."""
    return [(body, method.redelivered) for method, _, body in get_all(ch, queue_name)]


def get_tags(ch, queue_name, n) -> list:
    """The delivery tags of the next `n` messages of a queue, taken with basic.get (and
    left unacked)."""
    return [ch.basic_get(queue_name)[0].delivery_tag for _ in range(n)]


def publish_numbered(ch, queue_name, numbers) -> None:
    """Publish str(i) for each i in `numbers` to a queue, through the default exchange."""
    for i in numbers:
        ch.basic_publish("", queue_name, str(i).encode())


def pump(connection, until, timeout=3.0) -> None:
    """Process pika events until until() holds (asserted after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert until()


class Returns:
    """The basic.returns a pika BlockingChannel receives."""

    def __init__(self, connection, channel):
        self.connection = connection
        self.got = []
        channel.add_on_return_callback(lambda ch, method, props, body: self.got.append((method, props, body)))

    def collect(self, channel) -> list:
        """(method, properties, body) of each return since the last call. A synchronous round
        trip first: RabbitMQ sends basic.return before the next reply."""
        channel.exchange_declare("amq.direct", passive=True)
        self.connection.process_data_events(0)
        got, self.got = self.got, []
        return got

    def brief(self, channel) -> list:
        """collect(), as (reply_code, exchange, routing_key, body) tuples."""
        return [(m.reply_code, m.exchange, m.routing_key, body) for m, _, body in self.collect(channel)]


@pytest.fixture
def restart_broker(make_broker):
    """Stop a broker (SIGTERM by default, or e.g. SIGKILL) and start a new one on the same data
    dir, with the given extra arguments (not the old ones: pass them again if needed)."""

    def restart(old, *args, sig=signal.SIGTERM):
        old.stop(sig)
        return make_broker(*args, data_dir=old.data_dir)

    return restart
