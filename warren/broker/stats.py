"""The message and traffic counters the model keeps, each name declared once.

Queues, exchanges and channels count in plain dicts of ints, made here, because they are
incremented on the hot path (`stats["publish"] += 1`); a connection counts its traffic in
attributes of the same names. Everything that reports them (the management API's
warren.mgmt.stats, the Prometheus endpoint's warren.mgmt.metrics, and the web page) reads
them through the tuples below, so a new counter is added in one place. The names are
RabbitMQ's message_stats fields, in its order.

Node-wide totals must never go down (Prometheus counters): what a deleted queue or exchange,
or a closed connection, had counted is kept in the broker's RetiredCounters (a closed
channel's in broker.stats.message_totals), and the events RabbitMQ counts per node (connections and
channels opened and closed, queues declared, created and deleted, logins) are counted where
they happen, in broker.stats.node_counters: never per message.
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
# Events per node, in broker.stats.node_counters (RabbitMQ's rabbitmq_connections_opened_total ...
# rabbitmq_queues_deleted_total and rabbitmq_auth_attempts_{succeeded,failed}_total).
NODE_COUNTERS: tuple[str, ...] = ("connections_opened", "connections_closed", "channels_opened", "channels_closed",
                                  "queues_declared", "queues_created", "queues_deleted",
                                  "auth_attempts_succeeded", "auth_attempts_failed")
# A closed channel's publishes in confirm mode (its last sequence number), kept in
# broker.stats.message_totals beside the CHANNEL_COUNTERS (RabbitMQ's messages_received_confirm).
RECEIVED_CONFIRM = "received_confirm"
# RabbitMQ's derived deliver_get is the sum of these.
DELIVER_GET: tuple[str, ...] = ("deliver", "deliver_no_ack", "get", "get_no_ack")


def new_queue_counters() -> dict[str, int]:
    return dict.fromkeys(QUEUE_COUNTERS + QUEUE_DEAD_LETTER_COUNTERS, 0)


def new_channel_counters() -> dict[str, int]:
    return dict.fromkeys(CHANNEL_COUNTERS, 0)


def new_exchange_counters() -> dict[str, int]:
    return dict.fromkeys(EXCHANGE_COUNTERS, 0)


def new_node_counters() -> dict[str, int]:
    return dict.fromkeys(NODE_COUNTERS, 0)


def _add(totals: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value


class RetiredCounters:
    """The counters of the queues and exchanges deleted and the connections closed so far,
    so the node's totals (the sum over the live objects plus these) only grow."""

    __slots__ = ("queues", "exchanges", "connections")

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, int]] = {}  # queue type -> its deleted queues' counters
        self.exchanges = new_exchange_counters()
        self.connections: dict[str, int] = dict.fromkeys(CONNECTION_COUNTERS, 0)

    def queue_deleted(self, queue) -> None:
        totals = self.queues.get(queue.queue_type)
        if totals is None:
            totals = self.queues[queue.queue_type] = new_queue_counters()
        _add(totals, queue.stats)

    def exchange_deleted(self, exchange) -> None:
        stats = getattr(exchange, "stats", None)
        if stats:
            _add(self.exchanges, stats)

    def connection_closed(self, conn) -> None:
        totals = self.connections
        for key in CONNECTION_COUNTERS:
            totals[key] += getattr(conn, key, 0)


class NodeStats:
    """The node's counters: what closed channels counted (message_totals: the overview's
    totals include them), what deleted queues and exchanges and closed connections counted
    (retired), and the node's events (node_counters: connections opened, queues created,
    logins...)."""

    __slots__ = ("message_totals", "retired", "node_counters")

    def __init__(self) -> None:
        self.message_totals: dict[str, int] = {}
        self.retired = RetiredCounters()
        self.node_counters = new_node_counters()
