"""Queue credit (warren.broker.queue_flow): a publisher into a queue whose consumers have
credit but take less than it sends is not read until they have taken the backlog down, and
is never held by consumers that stopped taking (no credit, or nothing taken for a check
interval), by a queue it consumes from itself, or by a deleted queue. State `flow`, as
RabbitMQ shows credit flow; no connection.blocked."""

import pytest
from pamqp import commands

from warren.broker import queue_flow
from warren.amqp.message import Message
from warren.broker.broker import Broker
from warren.session.throttle import Reason

from .fake_transport import Client, ManualScheduler, Method

MIB = 1 << 20
OVER = [bytes([i]) * MIB for i in range(queue_flow.FLOW_HIGH // MIB + 1)]  # just past the mark


@pytest.fixture
def scheduler():
    return ManualScheduler()


@pytest.fixture
def broker(scheduler):
    broker = Broker.with_defaults()
    broker.set_scheduler(scheduler)
    return broker


def client(broker, queue="q") -> Client:
    c = Client(broker)
    c.open_channel(1)
    c.declare(1, queue)
    return c


def stalled_consumer(broker, no_ack=True, prefetch=0) -> Client:
    """A consumer of q whose socket is full: it has credit (unless prefetch says otherwise)
    but takes nothing until the test resumes its writing."""
    c = client(broker)
    if prefetch:
        c.qos(1, prefetch)
        c.receive()
    c.consume(1, "c", no_ack=no_ack)
    assert c.receive() == [Method(1, "Basic.ConsumeOk", "c")]
    c.conn.pause_writing()
    return c


def held(pub: Client) -> bool:
    return pub.transport.reading_paused and Reason.QUEUE_FLOW in pub.conn.throttle.reasons


def test_held_while_the_consumers_take_less_then_let_go(broker):
    cons = stalled_consumer(broker)
    pub = client(broker)
    pub.fill(1, "q", OVER[:-1])  # at the mark, not past it
    assert not held(pub)
    pub.fill(1, "q", OVER[-1:])
    assert held(pub) and pub.conn.throttle_state == "flow" and pub.conn.last_blocked_by == "flow"
    assert pub.conn.blocked_age() == 0.0
    cons.conn.resume_writing()  # the consumer takes: about 1 MiB a tick
    bodies = [f[-1] for f in cons.receive()]
    while held(pub):
        assert bodies, "the consumer stopped taking while the publisher was held"
        new = [f[-1] for f in cons.tick()]
        bodies += new
    queue = broker.vhosts["/"].queues["q"]
    assert queue.store.ready_bytes <= queue_flow.FLOW_LOW
    assert not pub.transport.reading_paused and pub.conn.throttle_state == "flow"  # shown for a while
    assert pub.receive() == []  # no connection.blocked / unblocked
    while queue.message_count:
        bodies += [f[-1] for f in cons.tick()]
    assert bodies == OVER


def test_consumers_without_credit_hold_nobody(broker):
    """Consumers with their prefetch full are the bottleneck: the queue buffers for them."""
    cons = client(broker)
    cons.qos(1, 1)
    cons.receive()
    cons.consume(1, "c")
    cons.receive()
    pub = client(broker)
    pub.fill(1, "q", OVER)
    assert cons.tick()[-1][-1] == OVER[0]  # one unacked delivery: no credit left
    pub.fill(1, "q", OVER)
    assert not held(pub) and pub.conn.throttle_state == "running"


def test_a_consumer_that_takes_nothing_lets_go_after_a_check(broker, scheduler):
    cons = stalled_consumer(broker)
    pub = client(broker)
    pub.fill(1, "q", OVER)
    assert held(pub)
    scheduler.advance(queue_flow.CHECK_INTERVAL)  # nothing taken since the hold
    assert not held(pub) and not pub.transport.reading_paused
    pub.fill(1, "q", OVER)
    assert not held(pub)  # not again while it takes nothing
    cons.conn.resume_writing()
    cons.receive()  # it takes again: the next publish holds the publisher again
    cons.conn.pause_writing()
    pub.fill(1, "q", [b"x"])
    assert held(pub)


def test_progress_keeps_holding(broker, scheduler):
    cons = stalled_consumer(broker)
    pub = client(broker)
    pub.fill(1, "q", OVER * 2)
    assert held(pub)
    cons.conn.resume_writing()
    cons.receive()  # a tick's worth taken, far from the low mark
    cons.conn.pause_writing()
    scheduler.advance(queue_flow.CHECK_INTERVAL)
    assert held(pub)  # progress since the last check
    scheduler.advance(queue_flow.CHECK_INTERVAL)
    assert not held(pub)  # none since


def test_a_publisher_that_consumes_from_the_queue_is_not_held(broker):
    pub = client(broker)
    pub.consume(1, "own", no_ack=True)
    pub.receive()
    pub.conn.pause_writing()
    pub.fill(1, "q", OVER)
    assert Reason.QUEUE_FLOW not in pub.conn.throttle.reasons


def test_deleting_the_queue_or_its_last_consumer_lets_go(broker):
    cons = stalled_consumer(broker)
    pub = client(broker)
    pub.fill(1, "q", OVER)
    assert held(pub)
    cons.send(1, commands.Basic.Cancel(consumer_tag="c"))  # (read, in this fake, though paused)
    assert not held(pub)
    cons.consume(1, "c2", no_ack=True)
    pub.fill(1, "q", [b"x"])
    assert held(pub)
    other = client(broker, "other")
    other.send(1, commands.Queue.Delete(queue="q"))
    assert not held(pub)


def test_closing_while_held_forgets_the_hold(broker):
    stalled_consumer(broker)
    pub = client(broker)
    pub.fill(1, "q", OVER)
    credit = broker.vhosts["/"].queues["q"].credit
    assert held(pub) and pub.conn in credit.held
    pub.conn.connection_lost()
    assert pub.conn not in credit.held and not pub.conn.flow_credits


def test_an_http_publish_that_presses_holds_no_connection(broker):
    """A press outside any connection's read (the management API's publish, a timer's
    dead-lettering) is forgotten before the next read: only the reader's own presses count."""
    stalled_consumer(broker)
    queue = broker.vhosts["/"].queues["q"]
    for body in OVER:
        queue.publish(Message("", "q", b"", b"", body))
    assert broker.queue_flow.pressed == {queue}
    pub = client(broker, "elsewhere")
    pub.fill(1, "elsewhere", [b"x"])
    assert not held(pub) and not broker.queue_flow.pressed
