"""Publish-time property checks: the properties RabbitMQ refuses a publish for (406)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..amqp.erlang import erl_string
from .errors import precondition_failed

if TYPE_CHECKING:
    from .auth import User


# RabbitMQ's ?MAX_EXPIRY_TIMER: the largest per-message or per-queue TTL, in milliseconds.
MAX_EXPIRY = 315360000000


def check_properties(props: dict[str, Any], user: User) -> int | None:
    """RabbitMQ's publish-time property checks (406): user_id must name the publishing user
    (unless tagged impersonator), and expiration must be a valid TTL. Returns that TTL (ms)."""
    user_id = props.get("user_id")
    if user_id is not None and user_id != user.name and "impersonator" not in user.tags:
        raise precondition_failed(f"user_id property set to '{user_id}' but authenticated user was '{user.name}'")
    expiration = props.get("expiration")
    if expiration is not None:
        ttl, err = parse_expiration(expiration)
        if err:
            raise precondition_failed(f"invalid expiration '{expiration}': {err}")
        return ttl
    return None


def parse_expiration(text: str) -> tuple[int, None] | tuple[None, str]:
    """The `expiration` property as RabbitMQ reads it: (milliseconds, None) or (None, error),
    error being the Erlang term RabbitMQ prints ("no_integer", "{value_negative,-1}", ...)."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0:
        return None, "no_integer"
    value = int(text[:len(text) - len(digits) + n])
    rest = digits[n:]
    if rest:
        return None, f"{{leftover_string,{erl_string(rest)}}}"
    if value > MAX_EXPIRY:
        return None, f"{{value_too_large,{value}}}"
    if value < 0:
        return None, f"{{value_negative,{value}}}"
    return value, None
