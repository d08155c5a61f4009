"""Queues for reliable consumption: a work queue whose rejected messages dead-letter to
`<name>.dlq`, retry queues `<name>.retry.<i>` that hold a failed message for delays[i]
seconds (x-message-ttl) and dead-letter it back to the work queue, and `<name>.parking`
for messages that failed max_attempts times. No requeue loop: a failed message waits in
a retry queue, never at the head of the work queue."""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel

from .incoming import ATTEMPT_HEADER, ConsumedMessage, from_delivery, republishable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkQueue:
    name: str
    dlq: str
    retry_queues: tuple[str, ...]
    retry_delays: tuple[float, ...]
    parking: str
    # Handler runs, the first one included, before a message is parked.
    max_attempts: int
    # The work queue's own arguments (dead-lettering to the DLQ plus the caller's).
    arguments: dict[str, Any]

    def retry_queue(self, failures: int) -> str:
        """The retry queue after the failures-th failure: the last delay repeats."""
        return self.retry_queues[min(failures, len(self.retry_queues)) - 1]


async def declare_work_queue(channel_or_url: "AbstractChannel | str", name: str, *,
                             retry_delays: Sequence[float] = (1.0, 5.0, 30.0),
                             max_attempts: int | None = None,
                             arguments: dict[str, Any] | None = None) -> WorkQueue:
    """Declare (idempotently) the work queue `name` and its DLQ, retry and parking queues,
    all durable. max_attempts defaults to one attempt plus one per retry delay."""
    if not retry_delays:
        raise ValueError("retry_delays must not be empty (use no topology to skip retries)")
    async with _channel(channel_or_url) as channel:
        delays = tuple(float(d) for d in retry_delays)
        topology = WorkQueue(
            name=name, dlq=f"{name}.dlq",
            retry_queues=tuple(f"{name}.retry.{i}" for i in range(len(delays))),
            retry_delays=delays, parking=f"{name}.parking",
            max_attempts=max_attempts if max_attempts is not None else len(delays) + 1,
            arguments={**(arguments or {}), "x-dead-letter-exchange": "",
                       "x-dead-letter-routing-key": f"{name}.dlq"})
        await channel.declare_queue(topology.dlq, durable=True)
        await channel.declare_queue(topology.parking, durable=True)
        for queue, delay in zip(topology.retry_queues, delays):
            await channel.declare_queue(queue, durable=True, arguments={
                "x-message-ttl": int(delay * 1000),
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": name})
        await channel.declare_queue(name, durable=True, arguments=topology.arguments)
        return topology


@dataclass(frozen=True)
class ShardSet:
    """A consistent-hash exchange and the queues it spreads messages over: publish to
    `exchange` with the shard key (an order or customer id) as routing key, and every
    message with that key goes to the same queue, in order; run a consumer per queue."""
    exchange: str
    queues: tuple[str, ...]
    # With retry_delays: each queue's WorkQueue, to give its ReliableConsumer.
    work_queues: tuple[WorkQueue, ...] = ()


async def declare_sharded_queues(channel_or_url: "AbstractChannel | str", exchange: str,
                                 shards: int, *, hash_header: str | None = None,
                                 hash_property: str | None = None,
                                 retry_delays: Sequence[float] | None = None,
                                 max_attempts: int | None = None,
                                 arguments: dict[str, Any] | None = None) -> ShardSet:
    """Seed 002's way to scale out past one queue: declare (idempotently) the durable
    `x-consistent-hash` exchange `exchange` and queues `<exchange>.<i>` for i < shards, each
    bound with weight 1. The key hashed is the routing key, or the header `hash_header`, or
    the property `hash_property` (e.g. "message_id"). With retry_delays every queue is a work
    queue with its own DLQ, retry and parking queues (declare_work_queue). On RabbitMQ the
    rabbitmq_consistent_hash_exchange plugin must be enabled; Warren has the type built in."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    exchange_arguments: dict[str, Any] = {k: v for k, v in (("hash-header", hash_header),
                                            ("hash-property", hash_property)) if v is not None}
    names = tuple(f"{exchange}.{i}" for i in range(shards))
    async with _channel(channel_or_url) as channel:
        hashing = await channel.declare_exchange(exchange, "x-consistent-hash", durable=True,
                                                 arguments=exchange_arguments or None)
        work_queues = []
        for name in names:
            if retry_delays is not None:
                work_queues.append(await declare_work_queue(
                    channel, name, retry_delays=retry_delays, max_attempts=max_attempts,
                    arguments=arguments))
                queue = await channel.declare_queue(name, passive=True)
            else:
                queue = await channel.declare_queue(name, durable=True, arguments=arguments)
            # The routing key of a binding to this exchange type is the queue's weight.
            await queue.bind(hashing, routing_key="1")
    return ShardSet(exchange, names, tuple(work_queues))


@asynccontextmanager
async def _channel(channel_or_url: "AbstractChannel | str") -> AsyncIterator[AbstractChannel]:
    """The caller's channel, or one on a connection of its own for the declarations."""
    if not isinstance(channel_or_url, str):
        yield channel_or_url
        return
    connection = await aio_pika.connect(channel_or_url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


async def drain_dlq(url: str, dlq: str, *,
                    handler: Callable[[ConsumedMessage], Awaitable[None]] | None = None,
                    target_queue: str | None = None, limit: int = 1000) -> int:
    """Take up to `limit` messages off `dlq` (basic.get, for small volumes) and give each
    to `handler` or republish it to `target_queue` with a confirm (its attempt count
    reset), acking it only afterwards. Returns how many were moved. A handler error
    requeues that message once and is raised (no loop on a bad message)."""
    if (handler is None) == (target_queue is None):
        raise ValueError("give exactly one of handler and target_queue")
    connection = await aio_pika.connect(url)
    moved = 0
    try:
        # on_return_raises: an unroutable republish fails instead of looking confirmed.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        queue = await channel.declare_queue(dlq, passive=True)
        while moved < limit:
            delivery = await queue.get(no_ack=False, fail=False)
            if delivery is None:
                break
            message = from_delivery(delivery)
            try:
                if handler is not None:
                    await handler(message)
                else:
                    assert target_queue is not None
                    await channel.default_exchange.publish(
                        aio_pika.Message(**republishable(message, **{ATTEMPT_HEADER: None})),
                        routing_key=target_queue, mandatory=True)
            except BaseException:
                await delivery.nack(requeue=True)
                raise
            await delivery.ack()
            moved += 1
    finally:
        await connection.close()
    log.info("moved %d messages off %s", moved, dlq)
    return moved
