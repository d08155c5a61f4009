"""What a resource alarm does to a connection (RabbitMQ 3.10's rabbit_reader, checked on a node):
while an alarm is on every connection is `blocking`; one that publishes becomes `blocked`: its
input stops right after the content header (the body and everything after it wait unread),
connection.blocked goes to a client that announced the capability, and once every alarm has
cleared connection.unblocked goes out and the held input is handled in order.

The alarms are raised with broker.alarms.set(...) directly, as the server's monitors do."""

from pamqp import commands, frame

from warren.broker.broker import Broker
from warren.session.throttle import Reason

from .fake_transport import (FRAME_MAX, PROTOCOL_HEADER, Client, FakeTransport, GetEmpty, GetOk, make_connection,
                             Deliver, ConsumeOk)

BLOCKED_CAPS = {"connection.blocked": True, "consumer_cancel_notify": True}


class AlarmClient(Client):
    """A Client whose start-ok announces `capabilities`."""

    def __init__(self, broker=None, capabilities=BLOCKED_CAPS):
        self.broker = broker if broker is not None else Broker.with_defaults()
        self.transport = FakeTransport()
        self.conn = make_connection(self.broker, self.transport)
        self._batch = None
        conn = self.conn
        conn.data_received(PROTOCOL_HEADER)
        self.transport.frames()
        conn.data_received(frame.marshal(commands.Connection.StartOk(
            client_properties={"capabilities": capabilities}, mechanism="PLAIN", response="\0guest\0guest"), 0))
        self.transport.frames()
        conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, FRAME_MAX, 0), 0))
        conn.data_received(frame.marshal(commands.Connection.Open("/"), 0))
        [(_, ok)] = self.transport.frames()
        assert isinstance(ok, commands.Connection.OpenOk)


def publisher(broker=None, capabilities=BLOCKED_CAPS) -> AlarmClient:
    c = AlarmClient(broker, capabilities)
    c.open_channel(1)
    c.declare(1, "q")
    return c


BLOCKED_MEMORY = (0, "Connection.Blocked", "low on memory")
UNBLOCKED = (0, "Connection.Unblocked")


def test_connection_blocked_is_advertised():
    transport = FakeTransport()
    conn = make_connection(Broker.with_defaults(), transport)
    conn.data_received(PROTOCOL_HEADER)
    [(_, start)] = transport.frames()
    assert start.server_properties["capabilities"]["connection.blocked"] is True


def test_an_alarm_makes_connections_blocking_and_sends_nothing_until_they_publish():
    c = publisher()
    c.publish(1, "", "q", b"before")
    c.broker.alarms.set("memory", True)
    assert c.conn.throttle_state == "blocking"
    assert c.tick() == []  # RabbitMQ: no connection.blocked at the alarm, even to a past publisher
    assert not c.transport.reading_paused
    c.broker.alarms.set("memory", False)
    assert c.conn.throttle_state == "running"
    assert c.tick() == []


def test_a_publish_during_an_alarm_blocks_the_connection_and_is_held_until_it_clears():
    broker = Broker.with_defaults()
    c = publisher(broker)
    other = publisher(broker)
    broker.alarms.set("memory", True)
    with c.batch():
        c.publish(1, "", "q", b"m1")
        c.publish(1, "", "q", b"m2")
        c.send(1, commands.Queue.Declare(queue="after"))
    assert c.receive() == [BLOCKED_MEMORY]
    assert c.conn.throttle_state == "blocked" and c.conn.last_blocked_by == "resource"
    assert c.transport.reading_paused
    assert Reason.BLOCKED in c.conn.throttle.reasons
    # Nothing of it was handled: the first body waits, and so does everything after it.
    assert other.ready_count(1, "q") == 0
    assert "after" not in broker.vhosts["/"].queues
    assert c.tick() == []
    broker.alarms.set("memory", False)
    assert c.tick() == [UNBLOCKED, (1, "Queue.DeclareOk", "after", 0, 0)]
    assert not c.transport.reading_paused and c.conn.throttle.reasons == set()
    assert c.conn.throttle_state == "running" and c.conn.blocked_age() is not None
    assert other.drain(1, "q") == [(b"m1", False), (b"m2", False)]


def test_the_other_channels_of_a_blocked_connection_wait_too():
    c = publisher()
    c.open_channel(2)
    c.broker.alarms.set("disk", True)
    with c.batch():
        c.publish(1, "", "q", b"m")
        c.send(2, commands.Basic.Get(queue="q", no_ack=True))
    assert c.receive() == [(0, "Connection.Blocked", "low on disk")]
    c.broker.alarms.set("disk", False)
    assert c.tick() == [UNBLOCKED, GetOk(2, 1, b"m", 0)]


def test_input_arriving_while_blocked_waits_behind_the_held_publish():
    c = publisher()
    c.broker.alarms.set("memory", True)
    c.publish(1, "", "q", b"first")
    assert c.receive() == [BLOCKED_MEMORY]
    # Bytes the socket delivered before the pause took effect: queued behind, not handled.
    c.publish(1, "", "q", b"second")
    c.get(1, "q", no_ack=True)
    assert c.receive() == []
    c.broker.alarms.set("memory", False)
    assert c.tick() == [UNBLOCKED, GetOk(1, 1, b"first", 1)]
    assert c.drain(1) == [(b"second", False)]


def test_an_empty_body_completes_its_message_before_the_block_as_in_rabbitmq():
    c = publisher()
    other = publisher(c.broker)
    c.broker.alarms.set("memory", True)
    c.publish(1, "", "q", b"")
    assert c.receive() == [BLOCKED_MEMORY]
    assert other.ready_count(1) == 1


def test_a_second_alarm_sends_no_second_frame_and_clearing_one_of_two_keeps_it_blocked():
    c = publisher()
    alarms = c.broker.alarms
    alarms.set("memory", True)
    c.publish(1, "", "q", b"m")
    assert c.receive() == [BLOCKED_MEMORY]
    alarms.set("disk", True)
    assert c.tick() == []
    alarms.set("memory", False)
    assert c.tick() == []
    assert c.conn.throttle_state == "blocked" and c.transport.reading_paused
    alarms.set("disk", False)
    assert c.tick() == [UNBLOCKED]
    assert c.ready_count(1) == 1


def test_the_reason_names_every_alarm_on_when_it_blocks():
    c = publisher()
    c.broker.alarms.set("memory", True)
    c.broker.alarms.set("disk", True)
    c.publish(1, "", "q", b"m")
    assert c.receive() == [(0, "Connection.Blocked", "low on disk & memory")]


def test_a_client_without_the_capability_is_held_the_same_way_without_the_frames():
    c = publisher(capabilities={"consumer_cancel_notify": True})
    c.broker.alarms.set("memory", True)
    c.publish(1, "", "q", b"m")
    assert c.receive() == []
    assert c.conn.throttle_state == "blocked" and c.transport.reading_paused
    c.get(1, "q", no_ack=True)
    assert c.receive() == []
    c.broker.alarms.set("memory", False)
    assert c.tick() == [GetOk(1, 1, b"m", 0)]


def test_a_consumer_only_connection_keeps_working_during_an_alarm():
    broker = Broker.with_defaults()
    pub = publisher(broker)
    pub.fill(1, "q", [b"a", b"b"])
    cons = publisher(broker)
    broker.alarms.set("memory", True)
    assert cons.call(1, commands.Queue.Declare(queue="q2"))[0][1] == "Queue.DeclareOk"
    assert cons.call(1, commands.Basic.Get(queue="q")) == [GetOk(1, 1, b"a", 1)]
    cons.ack(1, 1)
    assert cons.call(1, commands.Basic.Consume(queue="q", consumer_tag="t")) == [ConsumeOk(1, "t"),
                                                                                 Deliver(1, "t", 2, b"b")]
    cons.ack(1, 2)
    assert cons.drain(1, "q2") == []
    assert cons.conn.throttle_state == "blocking" and not cons.transport.reading_paused
    # Deliveries to it go on while another connection is blocked.
    pub.publish(1, "", "q", b"held")
    assert pub.receive() == [BLOCKED_MEMORY]
    assert cons.tick() == []
    broker.alarms.set("memory", False)
    pub.tick()
    assert cons.tick() == [Deliver(1, "t", 3, b"held")]


def test_a_blocked_connection_is_blocked_again_by_its_next_publish_only():
    c = publisher()
    alarms = c.broker.alarms
    alarms.set("memory", True)
    c.publish(1, "", "q", b"1")
    assert c.receive() == [BLOCKED_MEMORY]
    alarms.set("memory", False)
    assert c.tick() == [UNBLOCKED]
    alarms.set("memory", True)
    assert c.tick() == []  # no frame at the alarm: RabbitMQ waits for the next publish
    c.publish(1, "", "q", b"2")
    assert c.receive() == [BLOCKED_MEMORY]


def test_an_alarm_raised_while_a_big_body_arrives_blocks_once_the_body_is_whole():
    """A body frame collected over reads (the sink path): it completes its message, then
    the connection blocks, as RabbitMQ's reader does after a content body frame."""
    c = publisher()
    other = publisher(c.broker)
    body = bytes(range(256)) * 64  # 16 KiB in one body frame
    raw = bytearray()
    c.send_bytes = raw.extend  # capture the bytes instead of sending them
    c.publish(1, "", "q", body)
    c.send(1, commands.Queue.Declare(queue="after2"))
    del c.send_bytes
    cut = len(raw) - 9000
    c.conn.data_received(bytes(raw[:cut - 4000]))  # method, header and part of the body
    c.broker.alarms.set("memory", True)
    c.conn.data_received(bytes(raw[cut - 4000:cut]))
    assert c.receive() == []
    c.conn.data_received(bytes(raw[cut:]))  # the rest of the body, then the declare
    assert c.receive() == [BLOCKED_MEMORY]
    assert other.drain(1) == [(body, False)]  # the message is complete and routed
    assert "after2" not in c.broker.vhosts["/"].queues
    c.broker.alarms.set("memory", False)
    assert c.tick() == [UNBLOCKED, (1, "Queue.DeclareOk", "after2", 0, 0)]


def test_closing_a_blocked_connection_reads_again_and_forgets_the_alarms():
    c = publisher()
    alarms = c.broker.alarms
    alarms.set("memory", True)
    c.publish(1, "", "q", b"m")
    assert c.receive() == [BLOCKED_MEMORY]
    c.conn.close()
    assert not c.transport.reading_paused
    assert c.conn._alarms_changed not in alarms._listeners


def test_another_nodes_alarm_blocks_publishers_here_and_the_reason_names_every_nodes():
    """On a cluster member: the other running members' alarms (broker.alarms.set_others, as
    warren.cluster.membership gives them) hold this node's publishers as its own do; the reason
    is over every node's resources (RabbitMQ: memory on one node, disk on another → "low on
    disk & memory"); this node's own alarms (iterating, `in`) stay its own."""
    broker = Broker.with_defaults()
    c, d = publisher(broker), publisher(broker)
    broker.alarms.set_others({"rabbit-a@host": ["memory"]})
    assert c.conn.throttle_state == "blocking" and list(broker.alarms) == [] and not broker.alarms
    c.publish(1, "", "q", b"m")
    assert c.receive() == [BLOCKED_MEMORY]
    broker.alarms.set("disk", True)
    d.publish(1, "", "q", b"m")
    assert d.receive() == [(0, "Connection.Blocked", "low on disk & memory")]
    assert broker.alarms.by_node("here@host") == [("here@host", "disk"), ("rabbit-a@host", "memory")]
    broker.alarms.set("disk", False)
    assert c.tick() == [] and d.tick() == []  # a's memory alarm still holds both
    broker.alarms.set_others({"rabbit-a@host": ["memory", "fd"], "rabbit-b@host": []})  # unknown: left out
    assert broker.alarms.others == {"rabbit-a@host": frozenset({"memory"})}
    broker.alarms.set_others({})  # a stopped running
    assert c.tick() == [UNBLOCKED] and d.tick() == [UNBLOCKED]
    assert c.ready_count(1, "q") == 2
