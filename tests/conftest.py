"""Test fixtures: a real `warren server` subprocess on a free loopback port.

Set WARREN_TEST_BROKER=host:port to run the same tests against another broker (for
example a local RabbitMQ) to compare behaviour; tests that need to start their own
broker are skipped then.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

EXTERNAL = os.environ.get("WARREN_TEST_BROKER")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """A running broker under test."""

    def __init__(self, host, port, proc=None, data_dir=None, log_path=None):
        self.host = host
        self.port = port
        self.proc = proc
        self.data_dir = data_dir
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    def pika_params(self, **kwargs):
        import pika
        kwargs.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
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


def start_broker(*extra_args, data_dir=None, port=None, wait=True) -> BrokerProcess:
    """Start `python -m warren server` and wait until it accepts connections."""
    port = port or free_port()
    data_dir = data_dir or tempfile.mkdtemp(prefix="warren-test-")
    log_path = os.path.join(data_dir, f"broker-{port}.log")
    log = open(log_path, "ab")
    cmd = [sys.executable, "-m", "warren", "server", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", data_dir, *extra_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    broker = BrokerProcess("127.0.0.1", port, proc, data_dir, log_path)
    if wait:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"broker exited with {proc.returncode}:\n{broker.log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return broker
            except OSError:
                time.sleep(0.05)
        broker.stop()
        raise RuntimeError(f"broker did not start:\n{broker.log()}")
    return broker


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


@pytest.fixture
def connection(broker):
    import pika
    conn = pika.BlockingConnection(broker.pika_params())
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection):
    return connection.channel()
