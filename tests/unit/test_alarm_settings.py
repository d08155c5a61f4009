"""The memory and disk monitors without a server: total memory detection (OS, cgroup v1/v2,
unknown), the watermark and disk limit arithmetic, the alarms they raise and clear on a real
Broker, and the disk check interval (RabbitMQ's rabbit_disk_monitor formula)."""

import asyncio
import logging

import pytest

from warren.broker.broker import Broker
from warren.server.disk_monitor import DiskMonitor, check_interval
from warren.server.memory_monitor import (UNKNOWN_TOTAL, MemoryMonitor, ResidentMemory, cgroup_memory_limit,
                                          detect_total_memory)

GiB = 1024 ** 3


def fake_system(tmp_path, meminfo_kb=None, cgroup_lines=(), files=None):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    root.mkdir()
    if meminfo_kb is not None:
        (proc / "meminfo").write_text(f"MemTotal:       {meminfo_kb} kB\nMemFree:        1 kB\n")
    (proc / "self" / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    for path, text in (files or {}).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(proc), str(root)


def test_total_memory_from_meminfo(tmp_path):
    proc, root = fake_system(tmp_path, meminfo_kb=8 * 1024 * 1024, cgroup_lines=["0::/"])
    assert detect_total_memory(proc, root) == 8 * GiB


def test_cgroup_v2_limit_of_the_process_or_an_ancestor(tmp_path):
    proc, root = fake_system(tmp_path, 8 * 1024 * 1024, ["0::/app/worker"], {
        "cgroup.controllers": "memory", "app/memory.max": str(2 * GiB), "app/worker/memory.max": "max"})
    assert cgroup_memory_limit(proc, root) == 2 * GiB
    assert detect_total_memory(proc, root) == 2 * GiB


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path):
    proc, root = fake_system(tmp_path, 8 * 1024 * 1024, ["4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc"], {
        "memory/docker/abc/memory.limit_in_bytes": str(512 * 1024 * 1024),
        "memory/memory.limit_in_bytes": "9223372036854771712"})
    assert detect_total_memory(proc, root) == 512 * 1024 * 1024
    proc, root = fake_system(tmp_path / "b", 8 * 1024 * 1024, ["4:memory:/"],
                             {"memory/memory.limit_in_bytes": "9223372036854771712"})
    assert cgroup_memory_limit(proc, root) is None
    assert detect_total_memory(proc, root) == 8 * GiB


def test_cgroup_mounted_as_the_root_inside_a_container(tmp_path):
    # /proc/self/cgroup names a path the container cannot see: the mount's root is its cgroup.
    proc, root = fake_system(tmp_path, 8 * 1024 * 1024, ["4:memory:/kubepods/pod1/c1"],
                             {"memory/memory.limit_in_bytes": str(GiB)})
    assert detect_total_memory(proc, root) == GiB


def monitor(watermark, used, total=4 * GiB):
    broker = Broker()
    m = MemoryMonitor(broker, watermark, total_memory=lambda: total, memory_used=lambda: used[0])
    return broker, m


def test_watermark_zero_alarms_at_once_and_a_high_multiplier_never():
    used = [50 << 20]
    broker, m = monitor(("relative", 0.0), used)
    m.set_watermark(("relative", 0.0))
    assert (broker.config.mem_limit, list(broker.alarms)) == (0, ["memory"])
    m.set_watermark(("relative", 100.0))
    assert (broker.config.mem_limit, list(broker.alarms)) == (400 * GiB, [])
    used[0] = 300 * GiB
    m.check()
    assert list(broker.alarms) == []


def test_alarm_follows_rss_without_hysteresis():
    used = [100]
    broker, m = monitor(("relative", 0.4), used, total=1000)
    m.set_watermark(("relative", 0.4))
    assert broker.config.mem_limit == 400 and not broker.alarms
    used[0] = 401
    m.check()
    assert "memory" in broker.alarms
    used[0] = 400  # at the limit is not above it
    m.check()
    assert "memory" not in broker.alarms


def test_absolute_watermark_is_capped_at_total_memory():
    broker, m = monitor(("absolute", 10 * GiB), [1], total=4 * GiB)
    m.set_watermark(("absolute", 2_000_000_000))
    assert broker.config.mem_limit == 2_000_000_000
    m.set_watermark(("absolute", 10 * GiB))
    assert broker.config.mem_limit == 4 * GiB


def test_unknown_total_memory_assumes_1024_mb_with_rabbitmqs_warning(caplog):
    broker, m = monitor(("relative", 3.0), [1], total=None)
    with caplog.at_level(logging.INFO, logger="warren.server"):
        m.set_watermark(("relative", 3.0))
    assert broker.config.mem_limit == 3 * UNKNOWN_TOTAL
    assert "Assuming memory size is 1024MB." in caplog.text
    assert "Unknown total memory size for your OS {unix," in caplog.text
    assert "Memory limit set to 3072MB." in caplog.text


def test_resident_memory_is_this_process():
    rss = ResidentMemory()
    try:
        before = rss()
        block = bytearray(64 << 20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        assert rss() >= before + (60 << 20)
        del block
    finally:
        rss.close()


def test_disk_check_interval_follows_rabbitmq():
    # 2 * (free - limit) / 250 MB/s, between 0.1 s and 10 s; 10 s while alarmed.
    assert check_interval(50_000_000 + 250_000_000, 50_000_000, False) == 2.0
    assert check_interval(100 * 10 ** 9, 50_000_000, False) == 10.0
    assert check_interval(60_000_000, 50_000_000, False) == 0.1
    assert check_interval(10, 50_000_000, True) == 10.0


def run_disk_monitor(limit, free, total=GiB):
    broker = Broker()
    free_box = [free]

    def measure(_directory):
        if isinstance(free_box[0], Exception):
            raise free_box[0]
        return free_box[0]

    m = DiskMonitor(broker, "/data", limit, total_memory=lambda: total, measure=measure)

    async def go():
        await m.start(None)
        await m.stop()
    asyncio.run(go())
    return broker, m, free_box


def test_disk_alarm_below_the_limit_and_mem_relative(caplog):
    with caplog.at_level(logging.INFO, logger="warren.server"):
        broker, m, free = run_disk_monitor(("absolute", 50_000_000), 49_999_999)
    assert (broker.config.disk_free_limit, list(broker.alarms)) == (50_000_000, ["disk"])
    assert "Disk free limit set to 50MB" in caplog.text
    assert "Free disk space is insufficient. Free bytes: 49999999. Limit: 50000000" in caplog.text
    m.set_limit(("absolute", 49_999_999))  # equal is enough
    assert list(broker.alarms) == []
    m.set_limit(("mem_relative", 1.5))
    assert broker.config.disk_free_limit == round(1.5 * GiB) and list(broker.alarms) == ["disk"]


def test_disk_monitoring_disabled_when_free_space_cannot_be_read(caplog):
    with caplog.at_level(logging.INFO, logger="warren.server"):
        broker, m, _ = run_disk_monitor(("absolute", 50_000_000), OSError(38, "Function not implemented"))
        assert "Disabling disk free space monitoring" in caplog.text
        assert broker.config.disk_free_limit is None and not m.enabled and not broker.alarms
        m.set_limit(("absolute", 10 ** 18))  # (logged at INFO: inside the level's scope)
        assert "Cannot set disk free limit: disabled disk free space monitoring" in caplog.text
    assert not broker.alarms


@pytest.mark.parametrize("setting, expected", [(("absolute", -5), -5), (("absolute", 0), 0)])
def test_non_positive_disk_limits_never_alarm(setting, expected):
    broker, m, free = run_disk_monitor(setting, 0)
    assert (broker.config.disk_free_limit, list(broker.alarms)) == (expected, [])
