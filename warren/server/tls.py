"""TLS for the listeners: an ssl.SSLContext from RabbitMQ's ssl_options (or the management
API's management.ssl.*), the TLS layer of an AMQPS connection, and what it tells the session
about its TLS session.

The options are the dict warren.cli.config builds:

  certfile, keyfile   the server's certificate (chain) and key, PEM (both required)
  password            the key's password, if it is encrypted
  cacertfile          the CAs client certificates must chain to (PEM)
  verify              "verify_none" (RabbitMQ's default: no client certificate is asked for)
                      or "verify_peer" (one is asked for, and checked if sent)
  fail_if_no_peer_cert  with verify_peer: a client without a certificate is refused
  versions            ["tlsv1.2", "tlsv1.3"]: the versions allowed (default: both)
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Callable

from ..broker.ports import TLSInfo

log = logging.getLogger("warren.server")

VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
# RabbitMQ's ssl_handshake_timeout default: a client that has not finished the TLS handshake
# after 5 s is disconnected.
HANDSHAKE_TIMEOUT = 5.0


class TLSError(ValueError):
    """The options cannot make a TLS context (a file missing or unreadable, a wrong password,
    a certificate that does not match its key)."""


def server_context(options: dict, what: str = "ssl_options") -> ssl.SSLContext:
    """A server-side context for `options`; TLSError naming the `what.key` at fault."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for key in ("certfile", "keyfile"):
        if not options.get(key):
            raise TLSError(f"{what}.{key} is required for a TLS listener")
    try:
        context.load_cert_chain(options["certfile"], options["keyfile"], password=options.get("password"))
    except (OSError, ssl.SSLError) as err:
        raise TLSError(f"cannot use {what}.certfile {options['certfile']} with {what}.keyfile "
                       f"{options['keyfile']}: {_reason(err)}") from None
    if options.get("cacertfile"):
        try:
            context.load_verify_locations(cafile=options["cacertfile"])
        except (OSError, ssl.SSLError) as err:
            raise TLSError(f"cannot use {what}.cacertfile {options['cacertfile']}: {_reason(err)}") from None
    if options.get("verify") == "verify_peer":
        if not options.get("cacertfile"):
            raise TLSError(f"{what}.verify = verify_peer needs {what}.cacertfile (the CAs that sign "
                           "client certificates)")
        context.verify_mode = ssl.CERT_REQUIRED if options.get("fail_if_no_peer_cert") else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    versions = sorted(VERSIONS[v] for v in options.get("versions") or VERSIONS)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    return context


def _reason(err: Exception) -> str:
    if isinstance(err, ssl.SSLError):
        return err.reason or str(err)
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err)


def session_info(transport) -> TLSInfo | None:
    """The TLS session of an asyncio transport whose handshake is done (None: plain TCP)."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cipher = ssl_object.cipher()
    return TLSInfo(protocol=ssl_object.version() or "", cipher=cipher[0] if cipher else "",
                   peer_cert=ssl_object.getpeercert(binary_form=True))


# The TLS layer ------------------------------------------------------------------------------

READ_SIZE = 256 * 1024  # decrypted bytes handed to the connection per call, at most
# A fatal unexpected_message alert (a TLS 1.0 record, as Erlang's ssl writes it before it knows
# the version): what RabbitMQ answers a client that does not speak TLS at all, such as a
# plaintext AMQP client; OpenSSL sends no alert there.
UNEXPECTED_MESSAGE_ALERT = b"\x15\x03\x01\x00\x02\x02\x0a"


class TLSServerProtocol(asyncio.Protocol):
    """TLS over one accepted TCP connection (ssl.MemoryBIO), in front of the AMQP protocol,
    which gets a transport that encrypts what it writes once the handshake is done.

    Not asyncio's (or uvloop's) own TLS, because on a failed handshake those close the socket
    without sending the alert OpenSSL made: a client with a certificate from another CA, or
    none where one is required, would see an unexplained EOF where RabbitMQ sends "unknown
    CA" or "certificate required". Here the alert goes out, and the failure is logged."""

    def __init__(self, context: ssl.SSLContext, app_factory: Callable[[], asyncio.Protocol],
                 loop: asyncio.AbstractEventLoop, handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.context = context
        self.app_factory = app_factory
        self.loop = loop
        self.handshake_timeout = handshake_timeout
        self.transport: asyncio.Transport | None = None
        self.app: asyncio.Protocol | None = None  # once the handshake is done
        self.app_transport: TLSTransport | None = None
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.ssl: ssl.SSLObject | None = None
        self.closed = False
        self.reading_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.first_bytes = b""  # what the client sent first (to name a plaintext client)
        self.peer = "?"

    # the TCP side ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}"
        self.ssl = self.context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.timer = self.loop.call_later(self.handshake_timeout, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.incoming.write(data)
        if self.app is None:
            if len(self.first_bytes) < 8:
                self.first_bytes += data[:8 - len(self.first_bytes)]
            self._handshake()
        if self.app is not None:
            self._read()

    def eof_received(self) -> bool:
        self.incoming.write_eof()
        if self.app is not None:
            self._read()
        return False  # close

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.app is not None:
            self.app.connection_lost(exc)
            # The TLS transport refers back to this protocol: let both go with the connection,
            # by reference counting (no cycle for the GC to find).
            self.app = self.app_transport = None

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.app is not None:
            self.app.resume_writing()

    # TLS ---------------------------------------------------------------------------------
    def _handshake(self) -> None:
        assert self.ssl is not None and self.transport is not None
        try:
            self.ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except ssl.SSLError as err:
            self._failed(err)
            return
        self._flush()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.app_transport = TLSTransport(self)
        self.app = self.app_factory()
        self.app.connection_made(self.app_transport)

    def _failed(self, err: Exception) -> None:
        """The handshake failed: send the alert OpenSSL made, log why, close."""
        if not self._flush() and self.first_bytes[:1] != b"\x16" and self.transport is not None:
            self.transport.write(UNEXPECTED_MESSAGE_ALERT)  # not a TLS handshake record at all
        reason = getattr(err, "reason", None) or str(err)
        if self.first_bytes.startswith(b"AMQP"):
            reason += " (a plaintext AMQP client on the TLS port)"
        log.warning("TLS handshake from %s failed: %s", self.peer, reason)
        self._close_transport()

    def _handshake_timed_out(self) -> None:
        self.timer = None
        if self.app is None and not self.closed:
            log.warning("TLS handshake timeout from %s", self.peer)
            self._close_transport()

    def _read(self) -> None:
        """Hand the decrypted bytes to the connection (not while it has paused reading)."""
        assert self.ssl is not None and self.app is not None
        while not self.closed and not self.reading_paused and not self._closing():
            try:
                chunk = self.ssl.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):  # close_notify, or the socket closed without
                chunk = b""
            except ssl.SSLError as err:
                log.warning("TLS error from %s: %s", self.peer, getattr(err, "reason", None) or err)
                self._flush()
                self._close_transport()
                return
            if not chunk:
                self._flush()
                self._close_transport()
                return
            self.app.data_received(chunk)
        self._flush()  # (TLS 1.3 may answer a key update)

    def _flush(self) -> bool:
        """Send what TLS has to send; whether there was anything."""
        data = self.outgoing.read()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
        return bool(data)

    def _closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def _close_transport(self) -> None:
        if not self._closing():
            assert self.transport is not None
            self.transport.close()

    # for TLSTransport --------------------------------------------------------------------
    def write(self, data) -> None:
        if self.closed or self.ssl is None:
            return
        view = memoryview(data)
        while view:  # (a memory BIO takes everything; the loop is for partial writes anyway)
            written = self.ssl.write(view)
            view = view[written:]
        self._flush()

    def close(self) -> None:
        if self.ssl is not None and not self.closed:
            try:
                self.ssl.unwrap()  # close_notify
            except (ssl.SSLError, ValueError):
                pass  # (it waits for the client's: SSLWantReadError)
        self._flush()
        self._close_transport()

    def set_reading(self, on: bool) -> None:
        if self.transport is None or self.reading_paused == (not on):
            return
        self.reading_paused = not on
        if on:
            self.transport.resume_reading()
            self.loop.call_soon(self._resume)  # records already received and not yet read
        else:
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.app is not None and not self.closed and not self.reading_paused:
            self._read()


class TLSTransport(asyncio.Transport):
    """The connection's transport over TLS: what it writes is encrypted, and get_extra_info
    answers "ssl_object" (and "cipher", "peercert") as asyncio's TLS transports do."""

    def __init__(self, tls: TLSServerProtocol):
        super().__init__()
        self._tls = tls

    def get_extra_info(self, name, default=None):
        ssl_object = self._tls.ssl
        if name == "ssl_object":
            return ssl_object
        if name == "cipher" and ssl_object is not None:
            return ssl_object.cipher()
        if name == "peercert" and ssl_object is not None:
            return ssl_object.getpeercert()
        assert self._tls.transport is not None
        return self._tls.transport.get_extra_info(name, default)

    def write(self, data) -> None:
        self._tls.write(data)

    def writelines(self, list_of_data) -> None:
        self._tls.write(b"".join(list_of_data))

    def close(self) -> None:
        self._tls.close()

    def is_closing(self) -> bool:
        transport = self._tls.transport
        return self._tls.closed or transport is None or transport.is_closing()

    def abort(self) -> None:
        if self._tls.transport is not None:
            self._tls.transport.abort()

    def pause_reading(self) -> None:
        self._tls.set_reading(False)

    def resume_reading(self) -> None:
        self._tls.set_reading(True)

    def is_reading(self) -> bool:
        return not self._tls.reading_paused

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        if self._tls.transport is not None:
            self._tls.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        transport = self._tls.transport
        return transport.get_write_buffer_size() if transport is not None else 0
