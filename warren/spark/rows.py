"""The source's fixed row schema, like Kafka's, and messages turned into Arrow record batches
(a column at a time: binary bodies are never converted row by row)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import numpy as np
import pyarrow as pa

from .records import Entries

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
    """The x-death array (RabbitMQ's dead-lettering history, newest first) as rows, read as
    RabbitMQ writes it (rabbit_dead_letter: an array of tables, each with queue, reason and
    exchange strings, routing-keys an array of strings, count a long and time a timestamp).
    What a client put there otherwise reads as nothing, never as an error: an x-death that is
    not an array gives no deaths, an element that is not a table is left out, and a field that
    is missing or of another type is null (routing-keys unless every key is a string; count
    unless an integer, of any width)."""
    value = (headers or {}).get("x-death")
    if not isinstance(value, list):
        return []
    out = []
    for entry in value:
        if not isinstance(entry, dict):
            continue
        keys = entry.get("routing-keys")
        count = entry.get("count")
        out.append({"queue": _string(entry.get("queue")), "reason": _string(entry.get("reason")),
                    "exchange": _string(entry.get("exchange")),
                    "routing_keys": ([_string(k) for k in keys]
                                     if isinstance(keys, list) and all(isinstance(k, (str, bytes)) for k in keys)
                                     else None),
                    "count": count if isinstance(count, int) and not isinstance(count, bool) else None,
                    "time": _utc(entry.get("time"))})
    return out


def _string(value: Any) -> str | None:
    """A string field (a longstr, which pamqp gives as bytes when it is not UTF-8), else None."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


class Batch:
    """Rows gathered column by column, handed out as a pyarrow RecordBatch.

    What a message's properties give (timestamp, delivery count, the properties struct, the
    deaths, the headers map) is worked out once per properties object (the wire reader shares
    one between deliveries with the same content header) and taken into the columns by index
    at the end: per row only the body, the routing fields and the offset are appended, one by
    one with add(), or many at once with add_entries() (a stream's record batches, already in
    columns).

    `annotation`: a header the broker adds to every delivery and the row has a column for
    (a stream's `x-stream-offset`: the `offset` column), left out of the `headers` map, which
    then holds what the message carries (as Kafka's source keeps a record's offset out of its
    headers), and stays the same for every delivery of one properties object."""

    def __init__(self, annotation: str | None = None) -> None:
        self.annotation = annotation
        self._clear()

    def _clear(self) -> None:
        self._body: list[bytes] = []
        self._exchange: list[str] = []
        self._routing_key: list[str] = []
        self._source: list[str] = []
        self._offset: list[int | None] = []
        self._redelivered: list[bool] = []
        self._which: list[int] = []  # per row: its entry in _shared
        self._entries: list[tuple[Entries, str, np.ndarray]] = []  # (entries, source, their entries in _shared)
        self._rows = 0
        self._shared: list[tuple] = []  # (properties, delivery_count, timestamp, props, deaths, headers)
        self._seen: dict[int, int] = {}  # id(properties) -> entry

    def __len__(self) -> int:
        return self._rows

    def add(self, body: bytes, exchange: str, routing_key: str, source: str, offset: int | None,
            redelivered: bool, properties: Any) -> None:
        """One message; `properties`: the pamqp Basic.Properties it came with."""
        self._body.append(body)
        self._exchange.append(exchange)
        self._routing_key.append(routing_key)
        self._source.append(source)
        self._offset.append(offset)
        self._redelivered.append(redelivered)
        self._which.append(self._entry(properties))
        self._rows += 1

    def add_entries(self, entries: Entries, source: str) -> None:
        """Entries of stream `source`, none redelivered."""
        shared = np.array([self._entry(p) for p in entries.properties], np.int32)
        self._entries.append((entries, source, shared[entries.which] if len(shared) else entries.which))
        self._rows += len(entries)

    def _entry(self, properties: Any) -> int:
        entry = self._seen.get(id(properties))
        if entry is None:
            entry = self._seen[id(properties)] = self._learn(properties)
        return entry

    def _learn(self, properties: Any) -> int:
        headers = properties.headers or {}
        count = headers.get("x-delivery-count")
        props = {name: getattr(properties, name, None) for name in _PROPERTY_FIELDS}
        props["type"] = props.pop("message_type")
        pairs = [(str(k), header_text(v)) for k, v in headers.items() if k != self.annotation]
        self._shared.append((properties,  # (held: its id must not be reused while this batch lives)
                             int(count) if isinstance(count, int) and not isinstance(count, bool) else None,
                             _utc(properties.timestamp), props, deaths(headers), pairs or None))
        return len(self._shared) - 1

    def record_batch(self) -> pa.RecordBatch:
        if self._entries and self._which:  # (their order would be lost)
            raise ValueError("a Batch takes rows one by one or as entries, not both")
        if self._entries:
            parts = [_entry_columns(*e) for e in self._entries]
            columns = {name: _joined([part[name] for part in parts]) for name in _ROW_COLUMNS}
        else:
            columns = {"body": self._body, "exchange": self._exchange, "routing_key": self._routing_key,
                       "source": self._source, "offset": self._offset, "redelivered": self._redelivered,
                       "which": self._which}
            columns = {name: _array(values, _ROW_COLUMNS[name]) for name, values in columns.items()}
        which = columns.pop("which")
        shared = list(zip(*self._shared)) or [()] * 6
        arrays = []
        for field in ARROW_SCHEMA:
            if field.name in columns:
                arrays.append(columns[field.name])
            else:  # worked out once per properties object, taken by index
                arrays.append(pa.array(shared[_SHARED_AT[field.name]], field.type).take(which))
        batch = pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
        self._clear()
        return batch


def _entry_columns(entries: Entries, source: str, which: np.ndarray) -> dict[str, pa.Array]:
    n = len(entries)
    exchanges, keys = zip(*entries.routes) if entries.routes else ((), ())
    return {"body": entries.body, "exchange": _array(exchanges, pa.string()).take(entries.route),
            "routing_key": _array(keys, pa.string()).take(entries.route),
            "source": pa.array([source], pa.string()).take(np.zeros(n, np.int32)),
            "offset": pa.array(entries.offset, pa.int64()), "redelivered": pa.array(np.zeros(n, np.bool_)),
            "which": pa.array(which, pa.int32())}


def _array(values: Any, type_: pa.DataType) -> pa.Array:
    """pa.array(values, type_); a string column's names that are not UTF-8 (the readers keep
    their octets as surrogates, as Warren and RabbitMQ take any octets in a shortstr) shown
    with U+FFFD for those octets, as Arrow's strings must be UTF-8."""
    try:
        return pa.array(values, type_)
    except UnicodeEncodeError:
        return pa.array([v if v is None else v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                         for v in values], type_)


def _joined(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


# the columns given per row, and the index into the shared ones
_ROW_COLUMNS = {**{name: ARROW_SCHEMA.field(name).type
                   for name in ("body", "exchange", "routing_key", "source", "offset", "redelivered")},
                "which": pa.int32()}
_SHARED_AT = {"delivery_count": 1, "timestamp": 2, "properties": 3, "death": 4, "headers": 5}
