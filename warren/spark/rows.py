"""The source's fixed row schema, like Kafka's, and messages turned into Arrow record batches
(a column at a time: binary bodies are never converted row by row)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pyarrow as pa

SCHEMA_DDL = (
    "body BINARY, exchange STRING, routing_key STRING, source STRING, offset BIGINT, redelivered BOOLEAN, "
    "delivery_count INT, timestamp TIMESTAMP, headers MAP<STRING, STRING>, "
    "properties STRUCT<content_type: STRING, content_encoding: STRING, delivery_mode: INT, priority: INT, "
    "correlation_id: STRING, reply_to: STRING, expiration: STRING, message_id: STRING, type: STRING, "
    "user_id: STRING, app_id: STRING>, "
    "death ARRAY<STRUCT<queue: STRING, reason: STRING, exchange: STRING, routing_keys: ARRAY<STRING>, "
    "count: BIGINT, time: TIMESTAMP>>")

_TS = pa.timestamp("us", tz="UTC")
_PROPERTIES = pa.struct([("content_type", pa.string()), ("content_encoding", pa.string()),
                         ("delivery_mode", pa.int32()), ("priority", pa.int32()),
                         ("correlation_id", pa.string()), ("reply_to", pa.string()), ("expiration", pa.string()),
                         ("message_id", pa.string()), ("type", pa.string()), ("user_id", pa.string()),
                         ("app_id", pa.string())])
_DEATH = pa.struct([("queue", pa.string()), ("reason", pa.string()), ("exchange", pa.string()),
                    ("routing_keys", pa.list_(pa.string())), ("count", pa.int64()), ("time", _TS)])
ARROW_SCHEMA = pa.schema([
    ("body", pa.binary()), ("exchange", pa.string()), ("routing_key", pa.string()), ("source", pa.string()),
    ("offset", pa.int64()), ("redelivered", pa.bool_()), ("delivery_count", pa.int32()), ("timestamp", _TS),
    ("headers", pa.map_(pa.string(), pa.string())), ("properties", _PROPERTIES), ("death", pa.list_(_DEATH))])

_PROPERTY_FIELDS = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                    "expiration", "message_id", "message_type", "user_id", "app_id")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def header_text(value: Any) -> str:
    """A header value as the `headers` map shows it: strings as they are, bytes decoded,
    timestamps in ISO form, tables and arrays as JSON."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str):
        return value
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=lambda v: v.decode(errors="replace") if isinstance(v, bytes) else str(v),
                          sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _utc(value: Any) -> datetime.datetime | None:
    if not isinstance(value, datetime.datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.timezone.utc)


def deaths(headers: dict | None) -> list[dict]:
    """The x-death array (RabbitMQ's dead-lettering history, newest first) as rows."""
    out = []
    for entry in (headers or {}).get("x-death") or []:
        if not isinstance(entry, dict):
            continue
        count = entry.get("count")
        out.append({"queue": _text(entry.get("queue")), "reason": _text(entry.get("reason")),
                    "exchange": _text(entry.get("exchange")),
                    "routing_keys": [_text(k) for k in entry.get("routing-keys") or []],
                    "count": int(count) if isinstance(count, int) else None, "time": _utc(entry.get("time"))})
    return out


class Batch:
    """Rows gathered column by column, handed out as a pyarrow RecordBatch."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.columns["body"])

    def add(self, body: bytes, exchange: str, routing_key: str, source: str, offset: int | None,
            redelivered: bool, properties: Any) -> None:
        """One message; `properties`: the pamqp Basic.Properties it came with."""
        c = self.columns
        headers = properties.headers or {}
        if offset is not None and "x-stream-offset" in headers:
            # (properties may be shared by deliveries that differ only in their offset)
            headers = {**headers, "x-stream-offset": offset}
        count = headers.get("x-delivery-count")
        c["body"].append(body)
        c["exchange"].append(exchange)
        c["routing_key"].append(routing_key)
        c["source"].append(source)
        c["offset"].append(offset)
        c["redelivered"].append(redelivered)
        c["delivery_count"].append(int(count) if isinstance(count, int) and not isinstance(count, bool) else None)
        c["timestamp"].append(_utc(properties.timestamp))
        c["headers"].append([(str(k), header_text(v)) for k, v in headers.items()] if headers else None)
        props = {name: getattr(properties, name, None) for name in _PROPERTY_FIELDS}
        props["type"] = props.pop("message_type")
        c["properties"].append(props)
        c["death"].append(deaths(headers))

    def record_batch(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=ARROW_SCHEMA)
        self.columns = {name: [] for name in ARROW_SCHEMA.names}
        return batch

