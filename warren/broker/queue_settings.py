"""What a queue does with its messages: its x-arguments merged with its policy and operator
policy, as RabbitMQ 3.10 resolves them (rabbit_queue_type_util:args_policy_lookup).

A key set both ways resolves per key: the numeric limits (expires, message-ttl, max-length,
max-length-bytes, delivery-limit) take the lower value, the others the argument's. A policy and
an operator policy that both set a numeric limit give the lower (rabbit_policies
merge_policy_value); an operator policy sets only numeric limits. x-max-priority and
x-single-active-consumer exist only as arguments in 3.10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .policy import lower, policy_value

if TYPE_CHECKING:
    from .policy import Policy

# Keys where an argument and a policy value resolve to the lower (res_min); the others take
# the argument (res_arg).
_MIN_KEYS = frozenset({"expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit"})


@dataclass(frozen=True, slots=True)
class QueueSettings:
    expires: int | None = None            # ms unused before the queue is deleted
    message_ttl: int | None = None        # ms
    dlx: str | None = None                # dead-letter exchange name
    dlrk: str | None = None               # dead-letter routing key
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"           # or reject-publish, reject-publish-dlx
    delivery_limit: Any = None            # quorum queues: only a number limits (see quorum.py)
    dead_letter_strategy: str = "at-most-once"
    max_priority: int | None = None
    single_active_consumer: bool = False
    max_age: str | None = None                        # streams: "7D", "12h", ...
    stream_max_segment_size_bytes: int | None = None  # streams

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    # (names from the wire keep bytes that are not UTF-8 as surrogates, as exchange names do)
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)


def resolve(arguments: dict[str, Any], policy: Policy | None, operator_policy: Policy | None,
            policy_wins: frozenset[str] = frozenset()) -> QueueSettings:
    """The settings of a queue with these (validated) arguments and policies. `policy_wins`:
    keys whose policy value beats the argument (a quorum queue's expires and overflow)."""
    if not arguments and policy is None and operator_policy is None:
        return PLAIN  # most queues: nothing to look up (a declare of 100,000 queues)
    def lookup(key: str) -> Any:
        arg = arguments.get("x-" + key)
        pol = policy_value(key, policy, operator_policy) if (policy or operator_policy) else None
        if pol is None:
            return arg
        if arg is None or key in policy_wins:
            return pol
        return lower(pol, arg) if key in _MIN_KEYS else arg

    overflow = _text(lookup("overflow")) or "drop-head"
    return QueueSettings(
        expires=lookup("expires"), message_ttl=lookup("message-ttl"),
        dlx=_text(lookup("dead-letter-exchange")), dlrk=_text(lookup("dead-letter-routing-key")),
        max_length=lookup("max-length"), max_length_bytes=lookup("max-length-bytes"), overflow=overflow,
        delivery_limit=lookup("delivery-limit"),
        dead_letter_strategy=_text(lookup("dead-letter-strategy")) or "at-most-once",
        max_priority=arguments.get("x-max-priority"),
        single_active_consumer=arguments.get("x-single-active-consumer") is True,
        max_age=_text(lookup("max-age")), stream_max_segment_size_bytes=lookup("stream-max-segment-size-bytes"))


PLAIN = QueueSettings()
