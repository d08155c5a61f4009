"""`df.write.format("warren")` and `writeStream.format("warren")`: publish rows with confirms.

Columns: `body` (required, binary or string), and optionally `exchange`, `routing_key`,
`headers` (a map), `properties` (a struct with the source's property names) and `message_id`.
Options: `exchange` and `routingKey` (for rows without those columns), `mandatory` (an
unroutable row fails the task), `maxInFlight` (confirms outstanding at once, 1000 by default),
`confirmTimeout` (seconds, 60), and the connection options of the source (amqps:// too).

A task succeeds only once the broker confirmed every row it published: a nack, a return
(mandatory), a closed connection or a confirm timeout fails it, and Spark runs it again. The
rows of a task run again are published again, with the same message ids: ids are
`<query>:<batch>:<partition>:<row>` in a streaming query, `<writeId>:<stage>:<partition>:<row>`
in a batch write (option `writeId`, else an id drawn once for the write where Spark plans it, so
every task of it, retried or not, on any executor, has the same one), unless the rows have their
own `message_id`, so a consumer can drop the duplicates a retry makes. Speculative execution would
publish a task's rows twice at once: warren.spark.register refuses a session that has it on.

The writers take Arrow record batches (DataSourceArrowWriter, DataSourceStreamArrowWriter): a
column at a time, no Row per row. They publish through warren.spark.wire.Publisher, blocking
(frames built by hand into a send buffer, acks cut out of each read).
"""

from __future__ import annotations

import uuid
from itertools import repeat
from typing import Any, Iterable, Iterator, Mapping

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.datasource import DataSourceStreamArrowWriter

from .connection import Endpoint, endpoint, refuse_unknown
from .wire import ProtocolError, Publisher, joined_frames, property_template

DEFAULT_IN_FLIGHT = 1000
_PROPERTY_NAMES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                   "expiration", "message_id", "type", "user_id", "app_id")
_COLUMNS = ("body", "exchange", "routing_key", "headers", "properties", "message_id")
# The sink's options (besides the connection's), as documented; a streaming query's writer is
# also given its checkpointLocation and queryName by Spark.
SINK_OPTIONS = ("exchange", "routingKey", "mandatory", "maxInFlight", "confirmTimeout", "writeId",
                "checkpointLocation", "queryName")


class PublishFailed(Exception):
    """The broker did not confirm a row (nack, return, timeout): the task fails and is retried."""


class Written(WriterCommitMessage):
    def __init__(self, partition: int, rows: int):
        self.partition, self.rows = partition, rows


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _columns(batch: Any) -> tuple[int, list[Iterable]]:
    """(rows, [body, exchange, routing_key, headers, properties, message_id]) of a pyarrow
    RecordBatch (or of one Row, or a dict): each a list, or repeat(None) for a column it does
    not have. Bodies are bytes."""
    if hasattr(batch, "schema") and hasattr(batch, "num_rows"):
        import pyarrow as pa

        names = batch.schema.names
        if "body" not in names:
            raise ValueError("the warren sink needs a body column")
        columns: list[Iterable] = []
        for name in _COLUMNS:
            if name not in names:
                columns.append(repeat(None))
                continue
            column = batch.column(names.index(name))
            values = column.to_pylist()
            if name == "body":
                kind = column.type
                if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                        or pa.types.is_fixed_size_binary(kind)):
                    values = [_as_bytes(v) for v in values]
                elif column.null_count:
                    values = [b"" if v is None else v for v in values]
            columns.append(values)
        return batch.num_rows, columns
    row = batch.asDict() if hasattr(batch, "asDict") else dict(batch)
    if "body" not in row:
        raise ValueError("the warren sink needs a body column")
    return 1, [[_as_bytes(row["body"])], *([row.get(name)] for name in _COLUMNS[1:])]


class _Publisher:
    """The write side, shared by batch and streaming writes."""

    def __init__(self, options: Mapping[str, str]):
        refuse_unknown(options, SINK_OPTIONS, "sink")
        opts = {k.lower(): v for k, v in options.items()}
        self.endpoint: Endpoint = endpoint(options)
        self.exchange = opts.get("exchange", "")
        self.routing_key = opts.get("routingkey", "")
        mandatory = opts.get("mandatory", "false").lower()
        if mandatory not in ("true", "false"):
            raise ValueError(f"mandatory is true or false, not {opts['mandatory']!r}")
        self.mandatory = mandatory == "true"
        self.in_flight = int(opts.get("maxinflight", DEFAULT_IN_FLIGHT))
        if self.in_flight < 1:
            raise ValueError(f"maxInFlight must be at least 1, not {self.in_flight}")
        self.timeout = float(opts.get("confirmtimeout", 60))
        # (made where Spark plans the write, the driver: the writer goes to every task pickled)
        self.write_id = opts.get("writeid") or uuid.uuid4().hex

    def write(self, batches: Iterator) -> Written:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the warren sink writes from Spark tasks only")
        partition = ctx.partitionId()
        query = ctx.getLocalProperty("sql.streaming.queryId")
        if query:
            prefix = f"{query}:{ctx.getLocalProperty('streaming.sql.batchId')}:{partition}"
        else:
            prefix = f"{self.write_id}:{ctx.stageId()}:{partition}"
        return Written(partition, self._publish(batches, prefix))

    def _publish(self, batches: Iterable, prefix: str) -> int:
        """Publish every row of `batches` (Arrow record batches, or Rows), at most maxInFlight
        unconfirmed at once; return the number of rows once every one is confirmed. Raise
        PublishFailed at the first row the broker does not confirm (nack, return, a closed
        channel or connection, confirmTimeout seconds without a confirm)."""
        try:
            wire = Publisher(self.endpoint, min(self.timeout, 30.0))
        except (ProtocolError, OSError) as err:
            raise PublishFailed(f"cannot publish to {self.endpoint.shown}: {err}") from err
        confirmed = False
        try:
            wire.confirm_select(self.in_flight, self.timeout)
            n = 0
            for batch in batches:
                n = self._batch(wire, batch, prefix, n)
            wire.wait_confirms()
            confirmed = True
            return n
        except (ProtocolError, OSError) as err:  # nacked, returned, closed, timed out
            raise PublishFailed(f"publish failed: {err}") from err
        finally:
            if confirmed:
                wire.close_cleanly()
            else:
                wire.sock.settimeout(2.0)  # (a broker that takes nothing any more does not hold the task)
                wire.close()

    def _batch(self, wire: Publisher, batch: Any, prefix: str, n: int) -> int:
        """Publish the rows of one batch, numbered from n + 1; the last row's number."""
        bodies_only = _bodies_only(batch, wire.frame_max - 8)
        if bodies_only is not None:  # (the frames made a column at a time, JOINED_BYTES of bodies at once)
            before, after = property_template({})
            method = wire.method(self.exchange, self.routing_key, self.mandatory)
            for piece in _pieces(bodies_only, JOINED_BYTES):
                wire.publish_joined(joined_frames(method, before, after, f"{prefix}:".encode(), n + 1, piece))
                n += len(piece)
            return n
        rows, (bodies, exchanges, keys, headers, properties, ids) = _columns(batch)
        if not rows:
            return n
        publish, mandatory = wire.publish, self.mandatory
        pfx = f"{prefix}:".encode()
        if all(isinstance(c, repeat) for c in (headers, properties, ids)):
            if len(pfx) + len(str(n + rows)) > 255:
                raise ValueError(f"message ids {prefix}:<row> would be longer than 255 octets")
            before, after = property_template({})
            if isinstance(exchanges, repeat) and isinstance(keys, repeat):
                exchange, key = self.exchange, self.routing_key
                for body in bodies:
                    n += 1
                    mid = pfx + b"%d" % n
                    publish(exchange, key, body, before + bytes((len(mid),)) + mid + after, mandatory)
                return n
            for body, exchange, key in zip(bodies, exchanges, keys):
                n += 1
                mid = pfx + b"%d" % n
                publish(_text(exchange) or self.exchange, _text(key) or self.routing_key, body,
                        before + bytes((len(mid),)) + mid + after, mandatory)
            return n
        templates: dict[Any, tuple[bytes, bytes, Any]] = {}
        for body, exchange, key, head, props, given_id in zip(bodies, exchanges, keys, headers, properties, ids):
            n += 1
            before, after, props_id = _template(templates, head, props)
            mid = (_text(given_id) or props_id or f"{prefix}:{n}").encode()
            if len(mid) > 255:
                raise ValueError(f"a message id is at most 255 octets: {mid[:40]!r}…")
            publish(_text(exchange) or self.exchange, _text(key) or self.routing_key, body,
                    before + bytes((len(mid),)) + mid + after, mandatory)
        return n


# Bodies whose frames are made at once: a bound on the copy (and under Arrow's 2 GiB of int32
# offsets whatever Spark's Arrow batch size).
JOINED_BYTES = 32 << 20


def _pieces(bodies: Any, most: int) -> Iterator:
    """`bodies` cut into slices of at most `most` octets of bodies (at least one body each),
    each as a binary array."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ends = np.cumsum(pc.binary_length(bodies).to_numpy())
    start = 0
    while start < len(bodies):
        stop = max(start + 1, int(np.searchsorted(ends, (ends[start - 1] if start else 0) + most, side="right")))
        yield bodies.slice(start, stop - start).cast(pa.binary())
        start = stop


def _bodies_only(batch: Any, body_max: int) -> Any:
    """The body column of an Arrow record batch (binary or string, large or not), if the batch
    has none of the other columns the sink reads and every body is present, not empty, and fits
    one body frame; else None."""
    if not hasattr(batch, "schema") or not batch.num_rows:
        return None
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if "body" not in names or any(name in names for name in _COLUMNS[1:]):
        return None
    bodies = batch.column(names.index("body"))
    kind = bodies.type
    if bodies.null_count or not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                                 or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    shortest, longest = pc.min_max(pc.binary_length(bodies)).values()
    if shortest.as_py() == 0 or longest.as_py() > body_max:  # (an empty body has no body frame)
        return None
    return bodies


def _template(cache: dict, headers: Any, given: Any) -> tuple[bytes, bytes, Any]:
    """(before, after, message_id of the properties) of a row's headers and properties, the
    encoding cached per distinct pair."""
    if hasattr(given, "asDict"):
        given = given.asDict()
    if hasattr(headers, "items"):
        headers = list(headers.items())
    try:
        key = (tuple(headers) if headers else None, tuple(given.items()) if given else None)
        cached = cache.get(key)
    except TypeError:  # unhashable values: encoded every time
        key, cached = None, None
    if cached is None:
        given = given or {}
        props: dict[str, Any] = {name: given.get(name) for name in _PROPERTY_NAMES
                                 if name != "message_id" and given.get(name) is not None}
        if headers:
            props["headers"] = dict(headers)
        cached = (*property_template(props), _text(given.get("message_id")))
        if key is not None:
            if len(cache) > 4096:
                cache.clear()
            cache[key] = cached
    return cached


class WarrenWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: Any):
        self.publisher = _Publisher(options)

    def write(self, iterator: Iterator) -> Written:
        return self.publisher.write(iterator)

    def commit(self, messages: list) -> None:
        """Every task's rows are confirmed: nothing left to do."""

    def abort(self, messages: list) -> None:
        """(What was confirmed stays published: a retry publishes it again, same ids.)"""


class WarrenStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: Any):
        self.publisher = _Publisher(options)

    def write(self, iterator: Iterator) -> Written:
        return self.publisher.write(iterator)

    def commit(self, messages: list, batchId: int) -> None:
        """Every task's rows are confirmed: nothing left to do."""

    def abort(self, messages: list, batchId: int) -> None:
        """(What was confirmed stays published: a retry publishes it again, same ids.)"""
