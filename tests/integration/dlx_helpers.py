"""Helpers shared by the dead-lettering, TTL, length-limit, policy and retry-chain tests
(test_dlx, test_ttl, test_max_length, test_queue_policies, test_retry_chain).

Everything here goes through real clients or the broker's own control command, so the same
tests run against Warren and against RabbitMQ 3.10 (WARREN_TEST_BROKER with
WARREN_TEST_RABBITMQCTL, as `tools/rabbitmq_node.py run` sets them).
"""

from __future__ import annotations

import datetime
import os
import shlex
import struct
import subprocess
import time

import pika
import pytest
from pamqp import commands as c

from conftest import EXTERNAL
from rawamqp import FRAME_HEADER, connect
from warrenctl_path import WARRENCTL

DLX = "x-dead-letter-exchange"
DLRK = "x-dead-letter-routing-key"
TTL = "x-message-ttl"
EXPIRES = "x-expires"
MAX_LENGTH = "x-max-length"
MAX_BYTES = "x-max-length-bytes"
OVERFLOW = "x-overflow"

# The keys of an x-death entry in the order RabbitMQ 3.10 writes a new entry
# (rabbit_dead_letter:make_msg/5: count first, then the event, original-expiration last).
NEW_ENTRY_KEYS = ["count", "reason", "queue", "time", "exchange", "routing-keys"]


def wait_until(check, timeout: float = 5.0, interval: float = 0.01, what: str = ""):
    """check() until it returns a true value (returned); fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}: last value {got!r}")
        time.sleep(interval)


def message_count(ch, queue_name: str) -> int:
    """The queue's ready-message count (passive queue.declare)."""
    return ch.queue_declare(queue_name, passive=True).method.message_count


def wait_count(ch, queue_name: str, n: int, timeout: float = 5.0) -> None:
    """Wait until the queue holds exactly `n` ready messages."""
    wait_until(lambda: message_count(ch, queue_name) == n, timeout, what=f"{queue_name} to hold {n}")


def get_one(ch, queue_name: str, timeout: float = 5.0, auto_ack: bool = True):
    """(method, properties, body) of the next message of a queue, polling basic.get until one
    arrives (dead-lettering and expiry are asynchronous on RabbitMQ)."""
    return wait_until(lambda: _get(ch, queue_name, auto_ack), timeout, what=f"a message in {queue_name}")


def _get(ch, queue_name, auto_ack):
    method, props, body = ch.basic_get(queue_name, auto_ack=auto_ack)
    return (method, props, body) if method is not None else None


def get_n(ch, queue_name: str, n: int, timeout: float = 5.0) -> list:
    """The next `n` messages of a queue (polling), as (method, properties, body)."""
    return [get_one(ch, queue_name, timeout) for _ in range(n)]


def bodies(messages) -> list:
    return [body for _, _, body in messages]


def queue_exists(ch_factory, queue_name: str) -> bool:
    """Whether a queue exists (a passive declare on a fresh channel of the connection
    `ch_factory`, since a 404 closes the channel)."""
    ch = ch_factory.channel()
    try:
        ch.queue_declare(queue_name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    ch.close()
    return True


def deaths(props) -> list:
    """The x-death entries of a dead-lettered message with their `time` checked (a datetime,
    within a minute of now) and removed, so the rest can be compared exactly."""
    entries = []
    for entry in props.headers["x-death"]:
        entry = dict(entry)
        t = entry.pop("time")
        assert isinstance(t, datetime.datetime), t
        now = datetime.datetime.now(datetime.timezone.utc).timestamp()
        assert abs(t.timestamp() - now) < 60, t
        entries.append(entry)
    return entries


def is_long(value) -> bool:
    """pika decodes AMQP long-long ints ('l') to pika.compat.long and 32-bit ones to int."""
    return isinstance(value, pika.compat.long)


def declare(ch, name: str, **arguments) -> str:
    """Declare a (non-exclusive: other connections dead-letter into it) queue with the given
    x-arguments, written with underscores for dashes after the `x_` prefix, e.g.
    declare(ch, q, x_message_ttl=100, x_dead_letter_exchange="dlx")."""
    args = {key.replace("_", "-"): value for key, value in arguments.items()}
    ch.queue_declare(name, arguments=args or None)
    return name


# --------------------------------------------------------------------------------------
# Header tables with their AMQP field types, read from the raw content header.

def typed_headers(broker, queue_name: str, timeout: float = 5.0) -> list:
    """basic.get one message (no-ack) from a queue over a raw socket and return its headers
    table exactly as the broker encoded it: a list of (name, type_letter, value) in wire
    order, where a table's value is such a list and an array's a list of (type, value)."""
    with connect(broker) as raw:
        raw.open_channel(1)
        deadline = time.monotonic() + timeout
        while True:
            raw.send_method(1, c.Basic.Get(queue=queue_name, no_ack=True))
            reply = raw.read_frame().value
            if isinstance(reply, c.Basic.GetOk):
                break
            assert isinstance(reply, c.Basic.GetEmpty), reply
            assert time.monotonic() < deadline, f"no message in {queue_name}"
            time.sleep(0.02)
        f = raw.read_frame()
        assert f.type == FRAME_HEADER
        return _content_header_table(f.payload)


def _content_header_table(payload: bytes) -> list:
    # class id, weight, body size, then property flags: content-type (bit 15),
    # content-encoding (bit 14), headers (bit 13).
    (flags,) = struct.unpack_from(">H", payload, 12)
    pos = 14
    for bit in (15, 14):
        if flags & (1 << bit):
            pos += 1 + payload[pos]
    if not flags & (1 << 13):
        return []
    table, _ = _table(payload, pos)
    return table


def _table(data: bytes, pos: int):
    (size,) = struct.unpack_from(">I", data, pos)
    pos += 4
    end = pos + size
    items = []
    while pos < end:
        n = data[pos]
        name = data[pos + 1:pos + 1 + n].decode()
        pos += 1 + n
        kind, value, pos = _value(data, pos)
        items.append((name, kind, value))
    return items, end


_FIXED = {"t": ">B", "b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
          "f": ">f", "d": ">d", "T": ">Q"}


def _value(data: bytes, pos: int):
    kind = chr(data[pos])
    pos += 1
    if kind in _FIXED:
        fmt = _FIXED[kind]
        (value,) = struct.unpack_from(fmt, data, pos)
        return kind, value, pos + struct.calcsize(fmt)
    if kind in "Sx":
        (n,) = struct.unpack_from(">I", data, pos)
        raw = data[pos + 4:pos + 4 + n]
        return kind, raw.decode() if kind == "S" else raw, pos + 4 + n
    if kind == "F":
        items, pos = _table(data, pos)
        return kind, items, pos
    if kind == "A":
        (n,) = struct.unpack_from(">I", data, pos)
        pos += 4
        end = pos + n
        values = []
        while pos < end:
            k, v, pos = _value(data, pos)
            values.append((k, v))
        return kind, values, end
    if kind == "V":
        return kind, None, pos
    if kind == "D":
        return kind, data[pos:pos + 5], pos + 5
    raise AssertionError(f"unknown field type {kind!r}")


# --------------------------------------------------------------------------------------
# Policies: rabbitmqctl on RabbitMQ, warrenctl on Warren, with the same arguments.

RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")


class Policies:
    """set_policy / set_operator_policy through the broker's control command; whatever is set
    is cleared by clean()."""

    def __init__(self, broker):
        if EXTERNAL:
            if not RABBITMQCTL:
                pytest.skip("needs WARREN_TEST_RABBITMQCTL to set policies on the external broker")
            self.cmd = shlex.split(RABBITMQCTL)
        else:
            assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
            self.cmd = [WARRENCTL, "--port", str(broker.mgmt_port)]
        self.made: list[tuple[str, str]] = []

    def run(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([*self.cmd, *args], capture_output=True, text=True, timeout=60)

    def _set(self, kind, name, pattern, definition, priority, apply_to):
        import json
        r = self.run(f"set_{kind}", name, pattern, json.dumps(definition), "--priority", str(priority),
                     "--apply-to", apply_to)
        assert r.returncode == 0, r
        if (kind, name) not in self.made:
            self.made.append((kind, name))

    def set(self, name, pattern, definition: dict, priority=0, apply_to="queues") -> None:
        self._set("policy", name, pattern, definition, priority, apply_to)

    def set_operator(self, name, pattern, definition: dict, priority=0, apply_to="queues") -> None:
        self._set("operator_policy", name, pattern, definition, priority, apply_to)

    def set_all(self, items) -> None:
        """Set several (kind, name, pattern, definition, priority, apply_to) at once, in parallel (each
        rabbitmqctl run starts an Erlang VM: about a second)."""
        import json
        procs = []
        for kind, name, pattern, definition, priority, apply_to in items:
            procs.append(subprocess.Popen(
                [*self.cmd, f"set_{kind}", name, pattern, json.dumps(definition), "--priority", str(priority),
                 "--apply-to", apply_to], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            self.made.append((kind, name))
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (proc.args, out, err)

    def clear(self, name) -> None:
        r = self.run("clear_policy", name)
        assert r.returncode == 0, r
        self.made.remove(("policy", name))

    def clear_operator(self, name) -> None:
        r = self.run("clear_operator_policy", name)
        assert r.returncode == 0, r
        self.made.remove(("operator_policy", name))

    def clean(self) -> None:
        procs = [subprocess.Popen([*self.cmd, f"clear_{kind}", name], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for kind, name in self.made]
        for p in procs:
            p.wait(60)
        self.made = []


@pytest.fixture
def policies(broker):
    p = Policies(broker)
    yield p
    p.clean()


def confirmed(ch, q, body) -> bool:
    """Publish on a confirm channel: True if acked, False if nacked."""
    try:
        ch.basic_publish("", q, body)
        return True
    except pika.exceptions.NackError:
        return False
