"""consumer_timeout: a channel whose oldest unacknowledged delivery is older than the timeout
is closed with 406, as RabbitMQ 3.10's channel does on its tick (rabbit_channel
evaluate_consumer_timeout). Consumer deliveries and basic.get deliveries both count;
no-ack ones do not.

RabbitMQ stamps every delivery with the time. Warren stamps none: a periodic check of each
channel that could hold unacked deliveries notes the channel's last delivery tag and the
time. Delivery tags only grow, so a delivery with tag T was made no later than the first note
whose tag is >= T; once that note is older than the timeout, so is the delivery. The channel is
never closed early, and late by at most two check intervals; the interval is a tenth of the
timeout, at most 30 s, so a channel is closed no later than RabbitMQ's 60 s tick would.
Nothing happens per delivery.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from ..broker.errors import precondition_failed

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..broker.consumer import Consumer
    from ..broker.errors import AMQPError
    from ..broker.ports import Scheduler, Timer

log = logging.getLogger("warren.channel")

MAX_INTERVAL = 30.0   # seconds between checks, at most
MIN_INTERVAL = 0.01


class NamedConnection(Protocol):
    """A channel's connection, named in the warning."""

    @property
    def name(self) -> str: ...


class TimedChannel(Protocol):
    """What the check reads of its channel (warren.session.channel.Channel, which imports
    this module)."""

    @property
    def id(self) -> int: ...

    @property
    def conn(self) -> NamedConnection: ...

    @property
    def state(self) -> int:
        """0 while open."""

    @property
    def delivery_tag(self) -> int:
        """The last one handed out."""

    @property
    def unacked(self) -> Mapping[int, object]:
        """Its unacked deliveries by tag, oldest first."""

    @property
    def tx(self) -> object | None:
        """Its transaction, in tx mode (acks may come at commit)."""

    @property
    def consumers(self) -> Mapping[str, Consumer]: ...

    def error(self, err: AMQPError) -> None:
        """Close the channel with `err`."""


class AckTimeout:
    __slots__ = ("channel", "timeout_ms", "scheduler", "interval", "notes", "timer")

    def __init__(self, channel: TimedChannel, timeout_ms: int, scheduler: Scheduler):
        self.channel = channel
        self.timeout_ms = timeout_ms
        self.scheduler = scheduler
        self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, timeout_ms / 10000))
        self.notes: deque[tuple[int, float]] = deque()  # (last delivery tag, time), oldest first
        self.timer: Timer | None = None

    def start(self) -> None:
        """Check from now on (a consumer that acks, or a basic.get that must be acked, came)."""
        if self.timer is None:
            self._note(self.scheduler.now())
            self.timer = self.scheduler.call_later(self.interval, self._check)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.notes.clear()

    def _note(self, now: float) -> None:
        tag = self.channel.delivery_tag
        notes = self.notes
        if not notes or notes[-1][0] != tag:
            notes.append((tag, now))

    def _check(self) -> None:
        self.timer = None
        ch = self.channel
        if ch.state != 0:  # closing: release() stopped us, or is about to
            return
        unacked = ch.unacked
        if not (unacked or ch.tx is not None or any(not c.no_ack for c in ch.consumers.values())):
            self.notes.clear()  # nothing can be waiting for an ack: start() again when there is
            return
        now = self.scheduler.now()
        if not unacked:
            self.notes.clear()  # every later delivery has a higher tag: older notes never matter
        self._note(now)
        if unacked:
            oldest = next(iter(unacked))
            notes = self.notes
            while notes[0][0] < oldest:  # the last note's tag is the channel's last: >= oldest
                notes.popleft()
            if (now - notes[0][1]) * 1000 > self.timeout_ms:
                self._expire(oldest)
                return
        self.timer = self.scheduler.call_later(self.interval, self._check)

    def _expire(self, tag: int) -> None:
        ch = self.channel
        log.warning("channel %s:%d: delivery %d was not acknowledged within %d ms (consumer_timeout): "
                    "closing the channel", ch.conn.name, ch.id, tag, self.timeout_ms)
        self.notes.clear()
        # RabbitMQ's words; the close names no method (class 0, method 0).
        ch.error(precondition_failed(
            f"delivery acknowledgement on channel {ch.id} timed out. Timeout value used: {self.timeout_ms} ms. "
            "This timeout value can be configured, see consumers doc guide to learn more"))
