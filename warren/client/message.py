"""The one record every part of the client passes around: a message and its bookkeeping."""

import json
import os
import time
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
    # The AMQP properties as sent (an aiormq Basic.Properties), built once by
    # link.amqp_properties and reused by every resend.
    wire: Any = field(default=None, init=False, repr=False, compare=False)


def make_message(body: bytes, exchange: str, routing_key: str, message_id: str | None,
                 properties: dict[str, Any] | None) -> OutgoingMessage:
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    props: dict[str, Any] = {}
    if properties:
        props = dict(properties)
        message_id = message_id or props.pop("message_id", None)
        props.pop("message_id", None)
    return OutgoingMessage(bytes(body), exchange, routing_key, message_id or new_message_id(),
                           props)


# The version (4) and variant (RFC 4122) bits of a uuid4, as uuid.UUID sets them.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_message_id() -> str:
    """uuid.uuid4().hex (the same 122 random bits from os.urandom) at half its cost (uuid.UUID's
    constructor was a measurable part of a publish)."""
    bits = int.from_bytes(os.urandom(16)) & _UUID4_CLEAR | _UUID4_SET
    return f"{bits:032x}"


def dump_properties(properties: dict[str, Any]) -> str:
    """JSON for the outbox; fails early (in publish) on what the outbox can not store."""
    if not properties:
        return "{}"
    try:
        return json.dumps(properties, separators=(",", ":"))
    except TypeError as e:
        raise TypeError(f"properties must be JSON-serialisable with an outbox: {e}") from None
