"""Direct exchange: the routing key equals the binding key."""

from .base import Binding, Exchange, by_age


class DirectExchange(Exchange):
    type_name = "direct"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # routing key -> its Binding, or {Binding.key: Binding} in binding order when there
        # are several (other queues, or the same one bound again with other arguments)
        self._by_key: dict = {}
        # routing key -> its destinations, filled on first use and dropped when that key's
        # bindings change: one change costs O(1), and routing a key is one lookup.
        self._dests: dict = {}

    def _index_add(self, binding: Binding) -> None:
        key = binding.routing_key
        held = self._by_key.get(key)
        if held is None:
            self._by_key[key] = binding
        elif type(held) is dict:
            held[binding.key] = binding
        else:
            self._by_key[key] = {held.key: held, binding.key: binding}
        self._dests.pop(key, None)

    def _index_remove(self, binding: Binding) -> None:
        key = binding.routing_key
        held = self._by_key.get(key)
        if held is binding:
            del self._by_key[key]
        elif type(held) is dict:
            held.pop(binding.key, None)
            if not held:
                del self._by_key[key]
        self._dests.pop(key, None)

    def _index_clear(self) -> None:
        self._by_key = {}
        self._dests = {}

    def match(self, routing_key, message):
        dests = self._dests.get(routing_key)
        if dests is None:
            held = self._by_key.get(routing_key)
            if held is None:
                return ()
            dests = (held.destination,) if type(held) is not dict else by_age(held.values())
            self._dests[routing_key] = dests
        return dests


class DefaultExchange(DirectExchange):
    """The nameless exchange: every queue is implicitly bound by its own name."""

    is_default = True

    def match(self, routing_key, message):
        queue = self.vhost.queues.get(routing_key)
        return (queue,) if queue is not None else ()
