"""A queue's x-arguments: RabbitMQ's checks when a queue is declared, and its comparison when
one is redeclared. The checks and lists are each queue type's (its Capabilities name them);
kept apart from the queue classes, which share the functions."""

from collections.abc import Callable, Container
from typing import Any

from ..amqp.codec import table_type_class, table_type_name
from ..amqp.erlang import erl_s
from .errors import precondition_failed
from .publish_checks import MAX_EXPIRY  # also the limit of x-expires and x-message-ttl
from .stream_offsets import max_age_ms

# Arguments RabbitMQ 3.10 compares when a classic queue is redeclared, in the order it checks
# them (rabbit_classic_queue:capabilities/0 queue_arguments). x-queue-type is compared too, a
# missing one being the same as "classic": declaring a classic queue again as a quorum queue
# is refused.
EQUIVALENCE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
                    "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-queue-master-locator")

# Arguments RabbitMQ 3.10 compares when a quorum queue is redeclared: its queue type's own
# (rabbit_quorum_queue:capabilities/0 queue_arguments, in that order), x-queue-type included.
QUORUM_EQUIVALENCE_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
                           "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
                           "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
                           "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
                           "x-queue-leader-locator")

# Arguments RabbitMQ 3.10 compares when a stream is redeclared (rabbit_stream_queue:
# capabilities/0 queue_arguments, in that order).
STREAM_EQUIVALENCE_ARGS = ("x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
                           "x-initial-cluster-size", "x-queue-leader-locator")

# Arguments of other queue types, which a classic queue refuses.
NOT_CLASSIC_ARGS = frozenset({"x-max-in-memory-length", "x-max-in-memory-bytes", "x-delivery-limit",
                              "x-dead-letter-strategy", "x-max-age", "x-stream-max-segment-size-bytes",
                              "x-initial-cluster-size", "x-queue-leader-locator",
                              "x-quorum-initial-group-size"})

# Arguments of classic and stream queues, which a quorum queue refuses.
NOT_QUORUM_ARGS = frozenset({"x-max-priority", "x-queue-mode", "x-queue-version", "x-queue-master-locator",
                             "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size"})

# Arguments of classic and quorum queues, which a stream refuses.
NOT_STREAM_ARGS = frozenset({"x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                             "x-max-length", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
                             "x-single-active-consumer", "x-queue-master-locator", "x-max-in-memory-length",
                             "x-max-in-memory-bytes", "x-delivery-limit", "x-dead-letter-strategy",
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


def _check_one_of(known: tuple[str, ...], error: str) -> Check:
    """A string argument with a fixed set of values (a longstr; any other type is named)."""
    def check(value: Any, args: dict[str, Any]) -> str | None:
        if isinstance(value, bytes):
            return "{unacceptable_type,binary}"  # RabbitMQ matches {longstr, _} only
        err = _str_arg(value)
        if err is None and value not in known:
            return error
        return err
    return check


def _check_group_size(value: Any, args: dict[str, Any]) -> str | None:
    err = _non_neg_int_arg(value)
    if err is None and value == 0:
        return "{value_zero,0}"
    return err


# A classic queue's checks: RabbitMQ's declare_args(), each present argument in this order.
CLASSIC_CHECKS: tuple[tuple[str, Check], ...] = (
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


# A quorum queue's checks: RabbitMQ's declare_args() order, those of its queue type only
# (x-delivery-limit has none in 3.10: any value is taken, and only an integer limits).
QUORUM_CHECKS: tuple[tuple[str, Check], ...] = (
    ("x-expires", _check_expires),
    ("x-message-ttl", lambda v, a: _expiry_arg(v)),
    ("x-dead-letter-exchange", lambda v, a: _str_arg(v)),
    ("x-dead-letter-routing-key", _check_dlx_rk),
    ("x-dead-letter-strategy", _check_one_of(("at-most-once", "at-least-once"), "invalid_dlx_strategy")),
    ("x-max-length", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-length-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-in-memory-length", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-in-memory-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-overflow", _check_overflow),
    ("x-single-active-consumer", _check_sac),
    ("x-quorum-initial-group-size", _check_group_size),
    ("x-queue-leader-locator", _check_one_of(("client-local", "balanced", "random", "least-leaders"),
                                             "invalid_queue_locator_arg")),
)


def _check_max_age(value: Any, args: dict[str, Any]) -> str | None:
    if isinstance(value, bytes):
        return "{unacceptable_type,binary}"
    err = _str_arg(value)
    if err is None and max_age_ms(value) is None:
        return "invalid_max_age"
    return err


# A stream's checks, in RabbitMQ's declare_args() order, those of its queue type only.
STREAM_CHECKS: tuple[tuple[str, Check], ...] = (
    ("x-max-length-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-age", _check_max_age),
    ("x-stream-max-segment-size-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-initial-cluster-size", _check_group_size),
    ("x-queue-leader-locator", _check_one_of(("client-local", "balanced", "random", "least-leaders"),
                                             "invalid_queue_locator_arg")),
)


def check_queue_type(args: dict[str, Any], what: str, known: Container[str]) -> None:
    """x-queue-type, if given, names one of the `known` types (RabbitMQ's texts)."""
    qtype = args.get("x-queue-type")
    if qtype is None:
        return
    err = _str_arg(qtype)
    if err is None and qtype not in known:
        err = f"\"unsupported queue type '{erl_s(qtype)}'\""
    if err:
        raise precondition_failed(f"invalid arg 'x-queue-type' for {what}: {err}")


def validate_arguments(args: dict[str, Any] | None, what: str, checks: tuple[tuple[str, Check], ...],
                       refused: frozenset[str], type_module: str) -> None:
    """Check a new queue's arguments as RabbitMQ 3.10 does: its type's checks in RabbitMQ's
    order, then the other types' arguments (refused); unknown x- arguments are ignored."""
    if not args:
        return
    for key, check in checks:
        if key in args:
            err = check(args[key], args)
            if err:
                raise precondition_failed(f"invalid arg '{key}' for {what}: {err}")
    for key in args:
        if key in refused:
            raise precondition_failed(f"invalid arg '{key}' for {what} of queue type {type_module}")


def check_durable_only(what: str, durable: bool, exclusive: bool, auto_delete: bool) -> None:
    """A queue type that is durable only (a quorum queue, a stream): RabbitMQ's checks, in its
    order (rabbit_quorum_queue:declare, rabbit_stream_queue:declare), after the arguments'.
    (An exclusive declare is also non-durable there: the exclusive refusal comes first.)"""
    if auto_delete:
        raise precondition_failed(f"invalid property 'auto-delete' for {what}")
    if exclusive:
        raise precondition_failed(f"invalid property 'exclusive-owner' for {what}")
    if not durable:
        raise precondition_failed(f"invalid property 'non-durable' for {what}")


# The largest x-stream-max-segment-size-bytes (RabbitMQ's ?MAX_STREAM_MAX_SEGMENT_SIZE).
MAX_SEGMENT_SIZE = 3_000_000_000


def check_segment_size(args: dict[str, Any]) -> None:
    """A stream's segment size limit: checked after its declare properties, as RabbitMQ does."""
    size = args.get("x-stream-max-segment-size-bytes")
    if isinstance(size, int) and size > MAX_SEGMENT_SIZE:
        raise precondition_failed("Exceeded max value for x-stream-max-segment-size-bytes")


def check_equivalent_arguments(what: str, received: dict[str, Any] | None, current: dict[str, Any],
                               keys: tuple[str, ...] = EQUIVALENCE_ARGS) -> None:
    """406 unless a redeclare's arguments match the queue's (those RabbitMQ compares for its
    type, `keys`: same value and same table type class)."""
    received = received or {}
    for key in keys:
        got, have = received.get(key), current.get(key)
        if got is None and have is None:
            continue
        if key == "x-queue-type" and got in (None, "classic") and have in (None, "classic"):
            continue  # rabbit_misc:assert_field_equivalence's special case
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
