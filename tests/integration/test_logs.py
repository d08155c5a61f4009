"""The log of a real `warren server` started with RabbitMQ's log.* keys: the file it writes,
its startup lines (memory and disk limits, listeners), a pika client's connection lines in
RabbitMQ 3.10.8's words and format, rotation by size keeping log.file.rotation.count archives,
log.file = false, and bad values refused at start (exit status 2).

Warren-only: each test starts its own broker."""

import os
import re
import subprocess
import sys
import time

import pika
import pytest

from conftest import EXTERNAL, start_broker

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="starts its own Warren brokers with a config file")

# RabbitMQ's plaintext line: "$time [$level] $pid $msg".
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d \[(debug|info|notice|warning|error|critical)\] "
                  r"<([^>]+)> (.*)")


def write_config(tmp_path, *lines):
    path = tmp_path / "rabbitmq.conf"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def messages(path):
    """(level, pid, message) of each line (a message of several lines joined again)."""
    out = []
    with open(path) as f:
        for line in f.read().splitlines():
            m = LINE.fullmatch(line)
            assert m, f"not RabbitMQ's line format: {line!r}"
            level, pid, text = m.groups()
            if out and out[-1][:2] == (level, pid) and line.startswith(out[-1][3]):
                out[-1] = (level, pid, out[-1][2] + "\n" + text, out[-1][3])
            else:
                out.append((level, pid, text, line[:len(line) - len(text)]))
    return [entry[:3] for entry in out]


def test_the_log_file(tmp_path):
    log_file = tmp_path / "logs" / "warren.log"
    b = start_broker("--config", write_config(tmp_path, f"log.file = {log_file}", "log.console = false",
                                              "disk_free_limit.absolute = 2GB",
                                              "vm_memory_high_watermark.absolute = 1GiB"))
    try:
        ok = pika.BlockingConnection(b.pika_params())
        port = ok._impl._transport._sock.getsockname()[1]
        ok.channel()
        ok.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(b.pika_params(password="wrong"))
        assert wait_for(lambda: log_file.read_text().count("closing AMQP connection") == 2)
    finally:
        assert b.stop() == 0
    assert b.log() == ""  # log.console = false: nothing on stderr
    logged = messages(log_file)
    texts = [text for _, _, text in logged]
    # The startup lines the seeds quote, RabbitMQ's numbers (MiB and bytes; disk in MB of 10^6).
    assert "Memory high watermark set to 1024 MiB (1073741824 bytes) of " in "\n".join(texts)
    assert "Memory limit set to 1024MB." in texts
    assert ("info", "warren.server", "Disk free limit set to 2000MB") in logged
    assert ("info", "warren.server", f"started TCP listener on 127.0.0.1:{b.port}") in logged
    assert ("info", "warren.server", "Server startup complete; 0 plugins started.") in logged
    assert ("info", "warren.server", f"stopped TCP listener on 127.0.0.1:{b.port}") in logged
    connection = [(level, pid, text) for level, pid, text in logged if pid.startswith("0.")]
    (_, good, _), (_, bad, _) = connection[0], connection[-1]
    name = f"127.0.0.1:{port} -> 127.0.0.1:{b.port}"
    assert connection[:3] == [
        ("info", good, f"accepting AMQP connection <{good}> ({name})"),
        ("info", good, f"connection <{good}> ({name}): user 'guest' authenticated and granted access to vhost '/'"),
        ("info", good, f"closing AMQP connection <{good}> ({name}, vhost: '/', user: 'guest')")]
    name = re.search(r"\((127\.0\.0\.1:\d+ -> [^)]+)\)", connection[3][2]).group(1)
    assert good != bad and connection[3:] == [
        ("info", bad, f"accepting AMQP connection <{bad}> ({name})"),
        ("error", bad, f"Error on AMQP connection <{bad}> ({name}, state: starting):\n"
                       "PLAIN login refused: user 'guest' - invalid credentials"),
        ("info", bad, f"closing AMQP connection <{bad}> ({name})")]


def test_a_dropped_connection_is_a_warning_on_the_console(tmp_path):
    b = start_broker("--config", write_config(tmp_path, "log.console.level = warning"))
    try:
        conn = pika.BlockingConnection(b.pika_params())
        port = conn._impl._transport._sock.getsockname()[1]
        conn._impl._transport._sock.close()  # no connection.close
        assert wait_for(lambda: "client unexpectedly closed TCP connection" in b.log()), b.log()
    finally:
        b.stop()
    [first, second] = b.log().splitlines()  # warnings only: these two
    pid = LINE.fullmatch(first).group(2)
    assert LINE.fullmatch(first).groups() == ("warning", pid, f"closing AMQP connection <{pid}> (127.0.0.1:{port} -> "
                                                             f"127.0.0.1:{b.port}, vhost: '/', user: 'guest'):")
    assert LINE.fullmatch(second).groups() == ("warning", pid, "client unexpectedly closed TCP connection")


def test_rotation_by_size_keeps_count_archives(tmp_path):
    log_file = tmp_path / "warren.log"
    b = start_broker("--config", write_config(tmp_path, f"log.file = {log_file}", "log.file.rotation.size = 2000",
                                              "log.file.rotation.count = 2"))
    try:
        for _ in range(15):  # three lines of ~130 bytes each
            pika.BlockingConnection(b.pika_params()).close()
    finally:
        b.stop()
    assert sorted(os.listdir(tmp_path)) == ["rabbitmq.conf", "warren.log", "warren.log.0", "warren.log.1"]
    archives = [tmp_path / name for name in ("warren.log.1", "warren.log.0", "warren.log")]
    assert all(0 < path.stat().st_size < 2000 for path in archives)
    ids = [int(m) for path in archives for m in re.findall(r"\[info\] <0\.(\d+)\.0> accepting", path.read_text())]
    # The newest connections, in order; the oldest ones gone. (The first id went to the test's
    # check that the port is open: a connection without data, logged at debug.)
    assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[-1] == 16 and ids[0] > 2


def test_log_file_false_writes_no_file(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    # log.dir alone would put warren@localhost.log there; log.file = false turns the file off.
    b = start_broker("--config", write_config(tmp_path, f"log.dir = {logs}", "log.file = false"))
    try:
        pika.BlockingConnection(b.pika_params()).close()
        assert wait_for(lambda: "closing AMQP connection" in b.log())
    finally:
        b.stop()
    assert os.listdir(logs) == []
    assert "Server startup complete; 0 plugins started." in b.log()  # the console still has it


@pytest.mark.parametrize("lines, message", [
    (["log.file.rotation.date = $M1D0"], "rabbitmq.conf:1: log.file.rotation.date: monthly rotation ('$M1D0') "
                                         "is not supported"),
    (["log.file = /tmp/x.log", "log.file.rotation.count = many"],
     "rabbitmq.conf:2: log.file.rotation.count: expected an integer, got 'many'"),
    (["log.file = /proc/warren/warren.log"], "warren: cannot open log file /proc/warren/warren.log: "),
])
def test_bad_values_stop_the_start(tmp_path, lines, message):
    proc = subprocess.run([sys.executable, "-m", "warren", "server", "--port", "0", "--management-port", "0",
                           "--prometheus-port", "0", "--data-dir", str(tmp_path / "data"),
                           "--config", write_config(tmp_path, *lines)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
