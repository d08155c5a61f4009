"""How other objects name a connection (a channel's connection and an exclusive queue's
owner) and a cluster names a shovel or federation link, as data (so that a queue, a metadata
command or another node can hold them)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import quote


class ConnectionLink(NamedTuple):
    """How other objects name a connection (a channel's connection, an exclusive queue's
    owner): RabbitMQ's name for it and the client's address."""

    name: str          # "PEER_HOST:PEER_PORT -> HOST:PORT"
    peer_host: str
    peer_port: int | str  # "undefined" for a shovel's own connection, as RabbitMQ shows it


# Ids unique across the node's runs too (microseconds at start): a cluster's log keeps the
# owners of a node's exclusive queues while the node restarts.
_owner_ids = itertools.count(time.time_ns() // 1000)


@dataclass(frozen=True, slots=True)
class ExclusiveOwner:
    """Who an exclusive queue belongs to: a connection, by the node it is on and an id no
    other connection of that node has had (data, so a queue, a command or another node can
    hold it; one owner equals another by those two), with the link the management API shows
    as the queue's owner_pid_details."""

    node: str  # the node's name (its config's node_name)
    id: int
    link: ConnectionLink = field(compare=False)

    @classmethod
    def new(cls, node: str, link: ConnectionLink) -> "ExclusiveOwner":
        return cls(node, next(_owner_ids), link)


def link_key(*parts: str) -> str:
    """A shovel's or federation link's name among the links a cluster's members run
    (warren.cluster.link_owners): its parts, quoted (a name may hold a '/')."""
    return "/".join(quote(part, safe="") for part in parts)
