"""A consumer: a subscription of one channel to one queue, with its own prefetch credit."""


class Consumer:
    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix")

    def __init__(self, tag, channel, queue, no_ack, exclusive, arguments, prefetch, prefix):
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments or {}
        self.prefetch = prefetch  # per-consumer limit (basic.qos global=false), 0 = none
        self.unacked = 0
        self.prefix = prefix  # the constant start of this consumer's basic.deliver payload

    def ready(self) -> bool:
        """Whether a message may be pushed to this consumer now."""
        ch = self.channel
        if ch.blocked:
            return False
        if self.no_ack:
            return True  # as in RabbitMQ, prefetch limits only apply to acked deliveries
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not (ch.global_prefetch and ch.unacked_count >= ch.global_prefetch)
