"""basic.qos: prefetch per consumer (global=false) and per channel (global=true), with
RabbitMQ's meaning, and round-robin dispatch between consumers."""

import time

import pytest
from pamqp import commands as c

from conftest import connection_error, publish_numbered, pump
from rawamqp import connect


def settle(connection, until, timeout=3.0, quiet=0.2):
    """Process deliveries until `until()` holds, then for `quiet` more seconds (so that any
    delivery beyond a limit would show up)."""
    pump(connection, until, timeout)
    connection.process_data_events(time_limit=quiet)


class Recorder:
    """A pika consumer callback that keeps what it got."""

    def __init__(self):
        self.got = []  # (body, delivery_tag)

    def __call__(self, ch, method, props, body):
        self.got.append((body, method.delivery_tag))

    @property
    def bodies(self):
        return [b for b, _ in self.got]


@pytest.fixture
def q(channel, uid):
    name = f"qos-{uid}"
    channel.queue_declare(name, exclusive=True)
    channel.confirm_delivery()
    return name


def consume(ch, q, auto_ack=False) -> Recorder:
    """A new consumer of the queue on `ch`, recording its deliveries."""
    recorder = Recorder()
    ch.basic_consume(q, recorder, auto_ack=auto_ack)
    return recorder


def publish(channel, q, n, start=0):
    publish_numbered(channel, q, range(start, start + n))


def test_prefetch_per_consumer(connection, channel, q):
    publish(channel, q, 10)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=3)
    a, b = consume(ch, q), consume(ch, q)
    settle(connection, lambda: len(a.got) + len(b.got) == 6)
    # Each consumer has its own limit of 3 (global=false is per consumer in RabbitMQ).
    assert (len(a.got), len(b.got)) == (3, 3)
    ch.basic_ack(a.got[0][1])
    settle(connection, lambda: len(a.got) == 4)
    assert len(b.got) == 3


def test_prefetch_global_is_per_channel(connection, channel, q):
    publish(channel, q, 10)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = consume(ch, q), consume(ch, q)
    settle(connection, lambda: len(a.got) + len(b.got) == 3)
    assert len(a.got) + len(b.got) == 3
    first = (a.got or b.got)[0][1]
    ch.basic_ack(first)
    settle(connection, lambda: len(a.got) + len(b.got) == 4)
    assert len(a.got) + len(b.got) == 4


def test_per_consumer_and_global_limits_together(connection, channel, q):
    publish(channel, q, 20)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    consumers = [consume(ch, q) for _ in range(3)]
    settle(connection, lambda: sum(len(r.got) for r in consumers) == 5)
    assert [len(r.got) for r in consumers] == [2, 2, 1]  # at most 2 each, 5 in all


def test_per_consumer_qos_lifts_the_channel_limit(connection, channel, q):
    """RabbitMQ 3.10: basic.qos global=false clears a global=true limit set before it."""
    publish(channel, q, 20)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    ch.basic_qos(prefetch_count=2)
    consumers = [consume(ch, q) for _ in range(3)]
    settle(connection, lambda: sum(len(r.got) for r in consumers) == 6)
    assert [len(r.got) for r in consumers] == [2, 2, 2]


def test_prefetch_applies_to_consumers_created_after_qos(connection, channel, q):
    publish(channel, q, 10)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 1)
    ch.basic_qos(prefetch_count=4)
    b = consume(ch, q)
    settle(connection, lambda: len(b.got) == 4)
    # The earlier consumer keeps the limit it was created with.
    assert len(a.got) == 1
    ch.basic_ack(a.got[0][1])
    settle(connection, lambda: len(a.got) == 2)
    assert len(a.got) == 2


def test_prefetch_zero_is_unlimited(connection, channel, q):
    publish(channel, q, 25)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=0)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 25)


def test_prefetch_does_not_limit_no_ack_consumers(connection, channel, q):
    publish(channel, q, 10)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2, global_qos=True)
    ch.basic_qos(prefetch_count=1)
    a = consume(ch, q, auto_ack=True)
    settle(connection, lambda: len(a.got) == 10)


def test_basic_get_ignores_prefetch(connection, channel, q):
    publish(channel, q, 3)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1)
    assert [ch.basic_get(q)[2] for _ in range(3)] == [b"0", b"1", b"2"]


def test_get_does_not_count_against_global_prefetch(connection, channel, q):
    publish(channel, q, 5)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2, global_qos=True)
    method, _, _ = ch.basic_get(q)  # unacked, but not a consumer delivery
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 2)
    assert len(a.got) == 2


def test_global_prefetch_starts_from_what_is_unacked(connection, channel, q):
    """When the channel limit is set, everything unacked on the channel counts towards it."""
    publish(channel, q, 5)
    ch = connection.channel()
    ch.basic_get(q)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 1)
    assert len(a.got) == 1
    ch.basic_ack(a.got[0][1])
    settle(connection, lambda: len(a.got) == 2)
    assert len(a.got) == 2


def test_prefetch_size_is_not_implemented(channel):
    connection_error(lambda: channel.basic_qos(prefetch_size=1), 540, "NOT_IMPLEMENTED - prefetch_size!=0 (1)")


def test_prefetch_size_error_on_the_wire(broker):
    with connect(broker) as raw:
        raw.open_channel(1)
        raw.send_method(1, c.Basic.Qos(prefetch_size=4096, prefetch_count=5))
        raw.expect_connection_close(540, "NOT_IMPLEMENTED - prefetch_size!=0 (4096)", 60, 10)


# ------------------------------------------------------------- round-robin


def test_round_robin_between_consumers(connection, channel, q):
    ch = connection.channel()
    consumers = [consume(ch, q, auto_ack=True) for _ in range(3)]
    publish(channel, q, 30)
    settle(connection, lambda: sum(len(r.got) for r in consumers) == 30)
    assert [len(r.got) for r in consumers] == [10, 10, 10]
    # Strict rotation: consumer k gets messages k, k+3, k+6, ...
    firsts = sorted(int(r.bodies[0]) for r in consumers)
    assert firsts == [0, 1, 2]
    for r in consumers:
        nums = [int(b) for b in r.bodies]
        assert all(y - x == 3 for x, y in zip(nums, nums[1:])), nums


def test_round_robin_across_channels_and_connections(connection, other_connection, channel, uid):
    q = f"qos-shared-{uid}"
    channel.queue_declare(q, auto_delete=True)
    a = consume(connection.channel(), q, auto_ack=True)
    b = consume(other_connection.channel(), q, auto_ack=True)
    publish(channel, q, 20)
    deadline = time.monotonic() + 3
    while len(a.got) + len(b.got) < 20 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)
        other_connection.process_data_events(time_limit=0.02)
    assert (len(a.got), len(b.got)) == (10, 10)


def test_consumer_at_its_limit_is_skipped(connection, channel, q):
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1)
    slow = consume(ch, q)
    ch.basic_qos(prefetch_count=100)
    fast = consume(ch, q)
    publish(channel, q, 9)
    settle(connection, lambda: len(slow.got) + len(fast.got) == 9)
    assert (len(slow.got), len(fast.got)) == (1, 8)
    # Acking frees the slow consumer's credit: it takes part again.
    ch.basic_ack(slow.got[0][1])
    publish(channel, q, 4, start=9)
    settle(connection, lambda: len(slow.got) + len(fast.got) == 13)
    assert len(slow.got) == 2


def test_acking_frees_credit_for_queued_messages(connection, channel, q):
    publish(channel, q, 6)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 2)
    assert a.bodies == [b"0", b"1"]
    ch.basic_ack(a.got[1][1], multiple=True)
    settle(connection, lambda: len(a.got) == 4)
    assert a.bodies == [b"0", b"1", b"2", b"3"]
    ch.basic_reject(a.got[3][1], requeue=False)
    settle(connection, lambda: len(a.got) == 5)
    assert len(a.got) == 5  # one slot freed by the reject, the other is still held by "2"
    ch.basic_nack(0, multiple=True, requeue=True)
    settle(connection, lambda: len(a.got) == 7)
    assert a.bodies[5:] == [b"2", b"4"]  # requeued at their original places, redelivered first


def test_qos_raised_on_channel_delivers_more(connection, channel, q):
    publish(channel, q, 6)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2, global_qos=True)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 2)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    settle(connection, lambda: len(a.got) == 5)
    assert len(a.got) == 5


def test_lowered_global_limit_holds_consumers_until_below_it(connection, channel, q):
    """A channel limit lowered while its consumers hold more than it: nothing more until acks
    bring the channel's unacked deliveries below the new limit."""
    publish(channel, q, 10)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    a, b = consume(ch, q), consume(ch, q)
    settle(connection, lambda: len(a.got) + len(b.got) == 5)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    tags = sorted(t for r in (a, b) for _, t in r.got)
    ch.basic_ack(tags[2], multiple=True)  # 2 left unacked: at the new limit
    connection.process_data_events(time_limit=0.3)
    assert len(a.got) + len(b.got) == 5
    ch.basic_ack(tags[3])
    settle(connection, lambda: len(a.got) + len(b.got) == 6)
    assert len(a.got) + len(b.got) == 6


def test_per_consumer_qos_lifts_the_limit_of_existing_consumers(connection, channel, q):
    """basic.qos global=false while consumers wait at the channel limit lifts it for them (a
    consumer created with no prefetch of its own then takes everything); a channel limit set
    again counts from every delivery still unacked."""
    publish(channel, q, 8)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2, global_qos=True)
    a = consume(ch, q)
    settle(connection, lambda: len(a.got) == 2)
    ch.basic_qos(prefetch_count=1)
    settle(connection, lambda: len(a.got) == 8)
    ch.basic_qos(prefetch_count=9, global_qos=True)  # 8 unacked: room for one more
    publish(channel, q, 4, start=8)
    settle(connection, lambda: len(a.got) == 9)
    assert len(a.got) == 9
    ch.basic_ack(a.got[1][1], multiple=True)
    settle(connection, lambda: len(a.got) == 11)
    assert a.bodies == [str(i).encode() for i in range(11)]
