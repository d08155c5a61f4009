"""The connection to the broker and the delivery of one message until it is confirmed.

Everything that talks AMQP lives here; the publisher only sees confirmed messages or a
PublishError. The connection is aio-pika's robust one (it reconnects and reopens the
channel); a publish that was in flight when either went away is simply sent again (the
same message_id lets consumers drop the duplicate).
"""

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aio_pika
import aiormq
import aiormq.exceptions
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection
from yarl import URL

from .errors import ConfirmTimeout, ExchangeNotFound, Nacked, Returned
from .message import OutgoingMessage

log = logging.getLogger(__name__)

# Errors after which sending again may work: the connection or channel went away (the
# robust connection restores both), or another message's error closed the shared channel.
_TRANSIENT = (ConnectionError, OSError, aiormq.exceptions.AMQPError,
              aiormq.exceptions.ChannelInvalidStateError, RuntimeError)


class Link:
    def __init__(self, url: str, *, mandatory: bool, nack_attempts: int,
                 retry_delay: float = 0.1,
                 exchanges: Mapping[str, str | Mapping[str, Any]] | None = None) -> None:
        self.url = url
        # How to declare exchanges that may be missing: name -> type, or exchange_declare's
        # arguments (type, durable, auto_delete, internal, arguments).
        self.exchanges = {name: _exchange_spec(spec) for name, spec in (exchanges or {}).items()}
        self.mandatory = mandatory
        self.nack_attempts = nack_attempts
        self.retry_delay = retry_delay
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        # The aiormq channel under self._channel while it is open: what deliver() uses
        # without going through _open_channel's awaits (a lock and two events) every time.
        self._underlay: aiormq.abc.AbstractChannel | None = None
        self._connected = asyncio.Event()
        self._channel_lock = asyncio.Lock()
        self._connect_task: asyncio.Task[None] | None = None

    async def open(self, wait: bool) -> None:
        """wait=True fails fast on a wrong URL; wait=False (outbox) keeps trying in the
        background, since publish() must work while the broker is down."""
        if wait:
            await self._connect_once()
        else:
            self._connect_task = asyncio.create_task(self._connect_forever())

    async def _connect_once(self) -> None:
        url = URL(self.url)
        if "reconnect_interval" not in url.query:
            # aio-pika's default of 5 s delays every resend after a connection loss.
            url = url.update_query(reconnect_interval=1)
        self._connection = await aio_pika.connect_robust(url)
        self._connected.set()

    async def _connect_forever(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._connect_once()
                return
            except (ConnectionError, OSError, aiormq.exceptions.AMQPError) as e:
                log.info("broker %s unreachable (%s); retrying in %.1fs", self.url, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        if self._connect_task is not None:
            self._connect_task.cancel()
            await asyncio.gather(self._connect_task, return_exceptions=True)
        if self._connection is not None:
            await self._connection.close()

    async def channel(self) -> aiormq.abc.AbstractChannel:
        """The confirm-mode channel to publish on, (re)opened first if need be."""
        channel = self._underlay
        if channel is None or channel.is_closed:
            channel = await self._open_channel()
        return channel

    async def _open_channel(self) -> aiormq.abc.AbstractChannel:
        await self._connected.wait()
        assert self._connection is not None
        async with self._channel_lock:
            if self._channel is None:
                # on_return_raises: a mandatory message that was returned fails its publish
                # instead of looking confirmed (the broker acks returned messages too).
                self._channel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True)
            channel = self._channel
        # A robust channel gets a new underlay after a reconnect or a channel error.
        self._underlay = await channel.get_underlay_channel()
        return self._underlay

    async def deliver(self, message: OutgoingMessage, timeout: float) -> None:
        """Return once the broker confirmed `message`, sending it again after a nack (up to
        nack_attempts times) or a lost connection or channel; raise a PublishError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        properties = amqp_properties(message)
        nacks = 0
        last_error = "no connection to the broker"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ConfirmTimeout(message.message_id,
                                     f"not confirmed within {timeout}s ({last_error})")
            message.attempts += 1
            try:
                channel = self._underlay
                if channel is None or channel.is_closed:  # channel()'s test, without a timer
                    async with asyncio.timeout_at(deadline):
                        channel = await self._open_channel()
                # aiormq bounds the publish and its confirm by `timeout` (TimeoutError), and
                # builds that asyncio.timeout anyway: one of our own would be a second timer.
                await channel.basic_publish(
                    message.body, exchange=message.exchange, routing_key=message.routing_key,
                    properties=properties, mandatory=self.mandatory,
                    timeout=deadline - loop.time())
                return
            except TimeoutError:
                if self._underlay is not None and not self._underlay.is_closed:
                    last_error = "sent; no confirm from the broker"
                continue  # the deadline check above raises ConfirmTimeout
            except aiormq.exceptions.PublishError as e:  # before DeliveryError: a subclass
                frame = e.frame
                why = (f"{frame.reply_code} {frame.reply_text}"
                       if isinstance(frame, aiormq.spec.Basic.Return) else str(e))
                raise Returned(message.message_id,
                               f"unroutable: {why} (exchange {message.exchange!r}, "
                               f"routing key {message.routing_key!r})") from e
            except aiormq.exceptions.DeliveryError as e:
                nacks += 1
                last_error = f"nacked ({e})"
                if nacks >= self.nack_attempts:
                    raise Nacked(message.message_id,
                                 f"nacked by the broker {nacks} times") from e
            except aiormq.exceptions.ChannelNotFoundEntity as e:
                # The 404 may be another message's, published on the same channel: ask.
                last_error = str(e)
                if await self._exchange_missing(message.exchange, remaining):
                    if message.exchange not in self.exchanges:
                        raise ExchangeNotFound(message.message_id,
                                               f"exchange {message.exchange!r} not found") from e
                    # Told how: declare it, then send again.
                    failed = await self._declare(message.exchange, remaining)
                    if failed:
                        raise ExchangeNotFound(message.message_id, failed) from e
            except _TRANSIENT as e:
                last_error = f"{type(e).__name__}: {e}"
                log.debug("resending %s after %s", message.message_id, last_error)
            await asyncio.sleep(min(self.retry_delay * nacks or self.retry_delay,
                                    max(0.0, deadline - loop.time())))

    async def _exchange_missing(self, exchange: str, timeout: float) -> bool:
        if exchange == "":
            return False
        try:
            await self._on_spare_channel(timeout, exchange=exchange, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return True
        except (TimeoutError, *_TRANSIENT):
            return False
        return False

    async def _declare(self, exchange: str, timeout: float) -> str | None:
        """Declare `exchange` as self.exchanges says; the reason it failed, or None."""
        try:
            await self._on_spare_channel(timeout, exchange=exchange, **self.exchanges[exchange])
        except aiormq.exceptions.ChannelClosed as e:  # 406 (another type), 403, ...
            return f"exchange {exchange!r} not found, and declaring it failed: {e}"
        except (TimeoutError, *_TRANSIENT):
            return None  # e.g. a lost connection: the next round tries again
        log.info("declared missing exchange %r", exchange)
        return None

    async def _on_spare_channel(self, timeout: float, **declare: Any) -> None:
        """exchange_declare on a throw-away plain aiormq channel (a robust one would try to
        restore itself after a channel error)."""
        async with asyncio.timeout(timeout):
            underlay = await self._open_channel()
            spare = await underlay.connection.channel()
            try:
                await spare.exchange_declare(**declare)
            finally:
                if not spare.is_closed:
                    await spare.close()


def _exchange_spec(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    """exchange_declare's keyword arguments; durable unless said otherwise."""
    given = {"type": spec} if isinstance(spec, str) else dict(spec)
    unknown = set(given) - {"type", "durable", "auto_delete", "internal", "arguments"}
    if unknown:
        raise ValueError(f"unknown exchange settings {sorted(unknown)}")
    return {"exchange_type": given.get("type", "direct"),
            "durable": given.get("durable", True),
            "auto_delete": given.get("auto_delete", False),
            "internal": given.get("internal", False),
            "arguments": given.get("arguments")}


def amqp_properties(message: OutgoingMessage) -> aiormq.spec.Basic.Properties:
    """The message's AMQP properties, built on the first call and kept on the message (a
    publish builds them once, however often it is resent)."""
    if message.wire is None:
        message.wire = _build_properties(message)
    return message.wire


def _build_properties(message: OutgoingMessage) -> aiormq.spec.Basic.Properties:
    if not message.properties:
        # The common case without aio_pika.Message, which costs ten times as much; the same
        # properties as it sends (empty headers and priority 0 included).
        return aiormq.spec.Basic.Properties(
            delivery_mode=_PERSISTENT, message_id=message.message_id, headers={}, priority=0)
    # aio_pika.Message does the conversions (headers, datetime, expiration); persistent by
    # default because a reliable publisher wants the message to survive a broker restart.
    props = {"delivery_mode": _PERSISTENT, **message.properties}
    return aio_pika.Message(message.body, message_id=message.message_id, **props).properties


_PERSISTENT = aio_pika.DeliveryMode.PERSISTENT
