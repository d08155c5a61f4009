"""The transport of a connection whose socket is gone (warren.broker.ports.Transport)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..broker.ports import TLSInfo, Transport


class ClosedTransport:
    """What a connection holds in place of its transport once the transport has reported the
    socket gone (Connection.detach): the addresses its log lines and the API name it by, and
    nothing else. Whatever the connection still asks of it (a flush scheduled before the end)
    does nothing, as the server's transport does once closed. Holding this rather than the
    server's protocol, which holds the connection, leaves no reference cycle behind."""

    __slots__ = ("peer", "local", "tls")

    def __init__(self, transport: Transport):
        self.peer: tuple[str, int] = transport.peer
        self.local: tuple[str, int] = transport.local
        self.tls: TLSInfo | None = transport.tls

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, chunks: list) -> None:
        pass

    def close(self) -> None:
        pass

    def close_later(self, seconds: float) -> None:
        pass

    def schedule_flush(self, flush: Callable[[], None]) -> None:
        pass

    def heartbeat_negotiated(self, seconds: int) -> None:
        pass

    def handshake_done(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass
