"""A tiny raw-socket AMQP 0-9-1 client for connection-level tests.

It speaks the protocol by hand (frames are built here, methods are encoded and decoded with
pamqp, independently of Warren's own codec), so tests can send exactly the bytes they want:
wrong protocol headers, oversized or malformed frames, methods out of order.
"""

import socket
import struct
import time

from pamqp import commands, frame as pframe, header as pheader
from pamqp.body import ContentBody

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


class ConnectionEOF(Exception):
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


class Frame:
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

    def __repr__(self):
        what = self.method if self.method is not None else self.payload[:40]
        return f"Frame(type={self.type}, channel={self.channel}, {what!r})"


class RawClient:
    def __init__(self, host, port, timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.start = None   # connection.start
        self.tune = None    # connection.tune
        self.heartbeats = []  # arrival times of heartbeat frames seen by read_frame

    # ------------------------------------------------------------------ bytes
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, ftype, channel, payload, end=FRAME_END) -> None:
        self.send(frame(ftype, channel, payload, end))

    def send_method(self, channel: int, method) -> None:
        self.send(pframe.marshal(method, channel))

    def send_content(self, channel: int, body: bytes, body_size=None, properties=None) -> None:
        """A content header and one body frame."""
        size = len(body) if body_size is None else body_size
        hdr = pheader.ContentHeader(0, size, properties or commands.Basic.Properties())
        self.send(pframe.marshal(hdr, channel))
        if body:
            self.send(pframe.marshal(ContentBody(body), channel))

    def publish(self, channel, exchange, routing_key, body: bytes, mandatory=False) -> None:
        self.send_method(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                         mandatory=mandatory))
        self.send_content(channel, body)

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
        """Read the next frame, which must be a method of class `cls`; return the method."""
        f = self.read_frame(timeout)
        assert f.method is not None and isinstance(f.method, cls), f"expected {cls.__name__}, got {f!r}"
        if channel is not None:
            assert f.channel == channel, f"expected channel {channel}, got {f!r}"
        return f.method

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
        """Expect connection.close with `code` (and `text`, if given), answer close-ok and
        check the server then closes the socket (unless check_eof is False: after a framing
        error the server may not be able to read our close-ok). Returns the close method."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            f = self.read_frame(max(deadline - time.monotonic(), 0.01))
            if f.channel == 0 and isinstance(f.method, commands.Connection.Close):
                break
            # Anything the server had already queued before the error (e.g. a channel.open-ok).
        close = f.method
        assert (close.reply_code, close.reply_text if text is not None else None) == (code, text), \
            f"got connection.close {close.reply_code} {close.reply_text!r}"
        if class_id is not None:
            assert (close.class_id, close.method_id) == (class_id, method_id), \
                f"close for method {close.class_id}.{close.method_id}"
        self.send_method(0, commands.Connection.CloseOk())
        if check_eof:
            assert self.is_closed(self.timeout), "socket still open after close-ok"
        return close

    def expect_channel_close(self, channel: int, code: int, text=None, timeout=None):
        m = self.expect(commands.Channel.Close, channel, timeout)
        assert (m.reply_code, m.reply_text if text is not None else None) == (code, text), \
            f"got channel.close {m.reply_code} {m.reply_text!r}"
        self.send_method(channel, commands.Channel.CloseOk())
        return m

    # ------------------------------------------------------------- handshake
    def start_handshake(self, header: bytes = PROTOCOL_HEADER):
        self.send(header)
        self.start = self.expect(commands.Connection.Start, 0)
        return self.start

    def login(self, user="guest", password="guest", mechanism="PLAIN", capabilities=True, response=None):
        """Send start-ok; returns nothing (the caller reads tune or the refusal)."""
        props = {"product": "warren-tests rawamqp"}
        if capabilities:
            props["capabilities"] = dict(CLIENT_CAPABILITIES)
        if response is None:
            response = plain(user, password) if mechanism == "PLAIN" else amqplain(user, password)
        # connection.start-ok built by hand: pamqp encodes the response as text, ours is binary.
        payload = (struct.pack(">HH", 10, 11) + _table(props) + shortstr(mechanism)
                   + longstr(response) + shortstr("en_US"))
        self.send_frame(FRAME_METHOD, 0, payload)

    def handshake(self, user="guest", password="guest", vhost="/", mechanism="PLAIN",
                  channel_max=None, frame_max=None, heartbeat=0, open_vhost=True):
        """Run the handshake up to open-ok (or up to tune-ok when open_vhost is False).
        None for channel_max/frame_max means: accept the server's value."""
        self.start_handshake()
        self.login(user, password, mechanism)
        self.tune = self.expect(commands.Connection.Tune, 0)
        self.send_method(0, commands.Connection.TuneOk(
            channel_max=self.tune.channel_max if channel_max is None else channel_max,
            frame_max=self.tune.frame_max if frame_max is None else frame_max,
            heartbeat=heartbeat))
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


def connect(broker, timeout=5.0, **handshake_args) -> RawClient:
    """A raw client that has opened the vhost (and no channel yet)."""
    client = RawClient(broker.host, broker.port, timeout)
    client.handshake(**handshake_args)
    return client


# --------------------------------------------------------------------------------------
# Brokers with extra users, vhosts and permissions (RabbitMQ definitions JSON).

def password_hash(password: str, algorithm: str = "sha256", salt: bytes = b"\x8a\x1e\x07\x33") -> str:
    """RabbitMQ's stored password hash, base64(salt + H(salt + password)), computed here
    independently of Warren."""
    import base64
    import hashlib
    digest = getattr(hashlib, algorithm)(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


class DefinitionsBroker:
    """Where a test finds a broker loaded with `definitions`: a fresh `warren server
    --definitions FILE`, or, when WARREN_TEST_BROKER points at RabbitMQ and
    WARREN_TEST_RABBITMQCTL holds a rabbitmqctl command line for that node, the same
    definitions imported there (and removed again by stop())."""

    def __init__(self, definitions: dict):
        import json
        import os
        import shlex
        import subprocess
        import tempfile

        import pytest
        from conftest import EXTERNAL, BrokerProcess, start_broker

        self.definitions = definitions
        self.external = bool(EXTERNAL)
        directory = tempfile.mkdtemp(prefix="warren-defs-")
        os.chmod(directory, 0o755)
        path = os.path.join(directory, "definitions.json")
        with open(path, "w") as f:
            json.dump(definitions, f)
        os.chmod(path, 0o644)
        if not EXTERNAL:
            self.broker = start_broker("--definitions", path)
            return
        ctl = os.environ.get("WARREN_TEST_RABBITMQCTL")
        if not ctl:
            pytest.skip("needs its own users and vhosts: set WARREN_TEST_RABBITMQCTL to import them")
        self.ctl = shlex.split(ctl)
        host, port = EXTERNAL.rsplit(":", 1)
        self.broker = BrokerProcess(host, int(port))
        subprocess.run([*self.ctl, "import_definitions", path], check=True, capture_output=True, timeout=60)
        # The import is asynchronous: wait until the last user can log in.
        user = definitions["users"][-1]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            listed = subprocess.run([*self.ctl, "list_users", "-q"], capture_output=True, text=True, timeout=60)
            if any(line.split("\t")[0] == user["name"] for line in listed.stdout.splitlines()):
                break
            time.sleep(0.2)

    def stop(self) -> None:
        import subprocess
        if not self.external:
            self.broker.stop()
            return
        for user in self.definitions.get("users", []):
            subprocess.run([*self.ctl, "delete_user", user["name"]], capture_output=True, timeout=60)
        for vhost in self.definitions.get("vhosts", []):
            if vhost["name"] != "/":
                subprocess.run([*self.ctl, "delete_vhost", vhost["name"]], capture_output=True, timeout=60)
