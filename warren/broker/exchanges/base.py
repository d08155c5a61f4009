"""What every exchange type shares: identity, flags and the binding set."""

import itertools

from ...amqp.codec import table_type_name
from ...amqp.erlang import erl_s
from ..errors import inequivalent, precondition_failed, rs
from ..stats import new_exchange_counters


def _erl_value(value):
    """A value as RabbitMQ holds it for an exact (=:=) comparison: strings and binaries are both
    binaries; a bool is not the integer 1."""
    if isinstance(value, str):
        return (bytes, value.encode())
    return (type(value), value)


def freeze(value):
    """A hashable form of a decoded table value, for binding identity."""
    if not value and isinstance(value, dict):
        return ()  # most bindings have no arguments
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


# Creation order of bindings, across exchanges: routing results list destinations in the
# order of their oldest matching binding, whatever index found them.
_SEQ = itertools.count(1)


class Binding:
    __slots__ = ("source", "destination", "routing_key", "arguments", "key", "seq")

    def __init__(self, source, destination, routing_key: str, arguments: dict):
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments or {}
        # Its identity is data (what the binding commands and the definitions journal name):
        # the destination by kind and name, not by object.
        self.key = (destination.kind, destination.name, routing_key, freeze(self.arguments))
        self.seq = 0  # set when the binding is added to its source


def by_age(bindings) -> tuple:
    """The distinct destinations of the bindings, in the order of each one's oldest binding."""
    ordered = sorted(bindings, key=_seq_of)
    if len(ordered) == 1:
        return (ordered[0].destination,)
    return tuple(dict.fromkeys(b.destination for b in ordered))


def _seq_of(binding: Binding) -> int:
    return binding.seq


class Exchange:
    """An exchange: routes a message to the destinations (queues or exchanges) bound to it."""

    type_name = ""
    is_default = False

    def __init__(self, vhost, name: str, durable: bool = True, auto_delete: bool = False,
                 internal: bool = False, arguments: dict | None = None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict = {}  # Binding.key -> Binding, where this exchange is the source
        self.stats = new_exchange_counters()  # publish_out: one per queue routed to
        self.policy = None

    @property
    def kind(self) -> str:
        return "exchange"

    @property
    def alternate_exchange(self):
        """The AE name: the declare argument wins over a policy."""
        ae = self.arguments.get("alternate-exchange")
        if ae is None and self.policy is not None:
            ae = self.policy.definition.get("alternate-exchange")
        return ae

    def describe(self) -> str:
        return rs("exchange", self.name, self.vhost.name)

    def validate_binding(self, routing_key: str, arguments: dict) -> None:
        """Raise if this exchange type refuses the binding arguments."""

    # Each change updates the type's index by one entry (no rebuild): the cost of a binding
    # change does not depend on how many bindings the exchange has.
    def add_binding(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        binding.seq = next(_SEQ)
        self.bindings[binding.key] = binding
        self._index_add(binding)
        return True

    def remove_binding(self, key) -> Binding | None:
        binding = self.bindings.pop(key, None)
        if binding is not None:
            self._index_remove(binding)
        return binding

    def clear_bindings(self) -> list:
        """Drop every binding at once (the exchange is going away); returns them."""
        gone = list(self.bindings.values())
        self.bindings = {}
        self._index_clear()
        return gone

    def _index_add(self, binding: Binding) -> None:
        """Add one binding to the type's routing index."""

    def _index_remove(self, binding: Binding) -> None:
        """Remove one binding (as stored) from the type's routing index."""

    def _index_clear(self) -> None:
        """Empty the type's routing index."""

    def match(self, routing_key: str, message):
        """The destinations this exchange's own bindings select (no AE, no recursion)."""
        raise NotImplementedError

    def check_equivalent(self, type_name, durable, auto_delete, internal, arguments) -> None:
        if type_name != self.type_name:
            raise inequivalent(self.describe(), "type", type_name, self.type_name)
        for arg, received, current in (("durable", durable, self.durable),
                                       ("auto_delete", auto_delete, self.auto_delete),
                                       ("internal", internal, self.internal)):
            if received != current:
                raise inequivalent(self.describe(), arg, received, current)
        # Like RabbitMQ, only the alternate-exchange argument must match on redeclare. When
        # both sides have it only the values are compared (a longstr equals the same binary).
        absent = object()
        received = (arguments or {}).get("alternate-exchange", absent)
        current = self.arguments.get("alternate-exchange", absent)
        if received is absent and current is absent:
            return
        if received is not absent and current is not absent:
            if _erl_value(received) == _erl_value(current):
                return

            def show(v):
                return "none" if v is None else f"'{erl_s(v)}'"
        else:
            def show(v):
                return "none" if v is absent else f"the value '{erl_s(v)}' of type '{table_type_name(v)}'"
        raise precondition_failed(
            f"inequivalent arg 'alternate-exchange' for {self.describe()}: "
            f"received {show(received)} but current is {show(current)}")
