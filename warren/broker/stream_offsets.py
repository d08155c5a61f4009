"""Where a stream consumer starts (the `x-stream-offset` consumer argument) and RabbitMQ's
age strings (`x-max-age`, and an interval as an offset spec), as rabbit_stream_queue
parse_offset_arg and rabbit_amqqueue check_max_age read them."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..amqp.codec import table_type_name

# ms in each unit of an age string: Y(ears), M(onths), D(ays), h, m, s (RabbitMQ's
# unit_value_in_ms: a year is 365 days, a month 30).
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "D": 86_400_000, "M": 30 * 86_400_000, "Y": 365 * 86_400_000}
# check_max_age's regular expression: its unit is what follows the number up to the end of
# the first line ("." stops at a newline; "1s\nrest" is one second).
_AGE = re.compile(r"([0-9]*)(.*)")


def max_age_ms(text: str | bytes) -> int | None:
    """An age string such as "7D", "12h" or "30m" in ms, or None if RabbitMQ would refuse it
    (invalid_max_age): a positive whole number, then one of the units. (One that does not
    start with a digit, RabbitMQ fails on: a crash there, refused here.)"""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    match = _AGE.match(text)
    if match is None or not match.group(1):
        return None
    value = int(match.group(1))
    unit = _UNIT_MS.get(match.group(2))
    if value <= 0 or unit is None:
        return None
    return value * unit


@dataclass(frozen=True)
class OffsetSpec:
    """first, last, next, an offset, or a time (ms since the epoch: the first chunk appended
    at or after it)."""

    kind: str                 # "first" | "last" | "next" | "offset" | "timestamp"
    value: int = 0


NEXT = OffsetSpec("next")


def parse_offset_spec(value: Any) -> OffsetSpec | None:
    """The x-stream-offset argument (absent: next), or None if RabbitMQ refuses it."""
    if value is None:
        return NEXT
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return OffsetSpec(value)
        ms = max_age_ms(value)
        if ms is None:
            return None
        return OffsetSpec("timestamp", int(time.time() * 1000) - ms)
    if isinstance(value, datetime):  # an AMQP timestamp (seconds)
        return OffsetSpec("timestamp", int(value.timestamp()) * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if table_type_name(value) == "timestamp":  # one too large for a datetime
        return OffsetSpec("timestamp", value * 1000)
    return OffsetSpec("offset", value)
