"""Handing a routed message to its queues: one settlement handle for all of them.

Every publish ends here: the operations layer's (ops.publish, a channel's tx.commit, a
shovel's forward) and dead-lettering's republish (warren.broker.dead_letter), which the
vhost calls as its queues' host and so must not reach the operations layer above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..store.settlement import REJECTED, SETTLED, Settlement, later

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..store.settlement import Ticket


def enqueue(message: Message, queues: list, refusals: bool = True, ticket: Ticket | None = None) -> Settlement:
    """Hand a routed message to its queues. Returns the settlement handle a confirm of it
    waits on (warren.store.settlement: SETTLED when nothing needs to happen first), or, with
    `refusals`, REJECTED if a queue refused it (x-overflow reject-publish: the confirm is a
    basic.nack, whatever the other queues did). Without `refusals` (a dead letter: at most
    once where refused) what the other queues need is returned whatever a queue refused.
    With a confirm `ticket` (a channel's big persistent publish), queues may hold their
    records back: the ticket, covering every copy, is then the handle."""
    settlement: Settlement = SETTLED
    rejected = False
    for q in queues:
        s = q.publish(message, ticket)
        if s is REJECTED:
            rejected = True
        elif s is not SETTLED:
            settlement = s if settlement is SETTLED else later(settlement, s)  # (one queue: no call)
    if rejected and refusals:
        return REJECTED
    if ticket is not None:
        return ticket.covering(settlement)
    return settlement
