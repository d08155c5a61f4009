"""ConsumerSet: which consumer of a queue gets the next message (round robin, x-priority,
single active consumer), without sockets: consumers whose credit the tests set by hand."""

from warren.broker.consumer import Consumer
from warren.broker.consumer_set import ConsumerSet
from warren.broker.credit import Credit


class _Gate:
    delivering = True


def _consumer(tag, priority=None, prefetch=0, exclusive=False, credit=None):
    """A consumer with its own prefetch; `credit`: its channel's (a fresh, unlimited one by default)."""
    args = None if priority is None else {"x-priority": priority}
    return Consumer(tag, None, None, False, exclusive, args, prefetch, credit or Credit(), b"", _Gate())


def _take(cs, n):
    """Tags of the next n picks, each pick taking one unit of credit (its own and its
    channel's, as the channel's deliver does)."""
    tags = []
    for _ in range(n):
        c = cs.next_ready()
        if c is None:
            tags.append(None)
            continue
        c.unacked += 1
        c.credit.used += 1
        tags.append(c.tag)
    return tags


def test_round_robin_skips_consumers_without_credit():
    cs = ConsumerSet()
    a, b, c = _consumer("a"), _consumer("b", prefetch=1), _consumer("c")
    for x in (a, b, c):
        cs.add(x)
    assert (len(cs), bool(cs)) == (3, True)
    assert _take(cs, 5) == ["a", "b", "c", "a", "c"]


def test_consumers_of_one_channel_share_its_credit():
    """basic.qos global=true: the channel's Credit, held by each of its consumers, stops them
    all at its limit whatever their own prefetch, and frees them as it changes; a consumer of
    another channel goes on."""
    channel = Credit(limit=3)
    cs = ConsumerSet()
    a, b, other = _consumer("a", credit=channel), _consumer("b", prefetch=5, credit=channel), _consumer("other")
    for x in (a, b, other):
        cs.add(x)
    assert _take(cs, 5) == ["a", "b", "other", "a", "other"]
    assert channel.used == 3 and (a.has_credit(), b.has_credit(), other.has_credit()) == (False, False, True)
    channel.used -= 1  # an ack on the channel: one of its consumers takes the slot
    assert _take(cs, 3) == ["a", "other", "other"]
    channel.limit = 5  # basic.qos raised
    assert _take(cs, 3) == ["a", "b", "other"]
    assert (channel.used, b.unacked) == (5, 2)
    channel.limit = 0  # lifted (basic.qos global=false): b's own prefetch of 5 still holds it
    assert _take(cs, 11) == ["a", "b", "other"] * 3 + ["a", "other"]
    assert (b.unacked, b.has_credit(), a.has_credit()) == (5, False, True)


def test_highest_priority_with_credit_round_robin_among_equals():
    cs = ConsumerSet()
    low, hi1, neg, hi2 = _consumer("low"), _consumer("hi1", 5, 2), _consumer("neg", -3), _consumer("hi2", 5, 2)
    for x in (low, hi1, neg, hi2):
        cs.add(x)
    assert [c.tag for c in cs] == ["hi1", "hi2", "low", "neg"]
    assert _take(cs, 6) == ["hi1", "hi2", "hi1", "hi2", "low", "low"]
    hi2.unacked -= 1  # an ack: the higher priority is served again first
    assert _take(cs, 2) == ["hi2", "low"]
    low.prefetch, low.unacked = 1, 1
    assert _take(cs, 1) == ["neg"]


def test_removing_priorities_goes_back_to_one_ring():
    cs = ConsumerSet()
    a, b, hi = _consumer("a"), _consumer("b"), _consumer("hi", 1, 1)
    cs.add(a)
    cs.add(hi)
    cs.add(b)
    assert _take(cs, 3) == ["hi", "a", "b"]
    assert cs.remove(hi) and not cs.remove(hi)
    assert _take(cs, 3) == ["a", "b", "a"]
    assert cs.remove(a) and cs.remove(b)
    assert (len(cs), bool(cs), cs.next_ready()) == (0, False, None)


def test_single_active_first_registered_whatever_its_priority():
    cs = ConsumerSet(single_active=True)
    first, p5, p10, p10b = _consumer("first"), _consumer("p5", 5), _consumer("p10", 10), _consumer("p10b", 10)
    for x in (first, p5, p10, p10b):
        cs.add(x)
    assert cs.active is first
    assert _take(cs, 3) == ["first"] * 3
    assert [cs.activity(x) for x in (first, p5)] == [(True, "single_active"), (False, "waiting")]
    cs.remove(p5)  # a waiting one: nothing changes
    assert cs.active is first
    first.unacked = 0
    cs.remove(first)
    assert cs.active is p10  # the highest priority, the earliest registered among equals
    cs.remove(p10)
    assert cs.active is p10b
    cs.remove(p10b)
    assert cs.active is None and cs.next_ready() is None


def test_single_active_successor_waits_for_the_predecessors_unacked():
    cs = ConsumerSet(single_active=True)
    first, second = _consumer("first"), _consumer("second")
    cs.add(first)
    cs.add(second)
    assert _take(cs, 2) == ["first", "first"]
    cs.remove(first)
    assert cs.active is second
    assert cs.next_ready() is None  # first still has 2 deliveries out
    first.unacked = 1
    assert cs.next_ready() is None
    first.unacked = 0  # acked or requeued
    assert cs.next_ready() is second


def test_single_active_successor_by_registration_order():
    """A quorum queue's rule (rabbit_fifo): the earliest registered, whatever the priorities."""
    cs = ConsumerSet(single_active=True, successor_by_priority=False)
    first, low, high = _consumer("first"), _consumer("low", 0), _consumer("high", 10)
    for x in (first, low, high):
        cs.add(x)
    cs.remove(first)
    assert cs.active is low
    cs.remove(low)
    assert cs.active is high
    assert _take(cs, 2) == ["high", "high"]


def test_single_active_consumer_without_credit():
    cs = ConsumerSet(single_active=True)
    first, second = _consumer("first", prefetch=1), _consumer("second")
    cs.add(first)
    cs.add(second)
    assert _take(cs, 2) == ["first", None]  # the waiting one never gets messages


def test_exclusive_refusals():
    cs = ConsumerSet()
    assert not cs.exclusive_refused(True)
    cs.add(_consumer("a"))
    assert cs.exclusive_refused(True) and not cs.exclusive_refused(False)
    cs.clear()
    cs.add(_consumer("x", exclusive=True))
    assert cs.exclusive_refused(False)
    sac = ConsumerSet(single_active=True)
    assert sac.exclusive_refused(True) and not sac.exclusive_refused(False)


def test_activity_without_single_active():
    cs = ConsumerSet()
    a = _consumer("a")
    cs.add(a)
    assert cs.activity(a) == (True, "up") and cs.active is None
