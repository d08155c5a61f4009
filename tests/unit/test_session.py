"""The session layer without sockets: bytes in, bytes out (the h11 style)."""

import struct

from pamqp import commands, frame, header, body

from warren.broker.broker import Broker

from .fake_transport import FakeTransport, make_connection, open_connection


def test_handshake_and_capabilities():
    transport = FakeTransport()
    conn = make_connection(Broker.with_defaults(), transport)
    conn.data_received(b"AMQP\x00\x00\x09\x01")
    [(_, start)] = transport.frames()
    caps = start.server_properties["capabilities"]
    assert set(caps) == {"publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                         "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
                         "per_consumer_qos", "consumer_priorities", "x-warren-record-batch"}
    assert start.mechanisms == "PLAIN AMQPLAIN"


def test_wrong_protocol_header_gets_ours_back():
    transport = FakeTransport()
    conn = make_connection(Broker.with_defaults(), transport)
    conn.data_received(b"AMQP\x01\x01\x00\x0a")  # 0-10
    assert bytes(transport.data) == b"AMQP\x00\x00\x09\x01"
    assert transport.closed


def test_the_legacy_0_9_header_is_spoken_to_in_0_9_1():
    """AMQP\\x01\\x01\\x00\\x09 (0-9 as old clients announce it): RabbitMQ answers with its
    0-9-1 connection.start, and so does Warren."""
    transport = FakeTransport()
    conn = make_connection(Broker.with_defaults(), transport)
    conn.data_received(b"AMQP\x01\x01")
    assert not transport.closed and not transport.data
    conn.data_received(b"\x00\x09")
    [(_, start)] = transport.frames()
    assert isinstance(start, commands.Connection.Start) and (start.version_major, start.version_minor) == (0, 9)
    assert not transport.closed


def test_publish_and_get_in_one_chunk():
    conn, transport = open_connection()
    props = commands.Basic.Properties(content_type="text/plain", delivery_mode=2)
    chunk = b"".join([
        frame.marshal(commands.Channel.Open(), 1),
        frame.marshal(commands.Queue.Declare(queue="q1"), 1),
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="q1"), 1),
        frame.marshal(header.ContentHeader(0, 5, props), 1),
        frame.marshal(body.ContentBody(b"hello"), 1),
        frame.marshal(commands.Basic.Get(queue="q1", no_ack=True), 1),
    ])
    conn.data_received(chunk)
    frames = [f for _, f in transport.frames()]
    kinds = [type(f).__name__ for f in frames]
    assert kinds == ["OpenOk", "DeclareOk", "GetOk", "ContentHeader", "ContentBody"]
    get_ok, content_header, content = frames[2:]
    assert (get_ok.routing_key, get_ok.message_count, get_ok.delivery_tag) == ("q1", 0, 1)
    assert content_header.properties.content_type == "text/plain"
    assert content_header.properties.delivery_mode == 2
    assert content.value == b"hello"


def test_frames_split_at_every_byte_boundary():
    conn, transport = open_connection()
    data = b"".join([
        frame.marshal(commands.Channel.Open(), 1),
        frame.marshal(commands.Queue.Declare(queue="q2"), 1),
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="q2"), 1),
        frame.marshal(header.ContentHeader(0, 3, commands.Basic.Properties()), 1),
        frame.marshal(body.ContentBody(b"abc"), 1),
    ])
    for i in range(len(data)):
        conn.data_received(data[i:i + 1])
    kinds = [type(f).__name__ for _, f in transport.frames()]
    assert kinds == ["OpenOk", "DeclareOk"]
    assert conn.vhost.queues["q2"].message_count == 1


def test_oversized_frame_is_a_frame_error():
    conn, transport = open_connection()
    conn.data_received(struct.pack(">BHI", 1, 0, 200_000))
    [(_, close)] = transport.frames()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501


def _login(peer, user="guest", password="guest"):
    transport = FakeTransport(peer=peer)
    conn = make_connection(Broker.with_defaults(), transport)
    conn.data_received(b"AMQP\x00\x00\x09\x01")
    transport.frames()
    conn.data_received(frame.marshal(commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response=f"\0{user}\0{password}"), 0))
    return transport.frames()


def test_guest_is_refused_from_a_remote_address():
    # The peer address is an input of the session layer, so the loopback rule is testable here.
    [(_, close)] = _login(("10.1.2.3", 40000))
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN")


def test_guest_is_accepted_from_loopback():
    [(_, tune)] = _login(("127.0.0.1", 40000))
    assert isinstance(tune, commands.Connection.Tune)


def test_fake_transport_implements_the_transport_port():
    from warren.broker import ports

    port = ports.Transport
    members = {name for name in vars(port) if not name.startswith("_")} | set(port.__annotations__)
    assert {"peer", "local", "write", "schedule_flush", "pause_reading"} <= members
    transport = FakeTransport()
    assert sorted(m for m in members if not hasattr(transport, m)) == []
