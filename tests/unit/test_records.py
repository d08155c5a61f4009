"""The records a session connection and channel give of themselves (warren.broker.records,
built by warren.session.records) and the actions their handles take, over fake transports:
what the management API and the metrics read instead of the session's objects. (What the API
makes of them: tests/integration/test_mgmt_*.py.)"""

from __future__ import annotations

import ssl

from pamqp import commands, frame

from tls_certs import TestCerts
from warren.broker.broker import Broker
from warren.broker.ports import TLSInfo
from warren.broker.records import ChannelInfo, ConnectionInfo
from warren.broker.stats import CHANNEL_COUNTERS

from .fake_transport import (
    FRAME_MAX, PROTOCOL_HEADER, ChannelClose, Client, ConnectionClose, FakeTransport, make_connection,
)

PEER = ("127.0.0.9", 40000)  # (guest logs in from a loopback address only)
NAME = "127.0.0.9:40000 -> 127.0.0.1:5672"


def test_only_open_connections_are_registered():
    broker = Broker.with_defaults()
    conn = make_connection(broker, FakeTransport(peer=PEER))
    conn.data_received(PROTOCOL_HEADER)
    assert conn not in broker.connections  # (in its handshake: RabbitMQ lists it once open)
    c = Client(broker, peer=PEER)
    assert broker.connections == {c.conn}
    c.conn.connection_lost()
    assert not broker.connections


def test_a_connection_record():
    c = Client(peer=PEER)
    c.open_channel(1)
    c.open_channel(2)
    info = c.conn.info()
    assert isinstance(info, ConnectionInfo)
    assert (info.name, info.peer_host, info.peer_port, info.host, info.port) == (
        NAME, "127.0.0.9", 40000, "127.0.0.1", 5672)
    assert c.conn.connection_link() == (NAME, "127.0.0.9", 40000)
    assert (info.user, info.vhost, info.auth_mechanism) == ("guest", "/", "PLAIN")
    assert info.client_properties == {"capabilities": {"consumer_cancel_notify": True}}
    assert info.provided_name is None and info.tls is None
    assert (info.heartbeat, info.frame_max, info.channel_max) == (0, FRAME_MAX, 2047)
    assert (info.state, info.last_blocked_by, info.blocked_age) == ("running", "none", None)
    assert info.channel_count == 2
    # Reads: the header, start-ok, tune-ok, open, two channel.opens; a write for each reply.
    assert (info.counters.recv_cnt, info.counters.send_cnt) == (6, c.transport.write_count) == (6, 5)
    assert info.counters.recv_oct > 6 * 8 and info.counters.send_oct > 5 * 8
    assert info.counters == c.conn.counters() and info.send_pend == 0


def test_a_record_is_a_snapshot():
    c = Client(peer=PEER)
    c.open_channel(1)
    c.declare(1, "q")
    before, channel_before = c.conn.info(), c.conn.channels[1].info()
    c.fill(1, "q", [b"abc"] * 3)
    c.open_channel(2)
    after, channel_after = c.conn.info(), c.conn.channels[1].info()
    assert before.channel_count == 1 and after.channel_count == 2
    assert after.counters.recv_oct > before.counters.recv_oct
    assert channel_before.counters["publish"] == 0 and channel_after.counters["publish"] == 3


def test_the_name_the_client_gives_its_connection():
    broker = Broker.with_defaults()
    # (A longstr that is not UTF-8 arrives as bytes: its bad bytes are shown replaced.)
    for given, shown in (("orders", "orders"), ("café", "café"), (b"ab\xff", "ab\ufffd"), (7, None)):
        transport = FakeTransport(peer=PEER)
        conn = make_connection(broker, transport)
        conn.data_received(PROTOCOL_HEADER)
        start_ok = frame.marshal(commands.Connection.StartOk(
            client_properties={"connection_name": "ab?" if isinstance(given, bytes) else given},
            mechanism="PLAIN", response="\0guest\0guest"), 0)
        conn.data_received(start_ok.replace(b"ab?", given) if isinstance(given, bytes) else start_ok)
        conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, FRAME_MAX, 0), 0))
        conn.data_received(frame.marshal(commands.Connection.Open("/"), 0))
        assert conn.info().provided_name == shown, given
        conn.connection_lost()


def test_a_channel_record():
    c = Client(peer=PEER)
    c.open_channel(1)
    c.declare(1, "q")
    c.fill(1, "q", [b"x" * 10, b"y" * 20, b"z" * 30])
    c.open_channel(2)
    c.qos(2, 2)
    c.qos(2, 5, global_=True)  # (after: a per-consumer qos lifts the channel's limit, as RabbitMQ 3.10's)
    c.receive()
    c.consume(2, "ctag", "q")  # two deliveries: the consumer's prefetch
    c.receive()
    [tag] = c.get_tags(2, 1)  # and a fetch
    assert tag == 3
    c.open_channel(3)
    c.call(3, commands.Confirm.Select())
    c.open_channel(4)
    c.call(4, commands.Tx.Select())
    c.publish(4, "", "q", b"in a transaction")
    c.publish(4, "", "q", b"and another")
    info = c.conn.channels[2].info()
    assert isinstance(info, ChannelInfo)
    assert (info.name, info.number, info.user, info.vhost, info.state) == (f"{NAME} (2)", 2, "guest", "/", "running")
    assert info.connection == c.conn.connection_link()
    assert (info.prefetch, info.global_prefetch, info.consumer_count, info.unacked) == (2, 5, 1, 3)
    assert (info.confirm, info.transactional, info.unconfirmed, info.uncommitted) == (False, False, 0, 0)
    assert info.counters["deliver"] == 2 and info.counters["get"] == 1
    assert c.conn.channels[2].channel_link() == (info.name, 2, "guest", info.connection)
    assert list(c.conn.channels[2].consumers) == ["ctag"]
    [queue] = c.broker.vhosts["/"].queues.values()
    assert c.conn.channels[2].unacked_bytes() == {queue: 60}
    assert c.conn.channels[1].unacked_bytes() == {}
    confirming = c.conn.channels[3].info()
    assert (confirming.confirm, confirming.received_confirm, confirming.unconfirmed) == (True, 0, 0)
    tx = c.conn.channels[4].info()
    assert (tx.transactional, tx.uncommitted, tx.acks_uncommitted) == (True, 2, 0)


def test_a_closing_channel_says_its_counters_are_in_the_totals():
    c = Client(peer=PEER)
    c.open_channel(1)
    c.declare(1, "q")
    c.fill(1, "q", [b"m"])
    channel = c.conn.channels[1]
    counts, closing = channel.counters()
    assert dict(zip(CHANNEL_COUNTERS, counts)) == channel.info().counters and not closing
    assert c.call(1, commands.Basic.Get(queue="missing")) == [
        ChannelClose(1, 404, "NOT_FOUND - no queue 'missing' in vhost '/'", 60, 70)]
    assert channel.info().state == "closing"
    counts, closing = channel.counters()
    assert closing and dict(zip(CHANNEL_COUNTERS, counts))["publish"] == 1 == c.broker.stats.message_totals["publish"]


def test_force_close_closes_with_connection_forced():
    c = Client(peer=PEER)
    c.open_channel(1)
    c.conn.force_close("Closed via management plugin")
    assert c.receive() == [ConnectionClose(320, "CONNECTION_FORCED - Closed via management plugin")]
    assert c.conn not in c.broker.connections


def test_a_tls_connection_record(tmp_path):
    certs = TestCerts.make(str(tmp_path))
    cert, _key = certs.client("alice")
    with open(cert) as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    broker = Broker.with_defaults()
    records = []
    for peer_cert in (der, None, b"not a certificate"):
        tls = TLSInfo("TLSv1.3", "TLS_AES_256_GCM_SHA384", peer_cert)
        transport = FakeTransport(peer=PEER, tls=tls)
        conn = make_connection(broker, transport)
        conn.data_received(PROTOCOL_HEADER)
        conn.data_received(frame.marshal(commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0guest"), 0))
        conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, FRAME_MAX, 0), 0))
        conn.data_received(frame.marshal(commands.Connection.Open("/"), 0))
        records.append(conn.info().tls)
    with_cert, without, unreadable = records
    assert with_cert[:4] == ("TLSv1.3", "any", "aes_256_gcm", "aead")
    subject, issuer, validity = with_cert.peer_certificate
    assert (subject, issuer) == ("O=Warren Tests,CN=alice", "CN=Warren Test CA")
    assert validity.endswith("Z") and " - " in validity
    assert without[:4] == with_cert[:4] and without.peer_certificate is None
    assert unreadable.peer_certificate is None  # (shown as null, as no certificate)
