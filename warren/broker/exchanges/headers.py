"""Headers exchange: bindings match message headers by x-match all / any (/ -with-x)."""

import datetime
import decimal

from ...amqp.codec import table_type_name
from ...amqp.erlang import erl_term
from ..errors import precondition_failed
from .base import Exchange

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


class HeadersExchange(Exchange):
    type_name = "headers"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._compiled: list = []

    def validate_binding(self, routing_key, arguments):
        kind = (arguments or {}).get("x-match", "all")
        if not isinstance(kind, str):
            raise precondition_failed(
                f"Invalid x-match field type {table_type_name(kind)} (value {erl_term(kind)}); "
                "expected longstr")
        if kind not in MATCH_KINDS:
            raise precondition_failed(
                f"Invalid x-match field value {erl_term(kind)}; expected all, any, all-with-x, or any-with-x")

    def _bindings_changed(self):
        self._compiled = [(compile_binding(b.arguments), b.destination) for b in self.bindings.values()]

    def match(self, routing_key, message):
        headers = message.headers or {}
        return tuple(dict.fromkeys(
            dest for compiled, dest in self._compiled if headers_match(None, headers, compiled)))
