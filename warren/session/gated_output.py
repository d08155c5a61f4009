"""A connection's deliveries held until their queue's log has committed them.

A replicated queue's leader records each delivery in its log (a DELIVERED entry, or a SETTLE
for a consumer that acks nothing) and hands the message out. Were the frames written at once,
a leader that died or was replaced before that entry reached its followers would leave a
successor that hands the message out again as new: a duplicate the client cannot tell from a
fresh message. RabbitMQ's quorum queues deliver only what their Raft log has applied, so the
same rule holds here: the delivery's frames wait in `Connection.out` for their queue's commit
point (ReplicatedQueueStore.delivery_gate), and what the connection sends after them waits
behind them, so frames keep their order. A delivery whose leader stopped leading first never
leaves (`dropped` runs: its channel forgets it, and the new leader gives the message out
again), and a connection that closes drops what is still held (its channels requeue it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..store.settlement import Settlement, SyncWaiter


@dataclass
class _Gate:
    start: int  # the frames [start, stop) of Connection.out: deliveries made under one point
    stop: int
    point: Settlement
    dropped: list[Callable[[], None]] = field(default_factory=list)
    asked: bool = False  # (its point was asked to wake the connection)


class GatedOutput:
    """The gates over one connection's output, in order."""

    def __init__(self) -> None:
        self.held: deque[_Gate] = deque()  # (empty: the flush writes everything, as before)

    def hold(self, out: list, start: int, point: Settlement, dropped: Callable[[], None] | None) -> None:
        """out[start:] is a delivery just made under `point`."""
        gates = self.held
        last = gates[-1] if gates else None
        if last is not None and last.point is point and last.stop == start:
            last.stop = len(out)
        else:
            last = _Gate(start, len(out), point)
            gates.append(last)
        if dropped is not None:
            last.dropped.append(dropped)

    def releasable(self, out: list, closing: bool, waiter: SyncWaiter) -> int:
        """How many frames at the head of `out` may be written now; those of deliveries that
        will never leave are blanked (their octets no longer counted by the caller). Called at
        the end of each tick: every point still waited on is asked to wake the connection now,
        not once the gates before it open (a point no one waits on yet keeps moving to the
        log's end, and its deliveries would wait for what was appended after them). `waiter`
        is the connection (not kept here: a closed connection leaves no cycle behind)."""
        gates = self.held
        while gates:
            gate = gates[0]
            status = False if closing else gate.point.status()
            if status is None:
                for waiting in gates:
                    if not waiting.asked:
                        waiting.asked = True
                        waiting.point.notify(waiter)
                return gate.start
            gates.popleft()
            if not status:
                out[gate.start:gate.stop] = [b""] * (gate.stop - gate.start)
                if not closing:
                    for dropped in gate.dropped:
                        dropped()
        return len(out)

    def written(self, count: int) -> None:
        """The first `count` frames of the output left: the gates' frames moved up."""
        for gate in self.held:
            gate.start -= count
            gate.stop -= count
