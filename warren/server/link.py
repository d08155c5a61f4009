"""A link to another broker: one AMQP 0-9-1 client connection with one channel, the asyncio
shell around the sans-IO client (warren.amqp.client). Shovels (and federation) use it for an
end that is not on this broker.

A link reports what happens to its `owner` (LinkOwner): deliveries, confirms, a consumer the
broker cancelled, and, once, that it closed and why. Its failures carry the reason as
RabbitMQ's shovel status prints it (an Erlang term), so /api/shovels reads the same.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any, Protocol

from ..amqp import spec
from ..amqp.body import Body
from ..amqp.client import Client, ProtocolError
from ..amqp.erlang import erl_string
from ..amqp.spec import Method
from ..amqp.uri import Network

log = logging.getLogger("warren.link")

PRODUCT = "Warren"


class LinkError(Exception):
    """A link could not open, or a call on it failed; `reason` is printed as RabbitMQ's
    shovel status does (an Erlang term)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ChannelClosed(LinkError):
    """The broker closed the channel in reply to a call (`code`: its reply code)."""

    def __init__(self, reason: str, code: int):
        super().__init__(reason)
        self.code = code


class LinkOwner(Protocol):
    def link_delivery(self, link: Link, delivery_tag: int, redelivered: bool, route: bytes, header: bytes,
                      body: bytes) -> None: ...

    def link_confirmed(self, link: Link, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def link_cancelled(self, link: Link) -> None:
        """The broker cancelled the link's consumer (its queue was deleted)."""

    def link_closed(self, link: Link, reason: str) -> None:
        """The link is gone (closed by either side, or its connection died)."""

    def link_writable(self, link: Link) -> None:
        """The link's socket buffer drained after it was full."""


def client_context(tls: dict[str, Any], host: str) -> tuple[ssl.SSLContext, str | None]:
    """An amqps URI's TLS options as a client context (amqp_ssl): verify_peer checks the
    server's certificate against cacertfile (and the host name, unless
    server_name_indication=disable); verify_none, the default of RabbitMQ 3.10's client,
    does not."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.get("verify", "verify_none") not in ("verify_none", "verify_peer"):
        raise LinkError("{options,{verify," + str(tls["verify"]) + "}}")  # (as ssl refuses it at connect)
    verify = tls.get("verify", "verify_none") == "verify_peer"
    sni = tls.get("server_name_indication")
    server_name: str | None = None if sni == "disable" else (sni or host)
    context.check_hostname = verify and sni != "disable"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    try:
        if tls.get("cacertfile"):
            context.load_verify_locations(cafile=tls["cacertfile"])
        if tls.get("certfile"):
            context.load_cert_chain(tls["certfile"], tls.get("keyfile"), password=tls.get("password"))
    except (OSError, ssl.SSLError) as err:
        raise LinkError("{options," + erl_string(str(err)) + "}") from None
    return context, server_name


class Link(asyncio.Protocol):
    """One connection to another broker, channel 1 open (in confirm mode if asked)."""

    def __init__(self, owner: LinkOwner, endpoint: Network, name: str):
        self.owner = owner
        self.endpoint = endpoint
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.client = Client(self, endpoint.vhost, endpoint.username, endpoint.password, endpoint.mechanisms,
                             endpoint.heartbeat, endpoint.channel_max, endpoint.frame_max, {
                                 "product": PRODUCT, "connection_name": name,
                                 "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                                                  "basic.nack": True, "connection.blocked": True,
                                                  "authentication_failure_close": True,
                                                  "exchange_exchange_bindings": True}})
        self.closed = False
        self.writable = True
        self.is_blocked = False  # connection.blocked by the broker (a resource alarm there)
        self._opened: asyncio.Future | None = None
        self._reply: asyncio.Future | None = None
        self._expect: tuple[type, ...] = ()
        self._flush_pending = False
        self._heartbeat: asyncio.TimerHandle | None = None
        self._sent = False
        self._silent_ticks = 0
        self.confirming = False
        self.next_publish = 1  # the delivery tag of the next publish (confirm mode)

    # -------------------------------------------------------------- opening
    async def open(self, confirm: bool) -> None:
        """Connect, authenticate, open the vhost and channel 1; LinkError with RabbitMQ's reason."""
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        for key, limit in (("heartbeat", 0xFFFF), ("channel_max", 0xFFFF), ("frame_max", 0xFFFFFFFF)):
            value = getattr(ep, key)
            if not 0 <= value <= limit:  # (amqp_uri takes any integer; the connection then fails)
                raise LinkError("{invalid_" + key + "," + str(value) + "}")
        timeout = ep.connection_timeout / 1000 if ep.connection_timeout > 0 else None
        context = server_name = None
        if ep.tls is not None:
            context, server_name = client_context(ep.tls, ep.host)
        self._opened = loop.create_future()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, ep.host, ep.port, ssl=context,
                                                          server_hostname=server_name if context else None),
                                   timeout)
            await asyncio.wait_for(asyncio.shield(self._opened), timeout)
        except asyncio.TimeoutError:
            self.abort()
            raise LinkError("timeout") from None
        except ssl.SSLError as err:
            self.abort()
            raise LinkError("{tls_alert," + erl_string(err.reason or str(err)) + "}") from None
        except (socket.gaierror, OSError) as err:
            self.abort()
            raise LinkError(_socket_reason(err)) from None
        await self.call(spec.ChannelOpen(), spec.ChannelOpenOk)
        if confirm:
            await self.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
            self.confirming = True
        if self.client.heartbeat:
            self._heartbeat = loop.call_later(self.client.heartbeat / 2, self._heartbeat_tick)

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=4 << 20)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._write()

    # -------------------------------------------------------------- calls
    async def call(self, method: Method, *replies: type) -> Method:
        """Send a synchronous method on channel 1 and wait for its reply; LinkError if the
        broker closes the channel or the connection instead."""
        if self.closed:
            raise LinkError("closed")
        loop = asyncio.get_running_loop()
        self._reply = loop.create_future()
        self._expect = replies
        self.client.send(method)
        self._write()
        try:
            return await self._reply
        finally:
            self._reply = None

    async def reopen(self) -> None:
        """Open channel 1 again after the broker closed it (ChannelClosed)."""
        await self.call(spec.ChannelOpen(), spec.ChannelOpenOk)
        if self.confirming:
            await self.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
            self.next_publish = 1

    def publish(self, route: bytes, header: bytes, body: Body) -> int:
        """basic.publish; the delivery tag its confirm will name (confirm mode)."""
        self.client.publish(route, header, body)
        tag = self.next_publish
        self.next_publish = tag + 1
        self._flush_soon()
        return tag

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        if not self.closed:
            self.client.ack(delivery_tag, multiple)
            self._flush_soon()

    def nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        if not self.closed:
            self.client.nack(delivery_tag, multiple, requeue)
            self._flush_soon()

    def pause(self) -> None:
        """Stop reading from the broker (a consumer without acks that must not outrun us)."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close politely (connection.close); the socket goes once the broker answers, or
        after a second."""
        if self.closed:
            return
        if self.client.open:
            self.client.close()
            self._write()
            asyncio.get_running_loop().call_later(1.0, self.abort)
        else:
            self.abort()
        self._gone("shutdown", notify=False)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------------- protocol
    def data_received(self, data: bytes) -> None:
        try:
            self.client.receive(data)
        except (ProtocolError, ValueError) as err:
            log.error("Link %s: %s", self.name, err)
            self.abort()
            self._gone("{protocol_error," + erl_string(str(err)) + "}")
            return
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        reason = _socket_reason(exc) if isinstance(exc, OSError) else "{shutdown,{connection_closing,socket_closed_unexpectedly}}"
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(LinkError("{socket_closed_unexpectedly,'connection.start'}"
                                                 if not self.client.open else reason))
        self._gone(reason)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        if not self.closed:
            self.owner.link_writable(self)

    # -------------------------------------------------------------- ClientEvents
    def opened(self) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)

    def method(self, method: Any) -> None:
        if isinstance(method, spec.ChannelClose):
            code, text = getattr(method, "reply_code"), getattr(method, "reply_text")
            reason = "{shutdown,{server_initiated_close," + str(code) + "," + _binary(text) + "}}"
            if self._reply is not None and not self._reply.done():
                # A call refused (a passive declare of a missing queue): the caller may
                # open the channel again (reopen()).
                self._reply.set_exception(ChannelClosed(reason, code))
                return
            self.close()
            self._gone(reason)
            return
        if isinstance(method, spec.BasicCancel):
            self.owner.link_cancelled(self)
            return
        if self._reply is not None and not self._reply.done() and isinstance(method, self._expect):
            self._reply.set_result(method)

    def delivery(self, delivery_tag: int, redelivered: bool, route: bytes, header: bytes, body: bytes) -> None:
        self.owner.link_delivery(self, delivery_tag, redelivered, route, header, body)

    def confirmed(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.owner.link_confirmed(self, delivery_tag, multiple, ack)

    def connection_closed(self, code: int, text: str) -> None:
        reason = ("{shutdown,{server_initiated_close," + str(code) + "," + _binary(text) + "}}")
        if self._opened is not None and not self._opened.done():
            # Refused while opening: a wrong password (403) or a vhost it may not use.
            if code == 403 and "ACCESS_REFUSED" in text and "Login was refused" in text:
                reason = "{auth_failure," + erl_string(text) + "}"
            elif code == 530:  # (amqp_network_connection: a vhost it may not open)
                reason = "not_allowed"
            else:
                reason = "{error,{server_initiated_close," + str(code) + "," + _binary(text) + "}}"
            self._opened.set_exception(LinkError(reason))
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(LinkError(reason))
        self._write()
        self.abort()
        self._gone(reason)

    def blocked(self, blocked: bool) -> None:
        self.is_blocked = blocked

    # -------------------------------------------------------------- output
    def flush_soon(self) -> None:
        """Write what the client has queued on the loop's next turn."""
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self._write()

    def _write(self) -> None:
        out = self.client.out
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(self.client.take_output())
            self._sent = True

    def _heartbeat_tick(self) -> None:
        """Every half interval: send a heartbeat if nothing else went, and give up after two
        intervals without a byte from the broker (amqp_client's heartbeat timeout)."""
        if self.closed:
            return
        if not self._sent:
            self.client.heartbeat_frame()
            self._write()
        self._sent = False
        if self.client.received:
            self.client.received = False
            self._silent_ticks = 0
        else:
            self._silent_ticks += 1
            if self._silent_ticks >= 4:
                self.abort()
                self._gone("{shutdown,heartbeat_timeout}")
                return
        self._heartbeat = asyncio.get_running_loop().call_later(self.client.heartbeat / 2, self._heartbeat_tick)

    def _gone(self, reason: str, notify: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(LinkError(reason))
        if notify:
            self.owner.link_closed(self, reason)


def _binary(text: str) -> str:
    """An Erlang binary as ~p prints it: <<"text">>."""
    return "<<" + erl_string(text) + ">>"


def _socket_reason(err: BaseException | None) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "econnrefused"
    if isinstance(err, socket.gaierror):
        return "nxdomain"
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, ConnectionResetError):
        return "{shutdown,{connection_closing,econnreset}}"
    if isinstance(err, OSError) and err.errno is not None:
        import errno
        return errno.errorcode.get(err.errno, "error").lower()
    return "{shutdown,{connection_closing,socket_closed_unexpectedly}}"
