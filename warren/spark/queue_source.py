"""`spark.readStream.format("warren").option("queue", NAME)`: a destructive queue as a Spark
streaming source, at least once.

The driver holds one consumer (warren.spark.wire) and takes the messages itself: a batch's
messages travel to the executors inside its input partitions (as Arrow record batches), and
stay unacked on the broker until Spark has committed the batch, so a crash anywhere gives
them back (`redelivered`). How that converges rather than re-reading the last batch of every
run, and how a batch planned before a crash is rebuilt from the same messages: see
warren.spark.queue_offsets. Duplicates after a crash are at most one batch, each flagged
`redelivered`.

Options: `queue`, the connection options, `maxRecordsPerTrigger` (10,000 by default, at most
30,000: a batch is held in the driver's memory and its fingerprints are checkpointed),
`maxBytesPerTrigger` (body octets; with maxRecordsPerTrigger, a batch ends at whichever it
reaches first), `minPartitions`, `maxRecordsPerPartition`; stream mode's offset options
(`startingOffsets`, `startingTimestamp`, `endingOffsets`, `failOnDataLoss`) are refused
(warren.spark.source.SourceOptions). Batch reads
(`spark.read`) are refused: they have no commit to ack at; drain with Trigger.AvailableNow,
which stops at the queue's ready count when it started. The `offset` column is the message's
position in the query (see queue_offsets); `source` is the queue's name.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Iterator

from pamqp import commands as spec
from pamqp import frame as pframe
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition, ReadLimit
from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow

from .connection import Endpoint
from .queue_offsets import Fingerprints, QueueOffset, decode
from .read_limits import caps
from .rows import Batch
from .wire import ProtocolError, Wire

log = logging.getLogger("warren.spark")

DEFAULT_BATCH = 10_000
MAX_BATCH = 30_000  # two batches' worth of prefetch fit basic.qos's 16 bits
IDLE = 0.2  # seconds without a delivery that end a poll of the queue
FIRST_WAIT = 1.0  # how long a poll waits for the first message of a batch
REPLAY_WAIT = 10.0  # how long a batch being rebuilt waits for its messages to come back


@dataclass
class Held:
    """A message the driver took and has not acked."""

    position: int
    tag: int
    fingerprint: bytes
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Any
    body: bytes


class HeldPartition(InputPartition):
    """A part of a batch, its messages included (a pyarrow RecordBatch pickles compactly)."""

    def __init__(self, rows: Any):
        super().__init__(rows.num_rows)
        self.rows = rows


class _ConsumerWire(Wire):
    connection_name = "warren.spark queue consumer"


class QueueConsumer:
    """The driver's consumer: takes messages, numbers them, acks them once committed."""

    def __init__(self, ep: Endpoint, queue: str, prefetch: int):
        self.wire = _ConsumerWire(ep)
        self.queue = queue
        self.wire.consume(queue, prefetch, {})
        self.fingerprint = Fingerprints()

    def take(self, want: int, first_wait: float, on_message) -> int:
        """Pass on_message(tag, redelivered, exchange, routing_key, properties, body) each
        delivery, up to `want` (on_message returns whether the message counts), waiting up
        to `first_wait` for the first and IDLE between the others; returns how many counted."""
        taken = 0
        if want <= 0:
            return 0

        def on_delivery(tag, redelivered, exchange, routing_key, properties, _offset, body) -> bool:
            nonlocal taken
            if on_message(tag, redelivered, exchange, routing_key, properties, body):
                taken += 1
            self.wire.sock.settimeout(IDLE)
            return taken < want

        self.wire.sock.settimeout(first_wait)
        try:
            self.wire.deliveries(on_delivery)
        except socket.timeout:
            pass
        except OSError as err:
            raise ProtocolError(f"the queue consumer's connection failed: {err}") from None
        return taken

    def ack(self, tags: list[int]) -> None:
        if tags:
            self.wire.sock.settimeout(30)
            self.wire.sock.sendall(b"".join(pframe.marshal(spec.Basic.Ack(delivery_tag=t), 1) for t in sorted(tags)))

    def close(self) -> None:
        self.wire.close()


def ready_count(ep: Endpoint, queue: str) -> int:
    """The queue's ready messages now (a passive declare)."""
    wire = Wire(ep)
    try:
        return wire.call(spec.Queue.Declare(queue=queue, passive=True), spec.Queue.DeclareOk).message_count
    finally:
        wire.close()


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Queue mode of the `warren` streaming source (driver side; executors only unpack the
    partitions)."""

    def __init__(self, options: Any):
        self.options = options
        self.queue: str = options.queue
        limit = options.max_records or DEFAULT_BATCH
        if limit > MAX_BATCH:
            raise ValueError(f"maxRecordsPerTrigger is at most {MAX_BATCH} in queue mode (a batch is held on the "
                             f"driver), not {limit}")
        self.batch_limit = limit
        self._reset()

    def _reset(self) -> None:
        self._consumer: QueueConsumer | None = None
        self._held: deque[Held] = deque()  # by position
        self._next: int | None = None  # the position the next message taken gets
        self._settle: Counter = Counter()  # committed messages that may come back (redelivered)
        self._left: int | None = None  # Trigger.AvailableNow: messages still to take
        self._fresh = True  # nothing committed seen yet in this run

    def __getstate__(self) -> dict:
        return {"options": self.options, "queue": self.queue, "batch_limit": self.batch_limit}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    # ------------------------------------------------------------------ Spark's calls
    def initialOffset(self) -> dict:
        return QueueOffset(self.queue, 0).encode()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadMaxRows(self.batch_limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._left = ready_count(self.options.endpoint, self.queue)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch: the messages taken after `start`, up to the limit.
        Spark plans from the end of a committed batch only, so everything before `start` is
        acked here (Spark's own commit() comes a batch late, and never for a run's last)."""
        begin = decode(start)
        self._committed(begin)
        rows, octets = self._limits(limit)
        self._fill(begin.position, rows, octets)
        batch = self._batch(begin.position, rows, octets)
        if not batch:
            return begin.encode()
        return QueueOffset(self.queue, batch[-1].position + 1, tuple(h.fingerprint for h in batch)).encode()

    def partitions(self, start: dict, end: dict):
        begin, stop = decode(start), decode(end)
        self._committed(begin)
        batch = [h for h in self._held if begin.position <= h.position < stop.position]
        if [h.fingerprint for h in batch] != list(stop.batch):
            batch = self._rebuild(begin, stop)
        return self._split(batch)

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, HeldPartition)
        if partition.rows.num_rows:
            yield partition.rows

    def commit(self, end: dict) -> None:
        self._committed(decode(end))

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()  # what is held goes back to the queue
        self._reset()

    # ------------------------------------------------------------------ the held messages
    def _limits(self, limit: ReadLimit) -> tuple[int, int | None]:
        """(messages, body octets) of the next batch: the stream source's caps(), both options
        applying whatever limit Spark passes, with batch_limit as the message option: never more,
        as it bounds the driver's memory, even under ReadAllAvailable (Trigger.Once too)."""
        messages, octets = caps(limit, self.batch_limit, self.options.max_bytes, available_now=True)
        return messages or self.batch_limit, octets

    def _connected(self, position: int) -> QueueConsumer:
        if self._consumer is None:
            self._consumer = QueueConsumer(self.options.endpoint, self.queue, min(65535, 2 * self.batch_limit))
        if self._next is None:
            self._next = position
        return self._consumer

    def _committed(self, offset: QueueOffset) -> None:
        """Everything before `offset` is committed: ack what is held of it; the messages of
        the batch that ended there may be back from an earlier run, to ack on sight."""
        consumer = self._connected(offset.position)
        tags = []
        while self._held and self._held[0].position < offset.position:
            tags.append(self._held.popleft().tag)
        if tags:
            consumer.ack(tags)
        elif self._fresh:
            self._settle = offset.fingerprints()
        self._fresh = False

    def _take(self, tag: int, redelivered: bool, exchange: str, routing_key: str, properties: Any,
              body: bytes) -> bool:
        consumer = self._consumer
        assert consumer is not None and self._next is not None
        fingerprint = consumer.fingerprint(exchange, routing_key, properties, body)
        if redelivered and self._settle[fingerprint] > 0:
            self._settle[fingerprint] -= 1  # committed in an earlier run, back because its ack was not
            consumer.ack([tag])
            if self._left:
                self._left -= 1
            return False
        if not redelivered:
            self._settle.clear()  # requeued messages come back before any never delivered
        self._held.append(Held(self._next, tag, fingerprint, redelivered, exchange, routing_key, properties, body))
        self._next += 1
        return True

    def _fill(self, position: int, rows: int, octets: int | None) -> None:
        """Take messages until `rows` are held from `position` on (or `octets` of body), or
        the queue is quiet."""
        consumer = self._connected(position)
        held = sum(1 for h in self._held if h.position >= position)
        want = rows - held
        if octets is not None and sum(len(h.body) for h in self._held if h.position >= position) >= octets:
            want = 0
        if self._left is not None:
            want = min(want, self._left)
        taken = consumer.take(want, FIRST_WAIT if held == 0 else IDLE, self._take)
        if self._left is not None:
            self._left -= taken

    def _batch(self, position: int, rows: int, octets: int | None) -> list[Held]:
        batch: list[Held] = []
        size = 0
        for h in self._held:
            if h.position < position:
                continue
            if len(batch) >= rows or (octets is not None and batch and size + len(h.body) > octets):
                break
            batch.append(h)
            size += len(h.body)
        return batch

    def _rebuild(self, begin: QueueOffset, stop: QueueOffset) -> list[Held]:
        """A batch planned before a restart (or a lost connection): its messages, back
        redelivered, found by fingerprint; the others taken meanwhile wait for the next
        batch. Messages that do not come back (another consumer took them, they expired)
        are missing from the batch, with a warning."""
        consumer = self._connected(begin.position)
        wanted = stop.fingerprints()
        found: list[Held] = []
        others: list[Held] = []

        def sort_held() -> None:  # (all held are from begin on: _committed(begin) acked the rest)
            while self._held:
                h = self._held.popleft()
                if wanted[h.fingerprint] > 0:
                    wanted[h.fingerprint] -= 1
                    found.append(h)
                else:
                    others.append(h)

        sort_held()
        deadline = time.monotonic() + REPLAY_WAIT
        while sum(wanted.values()) and time.monotonic() < deadline:
            consumer.take(sum(wanted.values()), IDLE, self._take)
            sort_held()
        missing = sum(wanted.values())
        if missing:
            log.warning("queue %r: %d messages of the batch ending at position %d did not come back to be read "
                        "again (another consumer took them, or they expired)", self.queue, missing, stop.position)
        position = begin.position
        for h in found:
            h.position, position = position, position + 1
        position = stop.position
        for h in others:
            h.position, position = position, position + 1
        self._held = deque(found + others)
        self._next = position
        return found

    def _split(self, batch: list[Held]) -> list[HeldPartition]:
        if not batch:
            return []
        per = self.options.max_per_partition
        pieces = max(self.options.min_partitions, -(-len(batch) // per))
        size = -(-len(batch) // pieces)
        partitions = []
        for lo in range(0, len(batch), size):
            rows = Batch()
            for h in batch[lo:lo + size]:
                rows.add(h.body, h.exchange, h.routing_key, self.queue, h.position, h.redelivered, h.properties)
            partitions.append(HeldPartition(rows.record_batch()))
        return partitions
