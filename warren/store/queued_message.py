"""A message's place in one queue. It belongs to the store: the store creates it when it
reads a queue back from its segments, and records where it wrote it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..amqp.message import Message

if TYPE_CHECKING:
    from .segment_file import Segment
    from .settlement import Ticket


class QueuedMessage:
    """A message's place in one queue: its sequence number and delivery state there."""

    # seg/off: where the store wrote it (None if only in memory); durable: that record
    # survives restarts; deliveries: how often it was handed out (kept across restarts).
    # message: while a disk store has paged its body out, its stand-in PAGED_OUT (the store
    # reads it back before handing the QueuedMessage to anyone: warren.store.disk).
    # expiry: the scheduler (monotonic) time its TTL ends, None: no TTL (kept in its record
    # as wall-clock time, read back as this run's).
    # hold: while a disk store holds its record back (a big persistent body: see
    # warren.store.persister), the confirm Ticket of its publish; None otherwise.
    __slots__ = ("seq", "message", "redelivered", "seg", "off", "durable", "deliveries", "expiry", "hold")

    seq: int
    message: Message
    redelivered: bool
    seg: Segment | None
    off: int      # set together with seg
    durable: bool  # set together with seg
    deliveries: int
    expiry: float | None
    hold: Ticket | None

    def __init__(self, seq: int, message: Message, redelivered: bool = False):
        self.seq = seq
        self.message = message
        self.redelivered = redelivered
        self.seg = None
        self.deliveries = 0
        self.expiry = None
        self.hold = None

    def __lt__(self, other: QueuedMessage) -> bool:  # requeued messages are ordered by their original position
        return self.seq < other.seq
