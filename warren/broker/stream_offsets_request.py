"""`amq.warren.stream-offsets`: a stream's offsets over AMQP 0-9-1, without reading the stream.

Warren's extension (RabbitMQ's passive declare of a stream says message_count 0, and a
declare-ok has no room for more). A message published to the exchange name
`amq.warren.stream-offsets` in any vhost, with a stream's name as its routing key and a
`reply_to`, is answered, through the default exchange, to the `reply_to` queue, with the
request's `correlation_id`; the answer's headers hold the offsets as longs (its body holds the
same as JSON):

    x-stream-first-offset   the oldest offset still in the stream
    x-stream-last-offset    the newest committed offset (absent while the stream is empty)
    x-stream-next-offset    the offset the next message will get (committed: fsynced)
    x-stream-last-chunk     where a consumer with x-stream-offset=last starts (absent: empty)
    x-stream-first-timestamp  when the oldest chunk was appended (timestamp, and a long in
                            ms as x-stream-first-timestamp-ms; absent while empty)
    x-stream-messages, x-stream-bytes, x-stream-segments
    x-stream-consumer-offset  with a request header x-stream-consumer-name: the next offset
                            that named consumer reads (absent if it never acked)

The name is not an exchange: no listing, definitions export or total shows it (RabbitMQ's
tools see what they would see on RabbitMQ), and it cannot be declared or bound; ops.route
answers a publish to it when no exchange has that name (the `amq.` prefix is reserved, so
none can). Publishing needs write permission on that name, and the stream read permission:
a stream that does not exist, a queue that is not a stream, or no read permission is
answered with an `x-error` header (RabbitMQ's reply text) and no offsets. A request without
`reply_to` (or to a missing queue) is not answered; mandatory returns it as unroutable.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..amqp.codec import shortstr
from ..amqp.message import Message
from ..amqp.properties import encode_header
from .errors import AMQPError, precondition_failed

if TYPE_CHECKING:
    from .vhost import VHost

NAME = "amq.warren.stream-offsets"

# Who asks (warren.broker.ops.Actor): only handed back to `readable_queue`, so a type
# parameter rather than an import of the operations layer, which calls this module.
Actor = TypeVar("Actor")


def answer(actor: Actor, vhost: VHost, stream: str, request: Message,
           readable_queue: Callable[[Actor, str], Any]) -> tuple[Message, list]:
    """(the reply, [its queue]), or (request, []) when there is nobody to answer.
    `readable_queue`: ops.readable_queue (read permission, existence, exclusivity)."""
    props = request.properties
    reply_to = props.get("reply_to")
    queue = vhost.queues.get(reply_to) if isinstance(reply_to, str) else None
    if queue is None or not isinstance(reply_to, str):
        return request, []
    requested = (props.get("headers") or {}).get("x-stream-consumer-name")
    try:
        figures = _offsets(readable_queue(actor, stream), requested)
    except AMQPError as err:
        figures = {"x-error": err.reply_text}
    reply_props: dict[str, Any] = {"headers": figures, "content_type": "application/json"}
    if props.get("correlation_id") is not None:
        reply_props["correlation_id"] = props["correlation_id"]
    body = json.dumps({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in figures.items()},
                      sort_keys=True).encode()
    route = shortstr("") + shortstr(reply_to)
    return Message("", reply_to, route, encode_header(len(body), reply_props), body), [queue]


def _offsets(queue: Any, consumer_name: Any) -> dict[str, Any]:
    if queue.queue_type != "stream":
        raise precondition_failed(f"{queue.describe()} is not a stream")
    o = queue.info()["stream"]
    figures: dict[str, Any] = {
        "x-stream-first-offset": o["first_offset"], "x-stream-next-offset": o["next_offset"],
        "x-stream-messages": o["next_offset"] - o["first_offset"], "x-stream-bytes": o["bytes"],
        "x-stream-segments": o["segments"]}
    if o["last_offset"] is not None:
        figures["x-stream-last-offset"] = o["last_offset"]
        last_chunk = queue.log.last_chunk
        if last_chunk is not None:
            figures["x-stream-last-chunk"] = last_chunk
    if o["first_timestamp"] is not None:
        figures["x-stream-first-timestamp"] = datetime.fromtimestamp(o["first_timestamp"] // 1000, timezone.utc)
        figures["x-stream-first-timestamp-ms"] = o["first_timestamp"]
    if isinstance(consumer_name, bytes):
        consumer_name = consumer_name.decode(errors="replace")
    if isinstance(consumer_name, str):
        tracked = queue.log.tracked.get(consumer_name)
        if tracked is not None:
            figures["x-stream-consumer-offset"] = tracked
    return figures
