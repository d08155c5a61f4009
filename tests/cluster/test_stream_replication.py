"""Streams (x-queue-type=stream) replicated over a cluster of three nodes a, b, c, as RabbitMQ
3.10 runs them (rabbit_stream_queue on osiris): a stream has a replica on every node unless
x-initial-cluster-size says fewer, its leader is the declaring node (client-local), and it is
used through any node: a publish through any node, a member or not, is confirmed once the
stream holds it, and a consumer from "first" on any replica reads the same messages at the same
offsets. A consumer needs a replica on its own node (RabbitMQ reads the local log); a follower
that was down catches up once it is back.

The same tests run against a RabbitMQ 3.10 cluster with WARREN_TEST_RABBITMQ_CLUSTER=1
(members.py); every case was checked there."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
import requests

from .members import AUTH, Member, wait_for

STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def declare(members):
    """declare(member, name, size=None) declares a durable stream through `member` (with
    x-initial-cluster-size `size`, if given); the test's streams are deleted at its end
    (RabbitMQ's cluster lives for the session, and the members fixture forgets only conftest's
    QUEUE_NAMES), through whichever member answers."""
    names: list[str] = []

    def make(member: Member, name: str, size: int | None = None) -> str:
        names.append(name)
        arguments = {**STREAM, **({"x-initial-cluster-size": size} if size is not None else {})}
        connection = member.connect()
        connection.channel().queue_declare(name, durable=True, arguments=arguments)
        connection.close()
        return name

    yield make
    for member in members:
        try:
            connection = member.connect(connection_attempts=1)
        except pika.exceptions.AMQPError:
            continue
        for name in names:
            connection.channel().queue_delete(name)
        connection.close()
        return


def publish(member: Member, name: str, bodies: list[bytes]) -> None:
    """Each body through `member`, confirmed before the next (so offsets follow the order)."""
    connection = member.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", name, body, mandatory=True)
    connection.close()


def read(member: Member, name: str, last: bytes, timeout: float = 30,
         cancels: list | None = None) -> list[tuple[int, bytes]]:
    """The stream from its first offset through `member` up to the delivery of body `last`, as
    (x-stream-offset header, body) pairs: a consumer (prefetch 500, acking each delivery). A
    basic.cancel from the server ends it early (appended to `cancels`). A follower whose
    replica has not started yet (a moment after the declare-ok, or after its node's restart)
    refuses the consumer as a node without a replica does (RabbitMQ: 406): it consumes again."""
    cancels = [] if cancels is None else cancels
    deadline = time.monotonic() + timeout
    connection = member.connect()
    try:
        got: list[tuple[int, bytes]] = []

        def deliver(ch, method, properties, body) -> None:
            got.append((properties.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)
        while True:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            channel.add_on_cancel_callback(cancels.append)
            try:
                channel.basic_consume(name, deliver, arguments={"x-stream-offset": "first"})
                break
            except pika.exceptions.ChannelClosedByBroker as closed:
                if (closed.reply_code, closed.reply_text) != no_replica(name) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        while not cancels and (not got or got[-1][1] != last):
            assert time.monotonic() < deadline, f"{member.name} read {len(got)} of {name}, not up to {last!r}"
            connection.process_data_events(time_limit=0.1)
        return got
    finally:
        if connection.is_open:
            connection.close()


def shown(member: Member, name: str) -> dict:
    """The stream as `member`'s HTTP API shows it ({} when it does not)."""
    answer = requests.get(f"{member.api}/queues/%2F/{name}", auth=AUTH, timeout=10)
    return answer.json() if answer.ok else {}


def placement(member: Member, name: str) -> tuple[str, list[str], list[str]]:
    """(node, sorted members, sorted online) of the API once it lists the members: RabbitMQ
    takes `members` and `online` from statistics emitted every 5 s, so a new stream (or a node
    back) shows them a few seconds late; `node` is the leader's node at once."""
    def listed() -> dict | None:
        answer = shown(member, name)
        return answer if answer.get("members") else None
    answer = wait_for(listed, timeout=20, what=f"{member.name}'s API to list the members of {name}")
    return answer["node"], sorted(answer["members"]), sorted(answer["online"])


def consume_refusal(member: Member, name: str) -> tuple[int, str] | None:
    """basic.consume from "first" through `member`: the channel's close, or None."""
    connection = member.connect()
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(name, lambda *delivery: None, arguments={"x-stream-offset": "first"})
        connection.process_data_events(time_limit=0.5)
        return None
    except pika.exceptions.ChannelClosedByBroker as closed:
        assert connection.is_open, "the connection was closed, not the channel"
        return closed.reply_code, closed.reply_text
    finally:
        if connection.is_open:
            connection.close()


def no_replica(name: str) -> tuple[int, str]:
    """RabbitMQ's refusal of a consumer on a node without a replica (its rs() of the queue,
    quoted again)."""
    return 406, f"PRECONDITION_FAILED - queue 'queue '{name}' in vhost '/'' does not have a replica on the local node"


def test_a_stream_declared_through_one_node_reads_the_same_through_every_node(members, declare):
    """Publishes through the leader and through both followers, each confirmed before the next,
    take the offsets 0, 1, ... in that order; a consumer from "first" on every node reads the
    same (offset, body) sequence: every delivery's x-stream-offset is the message's offset in
    the one log."""
    a, b, c = members
    declare(a, "sq-everywhere")
    bodies = [f"{member.name}-{n}".encode() for member in (a, b, c) for n in range(10)]
    for member in (a, b, c):
        publish(member, "sq-everywhere", [body for body in bodies if body.startswith(member.name.encode())])
    expected = list(enumerate(bodies))
    for member in (a, b, c):
        assert read(member, "sq-everywhere", bodies[-1]) == expected, member.name


def test_declare_ok_counts_the_leaders_messages_through_every_node(members, declare):
    """queue.declare-ok's message_count is the leader's count (RabbitMQ asks the leader's node
    for it, from statistics refreshed every 5 s: 0 right after the publishes, then all), the
    same through the leader and the followers, passive or not; consumer_count is 0."""
    a, b, c = members
    declare(a, "sq-counted")
    publish(a, "sq-counted", [str(n).encode() for n in range(25)])

    def counts(member: Member) -> list[tuple[int, int]]:
        connection = member.connect()
        channel = connection.channel()
        passive = channel.queue_declare("sq-counted", passive=True).method
        active = channel.queue_declare("sq-counted", durable=True, arguments=STREAM).method
        connection.close()
        return [(passive.message_count, passive.consumer_count), (active.message_count, active.consumer_count)]
    for member in (b, c, a):
        wait_for(lambda: counts(member) == [(25, 0), (25, 0)], timeout=15, what=f"25 messages through {member.name}")


def test_the_api_shows_the_declaring_node_as_node_and_every_member(members, declare):
    """Without x-initial-cluster-size a stream has a replica on each of the three nodes, led by
    the one whose connection declared it: the API (through every node) shows it as `node`, the
    three as `members` and `online`, and no `leader` field (a quorum queue's)."""
    a, b, c = members
    names = sorted(member.name for member in members)
    declare(a, "sq-shown-a")
    declare(c, "sq-shown-c")
    for member in (a, b, c):
        assert placement(member, "sq-shown-a") == (a.name, names, names), member.name
        assert placement(member, "sq-shown-c") == (c.name, names, names), member.name
        answer = shown(member, "sq-shown-a")
        assert (answer["type"], answer["state"], "leader" in answer) == ("stream", "running", False), answer


def test_a_consumer_through_a_node_without_a_replica_is_refused(members, declare):
    """x-initial-cluster-size 1: the stream lives on the declaring node alone. Publishes through
    the other nodes are confirmed and read on the member; a consumer through another node is
    refused with a channel error (406: RabbitMQ reads a stream from the local replica only)."""
    a, b, c = members
    declare(a, "sq-alone", size=1)
    assert placement(b, "sq-alone") == (a.name, [a.name], [a.name])
    publish(b, "sq-alone", [b"through-b"])
    publish(c, "sq-alone", [b"through-c"])
    for member in (b, c):
        assert consume_refusal(member, "sq-alone") == no_replica("sq-alone"), member.name
    assert read(a, "sq-alone", b"through-c") == [(0, b"through-b"), (1, b"through-c")]


def test_an_initial_cluster_size_of_two_places_the_declarer_and_the_least_loaded_node(members, declare):
    """x-initial-cluster-size 2: the declaring node (which leads) and the other node holding the
    fewest stream replicas. With a one-replica stream on b, a two-replica stream declared
    through a lives on a and c; a consumer through b is refused."""
    a, b, c = members
    declare(b, "sq-on-b", size=1)
    declare(a, "sq-pair", size=2)
    assert placement(b, "sq-pair") == (a.name, sorted([a.name, c.name]), sorted([a.name, c.name]))
    publish(b, "sq-pair", [b"m"])
    assert read(c, "sq-pair", b"m") == [(0, b"m")]
    assert consume_refusal(b, "sq-pair") == no_replica("sq-pair")


def test_a_follower_killed_meanwhile_catches_up_after_its_restart(members, declare):
    """kill -9 of a follower: the API still lists it among the members, not among the online
    ones; publishes go on being confirmed by the two others; once it is back, a consumer from
    "first" on it reads everything, at the leader's offsets."""
    a, b, c = members
    names = sorted(member.name for member in members)
    declare(a, "sq-catch-up")
    before = [f"before-{n}".encode() for n in range(10)]
    publish(a, "sq-catch-up", before)
    c.kill()
    try:
        meanwhile = [f"meanwhile-{n}".encode() for n in range(100)]
        publish(a, "sq-catch-up", meanwhile)
        wait_for(lambda: placement(b, "sq-catch-up") == (a.name, names, sorted([a.name, b.name])), timeout=20,
                 what="c shown as a member not online")
    finally:
        c.restart()
    assert read(c, "sq-catch-up", meanwhile[-1]) == list(enumerate(before + meanwhile))
    assert read(a, "sq-catch-up", meanwhile[-1]) == list(enumerate(before + meanwhile))
