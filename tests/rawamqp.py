"""A tiny raw-socket AMQP 0-9-1 client for the tests.

It speaks the protocol by hand (frames are built here, methods are encoded and decoded with
pamqp, independently of Warren's own codec), so tests can send exactly the bytes they want
(wrong protocol headers, oversized or malformed frames, methods out of order) and see exactly
which frames the broker sends back, in which order.
"""

import socket
import struct
import time

from pamqp import commands, frame as pframe, header as pheader
from pamqp.body import ContentBody
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"

CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}


class ConnectionEOF(ConnectionError):
    """The server closed the socket."""


def frame(ftype: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def method_payload(method) -> bytes:
    """class id, method id and arguments of a pamqp command."""
    return struct.pack(">I", method.index) + method.marshal()


def shortstr(s) -> bytes:
    s = s.encode() if isinstance(s, str) else s
    return bytes((len(s),)) + s


def longstr(s) -> bytes:
    s = s.encode() if isinstance(s, str) else s
    return struct.pack(">I", len(s)) + s


def amqplain(user: str, password: str) -> bytes:
    """An AMQPLAIN response: a field table without its length prefix."""
    return shortstr("LOGIN") + b"S" + longstr(user) + shortstr("PASSWORD") + b"S" + longstr(password)


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def start_ok_payload(client_properties: dict, mechanism: str, response: bytes, locale: str = "en_US") -> bytes:
    """connection.start-ok built by hand: pamqp encodes the response as text, ours is binary."""
    return (struct.pack(">HH", 10, 11) + _table(client_properties) + shortstr(mechanism) + longstr(response)
            + shortstr(locale))


class Frame:
    """A frame from the server: `type`, `channel`, raw `payload`; `method` for a method frame
    and `value`, the frame decoded with pamqp (a method, ContentHeader, ContentBody or
    Heartbeat; header frames are decoded only when `value` is read)."""

    def __init__(self, ftype, channel, payload):
        self.type = ftype
        self.channel = channel
        self.payload = bytes(payload)
        self.method = None
        if ftype == FRAME_METHOD:
            if self.payload[:4] in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
                self.method = _decode_close(self.payload)
            else:
                self.method = pframe._unmarshal_method_frame(self.payload)

    @property
    def value(self):
        if self.type == FRAME_METHOD:
            return self.method
        if self.type == FRAME_HEADER:
            return pframe._unmarshal_header_frame(self.payload)
        if self.type == FRAME_BODY:
            return ContentBody(self.payload)
        if self.type == FRAME_HEARTBEAT:
            return Heartbeat()
        return None

    def __repr__(self):
        what = self.method if self.method is not None else self.payload[:40]
        return f"Frame(type={self.type}, channel={self.channel}, {what!r})"


class RawClient:
    """A socket to the broker, before the handshake: see connect() for one that has opened
    the vhost."""

    def __init__(self, host, port, timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.start = None   # connection.start
        self.tune = None    # connection.tune
        self.frame_max = 131072  # as negotiated by handshake(); publish() splits bodies by it
        self.heartbeats = []  # arrival times of heartbeat frames seen by read_frame

    # ------------------------------------------------------------------ bytes
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, ftype, channel, payload, end=FRAME_END) -> None:
        self.send(frame(ftype, channel, payload, end))

    def send_method(self, channel: int, method) -> None:
        self.send(pframe.marshal(method, channel))

    def call(self, channel: int, method, reply=None, timeout=None):
        """Send a synchronous method and return the server's answer on the same channel,
        which must be `reply` (by default the method's one valid response)."""
        if reply is None:
            (name,) = method.valid_responses
            class_name, method_name = name.split(".")
            reply = getattr(getattr(commands, class_name), method_name)
        self.send_method(channel, method)
        return self.expect(reply, channel, timeout)

    def send_content(self, channel: int, body: bytes, body_size=None, properties=None) -> None:
        """A content header and one body frame (none for an empty body), whatever frame_max."""
        size = len(body) if body_size is None else body_size
        hdr = pheader.ContentHeader(0, size, properties or commands.Basic.Properties())
        self.send(pframe.marshal(hdr, channel))
        if body:
            self.send(pframe.marshal(ContentBody(body), channel))

    def publish(self, channel, exchange, routing_key, body: bytes = b"", mandatory=False, properties=None,
                immediate=False) -> None:
        """basic.publish, its content header and the body in frames of at most frame_max,
        in one write."""
        data = pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                     mandatory=mandatory, immediate=immediate), channel)
        data += pframe.marshal(pheader.ContentHeader(0, len(body), properties or commands.Basic.Properties()),
                               channel)
        limit = self.frame_max - 8
        for start in range(0, len(body), limit):
            data += pframe.marshal(ContentBody(body[start:start + limit]), channel)
        self.send(data)

    def _fill(self, deadline) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from the server")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no data from the server") from None
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionEOF()
        self.buf += data

    def read_exact(self, n: int, timeout=None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            self._fill(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_frame(self, timeout=None, skip_heartbeats=True) -> Frame:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            while len(self.buf) < 7:
                self._fill(deadline)
            ftype, channel, size = struct.unpack_from(">BHI", self.buf)
            while len(self.buf) < 8 + size:
                self._fill(deadline)
            assert self.buf[7 + size] == FRAME_END, f"bad frame end from server: {bytes(self.buf[:16])!r}"
            payload = bytes(self.buf[7:7 + size])
            del self.buf[:8 + size]
            if ftype == FRAME_HEARTBEAT:
                self.heartbeats.append(time.monotonic())
                if skip_heartbeats:
                    continue
            return Frame(ftype, channel, payload)

    def expect(self, cls, channel=None, timeout=None):
        """Read the next frame, which must be a `cls` (a pamqp method class, ContentHeader or
        ContentBody), on `channel` if given; return it decoded."""
        f = self.read_frame(timeout)
        value = f.value
        assert isinstance(value, cls), f"expected {cls.__name__}, got {f!r}"
        if channel is not None:
            assert f.channel == channel, f"expected channel {channel}, got {f!r}"
        return value

    def read_content(self, timeout=None):
        """After a method with content (deliver, get-ok, return): its header and the
        assembled body."""
        header = self.expect(pheader.ContentHeader, timeout=timeout)
        body = b""
        while len(body) < header.body_size:
            body += self.expect(ContentBody, timeout=timeout).value
        return header, body

    def frames_until_quiet(self, quiet=0.3) -> list:
        """Every frame (decoded, heartbeats skipped) received until nothing arrives for `quiet`
        seconds."""
        frames = []
        while True:
            try:
                frames.append(self.read_frame(quiet).value)
            except TimeoutError:
                return frames

    def expect_eof(self, timeout=None) -> bytes:
        """Read until the server closes the socket; returns what came before the close."""
        deadline = time.monotonic() + (timeout or self.timeout)
        data = bytearray()
        while True:
            try:
                self._fill(deadline)
            except ConnectionEOF:
                data += self.buf
                self.buf.clear()
                return bytes(data)
            data += self.buf
            self.buf.clear()

    def is_closed(self, timeout=0.5) -> bool:
        """True if the server has closed the socket within `timeout` seconds (data is drained)."""
        try:
            self.expect_eof(timeout)
            return True
        except TimeoutError:
            return False

    def expect_connection_close(self, code: int, text=None, class_id=None, method_id=None, timeout=None,
                                check_eof=True):
        """The next frame must be connection.close with `code` (and `text`, `class_id` and
        `method_id`, if given); answers close-ok and checks the server then closes the socket
        (unless check_eof is False: after a framing error the server may not be able to read
        our close-ok). Returns the close method."""
        close = _check_close(self.expect(commands.Connection.Close, 0, timeout), code, text, class_id, method_id)
        self.send_method(0, commands.Connection.CloseOk())
        if check_eof:
            assert self.is_closed(self.timeout), "socket still open after close-ok"
        return close

    def expect_channel_close(self, channel: int, code: int, text=None, class_id=None, method_id=None,
                             timeout=None):
        """The next frame must be channel.close with `code` (and `text`, `class_id` and
        `method_id`, if given) on `channel`; answers close-ok and returns the close."""
        close = _check_close(self.expect(commands.Channel.Close, channel, timeout), code, text, class_id, method_id)
        self.send_method(channel, commands.Channel.CloseOk())
        return close

    # ------------------------------------------------------------- handshake
    def start_handshake(self, header: bytes = PROTOCOL_HEADER):
        self.send(header)
        self.start = self.expect(commands.Connection.Start, 0)
        return self.start

    def login(self, user="guest", password="guest", mechanism="PLAIN", capabilities=True, response=None):
        """Send start-ok; returns nothing (the caller reads tune or the refusal).
        capabilities: True for CLIENT_CAPABILITIES, False for none at all (no capabilities
        table), or the table to send."""
        props = {"product": "warren-tests rawamqp"}
        if capabilities is True:
            props["capabilities"] = dict(CLIENT_CAPABILITIES)
        elif capabilities is not False:
            props["capabilities"] = dict(capabilities)
        if response is None:
            response = plain(user, password) if mechanism == "PLAIN" else amqplain(user, password)
        self.send_frame(FRAME_METHOD, 0, start_ok_payload(props, mechanism, response))

    def handshake(self, user="guest", password="guest", vhost="/", mechanism="PLAIN",
                  channel_max=None, frame_max=None, heartbeat=0, open_vhost=True, capabilities=True):
        """Run the handshake up to open-ok (or up to tune-ok when open_vhost is False).
        None for channel_max/frame_max means: accept the server's value."""
        self.start_handshake()
        self.login(user, password, mechanism, capabilities)
        self.tune = self.expect(commands.Connection.Tune, 0)
        frame_max = self.tune.frame_max if frame_max is None else frame_max
        self.send_method(0, commands.Connection.TuneOk(
            channel_max=self.tune.channel_max if channel_max is None else channel_max,
            frame_max=frame_max, heartbeat=heartbeat))
        self.frame_max = frame_max or 1 << 32  # 0: no limit
        if open_vhost:
            self.send_method(0, commands.Connection.Open(virtual_host=vhost))
            self.expect(commands.Connection.OpenOk, 0)
        return self

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, channel)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_close(close, code, text, class_id, method_id):
    """Assert a connection.close / channel.close has `code` and, where given, `text` and
    `class_id`.`method_id`."""
    assert (close.reply_code, close.reply_text if text is not None else None) == (code, text), \
        f"got {close.name} {close.reply_code} {close.reply_text!r}"
    if class_id is not None:
        assert (close.class_id, close.method_id) == (class_id, method_id), \
            f"close for method {close.class_id}.{close.method_id}"
    return close


def _decode_close(payload: bytes):
    """connection.close / channel.close by hand: RabbitMQ may put latin-1 bytes in the
    reply text (pamqp insists on UTF-8)."""
    (code,) = struct.unpack_from(">H", payload, 4)
    n = payload[6]
    raw = payload[7:7 + n]
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    class_id, method_id = struct.unpack_from(">HH", payload, 7 + n)
    cls = commands.Connection.Close if payload[1] == 10 else commands.Channel.Close
    return cls(reply_code=code, reply_text=text, class_id=class_id, method_id=method_id)


def _table(table: dict) -> bytes:
    from pamqp import encode
    return encode.field_table(table)


def dial(broker, timeout=5.0) -> RawClient:
    """A raw client connected to `broker` that has sent nothing yet."""
    return RawClient(broker.host, broker.port, timeout)


def connect(broker, timeout=5.0, **handshake_args) -> RawClient:
    """A raw client that has opened the vhost (and no channel yet); handshake_args as for
    RawClient.handshake (user, password, vhost, frame_max, capabilities, ...)."""
    client = dial(broker, timeout)
    client.handshake(**handshake_args)
    return client
