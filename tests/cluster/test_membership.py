"""Nodes join a cluster through etcd (cluster_formation.peer_discovery_backend = etcd) and
every node lists every member with whether it runs: /api/nodes, RabbitMQ's discovery key, a
member killed (not running once its lease expires), stopped (at once), back again, and one
whose etcd is gone."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pika
import pika.exceptions
import pytest
import requests

from conftest import free_port
from integration.http_api import wait_for  # noqa: F401  (the cluster tests' too)
from warren.cluster.config import LIVENESS_TTL


def nodes(node) -> dict[str, bool]:
    """name -> running, as /api/nodes on `node` lists them."""
    answer = requests.get(node.api + "/nodes", auth=("guest", "guest"), timeout=5)
    answer.raise_for_status()
    return {n["name"]: n["running"] for n in answer.json()}


def etcd_get(endpoint: str, key: bytes) -> list[dict]:
    import base64
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    with urllib.request.urlopen(f"http://{endpoint}/v3/kv/range", body, timeout=5) as response:
        kvs = json.load(response).get("kvs", [])
    return [json.loads(base64.b64decode(kv["value"])) for kv in kvs]


def test_three_nodes_see_each_other(make_node, etcd):
    names = ["warren-a@localhost", "warren-b@localhost", "warren-c@localhost"]
    started = [make_node(name) for name in names]
    for node in started:
        wait_for(lambda: nodes(node) == dict.fromkeys(names, True), what=f"{node.name} to list the three")
    # Where RabbitMQ's etcd peer discovery registers a node, with its value's shape.
    [registration] = etcd_get(etcd.endpoints[0], f"/rabbitmq/discovery/{make_node.prefix}/clusters/default/"
                                                 f"nodes/{names[0]}".encode())
    assert registration["node"] == names[0] and registration["ttl"] == 30 and registration["lease_id"] > 0
    # One cluster name on every node: as RabbitMQ's default, the first node's name.
    for node in started:
        overview = requests.get(node.api + "/overview", auth=("guest", "guest"), timeout=5).json()
        assert overview["cluster_name"] == names[0]
    one = requests.get(started[2].api + "/nodes/warren-a@localhost", auth=("guest", "guest"), timeout=5).json()
    assert (one["name"], one["running"], one["type"]) == ("warren-a@localhost", True, "disc")


def test_a_killed_node_is_not_running_once_its_lease_expires_and_runs_again(make_node):
    a, b = make_node("warren-a@localhost"), make_node("warren-b@localhost")
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True}, what="both running")
    killed = time.monotonic()
    b.stop(signal.SIGKILL)
    # (etcd expires a lease on its own schedule: a loaded machine took over 10 s)
    wait_for(lambda: nodes(a) == {a.name: True, b.name: False}, timeout=LIVENESS_TTL + 20, what="b not running")
    assert time.monotonic() - killed > LIVENESS_TTL - 1  # the lease, not the connection, says so
    # RabbitMQ's entry of a node that does not run (200 for /api/nodes/NAME too).
    dead = requests.get(a.api + f"/nodes/{b.name}", auth=("guest", "guest"), timeout=5)
    assert (dead.status_code, dead.json()) == (200, {"cluster_links": [], "name": b.name, "running": False,
                                                     "type": "disc"})
    b2 = make_node(b.name, data_dir=b.data_dir, port=b.port)
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True}, what="b running again")
    assert nodes(b2) == {a.name: True, b.name: True}


def test_a_stopped_node_is_not_running_at_once(make_node):
    a, b = make_node("warren-a@localhost"), make_node("warren-b@localhost")
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True}, what="both running")
    b.stop(signal.SIGTERM)
    wait_for(lambda: nodes(a) == {a.name: True, b.name: False}, timeout=2, what="b not running")


def test_cluster_name_from_the_config_file(make_node):
    node = make_node("warren-a@localhost", "cluster_name = East Coast")
    connection = pika.BlockingConnection(node.pika_params())
    try:
        assert connection._impl.server_properties["cluster_name"] == "East Coast"
    finally:
        connection.close()
    overview = requests.get(node.api + "/overview", auth=("guest", "guest"), timeout=5).json()
    assert overview["cluster_name"] == "East Coast"


def test_a_new_node_whose_etcd_is_down_waits_for_the_clusters_definitions(make_node, make_etcd):
    """A node that never joined has no definitions of its own to serve (not even a guest: the
    cluster's are the ones it will have); it runs, and joins once etcd answers."""
    own = make_etcd(1)
    a = make_node("warren-a@localhost", on=own)
    wait_for(lambda: nodes(a) == {a.name: True}, what="a registered")
    own.members[0].signal(signal.SIGSTOP)
    try:
        # (Its services wait up to 5 s each for etcd before it listens: loaded CI took over 13 s.)
        b = make_node("warren-b@localhost", on=own, start_timeout=45)
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(b.pika_params()).close()
        assert "it has never joined" in b.log()
    finally:
        own.members[0].signal(signal.SIGCONT)
    wait_for(lambda: requests.get(b.api + "/nodes", auth=("guest", "guest"), timeout=5).ok, what="b's users")
    wait_for(lambda: nodes(b) == {a.name: True, b.name: True}, what="b joined once etcd answered")
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True}, what="a sees b")
    pika.BlockingConnection(b.pika_params()).close()


def test_an_unreachable_etcd_is_logged_not_fatal(make_node):
    node = make_node("lonely@localhost", on=_NoEtcd())
    wait_for(lambda: "no etcd endpoint answered" in node.log(), what="the log line")
    assert node.proc.poll() is None
    assert node.stop() == 0


class _NoEtcd:
    """Where no etcd listens."""

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{free_port()}"]
