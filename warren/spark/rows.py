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
    """Rows gathered column by column, handed out as a pyarrow RecordBatch.

    What a message's properties give (timestamp, delivery count, the properties struct, the
    deaths, the headers map) is worked out once per properties object (the wire reader shares
    one between deliveries with the same content header) and taken into the columns by index
    at the end: per row only the body, the routing fields and the offset are appended."""

    _PER_ROW = ("body", "exchange", "routing_key", "source", "offset", "redelivered", "headers")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in self._PER_ROW}
        self._which: list[int] = []  # per row: its entry in _shared
        self._shared: list[tuple] = []  # (properties, delivery_count, timestamp, props, deaths)
        self._seen: dict[int, tuple[int, list | None, int]] = {}  # id(properties) -> (entry, header pairs, offset at)

    def __len__(self) -> int:
        return len(self._which)

    def add(self, body: bytes, exchange: str, routing_key: str, source: str, offset: int | None,
            redelivered: bool, properties: Any) -> None:
        """One message; `properties`: the pamqp Basic.Properties it came with."""
        known = self._seen.get(id(properties))
        if known is None:
            known = self._seen[id(properties)] = self._learn(properties)
        entry, pairs, offset_at = known
        c = self.columns
        c["body"].append(body)
        c["exchange"].append(exchange)
        c["routing_key"].append(routing_key)
        c["source"].append(source)
        c["offset"].append(offset)
        c["redelivered"].append(redelivered)
        if pairs is not None and offset_at >= 0 and offset is not None:
            # (the broker's x-stream-offset differs per delivery of one properties object)
            pairs = pairs.copy()
            pairs[offset_at] = ("x-stream-offset", str(offset))
        c["headers"].append(pairs)
        self._which.append(entry)

    def _learn(self, properties: Any) -> tuple[int, list | None, int]:
        headers = properties.headers or {}
        count = headers.get("x-delivery-count")
        props = {name: getattr(properties, name, None) for name in _PROPERTY_FIELDS}
        props["type"] = props.pop("message_type")
        self._shared.append((properties,  # (held: its id must not be reused while this batch lives)
                             int(count) if isinstance(count, int) and not isinstance(count, bool) else None,
                             _utc(properties.timestamp), props, deaths(headers)))
        pairs = [(str(k), header_text(v)) for k, v in headers.items()] if headers else None
        offset_at = list(headers).index("x-stream-offset") if "x-stream-offset" in headers else -1
        return len(self._shared) - 1, pairs, offset_at

    def record_batch(self) -> pa.RecordBatch:
        c = self.columns
        which = pa.array(self._which, pa.int32())
        shared = list(zip(*self._shared)) or [()] * 5
        for i, name in enumerate(("delivery_count", "timestamp", "properties", "death"), start=1):
            c[name] = pa.array(shared[i], ARROW_SCHEMA.field(name).type).take(which)
        batch = pa.RecordBatch.from_pydict(c, schema=ARROW_SCHEMA)
        self._clear()
        return batch
