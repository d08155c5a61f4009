"""A published message: the publisher's content header and body bytes, kept as received.

It lives in the protocol layer (not the broker) because the store reads and writes it too:
neither the store nor the broker owns what a publisher sent.
"""

from typing import Any

from .body import Body
from .properties import FLAG_HEADERS, decode_properties, delivery_mode


class Message:
    """One published message, shared by every queue it is routed to.

    `route` holds the exchange and routing-key shortstrs exactly as they appear in
    basic.deliver, basic.get-ok and basic.return, so deliveries never re-encode them.
    """

    # ttl: the expiration property in ms, set by the publish path that checked it (None: none).
    # cc_keys: the routing keys its CC and BCC headers added at publish (None: none, or not
    # known, as after a restart: then the CC header still says them, BCC is lost). Kept because
    # BCC leaves the header, and dead-lettering without a routing key routes with them again.
    __slots__ = ("exchange", "routing_key", "route", "header", "body", "_props", "ttl", "cc_keys")

    def __init__(self, exchange: str, routing_key: str, route: bytes, header: bytes, body: Body):
        self.exchange = exchange
        self.routing_key = routing_key
        self.route = route
        self.header = header
        self.body = body
        self._props: dict[str, Any] | None = None
        self.ttl: int | None = None
        self.cc_keys: tuple[str, ...] | None = None

    @property
    def properties(self) -> dict[str, Any]:
        if self._props is None:
            self._props = decode_properties(self.header)
        return self._props

    def replace_header(self, header: bytes) -> None:
        """Store another content header (RabbitMQ strips BCC before the message is stored)."""
        self.header = header
        self._props = None

    @property
    def headers(self) -> dict[str, Any] | None:
        if not (self.header[12] << 8 | self.header[13]) & FLAG_HEADERS:
            return None
        return self.properties.get("headers")

    @property
    def persistent(self) -> bool:
        return delivery_mode(self.header) == 2

    @property
    def size(self) -> int:
        return len(self.body)
