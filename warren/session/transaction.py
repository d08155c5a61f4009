"""A channel's open transaction (tx.select): publishes, acks and rejects held until commit.

They are applied at tx.commit in the order they arrived, and forgotten at tx.rollback (whose
acks and rejects make their deliveries outstanding again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..broker.consumer import Consumer
    from ..broker.queues.base import Queue
    from ..store.queued_message import QueuedMessage

    # A delivery tag and what it stands for: the message, its queue, the consumer (None: basic.get).
    Unacked = tuple[int, tuple[QueuedMessage, Queue, Consumer | None]]


@dataclass(slots=True)
class TxPublish:
    queues: list
    message: Message
    mandatory: bool


@dataclass(slots=True)
class TxSettle:
    taken: list[Unacked]
    ack: bool
    requeue: bool = False


class Transaction:
    __slots__ = ("actions",)

    def __init__(self) -> None:
        self.actions: list[Union[TxPublish, TxSettle]] = []

    def publish(self, queues: list, message: Message, mandatory: bool) -> None:
        self.actions.append(TxPublish(queues, message, mandatory))

    def settle(self, taken: list[Unacked], ack: bool, requeue: bool = False) -> None:
        self.actions.append(TxSettle(taken, ack, requeue))

    def take(self) -> list[Union[TxPublish, TxSettle]]:
        """Everything held so far, leaving the transaction empty (commit)."""
        actions, self.actions = self.actions, []
        return actions

    def settled(self) -> list[Unacked]:
        """The deliveries acked or rejected in this transaction (to restore at rollback)."""
        return [entry for action in self.actions if isinstance(action, TxSettle) for entry in action.taken]

    @property
    def messages_uncommitted(self) -> int:
        return sum(1 for action in self.actions if isinstance(action, TxPublish))

    @property
    def acks_uncommitted(self) -> int:
        return sum(len(action.taken) for action in self.actions if isinstance(action, TxSettle) and action.ack)
