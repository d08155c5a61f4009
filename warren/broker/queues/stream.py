"""A stream queue (x-queue-type=stream), as RabbitMQ 3.10 serves one to AMQP 0-9-1 clients
(rabbit_stream_queue.erl): publishing appends to the stream's log (warren.store.stream),
consuming reads it from an offset and removes nothing.

- Declared durable only, with the stream's own arguments and policy keys (max-length-bytes,
  max-age, stream-max-segment-size-bytes: a policy's value beats the argument, RabbitMQ's
  policy_precedence); basic.get and queue.purge are refused.
- A consumer needs manual acks and a basic.qos prefetch; acks, nacks and rejects are all
  just credit. It starts where its `x-stream-offset` says (next by default) and every
  delivery carries its offset in the `x-stream-offset` header (a long).
- Consumers see committed offsets only (fsynced: warren.store.stream).

Warren's own: a consumer given a name (`x-stream-consumer-name`, ignored by RabbitMQ) has its
acked offset kept on the server, starts after it when it gives no `x-stream-offset`, and
shows its lag in the management API.

Warren's own too: a consumer with `x-warren-record-batch` (a byte count) gets the stream's
records as stored, many per delivery (see RecordBatch), for readers such as the Spark source
that take a range in bulk: the broker then does per batch what it does per entry otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...store.queued_message import QueuedMessage
from ...store.replicated_stream import ReplicatedStream, ReplicatedStreamReader
from ...store.stream import StreamLog, StreamReader
from ..errors import not_implemented, precondition_failed
from ..queue_arguments import NOT_STREAM_ARGS, STREAM_CHECKS, STREAM_EQUIVALENCE_ARGS, check_segment_size
from ..queue_settings import QueueSettings
from ..stream_offsets import OffsetSpec, max_age_ms, parse_offset_spec
from .base import Queue
from .capabilities import Capabilities
from ...amqp.codec import shortstr, table_type_name
from ...amqp.properties import encode_header
from ...amqp.erlang import erl_term
from ...amqp.message import Message
from ...amqp.reencode import long_slot
from ..consumer import RECORD_BATCH
from ..consumer_set import ConsumerSet

if TYPE_CHECKING:
    from ..consumer import Consumer
    from ..ports import Timer
    from ...store.persister import Persister
    from ...store.settlement import Settlement

log = logging.getLogger("warren.stream")

OFFSET_HEADER = b"x-stream-offset"
CONSUMER_NAME = "x-stream-consumer-name"
RECORDS_TYPE = "application/vnd.warren.stream-records"
RECORDS_FORMAT = 1  # the layout of warren.store.segments (x-warren-record-format)
MAX_RECORD_BATCH = 16 << 20  # (a batch is read into memory whole)
DELIVERED = Message("", "", b"", b"", b"")  # what an unacked record batch keeps of its message
# Deliveries read for one consumer at a time (its credit bounds them too).
TAKE = 256
# Seconds between retention checks by age, and between saves of the named consumers' offsets.
RETENTION_CHECK = 60.0
TRACKING_SAVE = 1.0


class StreamEntry(QueuedMessage):
    """One delivery of a stream entry: its offset, and the named consumer to credit on ack."""

    __slots__ = ("tracker",)

    def __init__(self, offset: int, message: Message, tracker: str | None):
        # (QueuedMessage's other slots are a queue's bookkeeping, never read for a stream:
        # one delivery's worth of attributes set here, as this runs for every delivery)
        self.seq = offset
        self.message = message
        self.redelivered = False
        self.tracker = tracker


class RecordBatch(StreamEntry):
    """One delivery of a record-batch consumer: consecutive entries of the stream, their
    records as the stream stores them (warren.store.segments: per record u32 length, u32
    checksum, u8 flags, u64 offset, u16 route length, an i64 if flags & 12 (a chunk's time), the
    route's exchange and routing-key shortstrs, u32 header length, the content header as
    published, the body). Its headers say the first offset (x-stream-offset), how many
    (x-warren-records) and the layout (x-warren-record-format); its seq is the last offset,
    so a named consumer's ack tracks past the whole batch. Once delivered it holds no
    records (DELIVERED): unacked bytes count none for it. Brokers that have record batches
    say so in connection.start's capabilities (`x-warren-record-batch`)."""

    __slots__ = ()


class StreamConsumers(ConsumerSet):
    """A stream's consumers: an exclusive consume is accepted and not enforced (RabbitMQ 3.10)."""

    __slots__ = ()

    def exclusive_refused(self, exclusive: bool) -> bool:
        return False


class StreamQueue(Queue):
    """RabbitMQ's stream queue on this node."""

    CAPABILITIES = Capabilities(
        name="stream", module="rabbit_stream_queue",
        argument_checks=STREAM_CHECKS, refused_arguments=NOT_STREAM_ARGS,
        equivalence_arguments=STREAM_EQUIVALENCE_ARGS,
        consumer_arguments=frozenset({"x-stream-offset", "x-credit", RECORD_BATCH}),
        # A policy with any other key does not apply to a stream (rabbit_stream_queue capabilities).
        policy_keys=frozenset({"max-length-bytes", "max-age", "stream-max-segment-size-bytes",
                               "queue-leader-locator", "initial-cluster-size"}),
        policy_wins=frozenset({"max-length-bytes", "max-age", "stream-max-segment-size-bytes"}),
        server_named=False, durable_only=True, counts_unacked=False, members=True,
        nacked_when_out_of_reach=True)

    @classmethod
    def make_store(cls, persister: Persister | None, vhost: str, name: str, durable: bool,
                   arguments: dict[str, Any]) -> StreamLog:
        """Its log; its segment size limit is checked here, after its declare properties, as
        RabbitMQ does."""
        cls.check_store_arguments(arguments)
        if persister is None:
            raise precondition_failed("stream queues need a data directory (warren server --data-dir)")
        return StreamLog(persister, persister.queue_dir(vhost, name))

    @classmethod
    def check_store_arguments(cls, arguments: dict[str, Any]) -> None:
        check_segment_size(arguments)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        assert isinstance(self.store, (StreamLog, ReplicatedStream)), "a stream queue's store is a stream's log"
        self.log: StreamLog | ReplicatedStream = self.store  # (a replica's on a cluster: warren.cluster.stream_replica)
        self.log.on_commit = self._committed
        self.consumers = StreamConsumers()
        self.readers: dict[Consumer, StreamReader | ReplicatedStreamReader] = {}
        self.names: dict[Consumer, str] = {}  # named consumers (x-stream-consumer-name)
        self.batching: dict[Consumer, int] = {}  # record-batch consumers: their batch size in bytes
        self._slots: dict[bytes, tuple[bytes, bytes]] = {}  # stored header -> its offset slot
        self._retention_timer: Timer | None = None
        self._tracking_timer: Timer | None = None

    # figures -------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.log.count

    def declare_ok_counts(self) -> tuple[int, int]:
        return self.log.count, 0  # RabbitMQ's stat/1 for streams: consumers always 0

    @property
    def delete_ok_count(self) -> int:
        return 0

    # declare and delete ----------------------------------------------------------
    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """RabbitMQ deletes a stream whatever if-unused and if-empty say."""

    @property
    def unused_auto_delete(self) -> bool:
        return False

    def purge(self) -> int:
        raise not_implemented(f"queue.purge not supported by stream queues {self.describe()}")

    # settings ----------------------------------------------------------------------
    def apply_settings(self) -> None:
        super().apply_settings()
        s = self.settings
        age = max_age_ms(s.max_age) if s.max_age is not None else None
        self.log.set_retention(s.max_length_bytes, age, s.stream_max_segment_size_bytes)
        self._arm_retention()

    def adjust_settings(self, s: QueueSettings) -> QueueSettings:
        return s

    def _enforce(self) -> None:
        """(A stream's limits are its retention, applied by its log: nothing is dropped
        message by message.)"""

    def _arm_retention(self) -> None:
        scheduler = self._scheduler()
        if self._retention_timer is not None or scheduler is None or self.deleted:
            return
        if self.log.max_age_ms is not None:
            self._retention_timer = scheduler.call_later(min(RETENTION_CHECK, self.log.max_age_ms / 1000),
                                                         self._retention_due)

    def _retention_due(self) -> None:
        self._retention_timer = None
        if not self.deleted:
            self.log.apply_retention()
            self._arm_retention()

    def start_timers(self) -> None:
        self._arm_retention()

    def stop_timers(self) -> None:
        super().stop_timers()
        for timer in (self._retention_timer, self._tracking_timer):
            if timer is not None:
                timer.cancel()
        self._retention_timer = self._tracking_timer = None

    def shutdown(self) -> None:
        self.log.save_tracking()

    def touch(self) -> None:
        """(x-expires does not apply to streams.)"""

    # publish -----------------------------------------------------------------------
    def publish(self, message, ticket: object = None) -> Settlement:
        self.stats["publish"] += 1
        return self.log.append(message)

    def _committed(self) -> None:
        """New offsets are committed: consumers waiting at the tail get them."""
        if self.consumers:
            self.deliver_ready()

    # consume -----------------------------------------------------------------------
    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict | None) -> None:
        """RabbitMQ's refusals of a basic.consume on a stream, in its order: the offset
        argument (where RabbitMQ 3.10 crashes with 541 on a string without digits, a bool, a
        table or a float, Warren refuses it the same way as "10x"), a per-consumer prefetch,
        manual acks, no global qos."""
        offset = (arguments or {}).get("x-stream-offset")
        if parse_offset_spec(offset) is None:
            raise precondition_failed(f"invalid arg 'x-stream-offset' for {self.describe()}: "
                                      f"{{invalid_stream_offset_arg,{{{table_type_name(offset)},{erl_term(offset)}}}}}")
        if not prefetch:
            raise precondition_failed(f"consumer prefetch count is not set for '{self.describe()}'")
        if no_ack:
            raise not_implemented(f"automatic acknowledgement not supported by stream queues {self.describe()}")
        if global_prefetch:
            raise not_implemented(f"{self.describe()} does not support global qos")
        batch = (arguments or {}).get(RECORD_BATCH)
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or not 0 < batch <= MAX_RECORD_BATCH):
            raise precondition_failed(f"invalid arg '{RECORD_BATCH}' for {self.describe()}: "
                                      f"expected a byte count from 1 to {MAX_RECORD_BATCH}, got {erl_term(batch)}")

    def add_consumer(self, consumer) -> None:
        args = consumer.arguments
        spec = parse_offset_spec(args.get("x-stream-offset"))
        assert spec is not None  # check_consume refused it
        name = args.get(CONSUMER_NAME)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        if isinstance(name, str) and name:
            self.names[consumer] = name
            tracked = self.log.tracked.get(name)
            if "x-stream-offset" not in args and tracked is not None:
                spec = OffsetSpec("offset", tracked)
        self.readers[consumer] = self.log.reader(self._start(spec))
        if args.get(RECORD_BATCH) is not None:
            self.batching[consumer] = args[RECORD_BATCH]
        super().add_consumer(consumer)

    def _start(self, spec: OffsetSpec) -> int:
        log_ = self.log
        if spec.kind == "first":
            return log_.first_offset
        if spec.kind == "last":
            last = log_.last_chunk
            return last if last is not None else log_.committed
        if spec.kind == "next":
            return log_.committed
        if spec.kind == "timestamp":
            return log_.offset_at(spec.value)
        return spec.value

    def remove_consumer(self, consumer) -> None:
        self.readers.pop(consumer, None)
        self.names.pop(consumer, None)
        self.batching.pop(consumer, None)
        super().remove_consumer(consumer)

    def deliver_ready(self) -> None:
        """Each consumer with credit reads on from its own offset."""
        if self.deleted:
            return
        for consumer, reader in list(self.readers.items()):
            if not consumer.gate.delivering or reader.caught_up:
                continue
            tracker = self.names.get(consumer)
            if consumer in self.batching:
                self._deliver_batches(consumer, reader, self.batching[consumer], tracker)
                continue
            credit = consumer.prefetch - consumer.unacked
            deliver = consumer.channel.deliver
            while credit > 0 and consumer.gate.delivering:
                entries = reader.take(min(credit, TAKE))
                if not entries:
                    break
                for offset, message in entries:
                    deliver(consumer, StreamEntry(offset, self._with_offset(message, offset), tracker))
                credit = consumer.prefetch - consumer.unacked

    def _deliver_batches(self, consumer: Consumer, reader: StreamReader | ReplicatedStreamReader, size: int,
                         tracker: str | None) -> None:
        deliver = consumer.channel.deliver
        while consumer.prefetch > consumer.unacked and consumer.gate.delivering:
            taken = reader.take_records(size)
            if taken is None:
                break
            first, count, records = taken
            header = encode_header(len(records), {"content_type": RECORDS_TYPE, "headers": {
                "x-stream-offset": first, "x-warren-records": count, "x-warren-record-format": RECORDS_FORMAT}})
            message = Message("", self.name, shortstr("") + shortstr(self.name), header, records)
            batch = RecordBatch(first + count - 1, message, tracker)
            deliver(consumer, batch)
            # The records went to the connection's output by reference; unacked, the batch
            # keeps its offsets only (else a consumer with a big prefetch that never acks
            # would have the broker hold prefetch × 16 MiB).
            batch.message = DELIVERED

    def _with_offset(self, message: Message, offset: int) -> Message:
        """The message as delivered: its header with the x-stream-offset header set."""
        header = message.header
        slot = self._slots.get(header)
        if slot is None:
            if len(self._slots) >= 1024:
                self._slots.clear()
            slot = self._slots[header] = long_slot(header, OFFSET_HEADER)
        before, after = slot
        return Message(message.exchange, message.routing_key, message.route,
                       before + (offset & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + after, message.body)

    def get(self):
        raise not_implemented(f"basic.get not supported by stream queues {self.describe()}")

    # settlement: only credit -------------------------------------------------------------
    def delivered(self, qm, no_ack: bool, get: bool = False, holder: str = "") -> None:
        self.unacked_count += 1
        self.stats["deliver"] += 1

    def ack(self, qm) -> None:
        self.unacked_count -= 1
        self.stats["ack"] += 1
        if qm.tracker is not None and not self.deleted:
            self.log.track(qm.tracker, qm.seq + 1)
            self._save_tracking_later()

    def check_recover(self) -> None:
        """(RabbitMQ 3.10 fails with 541 here.)"""
        raise not_implemented(f"basic.recover not supported by stream queues {self.describe()}")

    def reject(self, qm, requeue: bool, closed: bool = False) -> None:
        """Only its channel closing gives deliveries back (as credit): a client's nack or
        reject is a connection error, as in RabbitMQ."""
        self.unacked_count -= 1
        if not closed:
            raise not_implemented(f"basic.nack and basic.reject not supported by stream queues {self.describe()}")

    def _save_tracking_later(self) -> None:
        scheduler = self._scheduler()
        if self._tracking_timer is None and scheduler is not None:
            self._tracking_timer = scheduler.call_later(TRACKING_SAVE, self._save_tracking)

    def _save_tracking(self) -> None:
        self._tracking_timer = None
        if not self.deleted:
            self.log.save_tracking()

    # what operators see ------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Warren's extension of a stream's view: its first/last/next offsets, the oldest
        chunk's time, and its named consumers' offsets and lag."""
        log_ = self.log
        return {"stream": {"first_offset": log_.first_offset, "last_offset": log_.last_offset,
                           "next_offset": log_.committed, "first_timestamp": log_.first_timestamp,
                           "segments": len(log_.segments), "bytes": log_.total_bytes,
                           "consumer_offsets": [{"name": name, "offset": offset,
                                                 "lag": max(log_.committed - offset, 0)}
                                                for name, offset in sorted(log_.tracked.items())]}}

    def consumer_info(self, consumer) -> dict[str, Any]:
        """Warren's: a reader's next offset and how far behind the stream's end it is."""
        reader = self.readers.get(consumer)
        if reader is None:
            return {}
        return {"stream_offset": reader.offset, "stream_lag": max(self.log.committed - reader.offset, 0)}
