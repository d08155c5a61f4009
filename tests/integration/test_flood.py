"""The flood (issue 10 "Tests"; not a timed test): four publishers at full speed (64 KiB bodies
with confirms, half persistent, half transient) with no consumer, then a slow consumer, under a
300 MB watermark.

- The broker's RSS stays within the watermark plus a small margin: past half of it (the
  paging ratio) queues page bodies to disk and the memory falls. Without paging the same
  flood took Warren past 1 GB (the read-back of the disk tail alone was a 500 MB step).
- Paging keeps Warren below the watermark, so the flood alone does not raise the alarm here;
  the test raises it mid-flood (`warrenctl set_vm_memory_high_watermark 0`): every publisher
  is blocked, the slow consumer drains meanwhile, and when the watermark is set back
  (`absolute 300000000`) they are unblocked and resume.
- Every confirmed message arrives.

Warren only: it starts its own broker with a config file and reads its RSS. It prints the
figures bench/RESULTS.md quotes ("Memory alarm flood": peak RSS, time from alarm to blocked and
from clear to unblocked).
"""

import shutil
import subprocess
import threading
import time

import pika
import pytest
import requests

from conftest import EXTERNAL, process_memory, start_broker
from warrenctl_path import WARRENCTL

MiB = 1 << 20
WATERMARK = 300_000_000
MARGIN = 40 * MiB          # RSS may pass the watermark by this much at most (sampling, buffers)
BODY = 64 * 1024
FLOOD_BYTES = 800 * MiB    # published before the alarm: more than twice the watermark
PUBLISHERS = 4
WAIT = 30.0

pytestmark = [pytest.mark.skipif(bool(EXTERNAL), reason="Warren only: starts its own broker, reads its RSS"),
              pytest.mark.timeout(180)]


rss = process_memory


class Sampler(threading.Thread):
    """The broker's peak RSS, sampled every 10 ms."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.01)


class Publisher(threading.Thread):
    """Publishes numbered 64 KiB bodies with confirms as fast as pika goes until told to stop;
    records what was confirmed, and whether it got connection.blocked and .unblocked (pika
    runs those callbacks only once the held publish returns: the test watches the broker's
    connection states for the timing)."""

    def __init__(self, broker, queue: str, index: int):
        super().__init__(daemon=True)
        self.broker, self.queue, self.index = broker, queue, index
        self.confirmed: list[bytes] = []
        self.blocked: list[float] = []
        self.unblocked: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.broker.pika_params(
                blocked_connection_timeout=None, client_properties={"connection_name": f"flood-{self.index}"}))
            conn.add_on_connection_blocked_callback(lambda *_: self.blocked.append(time.monotonic()))
            conn.add_on_connection_unblocked_callback(lambda *_: self.unblocked.append(time.monotonic()))
            ch = conn.channel()
            ch.confirm_delivery()
            props = pika.BasicProperties(delivery_mode=2 if self.index % 2 else 1)
            n = 0
            while not self.stop.is_set():
                tag = f"p{self.index}-{n:07d}-".encode()
                ch.basic_publish("", self.queue, tag.ljust(BODY, b"."), props)  # returns once confirmed
                self.confirmed.append(tag)
                n += 1
            conn.process_data_events(0)  # runs the blocked/unblocked callbacks pika deferred
            conn.close()
        except BaseException as err:  # reported by the test
            self.error = err


class Consumer(threading.Thread):
    """A slow consumer: prefetch 1, one ack at a time; collects the numbered tags."""

    def __init__(self, broker, queue: str):
        super().__init__(daemon=True)
        self.broker, self.queue = broker, queue
        self.got: set[bytes] = set()
        self.received: list[bytes] = []  # in order, duplicates included
        self.done = threading.Event()  # no more publishing: stop once the queue is empty
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.broker.pika_params())
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1)
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=2.0):
                if method is None:
                    if self.done.is_set():
                        break
                    continue
                tag = body[:body.index(b"-", 3) + 1]
                self.got.add(tag)
                self.received.append(tag)
                ch.basic_ack(method.delivery_tag)
            conn.close()
        except BaseException as err:
            self.error = err


def publisher_states(b) -> list[str]:
    """The publishers' connection states, from the management API."""
    conns = requests.get(f"{b.api}/connections", auth=("guest", "guest"), timeout=10).json()
    return [c["state"] for c in conns if c.get("user_provided_name", "").startswith("flood-")]


def wait_for(condition, what: str) -> float:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return time.monotonic()


def test_flood_stays_within_the_watermark_blocks_resumes_and_loses_nothing(tmp_path, uid):
    config = tmp_path / "rabbitmq.conf"
    config.write_text(f"vm_memory_high_watermark.absolute = {WATERMARK}\n")
    b = start_broker("--config", str(config))
    warrenctl = WARRENCTL
    assert warrenctl, "warrenctl is not installed: run `pip install -e .`"

    def ctl(*args: str) -> None:
        r = subprocess.run([warrenctl, "--data-dir", b.data_dir, *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r

    sampler = Sampler(b.proc.pid)
    publishers: list[Publisher] = []
    consumer = None
    try:
        queue = f"flood-{uid}"
        setup = pika.BlockingConnection(b.pika_params())
        setup.channel().queue_declare(queue, durable=True)
        setup.close()
        idle = rss(b.proc.pid)
        sampler.start()
        publishers = [Publisher(b, queue, i) for i in range(PUBLISHERS)]
        started = time.monotonic()
        for p in publishers:
            p.start()

        def published() -> int:
            return sum(len(p.confirmed) for p in publishers)

        # 1. The flood, no consumer: paging holds the memory below the watermark.
        wait_for(lambda: published() * BODY >= FLOOD_BYTES or any(p.error for p in publishers), "the flood")
        flooded = published()
        peak_flood = sampler.peak

        # 2. The alarm: every publisher is blocked (and publishes nothing more).
        alarm = time.monotonic()
        ctl("set_vm_memory_high_watermark", "0")
        alarm_ctl = time.monotonic() - alarm
        blocked = wait_for(lambda: publisher_states(b) == ["blocked"] * PUBLISHERS, "every publisher blocked")
        time.sleep(0.3)
        held = [len(p.confirmed) for p in publishers]
        time.sleep(0.5)
        assert [len(p.confirmed) for p in publishers] == held, "a blocked publisher's messages were confirmed"
        # ... while the slow consumer drains.
        consumer = Consumer(b, queue)
        consumer.start()
        wait_for(lambda: len(consumer.got) >= 100, "the consumer, during the alarm")

        # 3. The clear: every publisher is unblocked and resumes.
        clear = time.monotonic()
        ctl("set_vm_memory_high_watermark", "absolute", str(WATERMARK))
        clear_ctl = time.monotonic() - clear
        unblocked = wait_for(lambda: not {"blocked", "blocking"} & set(publisher_states(b)),
                             "every publisher unblocked")
        wait_for(lambda: all(len(p.confirmed) >= n + 100 for p, n in zip(publishers, held)),
                 "every publisher to resume")
        for p in publishers:
            p.stop.set()
        for p in publishers:
            p.join(WAIT)
        consumer.done.set()
        consumer.join(120)
        elapsed = time.monotonic() - started
        sampler.stop.set()
        sampler.join()

        for p in publishers:
            assert p.error is None, repr(p.error)
        assert consumer.error is None, repr(consumer.error)
        print(f"\nflood: {flooded} x 64 KiB confirmed before the alarm, {published()} in all, in {elapsed:.1f}s; "
              f"RSS idle {idle / MiB:.0f} MiB, peak {peak_flood / MiB:.0f} MiB during the flood and "
              f"{sampler.peak / MiB:.0f} MiB overall against a watermark of {WATERMARK / MiB:.0f} MiB; "
              f"alarm to all blocked {1000 * (blocked - alarm):.0f} ms, clear to all unblocked "
              f"{1000 * (unblocked - clear):.0f} ms (each including warrenctl's run: "
              f"{1000 * alarm_ctl:.0f} and {1000 * clear_ctl:.0f} ms)")
        assert sampler.peak <= WATERMARK + MARGIN, f"RSS peaked at {sampler.peak / MiB:.0f} MiB"
        assert "Memory paging to disk started" in b.log()
        frames = [(len(p.blocked), len(p.unblocked)) for p in publishers]
        assert frames == [(1, 1)] * PUBLISHERS, f"connection.blocked / unblocked per publisher: {frames}"
        assert not consumer.is_alive(), "the consumer did not finish draining"
        assert len(consumer.received) == len(consumer.got), "a message was delivered twice"
        missing = {t for p in publishers for t in p.confirmed} - consumer.got
        assert not missing, f"{len(missing)} of {published()} confirmed messages never arrived"
    finally:
        for p in publishers:
            p.stop.set()
        if consumer is not None:
            consumer.done.set()
        sampler.stop.set()
        b.stop()
        shutil.rmtree(b.data_dir, ignore_errors=True)
