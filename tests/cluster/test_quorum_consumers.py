"""A quorum queue's consumers outlive its leader, as on RabbitMQ 3.10 (a node-down leader:
consumers on the surviving nodes are not cancelled, get no redelivery of what they hold,
ack it to the new leader and go on consuming; what the dead node's consumers held comes back
redelivered). Both kinds of survivor: one on the node elected next (its consumers become the
queue's own there) and one on the third node (it re-attaches over the link to the new leader)."""

from __future__ import annotations

import signal
import time

import pika

from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import wait_for
from .total_queue import leader

QQ = {"x-queue-type": "quorum"}
TOTAL = 120
PREFETCH = 5


class Consumer:
    """A pika consumer holding what it gets until told to ack; it records cancels."""

    def __init__(self, node, queue: str):
        self.connection = pika.BlockingConnection(node.pika_params(heartbeat=0))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=PREFETCH)
        self.held: list[tuple[int, bytes, bool]] = []  # (delivery tag, body, redelivered)
        self.acked: list[bytes] = []
        self.cancelled = False
        self.channel.add_on_cancel_callback(lambda frame: setattr(self, "cancelled", True))
        self.channel.basic_consume(queue, self._got)

    def _got(self, channel, method, properties, body) -> None:
        self.held.append((method.delivery_tag, body, method.redelivered))

    def pump(self, seconds: float = 0.05) -> None:
        self.connection.process_data_events(time_limit=seconds)

    def ack_all(self) -> None:
        for tag, body, _ in self.held:
            self.channel.basic_ack(tag)
            self.acked.append(body)
        self.held.clear()


def test_consumers_on_surviving_nodes_keep_what_they_hold_and_go_on(three):  # noqa: F811
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-consumers", durable=True, arguments=QQ)
    channel.confirm_delivery()
    for n in range(TOTAL):
        channel.basic_publish("", "qq-consumers", f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    assert leader(b, "qq-consumers") == a.name
    on = {node.name: Consumer(node, "qq-consumers") for node in (a, b, c)}
    wait_for(lambda: [x.pump() for x in on.values()] and all(len(x.held) == PREFETCH for x in on.values()),
             timeout=10, what="each consumer holding its prefetch")
    held_by_survivors = {body for node in (b, c) for _, body, _ in on[node.name].held}
    held_by_the_dead = {body for _, body, _ in on[a.name].held}

    a.proc.send_signal(signal.SIGKILL)
    survivors = [on[b.name], on[c.name]]
    wait_for(lambda: [x.pump() for x in survivors] and leader(c, "qq-consumers") == b.name, timeout=20,
             what="b elected")
    for x in survivors:  # (time for the new leader to hear from the third node)
        x.pump(0.5)
    assert not any(x.cancelled for x in survivors)
    assert all(len(x.held) == PREFETCH for x in survivors), "a survivor got more than its prefetch: not held"
    for x in survivors:
        x.ack_all()

    deadline = time.monotonic() + 30
    while sum(len(x.acked) for x in survivors) < TOTAL and time.monotonic() < deadline:
        for x in survivors:
            x.pump()
            x.ack_all()
    acked = [body for x in survivors for body in x.acked]
    assert not any(x.cancelled for x in survivors)
    assert sorted(acked) == sorted(f"m{n}".encode() for n in range(TOTAL)), "lost or duplicated"
    redelivered = {body for x in survivors for body in x.acked if body in held_by_the_dead}
    assert redelivered == held_by_the_dead
    assert held_by_survivors.isdisjoint(held_by_the_dead)
    # Nothing left behind: empty, nothing unacked, on every running node's view.
    for x in survivors:
        x.pump(0.3)
        assert not x.held
    probe = pika.BlockingConnection(c.pika_params())
    assert probe.channel().queue_declare("qq-consumers", passive=True).method.message_count == 0
    probe.close()
    for x in survivors:
        x.connection.close()


def test_a_deposed_leaders_own_consumers_follow_the_queue(three):  # noqa: F811
    """The leader paused past its lease (SIGSTOP) is replaced; back (SIGCONT), it follows,
    and its consumers, not cancelled, are served by the new leader."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-deposed", durable=True, arguments=QQ)
    connection.close()
    on_a = Consumer(a, "qq-deposed")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: leader(c, "qq-deposed") == b.name, timeout=20, what="b elected")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: on_a.pump() or leader(a, "qq-deposed") == b.name, timeout=20, what="a following")
    publisher = pika.BlockingConnection(c.pika_params())
    out = publisher.channel()
    out.confirm_delivery()
    for n in range(3):
        out.basic_publish("", "qq-deposed", f"after-{n}".encode(), pika.BasicProperties(delivery_mode=2))
    publisher.close()
    wait_for(lambda: on_a.pump() or len(on_a.held) == 3, timeout=10, what="a's consumer served by b")
    assert not on_a.cancelled
    assert [body for _, body, _ in on_a.held] == [b"after-0", b"after-1", b"after-2"]
    on_a.ack_all()
    on_a.pump(0.3)
    probe = pika.BlockingConnection(b.pika_params())
    assert probe.channel().queue_declare("qq-deposed", passive=True).method.message_count == 0
    probe.close()
    on_a.connection.close()
