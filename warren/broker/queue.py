"""A queue: ready messages in a store, consumers served round-robin, unacked accounting."""

from collections import deque

from ..store import MemoryQueueStore
from .errors import erl_s, inequivalent, precondition_failed, rs
from .message import QueuedMessage
from ..amqp.codec import table_type_class, table_type_name

# Arguments RabbitMQ compares when a queue is redeclared, in the order it checks them
# (its declare_args() order; x-queue-type is not compared).
EQUIVALENCE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
                    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
                    "x-single-active-consumer")

# RabbitMQ's ?MAX_EXPIRY_TIMER for x-expires and x-message-ttl: ten years in milliseconds.
MAX_EXPIRY = 315360000000

# Arguments of other queue types, which a classic queue refuses.
NOT_CLASSIC_ARGS = frozenset({"x-max-in-memory-length", "x-max-in-memory-bytes", "x-delivery-limit",
                              "x-dead-letter-strategy", "x-max-age", "x-stream-max-segment-size-bytes",
                              "x-initial-cluster-size", "x-queue-leader-locator",
                              "x-quorum-initial-group-size"})


def _int_arg(value):
    if isinstance(value, bool) or not isinstance(value, int):
        return f'"expected integer, got {table_type_name(value)}"'
    return None


def _non_neg_int_arg(value):
    err = _int_arg(value)
    if err is None and value < 0:
        return f"{{value_negative,{value}}}"
    return err


def _expiry_arg(value):
    err = _non_neg_int_arg(value)
    if err is None and value > MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return err


def _str_arg(value):
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    return None


def _check_expires(value, args):
    err = _int_arg(value)
    if err is None and value == 0:
        return "{value_zero,0}"
    return err or _expiry_arg(value)


def _check_dlx_rk(value, args):
    err = _str_arg(value)
    if err is None and "x-dead-letter-exchange" not in args:
        return "routing_key_but_no_dlx_defined"
    return err


def _check_max_priority(value, args):
    err = _non_neg_int_arg(value)
    if err is None and value > 255:
        return f"{{max_value_exceeded,{value}}}"
    return err


def _check_overflow(value, args):
    err = _str_arg(value)
    if err is None and value not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        return "invalid_overflow"
    return err


def _check_queue_mode(value, args):
    err = _str_arg(value)
    if err is None and value not in ("default", "lazy"):
        return f"\"unsupported queue mode '{erl_s(value)}'\""
    return err


def _check_queue_version(value, args):
    err = _int_arg(value)
    if err is None and value not in (1, 2):
        return f"\"unsupported queue version '{value}'\""
    return err


def _check_sac(value, args):
    if not isinstance(value, bool):
        return f"{{unacceptable_type,{table_type_name(value)}}}"
    return None


# RabbitMQ's declare_args(): each present argument is checked in this order.
_CHECKS = (
    ("x-expires", _check_expires),
    ("x-message-ttl", lambda v, a: _expiry_arg(v)),
    ("x-dead-letter-exchange", lambda v, a: _str_arg(v)),
    ("x-dead-letter-routing-key", _check_dlx_rk),
    ("x-max-length", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-length-bytes", lambda v, a: _non_neg_int_arg(v)),
    ("x-max-priority", _check_max_priority),
    ("x-overflow", _check_overflow),
    ("x-queue-mode", _check_queue_mode),
    ("x-queue-version", _check_queue_version),
    ("x-single-active-consumer", _check_sac),
)


def validate_arguments(args: dict, what: str) -> None:
    """Check a new queue's arguments as RabbitMQ 3.10 does; unknown x- arguments are ignored."""
    if not args:
        return
    qtype = args.get("x-queue-type")
    if qtype is not None:
        err = _str_arg(qtype)
        if err is None and qtype != "classic":
            # Warren only has classic queues.
            err = f"\"unsupported queue type '{erl_s(qtype)}'\""
        if err:
            raise precondition_failed(f"invalid arg 'x-queue-type' for {what}: {err}")
    for key, check in _CHECKS:
        if key in args:
            err = check(args[key], args)
            if err:
                raise precondition_failed(f"invalid arg '{key}' for {what}: {err}")
    for key in args:
        if key in NOT_CLASSIC_ARGS:
            raise precondition_failed(f"invalid arg '{key}' for {what} of queue type rabbit_classic_queue")


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
        self.next_seq = getattr(self.store, "max_seq", 0)  # continue after recovered messages
        self.deleted = False
        self.had_consumers = False
        # Message counters (warren.mgmt.stats turns them into RabbitMQ's message_stats and rates).
        self.stats = {"publish": 0, "deliver": 0, "deliver_no_ack": 0, "get": 0, "get_no_ack": 0,
                      "get_empty": 0, "ack": 0, "redeliver": 0}
        self.policy = None  # the warren.broker.policy.Policy that applies (set by the vhost)
        self.operator_policy = None

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
        if durable != self.durable:
            raise inequivalent(self.describe(), "durable", durable, self.durable)
        if auto_delete != self.auto_delete:
            raise inequivalent(self.describe(), "auto_delete", auto_delete, self.auto_delete)
        arguments = arguments or {}
        for key in EQUIVALENCE_ARGS:
            received, current = arguments.get(key), self.arguments.get(key)
            if received is None and current is None:
                continue
            if received is not None and current is not None:
                if received == current and table_type_class(received) == table_type_class(current):
                    continue
                shown_received, shown_current = f"'{erl_s(received)}'", f"'{erl_s(current)}'"
            else:
                def show(v):
                    return "none" if v is None else f"the value '{erl_s(v)}' of type '{table_type_name(v)}'"
                shown_received, shown_current = show(received), show(current)
            raise precondition_failed(f"inequivalent arg '{key}' for {self.describe()}: "
                                      f"received {shown_received} but current is {shown_current}")

    # enqueue and deliver -----------------------------------------------------
    def publish(self, message) -> int:
        """Accept a routed message: hand it straight to a ready consumer, else store it.
        Returns the store batch a publisher confirm must wait for (0: none)."""
        self.next_seq += 1
        qm = QueuedMessage(self.next_seq, message)
        self.stats["publish"] += 1
        store = self.store
        batch = store.accept(qm)
        if self.consumers and not len(store) and self._dispatch(qm):
            return batch
        store.push(qm)
        return batch

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
        if qm is None:
            self.stats["get_empty"] += 1
        return qm

    # settlement --------------------------------------------------------------
    def delivered(self, qm, no_ack: bool, get: bool = False) -> None:
        """qm was handed out by a consumer delivery (or basic.get when `get`)."""
        qm.deliveries += 1
        if no_ack:
            self.store.settle(qm)
            self.stats["get_no_ack" if get else "deliver_no_ack"] += 1
        else:
            self.unacked_count += 1
            self.store.delivered(qm)
            self.stats["get" if get else "deliver"] += 1
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
