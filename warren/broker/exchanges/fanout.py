"""Fanout exchange: every bound destination gets every message."""

from .base import Exchange


class FanoutExchange(Exchange):
    type_name = "fanout"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._dests: tuple = ()

    def _bindings_changed(self):
        self._dests = tuple(dict.fromkeys(b.destination for b in self.bindings.values()))

    def match(self, routing_key, message):
        return self._dests
