"""Flow control at the session level: when the transport's write buffer is full
(conn.pause_writing()), the connection's consumers get nothing more until resume_writing();
one read's output past the high-water mark holds deliveries until the next flush; and
channel.flow as RabbitMQ 3.10 answers it."""

import pytest
from pamqp import commands

from .fake_transport import Client, ConnectionClose, ConsumeOk, Deliver, GetOk, Method


@pytest.fixture
def pub():
    """The publisher: channel 1 open, queue "q" declared."""
    client = Client()
    client.open_channel(1)
    client.declare(1, "q")
    return client


def consumer(pub, tag="c", no_ack=True, prefetch=0) -> Client:
    """A second connection on the same broker, consuming "q" on channel 1."""
    client = Client(pub.broker)
    client.open_channel(1)
    if prefetch:
        client.qos(1, prefetch)
        assert client.receive() == [Method(1, "Basic.QosOk")]
    client.consume(1, tag, no_ack=no_ack)
    return client


def test_paused_writing_holds_deliveries_until_resumed(pub):
    con = consumer(pub)
    assert con.receive() == [ConsumeOk(1, "c")]
    con.conn.pause_writing()
    pub.fill(1, "q", [b"a", b"b", b"c"])
    assert con.tick() == []
    assert pub.ready_count(1) == 3  # held in the queue, not in the connection's buffer
    con.conn.resume_writing()
    assert con.tick() == [Deliver(1, "c", 1, b"a"), Deliver(1, "c", 2, b"b"), Deliver(1, "c", 3, b"c")]
    assert pub.ready_count(1) == 0


def test_acks_while_paused_deliver_nothing_until_resumed(pub):
    pub.fill(1, "q", [b"a", b"b"])
    con = consumer(pub, no_ack=False, prefetch=1)
    assert con.receive() == [ConsumeOk(1, "c"), Deliver(1, "c", 1, b"a")]
    con.conn.pause_writing()
    con.ack(1, 1)
    assert con.tick() == []
    con.conn.resume_writing()
    assert con.tick() == [Deliver(1, "c", 2, b"b")]


def test_a_paused_connection_does_not_hold_up_other_consumers(pub):
    paused, active = consumer(pub, "p"), consumer(pub, "a")
    assert paused.receive() == [ConsumeOk(1, "p")] and active.receive() == [ConsumeOk(1, "a")]
    paused.conn.pause_writing()
    pub.fill(1, "q", [b"1", b"2", b"3"])
    assert active.tick() == [Deliver(1, "a", 1, b"1"), Deliver(1, "a", 2, b"2"), Deliver(1, "a", 3, b"3")]
    assert paused.tick() == []


def test_a_full_write_buffer_stops_reading_the_socket_until_it_drains(pub):
    con = consumer(pub)
    t = con.transport
    con.conn.pause_writing()
    assert (t.reading_paused, t.pause_reading_calls, t.resume_reading_calls) == (True, 1, 0)
    con.conn.resume_writing()
    assert (t.reading_paused, t.pause_reading_calls, t.resume_reading_calls) == (False, 1, 1)


def test_output_past_the_high_water_mark_waits_for_the_next_flush(pub):
    big = [bytes([65 + i]) * 600_000 for i in range(3)]  # two of them pass 1 MiB
    pub.fill(1, "q", big)
    con = consumer(pub)
    assert con.receive() == [ConsumeOk(1, "c"), Deliver(1, "c", 1, big[0]), Deliver(1, "c", 2, big[1])]
    assert len(con.transport.scheduled) == 1
    assert con.tick() == [Deliver(1, "c", 3, big[2])]
    assert con.transport.scheduled == []


def _three_big_gets_in_one_read(pub) -> list:
    big = [bytes([65 + i]) * 600_000 for i in range(3)]  # two of them pass 1 MiB
    pub.fill(1, "q", big)
    with pub.batch():
        for _ in range(3):
            pub.get(1, no_ack=True)
    return big


def test_gets_past_the_high_water_mark_hold_the_rest_of_the_read(pub):
    """Pipelined basic.gets whose answers pass the high-water mark: the rest of the read
    waits, and the socket is not read, until the output has been written; then it is
    handled in order (also if nothing more arrives)."""
    big = _three_big_gets_in_one_read(pub)
    assert pub.receive() == [GetOk(1, 1, big[0], 2), GetOk(1, 2, big[1], 1)]
    t = pub.transport
    assert t.reading_paused and pub.conn.pending_len  # one get waits, unread input too
    assert pub.tick() == [GetOk(1, 3, big[2], 0)]
    assert not t.reading_paused and not pub.conn.pending_len


def test_held_input_waits_for_a_full_write_buffer_to_drain(pub):
    big = _three_big_gets_in_one_read(pub)
    pub.conn.pause_writing()  # the transport's buffer filled with the first two
    assert pub.receive() == [GetOk(1, 1, big[0], 2), GetOk(1, 2, big[1], 1)]
    t = pub.transport
    assert pub.tick() == [] and t.reading_paused
    pub.conn.resume_writing()
    assert pub.receive() == [GetOk(1, 3, big[2], 0)]
    assert not t.reading_paused


def test_channel_flow_active_is_acknowledged(pub):
    assert pub.call(1, commands.Channel.Flow(active=True)) == [Method(1, "Channel.FlowOk", True)]


def test_channel_flow_inactive_is_not_implemented(pub):
    assert pub.call(1, commands.Channel.Flow(active=False)) == [
        ConnectionClose(540, "NOT_IMPLEMENTED - active=false", 20, 20)]
