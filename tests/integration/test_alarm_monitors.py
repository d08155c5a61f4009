"""The memory and disk alarms' monitors and settings: `set_vm_memory_high_watermark`,
`set_disk_free_limit` and `status --formatter json`, with rabbitmqctl 3.10's validation,
messages and exit codes; the alarms in /api/nodes and /api/health/checks/alarms; the log lines.

The verb tests run warrenctl against Warren (through the control socket in its data dir, as
rabbitmqctl reaches its node) and, with WARREN_TEST_BROKER and WARREN_TEST_RABBITMQCTL set
(`tools/rabbitmq_node.py run`), rabbitmqctl against RabbitMQ with the same arguments. The
config, log and API tests need a Warren of their own and skip themselves against RabbitMQ.
"""

import json
import os
import shlex
import subprocess

import pytest
import requests

from conftest import EXTERNAL, start_broker
from warrenctl_path import WARRENCTL

RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
AUTH = ("guest", "guest")


class Ctl:
    def __init__(self, command: list[str]):
        self.command = command

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.command, *args], capture_output=True, text=True, timeout=60)

    def ok(self, *args: str) -> str:
        r = self(*args)
        assert r.returncode == 0, r
        return r.stdout

    def status(self) -> dict:
        return json.loads(self.ok("status", "--formatter", "json"))

    def restore(self) -> None:
        self.ok("set_vm_memory_high_watermark", "0.4")
        self.ok("set_disk_free_limit", "50000000")


@pytest.fixture(scope="module")
def ctl():
    if EXTERNAL:
        if not RABBITMQCTL:
            pytest.skip("needs WARREN_TEST_RABBITMQCTL against another broker")
        c = Ctl(shlex.split(RABBITMQCTL))
        yield c
        c.restore()
        return
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    b = start_broker()
    yield Ctl([WARRENCTL, "--data-dir", b.data_dir])
    b.stop()


def first_error_line(r: subprocess.CompletedProcess) -> str:
    return (r.stderr.strip().splitlines() or [""])[0]


# rabbitmqctl 3.10.8's answers, taken on a real node.
@pytest.mark.parametrize("args, code, error", [
    (["1.5"], 65, "Error (argument validation): Bad argument: The threshold should be a fraction between 0.0 and 1.0"),
    (["-1"], 65, "Error (argument validation): Bad argument: The threshold should be a fraction between 0.0 and 1.0"),
    (["100"], 65, "Error (argument validation): Bad argument: The threshold should be a fraction between 0.0 and 1.0"),
    (["abc"], 65, "Error (argument validation): Bad argument."),
    (["0.5x"], 65, "Error (argument validation): Bad argument."),
    (["absolute", "2gb"], 65, "Error (argument validation): Bad argument: Invalid units."),
    (["absolute", "1.5GB"], 65, "Error (argument validation): Bad argument: The threshold should be an integer."),
    (["absolute", "abc"], 65, "Error (argument validation): Bad argument."),
    (["absolute"], 64, "Error (argument validation): not enough arguments."),
    ([], 64, "Error (argument validation): not enough arguments."),
    (["0.5", "0.6"], 64, "Error (argument validation): too many arguments."),
    (["absolute", "2", "GB"], 64, "Error (argument validation): too many arguments."),
    (["relative", "0.5"], 64, "Error (argument validation): too many arguments."),
])
def test_set_vm_memory_high_watermark_refusals(ctl, args, code, error):
    before = ctl.status()["vm_memory_high_watermark_limit"]
    r = ctl("set_vm_memory_high_watermark", *args)
    assert (r.returncode, first_error_line(r)) == (code, error), r
    assert "Setting memory threshold" not in r.stdout
    assert ctl.status()["vm_memory_high_watermark_limit"] == before


# node_wide: the tests that set (or try to set) a threshold; the refusals change nothing.
@pytest.mark.node_wide
def test_absolute_watermark_of_zero_fails_after_the_banner(ctl):
    # rabbitmqctl 3.10 validates it, prints the banner, then fails with exit code 70.
    r = ctl("set_vm_memory_high_watermark", "absolute", "0")
    assert r.returncode == 70, r
    # (RabbitMQ's stack trace follows the banner on stdout; Warren says why on stderr.)
    assert r.stdout.startswith("Setting memory threshold on ")
    assert r.stdout.splitlines()[0].endswith(" to 0 bytes ...")
    assert r.stderr.startswith("Error:\n")


@pytest.mark.parametrize("args, code, error", [
    (["mem_relative", "-1"], 65, "Error (argument validation): Bad argument."),
    (["mem_relative", "abc"], 65, "Error (argument validation): Bad argument."),
    (["abc"], 65, "Error (argument validation): Bad argument."),
    (["1.5GB"], 65, "Error (argument validation): Bad argument."),
    (["1gb"], 65, "Error (argument validation): Bad argument."),
    (["mem_relative"], 64, "Error (argument validation): not enough arguments."),
    ([], 64, "Error (argument validation): not enough arguments."),
    (["1", "GB"], 64, "Error (argument validation): too many arguments."),
    (["absolute", "1GB"], 64, "Error (argument validation): too many arguments."),
])
def test_set_disk_free_limit_refusals(ctl, args, code, error):
    r = ctl("set_disk_free_limit", *args)
    assert (r.returncode, first_error_line(r)) == (code, error), r
    assert ctl.status()["disk_free_limit"] == 50_000_000


@pytest.mark.node_wide
def test_watermark_zero_raises_the_memory_alarm_and_setting_it_back_clears_it(ctl):
    try:
        out = ctl.ok("set_vm_memory_high_watermark", "0")
        assert out.startswith("Setting memory threshold on ") and out.rstrip().endswith(" to 0 ...")
        status = ctl.status()
        assert [(a["resource"], a["type"]) for a in status["alarms"]] == [("memory", "resource_limit")]
        assert status["vm_memory_high_watermark_limit"] == 0
        assert status["vm_memory_high_watermark_setting"] == {"relative": 0.0}

        ctl.ok("set_vm_memory_high_watermark", "0.4")
        status = ctl.status()
        assert status["alarms"] == []
        assert status["vm_memory_high_watermark_setting"] == {"relative": 0.4}
        relative_limit = status["vm_memory_high_watermark_limit"]
        assert relative_limit > 0

        out = ctl.ok("set_vm_memory_high_watermark", "absolute", "2GB")
        assert out.rstrip().endswith(" to 2GB bytes ...")
        status = ctl.status()
        assert status["vm_memory_high_watermark_setting"] == {"absolute": 2_000_000_000}
        assert status["vm_memory_high_watermark_limit"] == 2_000_000_000  # machines with more than 2 GB
        assert status["alarms"] == []
    finally:
        ctl.restore()


@pytest.mark.node_wide
def test_disk_limit_above_the_free_space_raises_the_disk_alarm(ctl):
    try:
        free = ctl.status()["disk_free"]
        limit = free * 4 + 10 ** 12  # far above what any check in between could free
        out = ctl.ok("set_disk_free_limit", str(limit))
        assert out.rstrip().endswith(f" to {limit} bytes ...")
        status = ctl.status()  # checked at once, not at the next interval
        assert [(a["resource"], a["type"]) for a in status["alarms"]] == [("disk", "resource_limit")]
        assert status["disk_free_limit"] == limit

        out = ctl.ok("set_disk_free_limit", "50MB")
        assert out.rstrip().endswith(" to 50MB bytes ...")
        status = ctl.status()
        assert status["alarms"] == []
        assert status["disk_free_limit"] == 50_000_000

        out = ctl.ok("set_disk_free_limit", "mem_relative", "1.0")
        assert out.rstrip().endswith(" to 1.0 times the total RAM ...")
        assert ctl.status()["disk_free_limit"] > 50_000_000

        ctl.ok("set_disk_free_limit", "-5")  # taken as it is: never an alarm
        status = ctl.status()
        assert (status["disk_free_limit"], status["alarms"]) == (-5, [])
    finally:
        ctl.restore()


@pytest.mark.node_wide
def test_both_alarms_together(ctl):
    try:
        ctl.ok("set_vm_memory_high_watermark", "0")
        ctl.ok("set_disk_free_limit", str(ctl.status()["disk_free"] * 4 + 10 ** 12))
        assert sorted(a["resource"] for a in ctl.status()["alarms"]) == ["disk", "memory"]
        ctl.ok("set_vm_memory_high_watermark", "0.4")
        assert [a["resource"] for a in ctl.status()["alarms"]] == ["disk"]
    finally:
        ctl.restore()
    assert ctl.status()["alarms"] == []


# --- Warren only: the config file, the log, the API --------------------------------------

warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="starts its own Warren")


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "rabbitmq.conf"
    path.write_text(text)
    return str(path)


def node_figures(b) -> dict:
    node = requests.get(f"{b.api}/nodes", auth=AUTH, timeout=10).json()[0]
    return {k: node[k] for k in ("mem_used", "mem_limit", "mem_alarm", "disk_free", "disk_free_limit",
                                 "disk_free_alarm")}


@warren_only
def test_config_watermark_zero_and_disk_limit_above_free_space(tmp_path):
    config = write_config(tmp_path, "vm_memory_high_watermark.relative = 0.0\n"
                                    "disk_free_limit.absolute = 1000000TB\n")
    b = start_broker("--config", config)
    try:
        figures = node_figures(b)
        assert figures["mem_limit"] == 0 and figures["mem_alarm"] is True
        assert figures["disk_free_limit"] == 10 ** 18 and figures["disk_free_alarm"] is True
        # /api/overview carries the same figures (Warren's addition), for monitoring users.
        overview = requests.get(f"{b.api}/overview", auth=AUTH, timeout=10).json()
        assert (overview["mem_alarm"], overview["disk_free_alarm"], overview["mem_limit"]) == (True, True, 0)
        assert overview["disk_free_limit"] == 10 ** 18 and overview["mem_used"] > 10 << 20
        assert figures["mem_used"] > 10 << 20 and 0 < figures["disk_free"] < 10 ** 18
        health = requests.get(f"{b.api}/health/checks/alarms", auth=AUTH, timeout=10)
        assert health.status_code == 503
        # (rabbit_alarm:format_as_map's names: "disk space", as RabbitMQ 3.10.8 answers)
        assert health.json()["alarms"] == [{"node": "warren@localhost", "resource": "disk space"},
                                           {"node": "warren@localhost", "resource": "memory"}]
        log = b.log()
        assert "Memory limit set to 0MB." in log
        assert "Memory high watermark set to 0 MiB (0 bytes) of " in log
        assert "memory resource limit alarm set on node 'warren@localhost'." in log
        assert "Disk free limit set to 1000000000000MB" in log
        assert "Free disk space is insufficient. Free bytes: " in log
        assert "disk resource limit alarm set on node 'warren@localhost'." in log

        ctl = Ctl([WARRENCTL, "--data-dir", b.data_dir])
        ctl.ok("set_vm_memory_high_watermark", "0.4")
        ctl.ok("set_disk_free_limit", "50MB")
        figures = node_figures(b)
        assert (figures["mem_alarm"], figures["disk_free_alarm"]) == (False, False)
        assert figures["mem_limit"] > 0 and figures["disk_free_limit"] == 50_000_000
        assert requests.get(f"{b.api}/health/checks/alarms", auth=AUTH, timeout=10).json() == {"status": "ok"}
        log = b.log()
        assert "memory resource limit alarm cleared on node 'warren@localhost'" in log
        assert "Free disk space is sufficient. Free bytes: " in log
        assert "disk resource limit alarm cleared on node 'warren@localhost'" in log
    finally:
        b.stop()


@warren_only
def test_defaults_and_a_high_multiplier(tmp_path):
    b = start_broker("--config", write_config(tmp_path, "vm_memory_high_watermark.relative = 100.0\n"))
    try:
        figures = node_figures(b)
        assert figures["mem_alarm"] is False and figures["mem_limit"] > 100 * figures["mem_used"]
        assert figures["disk_free_limit"] == 50_000_000 and figures["disk_free_alarm"] is False
        log = b.log()
        assert "Enabling free disk space monitoring" in log and "Disk free limit set to 50MB" in log
        assert f"Memory limit set to {figures['mem_limit'] >> 20}MB." in log
        watermark = requests.get(f"{b.api}/nodes/warren@localhost/vm-memory-high-watermark", auth=AUTH,
                                 timeout=10).json()
        assert watermark == {"relative": 100.0, "limit": figures["mem_limit"]}
    finally:
        b.stop()


@warren_only
def test_settings_endpoints_are_for_administrators(tmp_path):
    b = start_broker()
    try:
        user = requests.put(f"{b.api}/users/watcher", auth=AUTH, timeout=10,
                            json={"password": "pw", "tags": "monitoring"})
        assert user.status_code in (201, 204)
        for path, body in (("vm-memory-high-watermark", {"relative": 0.0}), ("disk-free-limit", {"absolute": 1})):
            url = f"{b.api}/nodes/warren@localhost/{path}"
            r = requests.put(url, auth=("watcher", "pw"), json=body, timeout=10)
            assert (r.status_code, r.json()["reason"]) == (401, "Not administrator user")
            assert requests.get(url, auth=("watcher", "pw"), timeout=10).status_code == 401
            bad = requests.put(url, auth=AUTH, json={"fraction": 1}, timeout=10)
            assert bad.status_code == 400
            assert requests.put(f"{b.api}/nodes/rabbit@elsewhere/{path}", auth=AUTH, json=body,
                                timeout=10).status_code == 404
        assert node_figures(b)["mem_alarm"] is False
    finally:
        b.stop()
