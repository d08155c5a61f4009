"""A replicated stream under kill -9 (and SIGSTOP) of its leader, as RabbitMQ 3.10 goes
through it: the surviving replicas elect a new leader at once, publishes through a surviving node go on being
confirmed (RabbitMQ sends what was in flight again to the new leader), consumers on the
surviving nodes are not cancelled and read on. Jepsen's total-queue check (total_queue.py) over
a few rounds of kills: every confirmed message is in the stream (lost 0), nothing is there that
was never published, a message is there twice only if its first publish was not confirmed (a
publisher's retry through another node), and every node holds the same message at each offset.

The same tests run against a RabbitMQ 3.10 cluster with WARREN_TEST_RABBITMQ_CLUSTER=1
(members.py); every case was checked there."""

from __future__ import annotations

import collections
import signal
import threading
import time

import pika
import pika.exceptions
import pytest

from .members import RABBITMQ, Member, all_running, wait_for
from .test_stream_replication import declare, placement, publish, read, shown  # noqa: F401  (the fixture)
from .total_queue import Publisher, check

ROUNDS = 3


def leader(members: list[Member], name: str) -> Member:
    """The member that leads the stream: the API's `node` (through the first member that shows
    the stream)."""
    led = next(filter(None, (shown(member, name).get("node") for member in members)))
    return next(member for member in members if member.name == led)


def first_confirm_after(publisher: Publisher, moment: float) -> float:
    """Seconds from `moment` (monotonic) to the publisher's first confirm after it."""
    return min(t for t in list(publisher.confirm_times) if t > moment) - moment


class Reader(threading.Thread):
    """read() of a stream through one member, up to the body b"end", in a thread; keeps what it
    read (`got`), the server's basic.cancel frames (`cancels`) or its error."""

    def __init__(self, member: Member, stream: str):
        super().__init__(daemon=True)
        self.member, self.stream = member, stream
        self.got: list[tuple[int, bytes]] = []
        self.cancels: list = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.got = read(self.member, self.stream, b"end", timeout=90, cancels=self.cancels)
        except BaseException as err:  # (reported by the test)
            self.error = err


def ids(got: list[tuple[int, bytes]]) -> collections.Counter[int]:
    """The publisher's message ids read (all but the closing b"end"), with how often."""
    return collections.Counter(int(body) for _, body in got if body != b"end")


def test_kill_9_of_the_stream_leader_round_after_round_loses_nothing(members, declare):  # noqa: F811
    """Round after round the leader is killed (-9) while a publisher confirms through the
    nodes that answer, and restarted; then every node's stream, read from "first", holds the
    same messages at the same offsets 0, 1, ..., every confirmed one among them. (The kills
    start once the API shows the stream's three members: RabbitMQ 3.10's node killed within a
    moment of the stream coordinator's start comes back without its coordinator member: the
    next leader's kill then leaves the coordinator without a majority, nothing is confirmed
    for 30 s, until a publish is closed with 506 "RESOURCE_ERROR - Stream coordinator
    unavailable for queue ..." and the coordinator's cluster is started again.)"""
    declare(members[0], "sq-torture")
    names = sorted(member.name for member in members)
    assert placement(members[0], "sq-torture") == (members[0].name, names, names)
    publisher = Publisher(list(members), "sq-torture")
    publisher.start()
    stalls = []
    try:
        for _ in range(ROUNDS):
            wait_for(lambda: publisher.confirmed and time.monotonic() - publisher.last_confirm < 0.5,
                     timeout=30, what="confirms flowing")
            victim = leader(members, "sq-torture")
            victim.kill()
            killed = time.monotonic()
            try:
                wait_for(lambda: publisher.last_confirm > killed, timeout=30, what=f"a confirm after {victim.name}'s kill")
                stalls.append(first_confirm_after(publisher, killed))
            except AssertionError as stalled:
                raise AssertionError(f"{stalled}; the publisher's last failures: {publisher.failures[-3:]}") from None
            finally:
                victim.restart()
            all_running(members)
            deadline = time.monotonic() + 60
            while sorted((last := shown(victim, "sq-torture")).get("online", [])) != names:
                assert time.monotonic() < deadline, (  # (its log's end: why, for a failure seen only under load)
                    f"{victim.name} not back online in the stream: {last}\n"
                    + "\n".join(victim.log().splitlines()[-60:]))
                time.sleep(0.1)
    finally:
        publisher.finish()
    publish(members[1], "sq-torture", [b"end"])
    reads = {member.name: read(member, "sq-torture", b"end", timeout=60) for member in members}
    first = reads[members[0].name]
    for name, got in reads.items():
        assert [offset for offset, _ in got] == list(range(len(got))), f"{name}'s offsets have gaps"
        assert got == first, f"{name} holds other messages at some offsets than {members[0].name}"
    outcome = check([publisher], ids(first), at_least=100)
    print(f"{outcome}, stalls: {', '.join(f'{stall:.2f}' for stall in stalls)} s, "
          f"publisher failures {len(publisher.failures)}")


def test_consumers_on_the_surviving_nodes_read_on_through_the_leaders_death(members, declare):  # noqa: F811
    """kill -9 of the leader a while consumers on b and c read the stream from "first" and a
    publisher confirms through c: RabbitMQ cancels neither consumer; a new leader (b or c) is
    elected at once, c sends the publishes it had in flight to it (the publisher sees no nack
    and no closed channel: its next confirm comes within a second), and both consumers read
    on: every confirmed message, before and after the kill, once, at the same offsets. (Warren
    nacks the publishes in flight to the dead leader instead: never a false confirm, but a
    difference, docs/clustering.md.)"""
    a, b, c = members
    declare(a, "sq-reading-on")
    readers = [Reader(member, "sq-reading-on") for member in (b, c)]
    for reader in readers:
        reader.start()
    publisher = Publisher([c], "sq-reading-on")
    publisher.start()
    try:
        wait_for(lambda: len(publisher.confirmed) >= 50, timeout=30, what="confirms before the kill")
        a.kill()
        killed = time.monotonic()
        wait_for(lambda: publisher.last_confirm > killed, timeout=10, what="a confirm after the leader's kill")
        stall = first_confirm_after(publisher, killed)
        wait_for(lambda: publisher.confirms_between(killed, float("inf")) >= 100, timeout=30,
                 what="confirms after the kill")
    finally:
        publisher.finish()
    if RABBITMQ:
        assert publisher.failures == []
    else:  # (Warren nacks what was in flight to the dead leader, and the publisher sends it again)
        assert all("NackError" in why for _, why in publisher.failures), publisher.failures
    assert leader([b, c], "sq-reading-on") in (b, c)
    publish(c, "sq-reading-on", [b"end"])
    for reader in readers:
        reader.join(120)
    for reader in readers:
        assert (reader.error, reader.cancels) == (None, []), reader.member.name
        assert [offset for offset, _ in reader.got] == list(range(len(reader.got))), reader.member.name
        check([publisher], ids(reader.got), at_least=150)
    assert readers[0].got == readers[1].got
    print(f"first confirm {stall:.2f} s after the kill; {len(publisher.confirmed)} confirmed, "
          f"{len(readers[0].got)} read on each")


@pytest.mark.skipif(RABBITMQ, reason="RabbitMQ sees a paused node only after its net_ticktime (60 s)")
def test_a_leader_paused_past_its_lease_confirms_nothing_its_successor_lacks(members, declare):  # noqa: F811
    """SIGSTOP of the stream's leader for longer than its lease (5 s): another member leads and
    confirms meanwhile; a publish the paused leader reads once it runs again is either confirmed
    and in the stream, or nacked (or its connection closed): never confirmed and missing; and
    every replica then holds the same messages at the same offsets."""
    a, b, c = members
    declare(a, "sq-paused")
    publish(a, "sq-paused", [b"before"])
    connection = a.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    outcome: list[str] = []

    def publish_while_paused() -> None:
        try:
            channel.basic_publish("", "sq-paused", b"while-paused")
            outcome.append("confirmed")
        except pika.exceptions.NackError:
            outcome.append("nacked")
        except Exception as err:  # (its connection closed: not confirmed)
            outcome.append(f"closed: {err!r}")
    a.signal(signal.SIGSTOP)
    try:
        thread = threading.Thread(target=publish_while_paused, daemon=True)
        thread.start()
        wait_for(lambda: shown(b, "sq-paused").get("node") not in (None, a.name), timeout=20, what="another leader")
        publish(b, "sq-paused", [b"while-a-paused"])
    finally:
        a.signal(signal.SIGCONT)
    thread.join(30)
    assert outcome, "the publish was never answered"
    publish(c, "sq-paused", [b"end"])
    reads = {member.name: read(member, "sq-paused", b"end", timeout=30) for member in members}
    first = reads[a.name]
    assert all(got == first for got in reads.values()), reads
    bodies = [body for _, body in first]
    assert [offset for offset, _ in first] == list(range(len(first)))
    assert b"before" in bodies and b"while-a-paused" in bodies
    if outcome[0] == "confirmed":
        assert b"while-paused" in bodies, "confirmed by the paused leader, and not in the stream"
    print("outcome:", outcome, bodies)
    if connection.is_open:
        connection.close()
