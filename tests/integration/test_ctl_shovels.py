"""warrenctl's shovel verbs, rabbitmqctl's with the shovel plugin (3.10.8): `shovel_status`,
`delete_shovel`, `restart_shovel` - their informational lines, columns, `-q`/`-s`/
`--no-table-headers`, `--formatter json`, exit codes and error texts.

Run as the alarm-monitor verb tests are: warrenctl against Warren (through the control socket
in its data dir, as rabbitmqctl reaches its node) and, with WARREN_TEST_BROKER and
WARREN_TEST_RABBITMQCTL set, rabbitmqctl against RabbitMQ with the same arguments and
assertions:

    python tools/rabbitmq_node.py run --plugins rabbitmq_shovel,rabbitmq_shovel_management -- \\
        python -m pytest -q tests/integration/test_ctl_shovels.py

The shovels are made with `set_parameter shovel` through the same command.
"""

import json
import os
import re
import shlex
import subprocess
import time

import pytest

from conftest import EXTERNAL, start_broker
from warrenctl_path import WARRENCTL

RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
TIMESTAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"  # rabbitmqctl's fmt_ts: every field zero-padded
# The columns of a running shovel from a queue to a queue (a map's keys: alphabetical).
QUEUE_TO_QUEUE = ["destination", "destination_protocol", "destination_queue", "last_changed", "name", "source",
                  "source_protocol", "source_queue", "state", "termination_reason", "type", "vhost"]


class Ctl:
    def __init__(self, command: list[str]):
        self.command = command

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.command, *args], capture_output=True, text=True, timeout=60)
        assert "Traceback" not in r.stdout + r.stderr, r
        return r

    def ok(self, *args: str) -> str:
        r = self(*args)
        assert (r.returncode, r.stderr) == (0, ""), r
        return r.stdout

    def fails(self, code: int, *args: str) -> subprocess.CompletedProcess:
        r = self(*args)
        assert r.returncode == code, r
        return r

    def statuses(self) -> dict:
        """shovel_status --formatter json, by (vhost, name)."""
        return {(s.get("vhost"), s["name"]): s for s in json.loads(self.ok("shovel_status", "--formatter", "json"))}

    def node(self) -> str:
        banner = self.ok("shovel_status").splitlines()[0]
        m = re.fullmatch(r"Shovel status on node (\S+)", banner)
        assert m, banner
        return m.group(1)


@pytest.fixture(scope="module")
def ctl():
    if EXTERNAL:
        if not RABBITMQCTL:
            pytest.skip("needs WARREN_TEST_RABBITMQCTL against another broker")
        rabbitmqctl = Ctl(shlex.split(RABBITMQCTL))
        if "not found" in rabbitmqctl("shovel_status").stderr:  # (a node without the shovel plugin)
            pytest.skip("the broker has no shovel plugin")
        yield rabbitmqctl
        return
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    b = start_broker()
    yield Ctl([WARRENCTL, "--data-dir", b.data_dir])
    b.stop()


def wait_for(ctl: Ctl, key, state="running", timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = ctl.statuses().get(key)
        if s is not None and s["state"] == state:
            return s
        assert time.monotonic() < deadline, f"shovel {key} not {state}: {s}"
        time.sleep(0.1)


def queue_shovel(ctl: Ctl, name: str, src: str, dest: str, vhost: str = "/", **more):
    value = {"src-uri": "amqp://" if vhost == "/" else f"amqp:///{vhost}", "src-queue": src,
             "dest-uri": "amqp://" if vhost == "/" else f"amqp:///{vhost}", "dest-queue": dest, **more}
    ctl.ok("set_parameter", "-p", vhost, "shovel", name, json.dumps(value))


@pytest.fixture
def cleanup(ctl):
    """Names to remove afterwards: ("shovel", vhost, name), ("queue", vhost, name), ("vhost", name)."""
    things = []
    yield things
    for kind, *what in reversed(things):
        if kind == "shovel":
            ctl("clear_parameter", "-p", what[0], "shovel", what[1])
        elif kind == "queue":
            ctl("delete_queue", "-p", what[0], what[1])
        else:
            ctl("delete_vhost", what[0])


def not_found(node: str, vhost: str) -> str:
    return (f"Error:\nShovel with the given name was not found on the target node '{node}' and / or virtual "
            f"host '{vhost}'\n")


# --- shovel_status ------------------------------------------------------------------------------

def test_shovel_status_lists_every_shovel(ctl, cleanup, uid):
    vhost = f"ctl-shv-{uid}"
    ctl.ok("add_vhost", vhost)
    cleanup.append(("vhost", vhost))
    name, other = f"s1 {uid}", f"s2-{uid}"
    src, dest = f"ctl-shv-src-{uid}", f"ctl-shv-dest-{uid}"
    cleanup += [("queue", "/", src), ("queue", "/", dest), ("shovel", "/", name), ("shovel", vhost, other)]
    queue_shovel(ctl, name, src, dest)
    ctl.ok("set_parameter", "-p", vhost, "shovel", other, json.dumps(
        {"src-uri": f"amqp:///{vhost}", "src-exchange": "amq.topic", "src-exchange-key": "a.#",
         "dest-uri": f"amqp:///{vhost}", "dest-exchange": "amq.direct", "dest-exchange-key": "k"}))
    wait_for(ctl, ("/", name))
    wait_for(ctl, (vhost, other))
    node = ctl.node()

    # A banner without " ...", then a header: the first row's keys; every row has its own
    # columns (a shovel between exchanges has other ones than one between queues).
    row = rf"amqp://\tamqp091\t{dest}\t{TIMESTAMP}\t{name}\tamqp://\tamqp091\t{src}\trunning\t\tdynamic\t/"
    other_row = (rf"amqp:///{vhost}\tamq\.direct\tk\tamqp091\t{TIMESTAMP}\t{other}\tamqp:///{vhost}\tamq\.topic\t"
                 rf"a\.#\tamqp091\trunning\t\tdynamic\t{vhost}")
    out = ctl.ok("shovel_status").splitlines()
    assert out[0] == f"Shovel status on node {node}"
    assert len(out[1].split("\t")) == len(out[2].split("\t")) and out[1].split("\t") == sorted(out[1].split("\t"))
    assert sum(bool(re.fullmatch(row, line)) for line in out[2:]) == 1, out
    assert sum(bool(re.fullmatch(other_row, line)) for line in out[2:]) == 1, out
    if re.fullmatch(row, out[2]):
        assert out[1].split("\t") == QUEUE_TO_QUEUE
    # -q drops the banner, --no-table-headers the header, -s both.
    assert ctl.ok("-q", "shovel_status").splitlines()[0] == out[1]
    no_headers = ctl.ok("shovel_status", "--no-table-headers").splitlines()
    assert no_headers[0] == out[0] and out[1] not in no_headers
    assert sum(bool(re.fullmatch(row, line)) for line in no_headers[1:]) == 1
    silent = ctl.ok("shovel_status", "-s").splitlines()
    assert out[0] not in silent and out[1] not in silent
    assert sum(bool(re.fullmatch(row, line)) for line in silent) == 1
    assert sum(bool(re.fullmatch(other_row, line)) for line in silent) == 1
    # rabbitmqctl 3.10.8 takes arguments and a vhost there, and ignores them.
    for args in (["shovel_status", "anything"], ["shovel_status", "-p", f"nowhere-{uid}"]):
        again = ctl.ok(*args).splitlines()
        assert again[0] == out[0] and sum(bool(re.fullmatch(row, line)) for line in again) == 1

    listed = ctl.statuses()
    mine, theirs = listed[("/", name)], listed[(vhost, other)]
    assert re.fullmatch(TIMESTAMP, mine.pop("last_changed")) and re.fullmatch(TIMESTAMP, theirs.pop("last_changed"))
    assert mine == {"destination": "amqp://", "destination_protocol": "amqp091", "destination_queue": dest,
                    "name": name, "source": "amqp://", "source_protocol": "amqp091", "source_queue": src,
                    "state": "running", "termination_reason": "", "type": "dynamic", "vhost": "/"}
    assert theirs == {"destination": f"amqp:///{vhost}", "destination_exchange": "amq.direct",
                      "destination_exchange_key": "k", "destination_protocol": "amqp091", "name": other,
                      "source": f"amqp:///{vhost}", "source_exchange": "amq.topic", "source_exchange_key": "a.#",
                      "source_protocol": "amqp091", "state": "running", "termination_reason": "",
                      "type": "dynamic", "vhost": vhost}
    # The JSON keeps rabbitmqctl's layout: one object a line, keys in order.
    text = ctl.ok("shovel_status", "--formatter", "json")
    assert text.startswith("[\n{") and text.endswith("}\n]\n")
    for line in text.splitlines()[1:-1]:
        keys = list(json.loads(line.lstrip(",")))
        assert keys == sorted(keys)


def test_shovel_status_with_no_shovels(make_broker):
    """A broker without shovels: the banner alone; JSON an empty list (as rabbitmqctl 3.10.8,
    seen on a node of its own)."""
    b = make_broker()
    ctl = Ctl([WARRENCTL, "--data-dir", b.data_dir])
    node = ctl.node()
    assert ctl.ok("shovel_status") == f"Shovel status on node {node}\n"
    assert ctl.ok("shovel_status", "-s") == ""
    assert ctl.ok("shovel_status", "--formatter", "json") == "[\n]\n"


def test_a_terminated_shovel(ctl, cleanup, uid):
    """Warren only (which RabbitMQ shows only for a moment): a stopped shovel's row has the
    reason and no source or destination. A shovel whose source queue is deleted comes back at
    once (declaring it again), as RabbitMQ's; deleted again within reconnect-delay, it stays
    terminated until then."""
    if EXTERNAL:
        pytest.skip("RabbitMQ restarts the shovel at once")
    name, src, dest = f"t-{uid}", f"ctl-shv-t-src-{uid}", f"ctl-shv-t-dest-{uid}"
    cleanup += [("queue", "/", src), ("queue", "/", dest), ("shovel", "/", name)]
    queue_shovel(ctl, name, src, dest, **{"reconnect-delay": 60})
    wait_for(ctl, ("/", name))
    ctl.ok("delete_queue", src)
    time.sleep(0.2)
    wait_for(ctl, ("/", name))  # (running again, at once)
    ctl.ok("delete_queue", src)
    s = wait_for(ctl, ("/", name), "terminated")
    assert s["termination_reason"] and (s["source"], s["destination"]) == ("", "")
    assert sorted(s) == ["destination", "last_changed", "name", "source", "state", "termination_reason", "type",
                         "vhost"]
    line = next(line for line in ctl.ok("shovel_status", "-s").splitlines() if f"\t{name}\t" in line)
    assert re.fullmatch(rf"\t{TIMESTAMP}\t{name}\t\tterminated\t.+\tdynamic\t/", line), line


# --- delete_shovel ------------------------------------------------------------------------------

def test_delete_shovel(ctl, cleanup, uid):
    vhost = f"ctl-shv-d-{uid}"
    ctl.ok("add_vhost", vhost)
    cleanup.append(("vhost", vhost))
    name, src, dest = f"d {uid}", f"ctl-shv-d-src-{uid}", f"ctl-shv-d-dest-{uid}"
    cleanup += [("shovel", vhost, name), ("shovel", "/", name), ("queue", "/", src), ("queue", "/", dest)]
    queue_shovel(ctl, name, src, dest)
    queue_shovel(ctl, name, src, dest, vhost)
    wait_for(ctl, ("/", name))
    wait_for(ctl, (vhost, name))
    node = ctl.node()

    assert ctl.ok("delete_shovel", "-p", vhost, name) == f"Deleting shovel {name} in vhost {vhost}\n"
    statuses = ctl.statuses()
    assert (vhost, name) not in statuses and ("/", name) in statuses
    assert name not in ctl.ok("list_parameters", "-p", vhost)  # its runtime parameter went with it
    # Not there (any more), or no such vhost: the banner, rabbitmqctl's error, 69.
    r = ctl.fails(69, "delete_shovel", "--vhost", vhost, name)
    assert (r.stdout, r.stderr) == (f"Deleting shovel {name} in vhost {vhost}\n", not_found(node, vhost))
    r = ctl.fails(69, "delete_shovel", "-p", f"nowhere-{uid}", name)
    assert (r.stdout, r.stderr) == (f"Deleting shovel {name} in vhost nowhere-{uid}\n",
                                    not_found(node, f"nowhere-{uid}"))
    r = ctl.fails(69, "delete_shovel", "-q", f"nothing-{uid}")
    assert (r.stdout, r.stderr) == ("", not_found(node, "/"))

    # The default vhost is /; -q and --formatter json print nothing.
    assert ctl.ok("delete_shovel", "--formatter", "json", name) == ""
    assert ("/", name) not in ctl.statuses()
    queue_shovel(ctl, name, src, dest)
    wait_for(ctl, ("/", name))
    assert ctl.ok("delete_shovel", "-q", name) == ""
    assert ("/", name) not in ctl.statuses()


def test_restart_shovel(ctl, cleanup, uid):
    vhost = f"ctl-shv-r-{uid}"
    ctl.ok("add_vhost", vhost)
    cleanup.append(("vhost", vhost))
    name, src, dest = f"r {uid}", f"ctl-shv-r-src-{uid}", f"ctl-shv-r-dest-{uid}"
    cleanup += [("shovel", vhost, name), ("queue", vhost, src), ("queue", vhost, dest)]
    queue_shovel(ctl, name, src, dest, vhost)
    wait_for(ctl, (vhost, name))
    node = ctl.node()

    out = ctl.ok("restart_shovel", "-p", vhost, name)
    assert out == f"Restarting dynamic Shovel {name} in virtual host {vhost} on node {node}\n"
    wait_for(ctl, (vhost, name))  # running again, with its parameter
    assert name in ctl.ok("list_parameters", "-p", vhost)
    assert ctl.ok("restart_shovel", "-q", "--vhost", vhost, name) == ""
    assert ctl.ok("restart_shovel", "--formatter", "json", "-p", vhost, name) == ""
    wait_for(ctl, (vhost, name))

    r = ctl.fails(69, "restart_shovel", name)  # in / there is none
    assert (r.stdout, r.stderr) == (f"Restarting dynamic Shovel {name} in virtual host / on node {node}\n",
                                    not_found(node, "/"))
    r = ctl.fails(69, "restart_shovel", "-p", f"nowhere-{uid}", name)
    assert (r.stdout, r.stderr) == (
        f"Restarting dynamic Shovel {name} in virtual host nowhere-{uid} on node {node}\n",
        not_found(node, f"nowhere-{uid}"))
    ctl.ok("delete_shovel", "-p", vhost, name)
    r = ctl.fails(69, "restart_shovel", "-p", vhost, name)
    assert r.stderr == not_found(node, vhost)


# --- usage --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, error", [
    (["delete_shovel"], "Error (argument validation): not enough arguments."),
    (["delete_shovel", "a", "b"], "Error (argument validation): too many arguments."),
    (["restart_shovel"], "Error (argument validation): not enough arguments."),
    (["restart_shovel", "a", "b"], "Error (argument validation): too many arguments."),
    (["delete_shovel", "--if-empty", "a"], "Error (argument validation): Invalid options for this command:"),
    (["shovel_status", "--if-unused"], "Error (argument validation): Invalid options for this command:"),
])
def test_usage_errors(ctl, args, error):
    r = ctl.fails(64, *args)
    assert r.stdout == "" and r.stderr.splitlines()[0] == error, r
    # rabbitmqctl's usage lines for these verbs
    usage = {"delete_shovel": "delete_shovel [--vhost <vhost>] <name>", "restart_shovel": "restart_shovel <name>",
             "shovel_status": "shovel_status"}[args[0]]
    assert any(line.endswith(f"[--quiet] {usage}") for line in r.stderr.splitlines()), r.stderr
