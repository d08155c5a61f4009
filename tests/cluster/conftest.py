"""Fixtures of the clustering tests: an etcd cluster (etcd_cluster.py) and Warren nodes that
join a cluster through it."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from conftest import EXTERNAL, free_port, scratch_dir, start_broker
from . import members as members_module
from .etcd_cluster import EtcdCluster


@pytest.fixture(scope="session")
def etcd():
    """Three etcd members shared by the tests that do not fault etcd itself; each test's
    cluster has its own key prefix."""
    cluster = EtcdCluster(3)
    yield cluster
    cluster.stop()


@pytest.fixture
def make_etcd():
    made = []

    def make(size: int = 3, everywhere: bool = False) -> EtcdCluster:
        made.append(EtcdCluster(size, everywhere))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()


def cluster_conf(endpoints: list[str], prefix: str, *extra: str) -> str:
    """A rabbitmq.conf joining the etcd backend's cluster under `prefix`."""
    path = os.path.join(scratch_dir("warren-cluster-conf-"), "rabbitmq.conf")
    with open(path, "w") as f:
        f.write("cluster_formation.peer_discovery_backend = etcd\n")
        for i, endpoint in enumerate(endpoints, 1):
            f.write(f"cluster_formation.etcd.endpoints.{i} = {endpoint}\n")
        f.write(f"cluster_formation.etcd.key_prefix = {prefix}\n")
        for line in extra:
            f.write(line + "\n")
    return path


def dist_lines(port: int) -> tuple[str, str]:
    """The config lines of a node's distribution port (its node links)."""
    return (f"distribution.listener.port_range.min = {port}", f"distribution.listener.port_range.max = {port}")


@pytest.fixture
def make_node(etcd):
    """make_node(name, extra config lines..., on=etcd, dist_port=None, **start_broker's) starts a
    Warren node in this test's cluster (the shared etcd unless another is given), with a free
    distribution port unless given (node.dist_port: pass it again to restart the node on it);
    nodes are killed after the test."""
    if EXTERNAL:
        pytest.skip("starts its own Warren nodes")
    prefix = "t-" + uuid.uuid4().hex[:10]
    started = []

    def make(name: str, *extra: str, on=None, dist_port: int | None = None, **kwargs):
        dist_port = dist_port or free_port()
        conf = cluster_conf((on or etcd).endpoints, prefix, *extra, *dist_lines(dist_port))
        node = start_broker("--node-name", name, "--config", conf, "--prometheus-port", "0", **kwargs)
        node.name = name
        node.dist_port = dist_port
        started.append(node)
        return node

    make.prefix = prefix
    yield make
    for node in started:
        node.stop(signal.SIGKILL)


QUEUE_NAMES = ["q", "excl"]  # the queues the queue tests declare


@pytest.fixture(scope="session")
def rabbitmq_three():
    cluster = members_module.rabbitmq_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def members(request):
    """Three running members a, b, c of one cluster (members.py): Warren nodes
    warren-a@localhost, ..., or RabbitMQ's rabbit-a@localhost, ... under
    WARREN_TEST_RABBITMQ_CLUSTER=1 (one cluster for the session, its queues deleted between
    tests, its killed nodes restarted)."""
    if members_module.RABBITMQ:
        three: list[members_module.Member] = [members_module.RabbitMQMember(node)
                                               for node in request.getfixturevalue("rabbitmq_three").nodes]
        members_module.forget_queues(three, QUEUE_NAMES)
        yield three
        for member in three:
            if member.node.alive():
                member.signal(signal.SIGCONT)
            else:
                member.restart()
        members_module.all_running(three)
        members_module.forget_queues(three, QUEUE_NAMES)
        return
    make_node = request.getfixturevalue("make_node")
    three = [members_module.WarrenMember(make_node, f"warren-{n}@localhost") for n in "abc"]
    members_module.all_running(three)
    yield three
