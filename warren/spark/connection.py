"""Where the Spark source and sink connect: the `uri` option, or host/port/vhost/user/password;
over TLS with an amqps:// uri (options `cacertfile`, `certfile`, `keyfile`, `verify`, named
after RabbitMQ's ssl_options).

The password is kept out of every repr and log line: a Spark plan, a task's error or a
progress line may print the options."""

from __future__ import annotations

import ssl
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
    # TLS: the CAs to trust (None: the system's), a client certificate and key (for the
    # EXTERNAL mechanism or a broker that asks for one), whether to verify the broker.
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.cacertfile)
        if self.certfile:
            context.load_cert_chain(self.certfile, self.keyfile)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

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


# The connection's options, as documented (Spark passes their names lowercased).
CONNECTION_OPTIONS = ("uri", "host", "port", "vhost", "user", "password", "cacertfile", "certfile", "keyfile",
                      "verify")


def refuse_unknown(options: Mapping[str, str], takes: tuple[str, ...], what: str) -> None:
    """Refuse an option name the source or sink does not take (a misspelt one, or another
    connector's): ignoring it would run the query without what it asked for."""
    known = {name.lower() for name in takes + CONNECTION_OPTIONS}
    unknown = sorted(k for k in options if k.lower() not in known)
    if unknown:
        raise ValueError(f"the warren {what} takes no option {', '.join(map(repr, unknown))}; its options: "
                         f"{', '.join(takes + CONNECTION_OPTIONS)}")


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
    verify = opts.get("verify", "verify_peer")
    if verify not in ("verify_peer", "verify_none"):
        raise ValueError(f"verify must be verify_peer or verify_none, not {verify!r}")
    tls_options = [k for k in ("cacertfile", "certfile", "keyfile", "verify") if k in opts]
    if tls_options and not base.tls:
        raise ValueError(f"{', '.join(tls_options)} need an amqps:// uri")
    return Endpoint(opts.get("host", base.host), port, opts.get("vhost", base.vhost),
                    opts.get("user", base.user), opts.get("password", base.password), base.tls,
                    opts.get("cacertfile"), opts.get("certfile"), opts.get("keyfile"),
                    verify == "verify_peer")
