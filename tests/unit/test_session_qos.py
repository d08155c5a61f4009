"""basic.qos at the session level (tests/integration/test_qos.py without a socket): RabbitMQ
3.10's per-consumer (global=false) and per-channel (global=true) prefetch, and round-robin."""

from unittest.mock import ANY

import pytest

from .fake_transport import Client, ConnectionClose, ConsumeOk, Deliver, GetOk, Method

QOS_OK = Method(2, "Basic.QosOk")


@pytest.fixture
def c():
    """Channel 1 publishes, channel 2 consumes; queue "q" declared and empty."""
    client = Client()
    client.open_channel(1)
    client.open_channel(2)
    client.declare(1, "q")
    return client


def fill(c, n, start=0):
    c.fill(1, "q", [str(i).encode() for i in range(start, start + n)])


def qos(c, count, global_=False):
    c.qos(2, count, global_)
    assert c.receive() == [QOS_OK]


def consume(c, tag, no_ack=False) -> list:
    """Start a consumer on channel 2: the deliveries it got at once (after checking consume-ok)."""
    c.consume(2, tag, no_ack=no_ack)
    got = c.receive()
    assert got[0] == ConsumeOk(2, tag)
    return got[1:]


def delivered(tag, first_tag, bodies, redelivered=False):
    return [Deliver(2, tag, first_tag + i, b, redelivered) for i, b in enumerate(bodies)]


def test_qos_ok(c):
    c.qos(2, 10)
    assert c.receive() == [QOS_OK]


def test_prefetch_is_per_consumer(c):
    fill(c, 10)
    qos(c, 3)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1", b"2"])
    assert consume(c, "b") == delivered("b", 4, [b"3", b"4", b"5"])
    c.ack(2, 1)
    assert c.receive() == [Deliver(2, "a", 7, b"6")]


def test_global_prefetch_is_shared_by_the_channels_consumers(c):
    fill(c, 10)
    qos(c, 3, global_=True)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1", b"2"])
    assert consume(c, "b") == []
    c.ack(2, 1)
    assert c.receive() == [Deliver(2, ANY, 4, b"3")]  # either consumer may take the freed slot


def test_per_consumer_and_global_limits_together(c):
    fill(c, 20)
    qos(c, 2)
    qos(c, 5, global_=True)
    assert consume(c, "x") == delivered("x", 1, [b"0", b"1"])
    assert consume(c, "y") == delivered("y", 3, [b"2", b"3"])
    assert consume(c, "z") == delivered("z", 5, [b"4"])


def test_per_consumer_qos_lifts_the_channel_limit(c):
    fill(c, 20)
    qos(c, 5, global_=True)
    qos(c, 2)  # RabbitMQ 3.10: this clears the global limit set before it
    assert consume(c, "x") == delivered("x", 1, [b"0", b"1"])
    assert consume(c, "y") == delivered("y", 3, [b"2", b"3"])
    assert consume(c, "z") == delivered("z", 5, [b"4", b"5"])


def test_prefetch_applies_to_consumers_created_after_qos(c):
    fill(c, 10)
    qos(c, 1)
    assert consume(c, "a") == delivered("a", 1, [b"0"])
    qos(c, 4)
    assert consume(c, "b") == delivered("b", 2, [b"1", b"2", b"3", b"4"])
    c.ack(2, 1)  # "a" keeps the limit it was created with
    assert c.receive() == [Deliver(2, "a", 6, b"5")]


def test_prefetch_zero_is_unlimited(c):
    fill(c, 25)
    qos(c, 0)
    assert consume(c, "a") == delivered("a", 1, [str(i).encode() for i in range(25)])


def test_prefetch_does_not_limit_no_ack_consumers(c):
    fill(c, 10)
    qos(c, 2, global_=True)
    qos(c, 1)
    assert consume(c, "a", no_ack=True) == delivered("a", 1, [str(i).encode() for i in range(10)])


def test_basic_get_ignores_prefetch(c):
    fill(c, 3)
    qos(c, 1)
    with c.batch():
        for _ in range(3):
            c.get(2)
    assert c.receive() == [GetOk(2, 1, b"0", 2), GetOk(2, 2, b"1", 1), GetOk(2, 3, b"2", 0)]


def test_get_does_not_count_against_global_prefetch(c):
    fill(c, 5)
    qos(c, 2, global_=True)
    c.get(2)
    assert c.receive() == [GetOk(2, 1, b"0", 4)]
    assert consume(c, "a") == delivered("a", 2, [b"1", b"2"])


def test_global_prefetch_starts_from_what_is_unacked(c):
    fill(c, 5)
    c.get(2)
    assert c.receive() == [GetOk(2, 1, b"0", 4)]
    qos(c, 2, global_=True)  # the unacked get counts towards the new limit
    assert consume(c, "a") == delivered("a", 2, [b"1"])
    c.ack(2, 2)
    assert c.receive() == [Deliver(2, "a", 3, b"2")]


def test_raising_the_global_limit_delivers_more(c):
    fill(c, 6)
    qos(c, 2, global_=True)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1"])
    c.qos(2, 5, global_=True)
    assert c.receive() == [QOS_OK] + delivered("a", 3, [b"2", b"3", b"4"])


def test_lowered_global_limit_holds_consumers_until_below_it(c):
    fill(c, 10)
    qos(c, 5, global_=True)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1", b"2", b"3", b"4"])
    qos(c, 2, global_=True)
    c.ack(2, 3, multiple=True)  # 2 left unacked: at the new limit
    assert c.receive() == []
    c.ack(2, 4)
    assert c.receive() == delivered("a", 6, [b"5"])


def test_per_consumer_qos_lifts_the_limit_of_existing_consumers(c):
    fill(c, 8)
    qos(c, 2, global_=True)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1"])
    c.qos(2, 1)  # "a" has no prefetch of its own: it takes the rest
    assert c.receive() == [QOS_OK] + delivered("a", 3, [str(i).encode() for i in range(2, 8)])
    qos(c, 9, global_=True)  # counted from the 8 unacked: room for one more
    with c.batch():
        for i in range(8, 12):
            c.publish(1, "", "q", str(i).encode())
    assert c.receive() == delivered("a", 9, [b"8"])
    c.ack(2, 2, multiple=True)
    assert c.receive() == delivered("a", 10, [b"9", b"10"])


def test_prefetch_size_is_not_implemented(c):
    c.qos(2, 5, size=4096)
    assert c.receive() == [ConnectionClose(540, "NOT_IMPLEMENTED - prefetch_size!=0 (4096)", 60, 10)]


# ------------------------------------------------------- credit and round-robin


def test_acking_frees_credit_for_queued_messages(c):
    fill(c, 6)
    qos(c, 2)
    assert consume(c, "a") == delivered("a", 1, [b"0", b"1"])
    c.ack(2, 2, multiple=True)
    assert c.receive() == delivered("a", 3, [b"2", b"3"])
    c.reject(2, 4, requeue=False)  # one slot freed; "2" still holds the other
    assert c.receive() == delivered("a", 5, [b"4"])
    c.nack(2, 0, multiple=True, requeue=True)  # back at their original places, redelivered first
    assert c.receive() == delivered("a", 6, [b"2", b"4"], redelivered=True)


def test_round_robin_between_consumers(c):
    for tag in ("a", "b", "c"):
        assert consume(c, tag, no_ack=True) == []
    bodies = [str(i).encode() for i in range(9)]
    with c.batch():
        for b in bodies:
            c.publish(1, "", "q", b)
    # Strict rotation: consumer k gets messages k, k+3, k+6.
    assert c.receive() == [Deliver(2, "abc"[i % 3], i + 1, b) for i, b in enumerate(bodies)]


def test_a_consumer_at_its_limit_is_skipped(c):
    qos(c, 1)
    assert consume(c, "slow") == []
    qos(c, 100)
    assert consume(c, "fast") == []
    bodies = [str(i).encode() for i in range(5)]
    with c.batch():
        for b in bodies:
            c.publish(1, "", "q", b)
    assert c.receive() == [Deliver(2, "slow", 1, b"0")] + [
        Deliver(2, "fast", i + 1, b) for i, b in enumerate(bodies) if i]


def test_round_robin_across_connections():
    a = Client()
    b = Client(a.broker)
    for client, tag in ((a, "a"), (b, "b")):
        client.open_channel(1)
        client.declare(1, "q")
        client.consume(1, tag, no_ack=True)
        assert client.receive() == [ConsumeOk(1, tag)]
    with a.batch():
        for i in range(4):
            a.publish(1, "", "q", b"%d" % i)
    # a's own deliveries go out with this read's flush; b's wait for b's flush (its loop turn).
    assert a.receive() == [Deliver(1, "a", 1, b"0"), Deliver(1, "a", 2, b"2")]
    assert b.receive() == []
    assert b.tick() == [Deliver(1, "b", 1, b"1"), Deliver(1, "b", 2, b"3")]
