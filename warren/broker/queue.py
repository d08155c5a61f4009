"""A queue: ready messages in a store, consumers served round-robin, unacked accounting."""

from collections import deque

from ..store import MemoryQueueStore
from .errors import precondition_failed, rs
from .message import QueuedMessage
from ..amqp.codec import table_type_name

# Arguments RabbitMQ compares when a queue is redeclared.
EQUIVALENCE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
                    "x-queue-type", "x-single-active-consumer")


def _erl(value) -> str:
    return f"<<\"{value}\">>" if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _int_arg(value, *, positive=False):
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    if value < 0:
        return f"{{value_negative,{value}}}"
    if positive and value == 0:
        return "{value_zero,0}"
    return None


def _str_arg(value):
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    return None


def _choice(value, choices):
    err = _str_arg(value)
    if err:
        return err
    if value not in choices:
        return f"{{unacceptable_value,{_erl(value)}}}"
    return None


def _check_arg(key, value, args):
    if key == "x-expires":
        return _int_arg(value, positive=True)
    if key in ("x-message-ttl", "x-max-length", "x-max-length-bytes"):
        return _int_arg(value)
    if key == "x-max-priority":
        err = _int_arg(value)
        if err is None and value > 255:
            return f"{{value_too_large,{value},255}}"
        return err
    if key == "x-dead-letter-exchange":
        return _str_arg(value)
    if key == "x-dead-letter-routing-key":
        err = _str_arg(value)
        if err is None and "x-dead-letter-exchange" not in args:
            return "routing_key_but_no_dlx_defined"
        return err
    if key == "x-overflow":
        return _choice(value, ("drop-head", "reject-publish", "reject-publish-dlx"))
    if key == "x-queue-mode":
        return _choice(value, ("default", "lazy"))
    if key == "x-queue-type":
        return _choice(value, ("classic",))
    if key == "x-single-active-consumer":
        if not isinstance(value, bool):
            return f"{{unacceptable_type,{table_type_name(value)}}}"
    if key == "x-queue-version":
        err = _int_arg(value)
        if err is None and value not in (1, 2):
            return f"{{unacceptable_value,{value}}}"
        return err
    return None  # unknown x- arguments are ignored, as in RabbitMQ


def validate_arguments(args: dict, what: str) -> None:
    for key, value in (args or {}).items():
        err = _check_arg(key, value, args)
        if err:
            raise precondition_failed(f"invalid arg '{key}' for {what}: {err}")


class Queue:
    def __init__(self, vhost, name: str, durable=False, exclusive_owner=None, auto_delete=False,
                 arguments=None, store=None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.owner = exclusive_owner  # the connection of an exclusive queue
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.store = store if store is not None else MemoryQueueStore()
        self.consumers: deque = deque()
        self.unacked_count = 0
        self.next_seq = 0
        self.deleted = False
        self.had_consumers = False
        self.stats = {"publish": 0, "deliver": 0, "deliver_no_ack": 0, "get": 0, "ack": 0, "redeliver": 0}
        self.policy = None

    # identity ----------------------------------------------------------------
    @property
    def exclusive(self) -> bool:
        return self.owner is not None

    @property
    def kind(self) -> str:
        return "queue"

    def describe(self) -> str:
        return rs("queue", self.name, self.vhost.name)

    @property
    def message_count(self) -> int:
        return len(self.store)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def check_equivalent(self, durable, auto_delete, arguments):
        def mismatch(arg, received, current):
            return precondition_failed(
                f"inequivalent arg '{arg}' for {self.describe()}: "
                f"received '{str(received).lower()}' but current is '{str(current).lower()}'")

        if durable != self.durable:
            raise mismatch("durable", durable, self.durable)
        if auto_delete != self.auto_delete:
            raise mismatch("auto_delete", auto_delete, self.auto_delete)
        arguments = arguments or {}
        for key in EQUIVALENCE_ARGS:
            received, current = arguments.get(key), self.arguments.get(key)
            if received != current or type(received) is not type(current) and (
                    isinstance(received, bool) or isinstance(current, bool)):
                def show(v):
                    return "none" if v is None else f"the value '{v}' of type '{table_type_name(v)}'"
                raise precondition_failed(
                    f"inequivalent arg '{key}' for {self.describe()}: "
                    f"received {show(received)} but current is {show(current)}")

    # enqueue and deliver -----------------------------------------------------
    def publish(self, message) -> None:
        """Accept a routed message: hand it straight to a ready consumer, else store it."""
        self.next_seq += 1
        qm = QueuedMessage(self.next_seq, message)
        self.stats["publish"] += 1
        store = self.store
        if self.consumers and not len(store) and self._dispatch(qm):
            return
        store.push(qm)

    def _dispatch(self, qm) -> bool:
        consumers = self.consumers
        for _ in range(len(consumers)):
            consumer = consumers[0]
            consumers.rotate(-1)
            if consumer.ready():
                consumer.channel.deliver(consumer, qm)
                return True
        return False

    def deliver_ready(self) -> None:
        """Push stored messages to consumers while any has credit."""
        store = self.store
        consumers = self.consumers
        while consumers and len(store):
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.ready():
                    consumer.channel.deliver(consumer, store.pop())
                    break
            else:
                return

    def get(self):
        """basic.get: the next ready message, or None."""
        qm = self.store.pop()
        if qm is not None:
            self.stats["get"] += 1
        return qm

    # settlement --------------------------------------------------------------
    def delivered(self, qm, no_ack: bool) -> None:
        if no_ack:
            self.store.settle(qm)
        else:
            self.unacked_count += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def ack(self, qm) -> None:
        self.unacked_count -= 1
        self.stats["ack"] += 1
        if not self.deleted:
            self.store.settle(qm)

    def reject(self, qm, requeue: bool) -> None:
        self.unacked_count -= 1
        if self.deleted:
            return
        if requeue:
            qm.redelivered = True
            self.store.requeue(qm)
        else:
            self.store.settle(qm)

    def purge(self) -> int:
        return self.store.purge()

    # consumers ---------------------------------------------------------------
    def add_consumer(self, consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    @property
    def unused_auto_delete(self) -> bool:
        return self.auto_delete and self.had_consumers and not self.consumers
