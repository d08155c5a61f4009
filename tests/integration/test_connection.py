"""Connection-level behaviour: protocol header, handshake, tune, heartbeats, close, channels.

Raw-socket tests (tests/rawamqp.py) check the exact frames; pika checks that a real client
sees the same. Shared tests pass against RabbitMQ 3.10 (WARREN_TEST_BROKER) and Warren.
"""

import signal
import socket
import struct
import time

import pika
import pytest
from pamqp import commands

from conftest import RABBITMQ
from rawamqp import (FRAME_BODY, FRAME_HEADER, FRAME_METHOD, HEARTBEAT, PROTOCOL_HEADER, ConnectionEOF, connect, dial,
                     frame, method_payload, plain, start_ok_payload)

CAPABILITIES = {"publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
                "connection.blocked", "authentication_failure_close", "per_consumer_qos", "consumer_priorities"}


# ------------------------------------------------------------------------ protocol header

@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",                       # AMQP 0-9 (not 0-9-1)
    b"AMQP\x01\x01\x00\x0a",                       # 0-10
    b"AMQP\x03\x01\x00\x00",                       # AMQP 1.0 SASL
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # not AMQP at all
], ids=["0-9", "0-10", "1.0", "http"])
def test_wrong_protocol_header_gets_ours_back_and_the_socket_closes(broker, header):
    with dial(broker) as client:
        client.send(header)
        assert client.expect_eof(3) == PROTOCOL_HEADER


def test_a_partial_header_waits_for_the_rest(broker):
    with dial(broker) as client:
        client.send(b"AMQP\x00")
        assert not client.is_closed(0.3)
        client.send(b"\x00\x09\x01")
        start = client.expect(commands.Connection.Start, 0)
        assert (start.version_major, start.version_minor) == (0, 9)


# ----------------------------------------------------------------------- connection.start

def test_connection_start(broker):
    with dial(broker) as client:
        start = client.start_handshake()
    assert (start.version_major, start.version_minor) == (0, 9)
    if RABBITMQ:
        # RabbitMQ 3.10 lists its mechanisms in ETS-table order, which differs between nodes
        # (seen both "PLAIN AMQPLAIN" and "AMQPLAIN PLAIN" for the same 3.10.8 package).
        assert sorted(start.mechanisms.split(" ")) == ["AMQPLAIN", "PLAIN"]
    else:
        assert start.mechanisms == "PLAIN AMQPLAIN"
    assert start.locales == "en_US"
    props = start.server_properties
    assert {"product", "version", "platform", "copyright", "information", "cluster_name"} <= set(props)
    caps = props["capabilities"]
    assert all(caps[c] is True for c in CAPABILITIES)
    if RABBITMQ:
        # RabbitMQ 3.10 also lists consumer_priorities and direct_reply_to.
        assert CAPABILITIES < set(caps)
    else:
        # Warren advertises exactly what it implements (and its stream record batches).
        assert set(caps) == CAPABILITIES | {"x-warren-record-batch"}
        assert props["product"] == "Warren"


# ------------------------------------------------------------------------------- tuning

def test_tune_offers_rabbitmq_defaults(broker):
    with dial(broker) as client:
        client.start_handshake()
        client.login()
        tune = client.expect(commands.Connection.Tune, 0)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_pika_negotiates_the_servers_values_and_lower_ones_it_asks_for(broker):
    conn = pika.BlockingConnection(broker.pika_params(heartbeat=0))
    try:
        params = conn._impl.params
        assert (params.channel_max, params.frame_max) == (2047, 131072)
    finally:
        conn.close()
    conn = pika.BlockingConnection(broker.pika_params(channel_max=7, frame_max=8192, heartbeat=0))
    try:
        params = conn._impl.params
        assert (params.channel_max, params.frame_max) == (7, 8192)
    finally:
        conn.close()


def test_a_lower_frame_max_is_used_for_deliveries_and_enforced(broker, uid):
    q = f"conn-fm-{uid}"
    body = bytes(range(256)) * 40  # 10240 bytes: three body frames of at most 4088
    with connect(broker, frame_max=4096) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=q, exclusive=True))
        client.expect(commands.Queue.DeclareOk, 1)
        # Our own frames may be as large as frame_max - 8 (RabbitMQ tolerates up to frame_max).
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=q))
        client.send_content(1, b"", body_size=len(body))
        for start in range(0, len(body), 4088):
            client.send_frame(FRAME_BODY, 1, body[start:start + 4088])
        client.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
        client.expect(commands.Basic.GetOk, 1)
        header = client.read_frame()
        assert header.type == 2
        sizes, got = [], b""
        while len(got) < len(body):
            f = client.read_frame()
            assert f.type == FRAME_BODY and f.channel == 1
            sizes.append(len(f.payload))
            got += f.payload
        assert got == body and sizes == [4088, 4088, 2064]
        # A frame header announcing more than frame_max octets is refused at once.
        client.send(struct.pack(">BHI", FRAME_BODY, 1, 4097))
        client.expect_connection_close(
            501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}", 0, 0, check_eof=False)


def test_a_lower_channel_max_limits_the_open_channels(broker):
    with connect(broker, channel_max=3) as client:
        for ch in (1, 2, 3):
            client.open_channel(ch)
        client.send_method(4, commands.Channel.Open())
        client.expect_connection_close(
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)", 0, 0)


def test_a_closed_channel_frees_its_place_under_channel_max(broker):
    with connect(broker, channel_max=2) as client:
        client.open_channel(1)
        client.open_channel(2)
        client.send_method(2, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect(commands.Channel.CloseOk, 2)
        client.open_channel(2)


def test_a_channel_number_above_channel_max_opens_as_in_rabbitmq_3_10(broker):
    """RabbitMQ 3.10 limits how many channels are open, not their numbers: channel 65535
    opens on a connection that negotiated channel_max 2047 (aiormq's test_bad_channel
    relies on it); the count limit still holds."""
    with connect(broker) as client:
        client.open_channel(65535)
        client.send_method(65535, commands.Queue.Declare(queue="", exclusive=True))
        client.expect(commands.Queue.DeclareOk, 65535)
    with connect(broker, channel_max=3) as client:
        for ch in (5, 1000, 65535):
            client.open_channel(ch)
        client.send_method(7, commands.Channel.Open())
        client.expect_connection_close(
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)", 0, 0)


TUNE_ERRORS = [
    (None, 131073, "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)"),
    (None, 0, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
    (None, 4095, "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)"),
    (2048, None, "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)"),
    (0, None, "negotiated channel_max = 0 (no limit) is higher than the maximum allowed value (2047)"),
]


def test_tune_ok_outside_the_offered_limits_is_refused(broker):
    """530 NOT_ALLOWED for connection.tune (as RabbitMQ 3.11+ says it). RabbitMQ 3.10 sends
    nothing: it closes the socket after its 3 s handshake-error delay."""
    clients = []
    for channel_max, frame_max, _ in TUNE_ERRORS:
        client = dial(broker, timeout=6)
        client.handshake(channel_max=channel_max, frame_max=frame_max, open_vhost=False)
        client.send_method(0, commands.Connection.Open(virtual_host="/"))
        clients.append(client)
    try:
        for client, (_, _, text) in zip(clients, TUNE_ERRORS):
            if RABBITMQ:
                assert client.expect_eof(6) == b""
            else:
                client.expect_connection_close(530, f"NOT_ALLOWED - {text}", 10, 30)
    finally:
        for client in clients:
            client.close()


# -------------------------------------------------------------------- handshake errors

def _start_ok_frame(size: int) -> bytes:
    props = {"product": "x" * size, "capabilities": {"authentication_failure_close": True}}
    return frame(FRAME_METHOD, 0, start_ok_payload(props, "PLAIN", plain("guest", "guest")))


SILENT_HANDSHAKE_ERRORS = {
    # before start-ok is accepted
    "unknown mechanism": lambda c: c.login(mechanism="CRAM-MD5", response=b"guest"),
    "unparseable PLAIN response": lambda c: c.login(mechanism="PLAIN", response=b"guest-guest"),
    "unparseable AMQPLAIN response": lambda c: c.login(mechanism="AMQPLAIN", response=b"garbage"),
    "wrong password, no authentication_failure_close": lambda c: c.login("guest", "wrong", capabilities=False),
    "start-ok larger than 4096 before tune": lambda c: c.send(_start_ok_frame(4000)),
    "connection.open before start-ok": lambda c: c.send_method(0, commands.Connection.Open(virtual_host="/")),
    "connection.close before start-ok": lambda c: c.send_method(
        0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
    "channel frame before start-ok": lambda c: c.send_method(1, commands.Channel.Open()),
    # after start-ok, before tune-ok
    "connection.open before tune-ok": lambda c: (c.login(), c.send_method(
        0, commands.Connection.Open(virtual_host="/"))),
}


def test_handshake_errors_before_tune_ok_close_the_socket_after_3s_without_a_word(broker):
    """RabbitMQ does not trust a client that fails this early: no connection.close, and the
    socket closes only after 3 s (its SILENT_CLOSE_DELAY), which slows password guessing."""
    clients = {}
    started = time.monotonic()
    for name, action in SILENT_HANDSHAKE_ERRORS.items():
        client = dial(broker, timeout=8)
        client.start_handshake()
        action(client)
        clients[name] = client
    try:
        for name, client in clients.items():
            if name == "connection.open before tune-ok":
                client.expect(commands.Connection.Tune, 0)
            assert client.expect_eof(8) == b"", name
            assert 2.5 < time.monotonic() - started < 5.0, name
    finally:
        for client in clients.values():
            client.close()


def test_frames_on_a_channel_before_connection_open_ok_are_unexpected(broker):
    with dial(broker) as client:
        client.handshake(open_vhost=False)
        client.send_frame(1, 1, b"\x00\x14\x00\x0a\x00")  # channel.open
        client.expect_connection_close(505, "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,0>>", 0, 0)


def test_methods_out_of_order_after_tune_ok(broker):
    with dial(broker) as client:
        client.handshake(open_vhost=False)
        client.send_method(0, commands.Queue.Declare(queue="x"))
        client.expect_connection_close(
            504, "CHANNEL_ERROR - unexpected method in connection state opening", 50, 10)
    with dial(broker) as client:
        client.handshake(open_vhost=False)
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect_connection_close(
            504, "CHANNEL_ERROR - unexpected method in connection state opening", 10, 50)


def test_heartbeat_frames_are_fine_during_the_handshake(broker):
    with dial(broker) as client:
        client.handshake(open_vhost=False)
        client.send(HEARTBEAT)
        client.send_method(0, commands.Connection.Open(virtual_host="/"))
        client.expect(commands.Connection.OpenOk, 0)


# ---------------------------------------------------------------------------- heartbeats

def test_server_heartbeats_and_drops_a_silent_peer(broker):
    """With heartbeat 1 s the server sends a heartbeat whenever it sent nothing for half a
    second, and a peer silent for more than two intervals is disconnected."""
    with connect(broker, heartbeat=1, timeout=6) as client:
        silent_since = time.monotonic()
        frames = []
        with pytest.raises(ConnectionEOF):
            while True:
                frames.append(client.read_frame(6, skip_heartbeats=False))
        dropped_after = time.monotonic() - silent_since
    assert frames and all(f.type == 8 and f.channel == 0 and f.payload == b"" for f in frames)
    beats = client.heartbeats
    assert len(beats) >= 2
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert all(0.3 < gap < 1.2 for gap in gaps), gaps
    # More than two intervals after its last byte (which was a moment before silent_since);
    # RabbitMQ takes about three.
    assert 1.9 <= dropped_after < 4.0, dropped_after


def test_a_peer_that_sends_heartbeats_stays_connected(broker):
    with connect(broker, heartbeat=1, timeout=3) as client:
        client.open_channel(1)
        until = time.monotonic() + 2.5  # more than two intervals
        while time.monotonic() < until:
            client.send(HEARTBEAT)
            try:
                client.read_frame(0.4)
            except TimeoutError:
                pass
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))
        client.expect(commands.Basic.QosOk, 1)


def test_pika_with_heartbeat_1s_stays_up(broker, uid):
    conn = pika.BlockingConnection(broker.pika_params(heartbeat=1))
    try:
        assert conn._impl.params.heartbeat == 1
        conn.sleep(3.0)  # pika answers heartbeats while it sleeps
        ch = conn.channel()
        q = ch.queue_declare(f"conn-hb-{uid}", exclusive=True).method.queue
        ch.basic_publish("", q, b"still here")
        assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    finally:
        conn.close()


def test_heartbeat_zero_means_no_heartbeats(broker):
    with connect(broker, heartbeat=0) as client:
        with pytest.raises(TimeoutError):
            client.read_frame(1.2, skip_heartbeats=False)
        assert client.heartbeats == []


# -------------------------------------------------------------------------------- closing

def test_client_close_gets_close_ok(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect(commands.Connection.CloseOk, 0)


def test_pika_close_is_clean(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel()
    conn.close()
    assert conn.is_closed


def test_after_server_close_only_close_ok_matters(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Open())  # 504: the server closes the connection
        close = client.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.class_id, close.method_id) == (504, 20, 10)
        # Until our close-ok, everything else is ignored.
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))
        client.send_method(2, commands.Channel.Open())
        with pytest.raises(TimeoutError):
            client.read_frame(0.5)
        client.send_method(0, commands.Connection.CloseOk())
        assert client.is_closed(3)


def test_close_crossing_a_server_close_gets_close_ok(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Open())
        client.expect(commands.Connection.Close, 0)
        client.send_method(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect(commands.Connection.CloseOk, 0)


def test_close_ok_without_close_is_unexpected(broker):
    with connect(broker) as client:
        client.send_method(0, commands.Connection.CloseOk())
        client.expect_connection_close(
            504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 51)


def test_sigterm_closes_clients_with_320_and_exits_0(make_broker):
    b = make_broker()
    client = connect(b)
    client.open_channel(1)
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel()
    started = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    client.expect_connection_close(
        320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", 0, 0)
    client.close()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn.process_data_events(time_limit=3)
    assert err.value.reply_code == 320
    assert err.value.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    assert b.proc.wait(5) == 0
    assert time.monotonic() - started < 3
    with pytest.raises(OSError):
        socket.create_connection((b.host, b.port), timeout=1).close()


def test_sigterm_with_a_client_that_never_answers_still_exits_promptly(make_broker):
    b = make_broker()
    client = connect(b)
    client.open_channel(1)
    started = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    assert client.expect(commands.Connection.Close, 0).reply_code == 320
    assert b.proc.wait(5) == 0  # without waiting for our close-ok forever
    assert time.monotonic() - started < 4
    assert client.is_closed(2)
    client.close()


# ------------------------------------------------------------------------------- channels

def test_channel_open_twice_is_a_channel_error(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Open())
        client.expect_connection_close(504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_method_on_an_unopened_channel_is_a_channel_error(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(2, commands.Queue.Declare(queue="", exclusive=True))
        client.expect_connection_close(504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)


def test_content_on_an_unopened_channel_is_unexpected(broker):
    with connect(broker) as client:
        client.send_content(3, b"body")
        client.expect_connection_close(
            505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)


def test_channel_methods_on_channel_zero(broker):
    with connect(broker) as client:
        client.send_method(0, commands.Channel.Open())
        client.expect_connection_close(
            504, "CHANNEL_ERROR - unexpected method in connection state running", 20, 10)


def test_connection_methods_on_a_channel_are_unimplemented(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect_connection_close(503, "COMMAND_INVALID - unimplemented method", 10, 50)


@pytest.mark.parametrize("method", [
    commands.Channel.CloseOk(), commands.Channel.FlowOk(active=True), commands.Channel.OpenOk(),
    commands.Queue.DeclareOk(queue="q", message_count=0, consumer_count=0),
], ids=lambda m: m.name)
def test_server_side_methods_from_a_client_are_unimplemented(broker, method):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, method)
        class_id, method_id = divmod(method.index, 1 << 16)
        client.expect_connection_close(503, "COMMAND_INVALID - unimplemented method", class_id, method_id)


def test_channel_flow_active_true_is_acknowledged(broker):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Flow(active=True))
        assert client.expect(commands.Channel.FlowOk, 1).active is True


def test_channel_flow_active_false_is_not_implemented(broker):
    """RabbitMQ 3.10 refuses to stop deliveries this way: 540, a connection error."""
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Channel.Flow(active=False))
        client.expect_connection_close(540, "NOT_IMPLEMENTED - active=false", 20, 20)


def test_channel_close_and_reuse_of_the_number(broker, uid):
    q = f"conn-reuse-{uid}"
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=q, exclusive=True))
        client.expect(commands.Queue.DeclareOk, 1)
        client.send_method(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect(commands.Channel.CloseOk, 1)
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=q, passive=True))
        assert client.expect(commands.Queue.DeclareOk, 1).queue == q


def test_channel_close_crossing_a_server_channel_close(broker, uid):
    """Both sides close at once: the server answers our close with close-ok and still takes
    our close-ok for its own close; then the number is free again."""
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=f"conn-missing-{uid}", passive=True))
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))  # dropped: the channel is closing
        client.send_method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
        close = client.expect(commands.Channel.Close, 1)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
        client.expect(commands.Channel.CloseOk, 1)
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(1)


def test_frames_for_a_channel_the_server_closed_are_dropped_until_close_ok(broker, uid):
    with connect(broker) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=f"conn-missing-{uid}", passive=True))
        client.publish(1, "", "nowhere", b"dropped")
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        assert client.expect(commands.Channel.Close, 1).reply_code == 404
        with pytest.raises(TimeoutError):
            client.read_frame(0.5)
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(1)


def test_pika_channel_close_and_reopen(connection, uid):
    ch = connection.channel()
    number = ch.channel_number
    ch.close()
    ch2 = connection.channel(number)
    q = ch2.queue_declare(f"conn-pika-{uid}", exclusive=True).method.queue
    ch2.basic_publish("", q, b"x")
    assert ch2.basic_get(q, auto_ack=True)[2] == b"x"


def test_update_secret(broker):
    with connect(broker) as client:
        client.send_method(0, commands.Connection.UpdateSecret(new_secret="token", reason="refresh"))
        client.expect(commands.Connection.UpdateSecretOk, 0)
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        conn.update_secret("token", "refresh")
        assert conn.channel().is_open
    finally:
        conn.close()


def test_after_close_ok_frames_still_in_flight_are_read_and_discarded(broker):
    """A client whose connection.close overtakes its own queued publishes (node's amqplib
    multiplexes channels): the broker answers close-ok and keeps reading and discarding
    until the client closes, instead of resetting the socket under the client's writes."""
    with connect(broker) as client:
        client.open_channel(1)
        publish = frame(FRAME_METHOD, 1, method_payload(
            commands.Basic.Publish(exchange="", routing_key="nowhere")))
        client.send(frame(FRAME_METHOD, 0, method_payload(
            commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))) + publish)
        client.expect(commands.Connection.CloseOk, 0)
        for _ in range(20):  # more in-flight frames after close-ok: still read, no reset
            client.send(publish + frame(FRAME_HEADER, 1, b"\x00\x3c" + bytes(12)))
            time.sleep(0.02)
        assert not client.is_closed(timeout=1.0)
