"""One AMQP channel: assembles published content, runs the channel's methods against the
broker model, and tracks deliveries, acks, transactions and publisher confirms."""

import logging
import struct
from collections import deque

from ..amqp import spec
from ..amqp.codec import DecodeError, read_shortstr
from ..amqp.constants import BASIC, BASIC_ACK, BASIC_PUBLISH, FRAME_HEADER, FRAME_METHOD, NO_ROUTE
from ..amqp.frames import ack_frame, content_frames, deliver_frame, deliver_prefix, get_ok_frame, nack_frame
from ..amqp.properties import FLAG_EXPIRATION, FLAG_USER_ID, decode_properties, parse_header
from ..broker.consumer import Consumer
from ..broker.errors import (
    AMQPError, access_refused, channel_error, command_invalid, not_allowed, not_found,
    not_implemented, precondition_failed, rs, unexpected_frame,
)
from ..broker.exchanges import TYPES
from ..broker.message import Message, check_properties
from ..broker.vhost import server_named
from . import frame_errors

log = logging.getLogger("warren.channel")

_HH = struct.Struct(">HH")
_QB = struct.Struct(">QB")
_I = struct.Struct(">I")
_CHANNEL_CLOSE, _CHANNEL_CLOSE_OK = (20 << 16) | 40, (20 << 16) | 41
_CHANNEL_OPEN = (20 << 16) | 10
_CHECKED_PROPS = FLAG_USER_ID | FLAG_EXPIRATION  # properties a publish is refused for

OPEN, CLOSING = 0, 1


class Channel:
    def __init__(self, connection, channel_id: int):
        self.conn = connection
        self.id = channel_id
        self.state = OPEN
        self.vhost = connection.vhost
        self.user = connection.user.name
        self.flow_active = True
        self.blocked = not connection.writable
        # content being assembled: [exchange, routing_key, route, mandatory, header, parts, remaining]
        self.publishing = None
        self.consumers: dict = {}
        self.unacked: dict = {}   # delivery tag -> (QueuedMessage, Queue, Consumer | None)
        self.unacked_count = 0     # unacked consumer deliveries (basic.get ones do not count)
        self.delivery_tag = 0
        self.prefetch = 0          # basic.qos global=false: limit for consumers created next
        self.global_prefetch = 0   # basic.qos global=true: limit shared by the channel
        self.confirm = False
        self.publish_seq = 0       # last publish sequence number handed out in confirm mode
        self.confirmed = 0         # last sequence number acked to the publisher
        self.sync_waits = deque()  # (sequence number, persister batch) not yet fsynced
        self._last_route = (None, "", "")
        self._last_header = b""
        self.tx = None             # list of deferred actions while in tx mode
        self.last_queue = ""       # for the empty-queue-name shortcut
        self.writable_exchanges: set = set()
        # Message counters (warren.mgmt.stats: RabbitMQ's channel message_stats); folded into
        # broker.message_totals when the channel closes.
        self.stats = {"publish": 0, "confirm": 0, "return_unroutable": 0, "drop_unroutable": 0,
                      "deliver": 0, "deliver_no_ack": 0, "get": 0, "get_no_ack": 0, "get_empty": 0,
                      "ack": 0, "redeliver": 0}

    # ----------------------------------------------------------------- frames
    def method_frame(self, payload) -> None:
        if len(payload) < 4:
            raise frame_errors.unknown_frame(FRAME_METHOD, payload)
        if self.state == CLOSING:
            self._closing_frame(payload)
            return
        if self.publishing is not None:
            raise _content_expected(self.publishing, "header" if self.publishing[4] is None else "body")
        method_id = _I.unpack_from(payload, 0)[0]
        try:
            if method_id == BASIC_PUBLISH:
                self._start_publish(payload)
            elif method_id == BASIC_ACK:
                if len(payload) != 13:
                    raise frame_errors.cannot_decode(payload, 60, 80)
                tag, bits = _QB.unpack_from(payload, 4)
                self._ack(tag, bool(bits & 1))
            else:
                method = self.conn.decode(payload)
                if method is not None:
                    self._dispatch(method)
        except AMQPError as err:
            self.error(err, *_HH.unpack_from(payload, 0))

    def header_frame(self, payload) -> None:
        if self.state == CLOSING:
            return
        pub = self.publishing
        if pub is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        if pub[4] is not None:
            raise _content_expected(pub, "body")
        try:
            class_id, body_size, flags = parse_header(payload)
        except DecodeError:
            raise frame_errors.unknown_frame(FRAME_HEADER, payload) from None
        if class_id != BASIC:
            err = unexpected_frame(f"expected content header for class 60, got one for class {class_id} instead")
            err.method_ids = (60, 40)
            raise err
        header = bytes(payload)
        if header == self._last_header:
            header = self._last_header  # one shared copy for a run of alike messages
        else:
            self._last_header = header
        pub[4] = header
        pub[6] = body_size
        max_size = self.conn.broker.limits.max_message_size
        if body_size > max_size:
            self.publishing = None
            self.error(precondition_failed(
                f"message size {body_size} is larger than configured max size {max_size}"), 60, 40)
            return
        if body_size == 0:
            self._publish_complete(b"")

    def body_frame(self, payload) -> None:
        if self.state == CLOSING:
            return
        pub = self.publishing
        if pub is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        if pub[4] is None:
            raise _content_expected(pub, "header")
        remaining = pub[6] - len(payload)
        if remaining < 0:
            # RabbitMQ 3.10 silently waits for more (the next method frame then fails): Warren
            # says what is wrong at once.
            err = unexpected_frame(f"content body of {len(payload)} bytes exceeds the {pub[6]} bytes "
                                   "left of the size in the content header")
            err.method_ids = (60, 40)
            raise err
        if remaining == 0 and not pub[5]:
            self._publish_complete(bytes(payload))
            return
        pub[5].append(bytes(payload))
        pub[6] = remaining
        if remaining == 0:
            self._publish_complete(b"".join(pub[5]))

    def _closing_frame(self, payload) -> None:
        # After we sent channel.close, everything but close/close-ok is dropped.
        method_id = _I.unpack_from(payload, 0)[0]
        if method_id == _CHANNEL_CLOSE_OK:
            self.conn.channel_closed(self)
        elif method_id == _CHANNEL_CLOSE:
            # Both sides closed at once: answer, and (as RabbitMQ) still wait for our close-ok.
            self.send(spec.ChannelCloseOk())
        elif method_id == _CHANNEL_OPEN:
            # Reopened without our close-ok (rabbitpy does this): RabbitMQ's connection error.
            err = channel_error("second 'channel.open' seen")
            err.method_ids = (20, 10)
            raise err

    # ---------------------------------------------------------------- helpers
    def send(self, method) -> None:
        self.conn.send_method(self.id, method)

    def error(self, err: AMQPError, class_id: int = 0, method_id: int = 0) -> None:
        """Close the channel (soft error) or the connection (hard error) with RabbitMQ's code."""
        if err.closes_connection:
            self.conn.connection_error(err, *getattr(err, "method_ids", (class_id, method_id)))
            return
        log.info("channel %s:%d error: %s", self.conn.name, self.id, err.reply_text)
        self.release()
        self.state = CLOSING
        self.send(spec.ChannelClose(reply_code=err.code, reply_text=err.reply_text,
                                    class_id=class_id, method_id=method_id))

    def _queue_name(self, name: str) -> str:
        if name == "":
            if self.last_queue == "":
                raise not_found("no previously declared queue")
            return self.last_queue
        return name

    def _queue(self, name: str):
        return self.vhost.queue(self._queue_name(name))

    def _check(self, what, kind, name):
        self.conn.broker.check(self.user, self.vhost.name, what, kind, name)

    def _dispatch(self, method) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise command_invalid("unimplemented method")  # RabbitMQ's words, e.g. for a client's cancel-ok
        handler(self, method)

    # --------------------------------------------------------------- channel
    def _channel_open(self, m):
        raise channel_error("second 'channel.open' seen")

    def _channel_flow(self, m):
        if not m.active:
            raise not_implemented("active=false")
        self.send(spec.ChannelFlowOk(active=True))

    def _channel_close(self, m):
        self.release()
        self.send(spec.ChannelCloseOk())
        self.conn.channel_closed(self)

    # -------------------------------------------------------------- exchange
    def _exchange_declare(self, m):
        vhost = self.vhost
        name = m.exchange
        if not m.passive and m.type not in TYPES:
            # RabbitMQ checks the type first (before the name); "" is a known Erlang atom
            # but no exchange type, hence its different text.
            raise command_invalid(f"{'invalid' if m.type == '' else 'unknown'} exchange type '{m.type}'")
        if name == "":
            raise access_refused("operation not permitted on the default exchange")
        if m.passive:
            vhost.exchange(name)
        else:
            self._check("configure", "exchange", name)
            ae = (m.arguments or {}).get("alternate-exchange")
            if name not in vhost.exchanges and isinstance(ae, str) and not name.startswith("amq."):
                # RabbitMQ: an AE needs read on the exchange and write on the AE (checked
                # after the amq.* name rule, which declare_exchange applies).
                self._check("read", "exchange", name)
                self._check("write", "exchange", ae)
            vhost.declare_exchange(name, m.type, m.durable, m.auto_delete, m.internal, m.arguments)
        if not m.nowait:
            self.send(spec.ExchangeDeclareOk())

    def _exchange_delete(self, m):
        name = m.exchange
        if name == "":
            raise access_refused("operation not permitted on the default exchange")
        if name.startswith("amq."):  # RabbitMQ refuses this even for a missing amq.* name
            raise access_refused(f"deletion of system {rs('exchange', name, self.vhost.name)} not allowed")
        self._check("configure", "exchange", name)
        self.vhost.delete_exchange(name, m.if_unused)
        if not m.nowait:
            self.send(spec.ExchangeDeleteOk())

    def _exchange_bind(self, m, unbind=False):
        vhost = self.vhost
        # RabbitMQ's order: write on the destination, the default-exchange rule, read on the source.
        self._check("write", "exchange", m.destination)
        if m.destination == "" or m.source == "":
            raise access_refused("operation not permitted on the default exchange")
        self._check("read", "exchange", m.source)
        if unbind:
            # RabbitMQ 3.10: unbinding is idempotent, even when an exchange is missing.
            source = vhost.exchanges.get(m.source)
            dest = vhost.exchanges.get(m.destination)
            if source is not None and dest is not None:
                vhost.unbind(source, dest, m.routing_key, m.arguments)
            if not m.nowait:
                self.send(spec.ExchangeUnbindOk())
            return
        source = vhost.exchange(m.source)
        dest = vhost.exchange(m.destination)
        vhost.bind(source, dest, m.routing_key, m.arguments)
        if not m.nowait:
            self.send(spec.ExchangeBindOk())

    def _exchange_unbind(self, m):
        self._exchange_bind(m, unbind=True)

    # ----------------------------------------------------------------- queue
    def _queue_declare(self, m):
        vhost = self.vhost
        conn = self.conn
        if m.passive:
            q = vhost.queue(m.queue)  # no empty-name shortcut for a passive declare (as RabbitMQ)
            vhost.check_exclusive(q, conn)
        else:
            name = m.queue
            if name == "":
                name = server_named("amq.gen-")
            elif name.startswith("amq."):
                raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
            self._check("configure", "queue", name)
            args = m.arguments or {}
            dlx = args.get("x-dead-letter-exchange")
            if name not in vhost.queues and dlx is not None:
                if not isinstance(dlx, (str, bytes)):
                    from ..amqp.codec import table_type_name
                    raise precondition_failed(f"invalid type '{table_type_name(dlx)}' for arg "
                                              f"'x-dead-letter-exchange' in {rs('queue', name, vhost.name)}")
                self._check("read", "queue", name)
                self._check("write", "exchange", dlx)
            owner = conn if m.exclusive else None
            durable = m.durable and not m.exclusive
            q, created = vhost.declare_queue(name, durable, owner, m.auto_delete, args)
            if created and owner is not None:
                conn.exclusive_queues.append(q)
        self.last_queue = q.name
        if not m.nowait:
            self.send(spec.QueueDeclareOk(queue=q.name, message_count=q.message_count,
                                          consumer_count=q.consumer_count))

    def _queue_bind(self, m, unbind=False):
        vhost = self.vhost
        qname = self._queue_name(m.queue)
        routing_key = m.routing_key
        if m.queue == "" and routing_key == "":
            routing_key = qname  # RabbitMQ's shortcut: empty key on the last queue uses its name
        self._check("write", "queue", qname)  # before the default-exchange rule, as RabbitMQ
        if m.exchange == "":
            raise access_refused("operation not permitted on the default exchange")
        self._check("read", "exchange", m.exchange)
        if unbind:
            # RabbitMQ 3.10: unbinding is idempotent, even when the queue or exchange is missing.
            q = vhost.queues.get(qname)
            x = vhost.exchanges.get(m.exchange)
            if q is not None and x is not None:
                vhost.check_exclusive(q, self.conn)
                vhost.unbind(x, q, routing_key, m.arguments)
            self.send(spec.QueueUnbindOk())
            return
        x = vhost.exchange(m.exchange)  # like RabbitMQ, a missing source is reported first
        q = vhost.queue(qname)
        vhost.check_exclusive(q, self.conn)
        vhost.bind(x, q, routing_key, m.arguments)
        if not m.nowait:
            self.send(spec.QueueBindOk())

    def _queue_unbind(self, m):
        self._queue_bind(m, unbind=True)

    def _queue_purge(self, m):
        name = self._queue_name(m.queue)
        self._check("read", "queue", name)  # permission first: a missing queue is a 403 too
        q = self.vhost.queue(name)
        self.vhost.check_exclusive(q, self.conn)
        count = q.purge()
        if not m.nowait:
            self.send(spec.QueuePurgeOk(message_count=count))

    def _queue_delete(self, m):
        vhost = self.vhost
        name = self._queue_name(m.queue)
        self._check("configure", "queue", name)
        q = vhost.queues.get(name)
        count = 0
        if q is not None:
            vhost.check_exclusive(q, self.conn)
            if m.if_unused and q.consumers:
                raise precondition_failed(f"{q.describe()} in use")
            if m.if_empty and q.message_count:
                raise precondition_failed(f"{q.describe()} not empty")
            count = vhost.delete_queue(q)
        if not m.nowait:
            self.send(spec.QueueDeleteOk(message_count=count))

    # ----------------------------------------------------------------- basic
    def _basic_qos(self, m):
        if m.prefetch_size != 0:
            raise not_implemented(f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            if not self.global_prefetch:
                # RabbitMQ's limiter starts from everything unacked on the channel, basic.get
                # deliveries included (their acks never count down).
                self.unacked_count = len(self.unacked)
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
            self.global_prefetch = 0  # as in RabbitMQ 3.10: a per-consumer qos lifts the channel limit
        self.send(spec.BasicQosOk())
        self.kick_queues()

    def _basic_consume(self, m):
        name = self._queue_name(m.queue)
        self._check("read", "queue", name)  # permission first: a missing queue is a 403 too
        q = self.vhost.queue(name)
        self.vhost.check_exclusive(q, self.conn)
        tag = m.consumer_tag or server_named("amq.ctag-")
        if tag in self.consumers:
            raise not_allowed(f"attempt to reuse consumer tag '{tag}'")
        if q.has_exclusive_consumer() or (m.exclusive and q.consumers):
            raise access_refused(f"{q.describe()} in exclusive use")
        consumer = Consumer(tag, self, q, m.no_ack, m.exclusive, m.arguments, self.prefetch,
                            deliver_prefix(tag))
        self.consumers[tag] = consumer
        q.add_consumer(consumer)
        if not m.nowait:
            self.send(spec.BasicConsumeOk(consumer_tag=tag))
        q.deliver_ready()

    def _basic_cancel(self, m):
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            self._drop_consumer(consumer)
        if not m.nowait:
            self.send(spec.BasicCancelOk(consumer_tag=m.consumer_tag))

    def _drop_consumer(self, consumer) -> None:
        q = consumer.queue
        q.remove_consumer(consumer)
        if q.unused_auto_delete and not q.deleted:
            q.vhost.delete_queue(q)

    def consumer_cancelled_by_broker(self, consumer) -> None:
        """The queue went away: tell clients that asked for consumer_cancel_notify."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.conn.capabilities.get("consumer_cancel_notify"):
            self.send(spec.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    def _basic_get(self, m):
        name = self._queue_name(m.queue)
        self._check("read", "queue", name)  # permission first: a missing queue is a 403 too
        q = self.vhost.queue(name)
        self.vhost.check_exclusive(q, self.conn)
        qm = q.get()
        if qm is None:
            self.stats["get_empty"] += 1
            self.send(spec.BasicGetEmpty(cluster_id=""))
            return
        self.delivery_tag += 1
        tag = self.delivery_tag
        msg = qm.message
        conn = self.conn
        out = conn.out
        out.append(get_ok_frame(self.id, tag, qm.redelivered, msg.route, q.message_count))
        content_frames(out, self.id, msg.header, msg.body, conn.frame_max)
        conn.note_output(len(msg.body))
        if not m.no_ack:
            # Not counted against the channel's prefetch, as in RabbitMQ.
            self.unacked[tag] = (qm, q, None)
        q.delivered(qm, m.no_ack, True)
        self.stats["get_no_ack" if m.no_ack else "get"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def _basic_ack(self, m):
        self._ack(m.delivery_tag, m.multiple)

    def _basic_reject(self, m):
        self._settle(self._take_unacked(m.delivery_tag, False), requeue=m.requeue, ack=False)

    def _basic_nack(self, m):
        self._settle(self._take_unacked(m.delivery_tag, m.multiple), requeue=m.requeue, ack=False)

    def _basic_recover(self, m):
        if not m.requeue:
            raise not_implemented("requeue=false")
        self.requeue_unacked()
        if isinstance(m, spec.BasicRecover):
            self.send(spec.BasicRecoverOk())

    # ------------------------------------------------------------- publish
    def _start_publish(self, payload) -> None:
        # Publishers mostly repeat the exchange and routing key: reuse the decoded strings
        # and the route bytes (also shared by every queued copy) when they do.
        route = bytes(payload[6:-1])
        cached = self._last_route
        if cached[0] == route and len(payload) > 6:
            bits = payload[-1]
            if bits & 2:
                raise not_implemented("immediate=true")
            self.publishing = [cached[1], cached[2], cached[0], bool(bits & 1), None, [], 0]
            return
        pos = 6
        try:
            exchange, pos = read_shortstr(payload, pos)
            routing_key, pos = read_shortstr(payload, pos)
            bits = payload[pos]
            if pos + 1 != len(payload):
                raise DecodeError("bytes after the basic.publish fields")
        except (IndexError, DecodeError) as err:
            self.conn.decode_failed(payload, err if isinstance(err, DecodeError) else DecodeError())
            return
        if bits & 2:
            raise not_implemented("immediate=true")
        # The exchange and routing key shortstrs, reused verbatim in deliver/get-ok/return.
        self._last_route = (route, exchange, routing_key)
        self.publishing = [exchange, routing_key, route, bool(bits & 1), None, [], 0]

    def _publish_complete(self, body: bytes) -> None:
        exchange_name, routing_key, route, mandatory, header, _, _ = self.publishing
        self.publishing = None
        try:
            self.publish(exchange_name, routing_key, route, mandatory, header, body)
        except AMQPError as err:
            self.error(err, 60, 40)

    def publish(self, exchange_name, routing_key, route, mandatory, header, body) -> None:
        vhost = self.vhost
        x = vhost.exchanges.get(exchange_name)
        # The cache is by name: an exchange redeclared internal under that name must still refuse.
        if x is None or exchange_name not in self.writable_exchanges or x.internal:
            self._check("write", "exchange", exchange_name)  # before the lookup, as RabbitMQ
            if x is None:
                raise not_found(f"no {rs('exchange', exchange_name, vhost.name)}")
            if x.internal:
                raise access_refused(f"cannot publish to internal {x.describe()}")
            self.writable_exchanges.add(exchange_name)
        if (header[12] << 8 | header[13]) & _CHECKED_PROPS:
            self._check_properties(header)
        message = Message(exchange_name, routing_key, route, header, body)
        queues = vhost.route(x, routing_key, message)
        self.stats["publish"] += 1
        xstats = x.stats
        xstats["publish_in"] += 1
        xstats["publish_out"] += len(queues)
        if self.tx is not None:
            self.tx.append(("publish", queues, message, mandatory))
            return
        batch = 0
        if queues:
            for q in queues:
                b = q.publish(message)
                if b > batch:
                    batch = b
        elif mandatory:
            self._return(message, NO_ROUTE, "NO_ROUTE")
        else:
            self.stats["drop_unroutable"] += 1
        if self.confirm:
            self.publish_seq += 1
            if batch:
                # Persistent message in a durable queue: confirmed once its batch is fsynced.
                self.sync_waits.append((self.publish_seq, batch))
                self.conn.broker.persister.wait_for(self)
            else:
                self.conn.confirming.add(self)

    def _check_properties(self, header) -> None:
        """user_id and expiration, checked after the exchange as RabbitMQ does."""
        check_properties(decode_properties(header), self.conn.user)

    def _return(self, message, code, text) -> None:
        self.stats["return_unroutable"] += 1
        conn = self.conn
        payload = _HH.pack(60, 50) + struct.pack(">H", code) + bytes((len(text),)) + text.encode() + message.route
        out = conn.out
        out.append(struct.pack(">BHI", 1, self.id, len(payload)) + payload + b"\xce")
        content_frames(out, self.id, message.header, message.body, conn.frame_max)
        conn.schedule_flush()

    def emit_confirms(self) -> None:
        """Acknowledge every publish confirmed since the last call, in one basic.ack
        (basic.nack for a publish whose write or fsync failed)."""
        if self.state != OPEN:
            return
        upto = self.publish_seq
        waits = self.sync_waits
        if waits:
            persister = self.conn.broker.persister
            while waits and waits[0][1] <= persister.synced:
                seq, batch = waits.popleft()
                if batch in persister.failed:
                    self._send_ack(seq - 1)
                    self.conn.out.append(nack_frame(self.id, seq, False))
                    self.confirmed = seq
            if waits:
                upto = waits[0][0] - 1
                persister.wait_for(self)
        self._send_ack(upto)

    def _send_ack(self, upto: int) -> None:
        if upto > self.confirmed:
            self.conn.out.append(ack_frame(self.id, upto, upto - self.confirmed > 1))
            self.stats["confirm"] += upto - self.confirmed
            self.confirmed = upto

    def store_synced(self) -> None:
        """The persister finished an fsync: some waiting confirms may be due."""
        if self.state == OPEN:
            self.conn.confirming.add(self)
            self.conn.schedule_flush()

    def _confirm_select(self, m):
        if self.tx is not None:
            raise precondition_failed("cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.send(spec.ConfirmSelectOk())

    # --------------------------------------------------------------- deliver
    def deliver(self, consumer, qm) -> None:
        """Send one message to a consumer on this channel (called by the queue)."""
        self.delivery_tag += 1
        tag = self.delivery_tag
        msg = qm.message
        conn = self.conn
        out = conn.out
        out.append(deliver_frame(self.id, consumer.prefix, tag, qm.redelivered, msg.route))
        content_frames(out, self.id, msg.header, msg.body, conn.frame_max)
        queue = consumer.queue
        if consumer.no_ack:
            queue.delivered(qm, True)
            self.stats["deliver_no_ack"] += 1
        else:
            self.unacked[tag] = (qm, queue, consumer)
            consumer.unacked += 1
            self.unacked_count += 1
            queue.delivered(qm, False)
            self.stats["deliver"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1
        conn.note_output(len(msg.body) + 64)

    def update_blocked(self) -> None:
        self.blocked = not (self.flow_active and self.conn.writable)

    def kick_queues(self) -> None:
        """Credit may have been freed: let the queues we consume from deliver again."""
        for queue in {c.queue for c in self.consumers.values()}:
            queue.deliver_ready()

    # ------------------------------------------------------------------ acks
    def _take_unacked(self, tag: int, multiple: bool) -> list:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.items())
                unacked.clear()
                return taken
            if tag not in unacked:
                raise precondition_failed(f"unknown delivery tag {tag}")
            taken = []
            for t in unacked:
                if t > tag:
                    break
                taken.append(t)
            return [(t, unacked.pop(t)) for t in taken]
        entry = unacked.pop(tag, None)
        if entry is None:
            raise precondition_failed(f"unknown delivery tag {tag}")
        return [(tag, entry)]

    def _ack(self, tag: int, multiple: bool) -> None:
        taken = self._take_unacked(tag, multiple)
        if self.tx is not None:
            self.tx.append(("ack", taken))
            return
        self._settle(taken, requeue=False, ack=True)

    def _settle(self, taken, requeue: bool, ack: bool) -> None:
        if not ack and self.tx is not None:
            self.tx.append(("reject", taken, requeue))
            return
        queues = set()
        for _tag, (qm, queue, consumer) in taken:
            if consumer is not None:
                consumer.unacked -= 1
                self.unacked_count -= 1
            if ack:
                queue.ack(qm)
            else:
                queue.reject(qm, requeue)
            queues.add(queue)
        if ack:
            self.stats["ack"] += len(taken)
        for queue in queues:
            queue.deliver_ready()
        if self.global_prefetch:
            self.kick_queues()

    def requeue_unacked(self) -> None:
        taken = list(self.unacked.items())
        self.unacked.clear()
        self._settle_now(taken, requeue=True)

    def _settle_now(self, taken, requeue):
        tx, self.tx = self.tx, None
        try:
            self._settle(taken, requeue=requeue, ack=False)
        finally:
            self.tx = tx

    # -------------------------------------------------------------------- tx
    def _tx_select(self, m):
        if self.confirm:
            raise precondition_failed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = []
        self.send(spec.TxSelectOk())

    def _tx_commit(self, m):
        if self.tx is None:
            raise precondition_failed("channel is not transactional")
        actions, self.tx = self.tx, None
        durable_writes = False
        try:
            for action in actions:
                if action[0] == "publish":
                    _, queues, message, mandatory = action
                    live = [q for q in queues if not q.deleted]
                    if live:
                        for q in live:
                            durable_writes |= bool(q.publish(message))
                    elif mandatory:
                        self._return(message, NO_ROUTE, "NO_ROUTE")
                elif action[0] == "ack":
                    self._settle(action[1], requeue=False, ack=True)
                else:
                    self._settle(action[1], requeue=action[2], ack=False)
        finally:
            self.tx = []
        if durable_writes and not self.conn.broker.persister.sync_now():
            # RabbitMQ has no tx nack: a failed write is an internal error.
            raise AMQPError(541, "cannot write the committed messages to disk")
        self.send(spec.TxCommitOk())

    def _tx_rollback(self, m):
        if self.tx is None:
            raise precondition_failed("channel is not transactional")
        self._tx_restore_unacked()
        self.tx = []
        self.send(spec.TxRollbackOk())

    def _tx_restore_unacked(self) -> None:
        """Acks and rejects taken in the open transaction become outstanding again."""
        restored = False
        for action in self.tx:
            if action[0] in ("ack", "reject"):
                for tag, entry in action[1]:
                    self.unacked[tag] = entry
                    restored = True
        if restored:
            self.unacked = dict(sorted(self.unacked.items()))

    # --------------------------------------------------------------- release
    def release(self) -> None:
        """The channel is closing: cancel its consumers and requeue what it holds."""
        if self.state == CLOSING:
            return
        totals = self.conn.broker.message_totals  # the overview's counters outlive the channel
        for key, value in self.stats.items():
            totals[key] = totals.get(key, 0) + value
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self._drop_consumer(consumer)
        if self.tx:
            self._tx_restore_unacked()  # uncommitted acks did not happen: requeue those too
        self.tx = None
        self.publishing = None
        if self.unacked:
            self.requeue_unacked()
        self.state = CLOSING
        self.conn.confirming.discard(self)


_HANDLERS = {
    spec.ChannelOpen: Channel._channel_open,
    spec.ChannelFlow: Channel._channel_flow,
    spec.ChannelClose: Channel._channel_close,
    spec.ExchangeDeclare: Channel._exchange_declare,
    spec.ExchangeDelete: Channel._exchange_delete,
    spec.ExchangeBind: Channel._exchange_bind,
    spec.ExchangeUnbind: Channel._exchange_unbind,
    spec.QueueDeclare: Channel._queue_declare,
    spec.QueueBind: Channel._queue_bind,
    spec.QueueUnbind: Channel._queue_unbind,
    spec.QueuePurge: Channel._queue_purge,
    spec.QueueDelete: Channel._queue_delete,
    spec.BasicQos: Channel._basic_qos,
    spec.BasicConsume: Channel._basic_consume,
    spec.BasicCancel: Channel._basic_cancel,
    spec.BasicGet: Channel._basic_get,
    spec.BasicAck: Channel._basic_ack,
    spec.BasicReject: Channel._basic_reject,
    spec.BasicNack: Channel._basic_nack,
    spec.BasicRecover: Channel._basic_recover,
    spec.BasicRecoverAsync: Channel._basic_recover,
    spec.ConfirmSelect: Channel._confirm_select,
    spec.TxSelect: Channel._tx_select,
    spec.TxCommit: Channel._tx_commit,
    spec.TxRollback: Channel._tx_rollback,
}


def _content_expected(publishing, what: str) -> AMQPError:
    """505 for a frame other than the content a basic.publish still waits for."""
    if what == "header":
        err = unexpected_frame("expected content header for class 60, got non content header frame instead")
    else:
        err = unexpected_frame("expected content body, got non content body frame instead")
    err.method_ids = (60, 40)
    return err
