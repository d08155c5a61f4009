"""Queues for reliable consumption: a work queue whose rejected messages dead-letter to
`<name>.dlq`, retry queues `<name>.retry.<i>` that hold a failed message for delays[i]
seconds (x-message-ttl) and dead-letter it back to the work queue, and `<name>.parking`
for messages that failed max_attempts times. No requeue loop: a failed message waits in
a retry queue, never at the head of the work queue."""

import logging
from collections.abc import Awaitable, Callable, Sequence
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
    if isinstance(channel_or_url, str):
        connection = await aio_pika.connect(channel_or_url)
        try:
            return await declare_work_queue(
                await connection.channel(), name, retry_delays=retry_delays,
                max_attempts=max_attempts, arguments=arguments)
        finally:
            await connection.close()
    channel = channel_or_url
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
