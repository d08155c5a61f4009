"""Per-connection flow control (issue 10), both directions.

- A publisher is read no faster than the store writes: a flood of persistent messages fanned
  out to durable queues (confirms read as they come) puts its connection in `flow` (RabbitMQ
  3.10 shows `flow` in `rabbitmqctl list_connections state` for such a flood, checked on a
  node; Warren in `warrenctl list_connections state`), no connection.blocked is sent, and
  every confirmed message arrives. Same path on both brokers; Warren runs with a tiny
  --queue-window so everything pages (its own option: the broker started here).
- A consumer that never reads its socket (prefetch unlimited, big messages) does not make
  the broker buffer without bound: the queue pages and the write-buffer throttle holds, and
  the consumer gets everything once it reads (Warren only: it measures the broker's RSS, as
  test_memory_bounds.py does).
"""

import os
import shlex
import subprocess
import threading
import time

import pika
import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

import rawamqp
from conftest import EXTERNAL, BrokerProcess, start_broker

from .test_memory_bounds import rss_mb
from warrenctl_path import WARRENCTL

RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
MB = 1 << 20


class FlowBroker:
    def __init__(self, broker: BrokerProcess, ctl: list[str]):
        self.broker = broker
        self._ctl = ctl

    def states(self) -> list[str]:
        r = subprocess.run([*self._ctl, "list_connections", "-q", "--no-table-headers", "state"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def flow_broker():
    if EXTERNAL:
        if not RABBITMQCTL:
            pytest.skip("needs WARREN_TEST_RABBITMQCTL to see connection states")
        host, port = EXTERNAL.rsplit(":", 1)
        yield FlowBroker(BrokerProcess(host, int(port)), shlex.split(RABBITMQCTL))
        return
    b = start_broker("--queue-window", "16")
    yield FlowBroker(b, [WARRENCTL or "warrenctl", "--port", str(b.mgmt_port)])
    b.stop()


def _confirmed_flood(broker: BrokerProcess, exchange: str, seconds: float, body_size: int,
                     enough: threading.Event, longest: float) -> set[int]:
    """Publish persistent messages (their number first in the body) as fast as the broker
    reads them for `seconds`, then on until `enough` is set (at most `longest` seconds), in
    confirm mode, reading the confirms as they come; the numbers (from 0) of the messages
    confirmed."""
    raw = rawamqp.RawClient(broker.host, broker.port, timeout=60)
    raw.handshake()
    raw.open_channel(1)
    raw.call(1, commands.Confirm.Select())
    head = (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=""), 1)
            + pframe.marshal(pheader.ContentHeader(0, body_size, commands.Basic.Properties(delivery_mode=2)), 1))
    pad = b"p" * (body_size - 8)
    acked: set[int] = set()
    nacked: set[int] = set()
    last = [0]  # highest delivery tag settled
    sent = [0]
    finished = threading.Event()
    errors: list = []

    def read_confirms() -> None:
        try:
            while not (finished.is_set() and last[0] >= sent[0]):
                f = raw.read_frame(timeout=60)
                value = f.value
                if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
                    tags = range(last[0] + 1, value.delivery_tag + 1) if value.multiple else [value.delivery_tag]
                    (acked if isinstance(value, commands.Basic.Ack) else nacked).update(tags)
                    last[0] = max(last[0], value.delivery_tag)
                elif isinstance(value, commands.Connection.Blocked):
                    errors.append("connection.blocked sent")
        except Exception as err:  # reported below
            errors.append(err)

    reader = threading.Thread(target=read_confirms)
    reader.start()
    start = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - start) < seconds or (not enough.is_set() and elapsed < longest):
        raw.send(b"".join(head + rawamqp.frame(3, 1, i.to_bytes(8, "big") + pad) for i in range(n, n + 4)))
        n += 4
        sent[0] = n
    finished.set()
    reader.join(90)
    raw.close()
    assert not errors, errors
    assert not nacked and last[0] == n, (len(nacked), last[0], n)
    return {tag - 1 for tag in acked}


def test_a_flood_into_the_store_is_in_flow_and_every_confirmed_message_arrives(flow_broker, uid):
    """Persistent messages fanned out to 20 durable queues: the store has 20 times the
    bytes to write and fsync, more than the disk takes, so the publisher is in `flow`."""
    b = flow_broker.broker
    exchange = f"flow-{uid}"
    queues = [f"flow-{uid}-{i}" for i in range(20)]
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", auto_delete=True)
        for q in queues:
            ch.queue_declare(q, durable=True)
            ch.queue_bind(q, exchange)
    seen: list[str] = []
    done = threading.Event()
    in_flow = threading.Event()

    def poll():
        while not done.is_set():
            seen.extend(flow_broker.states())
            if "flow" in seen:
                in_flow.set()
            time.sleep(0.1)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        # `flow` comes and goes; rabbitmqctl on a busy machine samples it only every 2 s or
        # so, so the flood goes on until a sample has caught it (or 20 s)
        confirmed = _confirmed_flood(b, exchange, 6.0, 64 << 10, in_flow, 20.0)
    finally:
        done.set()
        poller.join()
    print(f"{len(confirmed)} confirmed; states seen: {sorted(set(seen))} ({seen.count('flow')} flow of {len(seen)})")
    try:
        assert "flow" in seen, f"never in flow: {seen}"
        assert not {"blocked", "blocking"} & set(seen)
        with pika.BlockingConnection(b.pika_params()) as conn:
            ch = conn.channel()
            for q in queues:
                assert ch.queue_declare(q, passive=True).method.message_count == len(confirmed)
            got = []
            for method, _props, body in ch.consume(queues[0], auto_ack=True, inactivity_timeout=5):
                if method is None:
                    break
                got.append(int.from_bytes(body[:8], "big"))
            assert got == sorted(confirmed)  # all of them, in publishing order
    finally:
        with pika.BlockingConnection(b.pika_params()) as conn:
            ch = conn.channel()
            for q in queues:
                ch.queue_delete(q)


def test_a_consumer_that_never_reads_does_not_make_the_broker_buffer(make_broker, uid):
    """200 MiB published (1 MiB messages) to a queue whose only consumer (no prefetch limit,
    no acks) reads nothing: the broker's RSS stays bounded; then the consumer gets it all."""
    b = make_broker("--queue-window", "16")
    queue = f"stuck-{uid}"
    count = 200
    with pika.BlockingConnection(b.pika_params()) as conn:
        conn.channel().queue_declare(queue)
    raw = rawamqp.RawClient(b.host, b.port, timeout=30)
    raw.handshake()
    raw.open_channel(1)
    raw.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag="stuck", no_ack=True))
    time.sleep(0.5)  # consume-ok waits unread with everything else
    before = rss_mb(b.proc.pid)
    peak = before
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        for i in range(count):
            ch.basic_publish("", queue, i.to_bytes(4, "big") + b"b" * (MB - 4))
            if i % 20 == 0:
                peak = max(peak, rss_mb(b.proc.pid))
        ch.queue_declare(queue, passive=True)  # all routed
    time.sleep(1.0)
    peak = max(peak, rss_mb(b.proc.pid))
    print(f"RSS before {before:.0f} MB, peak {peak:.0f} MB while {count} MiB waited for a consumer that does not read")
    assert peak - before < 120, f"broker grew by {peak - before:.0f} MB for a consumer that does not read"
    # Now it reads: everything arrives, in order.
    raw.expect(commands.Basic.ConsumeOk, 1, timeout=30)
    for i in range(count):
        deliver = raw.expect(commands.Basic.Deliver, 1, timeout=30)
        assert deliver.delivery_tag == i + 1
        _header, body = raw.read_content(timeout=30)
        assert len(body) == MB and int.from_bytes(body[:4], "big") == i
    raw.close()
