"""AMQP URIs as RabbitMQ's Erlang client reads them (amqp_client's amqp_uri:parse, 3.10).

"amqp://" (no host) names this broker, directly: a `Direct` with its vhost. A URI with a
host names a broker over the network: a `Network` with what the link needs to connect
(credentials, heartbeat, timeouts, TLS options from an amqps URI's query). A URI amqp_uri
refuses raises UriError with its reason as RabbitMQ prints it (`~p` of the Erlang term), so
validation texts match RabbitMQ's. As in amqp_uri, query keys it does not know are ignored,
and keys it knows but that cannot be set in a query ({parameter_unconfigurable_in_query,...})
are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .erlang import erl_string

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
# amqp_client's #amqp_params_network{} defaults.
DEFAULT_HEARTBEAT = 10
DEFAULT_CONNECTION_TIMEOUT = 60000  # milliseconds
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_FRAME_MAX = 0               # 0: what the server offers
# The record's fields in its order: a query key naming one of those not settable from a
# query is refused; any other key is ignored.
_FIELDS = ("username", "password", "virtual_host", "host", "port", "channel_max", "frame_max",
           "heartbeat", "connection_timeout", "ssl_options", "auth_mechanisms", "client_properties",
           "socket_options")
_INTEGER_FIELDS = ("channel_max", "frame_max", "heartbeat", "connection_timeout")
_MECHANISMS = ("plain", "amqplain", "external")


class UriError(ValueError):
    """amqp_uri refused the URI; `reason` is the Erlang term, printed as RabbitMQ does."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Direct:
    """A URI without a host: this broker's vhost."""

    vhost: str


@dataclass(frozen=True)
class Network:
    """A broker over the network."""

    host: str
    port: int
    vhost: str
    username: str = "guest"
    password: str = "guest"
    heartbeat: int = DEFAULT_HEARTBEAT
    connection_timeout: int = DEFAULT_CONNECTION_TIMEOUT
    channel_max: int = DEFAULT_CHANNEL_MAX
    frame_max: int = DEFAULT_FRAME_MAX
    mechanisms: tuple[str, ...] = ("plain", "amqplain")
    tls: dict[str, Any] | None = None  # amqps: the TLS options of the query (cacertfile, verify...)


_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.S)


def parse(uri: str, default_vhost: str = "/") -> Direct | Network:
    """amqp_uri:parse: the endpoint a URI names, or UriError."""
    m = _URI.match(uri)
    if m is None:
        raise UriError("{unable_to_parse_uri,no_scheme}")
    scheme, rest = m.group("scheme").lower(), m.group("rest")
    if not rest.startswith("//"):
        raise UriError("{unable_to_parse_uri,{malformed_uri," + erl_string(uri) + "}}")
    rest = rest[2:]
    cut = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            cut = min(cut, at)
    authority, tail = rest[:cut], rest[cut:]
    path, _, query_text = tail.partition("?")
    path = path.partition("#")[0]
    query_text = query_text.partition("#")[0]
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        userinfo, hostport = "", authority
    host, port = _host_port(uri, hostport)
    query = _query(query_text)
    if scheme not in ("amqp", "amqps"):
        raise UriError("{unexpected_uri_scheme," + erl_string(scheme) + "}")
    if port is not None and not 0 < port <= 65535:
        raise UriError(f"{{port_out_of_range,{port}}}")
    if not path:
        vhost = default_vhost
    else:
        vhost_part = path[1:]
        if "/" in vhost_part:
            raise UriError("{invalid_vhost," + erl_string(vhost_part) + "}")
        vhost = _unescape(vhost_part)
    if host is None:
        if port is not None:
            raise UriError("port_requires_host")
        return Direct(vhost)
    mechanisms = tuple(v for k, v in query if k == "auth_mechanism") or ("plain", "amqplain")
    for mech in mechanisms:
        if mech not in _MECHANISMS:
            raise UriError("{not_mechanism,[" + ",".join(mech.split(":")) + "]}")
    values: dict[str, Any] = {}
    if userinfo:
        user, colon, password = userinfo.partition(":")
        values["username"] = _unescape(user)
        if colon:
            values["password"] = _unescape(password.partition(":")[0])
    tls = _tls_options(query) if scheme == "amqps" else None
    for name in _FIELDS:
        raw = next((v for k, v in query if k == name), None)
        if raw is None:
            continue
        if name in _INTEGER_FIELDS:
            values[name] = _integer(name, raw, query)
        elif name == "password":
            values[name] = raw
        else:
            raise UriError("{parameter_unconfigurable_in_query," + name + "," + erl_string(raw) + "}")
    default_port = DEFAULT_TLS_PORT if scheme == "amqps" else DEFAULT_PORT
    return Network(host=_unescape(host), port=port if port is not None else default_port, vhost=vhost,
                   mechanisms=mechanisms, tls=tls, **values)


def remove_credentials(uri: str) -> str:
    """amqp_uri:remove_credentials: scheme, host, port and path (no user, password or query)."""
    m = _URI.match(uri)
    if m is None or not m.group("rest").startswith("//"):
        return uri
    rest = m.group("rest")[2:]
    cut = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            cut = min(cut, at)
    authority, tail = rest[:cut], rest[cut:]
    hostport = authority.rpartition("@")[2]
    path = tail.partition("?")[0].partition("#")[0]
    return f"{m.group('scheme')}://{hostport}{path}"


def _host_port(uri: str, hostport: str) -> tuple[str | None, int | None]:
    if hostport.startswith("["):
        end = hostport.find("]")
        if end == -1:
            raise UriError("{unable_to_parse_uri,{malformed_uri," + erl_string(uri) + "}}")
        host, after = hostport[1:end], hostport[end + 1:]
        if after and not after.startswith(":"):
            raise UriError("{unable_to_parse_uri,{malformed_uri," + erl_string(uri) + "}}")
        port_text = after[1:] if after else None
    else:
        host, colon, port_text_ = hostport.partition(":")
        port_text = port_text_ if colon else None
    port = None
    if port_text:
        if not port_text.isdigit():
            raise UriError("{unable_to_parse_uri,{malformed_uri," + erl_string(uri) + "}}")
        port = int(port_text)
    return (host or None), port


def _query(text: str) -> list[tuple[str, str]]:
    """The query's key=value pairs (a key without "=" is proplists' short form: skipped)."""
    pairs = []
    for item in text.split("&") if text else []:
        key, eq, value = item.partition("=")
        if eq:
            pairs.append((_unescape(key), value))
    return pairs


def _unescape(text: str) -> str:
    """amqp_uri's unescape_string: %XX escapes, as UTF-8."""
    if "%" not in text:
        return text
    out = bytearray()
    i = 0
    raw = text.encode("utf-8", "surrogateescape")
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # %
            if len(raw) - i < 3:
                raise UriError("{unterminated_entity," + erl_string(raw[i:].decode("utf-8", "replace")) + "}")
            digits = raw[i + 1:i + 3].decode("ascii", "replace")
            try:
                out.append(int(digits, 16))
            except ValueError:
                raise UriError("{invalid_entitiy," + erl_string("%" + digits) + "}") from None
            i += 3
        else:
            out.append(c)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def _integer(name: str, raw: str, query: list[tuple[str, str]]) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", raw):
        raise UriError("{invalid_amqp_params_parameter," + name + "," + erl_string(raw) + ","
                       + _query_term(query) + ",{not_an_integer," + erl_string(raw) + "}}")
    return int(raw)


def _query_term(query: list[tuple[str, str]]) -> str:
    return "[" + ",".join("{" + erl_string(k) + "," + erl_string(v) + "}" for k, v in query) + "]"


def _tls_options(query: list[tuple[str, str]]) -> dict[str, Any]:
    """An amqps URI's TLS keys (build_ssl_broker): paths, verify, fail_if_no_peer_cert,
    password, server_name_indication ("disable" or a name), depth."""
    options: dict[str, Any] = {}
    for key in ("cacertfile", "certfile", "keyfile", "verify", "fail_if_no_peer_cert", "password",
                "server_name_indication", "depth"):
        raw = next((v for k, v in query if k == key), None)
        if raw is None:
            continue
        if key == "fail_if_no_peer_cert":
            if raw not in ("true", "false"):
                raise UriError("{invalid_ssl_parameter,fail_if_no_peer_cert," + erl_string(raw) + ","
                               + _query_term(query) + ",{require_boolean," + _atom(raw) + "}}")
            options[key] = raw == "true"
        elif key == "depth":
            if not re.fullmatch(r"[+-]?[0-9]+", raw):
                raise UriError("{invalid_ssl_parameter,depth," + erl_string(raw) + ","
                               + _query_term(query) + ",{not_an_integer," + erl_string(raw) + "}}")
            options[key] = int(raw)
        else:
            options[key] = _unescape(raw)
    return options


def _atom(text: str) -> str:
    return text if re.fullmatch(r"[a-z][A-Za-z0-9_@]*", text) else "'" + text.replace("'", "\\'") + "'"
