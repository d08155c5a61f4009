"""A shovel's ends on other brokers (warren.broker.shovel_links' port): each its own
connection (a Link) named "Shovel NAME", set up as RabbitMQ's amqp091 shovel does
(rabbit_amqp091_shovel: init_dest, then init_source; ensure_queue = a passive declare, then
a durable declare with the given arguments if the queue is missing; a static shovel's
declarations instead, run first).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..amqp import spec
from ..amqp.body import Body
from ..amqp.codec import typed_int
from ..amqp.message import Message
from ..broker.shovel_declarations import REPLIES
from ..broker.shovel_links import LinkUser, Opened
from ..store.settlement import SETTLED, Settlement, SyncWaiter
from .link import ChannelClosed, Link, LinkError

if TYPE_CHECKING:
    from ..amqp.uri import Network
    from ..broker.federation_plan import ExchangePlan, QueuePlan
    from ..broker.shovel_config import Config

log = logging.getLogger("warren.shovel")


class Confirm:
    """The settlement handle of one publish to another broker: its confirm, or False once
    the link is lost before it came (the shovel then gives the source's copy back)."""

    __slots__ = ("state", "tracker")

    def __init__(self, tracker: Confirms):
        self.state: bool | None = None
        self.tracker = tracker

    def status(self) -> bool | None:
        return self.state

    def notify(self, waiter: SyncWaiter) -> None:
        self.tracker.waiters.add(waiter)


class Confirms:
    """The unconfirmed publishes of one link, by delivery tag, oldest first."""

    def __init__(self) -> None:
        self.pending: dict[int, Confirm] = {}
        self.waiters: set[SyncWaiter] = set()

    def add(self, tag: int) -> Confirm:
        handle = self.pending[tag] = Confirm(self)
        return handle

    def settle(self, tag: int, multiple: bool, ack: bool) -> None:
        pending = self.pending
        if multiple:
            while pending:
                first = next(iter(pending))
                if first > tag:
                    break
                pending.pop(first).state = ack
        else:
            handle = pending.pop(tag, None)
            if handle is not None:
                handle.state = ack
        self._wake()

    def lose_all(self) -> None:
        for handle in self.pending.values():
            handle.state = False
        self.pending.clear()
        self._wake()

    def _wake(self) -> None:
        if self.waiters:
            waiters, self.waiters = self.waiters, set()
            for waiter in waiters:
                waiter.store_synced()


class _End:
    """What both ends share: the link, and telling the shovel once it is gone."""

    def __init__(self, user: LinkUser, endpoint: Network, name: str):
        self.user = user
        self.link = Link(self, endpoint, name)
        self.started = False  # set up: failures now go to the shovel, not to `done`

    def link_delivery(self, link: Link, delivery_tag: int, redelivered: bool, route: bytes, header: bytes,
                      body: bytes) -> None:
        pass

    def link_confirmed(self, link: Link, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass

    def link_cancelled(self, link: Link) -> None:
        pass

    def link_writable(self, link: Link) -> None:
        pass

    def link_closed(self, link: Link, reason: str) -> None:
        if self.started:
            self.user.remote_closed(self, reason)  # type: ignore[arg-type]

    def close(self) -> None:
        self.started = False
        self.link.close()

    async def declare(self, methods: tuple[spec.Method, ...]) -> str:
        """A static shovel's declarations, in order, each waiting for its reply: the name of
        the last queue declared ("" if none)."""
        last = ""
        for method in methods:
            ok: Any = await self.link.call(method, REPLIES[type(method)])
            if type(method) is spec.QueueDeclare:
                last = ok.queue
        return last

    async def ensure_queue(self, name: str, arguments: dict, durable: bool = True, auto_delete: bool = False) -> None:
        """A passive declare, and if the queue is missing a declare (on the channel opened
        again: the 404 closed it)."""
        try:
            await self.link.call(spec.QueueDeclare(queue=name, passive=True), spec.QueueDeclareOk)
        except ChannelClosed as err:
            if err.code != 404:
                raise
            await self.link.reopen()
            await self.link.call(spec.QueueDeclare(queue=name, durable=durable, auto_delete=auto_delete,
                                                   arguments=arguments), spec.QueueDeclareOk)


class Source(_End):
    def __init__(self, user: LinkUser, endpoint: Network, name: str):
        super().__init__(user, endpoint, name)
        self.queue_length = 0
        # Deliveries that came with basic.consume-ok, before the shovel has its end.
        self.early: list[tuple[int, Message, bool]] = []

    async def start(self, c: Config) -> None:
        link = self.link
        await link.open(confirm=False)
        ok: Any
        declared = await self.declare(c.src_declarations)
        if c.src_queue is not None:
            if not c.static:
                await self.ensure_queue(c.src_queue, c.src_queue_args)
            queue = c.src_queue or declared  # ("": the last queue declared, as on the channel)
            ok = await link.call(spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk)
        else:
            ok = await link.call(spec.QueueDeclare(queue="", exclusive=True), spec.QueueDeclareOk)
            queue = ok.queue
            await link.call(spec.QueueBind(queue=queue, exchange=c.src_exchange, routing_key=c.src_exchange_key),
                            spec.QueueBindOk)
        self.queue_length = ok.message_count
        no_ack = c.ack_mode == "no-ack"
        if not no_ack:
            await link.call(spec.BasicQos(prefetch_count=c.prefetch), spec.BasicQosOk)
        await link.call(spec.BasicConsume(queue=queue, no_ack=no_ack, arguments=c.src_consumer_args),
                        spec.BasicConsumeOk)

    def link_delivery(self, link: Link, delivery_tag: int, redelivered: bool, route: bytes, header: bytes,
                      body: bytes) -> None:
        n = route[0]
        exchange = route[1:1 + n].decode("utf-8", "surrogateescape")
        routing_key = route[2 + n:].decode("utf-8", "surrogateescape")
        message = Message(exchange, routing_key, route, header, body)
        if self.started:
            self.user.remote_delivery(self, delivery_tag, message, redelivered)
        else:
            self.early.append((delivery_tag, message, redelivered))

    def begin(self) -> None:
        """The shovel has its end: what arrived meanwhile goes to it."""
        early, self.early = self.early, []
        for delivery_tag, message, redelivered in early:
            if self.started:
                self.user.remote_delivery(self, delivery_tag, message, redelivered)

    def link_cancelled(self, link: Link) -> None:
        if self.started:
            self.user.remote_cancelled(self)

    def ack(self, delivery_tag: int) -> None:
        self.link.ack(delivery_tag)

    def reject(self, delivery_tag: int) -> None:
        self.link.nack(delivery_tag, requeue=True)

    def pause(self) -> None:
        self.link.pause()

    def resume(self) -> None:
        self.link.resume()


class Destination(_End):
    def __init__(self, user: LinkUser, endpoint: Network, name: str):
        super().__init__(user, endpoint, name)
        self.confirms: Confirms | None = None

    @property
    def writable(self) -> bool:
        return self.link.writable

    async def start(self, c: Config) -> None:
        confirm = c.ack_mode == "on-confirm"
        await self.link.open(confirm=confirm)
        await self.declare(c.dest_declarations)
        if c.dest_queue is not None:
            await self.ensure_queue(c.dest_queue, c.dest_queue_args)
        if confirm:
            self.confirms = Confirms()

    def publish(self, route: bytes, header: bytes, body: Body) -> Settlement:
        tag = self.link.publish(route, header, body)
        return self.confirms.add(tag) if self.confirms is not None else SETTLED

    def link_confirmed(self, link: Link, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if self.confirms is not None:
            self.confirms.settle(delivery_tag, multiple, ack)

    def link_writable(self, link: Link) -> None:
        if self.started:
            self.user.remote_writable()

    def link_closed(self, link: Link, reason: str) -> None:
        if self.confirms is not None:
            self.confirms.lose_all()  # (unconfirmed: the shovel gives the sources' copies back)
        super().link_closed(link, reason)

    def close(self) -> None:
        """Close; what is unconfirmed counts as lost (its sources' copies go back)."""
        super().close()
        if self.confirms is not None:
            self.confirms.lose_all()


class UpstreamExchangeEnd(Source):
    """A federation exchange link's end on the upstream broker
    (rabbit_federation_exchange_link: consume_from_upstream_queue, then
    ensure_upstream_bindings)."""

    def __init__(self, user: LinkUser, endpoint: Network, name: str, plan: ExchangePlan):
        super().__init__(user, endpoint, name)
        self.plan = plan
        self.cluster_name: str | None = None
        self._commands: asyncio.Queue = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        self.cleaning = False

    async def start(self, c: Any) -> None:
        p = self.plan
        link = self.link
        await link.open(confirm=False)
        name = link.client.server_properties.get("cluster_name")
        self.cluster_name = name if isinstance(name, str) else None
        # The new internal exchange is deleted and declared again below, before the old one
        # goes: if it is the one in use (this broker restarted and took the first suffix
        # again), the upstream exchange would meanwhile route nothing to the link's queue and
        # confirm what it drops. RabbitMQ keeps the suffix in use with the exchange
        # (rabbit_federation_db) and takes the other one; so does this, seeing which exists
        # (the old one first: it is there at every start but the first one, or one after a
        # restart, so the upstream rarely logs a refused passive declare).
        if not await self._exchange_exists(p.old_internal_exchange) and await self._exchange_exists(
                p.internal_exchange):
            p.swap()
        await link.call(spec.QueueDeclare(queue=p.queue, durable=True, arguments=p.queue_arguments),
                        spec.QueueDeclareOk)
        if not p.no_ack:
            await link.call(spec.BasicQos(prefetch_count=p.prefetch), spec.BasicQosOk)
        await link.call(spec.BasicConsume(queue=p.queue, consumer_tag=p.consumer_tag, no_ack=p.no_ack),
                        spec.BasicConsumeOk)
        # The upstream exchange, declared as the downstream one is if it is missing.
        try:
            await link.call(spec.ExchangeDeclare(exchange=p.exchange, type=p.exchange_type, passive=True),
                            spec.ExchangeDeclareOk)
        except ChannelClosed as err:
            if err.code != 404:
                raise
            await self._reconsume()
            await link.call(spec.ExchangeDeclare(exchange=p.exchange, type=p.exchange_type, durable=p.durable,
                                                 auto_delete=p.auto_delete, internal=p.internal,
                                                 arguments=p.exchange_arguments), spec.ExchangeDeclareOk)
        await link.call(spec.ExchangeDelete(exchange=p.internal_exchange), spec.ExchangeDeleteOk)
        base = {"exchange": p.internal_exchange, "durable": True, "internal": True, "auto_delete": True}
        try:
            await link.call(spec.ExchangeDeclare(type="x-federation-upstream", arguments=p.internal_arguments, **base),
                            spec.ExchangeDeclareOk)
        except ChannelClosed as err:
            if err.code != 503:  # (an upstream without the federation plugin: a plain fanout)
                raise
            await self._reconsume()
            await link.call(spec.ExchangeDeclare(type="fanout", arguments={"x-internal-purpose": "federation"},
                                                 **base), spec.ExchangeDeclareOk)
        await link.call(spec.QueueBind(queue=p.queue, exchange=p.internal_exchange), spec.QueueBindOk)
        for key, args in p.bindings:
            await self._bind(spec.ExchangeBind, key, args)
        await link.call(spec.ExchangeDelete(exchange=p.old_internal_exchange), spec.ExchangeDeleteOk)
        self._worker = asyncio.get_running_loop().create_task(self._run_commands())

    async def _exchange_exists(self, name: str) -> bool:
        """A passive declare (before the link consumes: a 404 just opens the channel again)."""
        try:
            await self.link.call(spec.ExchangeDeclare(exchange=name, passive=True), spec.ExchangeDeclareOk)
        except ChannelClosed as err:
            if err.code != 404:
                raise
            await self.link.reopen()
            return False
        return True

    async def _reconsume(self) -> None:
        """The channel was closed by a refused call: open it again and consume again."""
        p = self.plan
        await self.link.reopen()
        if not p.no_ack:
            await self.link.call(spec.BasicQos(prefetch_count=p.prefetch), spec.BasicQosOk)
        await self.link.call(spec.BasicConsume(queue=p.queue, consumer_tag=p.consumer_tag, no_ack=p.no_ack),
                             spec.BasicConsumeOk)

    async def _bind(self, method: Any, key: str, args: dict) -> None:
        p = self.plan
        await self.link.call(method(source=p.exchange, destination=p.internal_exchange, routing_key=key,
                                    arguments=args), spec.ExchangeBindOk, spec.ExchangeUnbindOk)

    def bind(self, routing_key: str, arguments: dict) -> None:
        self._commands.put_nowait((spec.ExchangeBind, routing_key, arguments))

    def unbind(self, routing_key: str, arguments: dict) -> None:
        self._commands.put_nowait((spec.ExchangeUnbind, routing_key, arguments))

    async def _run_commands(self) -> None:
        """Bindings changed downstream, carried out upstream in order; a refusal (the
        upstream exchange was deleted) ends the link, which starts again."""
        while True:
            method, key, args = await self._commands.get()
            try:
                await self._bind(method, key, args)
            except LinkError as err:
                if self.started:
                    self.started = False
                    self.link.close()
                    self.user.remote_closed(self, err.reason)
                return

    def cleanup(self) -> None:
        """Delete the queue and the internal exchange upstream (a clean stop), then close."""
        self.started = False
        self.cleaning = True
        if self._worker is not None:
            self._worker.cancel()
        p, link = self.plan, self.link

        async def run() -> None:
            try:
                await link.call(spec.QueueDelete(queue=p.queue), spec.QueueDeleteOk)
                await link.call(spec.ExchangeDelete(exchange=p.internal_exchange), spec.ExchangeDeleteOk)
            except LinkError:
                pass
            self.cleaning = False
            link.close()
        if not link.closed:
            asyncio.get_running_loop().create_task(run())

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        if not self.cleaning:  # (cleanup() closes once it is done)
            super().close()


class UpstreamQueueEnd(Source):
    """A federation queue link's end on the upstream broker (rabbit_federation_queue_link:
    go, consume, cancel)."""

    def __init__(self, user: LinkUser, endpoint: Network, name: str, plan: QueuePlan):
        super().__init__(user, endpoint, name)
        self.plan = plan

    async def start(self, c: Any) -> None:
        p = self.plan
        link = self.link
        await link.open(confirm=False)
        capabilities = link.client.server_properties.get("capabilities")
        if not (isinstance(capabilities, dict) and capabilities.get("consumer_priorities") is True):
            raise LinkError("{error,upstream_lacks_consumer_priorities}")
        await self.ensure_queue(p.queue, p.arguments, p.durable, p.auto_delete)
        if not p.no_ack:
            await link.call(spec.BasicQos(prefetch_count=p.prefetch), spec.BasicQosOk)

    def consume(self, on: bool) -> None:
        p = self.plan
        if on:
            self.link.client.send(spec.BasicConsume(queue=p.queue, consumer_tag=p.consumer_tag, no_ack=p.no_ack,
                                                    nowait=True, arguments={"x-priority": typed_int("long", -1)}))
        else:
            self.link.client.send(spec.BasicCancel(consumer_tag=p.consumer_tag, nowait=True))
        self.link.flush_soon()

    def cleanup(self) -> None:
        self.close()


class RemoteEnds:
    """The node's ShovelLinks: each end opened in a task of the server's loop."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()

    def open_source(self, user: LinkUser, endpoint: Network, config: Config, done: Opened) -> None:
        self._open(Source(user, endpoint, user.connection_name), config, done)

    def open_destination(self, user: LinkUser, endpoint: Network, config: Config, done: Opened) -> None:
        self._open(Destination(user, endpoint, user.connection_name), config, done)

    def open_upstream(self, user: LinkUser, endpoint: Network, plan: ExchangePlan, done: Opened) -> None:
        self._open(UpstreamExchangeEnd(user, endpoint, user.connection_name, plan), None, done)

    def open_upstream_queue(self, user: LinkUser, endpoint: Network, plan: QueuePlan, done: Opened) -> None:
        self._open(UpstreamQueueEnd(user, endpoint, user.connection_name, plan), None, done)

    def _open(self, end: Source | Destination, config: Any, done: Opened) -> None:
        async def run() -> None:
            try:
                await end.start(config)
            except LinkError as err:
                end.close()
                done(None, err.reason)
                return
            except Exception as err:  # (a bug must not leave the shovel "starting" for ever)
                log.exception("Shovel %s: opening %s failed", end.user.name, end.link.endpoint.host)
                end.close()
                done(None, repr(err))
                return
            if end.link.closed:
                done(None, "closed")
                return
            end.started = True
            done(end, None)
            if isinstance(end, Source):
                end.begin()

        task = asyncio.get_running_loop().create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
