"""A published message: the publisher's content header and body bytes, kept as received.

It lives in the protocol layer (not the broker) because the store reads and writes it too:
neither the store nor the broker owns what a publisher sent.
"""

from typing import Any

from .properties import FLAG_HEADERS, decode_properties, delivery_mode


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
        self._props: dict[str, Any] | None = None

    @property
    def properties(self) -> dict[str, Any]:
        if self._props is None:
            self._props = decode_properties(self.header)
        return self._props

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
