"""The one record every part of the client passes around: a message and its bookkeeping."""

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OutgoingMessage:
    body: bytes
    exchange: str
    routing_key: str
    # Always set: consumers drop duplicates by it, since a resend after a lost
    # confirmation delivers the message twice.
    message_id: str
    properties: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    attempts: int = 0
    # The last failure (nack, timeout, ...), None if none so far.
    error: str | None = None
    # The outbox row, None when there is no outbox.
    seq: int | None = None
    # Parked outbox messages (unroutable, no such exchange) wait for unpark().
    parked: bool = False


def make_message(body: bytes, exchange: str, routing_key: str, message_id: str | None,
                 properties: dict[str, Any] | None) -> OutgoingMessage:
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    props = dict(properties or {})
    given = message_id or props.pop("message_id", None)
    props.pop("message_id", None)
    return OutgoingMessage(bytes(body), exchange, routing_key, given or uuid.uuid4().hex, props)


def dump_properties(properties: dict[str, Any]) -> str:
    """JSON for the outbox; fails early (in publish) on what the outbox can not store."""
    try:
        return json.dumps(properties, separators=(",", ":"))
    except TypeError as e:
        raise TypeError(f"properties must be JSON-serialisable with an outbox: {e}") from None
