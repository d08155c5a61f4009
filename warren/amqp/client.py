"""The client side of AMQP 0-9-1, sans-IO: what a broker's own links to other brokers speak
(shovels, federation). Bytes go in through `receive()`; what to send collects in `out`; what
happens is told to a `ClientEvents` handler. The asyncio shell is warren.server.link.

Messages pass through as bytes: a delivery's content header and its exchange and routing key
shortstrs (`route`) are slices of what arrived, and a publish writes a header it was given
unchanged, so moving a message between brokers never decodes or re-encodes its properties.
Only one channel is used (1): a link is one consumer or one publisher.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from . import spec
from .body import Body
from .codec import encode_table, shortstr
from .constants import FRAME_BODY, FRAME_END, FRAME_END_BYTE, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD
from .frames import HEARTBEAT, content_frames, method_frame
from .spec import Method, decode_method

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CHANNEL = 1
_HEAD = struct.Struct(">BHI")
_QB = struct.Struct(">QB")
_Q = struct.Struct(">Q")
_DELIVER = (60 << 16) | 60
_ACK = (60 << 16) | 80
_NACK = (60 << 16) | 120
_PUBLISH_ID = b"\x00\x3c\x00\x28\x00\x00"  # basic.publish, ticket 0


class ProtocolError(Exception):
    """The peer broke the protocol (a frame we cannot read)."""


class ClientEvents(Protocol):
    def opened(self) -> None:
        """connection.open-ok: the link may open its channel."""

    def method(self, method: Method) -> None:
        """A method on the channel (replies, basic.cancel, channel.close...)."""

    def delivery(self, delivery_tag: int, redelivered: bool, route: bytes, header: bytes, body: bytes) -> None:
        """basic.deliver with its content: `route` is its exchange and routing-key shortstrs."""

    def confirmed(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        """A publisher confirm (basic.ack, or basic.nack: ack False)."""

    def connection_closed(self, code: int, text: str) -> None:
        """The broker closed the connection (connection.close); close-ok is already queued."""

    def blocked(self, blocked: bool) -> None:
        """connection.blocked / unblocked."""


class Client:
    """One client connection's protocol state."""

    def __init__(self, events: ClientEvents, vhost: str, username: str, password: str,
                 mechanisms: tuple[str, ...], heartbeat: int, channel_max: int, frame_max: int,
                 properties: dict):
        self.events = events
        self.vhost = vhost
        self.username = username
        self.password = password
        self.mechanisms = mechanisms
        self.heartbeat = heartbeat
        self.channel_max = channel_max
        self.frame_max = frame_max or 131072
        self.properties = properties
        self.out: list = [PROTOCOL_HEADER]
        self.open = False
        self.closing = False
        self.received = False  # anything arrived since the last heartbeat check
        self.server_properties: dict = {}  # connection.start's
        self._buf = b""
        # The delivery whose content is arriving: (tag, redelivered, route), header, parts, size left.
        self._delivery: tuple[int, bool, bytes] | None = None
        self._header = b""
        self._parts: list[bytes] = []
        self._left = 0

    # -------------------------------------------------------------- input
    def receive(self, data: bytes) -> None:
        self.received = True
        buf = self._buf + data if self._buf else data
        pos = 0
        end = len(buf)
        while end - pos >= 7:
            kind, channel, size = _HEAD.unpack_from(buf, pos)
            stop = pos + 7 + size
            if stop >= end:
                break
            if buf[stop] != FRAME_END:
                raise ProtocolError("frame end marker missing")
            payload = buf[pos + 7:stop]
            pos = stop + 1
            if kind == FRAME_METHOD:
                self._method(channel, payload)
            elif kind == FRAME_HEADER:
                self._content_header(payload)
            elif kind == FRAME_BODY:
                self._body(payload)
            elif kind != FRAME_HEARTBEAT:
                raise ProtocolError(f"unknown frame type {kind}")
        self._buf = buf[pos:]

    def _method(self, channel: int, payload: bytes) -> None:
        ident = int.from_bytes(payload[:4], "big")
        if ident == _DELIVER:
            n = payload[4]
            tag, redelivered = _QB.unpack_from(payload, 5 + n)
            self._delivery = (tag, bool(redelivered & 1), payload[14 + n:])
            return
        if ident == _ACK or ident == _NACK:
            (tag,) = _Q.unpack_from(payload, 4)
            self.events.confirmed(tag, bool(payload[12] & 1), ident == _ACK)
            return
        method = decode_method(payload)
        if channel == 0:
            self._connection_method(method)
        elif isinstance(method, spec.ChannelClose):
            self.send(spec.ChannelCloseOk())
            self.events.method(method)
        else:
            self.events.method(method)

    def _content_header(self, payload: bytes) -> None:
        if self._delivery is None:
            return  # (a basic.return's content: the link publishes without mandatory)
        self._header = payload
        self._left = int.from_bytes(payload[4:12], "big")
        self._parts = []
        if not self._left:
            self._deliver()

    def _body(self, payload: bytes) -> None:
        if self._delivery is None:
            return
        self._parts.append(payload)
        self._left -= len(payload)
        if self._left <= 0:
            self._deliver()

    def _deliver(self) -> None:
        delivery, self._delivery = self._delivery, None
        assert delivery is not None
        parts, self._parts = self._parts, []
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.events.delivery(delivery[0], delivery[1], delivery[2], self._header, body)

    def _connection_method(self, method: Any) -> None:
        if isinstance(method, spec.ConnectionStart):
            self._start_ok(method)
        elif isinstance(method, spec.ConnectionTune):
            self._tune_ok(method)
        elif isinstance(method, spec.ConnectionOpenOk):
            self.open = True
            self.events.opened()
        elif isinstance(method, spec.ConnectionClose):
            self.out.append(method_frame(0, spec.ConnectionCloseOk()))
            self.open = False
            self.events.connection_closed(getattr(method, "reply_code"), getattr(method, "reply_text"))
        elif isinstance(method, spec.ConnectionCloseOk):
            self.open = False
        elif isinstance(method, spec.ConnectionBlocked):
            self.events.blocked(True)
        elif isinstance(method, spec.ConnectionUnblocked):
            self.events.blocked(False)

    def _start_ok(self, start: Any) -> None:
        props = start.server_properties
        self.server_properties = props if isinstance(props, dict) else {}
        offered = start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else start.mechanisms
        offered_names = offered.split()
        for mech in self.mechanisms:
            if mech.upper() in offered_names:
                break
        else:
            raise ProtocolError(f"no mechanism in common: the server offers {offered}")
        mechanism = mech.upper()
        if mechanism == "PLAIN":
            response = b"\x00" + self.username.encode() + b"\x00" + self.password.encode()
        elif mechanism == "AMQPLAIN":
            response = encode_table({"LOGIN": self.username, "PASSWORD": self.password})[4:]
        else:
            response = b""
        self.out.append(method_frame(0, spec.ConnectionStartOk(
            client_properties=self.properties, mechanism=mechanism, response=response, locale="en_US")))

    def _tune_ok(self, tune: Any) -> None:
        def negotiate(ours: int, theirs: int) -> int:
            return max(ours, theirs) if not ours or not theirs else min(ours, theirs)
        self.channel_max = negotiate(self.channel_max, tune.channel_max)
        self.frame_max = negotiate(self.frame_max, tune.frame_max)
        self.heartbeat = negotiate(self.heartbeat, tune.heartbeat)
        self.out.append(method_frame(0, spec.ConnectionTuneOk(
            channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat)))
        self.out.append(method_frame(0, spec.ConnectionOpen(virtual_host=self.vhost)))

    # -------------------------------------------------------------- output
    def send(self, method: Method, channel: int = CHANNEL) -> None:
        self.out.append(method_frame(channel, method))

    def publish(self, route: bytes, header: bytes, body: Body) -> None:
        """basic.publish (not mandatory) of a message whose exchange and routing key are the
        shortstrs in `route`, with its content header as given."""
        payload = _PUBLISH_ID + route + b"\x00"
        out = self.out
        out.append(_HEAD.pack(FRAME_METHOD, CHANNEL, len(payload)))
        out.append(payload)
        out.append(FRAME_END_BYTE)
        content_frames(out, CHANNEL, header, body, self.frame_max)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.out.append(_HEAD.pack(FRAME_METHOD, CHANNEL, 13) + b"\x00\x3c\x00\x50"
                        + _QB.pack(delivery_tag, multiple) + FRAME_END_BYTE)

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.out.append(_HEAD.pack(FRAME_METHOD, CHANNEL, 13) + b"\x00\x3c\x00\x78"
                        + _QB.pack(delivery_tag, multiple | (requeue << 1)) + FRAME_END_BYTE)

    def heartbeat_frame(self) -> None:
        self.out.append(HEARTBEAT)

    def close(self, code: int = 200, text: str = "Goodbye") -> None:
        if self.open and not self.closing:
            self.closing = True
            self.out.append(method_frame(0, spec.ConnectionClose(reply_code=code, reply_text=text)))

    def take_output(self) -> list:
        out, self.out = self.out, []
        return out


def route(exchange: str, routing_key: str) -> bytes:
    """The shortstrs a publish names its exchange and routing key with."""
    return shortstr(exchange) + shortstr(routing_key)

