"""One AMQP connection: handshake, frame parsing, channel dispatch and output batching.

The server feeds received bytes to `data_received`; everything the connection wants to send
is gathered in `out` and written to the transport (warren.broker.ports.Transport) in one
piece per loop tick (`flush`), after the durable state the replies promise is written.
"""

from __future__ import annotations

import enum
import platform
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

from .. import __version__
from ..amqp import spec
from ..amqp.codec import DecodeError, MalformedUTF8
from ..amqp.constants import (
    ACCESS_REFUSED, CONNECTION_FORCED, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    FRAME_MIN_SIZE, NOT_ALLOWED, PROTOCOL_HEADER, REPLY_NAMES,
)
from ..amqp.frames import HEARTBEAT, method_frame
from ..broker.errors import (
    AMQPError, channel_error, command_invalid, not_allowed,
    syntax_error, unexpected_frame,
)
from ..broker import auth_mechanisms, x509
from ..broker.consumer import RECORD_BATCH
from ..broker.limits import NONE as NO_USAGE, channel_limited, check_channel, check_connection, connection_limited
from ..broker.links import ExclusiveOwner
from ..broker.metadata.commands import DeleteQueue
from . import connection_log, frame_errors, records
from .channel import Channel, HoldInput
from .closed_transport import ClosedTransport
from .gated_output import GatedOutput
from .sasl import credentials
from .throttle import Reason, Throttle

if TYPE_CHECKING:
    from ..broker.auth import User
    from ..broker.broker import Broker
    from ..broker.ports import Timer, Transport
    from ..broker.queue_flow import QueueCredit
    from ..broker.records import ConnectionCounters, ConnectionInfo, ConnectionLink, Usage
    from ..broker.vhost import VHost
    from ..store.settlement import Settlement

_FRAME_HEAD = struct.Struct(">BHI")
_unpack_head = _FRAME_HEAD.unpack_from
_HH = struct.Struct(">HH")
_I = struct.Struct(">I")
_CONNECTION_CLOSE, _CONNECTION_CLOSE_OK = (10 << 16) | 50, (10 << 16) | 51

# The header of AMQP 0-9 as some old clients send it (class 1, instance 1, version 0-9):
# RabbitMQ speaks 0-9-1 to them, and so does Warren.
_LEGACY_0_9_HEADER = b"AMQP\x01\x01\x00\x09"


class ConnectionState(enum.IntEnum):
    AWAIT_HEADER = 0
    AWAIT_START_OK = 1
    AWAIT_TUNE_OK = 2
    AWAIT_OPEN = 3
    OPEN = 4
    CLOSING = 5  # we sent connection.close: waiting for close-ok
    CLOSED = 6


AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = ConnectionState
# RabbitMQ's names for them, as its error texts say them.
_STATE_NAMES = {AWAIT_START_OK: "starting", AWAIT_TUNE_OK: "tuning", AWAIT_OPEN: "opening", OPEN: "running"}

# RabbitMQ does not trust a client that fails the handshake: most such errors get no
# connection.close, the socket just closes after this delay (its SILENT_CLOSE_DELAY).
SILENT_CLOSE_DELAY = 3.0

# After close-ok the socket is left for the client to close, for at most this long
# (RabbitMQ's CLOSING_TIMEOUT).
CLOSING_TIMEOUT = 30.0

# RabbitMQ answers a client's connection.close only once every channel process has exited
# (its reader shuts them down and waits for their exits): 0.2 to 0.7 ms after the close on
# a quiet machine, later under load; with no channel open, at once. Warren releases its
# channels synchronously, so the close-ok of a connection that had channels open waits:
# a client that races its own close against the close-ok (aiormq's writer, still finishing
# the write of its connection.close, and its reader, which ends on the close-ok) sees the
# close-ok once it is waiting for it, as with RabbitMQ, not in the middle of sending its
# close. uvloop's timers count whole milliseconds from the loop's cached time, so 2 ms
# fires 1 to 2 ms after the close, a little after RabbitMQ's usual close-ok.
CLOSE_OK_DELAY = 0.002

# RabbitMQ shows a connection as `flow` while it is in flow and for this long after.
FLOW_SHOWN_FOR = 5.0

# How much output may pile up in one tick before consumers of this connection are paused
# and its input is held back.
OUTPUT_HIGH_WATER = 1 << 20
# Output of a tick below this size is joined into one write; above it, pieces of _BIG_PIECE
# or more are passed by reference (joining small frames is cheaper than writev of many
# pieces: 8 KiB bodies by reference cost 13 % more CPU; 16 KiB and up, none). A body kept in
# parts goes out as slices that a frame boundary may cut to any size: with 64 KiB here the
# broker spent ~5 % more CPU a GB of 16 MiB bodies, joining the slices below it.
_JOIN_LIMIT = 256 << 10
_BIG_PIECE = 16 << 10
# A body frame at least this big that has not arrived whole is collected as views of the
# reads it arrives in, and kept with the rest of its body (Channel.body_received).
_STREAM_MIN = 4096

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "consumer_priorities": True,  # (x-priority: what a federated queue's link relies on upstream)
    RECORD_BATCH: True,  # (Warren's own: stream record batches)
}


def server_properties(cluster_name: str) -> dict:
    return {
        "product": "Warren",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "copyright": "Warren contributors",
        "information": "AMQP 0-9-1 broker compatible with RabbitMQ clients",
        "cluster_name": cluster_name,
        "capabilities": dict(CAPABILITIES),
    }


class Connection:
    def __init__(self, broker: Broker, transport: Transport):
        self.broker = broker
        self.transport: Transport = transport
        self.peer = transport.peer
        self.tls = transport.tls  # a warren.broker.ports.TLSInfo over TLS, else None
        self.state = AWAIT_HEADER
        # Received bytes not handled yet: the reads themselves (immutable bytes, so frames are
        # sliced out of them and no view can see them change), from head_pos of the first.
        self.pending: deque[bytes] = deque()
        self.pending_len = 0
        self.head_pos = 0
        self.read_pos = 0  # where _read_frames stopped (also when a frame raised)
        # The body frame being collected as it arrives: its channel, views of its payload so
        # far, and how many payload octets are still to come (then its frame end).
        self.sink_channel: Channel | None = None
        self.sink_parts: list[memoryview] | None = None
        self.sink_left = self.sink_size = 0
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        self.gates = GatedOutput()  # replicated queues' deliveries held in `out`
        self.throttle = Throttle(transport, self._resume_delivering)
        # The resource alarms (warren.broker.alarms), as RabbitMQ's reader sees them: while any
        # is on, on any node of the cluster, the connection is `blocking`; once it publishes it is `blocked` (input stops
        # where the publish is, Reason.BLOCKED) until every alarm has cleared. `alarmed` is the
        # one attribute the publish path tests.
        self.alarmed = False
        self.blocked = False
        self.blocked_sent = False  # connection.blocked went out: connection.unblocked is due
        self.last_blocked_by = "none"  # "resource" (an alarm) or "flow" (RabbitMQ's words)
        self.last_blocked_at: float | None = None  # monotonic time it was last blocked
        # Credit flow (warren.store.persister): `store_over` mirrors the store's `over` (the
        # one attribute tested per read); `in_flow` while its socket is not read for it.
        self.store_over = False
        self.in_flow = False
        # Queue credit (warren.broker.queue_flow): the queues holding this connection back.
        self.flow_credits: set[QueueCredit] = set()
        self.confirming: set[Channel] = set()  # channels with confirms waiting to go out
        self.channels: dict[int, Channel] = {}
        limits = broker.config.limits
        self.frame_max = FRAME_MIN_SIZE  # until tune-ok, as RabbitMQ
        self.channel_max = limits.channel_max
        self.heartbeat = 0
        self.user: User | None = None
        self.vhost: VHost | None = None
        self.client_properties: dict = {}
        self.capabilities: dict = {}
        self.exclusive_queues: list = []
        self.close_ok_timer: Timer | None = None  # the delayed close-ok (CLOSE_OK_DELAY)
        self.name = f"{self.peer[0]}:{self.peer[1]}"
        # Its log lines (warren.session.connection_log): its id there, whether it has sent a
        # byte, whether its last line is written.
        self.log_id = connection_log.new_id()
        self.data_seen = False
        self.end_logged = False
        self.connected_at = int(time.time() * 1000)
        self.link: ConnectionLink | None = None  # how records name it, once asked (warren.session.records)
        self.owner: ExclusiveOwner | None = None  # how its exclusive queues name it
        self.holds = 0  # waits of its channels for the cluster (the log, a queue of another node)
        self.deleting = 0  # its exclusive queues being deleted (through the cluster's log)
        self.close_ok_due = False
        # Traffic counters (warren.mgmt.stats): bytes and reads in, bytes and writes out.
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0

    # ------------------------------------------------------------------ input
    def data_received(self, data) -> None:
        if self.state == CLOSED:
            return
        if type(data) is not bytes:
            data = bytes(data)  # frames are sliced out of immutable reads (uvloop gives bytes)
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if data:
            self.pending.append(data)
            self.pending_len += len(data)
        self._process_input()

    def _process_input(self) -> None:
        """Handle the complete frames of the pending input, then write the replies. Processing
        stops early once this tick's output passes the high-water mark (a client pipelining
        basic.gets of big messages must not make one tick's output unbounded): the rest of
        the input waits, and the socket is not read, until the output has been written
        (`_continue_input`)."""
        # We flush at the end anyway: don't let output made meanwhile schedule another flush.
        self.flush_scheduled = True
        pressed = self.broker.queue_flow.pressed
        if pressed:
            pressed.clear()  # (pressed by an HTTP publish or a timer: nobody's read)
        try:
            if self.state != AWAIT_HEADER or self._read_protocol_header():
                self._read_input()
        except AMQPError as err:
            self.connection_error(err, *(err.method_ids or (0, 0)))
        except DecodeError as err:
            self.connection_error(syntax_error(str(err)))
        except HoldInput:
            pass  # (the frames after it wait for release_for_metadata)
        held = self.out_bytes > OUTPUT_HIGH_WATER and self.pending_len > 0 and self.state != CLOSED
        self.flush()
        if self.store_over:
            self._check_flow()
        if pressed:
            self._hold_for_queues(pressed)
        if held:
            self.throttle.add(Reason.INPUT_HELD)
            if Reason.WRITE_BUFFER not in self.throttle.reasons:
                self.transport.schedule_flush(self._continue_input)
        else:
            self.throttle.discard(Reason.INPUT_HELD)

    def _continue_input(self) -> None:
        if Reason.INPUT_HELD in self.throttle.reasons and Reason.WRITE_BUFFER not in self.throttle.reasons:
            if self.state == CLOSED:
                self.throttle.discard(Reason.INPUT_HELD)
            else:
                self._process_input()

    def _read_protocol_header(self) -> bool:
        if not self.data_seen and self.pending_len:
            connection_log.accepting(self)
        if self.pending_len < 8:
            head = self._peek(self.pending_len)
            if not (PROTOCOL_HEADER.startswith(head) or _LEGACY_0_9_HEADER.startswith(head)):
                self._refuse_protocol()
            return False
        if self._peek(8) not in (PROTOCOL_HEADER, _LEGACY_0_9_HEADER):
            self._refuse_protocol()
            return False
        self._advance(8)
        self.state = AWAIT_START_OK
        self.send_method(0, spec.ConnectionStart(
            version_major=0, version_minor=9,
            server_properties=server_properties(self.broker.cluster_name),
            mechanisms=" ".join(self._mechanisms()).encode(), locales=b"en_US"))
        return True

    def _mechanisms(self) -> list[str]:
        return auth_mechanisms.offered(self.broker.config.auth_mechanisms, self.tls is not None)

    def _refuse_protocol(self) -> None:
        # As the spec says: answer with the protocol header we do speak, then close.
        connection_log.ended(self, connection_log.bad_header(self._peek(min(8, self.pending_len))))
        self.state = CLOSED
        self.transport.write(PROTOCOL_HEADER)
        self.transport.close()

    # The pending reads: the frames that lie whole in one read are handled right where they
    # are; a frame split over reads is joined (small ones) or, a big body frame, copied
    # piece by piece into its message body as its bytes arrive.
    def _advance(self, n: int) -> None:
        """Drop the first n pending octets."""
        pending = self.pending
        self.pending_len -= n
        pos = self.head_pos + n
        while pending and pos >= len(pending[0]):
            pos -= len(pending.popleft())
        self.head_pos = pos

    def _peek(self, n: int) -> bytes:
        """The first n pending octets (n <= pending_len)."""
        chunk = self.pending[0] if self.pending else b""
        pos = self.head_pos
        if len(chunk) - pos >= n:
            return chunk[pos:pos + n]
        parts = []
        for chunk in self.pending:
            parts.append(memoryview(chunk)[pos:pos + n])
            n -= len(chunk) - pos
            pos = 0
            if n <= 0:
                break
        return b"".join(parts)

    def _read_input(self) -> None:
        pending = self.pending
        while self.pending_len:
            if (self.state == CLOSED or self.out_bytes > OUTPUT_HIGH_WATER or self.blocked
                    or Reason.METADATA in self.throttle.reasons):  # (a channel's change waits for the log)
                return
            if self.sink_parts is not None:
                if not self._fill_sink():
                    return
                continue
            buf = pending[0]
            pos = self.head_pos
            avail = len(buf) - pos
            if avail >= 7 and avail >= 8 + _unpack_head(buf, pos)[2]:
                # The hot path: whole frames, handled in place in this read.
                try:
                    self._read_frames(buf, pos)
                finally:
                    self._advance(self.read_pos - pos)
                continue
            # The next frame is not whole in this read.
            if self.pending_len < 7:
                return
            ftype, ch, size = _unpack_head(buf if avail >= 7 else self._peek(7), pos if avail >= 7 else 0)
            if size > self.frame_max:
                raise frame_errors.frame_too_large(ftype, size, self.frame_max)
            if ftype == FRAME_BODY and size >= _STREAM_MIN and self.state == OPEN:
                channel = self.channels.get(ch)
                if channel is not None and channel.accepts_body(size):
                    self._advance(7)
                    self.sink_channel = channel
                    self.sink_parts = []
                    self.sink_left = self.sink_size = size
                    continue
            if self.pending_len < size + 8:
                return
            frame = self._peek(size + 8)  # a small frame split over reads: joined
            try:
                self._read_frames(frame, 0)
            finally:
                self._advance(self.read_pos)

    def _fill_sink(self) -> bool:
        """Take pending octets into the body frame being collected; True once it is whole
        (and handed to its channel), False when it waits for more."""
        pending = self.pending
        parts = self.sink_parts
        assert parts is not None
        while self.sink_left and pending:
            chunk = pending[0]
            pos = self.head_pos
            n = min(self.sink_left, len(chunk) - pos)
            parts.append(memoryview(chunk)[pos:pos + n])
            self.sink_left -= n
            self._advance(n)
        if self.sink_left or not pending:
            return False
        end = pending[0][self.head_pos]
        self._advance(1)
        channel, size = self.sink_channel, self.sink_size
        self.sink_channel = self.sink_parts = None
        if end != FRAME_END:
            raise frame_errors.bad_frame_end(FRAME_BODY, bytes(parts[0][:16]), end)
        assert channel is not None
        channel.body_received(parts, size)
        if self.alarmed:
            self._block()  # _read_input stops before the next frame
        return True

    def _read_frames(self, buf: bytes, pos: int) -> None:
        """Handle the whole frames of `buf` from `pos` on; read_pos tells where it stopped."""
        n = len(buf)
        channels = self.channels
        try:
            while n - pos >= 7:
                ftype, ch, size = _unpack_head(buf, pos)
                if size > self.frame_max:  # RabbitMQ lets a payload reach frame_max (its "fudge")
                    raise frame_errors.frame_too_large(ftype, size, self.frame_max)
                start = pos + 7
                end = start + size
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise frame_errors.bad_frame_end(ftype, buf[start:end], buf[end])
                pos = end + 1
                channel = channels.get(ch)
                if channel is not None and self.state == OPEN:
                    # Hot path: frames for an open channel.
                    if ftype == FRAME_METHOD:
                        channel.method_frame(buf[start:end])
                    elif ftype == FRAME_BODY:
                        channel.body_frame(buf, start, end)
                        if self.alarmed:
                            self._block()
                            return
                    elif ftype == FRAME_HEADER:
                        channel.header_frame(buf[start:end])
                        if self.alarmed:
                            # As RabbitMQ's reader: content arrived during an alarm, so stop
                            # here. The body (and everything after it) waits unread; an empty
                            # body has already completed its message, as in RabbitMQ.
                            self._block()
                            return
                    elif ftype == FRAME_HEARTBEAT and not size:
                        raise frame_errors.unexpected_frame(ftype, b"")  # on a channel
                    else:
                        raise frame_errors.unknown_frame(ftype, buf[start:end])
                else:
                    self._other_frame(ftype, ch, buf[start:end])
                if self.state == CLOSED or self.out_bytes > OUTPUT_HIGH_WATER:
                    return
        finally:
            self.read_pos = pos

    def _other_frame(self, ftype, ch, payload) -> None:
        # RabbitMQ's order: the frame's shape (501 unknown_frame), then where it arrived.
        if (ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT)
                or (ftype == FRAME_HEARTBEAT and payload)
                or (ftype == FRAME_METHOD and len(payload) < 4)
                or (ftype == FRAME_HEADER and len(payload) < 12)):
            if self.state == CLOSING:
                return
            raise frame_errors.unknown_frame(ftype, payload)
        if ftype == FRAME_HEARTBEAT:
            if ch != 0 and self.state != CLOSING:
                raise frame_errors.unexpected_frame(ftype, payload)
            return
        if self.state == CLOSING:
            # After sending connection.close only close/close-ok matter.
            if ch == 0 and ftype == FRAME_METHOD:
                method_id = _I.unpack_from(payload, 0)[0]
                if method_id == _CONNECTION_CLOSE_OK:
                    self._closed()
                elif method_id == _CONNECTION_CLOSE:
                    self.send_method(0, spec.ConnectionCloseOk())
                    self._closed()
            return
        if ch == 0:
            if ftype != FRAME_METHOD:
                raise frame_errors.unexpected_frame(ftype, payload)
            method = self.decode(payload)
            if method is not None:
                self._connection_method(method)
            return
        if self.state != OPEN:
            raise frame_errors.unexpected_frame(ftype, payload)
        # A frame on a channel that is not open: only channel.open may create it.
        if self.channel_max and len(self.channels) >= self.channel_max:
            raise not_allowed(f"number of channels opened ({len(self.channels)}) has reached the "
                              f"negotiated channel_max ({self.channel_max})")
        if ftype != FRAME_METHOD:
            raise unexpected_frame("expected method frame, got non method frame instead")
        method = self.decode(payload)
        if method is None:
            return
        if not isinstance(method, spec.ChannelOpen):
            raise channel_error("expected 'channel.open'", (method.CLASS_ID, method.METHOD_ID))
        links, user = self.broker.node_links, self.user
        if links is not None and channel_limited(self.broker, user) and user is not None and links.usage_elsewhere(
                None, user.name, lambda elsewhere: self._counted(lambda: self._open_channel(ch, elsewhere))):
            # The user's channels on the other members count too: nothing more is read
            # until they have answered (the frames after it keep their order).
            self.hold_for_metadata()
            raise HoldInput
        self._open_channel(ch)

    def _open_channel(self, ch: int, elsewhere: Usage = NO_USAGE) -> None:
        check_channel(self.broker, self.user, elsewhere)  # the user's max-channels over all its connections
        # Any channel number is accepted, as RabbitMQ 3.10 accepts it (clients rely on that):
        # channel_max bounds how many are open, which is what protects memory.
        channel = Channel(self, ch)
        self.channels[ch] = channel
        self.broker.stats.node_counters["channels_opened"] += 1
        self.send_method(ch, spec.ChannelOpenOk(channel_id=b""))

    def decode(self, payload):
        """Decode a method payload; on failure, react as RabbitMQ does (and return None)."""
        try:
            return spec.decode_method(payload)
        except DecodeError as err:
            self.decode_failed(payload, err)
            return None

    def decode_failed(self, payload, err: DecodeError) -> None:
        """Arguments that do not parse: 501 "cannot decode", as RabbitMQ. An unknown method
        id or a field table that does not parse crash RabbitMQ 3.10's reader, so its client
        just sees the socket close; Warren closes with a code that says what was wrong."""
        class_id, method_id = _HH.unpack_from(payload, 0)
        if isinstance(err, spec.UnknownMethod):
            raise frame_errors.unknown_method(class_id, method_id) from None
        if isinstance(err, spec.BadTable):
            raise frame_errors.malformed_table(err.method_name, err.reason, class_id, method_id) from None
        if isinstance(err, MalformedUTF8):
            raise frame_errors.malformed_utf8() from None
        raise frame_errors.cannot_decode(payload, class_id, method_id) from None

    # ------------------------------------------------------- connection class
    def _connection_method(self, method) -> None:
        state = self.state
        if isinstance(method, spec.ConnectionStartOk) and state == AWAIT_START_OK:
            self._start_ok(method)
        elif isinstance(method, spec.ConnectionTuneOk) and state == AWAIT_TUNE_OK:
            self._tune_ok(method)
        elif isinstance(method, spec.ConnectionOpen) and state == AWAIT_OPEN:
            self._open(method)
        elif isinstance(method, spec.ConnectionClose) and state == OPEN:
            # As RabbitMQ: close-ok once the channels are shut down (CLOSE_OK_DELAY), then
            # read and discard until the client closes (bounded), so frames it queued before
            # its close (amqplib's multiplexed channels) do not meet a reset socket.
            had_channels = bool(self.channels)
            self._release()
            self.state = CLOSED
            self.flush()  # what the frames before the close asked for goes out first
            self.transport.close_later(CLOSING_TIMEOUT)
            scheduler = self.broker.scheduler
            if self.deleting:
                self.close_ok_due = True  # (sent once its exclusive queues are gone)
            elif had_channels and scheduler is not None:
                self.close_ok_timer = scheduler.call_later(CLOSE_OK_DELAY, self._send_close_ok)
            else:
                self._send_close_ok()
        elif isinstance(method, spec.ConnectionUpdateSecret) and state == OPEN:
            # Internal users carry no expiring secret: accept, as RabbitMQ's internal backend does.
            self.send_method(0, spec.ConnectionUpdateSecretOk())
        else:
            # Anything else on channel 0, including a close before the connection is open.
            raise channel_error(f"unexpected method in connection state {_STATE_NAMES[state]}",
                                (method.CLASS_ID, method.METHOD_ID))

    def _start_ok(self, method) -> None:
        self.client_properties = method.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism
        if mechanism not in self._mechanisms():
            raise command_invalid(f"{'invalid' if auth_mechanisms.known(mechanism) else 'unknown'} "
                                  f"authentication mechanism '{mechanism}'")
        refused: str | None = None  # why, in RabbitMQ's log words (EXTERNAL)
        if mechanism == "EXTERNAL":
            name, refused = self._external_user()
            # rabbitmq_auth_mechanism_ssl: the user must exist; no password is checked.
            user = self.broker.users.get(name) if refused is None else None
            if user is None and refused is None:
                refused = f"user '{name}' - invalid credentials"
        else:
            creds = credentials(mechanism, method.response)
            if creds is None:
                # RabbitMQ: a protocol error in the handshake, not a refused login.
                raise syntax_error(f"{mechanism} response {bytes(method.response)!r} invalid")
            name = creds[0]
            user = self.broker.authenticate(*creds)
        if user is not None and user.name in self.broker.config.loopback_users and not _is_loopback(self.peer[0]):
            refused = f"user '{user.name}' can only connect via localhost"
            user = None
        self.broker.stats.node_counters["auth_attempts_failed" if user is None else "auth_attempts_succeeded"] += 1
        if user is None:
            connection_log.login_refused(self, mechanism, refused or f"user '{name}' - invalid credentials")
            # Clients that do not announce the capability just see the socket close (AMQP 0-9-1).
            raise AMQPError(403, f"Login was refused using authentication mechanism {mechanism}. "
                                 "For details see the broker logfile.",
                            handshake_reply=bool(self.capabilities.get("authentication_failure_close")))
        self.user = user
        self.auth_mechanism = mechanism
        limits = self.broker.config.limits
        self.state = AWAIT_TUNE_OK
        self.send_method(0, spec.ConnectionTune(channel_max=limits.channel_max, frame_max=limits.frame_max,
                                                heartbeat=limits.heartbeat))

    def _external_user(self) -> tuple[str, str | None]:
        """(user name from the client's certificate, None), or (name or "", why it has none)
        in rabbitmq_auth_mechanism_ssl's words."""
        tls = self.tls
        if tls is None:  # (not offered then)
            return "", "not a TLS-enabled connection"
        if tls.peer_cert is None:
            return "", "connection peer presented no TLS (x.509) certificate"
        try:
            name = x509.login_name(tls.peer_cert, self.broker.config.ssl_cert_login_from)
        except x509.CertificateError:
            name = None
        return ("", "no name found") if name is None else (name, None)

    def _tune_ok(self, method) -> None:
        limits = self.broker.config.limits
        for field, minimum, server_value in (("frame_max", FRAME_MIN_SIZE, limits.frame_max),
                                             ("channel_max", 1, limits.channel_max)):
            value = getattr(method, field)
            detail = " (no limit)" if field == "channel_max" and value == 0 else ""
            if value != 0 and value < minimum:
                err = not_allowed(f"negotiated {field} = {value} is lower than the minimum allowed value ({minimum})")
            elif server_value != 0 and (value == 0 or value > server_value):
                err = not_allowed(f"negotiated {field} = {value}{detail} is higher than the maximum "
                                  f"allowed value ({server_value})")
            else:
                continue
            # RabbitMQ (3.11 on; 3.10 closes silently) answers this one with connection.close.
            raise AMQPError(err.code, err.text, (10, 30), handshake_reply=True)
        self.frame_max = method.frame_max or 0xFFFFFFFF  # 0: no limit
        self.channel_max = method.channel_max
        self.heartbeat = method.heartbeat
        self.state = AWAIT_OPEN
        self.transport.heartbeat_negotiated(self.heartbeat)

    def _open(self, method) -> None:
        name = method.virtual_host
        user = self.user
        assert user is not None, "connection.open is accepted only after start-ok logged in"
        links = self.broker.node_links
        if links is not None and connection_limited(self.broker, name, user) and links.usage_elsewhere(
                name, user.name, lambda elsewhere: self._counted(lambda: self._open_vhost(name, user, elsewhere))):
            self.hold_for_metadata()  # (the other members' connections count too: see _counted)
            raise HoldInput
        self._open_vhost(name, user)

    def _counted(self, then: Callable[[], None]) -> None:
        """The other members answered (or the time to wait for them ran out): go on with the
        connection.open or channel.open that waited for their counts, then with the input
        that waited behind it."""
        try:
            if self.state in (AWAIT_OPEN, OPEN):
                then()
        except AMQPError as err:
            self.connection_error(err, *(err.method_ids or (0, 0)))
        finally:
            self.release_for_metadata()

    def _open_vhost(self, name: str, user: User, elsewhere: Usage = NO_USAGE) -> None:
        check_connection(self.broker, name, user, elsewhere)  # vhost and user max-connections, before access (RabbitMQ)
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            err = not_allowed(f"vhost {name} not found")
        elif (user.name, name) not in self.broker.permissions:
            err = not_allowed(f"access to vhost '{name}' refused for user '{user.name}'")
        else:
            err = None
        if err is not None:
            raise AMQPError(err.code, err.text, (10, 40))
        self.vhost = vhost
        self.state = OPEN
        connection_log.granted(self)
        self.transport.handshake_done()
        self.broker.connections.add(self)
        self.broker.stats.node_counters["connections_opened"] += 1
        alarms = self.broker.alarms
        alarms.subscribe(self._alarms_changed)
        self.alarmed = alarms.blocking
        persister = self.broker.persister
        if persister is not None:
            persister.subscribe_flow(self._store_flow_changed)
            self.store_over = persister.over
        self.send_method(0, spec.ConnectionOpenOk(known_hosts=""))

    # ------------------------------------------------------- the cluster's log
    def hold_for_metadata(self) -> None:
        self.holds += 1
        self.throttle.add(Reason.METADATA)

    def release_for_metadata(self) -> None:
        self.holds -= 1
        if self.holds > 0:
            return  # (a wait that began in another's answer: the later release reads on)
        self.throttle.discard(Reason.METADATA)
        if self.state == CLOSED:
            return
        if self.pending_len:
            self.throttle.add(Reason.INPUT_HELD)
            self._continue_input()  # (flushes the reply with what follows)
        else:
            self.flush()

    # ------------------------------------------------------- resource alarms
    def _alarms_changed(self) -> None:
        """The broker's alarms changed (called by Alarms.set, for open connections)."""
        self.alarmed = self.broker.alarms.blocking
        # A second alarm, or one of two clearing, changes nothing for a blocked connection
        # (no second connection.blocked); the last one clearing lets it go, from the loop.
        if self.blocked and not self.alarmed:
            self.transport.schedule_flush(self._unblock)

    def _block(self) -> None:
        """Content arrived during an alarm: read nothing more (the frames already received
        wait where they are) and tell a client that announced the capability why."""
        if self.blocked or self.state != OPEN:
            return
        self.blocked = True
        self.last_blocked_by = "resource"
        self.last_blocked_at = None  # blocked now (see blocked_age)
        self.throttle.add(Reason.BLOCKED)  # also suspends heartbeat monitoring (not read)
        if self.capabilities.get("connection.blocked") is True:
            self.blocked_sent = True
            self.send_method(0, spec.ConnectionBlocked(reason=self.broker.alarms.reason()))

    def _unblock(self) -> None:
        """Every alarm has cleared: connection.unblocked, then the held input, in order."""
        if not self.blocked or self.alarmed or self.state != OPEN:
            return
        self.blocked = False
        self.last_blocked_at = time.monotonic()
        if self.blocked_sent:
            self.blocked_sent = False
            self.send_method(0, spec.ConnectionUnblocked())
        if self.pending_len:
            # Handled as input held back for output is: now, or once the write buffer drains.
            self.throttle.add(Reason.INPUT_HELD)
            self.throttle.discard(Reason.BLOCKED)
            self._continue_input()
        else:
            self.throttle.discard(Reason.BLOCKED)
        self.schedule_flush()

    # ------------------------------------------------------------ credit flow
    def _store_flow_changed(self, over: bool) -> None:
        """The message store passed its high-water mark, or drained below its low one."""
        self.store_over = over
        if not over and self.in_flow:
            self.in_flow = False
            self.last_blocked_at = time.monotonic()
            self.throttle.discard(Reason.FLOW)

    def _check_flow(self) -> None:
        """The store is behind: if this read's publishes were written into it, read no
        more (the frames of this read are all handled) until it has drained."""
        persister = self.broker.persister
        if self.in_flow or persister is None or not persister.written or self.state != OPEN:
            return
        self.in_flow = True
        self.last_blocked_by = "flow"
        self.last_blocked_at = None  # in flow now (see blocked_age)
        self.throttle.add(Reason.FLOW)

    def _hold_for_queues(self, pressed: set) -> None:
        """Queues this read published into pressed (warren.broker.queue_flow): read no more
        until those that hold this connection let it go."""
        queues = list(pressed)
        pressed.clear()
        if self.state != OPEN:
            return
        for queue in queues:
            if queue.hold_publisher(self):
                self.flow_credits.add(queue.credit)
        if self.flow_credits and Reason.QUEUE_FLOW not in self.throttle.reasons:
            self.last_blocked_by = "flow"
            self.last_blocked_at = None  # in flow now (see blocked_age)
            self.throttle.add(Reason.QUEUE_FLOW)

    def queue_released(self, credit: QueueCredit) -> None:
        """A HeldPublisher: a queue lets this connection go."""
        self.flow_credits.discard(credit)
        if not self.flow_credits and Reason.QUEUE_FLOW in self.throttle.reasons:
            self.last_blocked_at = time.monotonic()
            self.throttle.discard(Reason.QUEUE_FLOW)

    @property
    def throttle_state(self) -> str:
        """RabbitMQ's connection state for rabbitmqctl and the API: running, flow (read no
        faster than the store accepts, now or in the last FLOW_SHOWN_FOR seconds, as
        rabbit_reader shows it), blocking (an alarm is on, nothing published since),
        blocked (publishing held by an alarm)."""
        if self.blocked:
            return "blocked"
        if self.alarmed:
            return "blocking"
        if self.in_flow or self.flow_credits:
            return "flow"
        if self.last_blocked_by == "flow":
            at = self.last_blocked_at
            if at is not None and time.monotonic() - at < FLOW_SHOWN_FOR:
                return "flow"
        return "running"

    def blocked_age(self) -> float | None:
        """Seconds since the connection was last blocked (0 while it is); None if never."""
        if self.blocked or self.in_flow or self.flow_credits:
            return 0.0
        at = self.last_blocked_at
        return None if at is None else time.monotonic() - at

    # ------------------------------------- the broker's handle (warren.broker.records)
    def connection_link(self) -> ConnectionLink:
        return records.connection_link(self)

    def exclusive_owner(self) -> ExclusiveOwner:
        """How its exclusive queues name it (made once, when its first channel opens)."""
        if self.owner is None:
            self.owner = ExclusiveOwner.new(self.broker.config.node_name, self.connection_link())
        return self.owner

    def info(self) -> ConnectionInfo:
        return records.connection_info(self)

    def counters(self) -> ConnectionCounters:
        return records.connection_counters(self)

    def force_close(self, reason: str) -> None:
        self.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")

    # ----------------------------------------------------------------- output
    def send_method(self, channel: int, method) -> None:
        self.out.append(method_frame(channel, method))
        self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.transport.schedule_flush(self.flush)

    def flush(self) -> None:
        """Write everything gathered since the last flush in one call."""
        # Definitions, message records and delivery marks reach the files before any reply leaves.
        self.broker.durability.flush()
        self.flush_scheduled = False
        if self.confirming:
            for channel in self.confirming:
                channel.emit_confirms()
            self.confirming.clear()
        out = self.out
        if self.gates.held:
            self._flush_gated(out)
        elif out:
            self._write(out)
            out.clear()
            self.out_bytes = 0
        if self.state == OPEN and self.out_bytes <= OUTPUT_HIGH_WATER:  # (held deliveries still count)
            self.throttle.discard(Reason.TICK_OUTPUT)

    def _write(self, out: list) -> None:
        if self.out_bytes < _JOIN_LIMIT:  # (out_bytes: about what `out` holds)
            data = b"".join(out)
            self.send_oct += len(data)
            self.transport.write(data)
        else:
            # Message bodies go to the transport as they are, not copied into one buffer:
            # a body delivered or fetched many times is held once, by reference.
            chunks = _coalesce(out)
            self.send_oct += sum(map(len, chunks))
            self.transport.writelines(chunks)
        self.send_cnt += 1

    def _flush_gated(self, out: list) -> None:
        """Write what no replicated queue's delivery holds back (warren.session.gated_output)."""
        ready = self.gates.releasable(out, self.state != OPEN, self)
        if ready:
            self._write(out[:ready])
            del out[:ready]
            self.gates.written(ready)
        self.out_bytes = sum(map(len, out))

    def hold_delivery(self, start: int, point: Settlement, dropped: Callable[[], None] | None = None) -> None:
        """out[start:] is a delivery of a replicated queue: it leaves once `point` is committed."""
        self.gates.hold(self.out, start, point, dropped)

    def store_synced(self) -> None:
        """(A SyncWaiter: a point a held delivery waits for may be committed.)"""
        self.schedule_flush()

    def note_output(self, size: int) -> None:
        """Called for each delivery: pause this connection's consumers past the high-water mark."""
        self.out_bytes += size
        if self.out_bytes > OUTPUT_HIGH_WATER:
            self.throttle.add(Reason.TICK_OUTPUT)
        self.schedule_flush()

    def _resume_delivering(self) -> None:
        for channel in list(self.channels.values()):
            channel.kick_queues()

    def pause_writing(self) -> None:
        """The transport's buffer is full (asyncio's flow control)."""
        self.throttle.add(Reason.WRITE_BUFFER)

    def resume_writing(self) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        self.throttle.discard(Reason.WRITE_BUFFER)
        if self.state == OPEN:
            self.flush()
        self._continue_input()

    def send_heartbeat(self) -> None:
        if self.state == CLOSED:
            return
        if self.gates.held:  # (not held behind deliveries: a heartbeat goes between any two frames)
            self.transport.write(HEARTBEAT)
            return
        self.out.append(HEARTBEAT)
        self.flush()

    # ---------------------------------------------------------------- closing
    def connection_error(self, err: AMQPError, class_id: int = 0, method_id: int = 0, channel: int = 0) -> None:
        """Close the connection for `err`, logged as RabbitMQ's reader logs it in each state."""
        state = self.state
        if state in (CLOSING, CLOSED):
            return
        reason = connection_log.amqp_error_term(err.code, err.text, class_id, method_id)
        if state in (AWAIT_START_OK, AWAIT_TUNE_OK) and not err.handshake_reply:
            # Before tune-ok RabbitMQ answers (almost) nothing: it waits, then drops the socket.
            # (A refused login is logged where it is refused, and ends as a clean close.)
            if not (state == AWAIT_START_OK and err.code == ACCESS_REFUSED):
                connection_log.ended(self, f"{{handshake_error,{_STATE_NAMES[state]},{channel},{reason}}}")
            self._release()
            self.state = CLOSED
            self.transport.close_later(SILENT_CLOSE_DELAY)
            return
        if state == AWAIT_TUNE_OK:
            connection_log.ended(self, f"failed to negotiate connection parameters: {err.text}")
        elif state == AWAIT_OPEN and err.code == NOT_ALLOWED:
            connection_log.handshake_refused(self, "opening", err.text)
        elif state == AWAIT_OPEN:
            connection_log.hard_error(self, "opening", channel, f"{{handshake_error,opening,{reason}}}")
        elif state == OPEN:
            connection_log.hard_error(self, self._log_state(), channel, connection_log.connection_exception(
                err.code, err.text, class_id, method_id))
        self._send_close(err.code, err.reply_text, class_id, method_id)

    def _log_state(self) -> str:
        return "blocked" if self.blocked else "running"

    def abort(self) -> None:
        """Drop the connection without a word, as RabbitMQ does when its reader crashes."""
        self._release()
        self.state = CLOSED
        self.transport.close()

    def close(self, code: int = CONNECTION_FORCED, text: str = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
              class_id: int = 0, method_id: int = 0) -> None:
        """Start a server-initiated close: send connection.close and wait for close-ok."""
        if self.state == OPEN:
            # As RabbitMQ logs a connection it is told to close (shutdown, the API's close).
            name = REPLY_NAMES.get(code, "")
            connection_log.hard_error(self, self._log_state(), 0, connection_log.connection_exception(
                code, text[len(name) + 3:] if text.startswith(f"{name} - ") else text, class_id, method_id))
        self._send_close(code, text, class_id, method_id)

    def _send_close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        if self.state == AWAIT_HEADER:
            self._closed()
            return
        self._release()
        self.state = CLOSING
        self.send_method(0, spec.ConnectionClose(reply_code=code, reply_text=text[:255],
                                                 class_id=class_id, method_id=method_id))
        self.flush()
        self.transport.close_later(3.0)

    def _closed(self) -> None:
        self._release()
        self.state = CLOSED
        self.flush()
        self.transport.close()

    def _exclusive_queue_gone(self) -> None:
        self.deleting -= 1
        if not self.deleting and self.close_ok_due:
            self.close_ok_due = False
            self._send_close_ok()

    def _send_close_ok(self) -> None:
        """The answer to the client's connection.close, the last frame of the connection."""
        self.close_ok_timer = None
        self.out.append(method_frame(0, spec.ConnectionCloseOk()))
        self.flush()

    def connection_lost(self) -> None:
        # Once either side has sent connection.close, the socket's end is no surprise (RabbitMQ's
        # reader counts itself closed once it has sent its close).
        connection_log.ended(self, clean=self.state in (CLOSING, CLOSED))
        if self.close_ok_timer is not None:  # the client did not wait for its close-ok
            self.close_ok_timer.cancel()
            self.close_ok_timer = None
        self._release()
        self.state = CLOSED
        # What the release wrote (requeued held records, dead letters) is written out now:
        # no read of this connection will end with a flush any more.
        self.broker.durability.flush()

    def detach(self) -> None:
        """The transport's last call: the socket is gone and the connection released. Keep no
        reference back to the transport (the server's protocol, which holds this connection),
        nor from the throttle to this connection, so a closed connection is freed by
        reference counting as soon as the protocol is, not by a full run of the cyclic GC,
        which the broker's thresholds make rare (warren.server.memory): clients connecting
        per request left every closed connection to it, and RSS grew by hundreds of MB."""
        closed = ClosedTransport(self.transport)
        self.transport = closed
        self.throttle.detach(closed)

    def _release(self) -> None:
        """Give back everything the connection holds: unacked messages, consumers, exclusive queues."""
        for channel in list(self.channels.values()):
            channel.release()
        self.channels.clear()
        # Its exclusive queues go (on a cluster through the log: close-ok waits for them, so a
        # client that reconnects elsewhere finds them gone, as on RabbitMQ).
        going = [queue for queue in self.exclusive_queues if not queue.deleted]
        self.exclusive_queues.clear()
        self.deleting += len(going)
        for queue in going:
            self.broker.metadata.submit(DeleteQueue(queue.vhost.name, queue.name), self._exclusive_queue_gone)
        broker = self.broker
        if self in broker.connections:  # it was open: the node's totals keep its traffic
            broker.connections.discard(self)
            broker.stats.node_counters["connections_closed"] += 1
            broker.stats.retired.connection_closed(self)
        self.broker.alarms.unsubscribe(self._alarms_changed)
        persister = self.broker.persister
        if persister is not None:
            persister.unsubscribe_flow(self._store_flow_changed)
        if self.in_flow:  # closing: read the close-ok
            self.in_flow = False
            self.throttle.discard(Reason.FLOW)
        for credit in self.flow_credits:
            credit.forget(self)
        if self.flow_credits:
            self.flow_credits.clear()
            self.throttle.discard(Reason.QUEUE_FLOW)
        if self.blocked:
            # Closing: read again, so the client's close-ok (and its own close) arrive.
            self.blocked = False
            self.throttle.discard(Reason.BLOCKED)

    def channel_closed(self, channel: Channel) -> None:
        if self.channels.get(channel.id) is channel:
            del self.channels[channel.id]
        self.confirming.discard(channel)


def _coalesce(out: list) -> list:
    """Join runs of small pieces; big ones (message bodies) stay the objects they are."""
    chunks: list = []
    small: list = []
    for piece in out:
        if len(piece) < _BIG_PIECE:
            small.append(piece)
        else:
            if small:
                chunks.append(b"".join(small))
                small = []
            chunks.append(piece)
    if small:
        chunks.append(b"".join(small))
    return chunks


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")

