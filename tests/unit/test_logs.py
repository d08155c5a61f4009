"""The log (warren.cli.logs, warren.session.connection_log): the log.* config keys in both
formats, RabbitMQ's line format, rotation by size and date with RabbitMQ's archive names, and
the connection lines a session writes, word for word as RabbitMQ 3.10.8's (the expected texts
were read off a RabbitMQ 3.10.8 node's log, tools/rabbitmq_node.py)."""

import datetime
import gzip
import logging
import os
import re
import sys

import pytest
from pamqp import commands, frame

from .fake_transport import PROTOCOL_HEADER, Client, FakeTransport, make_connection
from warren.broker.broker import Broker
from warren.cli import logs
from warren.cli.config import ConfigError, parse_config


def conf(*lines):
    return parse_config("\n".join(lines) + "\n", "rabbitmq.conf")


def errors(*lines, path="rabbitmq.conf"):
    with pytest.raises(ConfigError) as info:
        parse_config("\n".join(lines) + "\n", path)
    return info.value.errors


# ------------------------------------------------------------------------- config keys

@pytest.mark.parametrize("line, expected", [
    ("log.file = /var/log/warren/warren.log", {"log_file": "/var/log/warren/warren.log"}),
    ("log.file = warren.log", {"log_file": "warren.log"}),
    ("log.file = false", {"log_file": False}),
    ("log.file.level = debug", {"log_file_level": "debug"}),
    ("log.file.level = <=notice", {"log_file_level": "<=notice"}),
    ("log.file.level = none", {"log_file_level": "none"}),
    ("log.file.rotation.size = 10485760", {"log_file_rotation_size": 10485760}),
    ("log.file.rotation.size = 10MiB", {"log_file_rotation_size": 10485760}),
    ("log.file.rotation.count = 5", {"log_file_rotation_count": 5}),
    ("log.file.rotation.count = 0", {"log_file_rotation_count": 0}),
    ("log.file.rotation.date = $D0", {"log_file_rotation_date": ("day", 0)}),
    ("log.file.rotation.date = $D23", {"log_file_rotation_date": ("day", 23)}),
    ("log.file.rotation.date = $W0D23", {"log_file_rotation_date": ("week", 0, 23)}),
    ("log.file.rotation.date = $W5", {"log_file_rotation_date": ("week", 5, 0)}),
    ("log.file.rotation.date = $H00", {"log_file_rotation_date": ("hour", 0)}),
    ("log.file.rotation.date = $H30", {"log_file_rotation_date": ("hour", 30)}),
    ("log.file.rotation.compress = true", {"log_file_rotation_compress": True}),
    ("log.console = false", {"log_console": False}),
    ("log.console = true", {"log_console": True}),
    ("log.console.stdio = stdout", {"log_console_stdio": "stdout"}),
    ("log.connection.level = warning", {"log_connection_level": logging.WARNING}),
    ("log.channel.level = none", {"log_channel_level": logging.CRITICAL + 10}),
])
def test_new_style_keys(line, expected):
    assert conf(line) == expected


def test_log_dir(tmp_path):
    assert conf(f"log.dir = {tmp_path}") == {"log_dir": str(tmp_path)}
    assert errors(f"log.dir = {tmp_path}/nowhere") == [
        f"rabbitmq.conf:1: log.dir: '{tmp_path}/nowhere' is not a writable directory"]


LEVELS = "debug, info, notice, warning, error, critical, alert, emergency, none"


@pytest.mark.parametrize("line, reason", [
    ("log.file = true", "expected a file path, or false to log to no file, got 'true'"),
    ("log.file.level = verbose", f"expected one of {LEVELS}, =debug, !=info, <=notice, <warning, got 'verbose'"),
    ("log.file.rotation.size = 0", "expected a positive number of bytes, got 0"),
    ("log.file.rotation.size = ten", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, "
                                     "4Gi, 10GB, 2TB, got 'ten'"),
    ("log.file.rotation.count = -1", "expected a number of archived files from 0 to 1000, got -1"),
    ("log.file.rotation.count = 5000", "expected a number of archived files from 0 to 1000, got 5000"),
    ("log.file.rotation.date = $M1D0", "monthly rotation ('$M1D0') is not supported: expected $D<hour> (daily, "
                                       "such as $D0 or $D23), $W<day>D<hour> (weekly, day 0 = Sunday, such as "
                                       "$W0D23) or $H<minute> (hourly, such as $H00), or rotation by size"),
    ("log.file.rotation.date = daily", "expected $D<hour> (daily, such as $D0 or $D23), $W<day>D<hour> (weekly, "
                                       "day 0 = Sunday, such as $W0D23) or $H<minute> (hourly, such as $H00), "
                                       "got 'daily'"),
    ("log.file.rotation.date = $D24", "expected an hour from 0 to 23, got '$D24'"),
    ("log.file.rotation.date = $W7", "expected $D<hour> (daily, such as $D0 or $D23), $W<day>D<hour> (weekly, "
                                     "day 0 = Sunday, such as $W0D23) or $H<minute> (hourly, such as $H00), "
                                     "got '$W7'"),
    ("log.file.rotation.date = $H60", "expected a minute from 0 to 59 in $H<minute>, got '$H60'"),
    ("log.console = yes", "expected true or false, got 'yes'"),
    ("log.console.stdio = stdin", "expected stdout or stderr, got 'stdin'"),
    ("log.connection.level = loud", f"expected one of {LEVELS}, got 'loud'"),
    ("log.syslog = true", "unknown key"),
])
def test_new_style_bad_values(line, reason):
    assert errors(line) == [f"rabbitmq.conf:1: {line.split(' = ')[0]}: {reason}"]


def test_classic_format(tmp_path):
    text = f"""[{{rabbit, [{{log_root, "{tmp_path}"}},
  {{log, [{{console, [{{enabled, false}}, {{level, debug}}, {{stdio, stdout}}]}},
          {{file, [{{file, "warren.log"}}, {{level, '<warning'}}, {{date, "$D0"}}, {{size, 1000}},
                   {{count, 3}}, {{compress, true}}]}},
          {{categories, [{{connection, [{{level, warning}}]}}, {{channel, [{{level, error}}]}}]}}]}}]}}].
"""
    assert parse_config(text, "rabbitmq.config") == {
        "log_dir": str(tmp_path), "log_console": False, "log_level": logging.DEBUG, "log_console_stdio": "stdout",
        "log_file": "warren.log", "log_file_level": "<warning", "log_file_rotation_date": ("day", 0),
        "log_file_rotation_size": 1000, "log_file_rotation_count": 3, "log_file_rotation_compress": True,
        "log_connection_level": logging.WARNING, "log_channel_level": logging.ERROR}
    assert parse_config("[{rabbit, [{log, [{file, [{file, false}]}]}]}].", "rabbitmq.config") == {"log_file": False}
    with pytest.raises(ConfigError) as info:
        parse_config('[{rabbit, [{log, [{file, [{date, "$M1"}, {count, x}]},\n'
                     '                  {categories, [{queue, [{level, debug}]}]}]}]}].', "rabbitmq.config")
    assert info.value.errors == [
        "rabbitmq.config:1: rabbit.log.file.date: monthly rotation ('$M1') is not supported: expected $D<hour> "
        "(daily, such as $D0 or $D23), $W<day>D<hour> (weekly, day 0 = Sunday, such as $W0D23) or $H<minute> "
        "(hourly, such as $H00), or rotation by size",
        "rabbitmq.config:1: rabbit.log.file.count: expected an integer, got x",
        "rabbitmq.config:2: rabbit.log.categories.queue: unknown key"]


# ----------------------------------------------------------------------- line format

def record(message, *args, level=logging.INFO, name="warren.server", **extra):
    rec = logging.LogRecord(name, level, __file__, 1, message, args, None)
    rec.__dict__.update(extra)
    return rec


LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d) \[(\w+)\] (<[^>]+>) (.*)")


def test_rabbitmq_line_format():
    formatter = logs.RabbitFormatter()
    rec = record("Disk free limit set to %dMB", 50)
    stamp, level, origin, message = LINE.fullmatch(formatter.format(rec)).groups()
    assert (level, origin, message) == ("info", "<warren.server>", "Disk free limit set to 50MB")
    assert datetime.datetime.fromisoformat(stamp).timestamp() == pytest.approx(rec.created, abs=1e-6)
    # A connection's lines carry its id; every line of a message gets the prefix.
    lines = formatter.format(record("closing AMQP connection <0.7.0> (a -> b):\nclient unexpectedly closed TCP "
                                    "connection", level=logging.WARNING, erl_pid="<0.7.0>")).split("\n")
    assert [LINE.fullmatch(line).groups()[1:] for line in lines] == [
        ("warning", "<0.7.0>", "closing AMQP connection <0.7.0> (a -> b):"),
        ("warning", "<0.7.0>", "client unexpectedly closed TCP connection")]
    assert len({line.split(" [")[0] for line in lines}) == 1  # the same time on each
    levels = [LINE.fullmatch(formatter.format(record("x", level=n))).group(2)
              for n in (logging.DEBUG, logging.INFO, logs.NOTICE, logging.WARNING, logging.ERROR, logging.CRITICAL)]
    assert levels == ["debug", "info", "notice", "warning", "error", "critical"]
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("warren", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(rec).split("\n")
    assert all(LINE.fullmatch(line) for line in text) and text[-1].endswith("] <warren> ValueError: boom")


@pytest.mark.parametrize("level, kept", [
    ("debug", ["debug", "info", "notice", "warning", "error"]),
    ("notice", ["notice", "warning", "error"]),
    ("=debug", ["debug"]),
    ("!=info", ["debug", "notice", "warning", "error"]),
    ("<=notice", ["debug", "info", "notice"]),
    ("<warning", ["debug", "info", "notice"]),
    ("none", []),
])
def test_file_levels(level, kept):
    threshold, level_filter = logs.file_level(level)
    names = ["debug", "info", "notice", "warning", "error"]
    passed = [n for n in names if logs.LEVELS[n] >= threshold
              and (level_filter is None or level_filter.filter(record("x", level=logs.LEVELS[n])))]
    assert passed == kept


# ---------------------------------------------------------------------------- rotation

def local(*args):
    return datetime.datetime(*args).timestamp()


@pytest.mark.parametrize("spec, now, expected", [
    (("day", 0), (2026, 11, 27, 9, 0, 0), (2026, 11, 28, 0, 0, 0)),
    (("day", 23), (2026, 11, 27, 9, 0, 0), (2026, 11, 27, 23, 0, 0)),
    (("day", 9), (2026, 11, 27, 9, 0, 0), (2026, 11, 28, 9, 0, 0)),  # just now: the next one
    (("day", 0), (2026, 12, 31, 23, 59, 59), (2027, 1, 1, 0, 0, 0)),
    (("hour", 0), (2026, 11, 27, 9, 10, 0), (2026, 11, 27, 10, 0, 0)),
    (("hour", 30), (2026, 11, 27, 9, 10, 0), (2026, 11, 27, 9, 30, 0)),
    (("hour", 30), (2026, 11, 27, 23, 45, 0), (2026, 11, 28, 0, 30, 0)),
    (("week", 0, 23), (2026, 11, 27, 9, 0, 0), (2026, 11, 29, 23, 0, 0)),  # a Friday: Sunday next
    (("week", 5, 16), (2026, 11, 27, 9, 0, 0), (2026, 11, 27, 16, 0, 0)),  # Friday, later today
    (("week", 5, 0), (2026, 11, 27, 9, 0, 0), (2026, 12, 4, 0, 0, 0)),  # Friday, earlier today
])
def test_next_rollover(spec, now, expected):
    assert datetime.datetime.fromtimestamp(logs.next_rollover(spec, local(*now))) == datetime.datetime(*expected)


def emit(handler, text):
    handler.handle(record("%s", text))


def test_rotation_by_size_keeps_count_archives(tmp_path):
    path = str(tmp_path / "warren.log")
    handler = logs.RotatingLogFile(path, size=1000, count=3)
    handler.setFormatter(logs.RabbitFormatter())
    for i in range(100):
        emit(handler, f"line {i:03d} " + "x" * 40)
    handler.close()
    assert sorted(os.listdir(tmp_path)) == ["warren.log", "warren.log.0", "warren.log.1", "warren.log.2"]
    contents = [open(f"{path}{suffix}").read() for suffix in (".2", ".1", ".0", "")]
    assert all(0 < os.path.getsize(f"{path}{s}") <= 1000 for s in (".2", ".1", ".0"))
    numbers = [int(n) for text in contents for n in re.findall(r"line (\d+)", text)]
    assert numbers == list(range(numbers[0], 100))  # the newest lines, oldest archive first, none lost between


def test_rotation_count_zero_starts_the_file_afresh(tmp_path):
    path = str(tmp_path / "warren.log")
    handler = logs.RotatingLogFile(path, size=500, count=0)
    for i in range(50):
        emit(handler, f"line {i} " + "x" * 40)
    handler.close()
    assert os.listdir(tmp_path) == ["warren.log"]
    assert "line 49" in open(path).read() and os.path.getsize(path) <= 500


def test_rotation_by_date(tmp_path):
    now = [local(2026, 11, 27, 23, 59, 0)]
    path = str(tmp_path / "warren.log")
    handler = logs.RotatingLogFile(path, count=2, date=("day", 0), clock=lambda: now[0])
    emit(handler, "thursday")
    now[0] = local(2026, 11, 28, 0, 0, 1)
    emit(handler, "friday")
    emit(handler, "friday again")
    now[0] = local(2026, 11, 29, 0, 0, 1)
    emit(handler, "saturday")
    now[0] = local(2026, 11, 30, 0, 0, 1)
    emit(handler, "sunday")
    handler.close()
    assert sorted(os.listdir(tmp_path)) == ["warren.log", "warren.log.0", "warren.log.1"]
    assert [open(f"{path}{s}").read().split("\n")[:-1] for s in (".1", ".0", "")] == [
        ["friday", "friday again"], ["saturday"], ["sunday"]]


def test_rotation_compressed(tmp_path):
    path = str(tmp_path / "warren.log")
    handler = logs.RotatingLogFile(path, size=300, count=2, compress=True)
    for i in range(30):
        emit(handler, f"line {i} " + "x" * 40)
    handler.close()
    assert sorted(os.listdir(tmp_path)) == ["warren.log", "warren.log.0.gz", "warren.log.1.gz"]
    assert gzip.open(f"{path}.0.gz", "rt").read().startswith("line ")


def test_log_file_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert logs.log_file_path({}) is None
    assert logs.log_file_path({"log_file": "a.log"}) == str(tmp_path / "a.log")
    assert logs.log_file_path({"log_file": "a.log", "log_dir": "/var/log/w"}) == "/var/log/w/a.log"
    assert logs.log_file_path({"log_file": "/tmp/b.log", "log_dir": "/var/log/w"}) == "/tmp/b.log"
    assert logs.log_file_path({"log_dir": "/var/log/w"}) == "/var/log/w/warren@localhost.log"
    # As RabbitMQ: a console enabled explicitly turns the default file off, not a named one.
    assert logs.log_file_path({"log_dir": "/var/log/w", "log_console": True}) is None
    assert logs.log_file_path({"log_file": "a.log", "log_console": True}) == str(tmp_path / "a.log")
    assert logs.log_file_path({"log_file": False, "log_dir": "/var/log/w"}) is None


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    loggers = {name: logging.getLogger(name).level for name in ("warren.connection", "warren.channel")}
    yield root
    for handler in root.handlers[:]:
        if handler not in saved[0]:
            root.removeHandler(handler)
            handler.close()
    for handler in saved[0]:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(saved[1])
    for name, level in loggers.items():
        logging.getLogger(name).setLevel(level)


def test_configure(tmp_path, root_logger):
    path = tmp_path / "logs" / "warren.log"  # its directory is made
    handlers = logs.configure({"log_file": str(path), "log_file_level": "debug", "log_level": logging.WARNING,
                               "log_console_stdio": "stdout", "log_connection_level": logging.ERROR})
    console, file = handlers
    assert root_logger.handlers == handlers and root_logger.level == logging.DEBUG
    assert console.stream is sys.stdout and console.level == logging.WARNING
    assert isinstance(file, logging.handlers.WatchedFileHandler) and file.level == logging.DEBUG
    assert logging.getLogger("warren.connection").level == logging.ERROR
    logging.getLogger("warren.server").debug("quiet %s", "here")
    logging.getLogger("warren.connection").warning("not written")
    file.flush()
    [line] = path.read_text().splitlines()
    assert line.endswith(" [debug] <warren.server> quiet here")
    # The command line's level wins for the console; rotation keys give the rotating handler.
    console, file = logs.configure({"log_console": True, "log_file": str(path), "log_file_rotation_date": ("day", 0)},
                                   console_level=logging.DEBUG)
    assert console.stream is sys.stderr and console.level == logging.DEBUG
    assert isinstance(file, logs.RotatingLogFile) and file.level == logging.INFO
    assert logs.configure({"log_console": False}) == [] and root_logger.level > logging.CRITICAL
    with pytest.raises(logs.LogSetupError, match="cannot open log file /proc/warren.log: "):
        logs.configure({"log_file": "/proc/warren.log"})


# ------------------------------------------------------------ a connection's lines

def lines(caplog):
    return [(r.levelname.lower(), getattr(r, "erl_pid", None), r.getMessage()) for r in caplog.records
            if r.name in ("warren.connection", "warren.channel")]


def login(conn, user="guest", password="guest", vhost="/"):
    conn.data_received(PROTOCOL_HEADER)
    conn.data_received(frame.marshal(commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response=f"\0{user}\0{password}"), 0))
    conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0))
    conn.data_received(frame.marshal(commands.Connection.Open(vhost), 0))


def test_connection_lines(caplog):
    caplog.set_level(logging.DEBUG)
    client = Client()
    conn = client.conn
    pid, name = conn.log_id, "127.0.0.1:50000 -> 127.0.0.1:5672"
    assert re.fullmatch(r"<0\.\d+\.0>", pid)
    client.open_channel(1)
    client.call(1, commands.Queue.Declare(queue="missing", passive=True))
    client.send(0, commands.Connection.Close(200, "bye", 0, 0))
    conn.connection_lost()
    conn.connection_lost()  # (the transport may say so twice: logged once)
    assert lines(caplog) == [
        ("info", pid, f"accepting AMQP connection {pid} ({name})"),
        ("info", pid, f"connection {pid} ({name}): user 'guest' authenticated and granted access to vhost '/'"),
        ("error", pid, f"Channel error on connection {pid} ({name}, vhost: '/', user: 'guest'), channel 1:\n"
                       "operation queue.declare caused a channel exception not_found: no queue 'missing' in vhost '/'"),
        ("info", pid, f"closing AMQP connection {pid} ({name}, vhost: '/', user: 'guest')")]


def test_connection_lines_of_failures(caplog):
    caplog.set_level(logging.DEBUG)
    broker = Broker.with_defaults()

    def connection(peer=("127.0.0.1", 50001)):
        return make_connection(broker, FakeTransport(peer=peer))

    refused = connection()
    login(refused, password="wrong")
    refused.connection_lost()
    no_vhost = connection()
    login(no_vhost, vhost="nope")
    no_vhost.connection_lost()
    dropped = connection()
    login(dropped)
    dropped.connection_lost()
    http = connection()
    http.data_received(b"GET / HTTP/1.1\r\n")
    http.connection_lost()
    health_check = connection(("::1", 50002))
    health_check.connection_lost()
    hard = connection()
    login(hard)
    hard.data_received(frame.marshal(commands.Channel.Open(), 0))
    hard.connection_lost()
    name = "127.0.0.1:50001 -> 127.0.0.1:5672"
    r, v, d, h, c, x = (c.log_id for c in (refused, no_vhost, dropped, http, health_check, hard))
    assert [(level, text) for level, _, text in lines(caplog)] == [
        ("info", f"accepting AMQP connection {r} ({name})"),
        ("error", f"Error on AMQP connection {r} ({name}, state: starting):\n"
                  "PLAIN login refused: user 'guest' - invalid credentials"),
        ("info", f"closing AMQP connection {r} ({name})"),
        ("info", f"accepting AMQP connection {v} ({name})"),
        ("error", f"Error on AMQP connection {v} ({name}, user: 'guest', state: opening):\nvhost nope not found"),
        ("info", f"closing AMQP connection {v} ({name}, vhost: 'none', user: 'guest')"),
        ("info", f"accepting AMQP connection {d} ({name})"),
        ("info", f"connection {d} ({name}): user 'guest' authenticated and granted access to vhost '/'"),
        ("warning", f"closing AMQP connection {d} ({name}, vhost: '/', user: 'guest'):\n"
                    "client unexpectedly closed TCP connection"),
        ("info", f"accepting AMQP connection {h} ({name})"),
        ("error", f"closing AMQP connection {h} ({name}):\n{{bad_header,<<\"GET / HT\">>}}"),
        ("debug", f"accepting AMQP connection {c} ([::1]:50002 -> 127.0.0.1:5672)"),
        ("debug", f"closing AMQP connection {c} ([::1]:50002 -> 127.0.0.1:5672):\n"
                  "connection_closed_with_no_data_received"),
        ("info", f"accepting AMQP connection {x} ({name})"),
        ("info", f"connection {x} ({name}): user 'guest' authenticated and granted access to vhost '/'"),
        ("error", f"Error on AMQP connection {x} ({name}, vhost: '/', user: 'guest', state: running), channel 0:\n"
                  " operation channel.open caused a connection exception channel_error: "
                  "\"unexpected method in connection state running\""),
        ("info", f"closing AMQP connection {x} ({name}, vhost: '/', user: 'guest')")]


def test_nothing_logged_per_message(caplog):
    client = Client()
    client.open_channel(1)
    client.declare(1, "q")
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    client.fill(1, "q", [b"x"] * 100)
    assert len(client.drain(1, "q")) == 100
    assert caplog.records == []


def test_tuning_and_handshake_errors(caplog):
    caplog.set_level(logging.DEBUG)
    broker = Broker.with_defaults()
    conn = make_connection(broker, FakeTransport())
    conn.data_received(PROTOCOL_HEADER)
    conn.data_received(frame.marshal(commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"), 0))
    conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, 1024, 0), 0))
    other = make_connection(broker, FakeTransport())
    other.data_received(PROTOCOL_HEADER)
    other.data_received(frame.marshal(commands.Connection.StartOk(mechanism="CRAM-MD5", response=""), 0))
    messages = [text for _, _, text in lines(caplog)]
    assert messages[1] == (f"closing AMQP connection {conn.log_id} (127.0.0.1:50000 -> 127.0.0.1:5672):\n"
                           "failed to negotiate connection parameters: negotiated frame_max = 1024 is lower than "
                           "the minimum allowed value (4096)")
    assert messages[3] == (f"closing AMQP connection {other.log_id} (127.0.0.1:50000 -> 127.0.0.1:5672):\n"
                           "{handshake_error,starting,0,{amqp_error,command_invalid,"
                           "\"unknown authentication mechanism 'CRAM-MD5'\",none}}")
    conn.connection_lost()
    other.connection_lost()
    assert len(lines(caplog)) == 4  # their last line was that one

