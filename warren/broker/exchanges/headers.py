"""Headers exchange: bindings match message headers by x-match all / any (/ -with-x)."""

import datetime
import decimal

from ..errors import precondition_failed
from .base import Exchange

MATCH_KINDS = ("all", "any", "all-with-x", "any-with-x")


def _type_class(value):
    # RabbitMQ compares values only within a type class: all integer types are one class.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, (str, bytes)):
        return "str"
    if isinstance(value, (float, decimal.Decimal)):
        return "float"
    if isinstance(value, datetime.datetime):
        return "time"
    if value is None:
        return "void"
    return type(value).__name__


def _same(a, b) -> bool:
    if isinstance(a, str):
        a = a.encode()
    if isinstance(b, str):
        b = b.encode()
    return a == b


def headers_match(args: dict, headers: dict) -> bool:
    kind = args.get("x-match", "all")
    if isinstance(kind, bytes):
        kind = kind.decode(errors="replace")
    with_x = kind.endswith("-with-x")
    want_all = kind.startswith("all")
    considered = 0
    for key, expected in args.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        considered += 1
        present = key in headers
        if present:
            actual = headers[key]
            ok = expected is None or (_type_class(expected) == _type_class(actual) and _same(expected, actual))
        else:
            ok = False
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


class HeadersExchange(Exchange):
    type_name = "headers"

    def validate_binding(self, routing_key, arguments):
        kind = (arguments or {}).get("x-match", "all")
        if isinstance(kind, bytes):
            kind = kind.decode(errors="replace")
        if kind not in MATCH_KINDS:
            raise precondition_failed(
                f"Invalid x-match field value <<\"{kind}\">>; expected all, any, all-with-x, or any-with-x")

    def match(self, routing_key, message):
        headers = message.headers or {}
        return tuple(dict.fromkeys(
            b.destination for b in self.bindings.values() if headers_match(b.arguments, headers)))
