"""The queue source's checkpointed offset, without Spark or a broker.

A destructive queue has no offsets, so the source numbers the messages it takes in the order
it takes them (a *position*, local to the query) and checkpoints, with the position a batch
ends at, the fingerprints of the batch's messages (8 octets each, base64):

    {"queue": {"batch": "<base64>", "name": "dlq", "position": 1200}}

The fingerprints are how the source stays at-least-once without duplicating forever when
Spark's source commit lags (Spark tells a source a batch is committed only when it plans
the next one, so the last batch of every run would stay unacked and come back):
- Spark plans a batch only from the end of a committed one, so the messages of the batch a
  `start` offset names are committed: those still held are acked, and those the broker gives
  back (`redelivered`, after a restart) are recognised by fingerprint and acked, not read
  again;
- a batch that was planned but not committed before a crash is rebuilt from the same
  messages (they come back redelivered) by fingerprint.
A fingerprint covers what a requeue does not change: exchange, routing key, properties and
body. Messages alike in all of them are interchangeable, so they are counted, not told apart.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

FINGERPRINT = 8  # octets: a collision needs ~4e9 messages in one batch
_PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id",
                   "cluster_id")


@dataclass(frozen=True)
class QueueOffset:
    """Where a queue source stands: `position` messages taken before this point, the last
    batch's being those whose fingerprints are `batch`."""

    name: str
    position: int
    batch: tuple[bytes, ...] = field(default=())

    def encode(self) -> dict:
        return {"queue": {"batch": base64.b64encode(b"".join(self.batch)).decode(), "name": self.name,
                          "position": self.position}}

    def fingerprints(self) -> Counter:
        return Counter(self.batch)


def decode(value: Mapping | str) -> QueueOffset:
    """A checkpointed queue offset back to a QueueOffset."""
    if isinstance(value, str):
        value = json.loads(value)
    queue = value.get("queue") if isinstance(value, Mapping) else None
    if not isinstance(queue, Mapping):
        raise ValueError(f'a queue offset must look like {{"queue": {{"name": ..., "position": ...}}}}, not {value!r}')
    position = queue.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"a queue offset's position must be a whole number >= 0, not {position!r}")
    raw = base64.b64decode(queue.get("batch") or "")
    if len(raw) % FINGERPRINT:
        raise ValueError("a queue offset's batch is not a whole number of fingerprints")
    batch = tuple(raw[i:i + FINGERPRINT] for i in range(0, len(raw), FINGERPRINT))
    return QueueOffset(str(queue.get("name")), position, batch)


class Fingerprints:
    """fingerprint(exchange, routing_key, properties, body): 8 octets of BLAKE2b. Properties
    are hashed once per distinct object (the wire reader shares them between deliveries
    whose headers are alike)."""

    def __init__(self) -> None:
        self._properties: dict[int, tuple[Any, bytes]] = {}

    def __call__(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> bytes:
        h = hashlib.blake2b(digest_size=FINGERPRINT)
        h.update(exchange.encode("utf-8", "surrogateescape") + b"\0")
        h.update(routing_key.encode("utf-8", "surrogateescape") + b"\0")
        h.update(self._of_properties(properties))
        h.update(body)
        return h.digest()

    def _of_properties(self, properties: Any) -> bytes:
        known = self._properties.get(id(properties))
        if known is not None and known[0] is properties:
            return known[1]
        values = repr(tuple(getattr(properties, name, None) for name in _PROPERTY_NAMES)).encode()
        digest = hashlib.blake2b(values, digest_size=16).digest()
        if len(self._properties) > 4096:
            self._properties.clear()
        self._properties[id(properties)] = (properties, digest)  # (held, so its id is not reused)
        return digest
