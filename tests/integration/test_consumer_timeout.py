"""The consumer delivery-acknowledgement timeout (`consumer_timeout`, RabbitMQ 3.10's default
30 min): a channel holding a delivery unacknowledged for longer is closed with 406, its
messages requeued. Consumer and basic.get deliveries count; no-ack ones do not.

On Warren the broker is started with `consumer_timeout = 400` in its config file. On RabbitMQ
(WARREN_TEST_BROKER) the same value is set at run time with rabbitmqctl eval (its channels
read it when they open), with its channel tick (60 s by default) at 100 ms, and put back after.
"""

import os
import shlex
import subprocess
import sys
import time

import pika
import pytest
from pamqp import commands

from conftest import EXTERNAL, BrokerProcess, pump, start_broker
from rawamqp import RawClient

TIMEOUT_MS = 400
# Against RabbitMQ the timeout is the shared node's: any channel holding a delivery for 400 ms
# would be closed.
pytestmark = pytest.mark.node_wide
TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {ch} timed out. Timeout value used: {ms} ms. "
        "This timeout value can be configured, see consumers doc guide to learn more")


def _rabbitmq_env(ctl, key, value):
    subprocess.run([*ctl, "eval", f"application:set_env(rabbit, {key}, {value})."], check=True,
                   capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def short_timeout(tmp_path_factory):
    """A broker whose consumer_timeout is TIMEOUT_MS."""
    if EXTERNAL:
        ctl = os.environ.get("WARREN_TEST_RABBITMQCTL")
        if not ctl:
            pytest.skip("needs WARREN_TEST_RABBITMQCTL to set RabbitMQ's consumer_timeout")
        ctl = shlex.split(ctl)
        _rabbitmq_env(ctl, "consumer_timeout", TIMEOUT_MS)
        _rabbitmq_env(ctl, "channel_tick_interval", 100)
        host, port = EXTERNAL.rsplit(":", 1)
        try:
            yield BrokerProcess(host, int(port))
        finally:
            _rabbitmq_env(ctl, "consumer_timeout", 1800000)
            _rabbitmq_env(ctl, "channel_tick_interval", 60000)
        return
    config = tmp_path_factory.mktemp("ct") / "rabbitmq.conf"
    config.write_text(f"consumer_timeout = {TIMEOUT_MS}\n")
    broker = start_broker("--config", str(config))
    yield broker
    broker.stop()


def _raw(broker):
    raw = RawClient(broker.host, broker.port).handshake()
    raw.open_channel(1)
    return raw


def _declare(raw, q):
    raw.call(1, commands.Queue.Declare(queue=q, exclusive=True))


def test_unacked_consumer_delivery_closes_the_channel(short_timeout, uid):
    raw = _raw(short_timeout)
    q = f"ct-consume-{uid}"
    _declare(raw, q)
    raw.open_channel(2)
    raw.call(2, commands.Basic.Consume(queue=q, consumer_tag="ctag"))
    raw.publish(1, "", q, b"hold")
    raw.expect(commands.Basic.Deliver, 2)
    delivered = time.monotonic()
    raw.read_content()
    # RabbitMQ names no method: class 0, method 0.
    raw.expect_channel_close(2, 406, TEXT.format(ch=2, ms=TIMEOUT_MS), 0, 0, timeout=5)
    elapsed = time.monotonic() - delivered
    assert TIMEOUT_MS / 1000 <= elapsed < TIMEOUT_MS / 1000 + 1.5
    # The message is back in the queue, redelivered.
    ok = raw.call(1, commands.Basic.Get(queue=q, no_ack=True), commands.Basic.GetOk)
    assert ok.redelivered
    assert raw.read_content()[1] == b"hold"
    raw.close()


def test_unacked_basic_get_counts_too(short_timeout, uid):
    raw = _raw(short_timeout)
    q = f"ct-get-{uid}"
    _declare(raw, q)
    raw.publish(1, "", q, b"got")
    raw.open_channel(3)
    raw.call(3, commands.Basic.Get(queue=q), commands.Basic.GetOk)
    raw.read_content()
    raw.expect_channel_close(3, 406, TEXT.format(ch=3, ms=TIMEOUT_MS), 0, 0, timeout=5)
    raw.close()


def test_timely_acks_and_no_ack_consumers_keep_the_channel(short_timeout, uid):
    """Deliveries acked within the timeout, over several timeouts, and a no-ack consumer:
    the channels stay open."""
    conn = pika.BlockingConnection(short_timeout.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare(f"ct-ok-{uid}", exclusive=True).method.queue
        acking, no_ack = conn.channel(), conn.channel()
        got = []
        acking.basic_consume(q, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
        idle = ch.queue_declare(f"ct-ok2-{uid}", exclusive=True).method.queue
        no_ack.basic_consume(idle, lambda c, m, p, b: got.append(b), auto_ack=True)
        ch.basic_publish("", idle, b"no-ack")
        deadline = time.monotonic() + 3 * TIMEOUT_MS / 1000
        n = 0
        while time.monotonic() < deadline:
            ch.basic_publish("", q, str(n).encode())
            n += 1
            conn.process_data_events(0.1)
        pump(conn, lambda: len(got) == n + 1)
        assert acking.is_open and no_ack.is_open and ch.is_open
        # An idle acking consumer with nothing unacked is not closed either.
        conn.process_data_events(2 * TIMEOUT_MS / 1000)
        assert acking.is_open
    finally:
        conn.close()


def test_requeued_messages_go_to_another_consumer(short_timeout, uid):
    conn = pika.BlockingConnection(short_timeout.pika_params())
    try:
        ch = conn.channel()
        q = ch.queue_declare(f"ct-requeue-{uid}", exclusive=True).method.queue
        slow = conn.channel()
        closed = []
        slow._impl.add_on_close_callback(lambda channel, reason: closed.append(reason))
        got = []
        slow.basic_consume(q, lambda c, m, p, b: got.append(("slow", b, m.redelivered)))
        for i in range(3):
            ch.basic_publish("", q, str(i).encode())
        pump(conn, lambda: len(got) == 3)
        pump(conn, lambda: bool(closed), timeout=5)
        assert (closed[0].reply_code, closed[0].reply_text) == (406, TEXT.format(ch=slow.channel_number,
                                                                                   ms=TIMEOUT_MS))
        fast = conn.channel()
        fast.basic_consume(q, lambda c, m, p, b: (got.append(("fast", b, m.redelivered)),
                                                  c.basic_ack(m.delivery_tag)))
        pump(conn, lambda: len(got) == 6)
        assert got[3:] == [("fast", b"0", True), ("fast", b"1", True), ("fast", b"2", True)]
    finally:
        conn.close()


# ------------------------------------------------------------------ Warren's config

warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="starts Warren with a config file")


@warren_only
@pytest.mark.parametrize("name, text, error", [
    ("rabbitmq.conf", "consumer_timeout = 0\n", "consumer_timeout: expected a positive number of milliseconds, got 0"),
    ("rabbitmq.conf", "consumer_timeout = 30min\n", "consumer_timeout: expected an integer, got '30min'"),
    ("rabbitmq.config", "[{rabbit, [{consumer_timeout, infinity}]}].\n", "consumer_timeout"),
])
def test_bad_config_values_stop_the_server(tmp_path, name, text, error):
    path = tmp_path / name
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "warren", "server", "--port", "0", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert error in proc.stderr


@warren_only
def test_classic_config_format(tmp_path, uid):
    """{consumer_timeout, Ms} in rabbitmq.config; {consumer_timeout, undefined} (RabbitMQ's way
    to turn it off) is accepted."""
    path = tmp_path / "off.config"
    path.write_text("[{rabbit, [{consumer_timeout, undefined}]}].\n")
    start_broker("--config", str(path)).stop()
    path = tmp_path / "short.config"
    path.write_text("[{rabbit, [{consumer_timeout, 300}]}].\n")
    broker = start_broker("--config", str(path))
    try:
        raw = _raw(broker)
        q = f"ct-classic-{uid}"
        _declare(raw, q)
        raw.publish(1, "", q, b"held")
        raw.call(1, commands.Basic.Get(queue=q), commands.Basic.GetOk)
        raw.read_content()
        raw.expect_channel_close(1, 406, TEXT.format(ch=1, ms=300), 0, 0, timeout=5)
        raw.close()
    finally:
        broker.stop()
