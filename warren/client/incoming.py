"""What a consumer's handler receives: a plain record, without the ack methods of
aio-pika's message, since the consumer alone decides when and how a delivery is settled."""

from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

# The number of failed attempts so far, carried from one retry to the next.
ATTEMPT_HEADER = "x-warren-attempt"


@dataclass
class ConsumedMessage:
    body: bytes
    routing_key: str
    message_id: str | None
    redelivered: bool
    headers: dict[str, Any] = field(default_factory=dict)
    # content_type, correlation_id, reply_to, ... (aio-pika's names); None values left out.
    properties: dict[str, Any] = field(default_factory=dict)
    # Failed attempts before this delivery (0 the first time).
    attempt: int = 0


_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority",
               "correlation_id", "reply_to", "expiration", "timestamp", "type", "user_id",
               "app_id")


def from_delivery(message: AbstractIncomingMessage) -> ConsumedMessage:
    headers = dict(message.headers or {})
    attempt = headers.get(ATTEMPT_HEADER, 0)
    properties = {name: getattr(message, name) for name in _PROPERTIES
                  if getattr(message, name, None) is not None}
    return ConsumedMessage(
        body=message.body, routing_key=message.routing_key or "",
        message_id=message.message_id, redelivered=bool(message.redelivered),
        headers=headers, properties=properties,
        attempt=attempt if isinstance(attempt, int) else 0)


def republishable(message: ConsumedMessage, **headers: Any) -> dict[str, Any]:
    """aio_pika.Message keyword arguments that carry `message` on, with `headers` changed
    (a None value removes the header); persistent, since it is moved between queues."""
    merged = {k: v for k, v in {**message.headers, **headers}.items() if v is not None}
    props: dict[str, Any] = {k: v for k, v in message.properties.items()
                             if k not in ("expiration", "user_id")}
    props["delivery_mode"] = 2
    return {"body": message.body, "message_id": message.message_id, "headers": merged, **props}
