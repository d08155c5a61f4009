"""A consumer: a subscription of one channel to one queue, with its own prefetch credit and
priority, and RabbitMQ's checks of basic.consume's arguments. Its channel's credit (basic.qos
global=true) is a record the channel shares with it (warren.broker.credit): the consumer reads
no state of its channel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..amqp.codec import table_type_name
from .errors import precondition_failed

if TYPE_CHECKING:
    from .credit import Credit
    from .ports import DeliverySink

# Warren's own consumer argument of streams: record batches (warren.broker.queues.stream),
# which connection.start's capabilities list.
RECORD_BATCH = "x-warren-record-batch"

def check_consume_arguments(arguments: dict[str, Any] | None, what: str, own: frozenset[str],
                            every: frozenset[str], type_module: str) -> None:
    """406 for a basic.consume argument RabbitMQ 3.10 refuses (rabbit_amqqueue
    check_consume_arguments, in its order): a non-integer x-priority, a non-boolean
    x-cancel-on-ha-failover (each where the queue type has it: `own`, its capabilities'),
    then the first argument of another queue type (in `every` type's, not in `own`). Other
    arguments are ignored."""
    if not arguments:
        return
    priority = arguments.get("x-priority")
    if "x-priority" in arguments and "x-priority" in own and (isinstance(priority, bool)
                                                               or not isinstance(priority, int)):
        raise precondition_failed(f"invalid arg 'x-priority' for {what}: "
                                  f'"expected integer, got {table_type_name(priority)}"')
    failover = arguments.get("x-cancel-on-ha-failover")
    if "x-cancel-on-ha-failover" in arguments and "x-cancel-on-ha-failover" in own and not isinstance(failover, bool):
        raise precondition_failed(f"invalid arg 'x-cancel-on-ha-failover' for {what}: "
                                  f"{{unacceptable_type,{table_type_name(failover)}}}")
    for key in arguments:
        if key in every and key not in own:
            raise precondition_failed(f"invalid arg '{key}' for {what} of queue type {type_module}")


class Gate(Protocol):
    """Whether the consumer's connection may be sent to now (its throttle)."""

    delivering: bool


class Consumer:
    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "priority", "prefetch",
                 "unacked", "credit", "prefix", "gate")
    # A consumer of another cluster member, served here for it (warren.cluster.queue_home):
    # that node shows it, as a consumer of its channel.
    remote = False

    def __init__(self, tag: str, channel: DeliverySink[Consumer], queue, no_ack: bool, exclusive: bool,
                 arguments: dict | None, prefetch: int, credit: Credit, prefix: bytes, gate: Gate):
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments or {}
        # x-priority (checked by check_consume_arguments): higher first, 0 by default.
        priority = self.arguments.get("x-priority", 0)
        self.priority = priority if isinstance(priority, int) else 0
        self.prefetch = prefetch  # per-consumer limit (basic.qos global=false), 0 = none
        self.unacked = 0
        self.credit = credit  # its channel's (basic.qos global=true), shared by the channel's consumers
        self.prefix = prefix  # the constant start of this consumer's basic.deliver payload
        self.gate = gate

    def ready(self) -> bool:
        """Whether a message may be pushed to this consumer now."""
        if not self.gate.delivering:
            return False
        if self.no_ack:
            return True  # as in RabbitMQ, prefetch limits only apply to acked deliveries
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        credit = self.credit
        return not (credit.limit and credit.used >= credit.limit)

    def has_credit(self) -> bool:
        """Whether its prefetch would let a message through now, whatever its connection's
        throttle (ready() inlines the same test: it runs for every message)."""
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        credit = self.credit
        return not (credit.limit and credit.used >= credit.limit)
