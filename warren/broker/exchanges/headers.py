"""Headers exchange: bindings match message headers by x-match all / any (/ -with-x).

So that a message does not test every binding, bindings are indexed by header: an `all`
binding under one of its required (header, value) pairs (or a required header, for a
presence-only test), so only bindings that pair can satisfy are tested; an `any` binding under
each of its pairs, where a hit is a match; an `all` binding with no test matches everything;
an `any` binding with no test matches nothing.
"""

import datetime
import decimal

from ...amqp.codec import table_type_name
from ...amqp.erlang import erl_term
from ..errors import precondition_failed
from .base import Binding, Exchange, by_age

MATCH_KINDS = ("all", "any", "all-with-x", "any-with-x")


def _strict(value):
    """A nested value compared the way RabbitMQ compares its typed table/array entries: types
    must agree (1 as a byte is not 1 as a signedint, nor 1.0; a string is not a binary; key
    order matters)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return (table_type_name(value), value)
    if isinstance(value, str):
        return ("longstr", value.encode())
    if isinstance(value, bytes):
        return (table_type_name(value), bytes(value))
    if isinstance(value, dict):
        return ("table", tuple((k, _strict(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_strict(v) for v in value))
    if isinstance(value, datetime.datetime):
        return ("timestamp", int(value.timestamp()))
    return ("other", _top(value))


def _top(value):
    """A top-level header value as RabbitMQ compares it (Erlang ==): numbers by value (an
    integer equals the same float or timestamp), strings and binaries by their bytes, a
    decimal by its scale and digits, a bool only equals a bool."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, str):
        return ("bin", value.encode())
    if isinstance(value, bytes):
        return ("bin", value)
    if isinstance(value, datetime.datetime):
        return ("num", int(value.timestamp()))
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * 10 ** max(0, exponent)
        return ("dec", max(0, -exponent), -unscaled if sign else unscaled)
    if value is None:
        return ("void",)
    return ("nested", _strict(value))


def compile_binding(args: dict):
    """(match all?, [(header, comparable value, or None for "present")]) for binding args."""
    kind = args.get("x-match", "all")
    with_x = kind in ("all-with-x", "any-with-x")
    want_all = kind not in ("any", "any-with-x")
    tests = [(key, None if expected is None else _top(expected)) for key, expected in args.items()
             if key != "x-match" and (with_x or not key.startswith("x-"))]
    return want_all, tests


def headers_match(args: dict, headers: dict, compiled=None) -> bool:
    want_all, tests = compiled or compile_binding(args)
    for key, expected in tests:
        if key in headers:
            ok = expected is None or _top(headers[key]) == expected
        else:
            ok = False
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


# The index entry of a presence test ("header exists, any value").
_PRESENT = ("present",)


class HeadersExchange(Exchange):
    type_name = "headers"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._index_clear()

    def _index_clear(self) -> None:
        # header -> comparable value (or _PRESENT) -> {Binding.key: (Binding, compiled)}
        self._all: dict = {}
        self._any: dict = {}
        self._always: dict = {}  # Binding.key -> Binding: `all` with no tests
        self._all_slot: dict = {}  # Binding.key -> (header, value) it is filed under in _all

    def validate_binding(self, routing_key, arguments):
        kind = (arguments or {}).get("x-match", "all")
        if not isinstance(kind, str):
            raise precondition_failed(
                f"Invalid x-match field type {table_type_name(kind)} (value {erl_term(kind)}); "
                "expected longstr")
        if kind not in MATCH_KINDS:
            raise precondition_failed(
                f"Invalid x-match field value {erl_term(kind)}; expected all, any, all-with-x, or any-with-x")

    def _index_add(self, binding: Binding) -> None:
        compiled = want_all, tests = compile_binding(binding.arguments)
        if want_all:
            if not tests:
                self._always[binding.key] = binding
                return
            # File it under the pair whose bucket is smallest now (a value test before a
            # presence test on a tie): a rough guess at the most selective pair.
            best, best_size = None, -1
            for header, expected in tests:
                slot = (header, _PRESENT if expected is None else expected)
                size = len(self._all.get(header, {}).get(slot[1], ())) + (expected is None)
                if best is None or size < best_size:
                    best, best_size = slot, size
            assert best is not None
            self._all_slot[binding.key] = best
            _put(self._all, best, binding, compiled)
        else:
            for header, expected in tests:
                _put(self._any, (header, _PRESENT if expected is None else expected), binding, compiled)

    def _index_remove(self, binding: Binding) -> None:
        if self._always.pop(binding.key, None) is not None:
            return
        slot = self._all_slot.pop(binding.key, None)
        if slot is not None:
            _drop(self._all, slot, binding)
            return
        for header, expected in compile_binding(binding.arguments)[1]:
            _drop(self._any, (header, _PRESENT if expected is None else expected), binding)

    def match(self, routing_key, message):
        headers = message.headers or {}
        hits = list(self._always.values())
        all_index, any_index = self._all, self._any
        if headers and (all_index or any_index):
            for header, value in headers.items():
                in_all, in_any = all_index.get(header), any_index.get(header)
                if in_all is None and in_any is None:
                    continue
                comparable = _top(value)
                if in_all is not None:
                    for table in (in_all.get(comparable), in_all.get(_PRESENT)):
                        if table:
                            hits.extend(b for b, compiled in table.values()
                                        if headers_match(None, headers, compiled))
                if in_any is not None:
                    for table in (in_any.get(comparable), in_any.get(_PRESENT)):
                        if table:
                            hits.extend(b for b, _ in table.values())
        if not hits:
            return ()
        return by_age(dict.fromkeys(hits))  # an `any` binding may be hit by several headers


def _put(index: dict, slot: tuple, binding: Binding, compiled) -> None:
    header, value = slot
    values: dict | None = index.get(header)
    if values is None:
        values = index[header] = {}
    table: dict | None = values.get(value)
    if table is None:
        table = values[value] = {}
    table[binding.key] = (binding, compiled)


def _drop(index: dict, slot: tuple, binding: Binding) -> None:
    header, value = slot
    values: dict | None = index.get(header)
    table: dict | None = None if values is None else values.get(value)
    if values is None or table is None:
        return
    table.pop(binding.key, None)
    if not table:
        del values[value]
        if not values:
            del index[header]
