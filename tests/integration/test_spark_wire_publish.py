"""warren.spark.wire.Publisher (the Spark sink's publisher with confirms, no Spark needed)
against a real broker, Warren and RabbitMQ alike: a window much smaller than the messages,
bodies past frame_max and empty ones, properties as pika reads them; a nack (reject-publish), a
mandatory return, a closed channel, a connection error, a connection closed through the
management API and a broker killed mid-publish all raise."""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pika
import pytest
from pamqp import commands as spec

from warren.spark.connection import endpoint
from warren.spark.wire import (
    Nacked, ProtocolError, Publisher, Returned, encode_properties, joined_frames, property_template,
)

EXTERNAL = os.environ.get("WARREN_TEST_BROKER")


def _publisher(broker, window=1000, timeout=10.0) -> Publisher:
    wire = Publisher(endpoint({"uri": f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"}), timeout)
    wire.confirm_select(window, timeout)
    return wire


def _get_all(ch, queue):
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((props, body))


def test_a_small_window_big_and_empty_bodies_and_properties(broker, channel, names):
    q = names("swp-q")
    channel.queue_declare(q)
    wire = _publisher(broker, window=7)
    assert wire.frame_max <= 131072
    big = bytes(range(256)) * 1200  # 307,200 octets: three body frames at 131072
    before, after = property_template({"headers": {"n": 1, "s": "t"}, "delivery_mode": 2, "type": "kind"})
    bodies = [b"m%d" % i if i % 100 else (big if i % 200 else b"") for i in range(1, 2501)]
    for i, body in enumerate(bodies):
        mid = b"id-%d" % i
        wire.publish("", q, body, before + bytes((len(mid),)) + mid + after)
        assert wire.unconfirmed <= 7
    wire.wait_confirms()
    assert (wire.published, wire.unconfirmed) == (2500, 0)
    wire.close()
    got = _get_all(channel, q)
    assert [body for _, body in got] == bodies
    assert [p.message_id for p, _ in got] == ["id-%d" % i for i in range(2500)]
    p = got[0][0]
    assert (p.headers, p.delivery_mode, p.type, p.content_type) == ({"n": 1, "s": "t"}, 2, "kind", None)


def _joined(wire, exchange, key, bodies, mandatory=False, first=1):
    """The frames of `bodies` made a column at a time (the sink's path for bodies alone)."""
    import pyarrow as pa
    before, after = property_template({})
    return joined_frames(wire.method(exchange, key, mandatory), before, after, b"j:", first,
                         pa.array(bodies, pa.binary()))


@pytest.mark.parametrize("window", [1, 3, 1000])
def test_frames_made_a_column_at_a_time_keep_the_window(broker, channel, names, window):
    """publish_joined: every message arrives, in order, with its id, whatever the window; a
    slice of the frames (an Arrow offset) sends only its messages."""
    q = names("swp-joined")
    channel.queue_declare(q)
    wire = _publisher(broker, window=window)
    bodies = [b"b%d" % i * (1 + i % 300) for i in range(700)]
    frames = _joined(wire, "", q, bodies)
    wire.publish_joined(frames.slice(0, 300))
    assert wire.unconfirmed <= window
    wire.publish_joined(frames.slice(300))
    wire.wait_confirms()
    assert (wire.published, wire.unconfirmed) == (700, 0)
    wire.close()
    got = _get_all(channel, q)
    assert [body for _, body in got] == bodies
    assert [p.message_id for p, _ in got] == ["j:%d" % i for i in range(1, 701)]


def test_frames_made_a_column_at_a_time_are_nacked_and_returned(broker, channel, names):
    q, x = names("swp-joined-full"), names("swp-joined-x")
    channel.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.exchange_declare(x, "direct")
    wire = _publisher(broker)
    with pytest.raises(Nacked):  # (from an ack read between sends, or while waiting)
        wire.publish_joined(_joined(wire, "", q, [b"r0", b"r1", b"r2"]))
        wire.wait_confirms()
    wire.close()
    wire = _publisher(broker)
    with pytest.raises(Returned, match="312 NO_ROUTE"):
        wire.publish_joined(_joined(wire, x, "nowhere", [b"lost"] * 5, mandatory=True))
        wire.wait_confirms()
    wire.close()


def test_reject_publish_nacks(broker, channel, names):
    q = names("swp-full")
    channel.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    wire = _publisher(broker)
    for i in range(3):
        wire.publish("", q, b"r%d" % i, encode_properties({"message_id": str(i)}))
    with pytest.raises(Nacked):
        wire.wait_confirms()
    wire.close()
    assert [body for _, body in _get_all(channel, q)] == [b"r0"]


def test_a_mandatory_unroutable_message_is_returned(broker, channel, names):
    x = names("swp-x")
    channel.exchange_declare(x, "direct")
    wire = _publisher(broker)
    wire.publish(x, "nowhere", b"lost", encode_properties({}))  # not mandatory: dropped and confirmed
    wire.wait_confirms()
    wire.publish(x, "nowhere", b"lost", encode_properties({}), mandatory=True)
    with pytest.raises(Returned, match="312 NO_ROUTE"):
        wire.wait_confirms()
    wire.close()


def test_a_missing_exchange_closes_the_channel(broker, channel, names):
    wire = _publisher(broker)
    for i in range(5):
        wire.publish(names("swp-missing"), "", b"m", encode_properties({}))
    with pytest.raises(ProtocolError, match="closed the channel: 404"):
        wire.wait_confirms()
    wire.close()


def test_a_connection_error_closes_the_connection(broker, channel, names):
    """A frame on a channel never opened: the broker closes the connection (504)."""
    q = names("swp-conn")
    channel.queue_declare(q)
    wire = _publisher(broker)
    wire.publish("", q, b"ok", encode_properties({}))
    wire.wait_confirms()
    wire.send(spec.Basic.Qos(prefetch_count=1), 9)
    # (RabbitMQ may still confirm a message published right after: publish until it fails)
    err = _publish_until_it_fails(wire, q)
    assert "closed the connection" in str(err) or isinstance(err, OSError), err
    wire.close()


def _publish_until_it_fails(wire, q, stop_after: float = 30.0) -> Exception:
    body = b"x" * 1024
    props = encode_properties({})
    deadline = time.monotonic() + stop_after
    try:
        while time.monotonic() < deadline:
            wire.publish("", q, body, props)
        wire.wait_confirms()
    except (ProtocolError, OSError) as err:
        return err
    raise AssertionError("publishing went on for 30 s")


CTL = os.environ.get("WARREN_TEST_RABBITMQCTL")


@pytest.mark.skipif(bool(EXTERNAL) and not CTL, reason="closes the connection with rabbitmqctl on RabbitMQ")
@pytest.mark.not_on_warren_cluster(
    "closes its connection through one node's API by the name it has there, which names the proxy's port")
def test_a_connection_closed_mid_publish(broker, channel, names):
    """Closed by Warren's management API, or by rabbitmqctl close_connection."""
    q = names("swp-mgmt")
    channel.queue_declare(q, arguments={"x-max-length": 100})
    wire = _publisher(broker)
    local = wire.sock.getsockname()
    name = f"{local[0]}:{local[1]} -> {broker.host}:{broker.port}"

    def close_it():
        time.sleep(0.5)
        if EXTERNAL:  # rabbitmqctl closes a connection named by its pid
            ctl = shlex.split(CTL or "")
            listed = subprocess.run([*ctl, "list_connections", "-q", "pid", "name"], check=True,
                                    capture_output=True, text=True, timeout=60).stdout
            pid = next(line.split("\t")[0] for line in listed.splitlines() if line.endswith("\t" + name))
            subprocess.run([*ctl, "close_connection", pid, "test"], check=True, capture_output=True, timeout=60)
            return
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        req = urllib.request.Request(f"{broker.api}/connections/{urllib.parse.quote(name, safe='')}",
                                     method="DELETE", headers={"Authorization": auth})
        urllib.request.urlopen(req, timeout=10).close()

    closer = threading.Thread(target=close_it)
    closer.start()
    err = _publish_until_it_fails(wire, q)
    closer.join(10)
    wire.close()
    assert "320" in str(err) or isinstance(err, OSError), err


def test_a_broker_killed_mid_publish(make_broker, uid):
    b = make_broker()
    conn = pika.BlockingConnection(b.pika_params())
    q = f"swp-kill-{uid}"
    conn.channel().queue_declare(q, arguments={"x-max-length": 100})
    conn.close()
    wire = _publisher(b, timeout=5.0)
    killer = threading.Timer(0.5, b.stop, kwargs={"sig": 9})
    killer.start()
    err = _publish_until_it_fails(wire, q)
    killer.join()
    wire.close()
    assert isinstance(err, (ProtocolError, OSError)), err
