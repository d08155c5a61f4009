"""Dead-lettering: a message leaving a queue for good (rejected, expired, over the length
limit or the delivery limit) republished to the queue's dead-letter exchange, as RabbitMQ
3.10 does (rabbit_dead_letter.erl).

The republish is internal: no channel and no user, so no permission check at this point
(RabbitMQ checked write on the DLX when the queue was declared with it); routing is the
vhost's own, alternate exchanges of the DLX included, and the target queues take the copy
through the same enqueue as any publish (their TTLs, limits and durable writes apply).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .dead_letter_message import detect_cycles, dead_letter_message
from .enqueue import enqueue
from .sender_selected import Routing, route_keys

if TYPE_CHECKING:
    from ..amqp.message import Message
    from .exchanges.base import Exchange
    from .queues.base import Queue
    from ..store.settlement import Settlement

log = logging.getLogger("warren.dead_letter")

# Dead-letter targets that were missing, cycles dropped: logged once each (RabbitMQ logs a
# cycle once per queue process; a missing DLX is a warning every time there, which a
# flood of expiring messages would turn into a log flood).
_warned: set[tuple[str, ...]] = set()
_WARNED_MAX = 10000


def _warn_once(key: tuple[str, ...], text: str, *args: object) -> None:
    if key in _warned:
        return
    if len(_warned) < _WARNED_MAX:
        _warned.add(key)
    log.warning(text, *args)


class DeadLetterVHost(Routing, Protocol):
    """What dead-lettering reads of the queue's vhost (warren.broker.vhost.VHost, which calls
    this as the queues' host: a Protocol here, so that the vhost stays above)."""

    @property
    def name(self) -> str: ...

    @property
    def exchanges(self) -> Mapping[str, Exchange]: ...


def publish(vhost: DeadLetterVHost, queue: Queue, message: Message, reason: str) -> Settlement | None:
    """Republish one message of `queue` to its dead-letter exchange. Returns the settlement
    handle of its copies (SETTLED: nothing to wait for), or None when the
    message goes nowhere: no DLX set, a DLX that does not exist (a warning, once), no queue
    it routes to (cycles left out)."""
    settings = queue.settings
    if settings.dlx is None:
        return None
    x = vhost.exchanges.get(settings.dlx)
    if x is None:
        _warn_once(("dlx", vhost.name, queue.name, settings.dlx),
                   "dead-letter exchange '%s' of %s does not exist; dead-lettered messages are dropped",
                   settings.dlx, queue.describe())
        return None
    try:
        dl_message, routing_keys = dead_letter_message(message, reason, queue.name, x.name, settings.dlrk,
                                                       int(time.time()))
    except ValueError:  # a dead-letter routing key over 255 bytes: no delivery could carry it
        _warn_once(("dlrk", vhost.name, queue.name), "dead-letter routing key of %s is longer than 255 "
                   "bytes; dead-lettered messages are dropped", queue.describe())
        return None
    targets = route_keys(vhost, x, routing_keys, dl_message)
    cycles = detect_cycles(dl_message, reason, [q.name for q in targets])
    if cycles:
        for cycle in cycles.values():
            _warn_once(("cycle", vhost.name, *cycle),
                       "message dropped: dead-letter queues cycle detected (no rejection in it): %s; "
                       "this cycle will not be reported again", cycle)
        targets = [q for q in targets if q.name not in cycles]
    if not targets:
        return None
    # A target that refuses it (reject-publish) does not hold up the others: at most once there.
    return enqueue(dl_message, targets, refusals=False)
