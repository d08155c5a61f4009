"""Every publish is confirmed, and soon, while the machine's other core is busy: a publisher
keeping a full window of 500 unconfirmed 16-byte messages, each with its own routing key,
into a topic exchange with 10,000 bindings to 5,000 queues (the conditions of bench/run.py's
scaling sequence, scenarios 8 and 9, in which a publisher was reported to wait minutes with its
window full, no confirm and no connection.blocked).

The test declares and deletes 10,000 queues first (scenario 8's churn), then the topology,
then publishes for a few seconds with keys that match one binding each, then with keys that
match none, and checks: no publish waits longer than CONFIRM_BOUND for its confirm, none is
nacked, none is left unconfirmed, and no connection.blocked comes (the client announces the
capability, so a resource alarm would show). The same holds on RabbitMQ (both brokers).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from pamqp import commands, frame as pframe

import rawamqp

QUEUES = 5000
BINDINGS = 2 * QUEUES       # a.b{i}.* and a.#.u{i} to queue i
WINDOW = 500                # unconfirmed publishes at most
PHASE_SECONDS = 4.0         # each publish phase
CONFIRM_BOUND = 10.0        # seconds from a publish to its confirm, at most (the stall was minutes)
CHURN = 10_000              # queues declared and deleted first
PIPELINE = 1000             # declare/bind/delete requests in flight

pytestmark = pytest.mark.timeout(240)


class BusyCore:
    """A process that keeps one core busy: the highest-numbered CPU this process may use, so
    on a 2-core machine the broker and the clients share the other one."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(self.proc.pid, {cpus[-1]})

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _pipelined(raw: rawamqp.RawClient, methods, reply: type) -> None:
    """Send the methods on channel 1 with up to PIPELINE awaiting their replies."""
    sent = answered = 0
    batch: list[bytes] = []
    for method in methods:
        batch.append(pframe.marshal(method, 1))
        sent += 1
        if len(batch) == 200:
            raw.send(b"".join(batch))
            batch = []
        while sent - answered >= PIPELINE:
            raw.expect(reply, 1, timeout=60)
            answered += 1
    if batch:
        raw.send(b"".join(batch))
    while answered < sent:
        raw.expect(reply, 1, timeout=60)
        answered += 1


def _publish_frames(exchange: bytes, key: bytes, body: bytes) -> bytes:
    """basic.publish, its content header and body on channel 1, encoded here (fast enough
    that the broker, not the test, sets the pace)."""
    method = struct.pack(">HHH", 60, 40, 0) + bytes((len(exchange),)) + exchange + bytes((len(key),)) + key + b"\x00"
    header = struct.pack(">HHQH", 60, 0, len(body), 0)
    return b"".join((struct.pack(">BHI", 1, 1, len(method)), method, b"\xce",
                     struct.pack(">BHI", 2, 1, len(header)), header, b"\xce",
                     struct.pack(">BHI", 3, 1, len(body)), body, b"\xce"))


class ConfirmingPublisher:
    """A confirm-mode channel keeping WINDOW publishes unconfirmed, recording each one's
    confirm latency."""

    def __init__(self, broker, exchange: str) -> None:
        self.raw = rawamqp.connect(broker, timeout=30)
        self.raw.open_channel(1)
        self.raw.call(1, commands.Confirm.Select())
        self.exchange = exchange.encode()
        self.sent_at: dict[int, float] = {}  # delivery tag -> send time, unconfirmed
        self.tag = 0
        self.confirmed = self.nacked = 0
        self.worst = 0.0
        self.blocked: list = []

    def _handle(self, frame: rawamqp.Frame) -> None:
        value = frame.value
        if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
            now = time.monotonic()
            tags = [value.delivery_tag]
            if value.multiple:  # (sent_at is in tag order)
                tags = [t for t in self.sent_at if t <= value.delivery_tag]
            for t in tags:
                self.worst = max(self.worst, now - self.sent_at.pop(t))
            if isinstance(value, commands.Basic.Nack):
                self.nacked += len(tags)
            else:
                self.confirmed += len(tags)
        elif isinstance(value, (commands.Connection.Blocked, commands.Connection.Unblocked)):
            self.blocked.append(value)
        else:
            raise AssertionError(f"unexpected frame while publishing: {value!r}")

    def _read(self, wait: float) -> None:
        """Handle the next frame (waiting up to `wait` seconds) and those read with it."""
        self._handle(self.raw.read_frame(timeout=wait))
        buf = self.raw.buf
        while len(buf) >= 8 and len(buf) >= 8 + struct.unpack_from(">I", buf, 3)[0]:
            self._handle(self.raw.read_frame())

    def _wait_for_room(self, room: int) -> None:
        while len(self.sent_at) > WINDOW - room:
            oldest = min(self.sent_at.values())
            left = oldest + CONFIRM_BOUND - time.monotonic()
            try:
                self._read(max(left, 0.001))
            except TimeoutError:
                raise AssertionError(
                    f"no confirm for {CONFIRM_BOUND:.0f} s with {len(self.sent_at)} publishes unconfirmed "
                    f"(window {WINDOW}; {self.confirmed} confirmed so far)") from None

    def publish_for(self, seconds: float, key_of) -> int:
        """Publish 16-byte messages with key_of(n) as routing key for `seconds`, keeping the
        window full; then wait for every confirm. Returns how many were published."""
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            self._wait_for_room(100)
            chunk = []
            now = time.monotonic()
            for _ in range(100):
                self.tag += 1
                self.sent_at[self.tag] = now
                chunk.append(_publish_frames(self.exchange, key_of(n), n.to_bytes(16, "big")))
                n += 1
            self.raw.send(b"".join(chunk))
        self._wait_for_room(WINDOW)
        return n

    def close(self) -> None:
        self.raw.close()


@pytest.mark.not_on_warren_cluster("declares 15,000 queues and 10,000 bindings first, each a change through etcd: "
                                   "more than its time limit on a cluster (docs/clustering.md#speed)")
def test_a_full_confirm_window_is_confirmed_within_a_bound_on_a_busy_machine(broker, uid):
    busy = BusyCore()
    setup = rawamqp.connect(broker, timeout=60)
    publisher = None
    try:
        setup.open_channel(1)
        churn = [f"churn-{uid}-{i}" for i in range(CHURN)]
        _pipelined(setup, (commands.Queue.Declare(queue=q, exclusive=True) for q in churn), commands.Queue.DeclareOk)
        _pipelined(setup, (commands.Queue.Delete(queue=q) for q in churn), commands.Queue.DeleteOk)
        exchange = f"topic-{uid}"
        setup.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="topic", auto_delete=True))
        # Exclusive queues: they go with the set-up connection, on either broker.
        queues = [f"topic-{uid}-{i}" for i in range(QUEUES)]
        _pipelined(setup, (commands.Queue.Declare(queue=q, exclusive=True) for q in queues), commands.Queue.DeclareOk)
        _pipelined(setup, (commands.Queue.Bind(queue=queues[i // 2], exchange=exchange,
                                               routing_key=f"a.b{i // 2}.*" if i % 2 == 0 else f"a.#.u{i // 2}")
                           for i in range(BINDINGS)), commands.Queue.BindOk)

        publisher = ConfirmingPublisher(broker, exchange)
        # One match each (a.b{k}.*: the last word is no u{i}), then none (no pattern starts with n).
        matched = publisher.publish_for(PHASE_SECONDS, lambda n: b"a.b%d.x%d" % (n % QUEUES, 10_000_000 + n))
        unmatched = publisher.publish_for(PHASE_SECONDS, lambda n: b"n.b%d.x%d" % (10_000_000 + n, n))
        print(f"{matched} routed and {unmatched} unroutable publishes confirmed; longest confirm "
              f"{publisher.worst * 1000:.0f} ms")
        assert publisher.confirmed == matched + unmatched and publisher.nacked == 0
        assert publisher.worst < CONFIRM_BOUND
        assert not publisher.blocked, publisher.blocked
        assert matched > WINDOW and unmatched > WINDOW
        # Every routed message is in its queue (one each: queue k got the keys n with n % QUEUES == k).
        depth = setup.call(1, commands.Queue.Declare(queue=queues[0], passive=True)).message_count
        assert depth == len(range(0, matched, QUEUES))
    finally:
        busy.stop()
        if publisher is not None:
            publisher.close()
        setup.close()  # its exclusive queues go, and the auto-delete exchange with their bindings

