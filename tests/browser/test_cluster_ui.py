"""The web UI's overview on a cluster member: every node of the cluster in its Nodes table,
with whether it runs, and this node's own figures (not the first member's)."""

from __future__ import annotations

import signal

import pytest

from conftest import free_port, start_broker

from cluster.etcd_cluster import EtcdCluster
from cluster.conftest import cluster_conf, dist_lines
from warren.cluster.config import LIVENESS_TTL

from .test_web_ui import by_css, log_in, visible, wait


@pytest.fixture(scope="module")
def nodes():
    etcd = EtcdCluster(1)
    started = []
    try:
        for name in ("warren-a@localhost", "warren-b@localhost"):
            conf = cluster_conf(etcd.endpoints, "ui", *dist_lines(free_port()))  # (AMQP + 20000 may be taken)
            started.append(start_broker("--node-name", name, "--config", conf, "--prometheus-port", "0"))
        yield started
    finally:
        for node in started:
            node.stop(signal.SIGKILL)
        etcd.stop()


def nodes_text(chrome) -> str:
    return by_css(chrome, "#nodes").text if visible(chrome, "#nodes") else ""


def test_the_overview_lists_the_clusters_nodes(chrome, nodes):
    a, b = nodes
    # Logged in on b, the later member: its own figures, and both nodes.
    log_in(chrome, f"http://127.0.0.1:{b.mgmt_port}/", "guest", "guest")
    wait(chrome, lambda: "warren-a@localhost" in nodes_text(chrome) and "warren-b@localhost" in nodes_text(chrome),
         timeout=15, message="the two nodes are not listed")
    assert nodes_text(chrome).count("not running") == 0
    # b's memory figures, from its own entry (a's, listed first, has none of another node's).
    wait(chrome, lambda: "used of" in by_css(chrome, "#node-memory").text, message="b's memory is not shown")
    a.stop(signal.SIGKILL)
    wait(chrome, lambda: nodes_text(chrome).count("not running") == 1, timeout=LIVENESS_TTL + 15,
         message="a is not shown as not running")
