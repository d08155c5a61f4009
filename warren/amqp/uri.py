"""AMQP URIs as RabbitMQ's Erlang client reads them (amqp_client's amqp_uri:parse and its
uri_parser, 3.10.8).

"amqp://" (no host) names this broker, directly: a `Direct` with its vhost. A URI with a
host names a broker over the network: a `Network` with what the link needs to connect
(credentials, heartbeat, timeouts, TLS options from an amqps URI's query). A URI amqp_uri
refuses raises UriError with the Erlang term it fails with; invalid_uri (in
warren.broker.parameter_validation) prints it with ~p, so validation texts match RabbitMQ's.
The parse follows amqp_uri step by step because its order decides which error a URI with
several faults gets, and its quirks are what RabbitMQ accepts: userinfo split on every ":",
query values taken raw (only TLS paths and passwords percent-decoded), the first of a repeated
key, query keys checked in the record's field order.

As amqp_uri works on the URI's bytes (a JSON string's UTF-8), so does this module: its
"chars" are a str of one character per byte (Latin-1), turned back into text at the end.

Warren refuses on purpose (UriError with an `Unsupported` text) what amqp_uri takes but
Warren's links cannot use: an auth_mechanism other than plain, amqplain and external.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .erlang import Atom

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
# amqp_client's #amqp_params_network{} defaults.
DEFAULT_HEARTBEAT = 10
DEFAULT_CONNECTION_TIMEOUT = 60000  # milliseconds
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_FRAME_MAX = 0               # 0: what the server offers
# The records' fields in their order: broker_add_query looks each up in the query, in this
# order; a field not settable from a query is refused, any other key ignored.
_NETWORK_FIELDS = ("username", "password", "virtual_host", "host", "port", "channel_max", "frame_max",
                   "heartbeat", "connection_timeout", "ssl_options", "auth_mechanisms", "client_properties",
                   "socket_options")
_DIRECT_FIELDS = ("username", "password", "virtual_host", "node", "adapter_info", "client_properties")
_INTEGER_FIELDS = ("channel_max", "frame_max", "heartbeat", "connection_timeout")
# build_ssl_broker's keys, in its order, and how each is read.
_TLS_KEYS = (("cacertfile", "path"), ("certfile", "path"), ("keyfile", "path"), ("verify", "atom"),
             ("fail_if_no_peer_cert", "boolean"), ("password", "identity"), ("server_name_indication", "sni"),
             ("depth", "integer"))
# The mechanisms Warren's links speak (warren.amqp.client), as amqp_auth_mechanisms names them.
_MECHANISMS = ("plain", "amqplain", "external")
_MECHANISM_MODULE = "amqp_auth_mechanisms"
# Erlang's list_to_integer: an optional sign and ASCII digits (base 10, or 16 for an escape).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_HEX = re.compile(r"[+-]?[0-9A-Fa-f]+")
_MAX_ATOM = 255  # list_to_atom's limit, in characters


class UriError(ValueError):
    """amqp_uri refused the URI: `reason` is the Erlang term it failed with (atoms as
    erlang.Atom, strings as lists of character codes, binaries as bytes), or an `Unsupported`
    text for what Warren refuses on purpose."""

    def __init__(self, reason: object):
        super().__init__(reason)
        self.reason = reason


class Unsupported(str):
    """Warren's own words for a URI amqp_uri takes but Warren's links cannot use."""


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


def _s(chars: str) -> list[int]:
    """An Erlang string (a list of character codes)."""
    return [ord(c) for c in chars]


class _Caller:
    """Where the stack trace of a non-numeric port ends: the function that called
    amqp_uri:parse, which invalid_uri fills in (with_caller)."""

    def __repr__(self) -> str:
        return "CALLER"


CALLER = _Caller()


def stack_frame(module: str, function: str, arity: int, line: int) -> tuple:
    """A frame of an Erlang stack trace: {Module,Function,Arity,[{file,...},{line,...}]}."""
    return (Atom(module), Atom(function), arity, [(Atom("file"), _s(module + ".erl")), (Atom("line"), line)])


# The callers of amqp_uri:parse in RabbitMQ 3.10.8, as their frame appears in that trace.
SHOVEL_CALLER = stack_frame("rabbit_shovel_parameters", "validate_uri", 3, 181)
FEDERATION_CALLER = stack_frame("rabbit_federation_parameters", "validate_uri", 2, 99)


def with_caller(term: object, frame: tuple) -> object:
    """The term with the CALLER placeholder replaced by `frame`."""
    if term is CALLER:
        return frame
    if isinstance(term, tuple):
        return tuple(with_caller(t, frame) for t in term)
    if isinstance(term, list):
        return [with_caller(t, frame) for t in term]
    return term


# ---------------------------------------------------------------- errors as amqp_uri makes them
class _Throw(Exception):
    """throw(Term) in amqp_uri or uri_parser (fail/1): caught by their `catch throw:`."""

    def __init__(self, term: object):
        super().__init__(term)
        self.term = term


class _Error(_Throw):
    """An Erlang error (badarg, case_clause, system_limit...): only amqp_uri:parse's own
    `catch error:` takes it."""


def _chars(text: str) -> str:
    """A JSON string as Erlang's binary_to_list sees it: one character per UTF-8 byte."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1")


def _text(codes: list[int], what: str) -> str:
    """Bytes amqp_uri made (one per code) as the text they encode. A code outside 0..255 (from
    an escape such as %-1) names nothing Warren can connect to: refused."""
    if any(not 0 <= c <= 255 for c in codes):
        raise UriError(Unsupported(f"the {what} has an escape that is not a byte (such as %-1)"))
    return bytes(codes).decode("utf-8", "surrogateescape")


def _list_to_binary(codes: list[int]) -> bytes:
    if any(not 0 <= c <= 255 for c in codes):
        raise _Error(Atom("badarg"))
    return bytes(codes)


def _list_to_atom(chars: str) -> Atom:
    if len(chars) > _MAX_ATOM:
        raise _Error(Atom("system_limit"))
    return Atom(chars)


def _to_lower(chars: str) -> str:
    """string:to_lower of a Latin-1 list: A-Z and the accented capitals."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" or "\u00c0" <= c <= "\u00de" and c != "\u00d7" else c
                   for c in chars)


# ---------------------------------------------------------------- uri_parser
@dataclass
class _Parsed:
    """uri_parser:parse's key list, merged with amqp_uri's defaults (undefined: None)."""

    scheme: str
    userinfo: list[str] | None  # None: no authority ("amqp:x")
    host: str | None
    port: int | None
    path: str | None
    query: list  # items: (key, value) for "k=v", the string itself for "k"


def _badarg_trace(port: str, line: int) -> tuple:
    """The {'EXIT',{badarg,Stack}} uri_parser's catch makes of list_to_integer(Port)."""
    stack = [(Atom("erlang"), Atom("list_to_integer"), [_s(port)],
              [(Atom("error_info"), {Atom("module"): Atom("erl_erts_errors")})]),
             stack_frame("uri_parser", "parse_host_port", 1, line), stack_frame("uri_parser", "parse_authority", 1, 84),
             stack_frame("uri_parser", "parse_uri_rest", 2, 69), stack_frame("uri_parser", "parse", 2, 51),
             stack_frame("amqp_uri", "parse1", 2, 74), stack_frame("amqp_uri", "parse", 2, 67),
             CALLER]  # (8 frames: Erlang's backtrace_depth)
    return (Atom("EXIT"), (Atom("badarg"), stack))


def _port(text: str, line: int) -> int:
    if not _INTEGER.fullmatch(text):
        raise _Error(_badarg_trace(text, line))
    return int(text)


def _split(text: str, pattern: str) -> tuple[str, str] | None:
    """uri_parser:split_uri: around the first match of a one-character pattern."""
    m = re.search(pattern, text)
    return None if m is None else (text[:m.start()], text[m.start() + 1:])


def _uri_parser(uri: str) -> _Parsed:
    """uri_parser:parse: the scheme up to the first ":", an authority after "//" (userinfo up
    to the first "@", a host and a port up to the first ":"), the path, query and fragment."""
    scheme_rest = _split(uri, ":")
    if scheme_rest is None:
        raise _Throw((Atom("unable_to_parse_uri"), Atom("no_scheme")))
    scheme, rest = scheme_rest
    try:
        userinfo, host, port, path_etc = None, None, None, rest
        if rest.startswith("//"):
            part = rest[2:]
            m = re.search(r"[/?#]", part)
            authority, path_etc = (part, "") if m is None else (part[:m.start()], part[m.start():])
            userinfo, host, port = _authority(authority)
        path_query = path_etc.partition("#")[0]
        path, _, query = path_query.partition("?")
    except _Throw as failure:  # (uri_parser's `catch`: a throw's term, an error's 'EXIT')
        raise _Throw((Atom("unable_to_parse_uri"), (Atom("malformed_uri"), _s(uri), failure.term))) from None
    return _Parsed(scheme, userinfo, host or None, port, path or None, _query(query))


def _authority(authority: str) -> tuple[list[str], str, int | None]:
    userinfo_host = _split(authority, "@")
    userinfo, hostport = userinfo_host if userinfo_host else ("", authority)
    if hostport.startswith("["):  # IPv6
        host, colon_port = _split(hostport[1:], r"\]") or (hostport[1:], "")
        at = colon_port.find(":")
        if at == -1:
            if colon_port:
                raise _Throw((Atom("invalid_port"), _s(colon_port)))
            port = None
        else:
            port = _port(colon_port[at + 1:], 93)
    else:
        host, colon, port_text = hostport.partition(":")
        port = _port(port_text, 100) if colon else None
    return ([] if not userinfo else userinfo.split(":")), host, port


def _query(text: str) -> list:
    if not text:
        return []
    return [tuple(item.split("=", 1)) if "=" in item else item for item in text.split("&")]


def _query_term(query: list) -> list:
    return [(_s(item[0]), _s(item[1])) if isinstance(item, tuple) else _s(item) for item in query]


def _first(query: list, key: str) -> str | None:
    """proplists:get_value / lists:keysearch: the value of the first "key=value"."""
    return next((item[1] for item in query if isinstance(item, tuple) and item[0] == key), None)


# ---------------------------------------------------------------- amqp_uri
def parse(uri: str, default_vhost: str = "/", node: str = "nonode@nohost") -> Direct | Network:
    """amqp_uri:parse: the endpoint a URI names, or UriError. `node` is the node's name as
    the record of a direct URI holds it (it appears in one of amqp_uri's errors)."""
    chars = _chars(uri)
    try:
        params = _parse1(chars, _chars(default_vhost), node)
    except _Throw as failure:
        raise UriError(failure.term) from None
    return _endpoint(params)


def _parse1(uri: str, default_vhost: str, node: str) -> dict[str, Any]:
    parsed = _uri_parser(uri)
    scheme = _to_lower(parsed.scheme)
    if scheme == "amqp":
        params = _build_broker(parsed, default_vhost, node)
    elif scheme == "amqps":
        params = _build_ssl_broker(parsed, default_vhost, node)
    else:
        raise _Throw((Atom("unexpected_uri_scheme"), _s(scheme)))
    return _broker_add_query(params, parsed.query)


def _unescape(chars: str) -> list[int]:
    """unescape_string: %XX escapes (list_to_integer base 16, so a sign passes: %-1 is -1)."""
    out: list[int] = []
    i = 0
    while i < len(chars):
        c = chars[i]
        if c != "%":
            out.append(ord(c))
            i += 1
        elif len(chars) - i >= 3:
            digits = chars[i + 1:i + 3]
            if not _HEX.fullmatch(digits):
                raise _Throw((Atom("invalid_entitiy"), [Atom("%")] + _s(digits)))
            out.append(int(digits, 16))
            i += 3
        else:
            raise _Throw((Atom("unterminated_entity"), [Atom("%")] + _s(chars[i + 1:])))
    return out


def _build_broker(parsed: _Parsed, default_vhost: str, node: str) -> dict[str, Any]:
    """build_broker: a record of amqp_params_direct or amqp_params_network, as a dict."""
    port = parsed.port
    if port is not None and not 0 < port <= 65535:
        raise _Throw((Atom("port_out_of_range"), port))
    if parsed.path is None:
        vhost = default_vhost.encode("latin-1")
    elif parsed.path.startswith("/"):
        rest = parsed.path[1:]
        if "/" in rest:
            raise _Throw((Atom("invalid_vhost"), _s(rest)))
        vhost = _list_to_binary(_unescape(rest))
    else:
        raise _Error((Atom("case_clause"), _s(parsed.path)))
    host = _unescape(parsed.host) if parsed.host is not None else None
    params: dict[str, Any]
    if host is None and port is None:
        params = {"record": "amqp_params_direct", "username": Atom("none"), "password": Atom("none"),
                  "virtual_host": vhost, "node": Atom(node)}
    elif host is None:
        raise _Throw(Atom("port_requires_host"))
    else:
        params = {"record": "amqp_params_network", "username": b"guest", "password": b"guest",
                  "virtual_host": vhost, "host": host, "port": port, "auth_mechanisms": _mechanisms(parsed.query)}
    if parsed.userinfo is None:
        raise _Error((Atom("case_clause"), Atom("undefined")))
    if parsed.userinfo:
        params["username"] = _list_to_binary(_unescape(parsed.userinfo[0]))
        if len(parsed.userinfo) > 1:
            params["password"] = _list_to_binary(_unescape(parsed.userinfo[1]))
    return params


def _mechanisms(query: list) -> list[list[str]]:
    """Each auth_mechanism as its ":"-separated names (string:tokens: empty ones dropped)."""
    values = [item[1] for item in query if isinstance(item, tuple) and item[0] == "auth_mechanism"]
    mechanisms = []
    for value in values or ["plain", "amqplain"]:
        names = [_list_to_atom(token) for token in value.split(":") if token]
        if len(names) not in (1, 2):
            raise _Throw((Atom("not_mechanism"), names))
        mechanisms.append([str(n) for n in names])
    return mechanisms


def _build_ssl_broker(parsed: _Parsed, default_vhost: str, node: str) -> dict[str, Any]:
    params = _build_broker(parsed, default_vhost, node)
    options: dict[str, Any] = {}
    for key, kind in _TLS_KEYS:
        raw = _first(parsed.query, key)
        if raw is None:
            continue
        try:
            options[key] = _tls_value(kind, raw)
        except _Error:
            raise
        except _Throw as failure:
            raise _Throw((Atom("invalid_ssl_parameter"), Atom(key), _s(raw), _query_term(parsed.query),
                          failure.term)) from None
    if params["record"] == "amqp_params_direct":  # (Params0#amqp_params_network{} of a direct record)
        raise _Error((Atom("badrecord"), (Atom("amqp_params_direct"), params["username"], params["password"],
                                          params["virtual_host"], params["node"], Atom("none"), [])))
    params["ssl_options"] = options
    return params


def _tls_value(kind: str, raw: str) -> object:
    if kind == "atom":
        return _list_to_atom(raw)
    if kind == "boolean":
        value = _list_to_atom(raw)
        if value not in ("true", "false"):
            raise _Throw((Atom("require_boolean"), value))
        return value == "true"
    if kind == "integer":
        return _integer(raw)
    if kind == "sni" and raw == "disable":
        return Atom("disable")
    return _unescape(raw)


def _integer(raw: str) -> int:
    if not _INTEGER.fullmatch(raw):
        raise _Throw((Atom("not_an_integer"), _s(raw)))
    return int(raw)


def _broker_add_query(params: dict[str, Any], query: list) -> dict[str, Any]:
    fields = _DIRECT_FIELDS if params["record"] == "amqp_params_direct" else _NETWORK_FIELDS
    for field in fields:
        raw = _first(query, field)
        if raw is None:
            continue
        try:
            if field in _INTEGER_FIELDS and params["record"] == "amqp_params_network":
                params[field] = _integer(raw)
            elif field == "password":
                params[field] = raw  # (the raw value: not percent-decoded)
            else:
                raise _Throw((Atom("parameter_unconfigurable_in_query"), Atom(field), _s(raw)))
        except _Throw as failure:
            raise _Throw((Atom("invalid_amqp_params_parameter"), Atom(field), _s(raw), _query_term(query),
                          failure.term)) from None
    return params


# ---------------------------------------------------------------- what Warren connects to
def _endpoint(params: dict[str, Any]) -> Direct | Network:
    """The record amqp_uri made, as Warren's endpoint; UriError (Unsupported) for what
    Warren's links cannot do."""
    vhost = params["virtual_host"].decode("utf-8", "surrogateescape")
    if params["record"] == "amqp_params_direct":
        return Direct(vhost)
    options = params.get("ssl_options")
    values: dict[str, Any] = {name: params[name] for name in _INTEGER_FIELDS if name in params}
    values["username"] = params["username"].decode("utf-8", "surrogateescape")
    password = params["password"]
    values["password"] = (password.decode("utf-8", "surrogateescape") if isinstance(password, bytes)
                          else _text(_s(password), "password"))
    port = params["port"]
    if port is None:
        port = DEFAULT_TLS_PORT if options is not None else DEFAULT_PORT
    return Network(host=_text(params["host"], "host"), port=port, vhost=vhost,
                   mechanisms=tuple(_mechanism(names) for names in params["auth_mechanisms"]),
                   tls=None if options is None else _tls_options(options), **values)


def _mechanism(names: list[str]) -> str:
    """An auth_mechanism (`name` of amqp_auth_mechanisms, or `module:function`) as the SASL
    mechanism Warren's link speaks. RabbitMQ's shovel calls the function at connect (and
    crashes if there is none); Warren has only these three."""
    module, name = names if len(names) == 2 else (_MECHANISM_MODULE, names[0])
    if module == _MECHANISM_MODULE and name in _MECHANISMS:
        return name
    given = _text(_s(":".join(names)), "auth_mechanism")
    raise UriError(Unsupported(
        f'auth_mechanism "{given}" is not one Warren\'s links can log in with (plain, amqplain, external, '
        f"or those as {_MECHANISM_MODULE}:NAME)"))


def _tls_options(options: dict[str, Any]) -> dict[str, Any]:
    """build_ssl_broker's options as the link takes them: paths, password and a server name
    as text, verify as its atom's name, fail_if_no_peer_cert a bool, depth an int."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Atom):
            out[key] = _text(_s(str(value)), key)
        elif isinstance(value, list):
            out[key] = _text(value, key)
        else:
            out[key] = value
    return out


def remove_credentials(uri: str) -> str:
    """amqp_uri:remove_credentials: scheme://host[:port]path, as uri_parser reads them
    (no userinfo, query or fragment; an IPv6 host without its brackets; the path raw)."""
    try:
        parsed = _uri_parser(_chars(uri))
    except _Throw:
        return uri
    port = "" if parsed.port is None else f":{parsed.port}"
    text = f"{parsed.scheme}://{parsed.host or ''}{port}{parsed.path or ''}"
    return text.encode("latin-1").decode("utf-8", "surrogateescape")
