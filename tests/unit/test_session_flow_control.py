"""Per-connection credit flow (issue 10): a publisher whose messages were written into the
message store while the store's outstanding bytes (written, fsync pending) are past the
high-water mark is not read until an fsync brings them below the low-water mark. State
`flow` as RabbitMQ shows it; no connection.blocked for it. Fsyncs finish when the test says
(ManualFsync), so entering and leaving flow happen at known points."""

import time

import pytest
from pamqp import commands

from warren.session import connection as connection_module
from warren.session.throttle import Reason

from .fake_transport import Client, ManualFsync, Method, durable_broker

BODY = b"x" * 40_000  # three of them pass the high-water mark below
HIGH, LOW = 100_000, 50_000


@pytest.fixture
def fsync():
    return ManualFsync()


@pytest.fixture
def broker(tmp_path, fsync):
    broker = durable_broker(tmp_path, run_in_thread=fsync)
    broker.persister.flow_high, broker.persister.flow_low = HIGH, LOW
    return broker


def publisher(broker, queue="dq", durable=True) -> Client:
    client = Client(broker)
    client.open_channel(1)
    client.declare(1, queue, durable=durable)
    return client


def test_persister_over_and_drained(broker, fsync):
    """The store's own accounting: over past the high mark once written, drained by the
    fsync that covers the bytes (listeners told each time, once)."""
    persister = broker.persister
    seen = []
    persister.subscribe_flow(seen.append)
    pub = publisher(broker)
    pub.fill(1, "dq", [BODY, BODY], persistent=True)  # 80 kB: under the mark
    assert not persister.over and persister.outstanding >= 80_000 and len(fsync.jobs) == 1
    pub.fill(1, "dq", [BODY], persistent=True)  # 120 kB outstanding: over
    assert persister.over and seen == [True]
    fsync.finish()  # the first 80 kB are on disk; the next fsync (40 kB) starts
    assert persister.outstanding == persister.syncing_bytes < LOW
    assert not persister.over and seen == [True, False]
    fsync.finish()
    assert persister.outstanding == 0 and not fsync.jobs
    persister.unsubscribe_flow(seen.append)
    pub.fill(1, "dq", [BODY] * 3, persistent=True)
    assert persister.over and seen == [True, False]  # no longer told


def test_publisher_into_a_store_behind_is_in_flow_until_it_drains(broker, fsync):
    pub = publisher(broker)
    conn, transport = pub.conn, pub.transport
    assert conn.throttle_state == "running" and conn.last_blocked_by == "none"
    pub.fill(1, "dq", [BODY] * 3, persistent=True)  # one read: 120 kB into the store
    assert broker.persister.over
    assert transport.reading_paused and Reason.FLOW in conn.throttle.reasons
    assert conn.throttle_state == "flow" and conn.last_blocked_by == "flow"
    assert conn.blocked_age() == 0.0
    fsync.finish()  # on disk: below the low mark, read again
    assert not transport.reading_paused and not conn.throttle.reasons
    assert pub.receive() == []  # no connection.blocked / unblocked for flow (as RabbitMQ)
    # Shown as `flow` for a while after, as rabbit_reader does.
    assert conn.throttle_state == "flow" and conn.last_blocked_by == "flow"
    assert 0 <= conn.blocked_age() < 1
    conn.last_blocked_at = time.monotonic() - connection_module.FLOW_SHOWN_FOR - 0.1
    assert conn.throttle_state == "running" and conn.last_blocked_by == "flow"
    # Everything published is there.
    assert [b for b, _ in pub.drain(1, "dq")] == [BODY] * 3


def test_below_the_mark_nothing_is_held(broker, fsync):
    pub = publisher(broker)
    pub.fill(1, "dq", [BODY, BODY], persistent=True)
    assert not pub.transport.reading_paused and pub.conn.throttle_state == "running"


def test_only_connections_that_wrote_into_the_store_go_to_flow(broker, fsync):
    pub = publisher(broker)
    other = publisher(broker, "tq", durable=False)  # transient messages, kept in memory
    pub.fill(1, "dq", [BODY] * 3, persistent=True)
    assert broker.persister.over and pub.conn.in_flow
    other.fill(1, "tq", [BODY] * 3)
    assert other.conn.store_over and not other.conn.in_flow
    assert not other.transport.reading_paused and other.conn.throttle_state == "running"
    # A second publisher into the store while it is over: also in flow.
    late = publisher(broker, "dq2")
    assert late.conn.store_over  # opened while the store was over
    late.fill(1, "dq2", [b"small"], persistent=True)
    assert late.conn.in_flow and late.transport.reading_paused
    fsync.finish()
    fsync.finish()
    assert not pub.conn.in_flow and not late.conn.in_flow
    assert not pub.transport.reading_paused and not late.transport.reading_paused


def test_consumers_of_a_connection_in_flow_are_still_sent_to(broker, fsync):
    pub = publisher(broker)
    pub.open_channel(2)
    pub.declare(2, "tq")
    pub.consume(2, "c", queue="tq", no_ack=True)
    assert pub.receive() == [Method(2, "Basic.ConsumeOk", "c")]
    pub.fill(1, "dq", [BODY] * 3, persistent=True)
    assert pub.conn.in_flow and pub.transport.reading_paused
    other = publisher(broker, "tq", durable=False)
    other.fill(1, "tq", [b"m"])
    got = pub.tick()
    assert [(f[1], f[-1]) for f in got] == [("Basic.Deliver", b"m")]
    assert pub.conn.in_flow


def test_closing_in_flow_reads_the_close_ok_and_forgets_the_store(broker, fsync):
    pub = publisher(broker)
    conn, transport = pub.conn, pub.transport
    pub.fill(1, "dq", [BODY] * 3, persistent=True)
    assert conn.in_flow
    conn.close()  # server-initiated (e.g. a forced close): the client's close-ok must be read
    assert not transport.reading_paused and not conn.in_flow
    assert conn._store_flow_changed not in broker.persister.flow_listeners
    pub.send(0, commands.Connection.CloseOk())
    assert transport.closed


def test_a_failing_fsync_still_drains(broker, fsync):
    """The store drains whatever the fsync's outcome (the confirms become nacks): no
    publisher is held for ever."""
    pub = publisher(broker)
    pub.fill(1, "dq", [BODY] * 3, persistent=True)
    assert pub.conn.in_flow
    fsync.finish(error="EIO")
    assert not pub.conn.in_flow and not pub.transport.reading_paused
