"""A queue's x-arguments: RabbitMQ's checks when a queue is declared, and its comparison when
one is redeclared. Kept apart from the queue classes: every queue type shares them."""

from collections.abc import Callable
from typing import Any

from ..amqp.codec import table_type_class, table_type_name
from ..amqp.erlang import erl_s
from .errors import precondition_failed
from .publish_checks import MAX_EXPIRY  # also the limit of x-expires and x-message-ttl

# Arguments RabbitMQ compares when a queue is redeclared, in the order it checks them
# (its declare_args() order; x-queue-type is not compared).
EQUIVALENCE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
                    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
                    "x-single-active-consumer")

# Arguments of other queue types, which a classic queue refuses.
NOT_CLASSIC_ARGS = frozenset({"x-max-in-memory-length", "x-max-in-memory-bytes", "x-delivery-limit",
                              "x-dead-letter-strategy", "x-max-age", "x-stream-max-segment-size-bytes",
                              "x-initial-cluster-size", "x-queue-leader-locator",
                              "x-quorum-initial-group-size"})

# A check returns None, or the Erlang term RabbitMQ prints for a bad value.
Check = Callable[[Any, dict[str, Any]], str | None]


def _int_arg(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f'"expected integer, got {table_type_name(value)}"'
    return None


def _non_neg_int_arg(value: Any) -> str | None:
    err = _int_arg(value)
    if err is None and value < 0:
        return f"{{value_negative,{value}}}"
    return err


def _expiry_arg(value: Any) -> str | None:
    err = _non_neg_int_arg(value)
    if err is None and value > MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return err


def _str_arg(value: Any) -> str | None:
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    return None


def _check_expires(value: Any, args: dict[str, Any]) -> str | None:
    err = _int_arg(value)
    if err is None and value == 0:
        return "{value_zero,0}"
    return err or _expiry_arg(value)


def _check_dlx_rk(value: Any, args: dict[str, Any]) -> str | None:
    err = _str_arg(value)
    if err is None and "x-dead-letter-exchange" not in args:
        return "routing_key_but_no_dlx_defined"
    return err


def _check_max_priority(value: Any, args: dict[str, Any]) -> str | None:
    err = _non_neg_int_arg(value)
    if err is None and value > 255:
        return f"{{max_value_exceeded,{value}}}"
    return err


def _check_overflow(value: Any, args: dict[str, Any]) -> str | None:
    err = _str_arg(value)
    if err is None and value not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        return "invalid_overflow"
    return err


def _check_queue_mode(value: Any, args: dict[str, Any]) -> str | None:
    err = _str_arg(value)
    if err is None and value not in ("default", "lazy"):
        return f"\"unsupported queue mode '{erl_s(value)}'\""
    return err


def _check_queue_version(value: Any, args: dict[str, Any]) -> str | None:
    err = _int_arg(value)
    if err is None and value not in (1, 2):
        return f"\"unsupported queue version '{value}'\""
    return err


def _check_sac(value: Any, args: dict[str, Any]) -> str | None:
    if not isinstance(value, bool):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    return None


# RabbitMQ's declare_args(): each present argument is checked in this order.
_CHECKS: tuple[tuple[str, Check], ...] = (
    ("x-expires", _check_expires),
    ("x-message-ttl", lambda v, a: _expiry_arg(v)),
    ("x-dead-letter-exchange", lambda v, a: _str_arg(v)),
    ("x-dead-letter-routing-key", _check_dlx_rk),
    ("x-max-length", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-length-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-priority", _check_max_priority),
    ("x-overflow", _check_overflow),
    ("x-queue-mode", _check_queue_mode),
    ("x-queue-version", _check_queue_version),
    ("x-single-active-consumer", _check_sac),
)


def validate_arguments(args: dict[str, Any] | None, what: str) -> None:
    """Check a new queue's arguments as RabbitMQ 3.10 does; unknown x- arguments are ignored."""
    if not args:
        return
    qtype = args.get("x-queue-type")
    if qtype is not None:
        err = _str_arg(qtype)
        if err is None and qtype != "classic":
            # Warren only has classic queues (queue_factory.QUEUE_TYPES).
            err = f"\"unsupported queue type '{erl_s(qtype)}'\""
        if err:
            raise precondition_failed(f"invalid arg 'x-queue-type' for {what}: {err}")
    for key, check in _CHECKS:
        if key in args:
            err = check(args[key], args)
            if err:
                raise precondition_failed(f"invalid arg '{key}' for {what}: {err}")
    for key in args:
        if key in NOT_CLASSIC_ARGS:
            raise precondition_failed(f"invalid arg '{key}' for {what} of queue type rabbit_classic_queue")


def check_equivalent_arguments(what: str, received: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """406 unless a redeclare's arguments match the queue's (those RabbitMQ compares:
    same value and same table type class)."""
    received = received or {}
    for key in EQUIVALENCE_ARGS:
        got, have = received.get(key), current.get(key)
        if got is None and have is None:
            continue
        if got is not None and have is not None:
            if got == have and table_type_class(got) == table_type_class(have):
                continue
            shown_received, shown_current = f"'{erl_s(got)}'", f"'{erl_s(have)}'"
        else:
            def show(v: Any) -> str:
                return "none" if v is None else f"the value '{erl_s(v)}' of type '{table_type_name(v)}'"
            shown_received, shown_current = show(got), show(have)
        raise precondition_failed(f"inequivalent arg '{key}' for {what}: "
                                  f"received {shown_received} but current is {shown_current}")
