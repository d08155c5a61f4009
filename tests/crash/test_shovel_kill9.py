"""Dynamic shovels between brokers under faults: kill -9, SIGSTOP and network partitions, on
every path (Warren -> Warren, Warren -> RabbitMQ, RabbitMQ -> Warren).

Each scenario moves a durable source queue into a durable destination queue with a shovel
running on a Warren broker (its parameter: ack-mode on-confirm, reconnect-delay 1,
src-prefetch-count 100; "amqp://" for the shovel's own broker, a URI with host and port for the
other), while a publisher publishes N uniquely numbered, persistent 1 KiB messages with
confirms to the source. Mid-transfer, one broker is killed with SIGKILL and restarted on its
port and data, or stopped (SIGSTOP) for seconds and continued, or cut off from the other by a
partition of its network namespace and healed. Then the destination is drained, and the
checker (links.py) counts what was lost (confirmed by the source, never arrived), unexpected
(never published) or damaged: all 0. Duplicates are allowed, for deliveries not yet confirmed
when a link died, and printed (pytest -s).

The shovel's link must come back on its own, after reconnect-delay, also with a URI list whose
first entry is a dead port (a broker picked at random at each connection).

RabbitMQ 3.10.8 runs as a private node (tools/rabbitmq_node.py) with the shovel plugin, one for
the module, killed and restarted on the same ports and mnesia directory. The last test runs the
same harness with RabbitMQ's own shovel between two RabbitMQ nodes: what passes there is what
Warren must do.

Partitions: the shovel's Warren broker runs in a network namespace of its own, joined to the
test's by a veth pair (links.Netns, which needs root); the other broker listens on the pair's
address in the test's namespace. The links of the stop and partition scenarios use
heartbeat=1, so that they die during the fault and must be made again.

A Warren restarted after kill -9 must still have both queues (a durable queue lost at a restart
fails as that, not as lost messages). RabbitMQ 3.10.8 itself now and then loses a durable queue
declared seconds before a kill -9 (its log recovers one queue less than it had): such a run says
nothing about the link and is skipped. On a failure the brokers' logs are printed.
"""

import json
import os
import re
import signal
import sys
import time

import pika
import pytest
import requests

from conftest import free_port

from .links import (Collected, ConfirmedPublisher, Netns, WarrenProcess, amqp_uri, collect, declare, depth, kill9,
                    netns_unavailable, partition, payload, stop, suite_ports, tally, wait_depth)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import rabbitmq_node  # noqa: E402  (tools/ is no package)

N = 3000            # messages published per scenario
RATE = 1000         # a second: publishing lasts 3 s, over the fault
PREFETCH = 100
PAUSE = 5.0         # seconds a broker stays stopped or cut off
# Where RabbitMQ is missing these tests skip, except in CI, which installs it.
RABBITMQ_REQUIRED = os.environ.get("CI") == "true" or os.environ.get("WARREN_REQUIRE_RABBITMQ") == "1"


# ------------------------------------------------------------------ the brokers
class Warren(WarrenProcess):
    """A Warren broker a scenario kills, stops or cuts off, where a shovel may run."""

    def uri(self, **query) -> str:
        return amqp_uri(self.host, self.port, **query)

    def put_shovel(self, name: str, value: dict) -> None:
        r = requests.put(f"http://{self.host}:{self.b.mgmt_port}/api/parameters/shovel/%2F/{name}",
                         json={"value": value}, auth=("guest", "guest"), timeout=30)
        assert r.status_code in (201, 204), (r.status_code, r.text)


class Rabbit:
    """The module's RabbitMQ node (tools/rabbitmq_node.py), as Warren above."""

    def __init__(self, node):
        self.node = node

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def port(self) -> int:
        return self.node.port

    def uri(self, **query) -> str:
        return amqp_uri(self.host, self.port, **query)

    def put_shovel(self, name: str, value: dict) -> None:
        self.node.ctl("set_parameter", "shovel", name, json.dumps(value))

    def kill(self) -> None:
        listed = self.node.ctl("list_queues", "-q", "--no-table-headers", "name", "durable").stdout
        self.durable_queues = sum(line.split("\t")[-1] == "true" for line in listed.splitlines())
        self.node.kill()

    def restart(self) -> None:
        self.node.restart()
        # RabbitMQ 3.10.8 now and then loses a durable queue declared seconds before a kill -9
        # (its record: "Recovering 2 queues" where there were 3), which a shovel then declares
        # again, empty. That is no fault of the link under test: the run says nothing then.
        recovered = re.findall(r"Recovering (\d+) queues of type rabbit_classic_queue", self.log())
        if recovered and int(recovered[-1]) < self.durable_queues:
            pytest.skip(f"RabbitMQ lost durable queues at its restart after kill -9 ({self.durable_queues} "
                        f"before, {recovered[-1]} recovered): nothing to judge the link by")

    def send_signal(self, sig: int) -> None:
        self.node.send_signal(sig)

    def check_log(self) -> None:
        pass

    def log(self) -> str:
        """Its log (of every start: the node appends to it)."""
        path = os.path.join(self.node.tmp or "", "log", f"{self.node.nodename}.log")
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError as e:
            return f"(no log: {e})"

    def log_tail(self) -> str:
        return "".join(self.log().splitlines(keepends=True)[-60:])


_netns_refused: list[str] = []  # why the module has no namespace, if it tried to make one


@pytest.fixture(scope="module")
def netns():
    """The module's network namespace (None where it cannot make one: the partitions skip)."""
    if netns_unavailable():
        yield None
        return
    ns = Netns()
    try:
        ns.create()
    except RuntimeError as e:  # (e.g. a container without CAP_NET_ADMIN)
        ns.close()
        _netns_refused.append(str(e))
        yield None
        return
    yield ns
    ns.close()


def _node(name: str, host: str) -> rabbitmq_node.RabbitMQNode:
    return rabbitmq_node.RabbitMQNode(
        f"{name}-{os.getpid()}@localhost", host=host, plugins=["rabbitmq_shovel"], ports=suite_ports,
        # guest may connect from the namespace's address too
        conf=["loopback_users = none"])


def _need_rabbitmq() -> None:
    server = rabbitmq_node.default_rabbitmq_bin("rabbitmq-server")
    if not os.path.exists(server):
        if RABBITMQ_REQUIRED:
            pytest.fail(f"RabbitMQ is not installed ({server}); CI=true or WARREN_REQUIRE_RABBITMQ=1: "
                        "these tests must run")
        pytest.skip(f"RabbitMQ is not installed ({server})")


@pytest.fixture(scope="module")
def rabbit_node(netns):
    """The module's RabbitMQ node, listening where the namespace's brokers reach it."""
    _need_rabbitmq()
    node = _node("warren-links", netns.root_addr if netns else "127.0.0.1")
    node.start()
    yield node
    node.stop()


@pytest.fixture
def rabbit(rabbit_node):
    if not rabbit_node.alive():  # (a failed test left it killed or stopped)
        rabbit_node.restart()
    rabbit_node.send_signal(signal.SIGCONT)
    yield Rabbit(rabbit_node)


# ------------------------------------------------------------------ the scenario
class Scenario:
    def __init__(self, source, dest, shovel_on, uid: str):
        self.source, self.dest, self.shovel_on = source, dest, shovel_on
        self.src_queue, self.dest_queue = f"links-src-{uid}", f"links-dest-{uid}"

    def run(self, fault, *, dest_uri=None, query=None, what: str = "") -> ConfirmedPublisher:
        """Start the shovel and the publisher, run fault() mid-transfer, wait for every
        confirmed message in the destination, and check. On a failure the brokers' logs say
        what they did (pytest shows what was printed)."""
        try:
            return self._run(fault, dest_uri, query or {}, what)
        except BaseException:
            for role, broker in (("source", self.source), ("destination", self.dest)):
                print(f"\n--- the {role}'s log ---\n{broker.log_tail()}")
            raise

    def _run(self, fault, dest_uri, query: dict, what: str) -> ConfirmedPublisher:
        source, dest = self.source, self.dest
        declare(source.host, source.port, self.src_queue)
        declare(dest.host, dest.port, self.dest_queue)
        value = {"src-uri": "amqp://" if source is self.shovel_on else source.uri(**query),
                 "src-queue": self.src_queue,
                 "dest-uri": dest_uri or ("amqp://" if dest is self.shovel_on else dest.uri(**query)),
                 "dest-queue": self.dest_queue,
                 "ack-mode": "on-confirm", "reconnect-delay": 1, "src-prefetch-count": PREFETCH}
        self.shovel_on.put_shovel("links", value)
        publisher = ConfirmedPublisher(source.host, source.port, self.src_queue, N, rate=RATE)
        publisher.start()
        wait_depth(dest.host, dest.port, self.dest_queue, N // 20, timeout=30)  # the shovel moves
        confirmed_before = len(publisher.confirmed)
        started = time.monotonic()
        fault()
        fault_seconds = time.monotonic() - started
        for broker, queue in ((source, self.src_queue), (dest, self.dest_queue)):
            try:  # (a broker that lost a durable queue at its restart fails here, not as "lost")
                depth(broker.host, broker.port, queue)
            except pika.exceptions.ChannelClosedByBroker as e:
                raise AssertionError(f"{type(broker).__name__} lost the durable queue {queue} at its restart: {e}")
        publisher.join(90)
        assert not publisher.is_alive(), "the publisher did not finish"
        assert 0 < confirmed_before < N, f"the fault came after {confirmed_before} confirms, not mid-publish"
        got = collect((dest.host, dest.port), self.dest_queue, publisher.confirmed,
                      source=(source.host, source.port, self.src_queue))
        result = tally(publisher, got)
        print(f"\n{what}: {result}; fault {fault_seconds:.1f} s, collected in {got.seconds:.1f} s, "
              f"publisher connections {publisher.connections}")
        result.check()
        assert result.confirmed > N * 0.9, f"few confirms: {result}"
        for broker in (source, dest):
            broker.check_log()
        return publisher


# ------------------------------------------------------------------ Warren -> Warren
@pytest.mark.parametrize("fault", ["kill -9 the destination", "kill -9 the source", "SIGSTOP the destination"])
def test_warren_to_warren(make_broker, uid, fault):
    source, dest = Warren(make_broker), Warren(make_broker)
    scenario = Scenario(source, dest, source, uid)
    if fault == "kill -9 the destination":
        scenario.run(kill9(dest), what=fault)
    elif fault == "kill -9 the source":
        # the shovel runs there: it comes back from the restarted broker's definitions
        publisher = scenario.run(kill9(source), what=fault)
        assert publisher.connections >= 2, "the publisher never saw the source die"
    else:
        scenario.run(stop(dest, PAUSE), query={"heartbeat": 1}, what=fault)


def test_a_uri_list_starting_with_a_dead_broker(make_broker, uid):
    """dest-uri [dead port, the destination]: each (re)connection picks one at random; one to
    the dead port fails, and the link tries again after reconnect-delay."""
    source, dest = Warren(make_broker), Warren(make_broker)
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2f"
    Scenario(source, dest, source, uid).run(kill9(dest), dest_uri=[dead, dest.uri()],
                                            what="a dead URI first, kill -9 the destination")


# ------------------------------------------------------------------ Warren <-> RabbitMQ
@pytest.mark.parametrize("fault", ["kill -9", "SIGSTOP"])
def test_warren_to_rabbitmq(make_broker, rabbit, uid, fault):
    source = Warren(make_broker)
    scenario = Scenario(source, rabbit, source, uid)
    if fault == "kill -9":
        scenario.run(kill9(rabbit), what="Warren -> RabbitMQ, kill -9 RabbitMQ")
    else:
        scenario.run(stop(rabbit, PAUSE), query={"heartbeat": 1}, what="Warren -> RabbitMQ, SIGSTOP RabbitMQ")


@pytest.mark.parametrize("fault", ["kill -9", "SIGSTOP"])
def test_rabbitmq_to_warren(make_broker, rabbit, uid, fault):
    dest = Warren(make_broker)
    scenario = Scenario(rabbit, dest, dest, uid)
    if fault == "kill -9":
        publisher = scenario.run(kill9(rabbit), what="RabbitMQ -> Warren, kill -9 RabbitMQ")
        assert publisher.connections >= 2, "the publisher never saw the source die"
    else:
        scenario.run(stop(rabbit, PAUSE), query={"heartbeat": 1}, what="RabbitMQ -> Warren, SIGSTOP RabbitMQ")


# ------------------------------------------------------------------ partitions
@pytest.mark.parametrize("path", ["Warren -> Warren", "Warren -> RabbitMQ", "RabbitMQ -> Warren"])
def test_a_partition(make_broker, netns, request, uid, path):
    """The shovel's Warren runs in its own network namespace; the link to the other broker is
    cut for PAUSE seconds, mid-transfer, and healed."""
    if netns is None:
        pytest.skip(f"no network namespace: {netns_unavailable() or _netns_refused}")
    shovel_on = Warren(make_broker, host=netns.ns_addr, netns=netns)
    if path == "Warren -> Warren":
        other = Warren(make_broker, host=netns.root_addr, listen=(netns.root_addr,))
    else:
        other = request.getfixturevalue("rabbit")
    source, dest = (shovel_on, other) if path.startswith("Warren ->") else (other, shovel_on)
    Scenario(source, dest, shovel_on, uid).run(partition(netns, PAUSE), query={"heartbeat": 1},
                                               what=f"{path}, partition")


# ------------------------------------------------------------------ the harness on RabbitMQ
def test_the_harness_with_rabbitmqs_shovel(rabbit, uid):
    """RabbitMQ -> RabbitMQ with RabbitMQ's own shovel (on the source node), kill -9 of the
    destination: the scenario passes there, so what fails on Warren is Warren's."""
    node = _node("warren-links-src", rabbit.host)
    node.start()
    try:
        source = Rabbit(node)
        Scenario(source, rabbit, source, uid).run(kill9(rabbit), what="RabbitMQ's shovel, kill -9 the destination")
    finally:
        node.stop()


def test_the_checker_counts():
    """What the scenarios assert is 0 is counted: a confirmed id that never arrived is lost
    (an unconfirmed one is not), an id never published is unexpected, a second copy is a
    duplicate, another body is damage."""
    publisher = ConfirmedPublisher("127.0.0.1", 1, "q", 4)  # (never started)
    publisher.attempted = ["a", "b", "c", "d"]
    publisher.confirmed = ["a", "b", "c"]
    got = Collected([("a", payload("a")), ("c", payload("a")), ("a", payload("a")), ("x", payload("x")),
                     (None, b"")])
    result = tally(publisher, got)
    assert (result.lost, result.unexpected, result.duplicated, result.damaged) == (
        ["b"], ["x", None], {"a": 1}, ["c"])
    assert str(result) == ("4 published, 3 confirmed, 5 received: 1 lost, 2 unexpected, 1 duplicated (1 ids), "
                           "1 damaged")
    with pytest.raises(AssertionError, match="1 lost"):
        result.check()
    publisher.confirmed = ["a"]
    tally(publisher, Collected([("a", payload("a")), ("a", payload("a"))])).check()
