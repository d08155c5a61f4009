"""Direct exchange: the routing key equals the binding key."""

from .base import Exchange


class DirectExchange(Exchange):
    type_name = "direct"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._by_key: dict = {}

    def _bindings_changed(self) -> None:
        index: dict = {}
        for b in self.bindings.values():
            dests = index.setdefault(b.routing_key, [])
            if b.destination not in dests:
                dests.append(b.destination)
        self._by_key = index

    def match(self, routing_key, message):
        return self._by_key.get(routing_key, ())


class DefaultExchange(DirectExchange):
    """The nameless exchange: every queue is implicitly bound by its own name."""

    is_default = True

    def match(self, routing_key, message):
        queue = self.vhost.queues.get(routing_key)
        return (queue,) if queue is not None else ()
