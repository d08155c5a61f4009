"""warrenctl's cluster verbs against real nodes in a real etcd: cluster_status (rabbitmqctl's
sections and --formatter json keys, as /work's RabbitMQ 3.10.8 cluster printed them, with
Warren's versions) and forget_cluster_node (RabbitMQ's refusals of a running node and of a
node that is no member; a stopped node forgotten is gone from /api/nodes and joins again
when it starts). warrenctl runs as on a node's machine: through that node's control socket."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess

import requests

from warren import __version__
from warrenctl_path import WARRENCTL
from .test_membership import nodes, wait_for


def ctl(node, *args):
    """warrenctl on `node`'s machine: its data dir's control socket, no flags naming a broker."""
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    env = {k: v for k, v in os.environ.items() if k not in ("WARRENCTL_HOST", "WARRENCTL_PORT")}
    env["WARREN_DATA_DIR"] = node.data_dir
    result = subprocess.run([WARRENCTL, *args], capture_output=True, text=True, timeout=60, env=env)
    assert "Traceback" not in result.stderr, result
    return result


def test_cluster_status_lists_members_running_nodes_and_their_listeners(make_node):
    a, b, c = (make_node(f"warren-{x}@localhost") for x in "abc")
    names = [a.name, b.name, c.name]
    wait_for(lambda: nodes(a) == dict.fromkeys(names, True), what="a to list the three")
    python = platform.python_version()

    out = ctl(a, "cluster_status")
    assert out.returncode == 0 and out.stderr == "", out
    text = out.stdout
    assert text.startswith(f"Cluster status of node {a.name} ...\nBasics\n\nCluster name: ")
    assert f"\nDisk Nodes\n\n{a.name}\n{b.name}\n{c.name}\n\nRunning Nodes\n\n{a.name}\n{b.name}\n{c.name}\n" in text
    assert "\nVersions\n\n" + "".join(f"{n}: Warren {__version__} on Python {python}\n" for n in names) in text
    assert "\nMaintenance status\n\n" + "".join(f"Node: {n}, status: not under maintenance\n" for n in names) in text
    assert "\nAlarms\n\n(none)\n\nNetwork Partitions\n\n(none)\n\nListeners\n\n" in text
    for node in (a, b, c):
        assert (f"Node: {node.name}, interface: 127.0.0.1, port: {node.port}, protocol: amqp, "
                f"purpose: AMQP 0-9-1\n") in text
    assert f"Node: {a.name}, interface: 127.0.0.1, port: {a.mgmt_port}, protocol: http, purpose: HTTP API" in text
    assert "Feature flags" not in text

    # -q drops the banner, as rabbitmqctl's
    assert ctl(a, "-q", "cluster_status").stdout.startswith("Basics\n")

    # A stopped node is still a disk node, no longer running (nor in versions or listeners).
    c.stop(signal.SIGTERM)
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True, c.name: False}, timeout=5, what="c stopped")
    status = json.loads(ctl(b, "cluster_status", "--formatter", "json").stdout)
    assert sorted(status) == ["alarms", "cluster_name", "disk_nodes", "listeners", "maintenance_status",
                              "partitions", "ram_nodes", "running_nodes", "versions"]
    overview = requests.get(b.api + "/overview", auth=("guest", "guest"), timeout=5).json()
    assert status["cluster_name"] == overview["cluster_name"]
    assert status["disk_nodes"] == names and status["running_nodes"] == [a.name, b.name]
    assert status["ram_nodes"] == [] and status["partitions"] == {} and status["alarms"] == []
    assert status["maintenance_status"] == {a.name: "not under maintenance", b.name: "not under maintenance"}
    assert status["versions"] == dict.fromkeys([a.name, b.name], {"erlang_version": "none", "python_version": python,
                                                                   "rabbitmq_name": "Warren",
                                                                   "rabbitmq_version": __version__})
    assert sorted(status["listeners"]) == [a.name, b.name]
    assert {"interface": "127.0.0.1", "node": a.name, "port": a.port, "protocol": "amqp",
            "purpose": "AMQP 0-9-1"} in status["listeners"][a.name]
    # The API under it: overview's listeners name every running node's AMQP listeners.
    amqp = {(lst["node"], lst["port"]) for lst in overview["listeners"] if lst["protocol"] == "amqp"}
    assert {(a.name, a.port), (b.name, b.port)} <= amqp and all(n != c.name for n, _ in amqp)


def test_cluster_status_of_a_node_alone_shows_that_node(make_broker):
    node = make_broker("--node-name", "solo@localhost")
    out = ctl(node, "cluster_status", "--formatter", "json")
    assert out.returncode == 0, out
    status = json.loads(out.stdout)
    assert status["disk_nodes"] == status["running_nodes"] == ["solo@localhost"]
    assert list(status["listeners"]) == ["solo@localhost"]


def test_forget_cluster_node_refuses_a_running_node_and_a_stranger(make_node):
    a, b = make_node("warren-a@localhost"), make_node("warren-b@localhost")
    wait_for(lambda: nodes(a) == {a.name: True, b.name: True}, what="both running")
    for name in (b.name, a.name):  # another running node, and the node itself
        out = ctl(a, "forget_cluster_node", name)
        assert out.returncode == 69, out
        assert out.stdout == f"Removing node {name} from the cluster\n"
        assert out.stderr == (f"Error:\nRabbitMQ on node {name} must be stopped with 'rabbitmqctl -n {name} "
                              "stop_app' before it can be removed\n")
    out = ctl(a, "forget_cluster_node", "warren-zzz@localhost")
    assert (out.returncode, out.stderr) == (69, "Error:\n{:not_a_cluster_node, 'The node selected is not in the "
                                                "cluster.'}\n")
    out = ctl(a, "forget_cluster_node")
    assert out.returncode == 64 and "not enough arguments" in out.stderr
    assert nodes(a) == {a.name: True, b.name: True}
    # Not over TCP: RabbitMQ's API has no such route, Warren's is the control socket's alone.
    answer = requests.delete(a.api + "/cluster-members/" + b.name, auth=("guest", "guest"), timeout=5)
    assert (answer.status_code, answer.json()) == (401, {"error": "not_authorised", "reason": "Only warrenctl on "
                                                         "the node's control socket may do this"})
    over_tcp = subprocess.run([WARRENCTL, "--port", str(a.mgmt_port), "forget_cluster_node", b.name],
                              capture_output=True, text=True, timeout=60)
    assert over_tcp.returncode == 77 and "control socket" in over_tcp.stderr, over_tcp


def test_a_forgotten_node_is_gone_everywhere_and_joins_again_when_it_starts(make_node):
    a, b, c = (make_node(f"warren-{x}@localhost") for x in "abc")
    names = [a.name, b.name, c.name]
    wait_for(lambda: nodes(a) == dict.fromkeys(names, True), what="a to list the three")
    c.stop(signal.SIGTERM)
    wait_for(lambda: nodes(b)[c.name] is False, timeout=5, what="c stopped")
    out = ctl(a, "forget_cluster_node", c.name)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"Removing node {c.name} from the cluster\n", ""), out
    assert nodes(a) == {a.name: True, b.name: True}  # at once on the node that forgot it
    wait_for(lambda: nodes(b) == {a.name: True, b.name: True}, timeout=5, what="b to forget c")
    assert json.loads(ctl(b, "cluster_status", "--formatter", "json").stdout)["disk_nodes"] == [a.name, b.name]
    out = ctl(b, "forget_cluster_node", c.name)  # again: no longer a member
    assert out.returncode == 69 and "not_a_cluster_node" in out.stderr, out
    make_node(c.name, data_dir=c.data_dir, port=c.port)
    for node in (a, b):
        wait_for(lambda: nodes(node) == dict.fromkeys(names, True), what=f"{node.name} to list c again")
