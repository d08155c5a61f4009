"""One throttle decision per connection, in the shape of rabbit_reader's control_throttle.

A connection is held back for a set of reasons. From that set one function decides whether
its socket is read and whether its consumers are sent to. The resource alarms block a
publishing connection here (Reason.BLOCKED; the connection sends connection.blocked /
unblocked); per-connection credit flow stops reading a publisher into a store that is behind
(Reason.FLOW).
"""

from __future__ import annotations

import enum
from typing import Callable

from ..broker.ports import Transport


class Reason(enum.Enum):
    # The transport's write buffer is full: deliver nothing more and stop reading the socket
    # (a client that does not read its deliveries must not make the broker buffer without
    # bound) until it drains.
    WRITE_BUFFER = "write_buffer"
    # This loop tick's output passed the high-water mark: consumers wait for the next flush,
    # so one busy queue cannot make one tick's write grow without bound.
    TICK_OUTPUT = "tick_output"
    # Frames already received wait unprocessed because one tick's output reached the high-
    # water mark: read no more until they are handled.
    INPUT_HELD = "input_held"
    # A resource alarm (memory, disk) is on and this connection published: read nothing more,
    # the rest of its input included, until every alarm has cleared (RabbitMQ's `blocked`
    # state). Its consumers are still sent to: a blocked publisher may also be a consumer.
    BLOCKED = "blocked"
    # Credit flow: this connection published into the message store while the store's
    # outstanding bytes (written, fsync pending) were past their high-water mark: read nothing
    # more until the store has drained below its low-water mark (RabbitMQ's `flow` state; no
    # connection.blocked for it). Its consumers are still sent to.
    FLOW = "flow"
    # Queue credit: this connection published into a queue whose consumers were taking less
    # than it sent (warren.broker.queue_flow): read nothing more until the queue lets it go.
    # Also RabbitMQ's `flow` state; its consumers are still sent to.
    QUEUE_FLOW = "queue_flow"
    # A channel's change of metadata waits for the cluster's log (warren.cluster.metadata_log):
    # read nothing more, and handle none of what was read, until this node has applied it.
    METADATA = "metadata"


# Reasons that stop the socket being read, and those that stop deliveries to consumers.
_STOP_READING = frozenset({Reason.WRITE_BUFFER, Reason.INPUT_HELD, Reason.BLOCKED, Reason.FLOW, Reason.QUEUE_FLOW,
                           Reason.METADATA})
_STOP_DELIVERING = frozenset({Reason.WRITE_BUFFER, Reason.TICK_OUTPUT})


class Throttle:
    """The set of reasons a connection is held back, and what follows from it.

    `delivering` is read on every delivery (the model's consumers hold this object as their
    gate), so it is a plain attribute kept in step with the reasons."""

    __slots__ = ("reasons", "delivering", "reading", "_transport", "_on_resume")

    def __init__(self, transport: Transport, on_resume: Callable[[], None]):
        self.reasons: set[Reason] = set()
        self.delivering = True
        self.reading = True
        self._transport = transport
        self._on_resume = on_resume  # consumers may be sent to again

    def detach(self, transport: Transport) -> None:
        """The connection is over (Connection.detach): refer to neither it nor its transport."""
        self._transport = transport
        self._on_resume = _nothing

    def add(self, reason: Reason) -> None:
        if reason not in self.reasons:
            self.reasons.add(reason)
            self._control()

    def discard(self, reason: Reason) -> None:
        if reason in self.reasons:
            self.reasons.discard(reason)
            self._control()

    def _control(self) -> None:
        reasons = self.reasons
        reading = not (reasons & _STOP_READING)
        if reading != self.reading:
            self.reading = reading
            if reading:
                self._transport.resume_reading()
            else:
                self._transport.pause_reading()
        delivering = not (reasons & _STOP_DELIVERING)
        if delivering != self.delivering:
            self.delivering = delivering
            if delivering:
                self._on_resume()


def _nothing() -> None:
    pass
