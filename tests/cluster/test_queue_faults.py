"""A classic queue on a cluster, under faults: a publisher with confirms through one node and
a consumer with manual acks through another, on a durable queue homed on a third, while each
of the three nodes is killed with -9 and restarted in turn; and the queue's home stopped
(SIGSTOP) while messages are published to it. Then the checker: every message confirmed and
not returned was consumed (lost: 0), nothing was consumed that was never published
(unexpected: 0), and a message was consumed twice only when its publish's confirm or a
delivery's ack was in doubt (its connection died, or its consumer was cancelled, first).

With WARREN_TEST_RABBITMQ_CLUSTER=1 the same runs against RabbitMQ 3.10 (members.py)."""

from __future__ import annotations

import collections
import signal
import threading
import time

import pika
import pika.exceptions

from .members import Member, wait_for

ERRORS = (pika.exceptions.AMQPError, OSError)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Publisher(threading.Thread):
    """Publishes p-0, p-1, ... to q through the default exchange, persistent and mandatory,
    each waiting for its confirm; after a failure it connects to the next of its nodes and
    publishes again the message whose confirm did not come."""

    def __init__(self, nodes: list[Member], pause: float = 0.005):
        super().__init__(daemon=True)
        self.nodes, self.pause = nodes, pause
        self.confirmed: set[str] = set()  # acked and not returned
        self.returned: set[str] = set()   # acked after a basic.return
        self.nacked: set[str] = set()
        self.sent: set[str] = set()
        self.in_doubt: set[str] = set()   # sent, then the connection failed before its confirm
        self.log: list[tuple[str, float, float, str]] = []  # (id, sent at, answered at, outcome)
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        n, turn, channel = 0, 0, None
        pending: str | None = None
        while not self.stopping.is_set():
            try:
                if channel is None:
                    node = self.nodes[turn % len(self.nodes)]
                    channel = node.connect(heartbeat=5, connection_attempts=1).channel()
                    channel.confirm_delivery()
                if pending is None:
                    pending, n = f"p-{n}", n + 1
                self.sent.add(pending)
                sent_at = time.monotonic()
                try:
                    channel.basic_publish("", "q", pending.encode(), PERSISTENT, mandatory=True)
                    self.confirmed.add(pending)
                    outcome = "confirmed"
                except pika.exceptions.UnroutableError:
                    self.returned.add(pending)
                    outcome = "returned"
                except pika.exceptions.NackError:
                    self.nacked.add(pending)
                    outcome = "nacked"
                self.log.append((pending, sent_at, time.monotonic(), outcome))
                pending = None
                time.sleep(self.pause)
            except ERRORS:
                self.failures += 1
                if pending is not None:
                    self.in_doubt.add(pending)
                _close(channel)
                channel, turn = None, turn + 1
                time.sleep(0.2)
        _close(channel)


class Consumer(threading.Thread):
    """Consumes q with manual acks (prefetch 50), acking each delivery at once; after a
    failure or a basic.cancel it consumes again, through the next of its nodes after a
    failure."""

    def __init__(self, nodes: list[Member]):
        super().__init__(daemon=True)
        self.nodes = nodes
        self.consumed: list[str] = []
        self.ack_in_doubt: set[str] = set()  # delivered to a consumer that failed or was cancelled after
        self.failures = 0
        self.cancels = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        turn, connection = 0, None
        while not self.stopping.is_set():
            delivered: list[str] = []
            cancelled: list[bool] = []
            try:
                if connection is None:
                    connection = self.nodes[turn % len(self.nodes)].connect(heartbeat=5, connection_attempts=1)
                channel = connection.channel()
                channel.basic_qos(prefetch_count=50)
                channel.add_on_cancel_callback(lambda frame: cancelled.append(True))

                def deliver(ch, method, props, body) -> None:
                    delivered.append(body.decode())
                    self.consumed.append(body.decode())
                    ch.basic_ack(method.delivery_tag)
                channel.basic_consume("q", deliver)
                while not cancelled and not self.stopping.is_set():
                    connection.process_data_events(time_limit=0.1)
                if cancelled:
                    self.cancels += 1
                    self.ack_in_doubt.update(delivered)
                    _close(channel)
                    time.sleep(0.2)
                else:
                    connection.close()
                    connection = None
            except pika.exceptions.ChannelClosedByBroker:  # 404 while the home is down: consume again
                self.ack_in_doubt.update(delivered)
                time.sleep(0.2)
            except ERRORS:
                self.failures += 1
                self.ack_in_doubt.update(delivered)
                _close(connection)
                connection, turn = None, turn + 1
                time.sleep(0.2)
        _close(connection)


def _close(thing) -> None:
    try:
        if thing is not None and thing.is_open:
            thing.close()
    except ERRORS:
        pass


def declare_q(home: Member) -> None:
    connection = home.connect()
    connection.channel().queue_declare("q", durable=True)
    connection.close()


def queue_back(member: Member) -> bool:
    try:
        connection = member.connect(connection_attempts=1)
    except ERRORS:
        return False
    try:
        connection.channel().queue_declare("q", passive=True)
        return True
    except ERRORS:
        return False
    finally:
        _close(connection)


def test_confirmed_messages_are_consumed_through_kills_of_every_node(members):
    a, b, c = members
    declare_q(a)
    publisher = Publisher([b, c])
    consumer = Consumer([c, b])
    publisher.start()
    consumer.start()
    time.sleep(3)
    c.kill()  # the consumer's node: it consumes through b
    time.sleep(2)
    c.restart()
    time.sleep(3)
    b.kill()  # the publisher's node (and now the consumer's): both go to c
    time.sleep(2)
    b.restart()
    time.sleep(3)
    a.kill()  # the queue's home: publishes are returned meanwhile
    time.sleep(4)
    a.restart()
    wait_for(lambda: queue_back(b), timeout=30, what="the queue back with its home")
    time.sleep(3)
    publisher.stopping.set()
    publisher.join(30)
    assert not publisher.is_alive()
    wait_for(lambda: publisher.confirmed <= set(consumer.consumed), timeout=20, what="the consumer to drain q")
    time.sleep(1)  # (any late duplicate)
    consumer.stopping.set()
    consumer.join(30)
    consumed = collections.Counter(consumer.consumed)
    lost = publisher.confirmed - set(consumed)
    unexpected = set(consumed) - publisher.sent
    duplicates = {m for m, times in consumed.items() if times > 1}
    in_doubt = publisher.in_doubt | consumer.ack_in_doubt
    unexplained = duplicates - in_doubt
    returned_yet_stored = (publisher.returned - publisher.in_doubt) & set(consumed)
    report = (f"sent {len(publisher.sent)}, confirmed {len(publisher.confirmed)}, returned {len(publisher.returned)}, "
              f"nacked {len(publisher.nacked)}, publish in doubt {len(publisher.in_doubt)}, consumed {len(consumed)}"
              f" ({len(consumer.consumed)} deliveries), duplicates {len(duplicates)} (all in doubt: "
              f"{not unexplained}), publisher failures {publisher.failures}, consumer failures "
              f"{consumer.failures}, cancels {consumer.cancels}")
    print(report)
    assert (len(lost), len(unexpected), len(unexplained), len(returned_yet_stored)) == (0, 0, 0, 0), (
        report, sorted(lost)[:20], sorted(unexpected)[:20], sorted(unexplained)[:20], sorted(returned_yet_stored)[:20])
    assert len(publisher.confirmed) > 200, report
    assert publisher.returned, report  # the home's downtime reached the publisher
    assert publisher.failures > 0 and consumer.failures > 0, report


def test_no_confirm_while_the_home_is_stopped_and_everything_confirmed_is_there(members):
    a, b, c = members
    declare_q(a)
    publisher = Publisher([b], pause=0.01)
    publisher.start()
    time.sleep(2)
    stopped_at = time.monotonic()
    a.signal(signal.SIGSTOP)
    time.sleep(8)
    resumed_at = time.monotonic()
    a.signal(signal.SIGCONT)
    time.sleep(2)
    publisher.stopping.set()
    publisher.join(30)
    assert not publisher.is_alive()
    # A message sent once the home was stopped is not confirmed (into the queue) until it resumed.
    early = [(m, sent - stopped_at, answered - stopped_at) for m, sent, answered, outcome in publisher.log
             if outcome == "confirmed" and sent > stopped_at + 0.05 and answered < resumed_at]
    assert early == []
    during = [m for m, sent, answered, _ in publisher.log if answered > stopped_at + 0.5 and sent < resumed_at]
    assert during, "a publish waited for the stopped home"
    connection = b.connect()
    channel = connection.channel()
    stored = []
    while True:
        method, _, body = channel.basic_get("q", auto_ack=True)
        if method is None:
            break
        stored.append(body.decode())
    connection.close()
    report = (f"sent {len(publisher.sent)}, confirmed {len(publisher.confirmed)}, returned "
              f"{len(publisher.returned)}, nacked {len(publisher.nacked)}, in doubt {len(publisher.in_doubt)}, "
              f"stored {len(stored)}, publisher failures {publisher.failures}")
    print(report)
    assert publisher.confirmed - set(stored) == set(), report
    assert set(stored) - publisher.sent == set(), report
    assert len(stored) == len(set(stored)), report
    assert len(publisher.confirmed) > 50, report
