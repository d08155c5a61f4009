"""`df.write.format("warren")` and `writeStream.format("warren")`: publish rows with confirms.

Columns: `body` (required, binary or string), and optionally `exchange`, `routing_key`,
`headers` (a map), `properties` (a struct with the source's property names) and `message_id`.
Options: `exchange` and `routingKey` (for rows without those columns), `mandatory` (an
unroutable row fails the task), `maxInFlight` (confirms outstanding at once, 1000 by default),
`confirmTimeout` (seconds, 60), and the connection options of the source.

A task succeeds only once the broker confirmed every row it published: a nack, a return
(mandatory), a closed connection or a confirm timeout fails it, and Spark runs it again. The
rows of a task run again are published again, with the same message ids: ids are
`<query>:<batch>:<partition>:<row>` in a streaming query, `<writeId>:<stage>:<partition>:<row>`
in a batch write (option `writeId`, else the application id), unless the rows have their own
`message_id`, so a consumer can drop the duplicates a retry makes. Speculative execution would
publish a task's rows twice at once: warren.spark.register refuses a session that has it on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, Mapping

from pamqp import commands as spec
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from .broker import connect, run
from .connection import Endpoint, endpoint

DEFAULT_IN_FLIGHT = 1000
_PROPERTY_NAMES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                   "expiration", "message_id", "type", "user_id", "app_id")


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


def _properties(row: Mapping[str, Any], message_id: str) -> spec.Basic.Properties:
    given = row.get("properties") or {}
    if hasattr(given, "asDict"):
        given = given.asDict()
    props: dict[str, Any] = {name: given.get(name) for name in _PROPERTY_NAMES if given.get(name) is not None}
    if "type" in props:
        props["message_type"] = props.pop("type")
    headers = row.get("headers")
    if headers:
        props["headers"] = dict(headers)
    props["message_id"] = _text(row.get("message_id")) or props.get("message_id") or message_id
    return spec.Basic.Properties(**props)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class _Publisher:
    """The write side, shared by batch and streaming writes."""

    def __init__(self, options: Mapping[str, str]):
        opts = {k.lower(): v for k, v in options.items()}
        self.endpoint: Endpoint = endpoint(options)
        self.exchange = opts.get("exchange", "")
        self.routing_key = opts.get("routingkey", "")
        self.mandatory = opts.get("mandatory", "false").lower() == "true"
        self.in_flight = int(opts.get("maxinflight", DEFAULT_IN_FLIGHT))
        self.timeout = float(opts.get("confirmtimeout", 60))
        self.write_id = opts.get("writeid")

    def write(self, rows: Iterator) -> Written:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the warren sink writes from Spark tasks only")
        partition = ctx.partitionId()
        query = ctx.getLocalProperty("sql.streaming.queryId")
        if query:
            prefix = f"{query}:{ctx.getLocalProperty('streaming.sql.batchId')}:{partition}"
        else:
            prefix = f"{self.write_id or _application_id()}:{ctx.stageId()}:{partition}"
        count = run(self._publish(rows, prefix))
        return Written(partition, count)

    async def _publish(self, rows: Iterator, prefix: str) -> int:
        """Publish every row, at most maxInFlight unconfirmed at once; raise PublishFailed at
        the first row the broker does not confirm."""
        conn = await connect(self.endpoint)
        try:
            ch = await conn.channel(publisher_confirms=True)
            window = asyncio.Semaphore(self.in_flight)
            failures: list[PublishFailed] = []
            running: set[asyncio.Future] = set()

            async def publish_one(body: bytes, exchange: str, routing_key: str, props: spec.Basic.Properties) -> None:
                try:
                    result = await asyncio.wait_for(ch.basic_publish(body, exchange=exchange, routing_key=routing_key,
                                                                     properties=props, mandatory=self.mandatory),
                                                    self.timeout)
                    if not isinstance(result, spec.Basic.Ack):
                        failures.append(PublishFailed(f"the broker answered {type(result).__name__}"))
                except asyncio.TimeoutError:
                    failures.append(PublishFailed("no confirm within confirmTimeout"))
                except Exception as err:  # returned (mandatory), closed channel
                    failures.append(PublishFailed(f"publish failed: {err}"))
                finally:
                    window.release()

            n = 0
            for n, row in enumerate(rows, 1):
                if failures:
                    break
                r = row.asDict() if hasattr(row, "asDict") else dict(row)
                if "body" not in r:
                    raise ValueError("the warren sink needs a body column")
                await window.acquire()
                task = asyncio.ensure_future(publish_one(
                    _as_bytes(r["body"]), _text(r.get("exchange")) or self.exchange,
                    _text(r.get("routing_key")) or self.routing_key, _properties(r, f"{prefix}:{n}")))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(running)
            if failures:
                raise failures[0]
            return n
        finally:
            await conn.close()


def _application_id() -> str:
    from pyspark import SparkFiles
    try:
        return SparkFiles.getRootDirectory().rstrip("/").rsplit("/", 1)[-1]
    except Exception:
        return "write"


class WarrenWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: Any):
        self.publisher = _Publisher(options)

    def write(self, iterator: Iterator) -> Written:
        return self.publisher.write(iterator)

    def commit(self, messages: list) -> None:
        """Every task's rows are confirmed: nothing left to do."""

    def abort(self, messages: list) -> None:
        """(What was confirmed stays published: a retry publishes it again, same ids.)"""


class WarrenStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str], schema: Any):
        self.publisher = _Publisher(options)

    def write(self, iterator: Iterator) -> Written:
        return self.publisher.write(iterator)

    def commit(self, messages: list, batchId: int) -> None:
        """Every task's rows are confirmed: nothing left to do."""

    def abort(self, messages: list, batchId: int) -> None:
        """(What was confirmed stays published: a retry publishes it again, same ids.)"""
