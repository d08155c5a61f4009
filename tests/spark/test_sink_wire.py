"""warren.spark.wire.Publisher, the sink's blocking publisher with confirms, against a scripted
fake broker on a real socket (no Spark, no broker process): the window (single acks out of
order, multiple acks), nacks, returns, a closed channel, a confirm timeout, bodies cut at the
negotiated frame_max, and the hand-encoded properties decoded by pamqp. The Spark writers
(Arrow batches, every column) against a real broker are at the end; those need Spark."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time

import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from warren.spark.connection import Endpoint
from warren.spark.wire import (ConfirmTimeout, Nacked, ProtocolError, Publisher, Returned, encode_properties,
                               property_template)

from .conftest import get_all, uri


class FakeBroker:
    """Accepts one connection on a free port, answers the handshake and confirm.select, then
    runs script(self) in a thread; whatever the script raises is raised again by join()."""

    def __init__(self, script, frame_max: int = 131072):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.script, self.frame_max = script, frame_max
        self.buf = b""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    def _run(self) -> None:
        try:
            self.sock, _ = self.listener.accept()
            self.sock.settimeout(10)
            assert self._exactly(8) == b"AMQP\x00\x00\x09\x01"
            self.send(spec.Connection.Start(server_properties={"product": "fake"}, mechanisms="PLAIN",
                                            locales="en_US"), channel=0)
            self.expect(spec.Connection.StartOk)
            self.send(spec.Connection.Tune(channel_max=16, frame_max=self.frame_max, heartbeat=0), channel=0)
            self.expect(spec.Connection.TuneOk)
            self.expect(spec.Connection.Open)
            self.send(spec.Connection.OpenOk(), channel=0)
            self.expect(spec.Channel.Open)
            self.send(spec.Channel.OpenOk())
            self.expect(spec.Confirm.Select)
            self.send(spec.Confirm.SelectOk())
            self.script(self)
        except BaseException as err:  # noqa: B902 (handed to the test)
            self.error = err
        finally:
            self.listener.close()

    def join(self) -> None:
        self.thread.join(15)
        assert not self.thread.is_alive(), "the fake broker's script did not end"
        if self.error is not None:
            raise self.error

    # -- frames
    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the client closed the connection")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def raw_frame(self) -> tuple[int, int, bytes]:
        ftype, channel, size = struct.unpack(">BHI", self._exactly(7))
        payload = self._exactly(size + 1)
        assert payload[-1:] == b"\xce"
        return ftype, channel, payload[:-1]

    def frame(self):
        ftype, channel, payload = self.raw_frame()
        return pframe.unmarshal(struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce")[2]

    def expect(self, kind):
        value = self.frame()
        assert isinstance(value, kind), value
        return value

    def send(self, *values, channel: int = 1) -> None:
        """Frames in one write: a client that gives up at the first may close before the rest."""
        self.sock.sendall(b"".join(pframe.marshal(value, channel) for value in values))

    def message(self) -> tuple[spec.Basic.Publish, ContentHeader, bytes, list[int]]:
        """The next basic.publish with its content: (method, header, body, body frame sizes)."""
        method = self.expect(spec.Basic.Publish)
        header = self.expect(ContentHeader)
        parts: list[bytes] = []
        while sum(map(len, parts)) < header.body_size:
            ftype, _channel, payload = self.raw_frame()
            assert ftype == 3
            parts.append(payload)
        return method, header, b"".join(parts), [len(p) for p in parts]

    def quiet(self, seconds: float = 0.3) -> None:
        """Nothing more arrives for `seconds`."""
        assert not self.buf
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        finally:
            self.sock.settimeout(10)
        raise AssertionError(f"the client sent more: {data[:60]!r}")


def _publisher(fake: FakeBroker, window: int = 1000, timeout: float = 5.0) -> Publisher:
    wire = Publisher(fake.endpoint, timeout)
    wire.confirm_select(window, timeout)
    return wire


def _props(message_id: str) -> bytes:
    return encode_properties({"message_id": message_id})


def test_the_window_holds_with_single_acks_out_of_order_and_multiple_acks():
    def script(fake):
        for _ in range(3):
            fake.message()
        fake.quiet()  # a window of 3: nothing more before an ack
        fake.send(spec.Basic.Ack(delivery_tag=2))
        fake.message()
        fake.quiet()  # 1 and 3 and 4 unconfirmed
        fake.send(spec.Basic.Ack(delivery_tag=1))  # 1 and 2 settled now
        fake.message()
        fake.quiet()
        fake.send(spec.Basic.Ack(delivery_tag=5, multiple=True))
        fake.expect(spec.Connection.Close)

    fake = FakeBroker(script)
    wire = _publisher(fake, window=3)
    for i in range(5):
        wire.publish("", "q", b"m%d" % i, _props(str(i)))
    wire.wait_confirms()
    assert (wire.published, wire.unconfirmed, wire.acked_above) == (5, 0, set())
    wire.close()
    fake.join()


def test_bodies_are_cut_at_the_negotiated_frame_max():
    got = []

    def script(fake):
        for _ in range(4):
            method, header, body, sizes = fake.message()
            got.append((method.routing_key, header.properties.message_id, header.body_size, body, sizes))
        fake.send(spec.Basic.Ack(delivery_tag=4, multiple=True))
        fake.expect(spec.Connection.Close)

    fake = FakeBroker(script, frame_max=4096)
    wire = _publisher(fake)
    assert wire.frame_max == 4096
    bodies = [bytes(range(256)) * 40, b"", b"y" * 4088, b"z" * 4089]  # 10240 octets: 4088 + 4088 + 2064
    for i, body in enumerate(bodies):
        wire.publish("", "k%d" % i, body, _props(str(i)))
    wire.wait_confirms()
    wire.close()
    fake.join()
    assert [(k, m, s, b) for k, m, s, b, _ in got] == [("k%d" % i, str(i), len(b), b) for i, b in enumerate(bodies)]
    assert [sizes for *_, sizes in got] == [[4088, 4088, 2064], [], [4088], [4088, 1]]


def test_a_nack_raises():
    def script(fake):
        for _ in range(3):
            fake.message()
        fake.send(spec.Basic.Ack(delivery_tag=1))
        fake.send(spec.Basic.Nack(delivery_tag=3, multiple=True))
        fake.expect(spec.Connection.Close)

    fake = FakeBroker(script)
    wire = _publisher(fake)
    for i in range(3):
        wire.publish("", "q", b"m", _props(str(i)))
    with pytest.raises(Nacked, match="nacked message 3 and those before it"):
        wire.wait_confirms()
    wire.close()
    fake.join()


def test_a_return_raises_though_its_ack_follows():
    def script(fake):
        method, header, body, _ = fake.message()
        assert method.mandatory
        fake.send(spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="nowhere"),
                  ContentHeader(0, len(body), header.properties), ContentBody(body), spec.Basic.Ack(delivery_tag=1))
        fake.expect(spec.Connection.Close)

    fake = FakeBroker(script)
    wire = _publisher(fake)
    wire.publish("x", "nowhere", b"lost", _props("1"), mandatory=True)
    with pytest.raises(Returned, match="312 NO_ROUTE"):
        wire.wait_confirms()
    wire.close()
    fake.join()


def test_a_closed_channel_raises():
    def script(fake):
        fake.message()
        fake.send(spec.Channel.Close(reply_code=404, reply_text="NOT_FOUND - no exchange 'x'", class_id=60,
                                     method_id=40))
        fake.expect(spec.Connection.Close)

    fake = FakeBroker(script)
    wire = _publisher(fake)
    wire.publish("x", "", b"m", _props("1"))
    with pytest.raises(ProtocolError, match="closed the channel: 404"):
        wire.wait_confirms()
    wire.close()
    fake.join()


def test_no_confirm_within_the_timeout_raises():
    def script(fake):
        fake.message()
        fake.message()
        fake.send(spec.Basic.Ack(delivery_tag=1))
        fake.expect(spec.Connection.Close)  # never confirms the second

    fake = FakeBroker(script)
    wire = _publisher(fake, timeout=0.5)
    wire.publish("", "q", b"a", _props("1"))
    wire.publish("", "q", b"b", _props("2"))
    started = time.monotonic()
    with pytest.raises(ConfirmTimeout, match="1 of 2 messages unconfirmed"):
        wire.wait_confirms()
    assert 0.4 < time.monotonic() - started < 3
    wire.close()
    fake.join()


def test_a_connection_gone_raises():
    def script(fake):
        fake.message()
        fake.sock.close()

    fake = FakeBroker(script)
    wire = _publisher(fake)
    wire.publish("", "q", b"a", _props("1"))
    with pytest.raises((ProtocolError, OSError)):
        wire.wait_confirms()
    wire.close()
    fake.join()


def test_properties_encoded_by_hand_decode_in_pamqp():
    when = datetime.datetime(2026, 11, 27, 1, 2, 3, tzinfo=datetime.timezone.utc)
    given = {"content_type": "text/plain", "content_encoding": "gzip", "headers": {"a": "b", "n": 7},
             "delivery_mode": 2, "priority": 5, "correlation_id": "c", "reply_to": "r", "expiration": "1000",
             "timestamp": when, "type": "t", "user_id": "guest", "app_id": "app", "cluster_id": "cl"}
    for message_id in ("id-1", None):
        raw = encode_properties({**given, "message_id": message_id})
        header = ContentHeader()
        header.unmarshal(struct.pack(">HHQ", 60, 0, 3) + raw)
        p = header.properties
        assert (p.content_type, p.content_encoding, p.headers, p.delivery_mode, p.priority, p.correlation_id,
                p.reply_to, p.expiration, p.message_id, p.timestamp, p.message_type, p.user_id, p.app_id,
                p.cluster_id) == ("text/plain", "gzip", {"a": "b", "n": 7}, 2, 5, "c", "r", "1000", message_id,
                                  when, "t", "guest", "app", "cl")
    before, after = property_template({"app_id": "x", "content_type": "y"})
    assert before + b"\x02id" + after == encode_properties({"app_id": "x", "content_type": "y", "message_id": "id"})
    assert encode_properties({}) == b"\x00\x00"
    with pytest.raises(ValueError, match="not AMQP basic properties"):
        property_template({"colour": "red"})
    with pytest.raises(ValueError, match="at most 255"):
        encode_properties({"message_id": "x" * 256})


# ---------------------------------------------------------------------------- Spark
#
# The writers against a real broker (tests/conftest.py); they need Spark (conftest.py here).

def _declare(broker, queue, **arguments):
    import pika
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(queue, arguments=arguments or None)
    conn.close()


def _drain(broker, queue):
    return [(method.routing_key, body, props) for method, props, body in get_all(broker, queue)]


def _writer(df, broker, **options):
    w = df.write.format("warren").option("uri", uri(broker)).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    return w


def test_every_column_of_an_arrow_batch(spark, broker, uid):
    """String bodies, per-row routing keys, headers, properties and message ids (some null:
    the properties' id, else the generated one), bodies past frame_max, a window of 3."""
    a, b = f"sw-a-{uid}", f"sw-b-{uid}"
    _declare(broker, a)
    _declare(broker, b)
    big = "B" * 300_000
    rows = [(("x%d" % i) if i != 7 else big, a if i % 2 else b, {"k": str(i)} if i % 3 else None,
             (f"text/t{i % 2}", 2, f"p{i}" if i % 5 == 0 else None, "app"), f"own{i}" if i % 4 == 0 else None)
            for i in range(40)]
    df = spark.createDataFrame(rows, "body STRING, routing_key STRING, headers MAP<STRING,STRING>, "
                                     "properties STRUCT<content_type: STRING, delivery_mode: INT, "
                                     "message_id: STRING, app_id: STRING>, message_id STRING").coalesce(1)
    _writer(df, broker, maxInFlight=3, writeId="w1").save()
    got = {body: (key, props) for key, body, props in _drain(broker, a) + _drain(broker, b)}
    assert len(got) == 40
    for i, (body, key, headers, (ctype, mode, pid, app), own) in enumerate(rows):
        routed, p = got[body.encode()]
        assert routed == key
        assert (p.content_type, p.delivery_mode, p.app_id) == (ctype, mode, app)
        assert p.headers == headers
        assert p.message_id == (own or pid or f"w1:{p.message_id.split(':')[1]}:0:{i + 1}"), (i, p.message_id)


def test_a_nacked_row_fails_the_write(spark, broker, uid):
    q = f"sw-full-{uid}"
    _declare(broker, q, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    df = spark.createDataFrame([(b"r%d" % i,) for i in range(5)], "body BINARY").coalesce(1)
    with pytest.raises(Exception, match="nacked"):
        _writer(df, broker, routingKey=q).save()
    assert [body for _, body, _ in _drain(broker, q)] == [b"r0"]


def test_source_and_sink_over_amqps(spark, tmp_path, uid):
    """The sink publishes and the source reads a stream over TLS (amqps:// and the CA in
    `cacertfile`); a broker certificate the client does not trust fails the write."""
    import pika
    from tests.conftest import EXTERNAL
    from tests.tls_certs import start_amqps_broker
    if EXTERNAL:
        pytest.skip("starts its own Warren with a TLS listener")
    broker, port, certs = start_amqps_broker(tmp_path)
    try:
        stream = f"tls-{uid}"
        conn = pika.BlockingConnection(broker.pika_params())
        conn.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        conn.close()
        url = f"amqps://guest:guest@localhost:{port}/%2F"
        df = spark.createDataFrame([(b"m%d" % i,) for i in range(50)], "body BINARY")
        (df.write.format("warren").option("uri", url).option("cacertfile", certs.ca)
         .option("routingKey", stream).mode("append").save())
        got = (spark.read.format("warren").option("uri", url).option("cacertfile", certs.ca)
               .option("stream", stream).load().select("body").collect())
        assert sorted(bytes(r.body) for r in got) == sorted(b"m%d" % i for i in range(50))
        # Without the CA the system's trust store does not know the test CA.
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            df.write.format("warren").option("uri", url).option("routingKey", stream).mode("append").save()
        with pytest.raises(Exception, match="need an amqps:// uri"):
            (df.write.format("warren").option("uri", uri(broker)).option("cacertfile", certs.ca)
             .mode("append").save())
    finally:
        broker.stop()
