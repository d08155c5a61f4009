"""How other objects name a connection: a channel's connection and an exclusive queue's
owner, as data (so that a queue, a metadata command or another node can hold them)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple


class ConnectionLink(NamedTuple):
    """How other objects name a connection (a channel's connection, an exclusive queue's
    owner): RabbitMQ's name for it and the client's address."""

    name: str          # "PEER_HOST:PEER_PORT -> HOST:PORT"
    peer_host: str
    peer_port: int | str  # "undefined" for a shovel's own connection, as RabbitMQ shows it


_owner_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ExclusiveOwner:
    """Who an exclusive queue belongs to: a connection, by an id no other connection of the
    node has had (data, so a queue, a command or another node can hold it), with the link the
    management API shows as the queue's owner_pid_details."""

    id: int
    link: ConnectionLink

    @classmethod
    def new(cls, link: ConnectionLink) -> "ExclusiveOwner":
        return cls(next(_owner_ids), link)
