"""What the broker's connections and channels tell the layers that report on them: records.

The management API, its metrics and warrenctl show connections and channels; they read them
only through these records (snapshots: plain values, made when asked, never on the message
path) and act on them only through the handles' methods, so a connection may as well be
another process's or node's. The session's Connection and Channel implement the handles
(warren.session.records builds their records); the broker keeps its open connections as
ConnectionHandles (Broker.connections).

The records hold facts in the model's terms (counts, names, seconds); what RabbitMQ's JSON or
metrics make of them (field names, "infinity", rounding) is the reporting layer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .links import ConnectionLink
from .stats import CONNECTION_COUNTERS

if TYPE_CHECKING:
    from .auth import User
    from .consumer import Consumer


# -------------------------------------------------------------------------- links
class ChannelLink(NamedTuple):
    """How a consumer names its channel."""

    name: str          # "<connection name> (<number>)"
    number: int
    user: str
    connection: ConnectionLink


# ------------------------------------------------------------------------ counters
class ConnectionCounters(NamedTuple):
    """A connection's traffic so far, in CONNECTION_COUNTERS' order."""

    recv_oct: int  # bytes received
    recv_cnt: int  # reads
    send_oct: int  # bytes sent
    send_cnt: int  # writes


assert ConnectionCounters._fields == CONNECTION_COUNTERS


class ChannelCounters(NamedTuple):
    """A channel's message counters now (the management's sampler reads every channel's
    every few seconds: this is the cheap read)."""

    counts: tuple[int, ...]  # the CHANNEL_COUNTERS (warren.broker.stats), in their order
    closing: bool            # closing: the counts are in the broker's message_totals already


# ------------------------------------------------------------------------- records
class PeerCertificate(NamedTuple):
    """The client's certificate, its names as RabbitMQ formats them (warren.broker.x509)."""

    subject: str
    issuer: str
    validity: str  # "2026-01-01T00:00:00Z - 2027-01-01T00:00:00Z"


class TLSSession(NamedTuple):
    """A connection's TLS session, its suite named as Erlang names it (x509.cipher_suite)."""

    protocol: str              # as OpenSSL names it: "TLSv1.3"
    key_exchange: str          # "ecdhe_rsa"
    cipher: str                # "aes_256_gcm"
    hash: str | None           # "sha384"; None for an AEAD suite
    peer_certificate: PeerCertificate | None  # None: no certificate, or one x509 cannot read


class ConnectionInfo(NamedTuple):
    """An open connection as it is now."""

    name: str                  # ConnectionLink.name
    peer_host: str
    peer_port: int
    host: str                  # the address the client connected to
    port: int
    user: str
    vhost: str
    auth_mechanism: str        # "PLAIN", "AMQPLAIN", "EXTERNAL"
    client_properties: dict[str, Any]  # as the client sent them (shared: never to be changed)
    provided_name: str | None  # the client's connection_name property, if it gave one
    tls: TLSSession | None     # None: not over TLS
    connected_at: int          # ms since the epoch
    heartbeat: int             # seconds, as negotiated (0: none)
    frame_max: int
    channel_max: int
    # running, flow (reading no faster than the store or a queue accepts, now or lately),
    # blocking (an alarm is on), blocked (its publishing is held by an alarm).
    state: str
    last_blocked_by: str       # "none", "resource" (an alarm) or "flow"
    blocked_age: float | None  # seconds since it was last blocked (0 while it is); None: never
    channel_count: int
    counters: ConnectionCounters
    send_pend: int             # bytes gathered to send, not yet written


class ChannelInfo(NamedTuple):
    """A channel of an open connection as it is now."""

    name: str                  # ChannelLink.name
    number: int
    user: str
    connection: ConnectionLink
    vhost: str
    state: str                 # "running", or "closing" (released, its close-ok not yet received)
    prefetch: int              # basic.qos global=false: the limit of consumers created next
    global_prefetch: int       # basic.qos global=true: the limit shared by the channel
    confirm: bool              # in confirm mode
    transactional: bool        # in tx mode
    consumer_count: int
    unacked: int               # deliveries and fetches not yet acknowledged
    unconfirmed: int           # publishes in confirm mode not yet confirmed
    uncommitted: int           # messages published in the open transaction
    acks_uncommitted: int      # acknowledgements in the open transaction
    counters: dict[str, int]   # warren.broker.stats.CHANNEL_COUNTERS (a copy)
    received_confirm: int      # publishes in confirm mode (RECEIVED_CONFIRM)


class Usage(NamedTuple):
    """What the limits count of one node's open connections: a vhost's, a user's and that
    user's channels (warren.broker.limits; a cluster member sums every member's)."""

    vhost_connections: int = 0
    user_connections: int = 0
    user_channels: int = 0

    def plus(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(self, other)))


# ------------------------------------------------------------------------- handles
class VHostView(Protocol):
    """A connection's vhost as its handle shows it (warren.broker.vhost.VHost, above the
    records: the limits compare it by identity, as the same vhost object)."""

    @property
    def name(self) -> str: ...


class ChannelHandle(Protocol):
    """A channel as its connection's handle lists it."""

    @property
    def consumers(self) -> Mapping[str, Consumer]:
        """Its consumers by tag (the model's, warren.broker.consumer)."""

    def channel_link(self) -> ChannelLink: ...

    def info(self) -> ChannelInfo: ...

    def counters(self) -> ChannelCounters: ...

    def unacked_bytes(self) -> dict[Any, int]:
        """Body bytes delivered or fetched on it and not yet acknowledged, per queue (the
        model's queue objects; empty when nothing is unacknowledged)."""


class ConnectionHandle(Protocol):
    """An open connection, as the broker's registry (Broker.connections) holds it."""

    # What the limits count (warren.broker.limits).
    @property
    def user(self) -> User | None: ...

    @property
    def vhost(self) -> VHostView | None: ...

    @property
    def channels(self) -> Mapping[int, ChannelHandle]:
        """Its channels by number."""

    def connection_link(self) -> ConnectionLink: ...

    def info(self) -> ConnectionInfo: ...

    def counters(self) -> ConnectionCounters: ...

    def force_close(self, reason: str) -> None:
        """Close it with 320 CONNECTION_FORCED and the reason ("CONNECTION_FORCED - reason"),
        as RabbitMQ closes a connection an administrator closes, or a deleted user's or vhost's."""
