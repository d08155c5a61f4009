"""`spark.read.format("warren")` and `spark.readStream.format("warren")`: Warren's streams as
a Spark source (PySpark's Python Data Source API), exactly once into file and Delta sinks.

Stream mode (`stream=NAME[,NAME...]`): a micro-batch is a range of offsets of each stream,
planned on the driver from the streams' committed offsets and checkpointed by Spark as
`{"streams": {name: next_offset}}`. Each partition reads its range with its own consumer
(warren.spark.broker.read_range), and a range read again gives the same entries, so a batch
replayed after a failure writes the same rows: the Spark checkpoint is the only resume point
(nothing is kept on the broker).

Queue mode (`queue=NAME`, streaming only) is warren.spark.queue_source: destructive reads,
at least once.

Options (case-insensitive): `stream`, connection (`uri`, or `host`, `port`, `vhost`, `user`,
`password`), `startingOffsets` (`earliest` | `latest` | JSON; streaming queries default to
latest, batch reads to earliest), `startingTimestamp` (ms since the epoch, taken to the second
below (AMQP timestamps are seconds): the first chunk appended at or after it, else the tail;
it takes precedence over startingOffsets, as Kafka's), `endingOffsets` (batch reads only:
`latest` | JSON, streams it leaves out end at latest), `maxRecordsPerTrigger` and
`maxBytesPerTrigger` (streaming only; by the streams' average entry size; both given: a
micro-batch ends at whichever it reaches first), `minPartitions` (the session's default
parallelism by default), `maxRecordsPerPartition` (250,000 by default; a partition hands Spark
its rows as Arrow batches of ROWS_PER_BATCH), `failOnDataLoss` (true: entries of a range that
retention removed, before or during its read, fail the query; false: skipped with a warning).
An option given where it would do nothing is refused, not ignored: the stream mode options in
queue mode, endingOffsets in a streaming query, the per-trigger limits in a batch read."""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, InputPartition, ReadAllAvailable, ReadLimit,
)
from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow

from .broker import offset_at, range_reader, run, stream_offsets, stream_sizes
from .offsets import StreamRange, admit, checked, decode, encode, ending, split, starting
from .connection import Endpoint, endpoint, refuse_unknown
from .read_limits import caps
from .rows import SCHEMA_DDL, Batch

log = logging.getLogger("warren.spark")

# A task costs ~0.1 s of its own (its worker, connection, parquet file): measured 2026-11-28
# (1,000,000 × 1 KiB into parquet, local[2], 250,000 a micro-batch), a later micro-batch read
# at 153,000 rows/s in six tasks of 41,667, 175,000-179,000 in four, 183,000-216,000 in two.
DEFAULT_MAX_PER_PARTITION = 250_000
# Rows per Arrow record batch a partition hands Spark, so that a partition is never held whole
# (250,000 × 1 KiB: 250 MB). Measured on 2026-11-27 (500,000 × 1 KiB into parquet, local[2]):
# 8,192 and 50,000 alike (26,400 and 28,000 rows/s, noisy), 2,048 slower (21,900).
ROWS_PER_BATCH = 8192


class RangePartition(InputPartition):
    """One Spark task's range of one stream (picklable: plain fields)."""

    def __init__(self, stream: str, start: int, end: int):
        super().__init__((stream, start, end))
        self.stream, self.start, self.end = stream, start, end


def _flag(options: Mapping[str, str], key: str, default: bool) -> bool:
    value = options.get(key.lower())  # (the options' names lowercased; errors name the option as documented)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{key} must be true or false, not {value!r}")


def _count(options: Mapping[str, str], key: str, least: int = 1, what: str = "a whole number") -> int | None:
    """The option as an integer of at least `least` (None if not given)."""
    value = options.get(key.lower())
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{key} must be {what}, not {value!r}") from None
    if n < least:
        raise ValueError(f"{key} must be {what} (>= {least}), not {n}")
    return n


# The source's options (besides the connection's), as documented.
SOURCE_OPTIONS = ("stream", "queue", "startingOffsets", "startingTimestamp", "endingOffsets", "maxRecordsPerTrigger",
                  "maxBytesPerTrigger", "minPartitions", "maxRecordsPerPartition", "failOnDataLoss")
# Stream mode's options that a queue has nothing to apply to: queue mode refuses them.
STREAM_ONLY = ("startingOffsets", "startingTimestamp", "endingOffsets", "failOnDataLoss")
# The per-trigger limits: streaming queries only (a batch read refuses them).
PER_TRIGGER = ("maxRecordsPerTrigger", "maxBytesPerTrigger")


def _applies(names: list[str], where: str, why: str) -> ValueError:
    verb = "applies" if len(names) == 1 else "apply"
    return ValueError(f"{', '.join(names)} {verb} to {where} only: {why}")


# Seen by the data source's Python workers: the session's default parallelism, put in the
# data source's environment by warren.spark.register.
PARALLELISM_ENV = "WARREN_SPARK_DEFAULT_PARALLELISM"


def default_parallelism() -> int:
    """minPartitions' default: the session's default parallelism (spark.default.parallelism,
    else the executors' cores), as warren.spark.register saw it; 1 without it (Spark Connect)."""
    try:
        return max(1, int(os.environ.get(PARALLELISM_ENV, "1")))
    except ValueError:
        return 1


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, checked once on the driver."""

    endpoint: Endpoint
    queue: str | None
    streams: tuple[str, ...]
    starting: str | None
    starting_timestamp: int | None
    ending: str | None  # (None: not given)
    max_records: int | None
    max_bytes: int | None
    min_partitions: int
    max_per_partition: int
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SourceOptions:
        refuse_unknown(raw, SOURCE_OPTIONS, "source")
        opts = {k.lower(): v for k, v in raw.items()}
        queue = opts.get("queue", "").strip() or None
        streams = tuple(s.strip() for s in opts.get("stream", "").split(",") if s.strip())
        if bool(queue) == bool(streams):
            raise ValueError("the warren source needs exactly one of stream=NAME[,NAME...] (offsets) and "
                             f"queue=NAME (destructive reads): {'both are' if queue else 'neither is'} given")
        if len(set(streams)) != len(streams):
            raise ValueError(f"stream names a stream twice: {opts['stream']!r}")
        if queue:
            given = [name for name in STREAM_ONLY if name.lower() in opts]
            if given:
                raise _applies(given, "stream mode (stream=NAME)", "queue=NAME takes messages off the queue: it "
                               "has no offsets to start or end at, and loses none to retention")
        starting_, ending_ = opts.get("startingoffsets"), opts.get("endingoffsets")
        if starting_ is not None:
            starting_ = checked("startingOffsets", starting_, ("earliest", "latest"), list(streams))
        if ending_ is not None:
            ending_ = checked("endingOffsets", ending_, ("latest",), list(streams))
        return cls(endpoint(raw), queue, streams, starting_, _count(opts, "startingTimestamp", 0, "milliseconds since the epoch"), ending_,
                   _count(opts, "maxRecordsPerTrigger"), _count(opts, "maxBytesPerTrigger"),
                   _count(opts, "minPartitions") or default_parallelism(),
                   _count(opts, "maxRecordsPerPartition") or DEFAULT_MAX_PER_PARTITION,
                   _flag(opts, "failOnDataLoss", True))


class _Planner:
    """What the driver asks of the streams: their offsets, where a query starts, the ranges
    of a batch."""

    def __init__(self, options: SourceOptions):
        self.o = options

    def current(self) -> dict[str, tuple[int, int]]:
        """{stream: (first, next)} committed offsets."""
        return run(stream_offsets(self.o.endpoint, list(self.o.streams)))

    def start(self, default: str, now: Mapping[str, tuple[int, int]] | None = None) -> dict[str, int]:
        now = self.current() if now is None else now
        first = {s: f for s, (f, _n) in now.items()}
        next_ = {s: n for s, (_f, n) in now.items()}
        if self.o.starting_timestamp is not None:  # (before startingOffsets, as Kafka's)
            # the consumer's x-stream-offset is an AMQP timestamp: whole seconds
            when = datetime.datetime.fromtimestamp(self.o.starting_timestamp // 1000, datetime.timezone.utc)
            start = {}
            for s in self.o.streams:
                found = run(offset_at(self.o.endpoint, s, when))
                start[s] = next_[s] if found is None else found
            return start
        return starting(self.o.starting or default, list(self.o.streams), first, next_)

    def partitions(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[RangePartition]:
        ranges = split(start, end, self.o.min_partitions, self.o.max_per_partition)
        return [RangePartition(r.stream, r.start, r.end) for r in ranges]


def read_partition(options: SourceOptions, partition: RangePartition) -> Iterator:
    """The rows of one range, as Arrow record batches."""
    batch = Batch(annotation="x-stream-offset")
    r = StreamRange(partition.stream, partition.start, partition.end)
    for _taken in range_reader(options.endpoint, r, options.fail_on_data_loss, batch.add, every=ROWS_PER_BATCH,
                               on_entries=batch.add_entries):
        if len(batch):
            yield batch.record_batch()


def batch_cap(limit: ReadLimit, options: SourceOptions, available_now: bool,
              average_size: Callable[[], int]) -> int | None:
    """The entries the next micro-batch may take (None: no cap); a byte limit counts the
    streams' average entry size (`average_size()`, asked only then), at least one entry."""
    rows, octets = caps(limit, options.max_records, options.max_bytes, available_now)
    if octets is None:
        return rows
    by_size = max(1, octets // max(1, average_size()))
    return by_size if rows is None else min(rows, by_size)


class WarrenBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        planner = _Planner(options)
        now = planner.current()
        self.start = planner.start("earliest", now)
        self.end = ending(options.ending or "latest", list(options.streams), self.start,
                          {s: n for s, (_f, n) in now.items()})

    def partitions(self):
        return _Planner(self.options).partitions(self.start, self.end)

    def read(self, partition):
        if not isinstance(partition, RangePartition):
            return iter(())  # InputPartition(None): what Spark reads when there are no partitions (nothing to read)
        return read_partition(self.options, partition)


class WarrenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: the tail at its start

    def initialOffset(self) -> dict:
        return encode(_Planner(self.options).start("latest"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records is not None:
            return ReadMaxRows(self.options.max_records)
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def _tails(self) -> dict[str, int]:
        return {s: n for s, (_f, n) in _Planner(self.options).current().items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._tails()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = decode(start)
        available = self._target if self._target is not None else self._tails()
        cap = batch_cap(limit, self.options, self._target is not None, self._average_size)
        return encode(admit(begin, available, cap))

    def _average_size(self) -> int:
        stats = run(stream_sizes(self.options.endpoint, list(self.options.streams)))
        return sum(b for b, _n in stats.values()) // max(1, sum(n for _b, n in stats.values()))

    def reportLatestOffset(self) -> dict:
        return encode(self._tails())

    def partitions(self, start: dict, end: dict):
        begin, stop = decode(start), decode(end)
        return _Planner(self.options).partitions(begin, stop)

    def read(self, partition):
        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        """(The Spark checkpoint is the only resume point: nothing to tell the broker.)"""


class WarrenDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "warren"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> WarrenBatchReader:
        options = SourceOptions.parse(self.options)
        if options.queue:
            raise ValueError("queue= reads are streaming only (a batch read has no commit to ack at): drain the "
                             "queue with spark.readStream and Trigger.AvailableNow")
        given = [name for name, v in zip(PER_TRIGGER, (options.max_records, options.max_bytes)) if v is not None]
        if given:
            raise _applies(given, "streaming queries (spark.readStream)",
                           "a batch read takes its whole range at once (endingOffsets bounds it)")
        return WarrenBatchReader(options)

    def streamReader(self, schema) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options)
        if options.queue:
            from .queue_source import QueueStreamReader
            return QueueStreamReader(options)
        if options.ending is not None:
            raise _applies(["endingOffsets"], "batch reads (spark.read)", "a streaming query reads on as the "
                           "streams grow (Trigger.AvailableNow stops at the tails it starts with)")
        return WarrenStreamReader(options)

    def writer(self, schema, overwrite: bool):
        from .sink import WarrenWriter
        return WarrenWriter(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import WarrenStreamWriter
        return WarrenStreamWriter(self.options, schema)
