"""The per-connection throttle: one decision from a set of reasons."""

from warren.session.throttle import Reason, Throttle


class Transport:
    def __init__(self):
        self.calls = []

    def pause_reading(self):
        self.calls.append("pause")

    def resume_reading(self):
        self.calls.append("resume")


def make():
    transport, resumed = Transport(), []
    return Throttle(transport, lambda: resumed.append(True)), transport, resumed


def test_a_full_write_buffer_stops_reading_and_delivering_until_it_drains():
    throttle, transport, resumed = make()
    throttle.add(Reason.WRITE_BUFFER)
    assert (throttle.reading, throttle.delivering, transport.calls) == (False, False, ["pause"])
    throttle.add(Reason.WRITE_BUFFER)  # no second pause
    assert transport.calls == ["pause"]
    throttle.discard(Reason.WRITE_BUFFER)
    assert (throttle.reading, throttle.delivering, transport.calls, resumed) == (True, True, ["pause", "resume"], [True])


def test_a_full_tick_pauses_deliveries_but_keeps_reading():
    throttle, transport, resumed = make()
    throttle.add(Reason.TICK_OUTPUT)
    assert (throttle.reading, throttle.delivering, transport.calls) == (True, False, [])
    throttle.discard(Reason.TICK_OUTPUT)
    assert throttle.delivering and resumed == [True]


def test_deliveries_resume_only_when_every_reason_has_cleared():
    throttle, transport, resumed = make()
    throttle.add(Reason.TICK_OUTPUT)
    throttle.add(Reason.WRITE_BUFFER)
    throttle.discard(Reason.TICK_OUTPUT)
    assert not throttle.delivering and not resumed
    throttle.discard(Reason.WRITE_BUFFER)
    assert throttle.delivering and resumed == [True]
    throttle.discard(Reason.WRITE_BUFFER)  # nothing held back: nothing happens
    assert resumed == [True] and transport.calls == ["pause", "resume"]
