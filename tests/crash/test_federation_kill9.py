"""Federation links between brokers under faults: kill -9, SIGSTOP and network partitions,
Warren -> Warren, RabbitMQ -> Warren and Warren -> RabbitMQ (RabbitMQ's own link, its
rabbitmq_federation plugin, with Warren as its upstream).

Each exchange scenario federates a durable direct exchange from the same-named one upstream
(an upstream parameter with reconnect-delay 1, ack-mode on-confirm by default, and a policy
on the downstream broker, where the link runs), with a durable queue bound to it downstream.
Each broker has its own cluster name. Once the link runs and its binding is in place upstream
(only then does the upstream's confirm mean that the message is in the link's queue), a
publisher publishes N uniquely numbered, persistent 1 KiB messages with confirms to the
upstream exchange; mid-transfer, one broker is killed with SIGKILL and restarted on its port
and data, or stopped (SIGSTOP) for seconds and continued, or cut off from the other by a
partition and healed. Then the downstream queue is drained (until the link's queue upstream
is empty too), and the checker (links.py) counts what was lost (confirmed upstream, never
arrived), unexpected or damaged: all 0. Duplicates are allowed and printed (pytest -s).

The queue scenario federates a durable queue: a consumer on it downstream from the start
(a queue link pulls only for consumers), the publisher publishing to the queue upstream,
and the upstream killed -9 mid-transfer. Where Warren runs the link, each fault must have
ended it: it starts running again after the fault (its log says so).

Two tests look at what a restart leaves upstream, without traffic, on Warren and on RabbitMQ:
the link's internal exchange and bindings survive a kill -9 of the upstream, and a link whose
broker was killed -9 sets up the other internal exchange ("... A" / "... B") than the one in
use, binding it before deleting the old one. A failure of either loses messages above.

RabbitMQ 3.10.8 runs as a private node (tools/rabbitmq_node.py) with the management and
federation plugins, one for the module, killed and restarted on the same ports and mnesia
directory. Partitions: the downstream Warren runs in a network namespace of its own
(links.Netns, which needs root), the upstream listens on the veth pair's address here. The
links of the stop and partition scenarios use heartbeat=1, so that they die during the fault
and must be made again.
"""

import os
import re
import signal
import sys
import time

import pytest

from .fed_faults import Broker, Consumer, Rabbit, Warren, q, wait_for
from .links import (ConfirmedPublisher, Netns, collect, kill9, netns_unavailable, partition, stop, suite_ports, tally,
                    wait_depth)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import rabbitmq_node  # noqa: E402  (tools/ is no package)

N = 3000            # messages published per scenario
RATE = 1000         # a second: publishing lasts 3 s, over the fault
PAUSE = 4.0         # seconds a broker stays stopped or cut off
KEY = "k"           # the routing key published with, and bound downstream
COLLECT = 20.0      # seconds the collector waits for what is missing (it takes 1 to 2 s)
PLUGINS = ["rabbitmq_management", "rabbitmq_federation", "rabbitmq_federation_management"]
# Where RabbitMQ is missing these tests skip, except in CI, which installs it.
RABBITMQ_REQUIRED = os.environ.get("CI") == "true" or os.environ.get("WARREN_REQUIRE_RABBITMQ") == "1"


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def netns():
    """The module's network namespace (None where it cannot make one)."""
    if netns_unavailable():
        yield None
        return
    ns = Netns()
    try:
        ns.create()
    except RuntimeError as e:  # (e.g. a container without CAP_NET_ADMIN)
        ns.close()
        pytest.skip(f"cannot make a network namespace: {e}")
    yield ns
    ns.close()


@pytest.fixture(scope="module")
def rabbit_node():
    server = rabbitmq_node.default_rabbitmq_bin("rabbitmq-server")
    if not os.path.exists(server):
        if RABBITMQ_REQUIRED:
            pytest.fail(f"RabbitMQ is not installed ({server}); CI=true or WARREN_REQUIRE_RABBITMQ=1: "
                        "these tests must run")
        pytest.skip(f"RabbitMQ is not installed ({server})")
    node = rabbitmq_node.RabbitMQNode(f"warren-fed-{os.getpid()}@localhost", plugins=PLUGINS, ports=suite_ports)
    node.start()
    yield node
    node.stop()


@pytest.fixture
def rabbit(rabbit_node):
    if not rabbit_node.alive():  # (a failed test left it killed or stopped)
        rabbit_node.restart()
    rabbit_node.send_signal(signal.SIGCONT)
    yield Rabbit(rabbit_node)


# ------------------------------------------------------------------ faults
# ------------------------------------------------------------------ the scenarios
class Scenario:
    """An upstream and a downstream broker (where the link runs), each with its own cluster
    name, and the names the scenario federates."""

    def __init__(self, up: Broker, down: Broker, uid: str):
        self.up, self.down = up, down
        self.exchange, self.queue, self.upstream = f"fed-x-{uid}", f"fed-q-{uid}", f"origin-{uid}"
        up.set_cluster_name(f"upstream-{uid}")
        down.set_cluster_name(f"downstream-{uid}")

    def running(self) -> None:
        wait_for(lambda: self.down.running_link(self.upstream), 30, f"running link on {self.down.name}")

    def report(self, what: str, publisher: ConfirmedPublisher, got, fault_seconds: float) -> None:
        """Print the counts (and, if they fail, the brokers' logs), then check them."""
        result = tally(publisher, got)
        print(f"\n{what}: {result}; fault {fault_seconds:.1f} s, collected in {got.seconds:.1f} s, "
              f"publisher connections {publisher.connections}")
        if result.lost or result.unexpected or result.damaged:
            for label, broker in (("upstream", self.up), ("downstream", self.down)):
                print(f"--- {label} {broker.name}'s log:\n{broker.log_tail()}")
        result.check()
        assert result.confirmed > N * 0.9, f"few confirms: {result}"
        for broker in (self.up, self.down):
            broker.check_log()

    def federate_exchange(self, query: dict | None = None) -> str:
        """Federate the exchange; once the link runs and binds the upstream exchange to its
        internal exchange, that one's name."""
        up, down = self.up, self.down
        up.declare(exchange=self.exchange)
        down.declare(exchange=self.exchange, queue=self.queue, key=KEY)
        down.federate(self.upstream, up.uri(**(query or {})), f"^{re.escape(self.exchange)}$", "exchanges")
        self.running()
        return wait_for(lambda: up.federation_binding(self.exchange, KEY), 30, "link's binding upstream")["destination"]

    def exchange_link(self, fault, *, query: dict | None = None, what: str = "") -> ConfirmedPublisher:
        """Federate the exchange, publish upstream, run fault() mid-transfer, drain the queue
        downstream and check."""
        up, down = self.up, self.down
        try:
            # The link's queue is bound upstream: from now on what the upstream confirms is in it.
            link_queue = self.federate_exchange(query)[:-len(" A")]
            publisher = ConfirmedPublisher(up.host, up.port, KEY, N, rate=RATE, exchange=self.exchange)
            publisher.start()
            wait_depth(down.host, down.port, self.queue, N // 20, timeout=30)  # the link moves
            confirmed_before = len(publisher.confirmed)
            starts = down.link_starts() if isinstance(down, Warren) else 0
            started = time.monotonic()
            fault()
            fault_seconds = time.monotonic() - started
            publisher.join(90)
            assert not publisher.is_alive(), "the publisher did not finish"
            assert 0 < confirmed_before < N, f"the fault came after {confirmed_before} confirms, not mid-publish"
            got = collect((down.host, down.port), self.queue, publisher.confirmed,
                          source=(up.host, up.port, link_queue), timeout=COLLECT)
            self.report(what, publisher, got, fault_seconds)
            if isinstance(down, Warren):
                assert down.link_starts() > starts, "the fault did not end the link: it never started again"
        finally:
            self.clean()
        return publisher

    def clean(self) -> None:
        if isinstance(self.down, Rabbit) and self.down.node.alive():  # (the module's node goes on)
            self.down.unfederate(self.upstream)

    def queue_link(self, fault, *, what: str = "") -> ConfirmedPublisher:
        """Federate the queue, consume it downstream, publish to it upstream, run fault()
        mid-transfer, and check what the consumer got."""
        up, down = self.up, self.down
        assert isinstance(down, Warren)
        up.declare(queue=self.queue)
        down.declare(queue=self.queue)
        down.federate(self.upstream, up.uri(), f"^{re.escape(self.queue)}$", "queues")
        consumer = Consumer(down.host, down.port, self.queue)
        consumer.start()
        assert consumer.ready.wait(15), "the consumer did not start"
        self.running()
        publisher = ConfirmedPublisher(up.host, up.port, self.queue, N, rate=RATE)
        publisher.start()
        wait_for(lambda: len(consumer.seen) >= N // 20, 30, "messages through the queue link")
        confirmed_before = len(publisher.confirmed)
        starts = down.link_starts()
        started = time.monotonic()
        fault()
        fault_seconds = time.monotonic() - started
        publisher.join(90)
        assert not publisher.is_alive(), "the publisher did not finish"
        assert 0 < confirmed_before < N, f"the fault came after {confirmed_before} confirms, not mid-publish"
        got = consumer.finish(publisher.confirmed, source=(up.host, up.port, self.queue), timeout=COLLECT)
        self.report(what, publisher, got, fault_seconds)
        assert down.link_starts() > starts, "the fault did not end the link: it never started again"
        return publisher


# ------------------------------------------------------------------ Warren -> Warren
@pytest.mark.parametrize("fault", ["kill -9 the upstream",
                                   "kill -9 the downstream", "SIGSTOP the upstream"])
def test_exchange_federation(make_broker, uid, fault):
    up, down = Warren(make_broker), Warren(make_broker)
    scenario = Scenario(up, down, uid)
    if fault == "kill -9 the upstream":
        publisher = scenario.exchange_link(kill9(up), what=fault)
        assert publisher.connections >= 2, "the publisher never saw the upstream die"
    elif fault == "kill -9 the downstream":
        # the link runs there: it comes back from the restarted broker's definitions
        scenario.exchange_link(kill9(down), what=fault)
    else:
        scenario.exchange_link(stop(up, PAUSE), query={"heartbeat": 1}, what=fault)


def test_exchange_federation_partition(make_broker, netns, uid):
    """The downstream Warren (the link's) runs in its own network namespace; the link to the
    upstream is cut for PAUSE seconds, mid-transfer, and healed."""
    if netns is None:
        pytest.skip(f"no network namespace: {netns_unavailable()}")
    down = Warren(make_broker, host=netns.ns_addr, netns=netns)
    up = Warren(make_broker, host=netns.root_addr, listen=(netns.root_addr,))
    Scenario(up, down, uid).exchange_link(partition(netns, PAUSE), query={"heartbeat": 1}, what="partition")


def test_queue_federation_kill9_the_upstream(make_broker, uid):
    up, down = Warren(make_broker), Warren(make_broker)
    publisher = Scenario(up, down, uid).queue_link(kill9(up), what="queue link, kill -9 the upstream")
    assert publisher.connections >= 2, "the publisher never saw the upstream die"


# ------------------------------------------------------------------ Warren <-> RabbitMQ
def test_rabbitmq_upstream_killed(make_broker, rabbit, uid):
    """Warren's link from RabbitMQ; RabbitMQ killed -9 and restarted."""
    down = Warren(make_broker)
    publisher = Scenario(rabbit, down, uid).exchange_link(kill9(rabbit), what="RabbitMQ -> Warren, kill -9 RabbitMQ")
    assert publisher.connections >= 2, "the publisher never saw the upstream die"


def test_warren_upstream_of_rabbitmq_killed(make_broker, rabbit, uid):
    """RabbitMQ's link (rabbitmq_federation) from Warren, which its x-federation-upstream
    exchange type serves; Warren killed -9 and restarted."""
    up = Warren(make_broker)
    publisher = Scenario(up, rabbit, uid).exchange_link(kill9(up), what="Warren -> RabbitMQ, kill -9 Warren")
    assert publisher.connections >= 2, "the publisher never saw the upstream die"


# ------------------------------------------------------------------ restarts of the link's broker
@pytest.mark.parametrize("downstream", ["Warren", "RabbitMQ"])
def test_a_restarted_downstream_sets_up_the_other_internal_exchange(make_broker, request, uid, downstream):
    """An exchange link sets up a new internal exchange upstream at each start, "... A" and
    "... B" in turn, bound before the old one is deleted: also after a kill -9 of its broker,
    which takes the other one than the one in use (RabbitMQ keeps it with the exchange),
    or the upstream exchange would route nothing to the link's queue for a moment."""
    up = Warren(make_broker)
    down = Warren(make_broker) if downstream == "Warren" else request.getfixturevalue("rabbit")
    scenario = Scenario(up, down, uid)
    try:
        before = scenario.federate_exchange()
        queue = before[:-len(" A")]
        if isinstance(down, Rabbit):
            # RabbitMQ writes the suffix in use to mnesia, whose log reaches the file up to 2 s
            # later (disk_log's write cache): killed before, it forgets it, and its link deletes
            # the internal exchange in use first (1 run in 6 here).
            time.sleep(3)
        down.kill()
        down.restart()
        after = f"{queue} {'A' if before.endswith(' B') else 'B'}"

        def upstream() -> tuple[list[str], str | None]:
            """The internal exchanges upstream, and the one the upstream exchange is bound to."""
            binding = up.federation_binding(scenario.exchange, KEY)
            return (sorted(x["name"] for x in up.http("GET", "/exchanges/%2F").json() if x["name"].startswith(queue)),
                    binding and binding["destination"])
        deadline = time.monotonic() + 30
        while upstream() != ([after], after) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert upstream() == ([after], after), f"before the restart: {before}"
    finally:
        scenario.clean()


@pytest.mark.parametrize("upstream", ["Warren", "RabbitMQ"])
def test_a_restarted_upstream_keeps_the_links_internal_exchange(make_broker, request, uid, upstream):
    """What an exchange link declared upstream is durable: the link's queue, its internal
    exchange and the bindings from the upstream exchange are there after a kill -9 of the
    upstream, before the link comes back (its broker is killed first)."""
    down = Warren(make_broker)
    up = Warren(make_broker) if upstream == "Warren" else request.getfixturevalue("rabbit")
    scenario = Scenario(up, down, uid)
    internal = scenario.federate_exchange()
    down.kill()
    up.kill()
    up.restart()
    binding = up.federation_binding(scenario.exchange, KEY)
    assert binding is not None and binding["destination"] == internal, binding
    to_queue = up.http("GET", f"/exchanges/%2F/{q(internal)}/bindings/source").json()
    assert [(b["destination"], b["destination_type"]) for b in to_queue] == [(internal[:-len(" A")], "queue")]
