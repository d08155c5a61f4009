"""The Spark source's options and reader objects without Spark (PySpark's data source classes
are pure Python): option names in any case, the options refused where they would do nothing,
Spark's ReadLimit and the options turned into a micro-batch's cap (both per-trigger limits
at once, Trigger.Once and Trigger.AvailableNow), and what Spark pickles. The readers' calls
that ask the broker (the AvailableNow target, the tails, the queue source's acks) run against
the real broker of tests/conftest.py."""

import pickle
import re
import time

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.datasource import InputPartition, ReadAllAvailable  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxFiles, ReadMaxRows, ReadMinRows  # noqa: E402

from warren.spark.offsets import decode, encode  # noqa: E402
from warren.spark.queue_offsets import decode as decode_queue  # noqa: E402
from warren.spark.queue_source import DEFAULT_BATCH, HeldPartition, QueueStreamReader  # noqa: E402
from warren.spark.source import (  # noqa: E402
    RangePartition, SourceOptions, WarrenBatchReader, WarrenDataSource, WarrenStreamReader, batch_cap, caps,
)

URI = "amqp://guest:guest@127.0.0.1:1/%2F"  # (nothing listens there: what needs no broker never connects)
STREAM = {"uri": URI, "stream": "s"}
QUEUE = {"uri": URI, "queue": "q"}


def parse(**options):
    return SourceOptions.parse(options)


# ---------------------------------------------------------------------------- option names

EVERY_STREAM_OPTION = {"uri": URI, "stream": "a,b", "startingOffsets": '{"streams": {"a": 3}}',
                       "startingTimestamp": "1700000000123", "endingOffsets": "latest",
                       "maxRecordsPerTrigger": "100", "maxBytesPerTrigger": "4096", "minPartitions": "3",
                       "maxRecordsPerPartition": "50", "failOnDataLoss": "false", "host": "h", "port": "5680",
                       "vhost": "v", "user": "u", "password": "p"}


@pytest.mark.parametrize("case", [str.lower, str.upper, str.swapcase, lambda k: k])
def test_every_option_name_is_case_insensitive(case):
    o = SourceOptions.parse({case(k): v for k, v in EVERY_STREAM_OPTION.items()})
    assert (o.streams, o.starting, o.starting_timestamp, o.ending) == (
        ("a", "b"), '{"streams": {"a": 3}}', 1700000000123, "latest")
    assert (o.max_records, o.max_bytes, o.min_partitions, o.max_per_partition, o.fail_on_data_loss) == (
        100, 4096, 3, 50, False)
    assert (o.endpoint.host, o.endpoint.port, o.endpoint.vhost, o.endpoint.user, o.endpoint.password) == (
        "h", 5680, "v", "u", "p")
    q = SourceOptions.parse({case(k): v for k, v in {**QUEUE, "maxRecordsPerTrigger": "7",
                                                     "maxBytesPerTrigger": "9"}.items()})
    assert (q.queue, q.streams, q.max_records, q.max_bytes) == ("q", (), 7, 9)


def test_defaults():
    o = parse(**STREAM)
    assert (o.starting, o.starting_timestamp, o.ending, o.max_records, o.max_bytes, o.fail_on_data_loss) == (
        None, None, None, None, None, True)


# ---------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("option,value", [("startingOffsets", "earliest"), ("STARTINGOFFSETS", "latest"),
                                          ("startingTimestamp", "0"), ("endingoffsets", "latest"),
                                          ("failOnDataLoss", "false"), ("FailOnDataLoss", "true")])
def test_queue_mode_refuses_the_stream_mode_options(option, value):
    canonical = next(n for n in ("startingOffsets", "startingTimestamp", "endingOffsets", "failOnDataLoss")
                     if n.lower() == option.lower())
    with pytest.raises(ValueError) as refused:
        parse(**QUEUE, **{option: value})
    assert str(refused.value) == (f"{canonical} applies to stream mode (stream=NAME) only: queue=NAME takes "
                                  "messages off the queue: it has no offsets to start or end at, and loses none "
                                  "to retention")


def test_queue_mode_names_every_refused_option():
    with pytest.raises(ValueError, match=r"^startingOffsets, failOnDataLoss apply to stream mode \(stream=NAME\) "
                                         r"only: "):
        parse(**QUEUE, startingOffsets="earliest", failOnDataLoss="true")


def test_stream_and_queue_neither_or_both():
    with pytest.raises(ValueError, match=r"needs exactly one of stream=NAME\[,NAME\.\.\.\] \(offsets\) and "
                                         r"queue=NAME \(destructive reads\): neither is given"):
        parse(uri=URI)
    with pytest.raises(ValueError, match="neither is given"):
        parse(uri=URI, stream=" , ", queue="")
    with pytest.raises(ValueError, match="exactly one of .*: both are given"):
        parse(uri=URI, stream="s", queue="q")
    with pytest.raises(ValueError, match="names a stream twice"):
        parse(uri=URI, stream="a,b,a")


@pytest.mark.parametrize("option,value,message", [
    ("startingOffsets", "earlist", "startingOffsets must be earliest or latest or JSON like "
                                   '{"streams": {"name": 123}}, not \'earlist\''),
    ("startingOffsets", '{"streams": {"other": 1}}', "startingOffsets names streams the source does not read: "
                                                    "['other']"),
    ("endingOffsets", "earliest", "endingOffsets must be latest or JSON like "),
    ("endingOffsets", '{"streams": {"s": 5, "t": 1}}', "endingOffsets names streams the source does not read: ['t']"),
    ("endingOffsets", '{"streams": {"s": -5}}', "offset of stream 's' must be a whole number >= 0, not -5"),
    ("startingTimestamp", "2026-01-01", "startingTimestamp must be milliseconds since the epoch, not '2026-01-01'"),
    ("startingTimestamp", "-1", "startingTimestamp must be milliseconds since the epoch (>= 0), not -1"),
    ("maxRecordsPerTrigger", "0", "maxRecordsPerTrigger must be a whole number (>= 1), not 0"),
    ("maxBytesPerTrigger", "1k", "maxBytesPerTrigger must be a whole number, not '1k'"),
    ("failOnDataLoss", "no", "failOnDataLoss must be true or false, not 'no'"),
])
def test_bad_values_are_refused_when_the_source_is_made(option, value, message):
    """(before any broker is asked: a typo found when the first batch is planned is found late)"""
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(**STREAM, **{option: value})


def test_a_streaming_query_refuses_ending_offsets_and_a_batch_read_the_trigger_limits():
    with pytest.raises(ValueError) as refused:
        WarrenDataSource({**STREAM, "ENDINGOFFSETS": "latest"}).streamReader(None)
    assert str(refused.value) == ("endingOffsets applies to batch reads (spark.read) only: a streaming query reads "
                                  "on as the streams grow (Trigger.AvailableNow stops at the tails it starts with)")
    with pytest.raises(ValueError) as refused:
        WarrenDataSource({**STREAM, "maxrecordspertrigger": "10"}).reader(None)
    assert str(refused.value) == ("maxRecordsPerTrigger applies to streaming queries (spark.readStream) only: a "
                                  "batch read takes its whole range at once (endingOffsets bounds it)")
    with pytest.raises(ValueError, match="^maxRecordsPerTrigger, maxBytesPerTrigger apply to streaming queries"):
        WarrenDataSource({**STREAM, "maxRecordsPerTrigger": "10", "maxBytesPerTrigger": "10"}).reader(None)
    with pytest.raises(ValueError, match="streaming only"):
        WarrenDataSource(QUEUE).reader(None)
    # what they apply to takes them (no broker is asked to make a stream reader)
    assert WarrenDataSource({**STREAM, "maxRecordsPerTrigger": "10"}).streamReader(None).options.max_records == 10
    queue_reader = WarrenDataSource({**QUEUE, "maxBytesPerTrigger": "10"}).streamReader(None)
    assert isinstance(queue_reader, QueueStreamReader) and queue_reader.options.max_bytes == 10


def test_queue_mode_caps_its_batches():
    with pytest.raises(ValueError, match="at most 30000 in queue mode"):
        QueueStreamReader(parse(**QUEUE, maxRecordsPerTrigger="30001"))
    assert QueueStreamReader(parse(**QUEUE)).batch_limit == DEFAULT_BATCH


# ---------------------------------------------------------------------------- read limits

def test_spark_read_limits_and_both_options():
    # the default limit Spark hands back: one of the options; the other applies too
    assert caps(ReadMaxRows(100), 100, None, False) == (100, None)
    assert caps(ReadMaxRows(100), 100, 4096, False) == (100, 4096)
    assert caps(ReadMaxBytes(4096), None, 4096, False) == (None, 4096)
    assert caps(ReadMaxRows(50), 100, None, False) == (50, None)  # whichever is smaller
    assert caps(ReadMaxBytes(10), None, 4096, True) == (None, 10)
    # Trigger.Once: everything, as Spark documents; Trigger.AvailableNow keeps the options' limits
    assert caps(ReadAllAvailable(), 100, 4096, False) == (None, None)
    assert caps(ReadAllAvailable(), 100, 4096, True) == (100, 4096)
    assert caps(ReadAllAvailable(), None, None, True) == (None, None)
    for other in (ReadMinRows(5), ReadMaxFiles(5)):  # (never the source's default: refused, not ignored)
        with pytest.raises(ValueError, match="takes no read limit"):
            caps(other, 100, None, False)


def test_a_micro_batch_stops_at_whichever_limit_comes_first():
    def never() -> int:
        raise AssertionError("the average entry size is asked for only under a byte limit")

    rows = parse(**STREAM, maxRecordsPerTrigger="100")
    both = parse(**STREAM, maxRecordsPerTrigger="100", maxBytesPerTrigger="5000")
    assert batch_cap(ReadMaxRows(100), rows, False, never) == 100
    assert batch_cap(ReadAllAvailable(), rows, False, never) is None
    assert batch_cap(ReadAllAvailable(), rows, True, never) == 100
    assert batch_cap(ReadMaxRows(100), both, False, lambda: 100) == 50  # bytes first: 5000 / 100
    assert batch_cap(ReadMaxRows(100), both, False, lambda: 10) == 100  # records first
    assert batch_cap(ReadAllAvailable(), both, True, lambda: 100) == 50
    assert batch_cap(ReadMaxBytes(5000), parse(**STREAM, maxBytesPerTrigger="5000"), False, lambda: 100) == 50
    assert batch_cap(ReadMaxRows(100), both, False, lambda: 10_000) == 1  # an entry above the limit: one a batch
    assert batch_cap(ReadMaxRows(100), both, False, lambda: 0) == 100  # (an empty stream's average)


def test_the_default_read_limit():
    assert WarrenStreamReader(parse(**STREAM)).getDefaultReadLimit() == ReadAllAvailable()
    assert WarrenStreamReader(parse(**STREAM, maxRecordsPerTrigger="7")).getDefaultReadLimit() == ReadMaxRows(7)
    assert WarrenStreamReader(parse(**STREAM, maxBytesPerTrigger="9")).getDefaultReadLimit() == ReadMaxBytes(9)
    assert WarrenStreamReader(parse(**STREAM, maxRecordsPerTrigger="7", maxBytesPerTrigger="9")) \
        .getDefaultReadLimit() == ReadMaxRows(7)
    assert QueueStreamReader(parse(**QUEUE)).getDefaultReadLimit() == ReadMaxRows(DEFAULT_BATCH)
    assert QueueStreamReader(parse(**QUEUE, maxBytesPerTrigger="9")).getDefaultReadLimit() == ReadMaxBytes(9)


def test_the_queue_source_applies_both_limits_too():
    both = QueueStreamReader(parse(**QUEUE, maxRecordsPerTrigger="100", maxBytesPerTrigger="5000"))
    assert both._limits(ReadMaxRows(100)) == (100, 5000)
    assert both._limits(ReadMaxBytes(5000)) == (100, 5000)
    assert both._limits(ReadAllAvailable()) == (100, 5000)  # (the driver holds a batch: never unbounded)
    assert QueueStreamReader(parse(**QUEUE))._limits(ReadAllAvailable()) == (DEFAULT_BATCH, None)
    with pytest.raises(ValueError, match="takes no read limit"):
        both._limits(ReadMinRows(1))


# ---------------------------------------------------------------------------- what Spark pickles

def test_partitions_and_readers_pickle():
    part = pickle.loads(pickle.dumps(RangePartition("s", 3, 9)))
    assert (part.stream, part.start, part.end, part.value) == ("s", 3, 9, ("s", 3, 9))
    rows = pa.RecordBatch.from_pydict({"body": [b"a", b"bc"], "offset": [4, 5]})
    held = pickle.loads(pickle.dumps(HeldPartition(rows)))
    assert held.value == 2 and held.rows.equals(rows)
    reader = WarrenStreamReader(parse(**STREAM, maxRecordsPerTrigger="5"))
    reader._target = {"s": 42}
    again = pickle.loads(pickle.dumps(reader))
    assert again.options == reader.options and again._target == {"s": 42}


def test_a_stream_readers_micro_batch_partitions_and_commit():
    reader = WarrenStreamReader(parse(uri=URI, stream="a,b", minPartitions="2", maxRecordsPerPartition="4"))
    parts = reader.partitions(encode({"a": 0, "b": 7}), encode({"a": 6, "b": 9}))
    # (four pieces, a multiple of minPartitions: the biggest cut first)
    assert [p.value for p in parts] == [("a", 0, 2), ("a", 2, 4), ("a", 4, 6), ("b", 7, 9)]
    assert all(isinstance(p, RangePartition) for p in parts)
    assert reader.partitions(encode({"a": 6, "b": 9}), encode({"a": 6, "b": 9})) == []
    # the checkpoint is the only resume point: a commit tells the broker nothing (none listens at URI)
    assert reader.commit(encode({"a": 6, "b": 9})) is None


def test_the_queue_reader_pickles_its_options_not_its_messages():
    reader = QueueStreamReader(parse(**QUEUE, maxRecordsPerTrigger="50"))
    reader._next, reader._left, reader._fresh = 12, 3, False
    reader._held.append("a held message")
    assert reader.__getstate__() == {"options": reader.options, "queue": "q", "batch_limit": 50}
    again = pickle.loads(pickle.dumps(reader))
    assert (again.options, again.queue, again.batch_limit) == (reader.options, "q", 50)
    assert (again._consumer, list(again._held), again._next, again._left, again._fresh) == (None, [], None, None, True)


# ---------------------------------------------------------------------------- against the broker

def _stream(broker, name, count, first=0):
    import pika

    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", name, b"m%d" % i)
    conn.close()


def test_available_now_stops_at_the_tail_it_started_with(broker, uid):
    s = f"so-target-{uid}"
    _stream(broker, s, 25)
    reader = WarrenStreamReader(parse(uri=broker.url, stream=s, startingOffsets="earliest",
                                      maxRecordsPerTrigger="10"))
    start = reader.initialOffset()
    assert start == encode({s: 0})
    reader.prepareForTriggerAvailableNow()
    _stream(broker, s, 5, first=25)  # after the start: not read
    ends, at = [], start
    while True:
        end = reader.latestOffset(at, ReadMaxRows(10))
        if end == at:
            break
        ends.append(decode(end)[s])
        at = end
    assert ends == [10, 20, 25]
    assert reader.reportLatestOffset() == encode({s: 30})  # the lag Spark shows: the live tail
    # pickled to a worker, it keeps the target
    assert pickle.loads(pickle.dumps(reader)).latestOffset(encode({s: 20}), ReadMaxRows(10)) == encode({s: 25})
    # without AvailableNow, the live tail; Trigger.Once (ReadAllAvailable) takes all of it
    live = WarrenStreamReader(parse(uri=broker.url, stream=s, maxRecordsPerTrigger="10"))
    assert live.initialOffset() == encode({s: 30})  # (streaming queries start at latest)
    assert live.latestOffset(encode({s: 25}), ReadMaxRows(10)) == encode({s: 30})
    assert live.latestOffset(encode({s: 0}), ReadAllAvailable()) == encode({s: 30})


def test_a_byte_limit_counts_the_streams_average_entry(broker, uid):
    import pika

    conn = pika.BlockingConnection(broker.pika_params())
    warren = conn._impl.server_properties.get("product") in ("Warren", b"Warren")
    conn.close()
    if not warren:
        pytest.skip("maxBytesPerTrigger needs Warren's offsets request")
    s = f"so-bytes-{uid}"
    _stream(broker, s, 40)

    def reader(**limits) -> WarrenStreamReader:
        return WarrenStreamReader(parse(uri=broker.url, stream=s, **limits))

    average = reader(maxBytesPerTrigger="1")._average_size()
    assert average > len(b"m39")  # (a stored entry holds its route and content header too)
    octets = 4 * average + average // 2  # four entries and a half
    assert reader(maxBytesPerTrigger=str(octets)).latestOffset(encode({s: 0}), ReadMaxBytes(octets)) == encode({s: 4})
    # both: whichever comes first
    both = reader(maxBytesPerTrigger=str(octets), maxRecordsPerTrigger="3")
    assert both.latestOffset(encode({s: 0}), ReadMaxRows(3)) == encode({s: 3})
    both = reader(maxBytesPerTrigger=str(octets), maxRecordsPerTrigger="10")
    assert both.latestOffset(encode({s: 0}), ReadMaxRows(10)) == encode({s: 4})
    both.prepareForTriggerAvailableNow()
    assert both.latestOffset(encode({s: 38}), ReadMaxRows(10)) == encode({s: 40})


def test_a_batch_read_plans_its_range_once(broker, uid):
    s = f"so-batch-{uid}"
    _stream(broker, s, 12)
    reader = WarrenBatchReader(parse(uri=broker.url, stream=s, startingOffsets='{"streams": {"%s": 2}}' % s,
                                     endingOffsets='{"streams": {"%s": 9}}' % s, minPartitions="2"))
    assert (reader.start, reader.end) == ({s: 2}, {s: 9})
    again = pickle.loads(pickle.dumps(reader))  # (Spark ships it to the workers)
    assert [p.value for p in again.partitions()] == [(s, 2, 6), (s, 6, 9)]
    # an ending before the start reads nothing; startingOffsets latest neither
    assert WarrenBatchReader(parse(uri=broker.url, stream=s, startingOffsets='{"streams": {"%s": 9}}' % s,
                                   endingOffsets='{"streams": {"%s": 4}}' % s)).end == {s: 9}
    empty = WarrenBatchReader(parse(uri=broker.url, stream=s, startingOffsets="latest"))
    assert empty.partitions() == []
    assert list(empty.read(InputPartition(None))) == []  # (Spark's stand-in for no partitions)


def test_streams_an_ending_leaves_out_end_at_latest(broker, uid):
    a, b = f"so-end-a-{uid}", f"so-end-b-{uid}"
    _stream(broker, a, 5)
    _stream(broker, b, 7)
    reader = WarrenBatchReader(parse(uri=broker.url, stream=f"{a},{b}", endingOffsets='{"streams": {"%s": 3}}' % a))
    assert (reader.start, reader.end) == ({a: 0, b: 0}, {a: 3, b: 7})


def test_a_queue_batch_is_acked_when_committed(broker, uid):
    import pika

    q = f"so-commit-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, b"m%d" % i)

    def ready() -> int:
        deadline = time.monotonic() + 10  # (a closed consumer's messages come back in the broker's time)
        while True:
            count = ch.queue_declare(q, passive=True).method.message_count
            if count or time.monotonic() > deadline:
                return count
            time.sleep(0.05)

    def first_batch() -> tuple[QueueStreamReader, dict]:
        reader = QueueStreamReader(parse(uri=broker.url, queue=q, maxRecordsPerTrigger="3"))
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(3))
        assert decode_queue(end).position == 3 and len(decode_queue(end).batch) == 3
        [part] = reader.partitions(start, end)
        assert part.rows.column("body").to_pylist() == [b"m0", b"m1", b"m2"]
        return reader, end

    reader, _end = first_batch()
    reader.stop()  # not committed: all of it comes back
    assert ready() == 5
    reader, end = first_batch()
    reader.commit(end)
    reader.stop()
    assert ready() == 2
    conn.close()


# ---------------------------------------------------------------------------- unknown names

@pytest.mark.parametrize("name", ["maxOffsetsPerTrigger", "startingOffset", "path", "kafka.bootstrap.servers"])
def test_an_option_the_source_does_not_take_is_refused(name):
    with pytest.raises(ValueError, match=f"the warren source takes no option '{re.escape(name)}'; its options: "
                                         "stream, queue, startingOffsets"):
        parse(**STREAM, **{name: "1"})


@pytest.mark.parametrize("name", ["routing_key", "mandatoryFlag", "path"])
def test_an_option_the_sink_does_not_take_is_refused(name):
    from warren.spark.sink import WarrenStreamWriter, WarrenWriter
    with pytest.raises(ValueError, match=f"the warren sink takes no option '{name}'; its options: exchange"):
        WarrenWriter({"uri": URI, name: "x"}, None)
    # (Spark gives a streaming query's writer its checkpointLocation and queryName)
    WarrenStreamWriter({"uri": URI, "checkpointlocation": "/tmp/cp", "queryname": "q", "ROUTINGKEY": "k"}, None)
