"""Fixtures of the clustering tests: an etcd cluster (etcd_cluster.py) and Warren nodes that
join a cluster through it."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from conftest import EXTERNAL, scratch_dir, start_broker
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


@pytest.fixture
def make_node(etcd):
    """make_node(name, etcd=None, extra config lines...) starts a Warren node in this test's
    cluster (the shared etcd unless another is given); nodes are killed after the test."""
    if EXTERNAL:
        pytest.skip("starts its own Warren nodes")
    prefix = "t-" + uuid.uuid4().hex[:10]
    started = []

    def make(name: str, *extra: str, on=None, **kwargs):
        conf = cluster_conf((on or etcd).endpoints, prefix, *extra)
        node = start_broker("--node-name", name, "--config", conf, "--prometheus-port", "0", **kwargs)
        node.name = name
        started.append(node)
        return node

    make.prefix = prefix
    yield make
    for node in started:
        node.stop(signal.SIGKILL)
