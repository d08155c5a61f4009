"""A published message: the publisher's content header and body bytes, kept as received."""

from ..amqp.properties import FLAG_HEADERS, decode_properties, delivery_mode
from .errors import precondition_failed


# RabbitMQ's ?MAX_EXPIRY_TIMER: the largest per-message or per-queue TTL, in milliseconds.
MAX_EXPIRY = 315360000000


def check_properties(props: dict, user) -> None:
    """RabbitMQ's publish-time property checks (406): user_id must name the publishing user
    (unless tagged impersonator), and expiration must be a valid TTL."""
    user_id = props.get("user_id")
    if user_id is not None and user_id != user.name and "impersonator" not in user.tags:
        raise precondition_failed(f"user_id property set to '{user_id}' but authenticated user was '{user.name}'")
    expiration = props.get("expiration")
    if expiration is not None:
        _, err = parse_expiration(expiration)
        if err:
            raise precondition_failed(f"invalid expiration '{expiration}': {err}")


def parse_expiration(text: str):
    """The `expiration` property as RabbitMQ reads it: (milliseconds, None) or (None, error),
    error being the Erlang term RabbitMQ prints ("no_integer", "{value_negative,-1}", ...)."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0:
        return None, "no_integer"
    value = int(text[:len(text) - len(digits) + n])
    rest = digits[n:]
    if rest:
        escaped = rest.replace("\\", "\\\\").replace('"', '\\"')
        return None, f'{{leftover_string,"{escaped}"}}'
    if value > MAX_EXPIRY:
        return None, f"{{value_too_large,{value}}}"
    if value < 0:
        return None, f"{{value_negative,{value}}}"
    return value, None


class Message:
    """One published message, shared by every queue it is routed to.

    `route` holds the exchange and routing-key shortstrs exactly as they appear in
    basic.deliver, basic.get-ok and basic.return, so deliveries never re-encode them.
    """

    __slots__ = ("exchange", "routing_key", "route", "header", "body", "_props")

    def __init__(self, exchange: str, routing_key: str, route: bytes, header: bytes, body: bytes):
        self.exchange = exchange
        self.routing_key = routing_key
        self.route = route
        self.header = header
        self.body = body
        self._props = None

    @property
    def properties(self) -> dict:
        if self._props is None:
            self._props = decode_properties(self.header)
        return self._props

    @property
    def headers(self):
        if not (self.header[12] << 8 | self.header[13]) & FLAG_HEADERS:
            return None
        return self.properties.get("headers")

    @property
    def persistent(self) -> bool:
        return delivery_mode(self.header) == 2

    @property
    def size(self) -> int:
        return len(self.body)


class QueuedMessage:
    """A message's place in one queue: its sequence number and delivery state there."""

    # seg/off: where the store wrote it (None if only in memory); durable: that record
    # survives restarts; deliveries: how often it was handed out (kept across restarts).
    __slots__ = ("seq", "message", "redelivered", "seg", "off", "durable", "deliveries")

    def __init__(self, seq: int, message: Message, redelivered: bool = False):
        self.seq = seq
        self.message = message
        self.redelivered = redelivered
        self.seg = None
        self.deliveries = 0

    def __lt__(self, other):  # requeued messages are ordered by their original position
        return self.seq < other.seq
