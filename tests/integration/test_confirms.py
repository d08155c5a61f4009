"""Publisher confirms (confirm.select, basic.ack from the broker), including the order of
basic.return and basic.ack for unroutable mandatory messages, observed on the wire."""

import socket
import time

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands as c
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat


class RawClient:
    """A minimal AMQP 0-9-1 client over a plain socket (pamqp frames), so tests can see
    exactly which frames the broker sends, in which order."""

    def __init__(self, host, port, capabilities=None, frame_max=131072, user="guest", password="guest"):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.buf = b""
        self.frame_max = frame_max
        self.sock.sendall(pframe.marshal(pheader.ProtocolHeader(), 0))
        self.expect(c.Connection.Start)
        props = {"product": "warren-raw-test"}
        if capabilities is not None:
            props["capabilities"] = capabilities
        self.send(0, c.Connection.StartOk(client_properties=props, mechanism="PLAIN",
                                          response=f"\0{user}\0{password}"))
        tune = self.expect(c.Connection.Tune)
        if tune.frame_max:
            self.frame_max = min(frame_max, tune.frame_max)
        self.send(0, c.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0))
        self.send(0, c.Connection.Open(virtual_host="/"))
        self.expect(c.Connection.OpenOk)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # output ------------------------------------------------------------------
    def send(self, channel, frame):
        self.sock.sendall(pframe.marshal(frame, channel))

    def open_channel(self, channel=1):
        self.send(channel, c.Channel.Open())
        self.expect(c.Channel.OpenOk, channel=channel)

    def publish(self, channel, exchange, routing_key, body=b"", mandatory=False, properties=None):
        data = pframe.marshal(c.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
                              channel)
        data += pframe.marshal(pheader.ContentHeader(0, len(body), properties or c.Basic.Properties()), channel)
        limit = self.frame_max - 8
        for start in range(0, len(body), limit):
            data += pframe.marshal(pbody.ContentBody(body[start:start + limit]), channel)
        self.sock.sendall(data)

    # input -------------------------------------------------------------------
    def recv(self, timeout=5.0):
        """The next frame as (channel, frame), skipping heartbeats; None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                size = int.from_bytes(self.buf[3:7], "big")
                if len(self.buf) >= size + 8:
                    consumed, channel, frame = pframe.unmarshal(self.buf)
                    self.buf = self.buf[consumed:]
                    if isinstance(frame, pheartbeat.Heartbeat):
                        continue
                    return channel, frame
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                return None
            if not data:
                raise ConnectionError("connection closed by broker")
            self.buf += data

    def expect(self, kind, channel=None, timeout=5.0):
        got = self.recv(timeout)
        assert got is not None, f"timed out waiting for {kind.__name__}"
        ch, frame = got
        assert isinstance(frame, kind), f"expected {kind.__name__}, got {frame!r}"
        if channel is not None:
            assert ch == channel
        return frame

    def recv_message(self, timeout=5.0):
        """After a method with content: its header and the assembled body."""
        header = self.expect(pheader.ContentHeader, timeout=timeout)
        body = b""
        while len(body) < header.body_size:
            body += self.expect(pbody.ContentBody, timeout=timeout).value
        return header, body

    def frames_until_quiet(self, quiet=0.3):
        """Every frame received until nothing arrives for `quiet` seconds."""
        frames = []
        while (got := self.recv(quiet)) is not None:
            frames.append(got[1])
        return frames


# --------------------------------------------------------------------------- tests


def test_confirm_tags_start_at_one_per_channel(broker):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.send(2, c.Channel.Open())
        raw.expect(c.Channel.OpenOk, channel=2)
        raw.send(2, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.publish(1, "amq.fanout", "x", b"a")
        ack = raw.expect(c.Basic.Ack, channel=1)
        assert ack.delivery_tag == 1 and ack.multiple is False
        raw.publish(2, "amq.fanout", "x", b"b")
        ack = raw.expect(c.Basic.Ack, channel=2)
        assert ack.delivery_tag == 1
        raw.publish(1, "amq.fanout", "x", b"c")
        ack = raw.expect(c.Basic.Ack, channel=1)
        assert ack.delivery_tag == 2 and ack.multiple is False


def _raw(broker, **kw):
    return RawClient(broker.host, broker.port, **kw)


def _acked_tags(frames):
    """Expand broker basic.acks into the set of confirmed tags (assuming in-order acks)."""
    tags = []
    last = 0
    for f in frames:
        if isinstance(f, c.Basic.Ack):
            upto = f.delivery_tag
            tags.extend(range(last + 1, upto + 1) if f.multiple else [upto])
            last = max(last, upto)
    return tags


def test_confirm_many_publishes_all_acked(broker, uid):
    q = f"conf-many-{uid}"
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Queue.Declare(queue=q, exclusive=True))
        raw.expect(c.Queue.DeclareOk)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        for i in range(200):
            raw.publish(1, "", q, str(i).encode())
        frames = []
        while not frames or _acked_tags(frames)[-1:] != [200]:
            got = raw.recv(5)
            assert got is not None, "missing confirms"
            frames.append(got[1])
        tags = _acked_tags(frames)
        assert sorted(tags) == list(range(1, 201))
        assert all(isinstance(f, c.Basic.Ack) for f in frames)
        raw.send(1, c.Queue.Declare(queue=q, passive=True))
        assert raw.expect(c.Queue.DeclareOk).message_count == 200


def test_confirm_select_nowait(broker, uid):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Confirm.Select(nowait=True))
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"x")
        # No select-ok: the first thing back is the ack of publish 1.
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1 and not ack.multiple


def test_unroutable_not_mandatory_is_acked_without_return(broker, uid):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"x")
        frames = raw.frames_until_quiet()
        assert len(frames) == 1
        assert isinstance(frames[0], c.Basic.Ack) and frames[0].delivery_tag == 1


def test_unroutable_mandatory_returns_before_ack(broker, uid):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"lost", mandatory=True,
                    properties=c.Basic.Properties(message_id="m1"))
        ret = raw.expect(c.Basic.Return)
        assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
        assert ret.exchange == "amq.direct" and ret.routing_key == f"nobody-{uid}"
        header, body = raw.recv_message()
        assert body == b"lost" and header.properties.message_id == "m1"
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1 and not ack.multiple
        assert raw.frames_until_quiet(0.2) == []


def test_mixed_routable_and_returned_with_pika_select(broker, uid):
    """pika's SelectConnection sees each return before the ack of its publish."""
    q = f"conf-mix-{uid}"
    events = []

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        ch.add_on_return_callback(lambda _ch, method, props, body: events.append(("return", body)))
        ch.queue_declare(q, exclusive=True, callback=lambda _f: ch.confirm_delivery(
            lambda frame: on_confirm(ch, frame), callback=lambda _f: publish(ch)))

    def publish(ch):
        ch.basic_publish("", q, b"1")
        ch.basic_publish("", f"missing-{uid}", b"2", mandatory=True)
        ch.basic_publish("", q, b"3", mandatory=True)
        ch.basic_publish("", f"missing-{uid}", b"4", mandatory=True)

    def on_confirm(ch, frame):
        m = frame.method
        events.append(("ack" if isinstance(m, pika.spec.Basic.Ack) else "nack", m.delivery_tag, m.multiple))
        if m.delivery_tag == 4:
            ch.connection.close()

    conn = pika.SelectConnection(broker.pika_params(), on_open_callback=on_open)
    conn.ioloop.call_later(5, conn.ioloop.stop)
    conn.add_on_close_callback(lambda *a: conn.ioloop.stop())
    conn.ioloop.start()
    returns = [e for e in events if e[0] == "return"]
    assert returns == [("return", b"2"), ("return", b"4")]
    # RabbitMQ may ack out of order (an unroutable message is confirmed at once, a routed one
    # when its queue has it), and with multiple=true an ack covers every earlier tag.
    acked = set()
    for i, e in enumerate(events):
        if e[0] == "ack":
            newly = set(range(1, e[1] + 1)) - acked if e[2] else {e[1]}
            acked |= newly
            for tag, body in ((2, b"2"), (4, b"4")):
                if tag in newly:
                    assert ("return", body) in events[:i], events
    assert acked == {1, 2, 3, 4}
    assert not [e for e in events if e[0] == "nack"]


def test_mandatory_publish_before_select_does_not_shift_numbering(broker, uid):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"before", mandatory=True)
        raw.expect(c.Basic.Return)
        raw.recv_message()
        raw.publish(1, "amq.fanout", "", b"before2")
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.publish(1, "amq.direct", f"nobody-{uid}", b"after", mandatory=True)
        raw.expect(c.Basic.Return)
        raw.recv_message()
        ack = raw.expect(c.Basic.Ack)
        assert ack.delivery_tag == 1


def test_pika_blocking_confirms_and_unroutable(channel, uid):
    q = f"conf-blk-{uid}"
    channel.queue_declare(q, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", q, b"ok")  # raises unless acked
    with pytest.raises(pika.exceptions.UnroutableError) as err:
        channel.basic_publish("", f"missing-{uid}", b"lost", mandatory=True)
    assert [m.body for m in err.value.messages] == [b"lost"]
    assert channel.basic_get(q, auto_ack=True)[2] == b"ok"


def test_confirm_select_after_tx_select_is_406(channel):
    channel.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        channel.confirm_delivery()
    assert err.value.reply_code == 406
    assert err.value.reply_text == "PRECONDITION_FAILED - cannot switch from tx to confirm mode"


def test_tx_select_after_confirm_select_is_406(channel):
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        channel.tx_select()
    assert err.value.reply_code == 406
    assert err.value.reply_text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"


def test_confirm_select_twice_is_fine(broker):
    with _raw(broker) as raw:
        raw.open_channel(1)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.send(1, c.Confirm.Select())
        raw.expect(c.Confirm.SelectOk)
        raw.publish(1, "amq.fanout", "", b"x")
        assert raw.expect(c.Basic.Ack).delivery_tag == 1
