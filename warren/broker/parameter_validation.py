"""Runtime parameters' validation, as rabbit_parameter_validation words it: each check takes
the key and the value and returns RabbitMQ's error text or None; proplist() runs a list of
them over a parameter's value in RabbitMQ's order (shovels, federation upstreams)."""

from __future__ import annotations

from ..amqp.erlang import erl_column, erl_format, erl_json, erl_list, erl_pretty, erl_text
from ..amqp.uri import SHOVEL_CALLER, Unsupported, with_caller


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(key, value):
    return None if is_number(value) else f"{key} should be a number, actually was {erl_json(value)}"


def binary(key, value):
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erl_json(value)}"


def boolean(key, value):
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erl_json(value)}"


def enum(options):
    def check(key, value):
        if not isinstance(value, str):
            return f"{key} should be binary, actually was {erl_json(value)}"
        if value not in options:
            return (f"{key} should be one of {erl_list([erl_json(o) for o in options])}, "
                    f"actually was {erl_json(value)}")
        return None
    return check


def proplist(name: str, constraints: list, value) -> list[str]:
    """rabbit_parameter_validation:proplist: the errors in RabbitMQ's order (unrecognised keys
    first, then each constraint's, last constraint first). A JSON object or an empty list is
    a proplist; anything else is "not a list" (RabbitMQ crashes, 500, on most of those)."""
    if isinstance(value, list) and not value:
        value = {}
    if not isinstance(value, dict):
        return [f"{name} not a list {erl_json(value)}"]
    known = {c[0] for c in constraints}
    results: list[str] = []
    for key, check, mandatory in constraints:
        if key in value:
            error = check(key, value[key])
            if error:
                results[:0] = error if isinstance(error, list) else [error]
        elif mandatory:
            results.insert(0, f'Key "{key}" not found in {name}')
    rest = sorted((k, v) for k, v in value.items() if k not in known)
    if rest:
        # (~p: a list that does not fit its line is broken, as RabbitMQ prints it)
        results.insert(0, erl_text(erl_format("Unrecognised terms ~p in ", rest)) + name)
    return results


def invalid_uri(uri: str, reason: object, caller: tuple = SHOVEL_CALLER) -> str:
    """A URI amqp_uri refused, as shovels and federation say it: "~s" not a valid URI: ~p of
    {Reason, URI} (the URI's bytes as Erlang's characters, the term laid out from the column
    the prefix ends at). `caller` is the frame of who called amqp_uri:parse, which ends the
    stack trace of one of its errors; Warren's own refusals (Unsupported) are text."""
    raw = uri.encode("utf-8", "surrogatepass")
    prefix = '"' + raw.decode("latin-1") + '" not a valid URI: '
    if isinstance(reason, Unsupported):
        return erl_text(prefix) + reason
    return erl_text(prefix + erl_pretty((with_caller(reason, caller), list(raw)), erl_column(prefix)))
