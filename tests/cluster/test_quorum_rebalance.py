"""rabbitmq-queues' `rebalance <all|classic|quorum>` as warrenctl's, on a cluster's quorum
queues (warren/cluster/queue_members.py): RabbitMQ 3.10's rabbit_amqqueue:rebalance moves the
leadership of the shortest queues off a node that leads more than ceil(queues / running nodes),
each to the member leading the fewest, and prints how many each node leads after. Its banners,
tables (rows in RabbitMQ's order: node names descending, a line between rows; nothing
rebalanced: a one-cell `Output` table of `[]`), JSON and refusals as rabbitmq-queues', checked
on a 3-node RabbitMQ 3.10.8. A move is a new epoch in the queue's record, to a member that
runs and is in sync: nothing confirmed is lost."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pika
import requests

from .test_ctl_cluster import ctl
from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import nodes, wait_for
from .test_quorum_members import declare, node_queues, publish
from .test_quorum_replication import drain

COLUMNS = ["Node name", "Number of quorum queues", "Number of replicated classic queues"]
NOTHING = "┌────────┐\n│ Output │\n├────────┤\n│ []     │\n└────────┘\n"  # (rabbitmq-queues': no queue rebalanced)


def table(rows: list[tuple[str, int]]) -> str:
    """rabbitmq-queues' table of rebalance's answer (its VT100 lines drawn in Unicode)."""
    width = max(len(COLUMNS[0]), *(len(node) for node, _ in rows))
    widths = [width, len(COLUMNS[1]), len(COLUMNS[2])]

    def line(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * (w + 2) for w in widths) + right

    def cells(values: list[str]) -> str:
        return "│" + "│".join(f" {v.ljust(w)} " for v, w in zip(values, widths)) + "│"
    between = line("├", "┼", "┤")
    body = f"\n{between}\n".join(cells([node, str(count), "0"]) for node, count in rows)
    return "\n".join([line("┌", "┬", "┐"), cells(COLUMNS), between, body, line("└", "┴", "┘")]) + "\n"


def leaders(node, prefix: str) -> dict[str, str]:
    """queue -> its leader, as `node`'s API shows them."""
    return {q["name"]: q["leader"] for q in node_queues(node) if q["name"].startswith(prefix)}


def test_rebalance_spreads_six_leaders_over_three_nodes_and_loses_nothing(three):  # noqa: F811
    a, b, c = three
    names = [f"qq.r{n}" for n in range(6)]
    for n, name in enumerate(names):
        declare(a, name)
        publish(a, name, [f"{name}-{m}".encode() for m in range(n + 1)])  # (logs of different lengths)
    assert set(leaders(a, "qq.r").values()) == {a.name}

    out = ctl(a, "rebalance", "quorum")
    assert (out.returncode, out.stderr) == (0, ""), out
    assert out.stdout == ("Re-balancing leaders of quorum queues...\n"
                          + table([(c.name, 2), (b.name, 2), (a.name, 2)])), out
    for node in (a, b, c):  # every node sees each lead two
        wait_for(lambda: Counter(leaders(node, "qq.r").values()) == {a.name: 2, b.name: 2, c.name: 2}, timeout=10,
                 what=f"{node.name}: two leaders each")
    assert sorted(n for n, leader in leaders(a, "qq.r").items() if leader == a.name) == ["qq.r4", "qq.r5"], \
        "the shortest queues move first"
    before = leaders(b, "qq.r")

    # Balanced: nothing moves. JSON as rabbitmq-queues' (each row an Erlang proplist).
    out = ctl(b, "rebalance", "all", "--formatter", "json")
    assert out.returncode == 0, out
    assert json.loads(out.stdout) == {"node": b.name, "result": "ok", "value": [
        [[COLUMNS[0], node.name], [COLUMNS[1], 2], [COLUMNS[2], 0]] for node in (c, b, a)]}, out
    assert leaders(c, "qq.r") == before

    # Warren's classic queues are never mirrored: nothing to rebalance.
    out = ctl(c, "rebalance", "classic")
    assert (out.returncode, out.stdout) == (0, "Re-balancing leaders of classic queues...\n" + NOTHING), out
    out = ctl(c, "rebalance", "classic", "--formatter", "json")
    assert json.loads(out.stdout) == {"node": c.name, "result": "ok", "value": []}, out

    for n, name in enumerate(names):  # everything confirmed before, through a node that led none of them before
        assert drain(c, name) == [f"{name}-{m}".encode() for m in range(n + 1)], name
    publish(b, "qq.r0", [b"after"])  # (and the queues work on after)
    assert drain(a, "qq.r0") == [b"after"]


def test_rebalance_patterns_and_refusals(three):  # noqa: F811
    a, b, c = three
    for n in range(6):
        declare(a, f"qq.p{n}")

    # Two queues match: at most one each (ceil(2 / 3)); the other queues stay where they are.
    out = ctl(b, "rebalance", "quorum", "--queue-pattern", "^qq\\.p[01]$", "-q")
    assert out.returncode == 0, out
    moved = {n: leader for n, leader in leaders(b, "qq.p").items() if leader != a.name}
    assert list(moved) == ["qq.p0"] and moved["qq.p0"] in (b.name, c.name), moved
    assert out.stdout == table([(moved["qq.p0"], 1), (a.name, 1)]), out  # (-q: no banner)

    out = ctl(a, "rebalance", "all", "--vhost-pattern", "^nomatch$")
    assert (out.returncode, out.stdout) == (0, "Re-balancing leaders of all queues...\n" + NOTHING), out
    assert {n: leader for n, leader in leaders(b, "qq.p").items() if leader != a.name} == moved

    out = ctl(a, "rebalance", "bogus")  # (rabbitmq-queues: before the banner, exit 69)
    assert (out.returncode, out.stdout, out.stderr) == (
        69, "", "Error:\ntype bogus is not supported. Try one of all, classic, quorum.\n"), out
    out = ctl(a, "rebalance")
    assert out.returncode == 64 and out.stderr.startswith("Error (argument validation): not enough arguments."), out
    out = ctl(a, "rebalance", "quorum", "--queue-pattern", "(")  # (RabbitMQ's CLI prints a badarg crash)
    assert out.returncode == 69 and out.stdout == "Re-balancing leaders of quorum queues...\n", out
    assert out.stderr.startswith("Error:\ninvalid regular expression '('"), out

    # Warren's route, as the other rabbitmq-queues verbs': the control socket's alone.
    answer = requests.post(a.api + "/quorum-queues/rebalance", auth=("guest", "guest"), timeout=5,
                           json={"type": "quorum"})
    assert answer.status_code == 401, answer.text

    # Over the running nodes alone (ceil(6 / 2) each): a stopped member leads nothing.
    c.stop(signal.SIGTERM)
    wait_for(lambda: nodes(a)[c.name] is False, timeout=10, what="c stopped")
    wait_for(lambda: c.name not in leaders(a, "qq.p").values(), timeout=10, what="c's queue led by another")
    out = ctl(a, "rebalance", "quorum")
    assert (out.returncode, out.stdout) == (0, "Re-balancing leaders of quorum queues...\n"
                                               + table([(b.name, 3), (a.name, 3)])), out
    wait_for(lambda: Counter(leaders(b, "qq.p").values()) == {a.name: 3, b.name: 3}, timeout=10,
             what="b: three leaders each")


def test_rebalance_on_a_node_alone_moves_nothing(make_broker):
    """As a single RabbitMQ node: its queues listed under it, nothing moved."""
    node = make_broker("--node-name", "solo@localhost")
    connection = pika.BlockingConnection(node.pika_params())
    for n in range(3):
        connection.channel().queue_declare(f"qq.solo{n}", durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    out = ctl(node, "rebalance", "quorum")
    assert (out.returncode, out.stdout) == (0, "Re-balancing leaders of quorum queues...\n"
                                               + table([("solo@localhost", 3)])), out
    out = ctl(node, "rebalance", "quorum", "--formatter", "json")
    assert json.loads(out.stdout) == {"node": "solo@localhost", "result": "ok", "value": [
        [[COLUMNS[0], "solo@localhost"], [COLUMNS[1], 3], [COLUMNS[2], 0]]]}, out
