"""The records a connection and a channel give of themselves (warren.broker.records), built
when the management API or the metrics ask: nothing here runs on the message path.

Connection and Channel call these from their handle methods (info(), counters(), ...)."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from ..broker import x509
from ..broker.records import (
    ChannelCounters, ChannelInfo, ChannelLink, ConnectionCounters, ConnectionInfo, ConnectionLink,
    PeerCertificate, TLSSession,
)
from ..broker.stats import CHANNEL_COUNTERS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..broker.auth import User
    from ..broker.credit import Credit
    from ..broker.ports import TLSInfo, Transport
    from ..broker.vhost import VHost
    from .transaction import Transaction


# What the records are made of. Connection and Channel import this module (their handles call
# it), so it names them by these Protocols.
class RecordedConnection(Protocol):
    """warren.session.connection.Connection, as its records read it."""

    link: ConnectionLink | None  # made by connection_link() when first asked, then kept
    peer: tuple[str, int]
    transport: Transport
    tls: TLSInfo | None
    user: User | None
    vhost: VHost | None
    client_properties: dict
    connected_at: int
    heartbeat: int
    frame_max: int
    channel_max: int
    last_blocked_by: str
    recv_oct: int
    recv_cnt: int
    send_oct: int
    send_cnt: int
    out_bytes: int

    @property
    def channels(self) -> Mapping[int, object]: ...

    @property
    def throttle_state(self) -> str: ...

    def blocked_age(self) -> float | None: ...


class RecordedChannel(Protocol):
    """warren.session.channel.Channel, as its records read it."""

    id: int
    user: str
    vhost: VHost
    stats: dict[str, int]
    prefetch: int
    credit: Credit  # its basic.qos global=true limit and unacked count
    confirm: bool
    publish_seq: int
    confirmed: int
    tx: Transaction | None
    unacked: dict  # delivery tag -> (QueuedMessage, queue, Consumer | None)

    @property
    def conn(self) -> RecordedConnection: ...

    @property
    def consumers(self) -> Mapping[str, object]: ...


# ---------------------------------------------------------------------- connections
def connection_link(conn: RecordedConnection) -> ConnectionLink:
    """Made once, when first asked for (its addresses never change), and kept: every channel
    record names its connection, and listings look connections up by name."""
    link = conn.link
    if link is None:
        peer, local = conn.peer, conn.transport.local
        link = conn.link = ConnectionLink(f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}", peer[0], peer[1])
    return link


def connection_counters(conn: RecordedConnection) -> ConnectionCounters:
    return ConnectionCounters(conn.recv_oct, conn.recv_cnt, conn.send_oct, conn.send_cnt)


def connection_info(conn: RecordedConnection) -> ConnectionInfo:
    user, vhost = conn.user, conn.vhost
    assert user is not None and vhost is not None  # only open connections are registered
    link = connection_link(conn)
    local = conn.transport.local
    provided = conn.client_properties.get("connection_name")
    tls = conn.tls
    # (Positional, in ConnectionInfo's order: a listing makes one per connection, and
    # keywords cost half as much again.)
    return ConnectionInfo(
        link.name,                                                                # name
        link.peer_host,                                                           # peer_host
        conn.peer[1],                                                             # peer_port
        local[0],                                                                 # host
        local[1],                                                                 # port
        user.name,                                                                # user
        vhost.name,                                                               # vhost
        getattr(conn, "auth_mechanism", None) or "PLAIN",                         # auth_mechanism
        conn.client_properties,                                                   # client_properties
        provided.decode(errors="replace") if isinstance(provided, bytes)          # provided_name
        else provided if isinstance(provided, str) else None,
        tls_session(tls) if tls is not None else None,                            # tls
        conn.connected_at,                                                        # connected_at
        conn.heartbeat,                                                           # heartbeat
        conn.frame_max,                                                           # frame_max
        conn.channel_max,                                                         # channel_max
        conn.throttle_state,                                                      # state
        conn.last_blocked_by,                                                     # last_blocked_by
        conn.blocked_age(),                                                       # blocked_age
        len(conn.channels),                                                       # channel_count
        ConnectionCounters(conn.recv_oct, conn.recv_cnt, conn.send_oct, conn.send_cnt),  # counters
        conn.out_bytes,                                                           # send_pend
    )


@lru_cache(maxsize=256)
def tls_session(tls: TLSInfo) -> TLSSession:
    """The session's record: its certificate parsed once for every connection that presents it
    (a TLSInfo is frozen, and clients of one service share a certificate)."""
    key_exchange, cipher, mac = x509.cipher_suite(tls.cipher)
    certificate = None
    if tls.peer_cert is not None:
        try:
            certificate = PeerCertificate(x509.subject(tls.peer_cert), x509.issuer(tls.peer_cert),
                                          x509.validity(tls.peer_cert))
        except x509.CertificateError:
            pass
    return TLSSession(tls.protocol, key_exchange, cipher, mac or None, certificate)


# ------------------------------------------------------------------------- channels
_channel_counts = operator.itemgetter(*CHANNEL_COUNTERS)


def channel_link(channel: RecordedChannel) -> ChannelLink:
    connection = connection_link(channel.conn)
    return ChannelLink(f"{connection.name} ({channel.id})", channel.id, channel.user, connection)


def channel_counters(channel: RecordedChannel, closing: bool) -> ChannelCounters:
    return ChannelCounters(_channel_counts(channel.stats), closing)


def channel_info(channel: RecordedChannel, closing: bool) -> ChannelInfo:
    connection = connection_link(channel.conn)
    tx = channel.tx
    # (Positional, in ChannelInfo's order: a scrape makes one per channel, and keywords cost
    # half as much again.)
    return ChannelInfo(
        f"{connection.name} ({channel.id})",                                       # name
        channel.id,                                                                # number
        channel.user,                                                              # user
        connection,                                                                # connection
        channel.vhost.name,                                                        # vhost
        "closing" if closing else "running",                                       # state
        channel.prefetch,                                                          # prefetch
        channel.credit.limit,                                                      # global_prefetch
        channel.confirm,                                                           # confirm
        tx is not None,                                                            # transactional
        len(channel.consumers),                                                    # consumer_count
        len(channel.unacked),                                                      # unacked
        channel.publish_seq - channel.confirmed if channel.confirm else 0,         # unconfirmed
        tx.messages_uncommitted if tx is not None else 0,                          # uncommitted
        tx.acks_uncommitted if tx is not None else 0,                              # acks_uncommitted
        dict(channel.stats),                                                       # counters
        channel.publish_seq,                                                       # received_confirm
    )


def unacked_bytes(channel: RecordedChannel) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for qm, queue, _consumer in channel.unacked.values():
        out[queue] = out.get(queue, 0) + len(qm.message.body)
    return out
