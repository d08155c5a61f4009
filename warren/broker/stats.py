"""The message and traffic counters the model keeps, each name declared once.

Queues, exchanges and channels count in plain dicts of ints, made here, because they are
incremented on the hot path (`stats["publish"] += 1`); a connection counts its traffic in
attributes of the same names. Everything that reports them (the management API's
warren.mgmt.stats, and later a Prometheus endpoint and the web page) reads them through the
tuples below, so a new counter is added in one place. The names are RabbitMQ's
message_stats fields, in its order.
"""

QUEUE_COUNTERS: tuple[str, ...] = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty",
                                   "ack", "redeliver")
# Messages that left a queue for good other than by ack, by reason (RabbitMQ's
# messages_dead_lettered_<reason>_total, per queue): republished to the DLX, or dropped
# (no DLX, a missing one, or a cycle).
QUEUE_DEAD_LETTER_COUNTERS: tuple[str, ...] = tuple(
    f"{fate}_{reason}" for fate in ("dead_lettered", "dropped")
    for reason in ("rejected", "expired", "maxlen", "delivery_limit"))
CHANNEL_COUNTERS: tuple[str, ...] = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver",
                                     "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver")
# publish_out counts one per queue a message was routed to, as RabbitMQ.
EXCHANGE_COUNTERS: tuple[str, ...] = ("publish_in", "publish_out")
# Attributes of warren.session.connection.Connection: bytes and reads in, bytes and writes out.
CONNECTION_COUNTERS: tuple[str, ...] = ("recv_oct", "recv_cnt", "send_oct", "send_cnt")
# RabbitMQ's derived deliver_get is the sum of these.
DELIVER_GET: tuple[str, ...] = ("deliver", "deliver_no_ack", "get", "get_no_ack")


def new_queue_counters() -> dict[str, int]:
    return dict.fromkeys(QUEUE_COUNTERS + QUEUE_DEAD_LETTER_COUNTERS, 0)


def new_channel_counters() -> dict[str, int]:
    return dict.fromkeys(CHANNEL_COUNTERS, 0)


def new_exchange_counters() -> dict[str, int]:
    return dict.fromkeys(EXCHANGE_COUNTERS, 0)
