"""One owner for "what a reply promises is on disk before the reply leaves".

A declare-ok, a delete-ok or an HTTP 201 follows the journal write of the definitions it
changed; a delivery follows the write of its delivered-mark; a publisher confirm follows its
message's settlement handle (warren.store.settlement: the group commit it joined, here). The
AMQP session and the HTTP API both go through this object instead of reaching into the
definitions file and the persister.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..store.persister import HOLD_MIN
from ..store.settlement import Ticket

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..store.persister import Persister


class Journal(Protocol):
    """The definitions journal, as the metadata store writes it (MetadataStore.flush)."""

    def flush(self) -> None: ...


class Writers(Protocol):
    """Where the node keeps what this writes (the broker, which holds this object: read at
    each call, as the server sets the persister after the broker is made)."""

    @property
    def metadata(self) -> Journal: ...

    @property
    def persister(self) -> Persister | None: ...


class Durability:
    def __init__(self, broker: Writers):
        self.broker = broker

    def flush(self) -> None:
        """Write what changed since the last flush: definitions (journal, fsynced) and the
        buffered message records and marks (an fsync of those starts if one is due). Called
        before any reply leaves."""
        broker = self.broker
        broker.metadata.flush()
        persister = broker.persister
        if persister is not None:
            persister.flush()

    def ticket(self, message: Message) -> Ticket | None:
        """A confirm Ticket for a publish whose queues may hold its records back until they
        are acked (a big persistent body: warren.store.persister); None: they write it at once.
        (A call per publish: about 0.1 µs of the 20-40 µs a message costs.)"""
        if len(message.body) < HOLD_MIN or not message.persistent:
            return None
        persister = self.broker.persister
        if persister is None or not persister.holding:
            return None
        return Ticket(persister)

    def sync_now(self) -> bool:
        """Write and fsync everything now (tx.commit). True if all of it is safe."""
        persister = self.broker.persister
        return persister is None or persister.sync_now()
