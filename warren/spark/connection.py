"""Where the Spark source and sink connect: the `uri` option, or host/port/vhost/user/password.

The password is kept out of every repr and log line: a Spark plan, a task's error or a
progress line may print the options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import quote, unquote, urlsplit


@dataclass(frozen=True)
class Endpoint:
    host: str = "localhost"
    port: int = 5672
    vhost: str = "/"
    user: str = "guest"
    password: str = field(default="guest", repr=False)
    tls: bool = False

    @property
    def url(self) -> str:
        """The amqp:// URL (with the password: never log it; `shown` is for logs)."""
        scheme = "amqps" if self.tls else "amqp"
        return (f"{scheme}://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{self.host}:{self.port}/"
                f"{quote(self.vhost, safe='')}")

    @property
    def shown(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{self.user}@{self.host}:{self.port}/{quote(self.vhost, safe='')}"

    def __str__(self) -> str:
        return self.shown


def endpoint(options: Mapping[str, str]) -> Endpoint:
    """The endpoint the options name (case-insensitive keys, as Spark passes them): `uri`
    first (amqp://user:password@host:port/vhost, the vhost %-encoded: `%2F` is "/"), then
    host, port, vhost, user, password override its parts."""
    opts = {k.lower(): v for k, v in options.items()}
    base = Endpoint()
    uri = opts.get("uri")
    if uri:
        parts = urlsplit(uri)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"uri must start with amqp:// or amqps://, not {parts.scheme}://")
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        base = Endpoint(parts.hostname or "localhost", parts.port or (5671 if parts.scheme == "amqps" else 5672),
                        vhost, unquote(parts.username or "guest"), unquote(parts.password or "guest"),
                        parts.scheme == "amqps")
    try:
        port = int(opts.get("port", base.port))
    except ValueError:
        raise ValueError(f"port must be a number, not {opts['port']!r}") from None
    return Endpoint(opts.get("host", base.host), port, opts.get("vhost", base.vhost),
                    opts.get("user", base.user), opts.get("password", base.password), base.tls)
