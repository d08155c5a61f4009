"""GatedOutput: a replicated queue's deliveries held in a connection's output until their
commit point is committed, what follows them kept behind them, failed ones dropped."""

from __future__ import annotations

from warren.session.gated_output import GatedOutput


class Point:
    """A settlement handle whose status the test sets."""

    def __init__(self) -> None:
        self.state: bool | None = None
        self.waiters: list = []

    def status(self) -> bool | None:
        return self.state

    def notify(self, waiter) -> None:
        self.waiters.append(waiter)

    def decide(self, state: bool) -> None:
        self.state = state
        for waiter in self.waiters:
            waiter.store_synced()


class Waker:
    def __init__(self, woken: list[int]):
        self.woken = woken

    def store_synced(self) -> None:
        self.woken.append(1)


def test_frames_after_a_held_delivery_wait_behind_it_and_leave_in_order():
    woken: list[int] = []
    gates = GatedOutput()
    out = [b"ack"]
    first, second = Point(), Point()
    out += [b"d1", b"b1"]
    gates.hold(out, 1, first, None)
    out += [b"d2"]
    gates.hold(out, 3, first, None)  # (contiguous, same point: one gate)
    out += [b"confirm"]
    out += [b"d3"]
    gates.hold(out, 5, second, None)
    assert len(gates.held) == 2
    assert gates.releasable(out, closing=False, waiter=Waker(woken)) == 1  # only what came before the first delivery
    assert first.waiters and second.waiters  # every point still waited on is asked at once
    del out[:1]
    gates.written(1)
    first.decide(True)
    assert woken
    assert gates.releasable(out, closing=False, waiter=Waker(woken)) == 4  # d1, b1, d2 and the confirm behind them
    assert out[:4] == [b"d1", b"b1", b"d2", b"confirm"]
    del out[:4]
    gates.written(4)
    second.decide(True)
    assert gates.releasable(out, closing=False, waiter=Waker(woken)) == 1 and out == [b"d3"] and not gates.held


def test_a_delivery_whose_leader_moved_is_dropped_and_forgotten():
    gates = GatedOutput()
    dropped: list[str] = []
    point = Point()
    out = [b"d1", b"b1"]
    gates.hold(out, 0, point, lambda: dropped.append("d1"))
    out.append(b"after")
    point.decide(False)
    assert gates.releasable(out, closing=False, waiter=Waker([])) == 3
    assert out == [b"", b"", b"after"] and dropped == ["d1"]


def test_a_closing_connection_drops_what_is_held_without_forgetting_it():
    gates = GatedOutput()
    dropped: list[str] = []
    out = [b"d1"]
    gates.hold(out, 0, Point(), lambda: dropped.append("d1"))
    out.append(b"close-ok")
    assert gates.releasable(out, closing=True, waiter=Waker([])) == 2
    assert out == [b"", b"close-ok"] and dropped == []  # (its channel requeues what it held)
