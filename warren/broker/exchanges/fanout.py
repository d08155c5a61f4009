"""Fanout exchange: every bound destination gets every message."""

from .base import Binding, Exchange, by_age


class FanoutExchange(Exchange):
    type_name = "fanout"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The destinations, rebuilt on the first route after a change: a binding change costs
        # O(1), and the rebuild costs what routing one message costs anyway (every binding).
        self._dests: tuple | None = ()

    def _index_add(self, binding: Binding) -> None:
        self._dests = None

    def _index_remove(self, binding: Binding) -> None:
        self._dests = None

    def _index_clear(self) -> None:
        self._dests = ()

    def match(self, routing_key, message):
        dests = self._dests
        if dests is None:
            dests = self._dests = by_age(self.bindings.values()) if self.bindings else ()
        return dests
