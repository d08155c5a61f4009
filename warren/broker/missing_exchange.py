"""Capturing publishes to missing exchanges: an opt-in Warren extension of a vhost (issue 14).

RabbitMQ closes the channel with 404 "NOT_FOUND - no exchange 'x' in vhost 'v'" when a
basic.publish names an exchange that does not exist, and the message is gone. A vhost whose
`missing_exchange` setting names a capture exchange routes such a publish through that
exchange instead: same routing key, same body and properties, plus the header
`x-warren-missing-exchange` holding the name the publisher used (other headers kept byte for
byte). The publish is then a publish to the capture exchange in every way (deliveries and
basic.return name it; confirms, mandatory, alternate exchange, CC/BCC, user_id and
expiration checks as for a publish there). Operators bind a queue to the capture exchange,
find what was lost and replay it to the exchange the header names once it exists.

Left unset (the default) nothing changes: the 404 is RabbitMQ's, and the only cost is on
that error path. Never captured: the default exchange and the predeclared amq.* (they always
exist), any other "amq." name (no client can declare one, so nothing could replay it), and
any publish when the capture exchange itself does not exist (the usual 404, and a log line).
Permissions: the publisher needs write permission on the name it published to, checked
before the lookup as RabbitMQ checks it; nothing on the capture exchange, which is the
operator's configuration (as an alternate exchange is): it may be internal, so that clients
cannot publish to it directly, and topic permissions do not apply to it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..amqp import reencode as rt
from ..amqp.codec import shortstr
from ..amqp.properties import FLAG_HEADERS

if TYPE_CHECKING:
    from .exchanges.base import Exchange
    from .vhost import VHost

log = logging.getLogger("warren.routing")

SETTING = "missing_exchange"  # the key in a vhost's metadata, the API's and the definitions'
HEADER = b"x-warren-missing-exchange"
RESERVED = "amq."
# The predeclared exchanges a capture may go through (warren.broker.vhost.PREDECLARED; the
# firehose tracer is not one).
PREDECLARED = ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match")


class SettingError(ValueError):
    """A value the missing_exchange setting cannot take (the text says why)."""


def validate(value: object) -> str | None:
    """The setting a value given over the API, the CLI or in definitions stands for: an
    exchange name, or None (off) for null or "". Anything else is refused (SettingError),
    never ignored: a non-string, a name longer than the 255 bytes of a shortstr, or one with
    the reserved "amq." prefix other than the predeclared amq.direct, amq.fanout, amq.topic,
    amq.headers and amq.match (no other can ever exist). The exchange need not exist yet."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SettingError(f"{SETTING} must be an exchange name (a string), or null or \"\" to turn "
                           f"the capture off; got {type(value).__name__} {value!r}")
    if len(value.encode("utf-8", "surrogateescape")) > 255:
        raise SettingError(f"{SETTING} '{value[:40]}...' is not a valid exchange name: longer than 255 bytes")
    if value.startswith(RESERVED) and value not in PREDECLARED:
        raise SettingError(f"{SETTING} '{value}' is not a valid exchange name: the prefix 'amq.' is "
                           f"reserved (of those, only {', '.join(PREDECLARED)} may capture)")
    return value


def capture(vhost: VHost, exchange_name: str, route: bytes, header: bytes) -> tuple[Exchange, bytes, bytes] | None:
    """Where a publish to `exchange_name`, which does not exist in `vhost`, goes instead:
    (capture exchange, route bytes naming it and the publish's routing key, content header
    with the x-warren-missing-exchange header), or None when nothing captures it (the
    caller answers 404). `route` and `header` are the publish's, as received."""
    target = vhost.missing_exchange
    if target is None or exchange_name.startswith(RESERVED):
        return None
    x = vhost.exchanges.get(target)
    if x is None:
        log.warning("capture exchange '%s' of vhost '%s' does not exist: the publish to missing "
                    "exchange '%s' is refused (404)", target, vhost.name, exchange_name)
        return None
    log.debug("publish to missing exchange '%s' in vhost '%s' captured by '%s'", exchange_name, vhost.name, target)
    key = route[1 + route[0]:]  # the routing key's shortstr, as the publisher sent it
    return x, shortstr(target) + key, with_missing_header(header, exchange_name)


def with_missing_header(header: bytes, exchange_name: str) -> bytes:
    """The content header with x-warren-missing-exchange set to `exchange_name` (a longstr):
    the other properties and headers as they were, in their order; a header of that name the
    message already had (a replayed capture) takes the new value in its place."""
    props = rt.split_header(header)
    value = rt.longstr_value(exchange_name.encode("utf-8", "surrogateescape"))
    table = props.get(FLAG_HEADERS)
    fields = rt.table_fields(table) if table is not None else []
    for n, (k, _) in enumerate(fields):
        if k == HEADER:
            fields[n] = (HEADER, value)
            break
    else:
        fields.append((HEADER, value))
    props[FLAG_HEADERS] = rt.encode_fields(fields)
    return rt.join_header(header, props)
