"""What a queue type is, in one record (RabbitMQ's rabbit_queue_type:capabilities/0 and the
choices its modules make): the arguments it takes and compares, the consumer arguments and
policy keys that apply to it, whether it may be server-named or must be durable, and how the
management API counts and shows it. The rest of the broker asks this record, never a type's
name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..queue_arguments import Check


@dataclass(frozen=True)
class Capabilities:
    name: str                               # x-queue-type, and the management API's "type"
    module: str                             # RabbitMQ's module: in errors, and Prometheus's queue_type label
    argument_checks: tuple[tuple[str, Check], ...]  # its own arguments' checks, in RabbitMQ's order
    refused_arguments: frozenset[str]       # other types' arguments: refused at declare
    equivalence_arguments: tuple[str, ...]  # compared when it is declared again, in RabbitMQ's order
    consumer_arguments: frozenset[str]      # basic.consume arguments it takes (another type's are refused)
    policy_keys: frozenset[str] | None = None   # a policy applies only if it has one of these (None: any)
    policy_wins: frozenset[str] = frozenset()   # settings whose policy value beats the argument
    server_named: bool = True               # may be declared with an empty name
    durable_only: bool = False              # durable, never exclusive or auto-delete
    counts_unacked: bool = True             # "messages" is ready + unacked (a stream: what it holds)
    members: bool = False                   # the API lists its members and online nodes
    leader: bool = False                    # ... and its leader
    sac_successor_by_priority: bool = True  # single active consumer: the successor is the highest
    #                                         priority's (else the earliest registered, as rabbit_fifo)
    nacked_when_out_of_reach: bool = False  # a publish while its home (leader) is out of reach is
    #                                         nacked (rabbit_fifo_client), not routed nowhere (then confirmed)
