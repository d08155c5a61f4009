"""One AMQP channel: assembles published content, turns the channel's methods into calls of
the operations layer (warren.broker.ops) and their results into frames, and tracks
deliveries, acks, transactions and publisher confirms."""

from __future__ import annotations

import enum
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..amqp import spec
from ..amqp.codec import DecodeError, read_shortstr
from ..amqp.constants import BASIC, BASIC_ACK, BASIC_PUBLISH, FRAME_HEADER, FRAME_METHOD, NO_ROUTE
from ..amqp.body import Body, BodyAssembly
from ..amqp.frames import ack_frame, content_frames, deliver_frame, deliver_prefix, get_ok_frame, nack_frame
from ..amqp.properties import header_fields, properties_error
from ..broker import ops
from ..broker.consumer import Consumer
from ..broker.credit import Credit
from ..broker.errors import (
    AMQPError, channel_error, command_invalid, not_found, not_implemented,
    precondition_failed, unexpected_frame,
)
from ..broker.stats import RECEIVED_CONFIRM, new_channel_counters
from ..broker.metadata.change import Change, Done
from ..broker.names import server_named
from ..store.settlement import REJECTED, SETTLED, Settlement
from . import connection_log, frame_errors, records
from .ack_timeout import AckTimeout
from .transaction import Transaction, TxPublish

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..broker.broker import Broker
    from ..broker.links import ExclusiveOwner
    from ..broker.records import ChannelCounters, ChannelInfo, ChannelLink
    from ..store.queued_message import QueuedMessage
    from .throttle import Throttle
    from .transaction import Unacked

log = logging.getLogger("warren.channel")

_HH = struct.Struct(">HH")
_QB = struct.Struct(">QB")
_I = struct.Struct(">I")
_CHANNEL_CLOSE, _CHANNEL_CLOSE_OK = (20 << 16) | 40, (20 << 16) | 41
_CHANNEL_OPEN = (20 << 16) | 10
_PUBLISH_IDS = (60, 40)
_route, _enqueue, _settle = ops.route, ops.enqueue, ops.settle


class ChannelState(enum.IntEnum):
    OPEN = 0
    CLOSING = 1  # we sent channel.close (or released it): waiting for close-ok


OPEN, CLOSING = ChannelState.OPEN, ChannelState.CLOSING


class PublishMethod:
    """A basic.publish waiting for its content. Publishers mostly repeat the exchange and
    routing key, so a channel reuses the last one (the decoded names and the route bytes,
    which every queued copy shares and deliveries send verbatim)."""

    __slots__ = ("exchange", "routing_key", "route", "mandatory")

    def __init__(self, exchange: str, routing_key: str, route: bytes, mandatory: bool):
        self.exchange = exchange
        self.routing_key = routing_key
        self.route = route  # the exchange and routing-key shortstrs as received
        self.mandatory = mandatory


class HoldInput(Exception):
    """A channel's change waits for the cluster's log (Channel._change): the connection
    handles no more of its input until release_for_metadata."""


class ChannelConnection(records.RecordedConnection, connection_log.LoggedConnection, Protocol):
    """The connection a channel runs on, as the channel sees it
    (warren.session.connection.Connection, which makes its channels and so imports this module)."""

    broker: Broker
    name: str                   # for the channel's log lines
    out: list[bytes]            # this tick's output: deliveries append their frames here
    confirming: set[Channel]    # channels with confirms to send at the flush
    throttle: Throttle          # its consumers' gate
    capabilities: dict          # the client's, from connection.start-ok
    holds: int                  # its channels' waits for the cluster (Channel._await)
    exclusive_queues: list      # deleted when it closes

    def note_output(self, size: int) -> None:
        """`size` more bytes of output this tick (past the high-water mark its consumers pause)."""

    def hold_delivery(self, start: int, point: Settlement, dropped: Callable[[], None] | None = None) -> None:
        """out[start:] is a replicated queue's delivery: it leaves once `point` is committed
        (warren.session.gated_output); `dropped` runs if it never does."""

    def exclusive_owner(self) -> ExclusiveOwner:
        """How its exclusive queues name it."""

    def send_method(self, channel: int, method: spec.Method) -> None: ...

    def schedule_flush(self) -> None: ...

    def decode(self, payload: bytes) -> spec.Method | None:
        """The method, or None once a failure to decode it was handled."""

    def decode_failed(self, payload: bytes, err: DecodeError) -> None: ...

    def connection_error(self, err: AMQPError, class_id: int = 0, method_id: int = 0, channel: int = 0) -> None: ...

    def channel_closed(self, channel: Channel) -> None: ...

    def hold_for_metadata(self) -> None:
        """A channel waits for the cluster's log: handle no more input until it is done."""

    def release_for_metadata(self) -> None:
        """It is done: handle the input that waited, and send what was answered."""


class Channel:
    def __init__(self, connection: ChannelConnection, channel_id: int):
        self.conn = connection
        self.id = channel_id
        self.state = OPEN
        user, vhost = connection.user, connection.vhost
        assert user is not None and vhost is not None, "a channel opens only on an open connection"
        self.vhost = vhost
        self.user = user.name
        self.actor = ops.Actor(connection.broker, user, vhost, connection.exclusive_owner())
        self.durability = connection.broker.durability
        # The content being assembled: the publish method, then its header and body parts.
        self.publishing: PublishMethod | None = None
        self.content_header: bytes | None = None
        self.body_size = self.body_remaining = 0
        # A body split over several frames: its parts so far (warren.amqp.body).
        self.assembly: BodyAssembly | None = None
        self._last_publish: PublishMethod | None = None
        self._last_header = b""
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict = {}   # delivery tag -> (QueuedMessage, queue, Consumer | None)
        self.delivery_tag = 0
        self.prefetch = 0          # basic.qos global=false: limit for consumers created next
        # basic.qos global=true: the limit shared by the channel's consumers, and the unacked
        # consumer deliveries it counts; each consumer holds this record (warren.broker.credit).
        self.credit = Credit()
        self.confirm = False
        self.publish_seq = 0       # last publish sequence number handed out in confirm mode
        self.confirmed = 0         # last sequence number acked to the publisher
        # (sequence number, settlement handle) of the publishes not yet settled (in order)
        self.sync_waits: deque[tuple[int, Settlement]] = deque()
        self.tx: Transaction | None = None  # while in tx mode
        self.last_queue = ""       # for the empty-queue-name shortcut
        self.held_cancels: list[str] | None = None  # during our own queue.delete: see _queue_delete
        self.ack_timeout: AckTimeout | None = None  # consumer_timeout's check, once something needs an ack
        # Message counters (warren.mgmt.stats: RabbitMQ's channel message_stats); folded into
        # broker.stats.message_totals when the channel closes.
        self.stats = new_channel_counters()

    # ----------------------------------------------------------------- frames
    def method_frame(self, payload) -> None:
        if len(payload) < 4:
            raise frame_errors.unknown_frame(FRAME_METHOD, payload)
        if self.state == CLOSING:
            self._closing_frame(payload)
            return
        if self.publishing is not None:
            raise _content_expected("header" if self.content_header is None else "body")
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
        if self.publishing is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        if self.content_header is not None:
            raise _content_expected("body")
        header = bytes(payload)
        if len(header) >= 14:
            class_id, weight, body_size, flags = header_fields(header)
        elif len(header) >= 12:  # no flags word: the properties check refuses it
            class_id, weight, body_size, flags = *_HH.unpack_from(header, 0), int.from_bytes(header[4:12], "big"), 0
        else:
            raise frame_errors.unknown_frame(FRAME_HEADER, payload)
        fresh = header != self._last_header  # else: checked when it came first
        if fresh:
            # RabbitMQ's checks of a content header, in its order, all before anything is
            # stored: nothing unreadable ever reaches a queue.
            if weight:
                raise _content_expected("header")
            if class_id != BASIC:
                raise unexpected_frame(f"expected content header for class 60, got one for class {class_id} "
                                       "instead", _PUBLISH_IDS)
        else:
            header = self._last_header  # one shared copy for a run of alike messages
        try:
            ops.check_message_size(self.conn.broker, body_size)
        except AMQPError as err:
            self.publishing = None
            self.error(err, *_PUBLISH_IDS)
            return
        if fresh:
            reason = properties_error(header, flags)
            if reason is not None:
                log.warning("connection %s, channel %d: malformed content header (%s): %r", self.conn.name,
                            self.id, reason, header[:64])
                raise frame_errors.malformed_content_header()
            if flags & 3:
                # Bits RabbitMQ ignores; a consumer would take bit 0 as the promise of another flags word.
                header = header[:13] + bytes((flags & 0xFC,)) + header[14:]
            self._last_header = header
        self.content_header = header
        self.body_size = self.body_remaining = body_size
        if body_size == 0:
            self._publish_complete(self.publishing, header, b"")

    def body_frame(self, buf: bytes, start: int, end: int) -> None:
        """A body frame whose payload is buf[start:end] (a read of the connection)."""
        if self.state == CLOSING:
            return
        if self.publishing is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        if self.content_header is None:
            raise _content_expected("header")
        size = end - start
        remaining = self.body_remaining - size
        if remaining < 0:
            # RabbitMQ 3.10 silently waits for more (the next method frame then fails): Warren
            # says what is wrong at once.
            raise unexpected_frame(f"content body of {size} bytes exceeds the {self.body_remaining} "
                                   "bytes left of the size in the content header", _PUBLISH_IDS)
        if remaining == 0 and size == self.body_size:
            # The whole body in one frame (the common case): its only copy, out of the read.
            self._publish_complete(self.publishing, self.content_header, buf[start:end])
            return
        # A part of a body that spans frames.
        self._body_part([memoryview(buf)[start:end]], size)

    def accepts_body(self, size: int) -> bool:
        """Whether a body frame of `size` octets is what this channel expects now: then the
        connection may collect its payload as it arrives (body_received); else the frame is
        read whole and body_frame says what is wrong with it."""
        return (self.state == OPEN and self.publishing is not None
                and self.content_header is not None and size <= self.body_remaining)

    def body_received(self, parts: list[memoryview], size: int) -> None:
        """A body frame that spanned reads has arrived whole: `parts` are views of them."""
        if self.state != OPEN or self.publishing is None or self.content_header is None:
            return  # the channel closed meanwhile
        self._body_part(parts, size)

    def _body_part(self, views: list[memoryview], size: int) -> None:
        # A header alone allocates nothing: the body is what its frames brought.
        assembly = self.assembly
        if assembly is None:
            assembly = self.assembly = BodyAssembly()
        for view in views:
            assembly.add(view)
        self.body_remaining -= size
        if self.body_remaining == 0:
            body = assembly.body()
            self.assembly = None
            assert self.publishing is not None and self.content_header is not None
            self._publish_complete(self.publishing, self.content_header, body)

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
            raise channel_error("second 'channel.open' seen", (20, 10))

    # ---------------------------------------------------------------- helpers
    def send(self, method: spec.Method) -> None:
        self.conn.send_method(self.id, method)

    def error(self, err: AMQPError, class_id: int = 0, method_id: int = 0) -> None:
        """Close the channel (soft error) or the connection (hard error) with RabbitMQ's code."""
        if err.closes_connection:
            self.conn.connection_error(err, *(err.method_ids or (class_id, method_id)), channel=self.id)
            return
        connection_log.channel_error(self.conn, self.id, err.code, err.text, class_id, method_id)
        self.release()
        self.send(spec.ChannelClose(reply_code=err.code, reply_text=err.reply_text,
                                    class_id=class_id, method_id=method_id))

    def _queue_name(self, name: str) -> str:
        if name == "":
            if self.last_queue == "":
                raise not_found("no previously declared queue")
            return self.last_queue
        return name

    def _dispatch(self, method: spec.Method) -> None:
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

    # ------------------------------------------------------- metadata changes
    def _change(self, m: spec.Method, operation: Callable[[], Change[Any]], then: Callable[[Any], None],
                after: Callable[[], None] | None = None) -> None:
        """Carry out an operation that changes metadata, then `then(result)`, and `after()`
        whatever happened. On a node alone at once; on a cluster member the connection reads
        nothing more (its later frames wait, in order) until the cluster's log has the change
        and this node has applied it."""
        store = self.conn.broker.metadata
        if store.log is None:
            try:
                then(store.run(operation()))
            finally:
                if after is not None:
                    after()
            return
        log = store.log
        self._await(m, lambda done: log.submit(operation, done), then, after)

    def _await(self, m: spec.Method, start: Callable[[Done], None], then: Callable[[Any], None],
               after: Callable[[], None] | None = None) -> None:
        """Start something this node answers later (the cluster's log, a queue's home node),
        then `then(result)`: the connection reads nothing more meanwhile, so replies keep the
        order of requests. Leaves the frame loop (HoldInput) unless it is called from another
        wait's answer (the connection then already reads nothing)."""
        conn = self.conn
        in_frame_loop = not conn.holds
        conn.hold_for_metadata()

        def done(result: Any, error: BaseException | None) -> None:
            try:
                if self.state != OPEN:
                    return  # (closed meanwhile: by the broker, or with its connection)
                if error is not None:
                    raise error
                then(result)
            except AMQPError as err:
                self.error(err, m.CLASS_ID, m.METHOD_ID)
            finally:
                if after is not None and self.state == OPEN:
                    after()
                conn.release_for_metadata()
        start(done)
        if in_frame_loop:
            # Stop the connection's frame loop here, at no cost to it per frame (an exception).
            raise HoldInput

    # -------------------------------------------------------------- exchange
    def _exchange_declare(self, m):
        self._change(m, lambda: ops.declare_exchange.change(self.actor, m.exchange, m.type, m.passive, m.durable,
                                                            m.auto_delete, m.internal, m.arguments),
                     lambda _: self._reply(m, spec.ExchangeDeclareOk()))

    def _exchange_delete(self, m):
        self._change(m, lambda: ops.delete_exchange.change(self.actor, m.exchange, m.if_unused),
                     lambda _: self._reply(m, spec.ExchangeDeleteOk()))

    def _exchange_bind(self, m):
        self._change(m, lambda: ops.bind.change(self.actor, m.source, "exchange", m.destination, m.routing_key,
                                                m.arguments),
                     lambda _: self._reply(m, spec.ExchangeBindOk()))

    def _exchange_unbind(self, m):
        self._change(m, lambda: ops.unbind.change(self.actor, m.source, "exchange", m.destination, m.routing_key,
                                                  m.arguments),
                     lambda _: self._reply(m, spec.ExchangeUnbindOk()))

    def _reply(self, m, reply: spec.Method) -> None:
        if not m.nowait:
            self.send(reply)

    # ----------------------------------------------------------------- queue
    def _queue_declare(self, m):
        # No empty-name shortcut for a passive declare (as RabbitMQ).
        self._change(m, lambda: ops.declare_queue.change(self.actor, m.queue, m.passive, m.durable, m.exclusive,
                                                         m.auto_delete, m.arguments),
                     lambda result: self._queue_declared(m, *result))

    def _queue_declared(self, m, q, created: bool) -> None:
        if created and q.owner is not None:
            self.conn.exclusive_queues.append(q)
        self.last_queue = q.name
        if m.nowait:
            return
        if q.remote:  # its counts are its home's
            self._await(m, q.counts_async, lambda counts: self._declare_ok(q, counts))
        else:
            self._declare_ok(q, q.declare_ok_counts())

    def _declare_ok(self, q, counts: tuple[int, int]) -> None:
        self.send(spec.QueueDeclareOk(queue=q.name, message_count=counts[0], consumer_count=counts[1]))

    def _queue_binding(self, m) -> tuple[str, str]:
        qname = self._queue_name(m.queue)
        # RabbitMQ's shortcut: an empty key on the last queue uses its name.
        return qname, (qname if m.queue == "" and m.routing_key == "" else m.routing_key)

    def _queue_bind(self, m):
        qname, routing_key = self._queue_binding(m)
        self._change(m, lambda: ops.bind.change(self.actor, m.exchange, "queue", qname, routing_key, m.arguments),
                     lambda _: self._reply(m, spec.QueueBindOk()))

    def _queue_unbind(self, m):
        qname, routing_key = self._queue_binding(m)
        self._change(m, lambda: ops.unbind.change(self.actor, m.exchange, "queue", qname, routing_key, m.arguments),
                     lambda _: self.send(spec.QueueUnbindOk()))

    def _queue_purge(self, m):
        q = ops.readable_queue(self.actor, self._queue_name(m.queue))
        if q.remote:
            self._await(m, q.purge_async, lambda count: self._reply(m, spec.QueuePurgeOk(message_count=count)))
        else:
            self._reply(m, spec.QueuePurgeOk(message_count=q.purge()))

    def _queue_delete(self, m):
        # RabbitMQ answers delete-ok before it cancels this channel's own consumers of the
        # queue (the channel hears of the deletion after the reply; other channels may hear
        # before it): clients waiting for delete-ok (kombu on py-amqp) fail on an earlier cancel.
        name = self._queue_name(m.queue)
        q = self.actor.vhost.queues.get(name)
        self.held_cancels = []
        if q is not None and q.remote and ops.queue_to_delete(self.actor, name) is not None:
            # Its home checks if-unused and if-empty and deletes it through the cluster's log.
            self._await(m, lambda done: q.delete_async(m.if_unused, m.if_empty, done),
                        lambda count: self._reply(m, spec.QueueDeleteOk(message_count=count)),
                        after=self._send_held_cancels)
            return
        self._change(m, lambda: ops.delete_queue.change(self.actor, name, m.if_unused, m.if_empty),
                     lambda count: self._reply(m, spec.QueueDeleteOk(message_count=count)),
                     after=self._send_held_cancels)

    def _send_held_cancels(self) -> None:
        held, self.held_cancels = self.held_cancels, None
        for tag in held or ():
            self.send(spec.BasicCancel(consumer_tag=tag, nowait=True))

    # ----------------------------------------------------------------- basic
    def _basic_qos(self, m):
        if m.prefetch_size != 0:
            raise not_implemented(f"prefetch_size!=0 ({m.prefetch_size})")
        credit = self.credit
        if m.global_:
            if not credit.limit:
                # RabbitMQ's limiter starts from everything unacked on the channel, basic.get
                # deliveries included (their acks never count down).
                credit.used = len(self.unacked)
            credit.limit = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
            credit.limit = 0  # as in RabbitMQ 3.10: a per-consumer qos lifts the channel limit
        self.send(spec.BasicQosOk())
        self.kick_queues()

    def _basic_consume(self, m) -> None:  # typed, so mypy checks a Channel is a DeliverySink
        tag = m.consumer_tag or server_named("amq.ctag-")
        consumer = ops.consume(self.actor, self._queue_name(m.queue), tag, m.no_ack, m.exclusive, m.arguments,
                               self.prefetch, self.credit, self, self.conn.throttle, deliver_prefix(tag),
                               self.consumers)
        self.consumers[tag] = consumer
        if consumer.queue.remote:  # consume-ok once its home has it (its checks may refuse it)
            self._await(m, lambda done: consumer.queue.consume_async(consumer, done),
                        lambda _: self._consuming(m, consumer))
        else:
            self._consuming(m, consumer)

    def _consuming(self, m, consumer: Consumer) -> None:
        if not m.nowait:
            self.send(spec.BasicConsumeOk(consumer_tag=consumer.tag))
        if not m.no_ack:
            self._watch_acks()
        consumer.queue.deliver_ready()

    def _basic_cancel(self, m):
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            ops.cancel(consumer)
            # A single active consumer's successor may take over now (RabbitMQ 3.10.8 waits
            # for the next requeue, and its next publish crashes the queue).
            consumer.queue.deliver_ready()
        if not m.nowait:
            self.send(spec.BasicCancelOk(consumer_tag=m.consumer_tag))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away: tell clients that asked for consumer_cancel_notify."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.conn.capabilities.get("consumer_cancel_notify"):
            if self.held_cancels is not None:
                self.held_cancels.append(consumer.tag)
            else:
                self.send(spec.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    def _basic_get(self, m):
        name = self._queue_name(m.queue)
        q = self.actor.vhost.queues.get(name)
        if q is not None and q.remote:
            q = ops.readable_queue(self.actor, name)
            self._await(m, lambda done: q.get_async(m.no_ack, done), lambda got: self._got(m, q, *got))
            return
        q, qm = ops.get(self.actor, name, m.no_ack)
        self._got(m, q, qm, q.message_count if qm is not None else 0)

    def _got(self, m, q, qm, message_count: int, answered_by=None) -> None:
        """`answered_by`: the queue that handed it out, when not `q` (a quorum queue whose
        leader moved to this node while the get waited: RemoteQuorumQueue.get_async)."""
        if answered_by is not None:
            q = answered_by
        if qm is None:
            self.stats["get_empty"] += 1
            self.send(spec.BasicGetEmpty(cluster_id=""))
            return
        self.delivery_tag += 1
        tag = self.delivery_tag
        msg = qm.message
        conn = self.conn
        out = conn.out
        start = len(out)
        out.append(get_ok_frame(self.id, tag, qm.redelivered, msg.route, message_count))
        content_frames(out, self.id, msg.header, msg.body, conn.frame_max)
        conn.note_output(len(msg.body))
        if not m.no_ack:
            # Not counted against the channel's prefetch, as in RabbitMQ.
            self.unacked[tag] = (qm, q, None)
            self._watch_acks()  # but by consumer_timeout
        if q.gated:
            self._gate(q, start, tag, m.no_ack)
        self.stats["get_no_ack" if m.no_ack else "get"] += 1
        if qm.redelivered:
            self.stats["redeliver"] += 1

    def _basic_ack(self, m):
        self._ack(m.delivery_tag, m.multiple)

    def _basic_reject(self, m):
        self._settle_or_hold(self._take_unacked(m.delivery_tag, False), ack=False, requeue=m.requeue)

    def _basic_nack(self, m):
        self._settle_or_hold(self._take_unacked(m.delivery_tag, m.multiple), ack=False, requeue=m.requeue)

    def _basic_recover(self, m):
        if not m.requeue:
            raise not_implemented("requeue=false")
        for _qm, queue, _consumer in self.unacked.values():
            queue.check_recover()
        if isinstance(m, spec.BasicRecover):
            # Before the redeliveries, as RabbitMQ (its queues redeliver after the reply).
            self.send(spec.BasicRecoverOk())
        self.requeue_unacked()

    # ------------------------------------------------------------- publish
    def _start_publish(self, payload) -> None:
        self.content_header = None
        self.assembly = None
        route = bytes(payload[6:-1])
        cached = self._last_publish
        if cached is not None and cached.route == route and len(payload) > 6:
            bits = payload[-1]
            if bits & 2:
                raise not_implemented("immediate=true")
            if cached.mandatory != bool(bits & 1):
                cached = self._last_publish = PublishMethod(cached.exchange, cached.routing_key, cached.route,
                                                            bool(bits & 1))
            self.publishing = cached
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
        self.publishing = self._last_publish = PublishMethod(exchange, routing_key, route, bool(bits & 1))

    def _publish_complete(self, pub: PublishMethod, header: bytes, body: Body) -> None:
        """The content of `pub` is complete (the callers pass self.publishing and
        self.content_header, which they checked are set)."""
        self.publishing = None
        try:
            self.publish(pub.exchange, pub.routing_key, pub.route, pub.mandatory, header, body)
        except AMQPError as err:
            self.error(err, *_PUBLISH_IDS)

    def publish(self, exchange_name: str, routing_key: str, route: bytes, mandatory: bool, header: bytes,
                body: Body) -> None:
        if self.tx is not None:
            message, queues = _route(self.actor, exchange_name, routing_key, route, header, body)
            self.stats["publish"] += 1
            self.tx.publish(queues, message, mandatory)
            return
        # ops.publish(..., may_hold=True), inlined: its call and result tuple were 2 % of the
        # instructions of a persistent confirmed publish (callgrind, 70.9k -> 69.5k a message).
        message, queues = _route(self.actor, exchange_name, routing_key, route, header, body)
        settlement = _enqueue(message, queues, True, self.durability.ticket(message)) if queues else SETTLED
        self.stats["publish"] += 1
        if not queues:
            if mandatory:
                self._return(message, NO_ROUTE, "NO_ROUTE")
            else:
                self.stats["drop_unroutable"] += 1
        if self.confirm:
            self.publish_seq += 1
            if settlement is SETTLED:
                self.conn.confirming.add(self)
                return
            # Confirmed (or nacked: REJECTED, a failed write) in order with the others, once
            # settled: a persistent message in a durable queue once its batch is on disk.
            self.sync_waits.append((self.publish_seq, settlement))
            if settlement is REJECTED:
                self.conn.confirming.add(self)
            else:
                settlement.notify(self)

    def _return(self, message: Message, code: int, text: str) -> None:
        self.stats["return_unroutable"] += 1
        conn = self.conn
        payload = _HH.pack(60, 50) + struct.pack(">H", code) + bytes((len(text),)) + text.encode() + message.route
        out = conn.out
        out.append(struct.pack(">BHI", 1, self.id, len(payload)) + payload + b"\xce")
        content_frames(out, self.id, message.header, message.body, conn.frame_max)
        conn.note_output(len(message.body) + 64)

    def emit_confirms(self) -> None:
        """Acknowledge every publish confirmed since the last call, in one basic.ack
        (basic.nack for a publish whose write or fsync failed)."""
        if self.state != OPEN:
            return
        upto = self.publish_seq
        waits = self.sync_waits
        if waits:
            while waits:
                safe = waits[0][1].status()
                if safe is None:
                    break
                seq, _batch = waits.popleft()
                if not safe:
                    self._send_ack(seq - 1)
                    self.conn.out.append(nack_frame(self.id, seq, False))
                    self.confirmed = seq
            if waits:
                upto = waits[0][0] - 1
                waits[0][1].notify(self)
        self._send_ack(upto)

    def _send_ack(self, upto: int) -> None:
        if upto > self.confirmed:
            self.conn.out.append(ack_frame(self.id, upto, upto - self.confirmed > 1))
            self.stats["confirm"] += upto - self.confirmed
            self.confirmed = upto

    def store_synced(self) -> None:
        """The store finished an fsync: some waiting confirms may be due (a SyncWaiter)."""
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
    def deliver(self, consumer: Consumer, qm: QueuedMessage) -> None:
        """Send one message to a consumer on this channel (the queue calls this: a DeliverySink)."""
        self.delivery_tag += 1
        tag = self.delivery_tag
        msg = qm.message
        conn = self.conn
        out = conn.out
        start = len(out)
        out.append(deliver_frame(self.id, consumer.prefix, tag, qm.redelivered, msg.route))
        content_frames(out, self.id, msg.header, msg.body, conn.frame_max)
        queue = consumer.queue
        if consumer.no_ack:
            queue.delivered(qm, True)
            self.stats["deliver_no_ack"] += 1
        else:
            self.unacked[tag] = (qm, queue, consumer)
            consumer.unacked += 1
            self.credit.used += 1
            queue.delivered(qm, False)
            self.stats["deliver"] += 1
        if queue.gated:
            self._gate(queue, start, tag, consumer.no_ack)
        if qm.redelivered:
            self.stats["redeliver"] += 1
        conn.note_output(len(msg.body) + 64)

    def _gate(self, queue, start: int, tag: int, no_ack: bool) -> None:
        """The delivery just written to out[start:] waits for its queue's commit, if any."""
        point = queue.delivery_gate()
        if point is not None:
            self.conn.hold_delivery(start, point, None if no_ack else lambda: self._forget(tag))

    def _forget(self, tag: int) -> None:
        """A delivery that never left (its queue's leader moved first): the client will not
        settle it, and the new leader hands the message out again."""
        entry = self.unacked.pop(tag, None)
        if entry is not None and entry[2] is not None:
            entry[2].unacked -= 1
            self.credit.used -= 1
            self.kick_queues()

    def kick_queues(self) -> None:
        """Credit may have been freed: let the queues we consume from deliver again."""
        for queue in {c.queue for c in self.consumers.values()}:
            queue.deliver_ready()

    # ------------------------------------------------------------------ acks
    def _watch_acks(self) -> None:
        """A delivery that needs an ack may come: check consumer_timeout (warren.session.ack_timeout)."""
        watch = self.ack_timeout
        if watch is None:
            broker = self.conn.broker
            timeout, scheduler = broker.config.limits.consumer_timeout, broker.scheduler
            if timeout is None or scheduler is None:
                return
            watch = self.ack_timeout = AckTimeout(self, timeout, scheduler)
        watch.start()

    def _take_unacked(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.items())
                unacked.clear()
                return taken
            if tag not in unacked:
                raise precondition_failed(f"unknown delivery tag {tag}")
            tags = []
            for t in unacked:
                if t > tag:
                    break
                tags.append(t)
            return [(t, unacked.pop(t)) for t in tags]
        entry = unacked.pop(tag, None)
        if entry is None:
            raise precondition_failed(f"unknown delivery tag {tag}")
        return [(tag, entry)]

    def _ack(self, tag: int, multiple: bool) -> None:
        self._settle_or_hold(self._take_unacked(tag, multiple), ack=True)

    def _settle_or_hold(self, taken: list[Unacked], ack: bool, requeue: bool = False) -> None:
        """Settle now, or at tx.commit inside a transaction."""
        if self.tx is not None:
            self.tx.settle(taken, ack, requeue)
        else:
            self._settle(taken, ack, requeue)

    def _settle(self, taken: list[Unacked], ack: bool, requeue: bool, closed: bool = False) -> None:
        """`closed`: requeued because the channel goes away, not by the client."""
        queues = set()
        credit = self.credit
        for _tag, (qm, queue, consumer) in taken:
            if consumer is not None:
                credit.used -= 1
            _settle(qm, queue, consumer, ack, requeue, closed)
            queues.add(queue)
        if ack:
            self.stats["ack"] += len(taken)
        for queue in queues:
            queue.deliver_ready()
        if credit.limit:
            self.kick_queues()

    def requeue_unacked(self, closed: bool = False) -> None:
        taken = list(self.unacked.items())
        self.unacked.clear()
        self._settle(taken, ack=False, requeue=True, closed=closed)

    # -------------------------------------------------------------------- tx
    def _tx_select(self, m):
        if self.confirm:
            raise precondition_failed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self.send(spec.TxSelectOk())

    def _tx_commit(self, m):
        tx = self.tx
        if tx is None:
            raise precondition_failed("channel is not transactional")
        durable_writes = False
        for action in tx.take():
            if isinstance(action, TxPublish):
                live = [q for q in action.queues if not q.deleted]
                if live:
                    durable_writes |= _enqueue(action.message, live) is not SETTLED
                elif action.mandatory:
                    self._return(action.message, NO_ROUTE, "NO_ROUTE")
            else:
                self._settle(action.taken, action.ack, action.requeue)
        if durable_writes and not self.durability.sync_now():
            # RabbitMQ has no tx nack: a failed write is an internal error.
            raise AMQPError(541, "cannot write the committed messages to disk")
        self.send(spec.TxCommitOk())

    def _tx_rollback(self, m):
        if self.tx is None:
            raise precondition_failed("channel is not transactional")
        self._tx_restore_unacked()
        self.tx = Transaction()
        self.send(spec.TxRollbackOk())

    def _tx_restore_unacked(self) -> None:
        """Acks and rejects taken in the open transaction become outstanding again."""
        settled = self.tx.settled() if self.tx is not None else []
        for tag, entry in settled:
            self.unacked[tag] = entry
        if settled:
            self.unacked = dict(sorted(self.unacked.items()))

    # --------------------------------------------------------------- release
    def release(self) -> None:
        """The channel is closing: cancel its consumers and requeue what it holds."""
        if self.state == CLOSING:
            return
        broker = self.conn.broker
        totals = broker.stats.message_totals  # the overview's counters outlive the channel
        for key, value in self.stats.items():
            totals[key] = totals.get(key, 0) + value
        totals[RECEIVED_CONFIRM] = totals.get(RECEIVED_CONFIRM, 0) + self.publish_seq
        broker.stats.node_counters["channels_closed"] += 1
        if self.ack_timeout is not None:
            self.ack_timeout.stop()
            self.ack_timeout = None  # (it refers back to this channel: no cycle left behind)
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            ops.cancel(consumer)
        self._tx_restore_unacked()  # uncommitted acks did not happen: requeue those too
        self.tx = None
        self.publishing = None
        self.assembly = None
        if self.unacked:
            self.requeue_unacked(closed=True)
        self.state = CLOSING
        self.conn.confirming.discard(self)

    # ------------------------------ its connection's handle of it (warren.broker.records)
    def channel_link(self) -> ChannelLink:
        return records.channel_link(self)

    def info(self) -> ChannelInfo:
        return records.channel_info(self, self.state == CLOSING)

    def counters(self) -> ChannelCounters:
        return records.channel_counters(self, self.state == CLOSING)

    def unacked_bytes(self) -> dict:
        return records.unacked_bytes(self)


_HANDLERS: dict[type, Callable[[Channel, spec.Method], None]] = {
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


def _content_expected(what: str) -> AMQPError:
    """505 for a frame other than the content a basic.publish still waits for."""
    if what == "header":
        return unexpected_frame("expected content header for class 60, got non content header frame instead",
                                _PUBLISH_IDS)
    return unexpected_frame("expected content body, got non content body frame instead", _PUBLISH_IDS)
