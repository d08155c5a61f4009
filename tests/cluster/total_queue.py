"""Jepsen's total-queue check for a replicated quorum queue under faults (as in its RabbitMQ
analysis): publishers publish uniquely numbered messages with confirms through the faults,
consumers may take some meanwhile, and at the end the queue is read back to the last message.
Then every confirmed message was read (lost 0), nothing was read that was never published
(unexpected 0), and a message read twice is one whose publish was not confirmed the first time
or whose second delivery says it is a redelivery (duplicates only of those).

Shared by the quorum queue fault tests (test_quorum_faults.py, test_quorum_partitions.py)."""

from __future__ import annotations

import base64
import collections
import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable

import pika
import pika.exceptions
import requests

QQ = {"x-queue-type": "quorum"}
AUTH = ("guest", "guest")

logging.getLogger("pika").setLevel(logging.CRITICAL)  # every refused reconnect is logged otherwise


class Publisher(threading.Thread):
    """Publishes base, base + 1, ... with confirms through whichever node answers (round robin
    over `nodes`); a publish whose fate is unknown (nack, connection lost) is sent again as a
    new attempt of the same id. `enter` runs first in the thread (e.g. Netns.enter: the thread
    then connects from inside a network namespace). Not `mandatory`: a message that went
    nowhere but was confirmed counts as confirmed (and lost)."""

    def __init__(self, nodes: list, queue: str, *, base: int = 0, enter: Callable[[], None] | None = None,
                 params: Callable | None = None, mandatory: bool = True):
        super().__init__(daemon=True)
        self.nodes, self.queue, self.base, self.enter, self.mandatory = nodes, queue, base, enter, mandatory
        self.params = params or (lambda node: node.pika_params(socket_timeout=5, blocked_connection_timeout=5))
        self.confirmed: set[int] = set()
        self.attempted: collections.Counter[int] = collections.Counter()
        self.confirm_times: list[float] = []  # (monotonic) when each confirm came
        self.confirmed_sends: list[float] = []  # (monotonic) when each confirmed publish was sent
        self.failures: list[tuple[float, str]] = []  # when and why a publish was not confirmed
        self.stop = threading.Event()
        self.last_confirm = time.monotonic()

    def run(self) -> None:
        if self.enter is not None:
            self.enter()
        n, turn = self.base, 0
        while not self.stop.is_set():
            node = self.nodes[turn % len(self.nodes)]
            turn += 1
            try:
                connection = pika.BlockingConnection(self.params(node))
                channel = connection.channel()
                channel.confirm_delivery()
                while not self.stop.is_set():
                    self.attempted[n] += 1
                    sent = time.monotonic()
                    channel.basic_publish("", self.queue, str(n).encode(), pika.BasicProperties(delivery_mode=2),
                                          mandatory=self.mandatory)
                    self.confirmed.add(n)
                    self.last_confirm = time.monotonic()
                    self.confirm_times.append(self.last_confirm)
                    self.confirmed_sends.append(sent)
                    n += 1
                connection.close()
            except Exception as err:  # (nack, unroutable, a node gone: the same id again, elsewhere)
                self.failures.append((time.monotonic(), repr(err)))
                time.sleep(0.1)

    def confirms_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.confirm_times if start <= t < end)

    def finish(self, timeout: float = 30) -> None:
        self.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "the publisher did not stop"


class Consumer(threading.Thread):
    """Consumes the queue with manual acks through whichever node answers, acking each message
    once it is counted; consumes again after a cancel or a lost connection. `redelivered`
    counts the deliveries that said they were redeliveries."""

    def __init__(self, nodes: list, queue: str, *, prefetch: int = 50):
        super().__init__(daemon=True)
        self.nodes, self.queue, self.prefetch = nodes, queue, prefetch
        self.got: collections.Counter[int] = collections.Counter()
        self.redelivered: collections.Counter[int] = collections.Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            node = self.nodes[turn % len(self.nodes)]
            turn += 1
            try:
                connection = pika.BlockingConnection(node.pika_params(socket_timeout=5, blocked_connection_timeout=5))
                channel = connection.channel()
                channel.basic_qos(prefetch_count=self.prefetch)
                for method, _, body in channel.consume(self.queue, inactivity_timeout=0.5):
                    if self.stop.is_set():
                        break
                    if method is None:
                        if not channel.is_open or channel.consumer_tags == []:
                            break  # (cancelled by the broker: consume again)
                        continue
                    n = int(body)
                    self.got[n] += 1
                    if method.redelivered:
                        self.redelivered[n] += 1
                    channel.basic_ack(method.delivery_tag)
                connection.close()
            except Exception:  # (a node gone, the queue moving: consume again, elsewhere)
                time.sleep(0.1)

    def finish(self, timeout: float = 30) -> None:
        self.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "the consumer did not stop"


class Read(collections.Counter):
    """What read_all() read: id -> deliveries, and the deliveries that said they were
    redeliveries (`redelivered`)."""

    def __init__(self) -> None:
        super().__init__()
        self.redelivered: collections.Counter[int] = collections.Counter()


def read_all(node, queue: str, idle: float = 3.0) -> Read:
    """Every message left in the queue, consumed through `node` until none came for `idle`
    seconds. Acked (many at a time), not auto-acked: a leader that changes while it is read
    (a node's lease lost under load) gives back what was not acked, marked redelivered; with
    auto-ack a message handed out as the leader moved may be lost, as RabbitMQ's may."""
    got = Read()
    connection = pika.BlockingConnection(node.pika_params(socket_timeout=10))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2000)
    last, unacked = 0, 0
    for method, _, body in channel.consume(queue, inactivity_timeout=idle):
        if method is None:
            break
        got[int(body)] += 1
        if method.redelivered:
            got.redelivered[int(body)] += 1
        last, unacked = method.delivery_tag, unacked + 1
        if unacked == 500:
            channel.basic_ack(last, multiple=True)
            unacked = 0
    if unacked:
        channel.basic_ack(last, multiple=True)
    channel.cancel()
    left = channel.queue_declare(queue, passive=True).method.message_count
    connection.close()
    assert left == 0, f"{left} messages left in {queue} after reading it"
    return got


@dataclass
class Outcome:
    confirmed: int
    read: int
    duplicated: int

    def __str__(self) -> str:
        return f"{self.confirmed} confirmed, {self.read} read, {self.duplicated} duplicated"


def check(publishers: list[Publisher], got: collections.Counter[int],
          consumers: tuple[Consumer, ...] = (), at_least: int = 100) -> Outcome:
    """The total-queue check over what the publishers confirmed and attempted, what the
    consumers took meanwhile and what was read at the end (`got`)."""
    confirmed = set().union(*(p.confirmed for p in publishers))
    attempted: collections.Counter[int] = sum((p.attempted for p in publishers), collections.Counter())
    seen = collections.Counter(got)
    redelivered: collections.Counter[int] = collections.Counter(getattr(got, "redelivered", {}))
    for consumer in consumers:
        seen.update(consumer.got)
        redelivered.update(consumer.redelivered)
    lost = confirmed - set(seen)
    unexpected = set(seen) - set(attempted)
    duplicated = {n for n, count in seen.items() if count > 1}
    # A duplicate is fine if its publish was attempted more than once (the first attempt's
    # confirm never came) or if all deliveries but one said they were redeliveries.
    bad = {n for n in duplicated if attempted[n] == 1 and seen[n] - redelivered[n] > 1}
    assert not lost, f"lost {len(lost)} of {len(confirmed)} confirmed: {sorted(lost)[:20]}"
    assert not unexpected, f"unexpected: {sorted(unexpected)[:20]}"
    assert not bad, f"duplicates of publishes confirmed the first time, not redeliveries: {sorted(bad)[:20]}"
    assert len(confirmed) >= at_least, f"only {len(confirmed)} confirmed"
    return Outcome(len(confirmed), sum(seen.values()), len(duplicated))


def leader(node, queue: str) -> str | None:
    """The queue's leader as `node`'s API has it (None: no answer)."""
    try:
        answer = requests.get(f"{node.api}/queues/%2F/{queue}", auth=AUTH, timeout=5)
        return answer.json().get("leader") if answer.ok else None
    except requests.RequestException:
        return None


def online(node, queue: str) -> list[str] | None:
    try:
        answer = requests.get(f"{node.api}/queues/%2F/{queue}", auth=AUTH, timeout=5)
        return sorted(answer.json().get("online", [])) if answer.ok else None
    except requests.RequestException:
        return None


def records(endpoint: str, prefix: str) -> list[dict]:
    """The replicated queues' records in etcd (leader, epoch, members, isr) of the cluster
    under `prefix` (make_node.prefix), read over etcd's JSON gateway."""
    key = f"/warren/{prefix}/clusters/default/queues/".encode()
    end = key[:-1] + bytes([key[-1] + 1])
    body = json.dumps({"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode()}).encode()
    with urllib.request.urlopen(f"http://{endpoint}/v3/kv/range", body, timeout=5) as response:
        kvs = json.load(response).get("kvs", [])
    return [json.loads(base64.b64decode(kv["value"])) for kv in kvs]



class Batch:
    """Confirmed and attempted ids of publishes sent in windows (publish_windows), in the
    form check() reads."""

    def __init__(self) -> None:
        self.confirmed: set[int] = set()
        self.attempted: collections.Counter[int] = collections.Counter()


async def publish_windows(url: str, queue: str, ids: range, batch: Batch, window: int = 1000) -> None:
    """Publish `ids` (persistent, through the default exchange) with confirms, `window` at a
    time in flight: much faster than one confirm after another."""
    import asyncio

    import aio_pika
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        for start in range(ids.start, ids.stop, window):
            chunk = range(start, min(start + window, ids.stop))
            for n in chunk:
                batch.attempted[n] += 1
            results = await asyncio.gather(
                *(channel.default_exchange.publish(
                    aio_pika.Message(str(n).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT), queue)
                  for n in chunk), return_exceptions=True)
            batch.confirmed.update(n for n, result in zip(chunk, results) if not isinstance(result, BaseException))
    finally:
        await connection.close()
