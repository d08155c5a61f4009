"""What a resource alarm does to connections, as RabbitMQ 3.10 does it (issue 10, checked on a
node): while an alarm is on every connection is `blocking`; one that publishes becomes
`blocked` (its socket is not read), gets connection.blocked if it announced the capability,
and its publishes are held, not dropped, until every alarm has cleared (connection.unblocked).
Consumers keep working; heartbeat monitoring is suspended for blocked connections.

The alarms are raised the same way on both brokers, with the same arguments:
`set_vm_memory_high_watermark 0` / `0.4` and `set_disk_free_limit 100000GB` / `50MB`, through
warrenctl on Warren (a broker of this module's own, so no other test sees the alarms) and
rabbitmqctl (WARREN_TEST_RABBITMQCTL) with WARREN_TEST_BROKER.
"""

import asyncio
import concurrent.futures
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pika
import pytest
import requests
from pamqp import commands

from conftest import EXTERNAL, BrokerProcess, start_broker
from rawamqp import CLIENT_CAPABILITIES, HEARTBEAT, connect
from warrenctl_path import WARRENCTL

RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
CTL_SOURCE = Path(__file__).resolve().parents[2] / "warren" / "cli" / "ctl.py"
RESET = (("set_vm_memory_high_watermark", "0.4"), ("set_disk_free_limit", "50MB"))
WAIT = 15.0
# Against RabbitMQ the alarms are the shared node's: every publisher there would be blocked.
pytestmark = pytest.mark.node_wide


class AlarmBroker:
    """A broker and the control command that raises and clears its alarms."""

    def __init__(self, broker: BrokerProcess, ctl: list[str]):
        self.broker = broker
        self.host, self.port = broker.host, broker.port
        self._ctl = ctl

    def ctl(self, *args) -> str:
        r = subprocess.run([*self._ctl, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
        return r.stdout

    def memory_alarm(self, on: bool) -> None:
        self.ctl("set_vm_memory_high_watermark", "0" if on else "0.4")

    def disk_alarm(self, on: bool) -> None:
        self.ctl("set_disk_free_limit", "100000GB" if on else "50MB")

    def states(self) -> dict:
        """{peer port: state} from `list_connections peer_port state`."""
        out = self.ctl("list_connections", "-q", "--no-table-headers", "peer_port", "state")
        return {int(p): s for p, s in (line.split("\t") for line in out.splitlines() if line.strip())}

    def wait_state(self, port: int, state: str) -> None:
        deadline = time.monotonic() + WAIT
        while self.states().get(port) != state:
            assert time.monotonic() < deadline, f"connection {port} not {state}: {self.states()}"
            time.sleep(0.2)

    def pika(self, **kwargs) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.broker.pika_params(**kwargs))


@pytest.fixture(scope="module")
def alarm_broker():
    if EXTERNAL:
        if not RABBITMQCTL:
            pytest.skip("needs WARREN_TEST_RABBITMQCTL to raise the alarms")
        host, port = EXTERNAL.rsplit(":", 1)
        yield AlarmBroker(BrokerProcess(host, int(port)), shlex.split(RABBITMQCTL))
        return
    if "set_vm_memory_high_watermark" not in CTL_SOURCE.read_text():
        pytest.skip("warrenctl set_vm_memory_high_watermark (the monitors' part of issue 10) is not there yet")
    b = start_broker()
    yield AlarmBroker(b, [WARRENCTL or "warrenctl", "--port", str(b.mgmt_port)])
    b.stop()


@pytest.fixture
def alarms(alarm_broker):
    """The alarm broker, with both alarms cleared after the test whatever happened."""
    yield alarm_broker
    for args in RESET:
        alarm_broker.ctl(*args)


@pytest.fixture
def qname(alarms, uid):
    name = f"alarm-{uid}"
    with alarms.pika() as conn:
        conn.channel().queue_declare(name)
    yield name
    with alarms.pika() as conn:
        conn.channel().queue_delete(name)


def ready(alarms, qname) -> int:
    with alarms.pika() as conn:
        return conn.channel().queue_declare(qname, passive=True).method.message_count


def pump_until(conn, until, timeout=WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        conn.process_data_events(time_limit=0.1)


def test_pika_is_blocked_at_its_publish_and_its_messages_arrive_after_the_clear(alarms, qname):
    events = []
    pub = alarms.pika()
    pub.add_on_connection_blocked_callback(lambda _c, frame: events.append(("blocked", frame.method.reason)))
    pub.add_on_connection_unblocked_callback(lambda _c, _f: events.append(("unblocked",)))
    ch = pub.channel()
    ch.basic_publish("", qname, b"before")
    port = pub._impl._transport._sock.getsockname()[1]
    alarms.memory_alarm(True)
    alarms.wait_state(port, "blocking")
    pub.process_data_events(time_limit=0.5)
    assert events == []  # RabbitMQ sends nothing at the alarm, even to a past publisher
    for i in range(3):
        ch.basic_publish("", qname, f"m{i}".encode())
    pump_until(pub, lambda: events)
    assert events == [("blocked", "low on memory")]
    alarms.wait_state(port, "blocked")
    assert ready(alarms, qname) == 1  # held, not routed
    alarms.memory_alarm(False)
    pump_until(pub, lambda: len(events) == 2)
    assert events[1] == ("unblocked",)
    alarms.wait_state(port, "running")
    with alarms.pika() as conn:
        c = conn.channel()
        got = [c.basic_get(qname, auto_ack=True)[2] for _ in range(4)]
    assert got == [b"before", b"m0", b"m1", b"m2"]
    pub.close()


def test_overlapping_alarms_block_once_and_unblock_when_both_clear(alarms, qname):
    events = []
    pub = alarms.pika()
    pub.add_on_connection_blocked_callback(lambda _c, frame: events.append(frame.method.reason))
    pub.add_on_connection_unblocked_callback(lambda _c, _f: events.append("unblocked"))
    ch = pub.channel()
    port = pub._impl._transport._sock.getsockname()[1]
    alarms.disk_alarm(True)
    alarms.wait_state(port, "blocking")
    ch.basic_publish("", qname, b"m")
    pump_until(pub, lambda: events)
    alarms.memory_alarm(True)
    pub.process_data_events(time_limit=1.0)
    assert events == ["low on disk"]  # no second frame
    alarms.disk_alarm(False)
    pub.process_data_events(time_limit=1.5)
    assert events == ["low on disk"]  # still blocked by the memory alarm
    assert alarms.states()[port] == "blocked"
    assert ready(alarms, qname) == 0
    alarms.memory_alarm(False)
    pump_until(pub, lambda: len(events) == 2)
    assert events == ["low on disk", "unblocked"]
    pub.process_data_events(time_limit=0.3)
    assert ready(alarms, qname) == 1
    pub.close()


def test_both_alarms_give_both_reasons(alarms, qname):
    with connect(alarms) as raw:
        raw.open_channel(1)
        alarms.memory_alarm(True)
        alarms.disk_alarm(True)
        alarms.wait_state(raw.sock.getsockname()[1], "blocking")
        raw.publish(1, "", qname, b"m")
        assert raw.expect(commands.Connection.Blocked, 0).reason == "low on disk & memory"
        alarms.memory_alarm(False)
        alarms.disk_alarm(False)
        raw.expect(commands.Connection.Unblocked, 0, timeout=WAIT)


def test_consumers_drain_while_a_publisher_is_blocked(alarms, qname):
    with alarms.pika() as filler:
        fch = filler.channel()
        fch.confirm_delivery()
        for i in range(5):
            fch.basic_publish("", qname, f"old{i}".encode())
    cons = alarms.pika()
    cch = cons.channel()
    cport = cons._impl._transport._sock.getsockname()[1]
    pub = alarms.pika()
    blocked = []
    pub.add_on_connection_blocked_callback(lambda *_: blocked.append(True))
    pch = pub.channel()
    alarms.memory_alarm(True)
    alarms.wait_state(cport, "blocking")
    pch.basic_publish("", qname, b"new")
    pump_until(pub, lambda: blocked)
    # The consumer's connection declares, gets, consumes and acks as usual.
    cch.queue_declare(f"{qname}-2", auto_delete=True)
    method, _, body = cch.basic_get(qname)
    assert body == b"old0"
    cch.basic_ack(method.delivery_tag)
    got = []
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(qname, lambda c, m, _p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pump_until(cons, lambda: len(got) == 4)
    assert got == [b"old1", b"old2", b"old3", b"old4"]
    assert alarms.states()[cport] == "blocking"
    alarms.memory_alarm(False)
    pump_until(cons, lambda: len(got) == 5)  # the held publish, once unblocked
    assert got[4] == b"new"
    pub.close()
    cons.close()


def test_a_client_without_the_capability_is_held_without_the_frames(alarms, qname):
    caps = {k: v for k, v in CLIENT_CAPABILITIES.items() if k != "connection.blocked"}
    with connect(alarms, capabilities=caps) as raw:
        raw.open_channel(1)
        port = raw.sock.getsockname()[1]
        alarms.memory_alarm(True)
        alarms.wait_state(port, "blocking")
        raw.publish(1, "", qname, b"quiet")
        alarms.wait_state(port, "blocked")
        raw.send_method(1, commands.Basic.Get(queue=qname, no_ack=True))
        assert raw.frames_until_quiet(1.0) == []  # no connection.blocked, and the get waits
        alarms.memory_alarm(False)
        get_ok = raw.expect(commands.Basic.GetOk, 1, timeout=WAIT)
        assert raw.read_content()[1] == b"quiet"
        assert get_ok.message_count == 0


def beating(raw, call, *args) -> None:
    """call(*args) (a control command, seconds on a busy machine) while the client sends its
    heartbeats: until it is blocked it is monitored, and two silent intervals close it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(call, *args)
        while not running.done():
            raw.send(HEARTBEAT)
            concurrent.futures.wait([running], timeout=0.5)
        running.result()  # (its failure is the test's)


def test_heartbeats_are_not_monitored_while_blocked(alarms, qname):
    """A blocked client that sends nothing for several heartbeat intervals stays connected."""
    with connect(alarms, heartbeat=2) as raw:
        raw.open_channel(1)
        port = raw.sock.getsockname()[1]
        beating(raw, alarms.memory_alarm, True)
        beating(raw, alarms.wait_state, port, "blocking")
        raw.send(HEARTBEAT)
        raw.publish(1, "", qname, b"hb")
        raw.expect(commands.Connection.Blocked, 0)
        deadline = time.monotonic() + 7  # 3.5 heartbeat intervals, silent
        while time.monotonic() < deadline:
            raw.frames_until_quiet(0.5)  # the broker's heartbeats are read (and skipped)
        assert port in alarms.states()
        alarms.memory_alarm(False)
        raw.expect(commands.Connection.Unblocked, 0, timeout=WAIT)
        raw.send(HEARTBEAT)
    assert ready(alarms, qname) == 1


@pytest.mark.asyncio
async def test_aio_pika_publishes_wait_for_the_unblock_and_are_confirmed(alarms, qname):
    import aio_pika
    conn = await aio_pika.connect(f"amqp://guest:guest@{alarms.host}:{alarms.port}/%2F", timeout=10)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"first"), routing_key=qname)
        await asyncio.to_thread(alarms.memory_alarm, True)
        await asyncio.sleep(1.0)
        tasks = [asyncio.ensure_future(ch.default_exchange.publish(aio_pika.Message(f"a{i}".encode()),
                                                                   routing_key=qname)) for i in range(3)]
        await asyncio.sleep(1.5)
        assert not any(t.done() for t in tasks)  # held: no confirm while the alarm is on
        assert await asyncio.to_thread(ready, alarms, qname) == 1
        await asyncio.to_thread(alarms.memory_alarm, False)
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        queue = await ch.get_queue(qname)
        got = []
        for _ in range(4):
            message = await queue.get(no_ack=True)
            got.append(message.body)
        assert got == [b"first", b"a0", b"a1", b"a2"]
    finally:
        await conn.close()


# Warren only: the management API.
warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="Warren's management API (not in CI's RabbitMQ)")


@warren_only
def test_the_api_shows_the_states_and_last_blocked_fields(alarms, qname):
    api = alarms.broker.api
    pub = alarms.pika()
    ch = pub.channel()
    port = pub._impl._transport._sock.getsockname()[1]

    def shown():
        [conn] = [c for c in requests.get(f"{api}/connections", auth=("guest", "guest"), timeout=10).json()
                  if c["peer_port"] == port]
        return conn["state"], conn["last_blocked_by"], conn["last_blocked_age"]

    assert shown() == ("running", "none", "infinity")
    alarms.memory_alarm(True)
    alarms.wait_state(port, "blocking")
    assert shown() == ("blocking", "none", "infinity")
    ch.basic_publish("", qname, b"m")
    alarms.wait_state(port, "blocked")
    assert shown() == ("blocked", "resource", 0.0)
    alarms.memory_alarm(False)
    alarms.wait_state(port, "running")
    time.sleep(0.3)
    state, by, age = shown()
    assert (state, by) == ("running", "resource") and 0 < age < WAIT
    pub.close()


@warren_only
def test_an_api_publish_is_held_during_an_alarm(alarms, qname):
    """RabbitMQ 3.10's API publishes through an alarm; Warren holds it, as an AMQP publish."""
    api = alarms.broker.api
    alarms.memory_alarm(True)
    body = {"properties": {}, "routing_key": qname, "payload": "via api", "payload_encoding": "string"}
    replies = []
    post = threading.Thread(target=lambda: replies.append(requests.post(
        f"{api}/exchanges/%2F/amq.default/publish", json=body, auth=("guest", "guest"), timeout=WAIT)))
    post.start()
    time.sleep(1.5)
    assert replies == [] and ready(alarms, qname) == 0
    alarms.memory_alarm(False)
    post.join(WAIT)
    [r] = replies
    assert (r.status_code, r.json()) == (200, {"routed": True})
    assert ready(alarms, qname) == 1
