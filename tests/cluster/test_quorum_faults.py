"""A replicated quorum queue under its leader's kill -9, round after round, with a publisher
confirming all the while (Jepsen's total-queue check, as in its RabbitMQ analysis): every
confirmed message is read back (lost 0), nothing is read that was never published
(unexpected 0), and a message read twice is one whose publish was not confirmed the first
time (duplicates only of unconfirmed publishes)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pika
import pytest
import requests

from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import wait_for
from .total_queue import AUTH, QQ, Batch, Consumer, Publisher, check, leader, publish_windows, read_all

ROUNDS = 20


def restart(make_node, nodes: list, victim, queue: str) -> None:
    """The stopped `victim` started again on its data, in its place in `nodes`, until every
    node shows the queue online on all of them."""
    nodes[nodes.index(victim)] = make_node(victim.name, data_dir=victim.data_dir, port=victim.port,
                                           dist_port=victim.dist_port)
    wait_for(lambda: all(sorted(requests.get(f"{node.api}/queues/%2F/{queue}", auth=AUTH, timeout=5)
                                .json().get("online", [])) == sorted(n.name for n in nodes) for node in nodes),
             timeout=30, what=f"{victim.name} back online")


def test_kill_9_of_the_leader_round_after_round_loses_nothing(three, make_node):  # noqa: F811
    nodes = list(three)
    connection = pika.BlockingConnection(nodes[0].pika_params())
    connection.channel().queue_declare("qq-torture", durable=True, arguments=QQ)
    connection.close()
    publisher = Publisher(nodes, "qq-torture")
    publisher.start()
    stalls = []
    try:
        for _ in range(ROUNDS):
            wait_for(lambda: len(publisher.confirmed) > 0 and time.monotonic() - publisher.last_confirm < 0.5,
                     timeout=30, what="confirms flowing")
            name = next(filter(None, (leader(node, "qq-torture") for node in nodes)))
            victim = next(node for node in nodes if node.name == name)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            killed = time.monotonic()
            try:
                wait_for(lambda: publisher.last_confirm > killed, timeout=30, what="a confirm after the kill")
            except AssertionError:
                for node in nodes:
                    if node is not victim:
                        print("=====", node.name, "\n", "\n".join(l for l in node.log().splitlines()
                                                               if "replica" in l or "leader" in l or "error" in l)[-3000:])
                raise
            stalls.append(publisher.last_confirm - killed)
            restart(make_node, nodes, victim, "qq-torture")
    finally:
        publisher.stop.set()
        publisher.join(30)
    outcome = check([publisher], read_all(nodes[0], "qq-torture"), at_least=ROUNDS * 10)
    print(f"{outcome}, stalls: "
          f"max {max(stalls):.1f} s, mean {sum(stalls) / len(stalls):.1f} s")


@pytest.mark.parametrize("fault", ["SIGTERM", "SIGKILL"])
def test_a_leader_stopped_under_its_own_consumer_hands_nothing_out_twice_as_new(three, make_node, fault):  # noqa: F811
    """Round after round, the leader stopped (SIGTERM) or killed (-9) while a consumer connected
    to it takes and acks messages as fast as they come: what it was handed before the stop and
    gets again says it is a redelivery. (A delivery leaves only once the entry recording it is
    committed: warren.session.gated_output. The stopping node closes its clients before its
    node links, so their last acks reach the followers; CI's rolling restart found it did not.)"""
    nodes = list(three)
    connection = pika.BlockingConnection(nodes[0].pika_params())
    connection.channel().queue_declare("qq-stopped", durable=True, arguments=QQ)
    connection.close()
    publisher = Publisher(nodes[1:], "qq-stopped")
    publisher.start()
    consumers = []
    try:
        for _ in range(3):
            wait_for(lambda: time.monotonic() - publisher.last_confirm < 0.5 and len(publisher.confirmed) > 100,
                     timeout=30, what="confirms flowing")
            name = next(filter(None, (leader(node, "qq-stopped") for node in nodes)))
            victim = next(node for node in nodes if node.name == name)
            consumer = Consumer([victim], "qq-stopped", prefetch=200)
            consumers.append(consumer)
            consumer.start()
            wait_for(lambda: sum(consumer.got.values()) > 300, timeout=30, what="the consumer taking messages")
            victim.proc.send_signal(getattr(signal, fault))
            assert victim.proc.wait(20) == (0 if fault == "SIGTERM" else -signal.SIGKILL), victim.log()[-3000:]
            consumer.finish()
            restart(make_node, nodes, victim, "qq-stopped")
    finally:
        publisher.finish()
        for consumer in consumers:
            consumer.finish()
    outcome = check([publisher], read_all(nodes[0], "qq-stopped"), consumers=tuple(consumers), at_least=300)
    print(f"{outcome}; {sum(sum(c.redelivered.values()) for c in consumers)} redelivered to the consumers")


def test_a_leader_paused_past_its_lease_sends_its_clients_publishes_to_the_next(three):  # noqa: F811
    """SIGSTOP of the leader for longer than its lease: another member leads meanwhile; a
    publish the paused leader reads once it runs again, whether its log took it before it
    learnt of its successor or not, is sent to the new leader and confirmed, and is in the
    queue once (RabbitMQ's quorum queue client resends its pending publishes to the next
    leader; never confirmed and missing, never nacked)."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    channel = connection.channel()
    channel.queue_declare("qq-paused", durable=True, arguments=QQ)
    channel.confirm_delivery()
    channel.basic_publish("", "qq-paused", b"before", pika.BasicProperties(delivery_mode=2))
    outcome: list[str] = []

    def publish_while_paused() -> None:
        try:
            channel.basic_publish("", "qq-paused", b"while-paused", pika.BasicProperties(delivery_mode=2))
            outcome.append("confirmed")
        except pika.exceptions.NackError:
            outcome.append("nacked")
        except Exception as err:  # (its connection closed: not confirmed)
            outcome.append(f"closed: {err!r}")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        publisher = threading.Thread(target=publish_while_paused, daemon=True)
        publisher.start()
        wait_for(lambda: leader(b, "qq-paused") not in (None, a.name), timeout=20, what="another leader")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    publisher.join(30)
    assert outcome, "the publish was never answered"
    print("outcome:", outcome)
    got = []
    reader = pika.BlockingConnection(b.pika_params())
    while True:
        method, _, body = reader.channel().basic_get("qq-paused", auto_ack=True)
        if method is None:
            break
        got.append(body)
    reader.close()
    assert outcome == ["confirmed"]
    assert sorted(got) == [b"before", b"while-paused"]


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_publishes_in_flight_at_the_leaders_fault_are_confirmed_by_the_next(three, fault):  # noqa: F811
    """SIGKILL: a publisher with confirms on a node that does not lead the queue, the leader
    killed (-9); SIGSTOP: a publisher on the leader's own node, the leader paused past its
    lease (another member leads meanwhile) and let run again. Either way, what the publisher
    had not had confirmed (in the old leader's log or not) is sent to the new leader, which
    takes only what its log lacks: every publish is confirmed, none nacked, and each message is
    in the queue once (as on RabbitMQ, whose quorum queue client resends to a new leader)."""
    a, b, c = three
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-resent", durable=True, arguments=QQ)
    connection.close()
    assert leader(c, "qq-resent") == a.name
    batch = Batch()
    total = 20_000

    async def fault_after(count: int) -> None:
        while len(batch.confirmed) < count:
            await asyncio.sleep(0.01)
        a.proc.send_signal(getattr(signal, fault))
        if fault == "SIGSTOP":
            try:
                deadline = time.monotonic() + 20
                while leader(c, "qq-resent") in (None, a.name):
                    assert time.monotonic() < deadline, "no other leader"
                    await asyncio.sleep(0.2)
            finally:
                a.proc.send_signal(signal.SIGCONT)

    async def publish_through_the_fault() -> None:
        faulted = asyncio.ensure_future(fault_after(3000))
        await publish_windows((c if fault == "SIGKILL" else a).url, "qq-resent", range(total), batch, window=500)
        await faulted
    asyncio.run(publish_through_the_fault())
    if fault == "SIGKILL":
        a.proc.wait()
    assert leader(c, "qq-resent") != a.name
    assert len(batch.confirmed) == total, f"{total - len(batch.confirmed)} publishes not confirmed"
    outcome = check([batch], read_all(c, "qq-resent"), at_least=total)
    assert outcome.duplicated == 0, outcome
    print(outcome)
