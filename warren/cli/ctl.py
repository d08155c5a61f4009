"""`warrenctl`: the rabbitmqctl of Warren, over the management HTTP API.

The verbs, arguments, informational lines, table columns and exit codes are rabbitmqctl's
(3.10): an informational line ("Listing queues for vhost / ..."), then a tab-separated table
with a header row; `-q` drops the informational line, `--no-table-headers` the header row,
`--formatter json` prints JSON for scripts. Exit codes (sysexits, as rabbitmqctl): 0 ok,
64 usage, 65 bad input data or missing vhost, 67 missing user, 69 broker unreachable,
70 other failures, 77 authentication failed / not authorised.

Which broker: without --host, --port, --user or --password (nor $WARRENCTL_HOST/PORT),
warrenctl talks to the broker of this machine through its control socket
(warren.cli.local: warren-ctl.sock in the data dir, --data-dir or $WARREN_DATA_DIR), which the
broker serves to its own Unix user only and trusts fully, as a node trusts rabbitmqctl
through the Erlang cookie. Without that socket it falls back to the API on localhost as
guest; with any of those flags it always uses the API over TCP with a user (a remote broker).

Only the standard library is used (urllib), and of Warren only warren.amqp's Erlang term
printers (standard library too), so warrenctl runs wherever Python does.
"""

import base64
import difflib
import errno
import functools
import html
import http.client
import json
import os
import re
import socket
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..amqp.codec import allow_nesting
from ..amqp.erlang import erl_ctl
from . import local

EX_OK, EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = 0, 64, 65, 67, 69, 70, 77

PROG = "warrenctl"


class CtlError(Exception):
    """Ends the command: `message` goes to stderr and the process exits with `code`."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class UsageError(CtlError):
    def __init__(self, message: str):
        super().__init__(EX_USAGE, message)


class HttpError(Exception):
    """A non-2xx answer from the API (kept for the verb to turn into its own message)."""

    def __init__(self, status: int, error: str, reason: str, body: dict | None = None):
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.body = body or {}  # the whole JSON answer (a failed health check's details)


# --- the HTTP client ------------------------------------------------------------------------

class UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the broker's control socket)."""

    def __init__(self, path: str, host: str, **kw):
        super().__init__(host, **kw)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout if isinstance(self.timeout, (int, float)) else None)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class UnixHandler(urllib.request.HTTPHandler):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def http_open(self, req):
        return self.do_open(functools.partial(UnixConnection, self.path), req)


# Connecting to the control socket failed in a way that means "no broker behind it" (or not
# ours to use): fall back to the API over TCP.
_NO_CONTROL = (errno.ENOENT, errno.ECONNREFUSED, errno.EACCES, errno.EPERM, errno.ENOTSOCK)


class Api:
    def __init__(self, host: str, port: int, user: str, password: str, timeout: float, answered=None,
                 control_socket: str | None = None):
        self.host, self.port, self.user = host, port, user
        self.answered = answered or (lambda: None)  # called when the API answers (any status)
        self.base = f"http://{host if ':' not in host else '[' + host + ']'}:{port}/api"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout
        self.last_status = None  # of the last successful request (201 created, 204 updated ...)
        # The local broker's control socket, while it is the way in (None: TCP with a user).
        self.control_socket = control_socket
        self.control_refused: str | None = None  # why the socket was given up, for the 401 text
        self._control_used = False  # the broker answered on it: no falling back after that
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), UnixHandler(control_socket)) \
            if control_socket else None

    @property
    def local(self) -> bool:
        """Talking to the local broker through its control socket (fully trusted)."""
        return self.control_socket is not None

    def request(self, method: str, path: str, body=None, headers=None, query=None):
        """The decoded JSON answer (None for an empty body); HttpError for non-2xx; CtlError
        with EX_UNAVAILABLE when nothing answers, EX_NOPERM on 401/403."""
        if self.control_socket is not None:
            try:
                answer = self._request(method, path, body, headers, query)
                self._control_used = True
                return answer
            except HttpError:
                self._control_used = True
                raise
            except _ControlSocketGone as gone:
                if self._control_used:  # the broker went away meanwhile: not another one now
                    raise unreachable(gone.path, gone.reason, True) from None
                # A stale socket (the broker was killed) or one we may not use: as without it.
                self.control_socket, self._opener = None, None
                self.control_refused = f"{gone.path}: {gone.reason}"
        return self._request(method, path, body, headers, query)

    def _request(self, method, path, body, headers, query):
        base = "http://localhost/api" if self.control_socket is not None else self.base
        url = base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        hdrs = {} if self.control_socket is not None else {"Authorization": self.auth}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        where = self.control_socket if self.control_socket is not None else f"{self.host}:{self.port}"
        try:
            if self._opener is not None:
                resp_cm = self._opener.open(req, timeout=self.timeout)
            else:
                resp_cm = urllib.request.urlopen(req, timeout=self.timeout)
            with resp_cm as resp:
                raw = resp.read()
                self.last_status = resp.status
            self.answered()
        except urllib.error.HTTPError as err:
            raw = err.read()
            if err.code not in (401, 403):
                self.answered()
            info = None
            try:
                info = json.loads(raw)
                error, reason = str(info.get("error", "")), str(info.get("reason", ""))
            except (ValueError, AttributeError):
                error, reason = err.reason or "", raw.decode(errors="replace").strip()
            if err.code in (401, 403):
                if self.control_socket is not None:
                    raise CtlError(EX_NOPERM, f"Error: the broker refused warrenctl on its control socket "
                                              f"{where} (HTTP {err.code}: {reason or error}): run warrenctl "
                                              "as the broker's user.") from None
                hint = ""
                if self.control_refused:
                    hint = (f" (The local broker's control socket, which needs no user, could not be used: "
                            f"{self.control_refused}.)")
                raise CtlError(EX_NOPERM, f"Error: authentication failed for user '{self.user}' at "
                                          f"{where} (HTTP {err.code}: {reason or error}). "
                                          "Check --user and --password; the user needs the "
                                          "'administrator' tag (or 'monitoring' to list)." + hint) from None
            raise HttpError(err.code, error, reason, info if isinstance(info, dict) else None) from None
        except urllib.error.URLError as err:
            if self.control_socket is not None and getattr(err.reason, "errno", None) in _NO_CONTROL:
                raise _ControlSocketGone(self.control_socket, err.reason.strerror or str(err.reason)) from None
            raise unreachable(where, err.reason, self.control_socket is not None) from None
        except (http.client.HTTPException, ConnectionError, socket.timeout, OSError) as err:
            raise unreachable(where, err, self.control_socket is not None) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CtlError(EX_UNAVAILABLE, f"Error: {where} answered {method} {path} with something "
                                           "that is not JSON: is it Warren's management port?") from None

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def put(self, path, body, **kw):
        return self.request("PUT", path, body=body, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body=body, **kw)

    def exists(self, path) -> bool:
        try:
            self.get(path)
            return True
        except HttpError as err:
            if err.status == 404:
                return False
            raise


class _ControlSocketGone(Exception):
    """Nothing we may use listens on the control socket (nothing was sent)."""

    def __init__(self, path: str, reason: str):
        super().__init__(reason)
        self.path, self.reason = path, reason


def unreachable(where: str, reason, control_socket: bool = False) -> CtlError:
    if isinstance(reason, (socket.timeout, TimeoutError)):
        why = "timed out"
    elif isinstance(reason, ConnectionRefusedError):
        why = "connection refused"
    elif isinstance(reason, ConnectionResetError):
        why = "connection reset (is that the AMQP port rather than the management port?)"
    elif isinstance(reason, socket.gaierror):
        why = f"cannot resolve the host name ({reason.strerror or reason})"
    elif isinstance(reason, http.client.HTTPException):
        why = "it does not speak HTTP (is that the AMQP port rather than the management port?)"
    else:
        why = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    if control_socket:
        return CtlError(EX_UNAVAILABLE, f"Error: unable to talk to the local Warren broker on its control "
                                        f"socket {where}: {why}.")
    return CtlError(EX_UNAVAILABLE,
                    f"Error: unable to connect to the Warren management API at {where}: {why}.\n"
                    f"Is the broker running with its management API on port {where.rsplit(':', 1)[1]}? "
                    "(see --host and --port; `warren server --management-port`)")


def q(name: str) -> str:
    """One path segment: every byte that is not unreserved percent-encoded (the vhost "/" is %2F)."""
    return urllib.parse.quote(name, safe="")


# --- output ---------------------------------------------------------------------------------

def compact_json(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Output:
    def __init__(self, formatter: str, quiet: bool, silent: bool, headers: bool):
        self.json = formatter == "json"
        self.quiet = quiet or silent or self.json
        self.silent = silent
        self.headers = headers and not silent

        self.pending: list[str] = []

    def info(self, line: str) -> None:
        """An informational line. It waits for the broker's first answer, so that an
        unreachable broker gets only the error."""
        if not self.quiet:
            self.pending.append(line)

    def flush(self) -> None:
        if self.pending:
            print("\n".join(self.pending), flush=True)
            self.pending = []

    def message(self, line: str) -> None:
        """A result line (printed even with -q, as rabbitmqctl; not in JSON mode)."""
        self.flush()
        if not self.json:
            print(line, flush=True)

    def table(self, columns, rows, json_rows=None, empty_line=False) -> None:
        """rows: lists of table cells; json_rows: the same rows as dicts for --formatter json."""
        self.flush()
        if self.json:
            items = json_rows if json_rows is not None else [dict(zip(columns, r)) for r in rows]
            out = "[\n" + "\n,".join(compact_json(i) for i in items) + ("\n" if items else "") + "]"
            print(out, flush=True)
            return
        if not rows:
            if empty_line:
                print()
            return
        lines = []
        if self.headers:
            lines.append("\t".join(columns))
        lines.extend("\t".join(r) for r in rows)
        print("\n".join(lines), flush=True)


# --- info items: rabbitmqctl's column names over the API's objects -----------------------------

def _get(*path, default=None):
    def get(obj):
        for key in path:
            if not isinstance(obj, dict) or key not in obj:
                return default
            obj = obj[key]
        return obj
    return get


def _const(value):
    return lambda obj: value


def _items(names, **special):
    return {n: special.get(n, _get(n)) for n in names}


QUEUE_ITEMS = _items(
    ["arguments", "auto_delete", "consumer_capacity", "consumer_utilisation", "consumers", "disk_reads",
     "disk_writes", "durable", "exclusive", "exclusive_consumer_pid", "exclusive_consumer_tag",
     "head_message_timestamp", "leader", "members", "memory", "message_bytes", "message_bytes_persistent",
     "message_bytes_ram", "message_bytes_ready", "message_bytes_unacknowledged", "messages",
     "messages_persistent", "messages_ram", "messages_ready", "messages_ready_ram",
     "messages_unacknowledged", "messages_unacknowledged_ram", "name", "online", "owner_pid", "pid",
     "policy", "slave_pids", "state", "synchronised_slave_pids", "type"],
    owner_pid=_get("owner_pid_details", "name", default=""),
    exclusive_consumer_pid=_get("exclusive_consumer_details", "channel_details", "name", default=""),
    consumer_capacity=lambda o: o.get("consumer_capacity", o.get("consumer_utilisation")),
    exclusive=lambda o: o.get("exclusive", bool(o.get("owner_pid_details"))),
    # A queue whose node is down: rabbitmqctl names its type by its module.
    type=lambda o: ("rabbit_classic_queue" if o.get("state") == "down" and o.get("type", "classic") == "classic"
                    else o.get("type", "classic")),
    pid=_get("node", default=""),
)
EXCHANGE_ITEMS = _items(["arguments", "auto_delete", "durable", "internal", "name", "policy", "type"])
BINDING_ITEMS = {
    "arguments": _get("arguments"),
    "destination_kind": _get("destination_type"),
    "destination_name": _get("destination"),
    "routing_key": _get("routing_key"),
    "source_kind": _const("exchange"),
    "source_name": _get("source"),
}
CONNECTION_ITEMS = _items(
    ["auth_mechanism", "channel_max", "channels", "client_properties", "connected_at", "frame_max", "host",
     "name", "peer_cert_issuer", "peer_cert_subject", "peer_cert_validity", "peer_host", "peer_port", "pid",
     "port", "protocol", "recv_cnt", "recv_oct", "send_cnt", "send_oct", "send_pend", "ssl", "ssl_cipher",
     "ssl_hash", "ssl_key_exchange", "ssl_protocol", "state", "timeout", "user", "vhost",
     # Not in rabbitmqctl 3.10's list, but in the issue (flow control / alarms).
     "last_blocked_by", "last_blocked_age"],
    pid=_get("name"),
)
CHANNEL_ITEMS = _items(
    ["acks_uncommitted", "confirm", "connection", "consumer_count", "global_prefetch_count",
     "messages_unacknowledged", "messages_uncommitted", "messages_unconfirmed", "name", "number", "pid",
     "prefetch_count", "transactional", "user", "vhost"],
    pid=_get("name"),
    connection=_get("connection_details", "name"),
)
CONSUMER_ITEMS = _items(
    ["ack_required", "active", "activity_status", "arguments", "channel_pid", "consumer_tag",
     "prefetch_count", "queue_name"],
    channel_pid=_get("channel_details", "name"),
    queue_name=_get("queue", "name"),
    active=lambda o: o.get("active", True),
    activity_status=lambda o: o.get("activity_status", "up" if o.get("active", True) else "waiting"),
)
VHOST_ITEMS = _items(["cluster_state", "default_queue_type", "description", "missing_exchange", "name", "tags",
                      "tracing"],
                     description=lambda o: o.get("description", _get("metadata", "description")(o)),
                     tags=lambda o: o.get("tags", _get("metadata", "tags")(o)),
                     default_queue_type=_get("default_queue_type", default="classic"),
                     # Warren's capture exchange (an extension; "" when off)
                     missing_exchange=_get("missing_exchange", default=""))


def user_tags(obj) -> list:
    tags = obj.get("tags", [])
    if isinstance(tags, str):
        tags = [t for t in (s.strip() for s in tags.split(",")) if t]
    return list(tags)


def cell(column: str, value) -> str:
    if column == "tags" and isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return erl_ctl(value)


# --- the verbs ------------------------------------------------------------------------------

VERBS: dict[str, dict[str, Any]] = {}  # name -> fn, usage, args, options, columns, help (see verb())


def verb(name, usage, args=(0, 0), options=(), columns=None, help=""):
    """Register a verb: args = (min, max) positional arguments (max None: unlimited);
    options: its own option names; columns: info items it lists (then args are columns)."""
    def register(fn):
        VERBS[name] = dict(fn=fn, usage=usage, args=args, options=set(options), columns=columns, help=help)
        return fn
    return register


def select_columns(args, items, default):
    columns = list(args) or list(default)
    bad = [c for c in columns if c not in items]
    if bad:
        raise UsageError(f"Error (argument validation): Info key(s) {','.join(bad)} are not supported\n"
                         f"Valid columns: {', '.join(sorted(items))}")
    return columns


def list_objects(ctx, objects, columns, items):
    rows = [[cell(c, items[c](o)) for c in columns] for o in objects]
    json_rows = [{c: items[c](o) for c in columns} for o in objects]
    ctx.out.table(columns, rows, json_rows)


def vhost_missing(ctx, vhost, code=EX_DATAERR):
    return CtlError(code, f"Virtual host '{vhost}' does not exist")


def get_vhost_list(ctx, path, vhost):
    """GET a vhost-scoped collection; a 404 means the vhost does not exist."""
    try:
        return ctx.api.get(path) or []
    except HttpError as err:
        if err.status == 404:
            raise vhost_missing(ctx, vhost) from None
        raise


@verb("list_queues", "list_queues [--vhost <vhost>] [--online] [--offline] [--no-table-headers] [<column> ...]",
      (0, None), options=("online", "offline"), columns=QUEUE_ITEMS,
      help="Lists queues and their properties (--online: those whose node runs; --offline: the others).")
def list_queues(ctx, args):
    columns = select_columns(args, QUEUE_ITEMS, ["name", "messages"])
    ctx.out.info(f"Timeout: {ctx.timeout:.1f} seconds ...")
    ctx.out.info(f"Listing queues for vhost {ctx.vhost} ...")
    queues = get_vhost_list(ctx, f"/queues/{q(ctx.vhost)}", ctx.vhost)
    online, offline = "online" in ctx.options, "offline" in ctx.options
    if online != offline:  # (both, or neither: all of them)
        queues = [o for o in queues if (o.get("state") == "down") == offline]
    list_objects(ctx, queues, columns, QUEUE_ITEMS)


@verb("list_exchanges", "list_exchanges [--vhost <vhost>] [--no-table-headers] [<column> ...]", (0, None),
      columns=EXCHANGE_ITEMS, help="Lists exchanges.")
def list_exchanges(ctx, args):
    columns = select_columns(args, EXCHANGE_ITEMS, ["name", "type"])
    ctx.out.info(f"Listing exchanges for vhost {ctx.vhost} ...")
    list_objects(ctx, get_vhost_list(ctx, f"/exchanges/{q(ctx.vhost)}", ctx.vhost), columns, EXCHANGE_ITEMS)


@verb("list_bindings", "list_bindings [--vhost <vhost>] [--no-table-headers] [<column> ...]", (0, None),
      columns=BINDING_ITEMS, help="Lists all bindings on a vhost.")
def list_bindings(ctx, args):
    columns = select_columns(args, BINDING_ITEMS, ["source_name", "source_kind", "destination_name",
                                                   "destination_kind", "routing_key", "arguments"])
    ctx.out.info(f"Listing bindings for vhost {ctx.vhost}...")
    list_objects(ctx, get_vhost_list(ctx, f"/bindings/{q(ctx.vhost)}", ctx.vhost), columns, BINDING_ITEMS)


@verb("list_connections", "list_connections [--no-table-headers] [<column> ...]", (0, None),
      columns=CONNECTION_ITEMS, help="Lists AMQP 0.9.1 connections for the node.")
def list_connections(ctx, args):
    columns = select_columns(args, CONNECTION_ITEMS, ["user", "peer_host", "peer_port", "state"])
    ctx.out.info("Listing connections ...")
    list_objects(ctx, ctx.api.get("/connections") or [], columns, CONNECTION_ITEMS)


@verb("list_channels", "list_channels [--no-table-headers] [<column> ...]", (0, None),
      columns=CHANNEL_ITEMS, help="Lists all channels in the node.")
def list_channels(ctx, args):
    columns = select_columns(args, CHANNEL_ITEMS, ["pid", "user", "consumer_count", "messages_unacknowledged"])
    ctx.out.info("Listing channels ...")
    list_objects(ctx, ctx.api.get("/channels") or [], columns, CHANNEL_ITEMS)


@verb("list_consumers", "list_consumers [--vhost <vhost>] [--no-table-headers] [<column> ...]", (0, None),
      columns=CONSUMER_ITEMS, help="Lists all consumers for a vhost.")
def list_consumers(ctx, args):
    columns = select_columns(args, CONSUMER_ITEMS, ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                                                    "prefetch_count", "active", "arguments"])
    ctx.out.info(f"Listing consumers in vhost {ctx.vhost} ...")
    list_objects(ctx, get_vhost_list(ctx, f"/consumers/{q(ctx.vhost)}", ctx.vhost), columns, CONSUMER_ITEMS)


@verb("list_vhosts", "list_vhosts [--no-table-headers] [<column> ...]", (0, None),
      columns=VHOST_ITEMS, help="Lists virtual hosts.")
def list_vhosts(ctx, args):
    columns = select_columns(args, VHOST_ITEMS, ["name"])
    ctx.out.info("Listing vhosts ...")
    list_objects(ctx, ctx.api.get("/vhosts") or [], columns, VHOST_ITEMS)


@verb("list_users", "list_users [--no-table-headers]", help="List user names and tags.")
def list_users(ctx, args):
    ctx.out.info("Listing users ...")
    users = ctx.api.get("/users") or []
    items = {"user": _get("name"), "tags": user_tags}
    list_objects(ctx, users, ["user", "tags"], items)


PERMISSION_ITEMS = {k: _get(k) for k in ("user", "vhost", "configure", "write", "read")}


@verb("list_permissions", "list_permissions [--vhost <vhost>] [--no-table-headers]",
      help="Lists user permissions in a virtual host.")
def list_permissions(ctx, args):
    ctx.out.info(f'Listing permissions for vhost "{ctx.vhost}" ...')
    perms = get_vhost_list(ctx, f"/vhosts/{q(ctx.vhost)}/permissions", ctx.vhost)
    list_objects(ctx, perms, ["user", "configure", "write", "read"], PERMISSION_ITEMS)


@verb("list_user_permissions", "list_user_permissions [--no-table-headers] <username>", (1, 1),
      help="Lists permissions of a user across virtual hosts.")
def list_user_permissions(ctx, args):
    (user,) = args
    ctx.out.info(f'Listing permissions for user "{user}" ...')
    try:
        perms = ctx.api.get(f"/users/{q(user)}/permissions") or []
    except HttpError as err:
        if err.status == 404:
            raise user_missing(user) from None
        raise
    list_objects(ctx, perms, ["vhost", "configure", "write", "read"], PERMISSION_ITEMS)


POLICY_COLUMNS = ["vhost", "name", "pattern", "apply-to", "definition", "priority"]


def _list_policies(ctx, kind, what):
    ctx.out.info(f'Listing {what} for vhost "{ctx.vhost}" ...')
    policies = get_vhost_list(ctx, f"/{kind}/{q(ctx.vhost)}", ctx.vhost)
    # As rabbitmqctl: the definition is shown (and given in JSON) as a compact JSON string.
    items = {c: _get(c) for c in POLICY_COLUMNS}
    items["apply-to"] = _get("apply-to", default="all")
    items["priority"] = _get("priority", default=0)
    items["definition"] = lambda o: compact_json(o.get("definition", {}))
    rows = [[cell(c, items[c](p)) for c in POLICY_COLUMNS] for p in policies]
    ctx.out.table(POLICY_COLUMNS, rows, [{c: items[c](p) for c in POLICY_COLUMNS} for p in policies],
                  empty_line=True)


@verb("list_policies", "list_policies [--vhost <vhost>] [--no-table-headers]",
      help="Lists all policies in a virtual host.")
def list_policies(ctx, args):
    _list_policies(ctx, "policies", "policies")


@verb("list_operator_policies", "list_operator_policies [--vhost <vhost>] [--no-table-headers]",
      help="Lists operator policy overrides for a virtual host.")
def list_operator_policies(ctx, args):
    _list_policies(ctx, "operator-policies", "operator policy overrides")


# users

def user_missing(user, quoted=True) -> CtlError:
    name = f'"{user}"' if quoted else user
    return CtlError(EX_NOUSER, f"Error:\nUser {name} does not exist")


def get_user(ctx, user, quoted=True) -> dict:
    try:
        return ctx.api.get(f"/users/{q(user)}") or {}
    except HttpError as err:
        if err.status == 404:
            raise user_missing(user, quoted) from None
        raise


def password_arg(args, index) -> str:
    if len(args) > index:
        return args[index]
    # As rabbitmqctl: without the argument, the password is read from standard input.
    line = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise CtlError(EX_DATAERR, "Error:\nPassword is not provided via argument or stdin")
    return password


@verb("add_user", "add_user <username> <password>", (1, 2), help="Creates a new user in the internal database.")
def add_user(ctx, args):
    user = args[0]
    ctx.out.info(f'Adding user "{user}" ...')
    password = password_arg(args, 1)
    if ctx.api.exists(f"/users/{q(user)}"):
        raise CtlError(EX_SOFTWARE, f'Error:\nUser "{user}" already exists')
    ctx.api.put(f"/users/{q(user)}", {"password": password, "tags": ""})
    ctx.out.message("Done. Don't forget to grant the user permissions to some virtual hosts! "
                    f"See '{PROG} help set_permissions' to learn more.")


@verb("delete_user", "delete_user <username>", (1, 1), help="Removes a user from the internal database.")
def delete_user(ctx, args):
    (user,) = args
    ctx.out.info(f'Deleting user "{user}" ...')
    try:
        ctx.api.delete(f"/users/{q(user)}")
    except HttpError as err:
        if err.status == 404:
            raise user_missing(user) from None
        raise


@verb("change_password", "change_password <username> <password>", (1, 2), help="Changes the user password.")
def change_password(ctx, args):
    user = args[0]
    ctx.out.info(f'Changing password for user "{user}" ...')
    password = password_arg(args, 1)
    existing = get_user(ctx, user)
    ctx.api.put(f"/users/{q(user)}", {"password": password, "tags": ",".join(user_tags(existing))})


@verb("set_user_tags", "set_user_tags <username> <tag> [...]", (1, None), help="Sets user tags.")
def set_user_tags(ctx, args):
    user, tags = args[0], args[1:]
    ctx.out.info(f'Setting tags for user "{user}" to [{", ".join(tags)}] ...')
    existing = get_user(ctx, user)
    # A PUT without a password would clear it (as in RabbitMQ): send the stored hash back.
    body = {"tags": ",".join(tags)}
    if existing.get("password_hash"):
        body["password_hash"] = existing["password_hash"]
        if existing.get("hashing_algorithm"):
            body["hashing_algorithm"] = existing["hashing_algorithm"]
    ctx.api.put(f"/users/{q(user)}", body)


# vhosts and permissions

@verb("add_vhost", "add_vhost <vhost> [--missing-exchange <exchange>]", (1, 1), options=("missing-exchange",),
      help="Creates a virtual host. --missing-exchange (a Warren extension) names the exchange "
           "that captures publishes to exchanges missing there (see set_vhost_missing_exchange).")
def add_vhost(ctx, args):
    (vhost,) = args
    ctx.out.info(f'Adding vhost "{vhost}" ...')
    capture = ctx.options.get("missing-exchange")
    body = {} if capture is None else {"missing_exchange": capture}
    _put_vhost(ctx, vhost, body)
    if ctx.api.last_status == 201 and not ctx.api.local:
        # The HTTP API gives the user who creates a vhost full permissions on it; rabbitmqctl's
        # add_vhost grants nothing, and neither does warrenctl's (the control socket grants none).
        try:
            ctx.api.delete(f"/permissions/{q(vhost)}/{q(ctx.api.user)}")
        except HttpError as err:
            if err.status != 404:
                raise
    if capture is not None:
        _check_missing_exchange(ctx, vhost, capture or None)


def _put_vhost(ctx, vhost, body) -> None:
    try:
        ctx.api.put(f"/vhosts/{q(vhost)}", body)
    except HttpError as err:
        if err.status == 400:  # an invalid missing_exchange: the broker's reason
            raise CtlError(EX_DATAERR, f"Error:\n{err.reason}") from None
        raise


def _check_missing_exchange(ctx, vhost, expected) -> None:
    """The broker took the setting (a broker without Warren's extension, RabbitMQ, ignores
    it: an error, never a silent no-op)."""
    got = (ctx.api.get(f"/vhosts/{q(vhost)}") or {}).get("missing_exchange")
    if got != expected:
        raise CtlError(EX_SOFTWARE, "Error:\nthe broker ignored missing_exchange: it has no capture of "
                                    "publishes to missing exchanges (a Warren extension; is it Warren?)")


def _set_missing_exchange(ctx, capture) -> None:
    try:
        existing = ctx.api.get(f"/vhosts/{q(ctx.vhost)}") or {}
    except HttpError as err:
        if err.status == 404:  # a PUT would create it
            raise vhost_missing(ctx, ctx.vhost) from None
        raise
    # Description and tags sent back as they are (a PUT without them may clear them elsewhere).
    body = {"description": existing.get("description", ""), "tags": ",".join(user_tags(existing)),
            "missing_exchange": capture}
    _put_vhost(ctx, ctx.vhost, body)
    _check_missing_exchange(ctx, ctx.vhost, capture)


@verb("set_vhost_missing_exchange", "set_vhost_missing_exchange [--vhost <vhost>] <exchange>", (1, 1),
      help="Warren extension: publishes to exchanges that do not exist in the vhost are routed through "
           "<exchange> (with an x-warren-missing-exchange header naming the one used) instead of "
           "closing the channel with 404.")
def set_vhost_missing_exchange(ctx, args):
    (exchange,) = args
    if exchange == "":
        raise UsageError(f"Error (argument validation): the exchange name is empty "
                         f"(use clear_vhost_missing_exchange to turn the capture off)\n\n"
                         f"{verb_help('set_vhost_missing_exchange')}")
    ctx.out.info(f'Setting the missing-exchange capture of vhost "{ctx.vhost}" to "{exchange}" ...')
    _set_missing_exchange(ctx, exchange)


@verb("clear_vhost_missing_exchange", "clear_vhost_missing_exchange [--vhost <vhost>]",
      help="Warren extension: publishes to missing exchanges of the vhost get 404 again (as in RabbitMQ).")
def clear_vhost_missing_exchange(ctx, args):
    ctx.out.info(f'Clearing the missing-exchange capture of vhost "{ctx.vhost}" ...')
    _set_missing_exchange(ctx, None)


@verb("delete_vhost", "delete_vhost <vhost>", (1, 1), help="Deletes a virtual host.")
def delete_vhost(ctx, args):
    (vhost,) = args
    ctx.out.info(f'Deleting vhost "{vhost}" ...')
    try:
        ctx.api.delete(f"/vhosts/{q(vhost)}")
    except HttpError as err:
        if err.status == 404:
            raise vhost_missing(ctx, vhost) from None
        raise


def check_user_and_vhost(ctx, user):
    get_user(ctx, user, quoted=False)
    if not ctx.api.exists(f"/vhosts/{q(ctx.vhost)}"):
        raise CtlError(EX_SOFTWARE, f"Error:\nVirtual host {ctx.vhost} does not exist")


@verb("set_permissions", "set_permissions [--vhost <vhost>] <username> <conf> <write> <read>", (4, 4),
      help="Sets user permissions for a vhost.")
def set_permissions(ctx, args):
    user, configure, write, read = args
    ctx.out.info(f'Setting permissions for user "{user}" in vhost "{ctx.vhost}" ...')
    check_user_and_vhost(ctx, user)
    try:
        ctx.api.put(f"/permissions/{q(ctx.vhost)}/{q(user)}",
                    {"configure": configure, "write": write, "read": read})
    except HttpError as err:
        if err.status == 400:
            raise CtlError(EX_DATAERR, f"Error:\n{err.reason}") from None
        raise


@verb("clear_permissions", "clear_permissions [--vhost <vhost>] <username>", (1, 1),
      help="Revokes user permissions for a vhost.")
def clear_permissions(ctx, args):
    (user,) = args
    ctx.out.info(f'Clearing permissions for user "{user}" in vhost "{ctx.vhost}" ...')
    check_user_and_vhost(ctx, user)
    try:
        ctx.api.delete(f"/permissions/{q(ctx.vhost)}/{q(user)}")
    except HttpError as err:
        if err.status != 404:  # no permissions there: nothing to clear, as rabbitmqctl
            raise


# policies

def _set_policy(ctx, args, kind, what):
    name, pattern, definition = args
    priority = ctx.options.get("priority", "0")
    apply_to = ctx.options.get("apply-to", "all")
    ctx.out.info(f'Setting {what} "{name}" for pattern "{pattern}" to "{definition}" with priority '
                 f'"{priority}" for vhost "{ctx.vhost}" ...')
    try:
        priority = int(priority)
    except ValueError:
        raise UsageError(f"Error (argument validation): --priority must be an integer, not '{priority}'") from None
    if apply_to not in ("queues", "exchanges", "all"):
        raise UsageError(f"Error (argument validation): --apply-to must be one of queues, exchanges, all, "
                         f"not '{apply_to}'")
    parsed = _json_arg(definition)
    if not isinstance(parsed, dict):  # (rabbitmqctl fails with a badmap)
        raise Failed(f"Validation failed\n\ndefinition must be a JSON object, not {compact_json(parsed)}")
    try:
        ctx.api.put(f"/{kind}/{q(ctx.vhost)}/{q(name)}",
                    {"pattern": pattern, "definition": parsed, "priority": priority, "apply-to": apply_to})
    except HttpError as err:
        if err.status == 404:
            raise vhost_missing(ctx, ctx.vhost) from None
        if err.status == 400:
            raise Failed(_erlang_chars(html.unescape(err.reason))) from None
        raise


def _erlang_chars(reason: str) -> str:
    """A validation text as rabbitmqctl prints it: RabbitMQ's texts are made of Erlang's
    characters, one per byte of a value's UTF-8 ("é" shows as "Ã©"), which its HTTP replies
    give back as UTF-8 and rabbitmqctl shows one by one."""
    return reason.encode("utf-8", "surrogatepass").decode("latin-1")


def _clear_policy(ctx, args, kind, what):
    (name,) = args
    ctx.out.info(f'Clearing {what} "{name}" on vhost "{ctx.vhost}" ...')
    try:
        ctx.api.delete(f"/{kind}/{q(ctx.vhost)}/{q(name)}")
    except HttpError as err:
        if err.status == 404:
            if not ctx.api.exists(f"/vhosts/{q(ctx.vhost)}"):
                raise vhost_missing(ctx, ctx.vhost) from None
            raise CtlError(EX_SOFTWARE, "Error:\nParameter does not exist") from None
        raise


POLICY_USAGE = ("{verb} [--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
                "<name> <pattern> <definition>")


@verb("set_policy", POLICY_USAGE.format(verb="set_policy"), (3, 3), options=("priority", "apply-to"),
      help="Sets or updates a policy.")
def set_policy(ctx, args):
    _set_policy(ctx, args, "policies", "policy")


@verb("clear_policy", "clear_policy [--vhost <vhost>] <name>", (1, 1), help="Clears (removes) a policy.")
def clear_policy(ctx, args):
    _clear_policy(ctx, args, "policies", "policy")


@verb("set_operator_policy", POLICY_USAGE.format(verb="set_operator_policy"), (3, 3),
      options=("priority", "apply-to"), help="Sets an operator policy that overrides a subset of arguments "
                                             "in user policies.")
def set_operator_policy(ctx, args):
    _set_policy(ctx, args, "operator-policies", "operator policy override")


@verb("clear_operator_policy", "clear_operator_policy [--vhost <vhost>] <name>", (1, 1),
      help="Clears an operator policy.")
def clear_operator_policy(ctx, args):
    _clear_policy(ctx, args, "operator-policies", "operator policy")


# queues and connections

def queue_missing(ctx, code) -> CtlError:
    if not ctx.api.exists(f"/vhosts/{q(ctx.vhost)}"):
        return vhost_missing(ctx, ctx.vhost)
    return CtlError(code, "Error:\nQueue not found")


@verb("purge_queue", "purge_queue [--vhost <vhost>] <queue>", (1, 1), help="Purges a queue (removes all "
                                                                             "messages in it).")
def purge_queue(ctx, args):
    (name,) = args
    ctx.out.info(f"Purging queue '{name}' in vhost '{ctx.vhost}' ...")
    try:
        ctx.api.delete(f"/queues/{q(ctx.vhost)}/{q(name)}/contents")
    except HttpError as err:
        if err.status == 404:
            raise queue_missing(ctx, EX_SOFTWARE) from None
        raise


@verb("delete_queue", "delete_queue [--vhost <vhost>] <queue_name> [--if-empty|-e] [--if-unused|-u]", (1, 1),
      options=("if-empty", "if-unused"), help="Deletes a queue.")
def delete_queue(ctx, args):
    (name,) = args
    if_empty, if_unused = "if-empty" in ctx.options, "if-unused" in ctx.options
    conditions = (["if queue is empty "] if if_empty else []) + (["if queue is unused "] if if_unused else [])
    ctx.out.info(f"Deleting queue '{name}' on vhost '{ctx.vhost}' " + "and ".join(conditions) + "...")
    path = f"/queues/{q(ctx.vhost)}/{q(name)}"
    try:
        ready = (ctx.api.get(path) or {}).get("messages_ready", 0)
        query = {k: "true" for k, on in (("if-empty", if_empty), ("if-unused", if_unused)) if on}
        ctx.api.delete(path, query=query)
    except HttpError as err:
        if err.status == 404:
            raise queue_missing(ctx, EX_USAGE) from None
        if err.status == 400 and "not empty" in err.reason:
            raise CtlError(EX_USAGE, "Error:\nQueue is not empty") from None
        if err.status == 400 and "in use" in err.reason:
            raise CtlError(EX_USAGE, "Error:\nQueue is in use") from None
        raise
    ctx.out.message(f"Queue was successfully deleted with {ready} ready messages")


@verb("close_connection", "close_connection <connection name> <explanation>", (2, 2),
      help="Instructs the broker to close the connection (named as list_connections name shows it).")
def close_connection(ctx, args):
    name, explanation = args
    ctx.out.info(f"Closing connection {name}, reason: {explanation}...")
    try:
        ctx.api.delete(f"/connections/{q(name)}", headers={"X-Reason": explanation})
    except HttpError as err:
        if err.status == 404:
            raise CtlError(EX_SOFTWARE, f"Error:\nConnection '{name}' not found "
                                        f"(see `{PROG} list_connections name`)") from None
        raise


# definitions

@verb("export_definitions", 'export_definitions <file_path | "-">', (1, 1),
      help="Exports definitions in JSON to a file or standard output.")
def export_definitions(ctx, args):
    (path,) = args
    if path != "-":
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise CtlError(EX_DATAERR, f"Error (argument validation): Bad argument: Directory {directory} "
                                       "does not exist")
        ctx.out.info(f'Exporting definitions in JSON to a file at "{path}" ...')
    body = json.dumps(_rabbitmqctl_definitions(ctx), separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    if path == "-":
        sys.stdout.write(body)
        sys.stdout.flush()
        return
    try:
        with open(path, "w") as f:
            f.write(body)
    except OSError as err:
        raise CtlError(EX_DATAERR, f"Error:\ncannot write {path}: {err.strerror or err}") from None


# The fields of a binding in rabbitmqctl's export.
BINDING_FIELDS = ("source", "vhost", "destination", "destination_type", "routing_key", "arguments")


def _rabbitmqctl_definitions(ctx) -> dict:
    """What rabbitmqctl 3.10.8's export_definitions writes (rabbit_definitions:all_definitions),
    made of the management API's answers: its export, with each vhost's limits (as [name,
    value] pairs) and metadata, each queue's type, every binding but the default exchange's
    (those to exclusive queues too), no internal exchanges (nor the "internal" key) and no
    global parameter whose name starts with "internal". JSON objects are Erlang maps there:
    their keys come sorted."""
    api = ctx.api.get("/definitions")
    metadata = {v["name"]: v.get("metadata", {"description": v.get("description", ""), "tags": v.get("tags", [])})
                for v in ctx.api.get("/vhosts?columns=name,description,tags,metadata")}
    limits = {p["vhost"]: sorted([name, value] for name, value in p["value"].items())
              if isinstance(p["value"], dict) else p["value"]  # (no limits: [])
              for p in api["parameters"] if p["component"] == "vhost-limits"}
    types = {(q["vhost"], q["name"]): q.get("type", "classic") for q in ctx.api.get("/queues?columns=vhost,name,type")}
    return {
        "rabbit_version": api["rabbit_version"], "rabbitmq_version": api.get("rabbitmq_version", api["rabbit_version"]),
        "users": api["users"],
        "vhosts": [{"name": v["name"], "limits": limits.get(v["name"], []), "metadata": metadata.get(v["name"], {})}
                   for v in api["vhosts"]],
        "permissions": api["permissions"], "topic_permissions": api["topic_permissions"],
        "parameters": api["parameters"],
        "global_parameters": [g for g in api["global_parameters"] if not g["name"].startswith("internal")],
        "policies": api["policies"],
        "queues": [{**q, "type": types.get((q["vhost"], q["name"]), "classic")} for q in api["queues"]],
        "exchanges": [{k: v for k, v in x.items() if k != "internal"} for x in api["exchanges"] if not x["internal"]],
        "bindings": [{k: b[k] for k in BINDING_FIELDS} for b in ctx.api.get("/bindings") if b["source"] != ""],
    }


@verb("import_definitions", 'import_definitions <file_path | "-">', (1, 1),
      help="Imports definitions in JSON from a file or standard input.")
def import_definitions(ctx, args):
    (path,) = args
    if path == "-":
        text = sys.stdin.read()
    else:
        if not os.path.isfile(path):
            raise CtlError(EX_DATAERR, f"Error (argument validation): Bad argument: File {path} does not exist")
        ctx.out.info(f'Importing definitions in JSON from a file at "{path}" ...')
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise CtlError(EX_DATAERR, f"Error:\ncannot read {path}: {err}") from None
    try:
        parsed = json.loads(text)
    except ValueError as err:
        raise CtlError(EX_DATAERR, f"Error:\nFailed to deserialise input (format: JSON) (error: {err})") from None
    if not isinstance(parsed, dict):
        raise CtlError(EX_DATAERR, "Error:\nFailed to deserialise input (format: JSON) "
                                   "(error: the definitions must be a JSON object)")
    try:
        ctx.api.post("/definitions", parsed)
    except HttpError as err:
        if err.status == 400:  # the broker's text, as it gives it (HTML-escaped), as rabbitmqctl
            raise Failed(err.reason) from None
        raise
    ctx.out.message("Successfully imported definitions.")


# cluster name, topic permissions, limits and runtime parameters

@verb("set_cluster_name", "set_cluster_name <name>", (1, 1), help="Sets the cluster name.")
def set_cluster_name(ctx, args):
    (name,) = args
    ctx.out.info(f"Setting cluster name to {name} ...")
    ctx.api.put("/cluster-name", {"name": name})


class Failed(CtlError):
    """An error the broker reported, as rabbitmqctl shows one: after the informational line,
    "Error:" and the broker's text, exit code 69."""

    def __init__(self, reason: str):
        super().__init__(EX_UNAVAILABLE, f"Error:\n{reason}")


def _json_arg(text: str):
    try:
        return json.loads(text)
    except ValueError:
        raise Failed("JSON decoding error. Reason: badarg") from None


def _json_object_arg(text: str) -> dict:
    value = _json_arg(text)
    if not isinstance(value, dict):
        raise Failed(f"Validation failed\n\n{compact_json(value)} is not a JSON object")
    return value


def _no_such_user(user) -> CtlError:
    return Failed(f'{{:no_such_user, "{user}"}}')


def _user_exists(ctx, user) -> bool:
    return ctx.api.exists(f"/users/{q(user)}")


def _rejected(err: HttpError) -> CtlError:
    """A 400 from the API: its reason is RabbitMQ's validation text, shown as it is."""
    return Failed(html.unescape(err.reason))


TOPIC_PERMISSION_COLUMNS = ["exchange", "write", "read"]


@verb("set_topic_permissions", "set_topic_permissions [--vhost <vhost>] <username> <exchange> <write> <read>",
      (4, 4), help="Sets user topic permissions for an exchange.")
def set_topic_permissions(ctx, args):
    user, exchange, write, read = args
    ctx.out.info(f'Setting topic permissions on "{exchange}" for user "{user}" in vhost "{ctx.vhost}" ...')
    _check_user_then_vhost(ctx, user)
    _put_checked(ctx, f"/topic-permissions/{q(ctx.vhost)}/{q(user)}",
                 {"exchange": exchange, "write": write, "read": read})


def _put_checked(ctx, path: str, body, missing=None) -> None:
    """A PUT whose 400 is the broker's validation text (exit 69, as rabbitmqctl), and whose
    404 is missing() when given."""
    try:
        ctx.api.put(path, body)
    except HttpError as err:
        if err.status == 400:
            raise _rejected(err) from None
        if err.status == 404 and missing is not None:
            raise missing() from None
        raise


def _clear_parameter(ctx, path: str) -> None:
    """A DELETE of a parameter: a 404 is rabbitmqctl's "Parameter does not exist"."""
    try:
        ctx.api.delete(path)
    except HttpError as err:
        if err.status == 404:
            raise Failed("Parameter does not exist") from None
        raise


def _check_user_then_vhost(ctx, user):
    """rabbitmqctl's order and codes: no such user 67, then no such vhost 69."""
    if not _user_exists(ctx, user):
        raise CtlError(EX_NOUSER, f"Error:\nUser {user} does not exist")
    if not ctx.api.exists(f"/vhosts/{q(ctx.vhost)}"):
        raise Failed(f"Virtual host {ctx.vhost} does not exist")


@verb("clear_topic_permissions", "clear_topic_permissions [--vhost <vhost>] <username> [<exchange>]", (1, 2),
      help="Clears user topic permissions for a vhost or exchange.")
def clear_topic_permissions(ctx, args):
    user, exchange = args[0], (args[1] if len(args) > 1 else None)
    on = f'on "{exchange}" ' if exchange is not None else ""
    ctx.out.info(f'Clearing topic permissions {on}for user "{user}" in vhost "{ctx.vhost}" ...')
    _check_user_then_vhost(ctx, user)
    path = f"/topic-permissions/{q(ctx.vhost)}/{q(user)}"
    try:
        # One exchange's entry alone (RabbitMQ's API has that path too): the others are
        # never cleared meanwhile, so never unrestricted for a moment.
        ctx.api.delete(path if exchange is None else f"{path}/{q(exchange)}")
    except HttpError as err:
        if err.status != 404:  # none there: nothing to clear, as rabbitmqctl
            raise


@verb("list_topic_permissions", "list_topic_permissions [--vhost <vhost>] [--no-table-headers]",
      help="Lists topic permissions in a virtual host.")
def list_topic_permissions(ctx, args):
    ctx.out.info(f'Listing topic permissions for vhost "{ctx.vhost}" ...')
    perms = get_vhost_list(ctx, f"/vhosts/{q(ctx.vhost)}/topic-permissions", ctx.vhost)
    columns = ["user", *TOPIC_PERMISSION_COLUMNS]
    ctx.out.table(columns, [[cell(c, p.get(c)) for c in columns] for p in perms],
                  [{c: p.get(c) for c in columns} for p in perms], empty_line=True)


@verb("list_user_topic_permissions", "list_user_topic_permissions [--no-table-headers] <username>", (1, 1),
      help="Lists user topic permissions.")
def list_user_topic_permissions(ctx, args):
    (user,) = args
    ctx.out.info(f'Listing topic permissions for user "{user}" ...')
    try:
        perms = ctx.api.get(f"/users/{q(user)}/topic-permissions") or []
    except HttpError as err:
        if err.status == 404:
            raise _no_such_user(user) from None
        raise
    columns = ["vhost", *TOPIC_PERMISSION_COLUMNS]
    # As rabbitmqctl 3.10, this listing has no header row.
    ctx.out.headers = False
    ctx.out.table(columns, [[cell(c, p.get(c)) for c in columns] for p in perms],
                  [{c: p.get(c) for c in columns} for p in perms], empty_line=True)


def limits_json(limits: dict) -> str:
    return compact_json(dict(sorted(limits.items())))


def _vhost_limits(ctx, vhost) -> dict:
    """The vhost's limits (404: no such vhost, rabbitmqctl's 65)."""
    try:
        items = ctx.api.get(f"/vhost-limits/{q(vhost)}") or []
    except HttpError as err:
        if err.status == 404:
            raise vhost_missing(ctx, vhost) from None
        raise
    return dict(items[0].get("value") or {}) if items else {}


@verb("set_vhost_limits", "set_vhost_limits [--vhost <vhost>] <definition>", (1, 1),
      help="Sets virtual host limits (replacing those set before).")
def set_vhost_limits(ctx, args):
    (definition,) = args
    ctx.out.info(f'Setting vhost limits to "{definition}" for vhost "{ctx.vhost}" ...')
    limits = _json_object_arg(definition)
    # One parameter, validated whole: the definition replaces the vhost's limits, and a bad
    # one changes nothing (as rabbitmqctl).
    _put_checked(ctx, f"/parameters/vhost-limits/{q(ctx.vhost)}/limits", {"value": limits},
                 lambda: vhost_missing(ctx, ctx.vhost))


@verb("clear_vhost_limits", "clear_vhost_limits [--vhost <vhost>]", help="Clears virtual host limits.")
def clear_vhost_limits(ctx, args):
    ctx.out.info(f'Clearing vhost "{ctx.vhost}" limits ...')
    _clear_parameter(ctx, f"/parameters/vhost-limits/{q(ctx.vhost)}/limits")


@verb("list_vhost_limits", "list_vhost_limits [--vhost <vhost>] [--global] [--no-table-headers]",
      options=("global",), help="Displays configured virtual host limits.")
def list_vhost_limits(ctx, args):
    if ctx.options.get("global"):
        ctx.out.info("Listing limits for all vhosts ...")
        items = [i for i in ctx.api.get("/vhost-limits") or [] if i.get("value")]
        rows = [[cell("vhost", i.get("vhost")), limits_json(i["value"])] for i in items]
        ctx.out.table(["vhost", "limits"], rows, [{"vhost": i.get("vhost"), "limits": limits_json(i["value"])}
                                                  for i in items], empty_line=True)
        return
    ctx.out.info(f'Listing limits for vhost "{ctx.vhost}" ...')
    limits = _vhost_limits(ctx, ctx.vhost)
    ctx.out.flush()
    if ctx.out.json:
        node = (ctx.api.get("/overview") or {}).get("node", "") if limits else ""
        print(compact_json({"node": node, "result": "ok", "value": limits_json(limits)}) if limits else "[]")
    elif not ctx.out.quiet or limits:
        print(limits_json(limits) if limits else "", flush=True)


def _check_user(ctx, user):
    if not _user_exists(ctx, user):
        raise _no_such_user(user)


@verb("set_user_limits", "set_user_limits <username> <definition>", (2, 2),
      help="Sets user limits (adding to those set before).")
def set_user_limits(ctx, args):
    user, definition = args
    ctx.out.info(f'Setting user limits to "{definition}" for user "{user}" ...')
    limits = _json_object_arg(definition)
    _check_user(ctx, user)
    for name, value in limits.items():
        _put_checked(ctx, f"/user-limits/{q(user)}/{q(name)}", {"value": value})


def _user_limits(ctx, user) -> dict:
    try:
        items = ctx.api.get(f"/user-limits/{q(user)}") or []
    except HttpError as err:
        if err.status == 404:
            raise _no_such_user(user) from None
        raise
    return dict(items[0].get("value") or {}) if items else {}


@verb("clear_user_limits", "clear_user_limits <username> <limit_type> | all", (2, 2),
      help="Clears user connection/channel limits.")
def clear_user_limits(ctx, args):
    user, limit = args
    if limit == "all":
        ctx.out.info(f'Clearing all limits for user "{user}" ...')
    else:
        ctx.out.info(f'Clearing "{limit}" limit for user "{user}" ...')
    names = list(_user_limits(ctx, user)) if limit == "all" else [limit]
    for name in names:
        try:
            ctx.api.delete(f"/user-limits/{q(user)}/{q(name)}")
        except HttpError as err:
            if err.status != 404:  # not set: nothing to clear, as rabbitmqctl
                raise


@verb("list_user_limits", "list_user_limits [--user <username>] [--global]", options=("global", "user"),
      help="Displays configured user limits (--user must follow the command name).")
def list_user_limits(ctx, args):
    if ctx.options.get("global"):
        ctx.out.info("Listing limits for all users ...")
        items = [i for i in ctx.api.get("/user-limits") or [] if i.get("value")]
        rows = [[cell("user", i.get("user")), limits_json(i["value"])] for i in items]
        ctx.out.table(["user", "limits"], rows, [{"user": i.get("user"), "limits": limits_json(i["value"])}
                                                 for i in items], empty_line=True)
        return
    user = str(ctx.options.get("user", "guest"))
    ctx.out.info(f'Listing limits for user "{user}" ...')
    limits = _user_limits(ctx, user)
    ctx.out.flush()
    if ctx.out.json:
        print(compact_json({"message": limits_json(limits)}))
    else:
        print(limits_json(limits), flush=True)


PARAMETER_COLUMNS = ["component", "name", "value"]


@verb("set_parameter", "set_parameter [--vhost <vhost>] <component_name> <name> <value>", (3, 3),
      help="Sets a runtime parameter.")
def set_parameter(ctx, args):
    component, name, value = args
    ctx.out.info(f'Setting runtime parameter "{name}" for component "{component}" to "{value}" in vhost '
                 f'"{ctx.vhost}" ...')
    parsed = _json_arg(value)
    _put_checked(ctx, f"/parameters/{q(component)}/{q(ctx.vhost)}/{q(name)}",
                 {"component": component, "vhost": ctx.vhost, "name": name, "value": parsed},
                 lambda: vhost_missing(ctx, ctx.vhost))


@verb("clear_parameter", "clear_parameter [--vhost <vhost>] <component_name> <name>", (2, 2),
      help="Clears a runtime parameter.")
def clear_parameter(ctx, args):
    component, name = args
    ctx.out.info(f'Clearing runtime parameter "{name}" for component "{component}" on vhost "{ctx.vhost}" ...')
    _clear_parameter(ctx, f"/parameters/{q(component)}/{q(ctx.vhost)}/{q(name)}")


@verb("list_parameters", "list_parameters [--vhost <vhost>] [--no-table-headers]",
      help="Lists runtime parameters for a virtual host.")
def list_parameters(ctx, args):
    ctx.out.info(f'Listing runtime parameters for vhost "{ctx.vhost}" ...')
    if not ctx.api.exists(f"/vhosts/{q(ctx.vhost)}"):
        raise vhost_missing(ctx, ctx.vhost)
    # The API lists parameters per component or all of them; rabbitmqctl lists one vhost's.
    params = [p for p in ctx.api.get("/parameters") or [] if p.get("vhost") == ctx.vhost]
    rows = [[cell("component", p.get("component")), cell("name", p.get("name")), compact_json(p.get("value"))]
            for p in params]
    ctx.out.table(PARAMETER_COLUMNS, rows, [dict(zip(PARAMETER_COLUMNS, r)) for r in rows], empty_line=True)


@verb("set_global_parameter", "set_global_parameter <name> <value>", (2, 2),
      help="Sets a runtime parameter.")
def set_global_parameter(ctx, args):
    name, value = args
    ctx.out.info(f'Setting global runtime parameter "{name}" to "{value}" ...')
    parsed = _json_arg(value)
    _put_checked(ctx, f"/global-parameters/{q(name)}", {"name": name, "value": parsed})


@verb("clear_global_parameter", "clear_global_parameter <name>", (1, 1),
      help="Clears a global runtime parameter.")
def clear_global_parameter(ctx, args):
    (name,) = args
    ctx.out.info(f'Clearing global runtime parameter "{name}" ...')
    _clear_parameter(ctx, f"/global-parameters/{q(name)}")


@verb("list_global_parameters", "list_global_parameters [--no-table-headers]",
      help="Lists global runtime parameters.")
def list_global_parameters(ctx, args):
    ctx.out.info("Listing global runtime parameters ...")
    params = ctx.api.get("/global-parameters") or []
    rows = [[cell("name", p.get("name")), compact_json(p.get("value"))] for p in params]
    ctx.out.table(["name", "value"], rows, [dict(zip(["name", "value"], r)) for r in rows], empty_line=True)


# the shovel plugin's verbs (rabbitmq_shovel 3.10.8's ShovelStatus, DeleteShovel and
# RestartShovel commands), over /api/shovels

# rabbit_shovel_status's details of a running shovel -> the names shovel_status shows them by
_SHOVEL_DETAILS = (("src_address", "source_address"), ("src_queue", "source_queue"),
                   ("src_exchange", "source_exchange"), ("src_exchange_key", "source_exchange_key"),
                   ("dest_address", "destination_address"), ("dest_queue", "destination_queue"),
                   ("dest_exchange", "destination_exchange"), ("dest_exchange_key", "destination_exchange_key"))


def _shovel_timestamp(text) -> str:
    """The API's "Y-M-D H:MM:SS" (RabbitMQ's API leaves the hour unpadded) as rabbitmqctl's
    fmt_ts writes it, every field zero-padded."""
    m = re.fullmatch(r"(\d+)-(\d+)-(\d+) (\d+):(\d+):(\d+)", str(text or ""))
    if not m:
        return str(text or "")
    y, mo, d, h, mi, s = (int(g) for g in m.groups())
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}"


def _shovel_status_row(s: dict) -> dict:
    """One /api/shovels entry as ShovelStatusCommand:output/2 makes it (a map: its keys in
    Erlang's order, which is the alphabetical one)."""
    row = {"name": s.get("name"), "type": s.get("type", "dynamic"),
           "last_changed": _shovel_timestamp(s.get("timestamp"))}
    if s.get("vhost") is not None:  # (static shovels have none)
        row["vhost"] = s["vhost"]
    state = s.get("state")
    row["state"] = state
    if state == "running":
        row.update(source_protocol=s.get("src_protocol", "undefined"), source=s.get("src_uri"),
                   destination_protocol=s.get("dest_protocol", "undefined"), destination=s.get("dest_uri"),
                   termination_reason="")
        row.update({new: s[old] for old, new in _SHOVEL_DETAILS if old in s})
    else:
        row.update(source="", destination="",
                   termination_reason=s.get("reason", "") if state == "terminated" else "")
    return dict(sorted(row.items()))


@verb("shovel_status", "shovel_status", (0, None), help="Displays status of Shovel on a node.")
def shovel_status(ctx, args):
    # rabbitmqctl 3.10.8 takes any arguments and -p, and ignores them: every shovel is listed.
    node = _node_name(ctx)
    ctx.out.info(f"Shovel status on node {node}")
    found = [_shovel_status_row(s) for s in ctx.api.get("/shovels") or []]
    # As rabbitmqctl's table formatter does with a stream of maps: the header is the first
    # row's keys, and every row shows its own values in its own keys' order (a starting or
    # terminated shovel has fewer keys than a running one, so such rows do not line up).
    columns = list(found[0]) if found else []
    rows = [[cell(k, v) for k, v in r.items()] for r in found]
    ctx.out.table(columns, rows, found)


def _shovel_not_found(ctx) -> CtlError:
    return Failed(f"Shovel with the given name was not found on the target node '{_node_name(ctx)}' and / or "
                  f"virtual host '{ctx.vhost}'")


def _shovel_request(ctx, path: str) -> None:
    """DELETE of /api/shovels/vhost/{vhost}/{name}[/restart]: a 404 (no such shovel, or no
    such vhost) is rabbitmqctl's "not found" error, exit 69."""
    try:
        ctx.api.delete(path)
    except HttpError as err:
        if err.status == 404:
            raise _shovel_not_found(ctx) from None
        raise


@verb("delete_shovel", "delete_shovel [--vhost <vhost>] <name>", (1, 1), help="Deletes a Shovel.")
def delete_shovel(ctx, args):
    (name,) = args
    ctx.out.info(f"Deleting shovel {name} in vhost {ctx.vhost}")
    _shovel_request(ctx, f"/shovels/vhost/{q(ctx.vhost)}/{q(name)}")


@verb("restart_shovel", "restart_shovel <name>", (1, 1), help="Restarts a dynamic Shovel.")
def restart_shovel(ctx, args):
    (name,) = args
    ctx.out.info(f"Restarting dynamic Shovel {name} in virtual host {ctx.vhost} on node {_node_name(ctx)}")
    _shovel_request(ctx, f"/shovels/vhost/{q(ctx.vhost)}/{q(name)}/restart")


# the federation plugin's verbs (rabbitmq_federation 3.10.8's FederationStatus and
# RestartFederationLink commands), over /api/federation-links

@verb("federation_status", "federation_status [--only-down]", (0, None), options=("only-down",),
      help="Displays federation link status")
def federation_status(ctx, args):
    down = "only-down" in ctx.options
    ctx.out.info(f"Listing federation links {'which are down ' if down else ''}on node {_node_name(ctx)}...")
    links = ctx.api.get("/federation-links/state/down" if down else "/federation-links") or []
    found = []
    for link in links:
        row = {"queue": "", "exchange": "", "upstream_queue": "", "upstream_exchange": "", "local_connection": "",
               "error": ""}
        row.update({k: v for k, v in link.items() if k not in ("timestamp", "node", "local_channel")})
        row["last_changed"] = _shovel_timestamp(link.get("timestamp"))
        found.append(dict(sorted(row.items())))
    columns = list(found[0]) if found else []
    ctx.out.table(columns, [[cell(k, v) for k, v in r.items()] for r in found], found)


@verb("restart_federation_link", "restart_federation_link <link_id>", (1, 1),
      help="Restarts a running federation link")
def restart_federation_link(ctx, args):
    (link_id,) = args
    node = _node_name(ctx)
    ctx.out.info(f"Restarting federation link {link_id} on node {node}")
    for link in ctx.api.get("/federation-links") or []:
        if link.get("id") == link_id:
            ctx.api.delete(f"/federation-links/vhost/{q(link['vhost'])}/{q(link_id)}/{q(node)}/restart")
            return
    raise Failed("Link with the given ID was not found")


# the resource alarms' settings (Warren-only API endpoints: rabbitmqctl reaches the node directly)

# rabbitmqctl 3.10's units for absolute thresholds (RabbitMQ.CLI.Core.Memory), letter case as
# written: "2gb" is refused.
_CTL_UNITS = {"": 1, "k": 1024, "kiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2, "G": 1024 ** 3,
              "GiB": 1024 ** 3, "kB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def _integer_prefix(text: str) -> tuple[int, str] | None:
    """Elixir's Integer.parse: the leading integer and the rest, or None."""
    m = re.match(r"[+-]?[0-9]+", text)
    return (int(m.group()), text[m.end():]) if m else None


def _float_prefix(text: str) -> tuple[float, str] | None:
    """Elixir's Float.parse: the leading number (fraction and exponent optional) and the rest."""
    m = re.match(r"[+-]?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", text)
    return (float(m.group()), text[m.end():]) if m else None


def _bad_argument(name: str, detail: str = "") -> CtlError:
    text = f"Bad argument: {detail}" if detail else "Bad argument."
    return CtlError(EX_DATAERR, f"Error (argument validation): {text}\n\n{verb_help(name)}")


def _too_many(name: str) -> CtlError:
    return UsageError(f"Error (argument validation): too many arguments.\n\n{verb_help(name)}")


def _not_enough(name: str) -> CtlError:
    return UsageError(f"Error (argument validation): not enough arguments.\n\n{verb_help(name)}")


def _node_name(ctx) -> str:
    return (ctx.api.get("/overview") or {}).get("node", "")


@verb("set_vm_memory_high_watermark", "set_vm_memory_high_watermark <fraction> | absolute <value>", (1, 2),
      help="Sets the vm_memory_high_watermark setting (until the broker restarts): a fraction of "
           "total memory from 0.0 to 1.0 (0 raises the memory alarm), or an absolute value in "
           "bytes with a unit (k, kiB, M, MiB, G, GiB, kB, MB, GB), e.g. absolute 2GB.")
def set_vm_memory_high_watermark(ctx, args):
    name = "set_vm_memory_high_watermark"
    if args[0] == "absolute":
        if len(args) < 2:
            raise _not_enough(name)
        parsed = _integer_prefix(args[1])
        if parsed is None:
            raise _bad_argument(name)
        number, unit = parsed
        if unit not in _CTL_UNITS:
            as_float = _float_prefix(args[1])
            raise _bad_argument(name, "Invalid units." if as_float is not None and as_float[1] == unit
                                else "The threshold should be an integer.")
        node = _node_name(ctx)
        ctx.out.info(f"Setting memory threshold on {node} to {args[1]} bytes ...")
        if number <= 0:
            # rabbitmqctl 3.10 crashes here (function_clause, exit 70): the same code, said plainly.
            raise CtlError(EX_SOFTWARE, "Error:\nThe threshold should be a number of bytes above 0 "
                                        "(set_vm_memory_high_watermark 0 raises the memory alarm).")
        setting = {"absolute": number * _CTL_UNITS[unit]}
    else:
        if len(args) > 1:
            raise _too_many(name)
        parsed_float = _float_prefix(args[0])
        if parsed_float is None or parsed_float[1] != "":
            raise _bad_argument(name)
        if not 0.0 <= parsed_float[0] <= 1.0:
            raise _bad_argument(name, "The threshold should be a fraction between 0.0 and 1.0")
        node = _node_name(ctx)
        ctx.out.info(f"Setting memory threshold on {node} to {args[0]} ...")
        setting = {"relative": parsed_float[0]}
    _put_node_setting(ctx, node, "vm-memory-high-watermark", setting)


@verb("set_disk_free_limit", "set_disk_free_limit <disk_limit> | mem_relative <fraction>", (1, 2),
      help="Sets the disk_free_limit setting (until the broker restarts): an absolute value in "
           "bytes with a unit (k, kiB, M, MiB, G, GiB, kB, MB, GB), e.g. 1GB, or mem_relative "
           "<fraction> of total memory. The free space is checked again at once.")
def set_disk_free_limit(ctx, args):
    name = "set_disk_free_limit"
    if args[0] == "mem_relative":
        if len(args) < 2:
            raise _not_enough(name)
        parsed_float = _float_prefix(args[1])
        if parsed_float is None or parsed_float[1] != "" or parsed_float[0] < 0:
            raise _bad_argument(name)
        node = _node_name(ctx)
        ctx.out.info(f"Setting disk free limit on {node} to {args[1]} times the total RAM ...")
        setting: dict = {"mem_relative": parsed_float[0]}
    else:
        if len(args) > 1:
            raise _too_many(name)
        parsed = _integer_prefix(args[0])
        if parsed is None:
            raise _bad_argument(name)
        number, unit = parsed
        # A negative number alone is taken (the alarm then never goes off); with a unit it is not.
        if unit and (number < 0 or unit not in _CTL_UNITS):
            raise _bad_argument(name)
        node = _node_name(ctx)
        ctx.out.info(f"Setting disk free limit on {node} to {args[0]} bytes ...")
        setting = {"absolute": number * _CTL_UNITS[unit]}
    _put_node_setting(ctx, node, "disk-free-limit", setting)


def _put_node_setting(ctx, node: str, path: str, setting: dict) -> None:
    try:
        ctx.api.put(f"/nodes/{q(node)}/{path}", setting)
    except HttpError as err:
        if err.status in (400, 404):
            raise Failed(html.unescape(err.reason)) from None
        raise


def _node_setting(ctx, node: str, path: str) -> dict | None:
    """A Warren-only setting of the node, or None where the API has none (RabbitMQ's)."""
    try:
        setting = ctx.api.get(f"/nodes/{q(node)}/{path}") or {}
    except HttpError:
        return None
    setting.pop("limit", None)
    return setting


# status

def _gb(n) -> str:
    return f"{round((n or 0) / 1e9, 4)} gb"


_ALARM_LINES = {"memory": "Memory alarm on node {}", "disk": "Free disk space alarm on node {}"}


@verb("status", "status", help="Displays status of a node.")
def status(ctx, args):
    overview = ctx.api.get("/overview") or {}
    node = _this_node(overview, ctx.api.get("/nodes") or [])
    vhosts = ctx.api.get("/vhosts") or []
    name = node.get("name") or overview.get("node", "")
    totals = overview.get("object_totals", {})
    alarms = _node_alarms(node)  # this node's own, as rabbitmqctl's
    watermark = _node_setting(ctx, name, "vm-memory-high-watermark") if name else None
    listeners = overview.get("listeners") or []
    uptime = int((node.get("uptime") or 0) / 1000)
    ctx.out.flush()
    if ctx.out.json:
        # rabbitmqctl status --formatter json's keys; memory holds the one figure Warren has,
        # the RSS (RabbitMQ breaks it down by Erlang allocator).
        print(json.dumps({
            "pid": int(node["os_pid"]) if str(node.get("os_pid", "")).isdigit() else node.get("os_pid"),
            "os": node.get("os", "Linux"), "uptime": uptime,
            "product_name": overview.get("product_name", "Warren"),
            "product_version": overview.get("product_version", ""),
            "rabbitmq_version": overview.get("rabbitmq_version", ""),
            "node": name,
            "alarms": [{"node": name, "resource": a, "type": "resource_limit"} for a in alarms],
            "memory": {"strategy": "rss", "total": {"rss": node.get("mem_used")}},
            "vm_memory_calculation_strategy": "rss",
            "vm_memory_high_watermark_limit": node.get("mem_limit"),
            **({"vm_memory_high_watermark_setting": watermark} if watermark else {}),
            "disk_free": node.get("disk_free"), "disk_free_limit": node.get("disk_free_limit"),
            "file_descriptors": {"total_used": node.get("fd_used"), "total_limit": node.get("fd_total"),
                                 "sockets_used": node.get("sockets_used"),
                                 "sockets_limit": node.get("sockets_total")},
            "processes": {"used": node.get("proc_used"), "limit": node.get("proc_total")},
            "totals": {"virtual_host_count": len(vhosts), "connection_count": totals.get("connections", 0),
                       "queue_count": totals.get("queues", 0)},
            "listeners": listeners,
        }, indent=2))
        return
    if not ctx.out.quiet:
        print(f"Status of node {name} ...")
    bold = (lambda s: f"\x1b[1m{s}\x1b[0m") if sys.stdout.isatty() else (lambda s: s)
    lines = [bold("Runtime"), "",
             f"OS PID: {node.get('os_pid', '')}",
             f"OS: {node.get('os', 'Linux')}",
             f"Uptime (seconds): {uptime}",
             f"RabbitMQ version: {overview.get('rabbitmq_version', '')}",
             f"Node name: {name}"]
    product, version = overview.get("product_name"), overview.get("product_version")
    if product and product != "RabbitMQ":
        lines.insert(5, f"{product} version: {version or ''}")
    lines += ["", bold("Alarms"), ""]
    lines += [_ALARM_LINES[a].format(name) for a in alarms] or ["(none)"]
    lines += ["", bold("Memory"), "", f"Total memory used: {_gb(node.get('mem_used'))}",
              "Calculation strategy: rss"]
    if node.get("mem_limit") is not None:
        if watermark and "relative" in watermark:
            setting = f"{watermark['relative']} of available memory"
        elif watermark and "absolute" in watermark:
            setting = _gb(watermark["absolute"])
        else:
            setting = _gb(node.get("mem_limit"))
        lines.append(f"Memory high watermark setting: {setting}, computed to: {_gb(node.get('mem_limit'))}")
    lines += ["", bold("File Descriptors"), "",
              f"Total: {node.get('fd_used', '')}, limit: {node.get('fd_total', '')}",
              f"Sockets: {node.get('sockets_used', '')}, limit: {node.get('sockets_total', '')}",
              "", bold("Free Disk Space"), ""]
    if node.get("disk_free_limit") is not None:
        lines.append(f"Low free disk space watermark: {_gb(node.get('disk_free_limit'))}")
    lines += [f"Free disk space: {_gb(node.get('disk_free'))}",
              "", bold("Totals"), "",
              f"Connection count: {totals.get('connections', 0)}",
              f"Queue count: {totals.get('queues', 0)}",
              f"Virtual host count: {len(vhosts)}",
              "", bold("Listeners"), ""]
    for lst in listeners:
        lines.append(f"Interface: {_interface(lst)}, port: {lst.get('port', '')}, "
                     f"protocol: {lst.get('protocol', '')}, purpose: {lst.get('purpose', _purpose(lst))}")
    print("\n".join(lines), flush=True)


def _this_node(overview: dict, nodes: list) -> dict:
    """The answering node's entry of /api/nodes (which lists every member in a cluster)."""
    name = overview.get("node")
    return next((n for n in nodes if n.get("name") == name), nodes[0] if nodes else {})


def _purpose(listener) -> str:
    return {"amqp": "AMQP 0-9-1", "amqp/ssl": "AMQP 0-9-1 over TLS", "http": "HTTP API",
            "https": "HTTP API over TLS (HTTPS)", "http/prometheus": "Prometheus exporter API over HTTP",
            "clustering": "inter-node and CLI tool communication"}.get(listener.get("protocol"), "")


def _interface(listener) -> str:
    """The address as rabbitmqctl prints it: an IPv6 one in brackets ([::1])."""
    address = str(listener.get("ip_address", listener.get("interface", "")))
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


# cluster

def _node_alarms(node: dict) -> list[str]:
    return [a for a, on in (("memory", node.get("mem_alarm")), ("disk", node.get("disk_free_alarm"))) if on]


def _version(overview: dict, node: dict, here: bool) -> dict:
    """rabbitmqctl cluster_status's versions entry: the product (Warren) and its version, and
    the runtime's (Python; "none" for Erlang, as Warren's rabbitmq_build_info metric says)."""
    apps = {a.get("name"): a.get("version") for a in node.get("applications") or () if isinstance(a, dict)}
    if "warren" in apps:
        return {"erlang_version": "none", "python_version": apps.get("python") or "",
                "rabbitmq_name": "Warren", "rabbitmq_version": apps["warren"] or ""}
    # Another broker's API (RabbitMQ's: its rabbit application, Erlang in the overview).
    return {"erlang_version": overview.get("erlang_version", "") if here else "",
            "rabbitmq_name": overview.get("product_name", "RabbitMQ"), "rabbitmq_version": apps.get("rabbit", "")}


@verb("cluster_status", "cluster_status",
      help="Displays all the nodes in the cluster grouped by node type, together with the currently running nodes.")
def cluster_status(ctx, args):
    overview = ctx.api.get("/overview") or {}
    nodes = [n for n in ctx.api.get("/nodes") or [] if isinstance(n, dict) and n.get("name")]
    here = _this_node(overview, nodes)
    name = here.get("name") or overview.get("node", "")
    ctx.out.info(f"Cluster status of node {name} ...")
    disk = sorted(n["name"] for n in nodes)
    running = sorted(n["name"] for n in nodes if n.get("running", True))
    versions = {n["name"]: _version(overview, n, n is here) for n in nodes if n["name"] in running}
    # As rabbitmqctl asks each running node for its own alarms (status shows this node's only).
    by_name = {n["name"]: n for n in nodes}
    alarms = [{"node": n, "resource": a, "type": "resource_limit"} for n in running for a in _node_alarms(by_name[n])]
    listeners: dict[str, list[dict]] = {}
    for lst in overview.get("listeners") or []:
        node = lst.get("node", name)
        if node in running:
            listeners.setdefault(node, []).append(
                {"interface": _interface(lst), "node": node, "port": lst.get("port"),
                 "protocol": lst.get("protocol", ""), "purpose": lst.get("purpose", _purpose(lst))})
    listeners = {n: listeners[n] for n in sorted(listeners)}
    maintenance = {n: "not under maintenance" for n in running}
    ctx.out.flush()
    if ctx.out.json:
        # rabbitmqctl's keys but feature_flags (Warren has none to show).
        print(compact_json({"alarms": alarms, "cluster_name": overview.get("cluster_name", ""), "disk_nodes": disk,
                            "listeners": listeners, "maintenance_status": maintenance, "partitions": {},
                            "ram_nodes": [], "running_nodes": running, "versions": versions}), flush=True)
        return
    bold = (lambda s: f"\x1b[1m{s}\x1b[0m") if sys.stdout.isatty() else (lambda s: s)
    lines = [bold("Basics"), "", f"Cluster name: {overview.get('cluster_name', '')}",
             "", bold("Disk Nodes"), "", *disk,
             "", bold("Running Nodes"), "", *running,
             "", bold("Versions"), ""]
    for node, v in versions.items():
        runtime = f"Python {v['python_version']}" if "python_version" in v else f"Erlang {v['erlang_version']}"
        lines.append(f"{node}: {v['rabbitmq_name']} {v['rabbitmq_version']} on {runtime}")
    lines += ["", bold("Maintenance status"), ""]
    lines += [f"Node: {n}, status: {status}" for n, status in maintenance.items()]
    lines += ["", bold("Alarms"), ""]
    lines += [_ALARM_LINES[a["resource"]].format(a["node"]) for a in alarms] or ["(none)"]
    lines += ["", bold("Network Partitions"), "", "(none)", "", bold("Listeners"), ""]
    lines += [f"Node: {n}, interface: {lst['interface']}, port: {lst['port']}, protocol: {lst['protocol']}, "
              f"purpose: {lst['purpose']}" for n, entries in listeners.items() for lst in entries] or ["(none)"]
    print("\n".join(lines), flush=True)


@verb("forget_cluster_node", "forget_cluster_node <existing_cluster_member_node>", (1, 1),
      help="Removes a node from the cluster. The node must not run; run on a member's machine "
           "(through its control socket). Started again, the node joins again.")
def forget_cluster_node(ctx, args):
    (node,) = args
    ctx.out.info(f"Removing node {node} from the cluster")
    refused = CtlError(EX_NOPERM, "Error: forget_cluster_node needs a node's control socket: run warrenctl on a "
                                  "member's machine as the broker's user, without --host, --port, --user or "
                                  "--password (the management API over TCP cannot forget a node).")
    if not ctx.api.local:
        raise refused
    try:
        ctx.api.delete(f"/cluster-members/{q(node)}")
    except HttpError as err:
        if err.error == "not_a_cluster_node":
            raise Failed(f"{{:not_a_cluster_node, '{err.reason}'}}") from None
        if err.error == "node_running":
            raise Failed(err.reason) from None
        raise
    except CtlError as err:
        if err.code == EX_NOPERM and not ctx.api.local:  # the socket was stale: the API over TCP refused
            raise refused from None
        raise


# --- rabbitmq-queues' verbs (warren.cluster.queue_members, through /api/quorum-queues) --------

def _local_only(ctx, name: str) -> None:
    """These change or read a node's replicas as rabbitmq-queues does over Erlang distribution:
    through a node's control socket only."""
    if not ctx.api.local:
        raise CtlError(EX_NOPERM, f"Error: {name} needs a node's control socket: run warrenctl on a member's "
                                  "machine as the broker's user, without --host, --port, --user or --password.")


def _refusal(err: HttpError) -> CtlError:
    """The broker's refusal as rabbitmq-queues prints it: Error: and its text, exit 69."""
    if err.status in (400, 404, 409, 503) and err.reason:
        return Failed(err.reason)
    return CtlError(EX_SOFTWARE, f"Error:\n{err.reason or err.error} (HTTP {err.status})")


def pretty_table(columns: list[str], rows: list[list[str]]) -> str:
    """rabbitmq-queues' PrettyTable: a box around a header row and the rows."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * (w + 2) for w in widths) + right

    def cells(values: list[str]) -> str:
        return "│" + "│".join(f" {v.ljust(w)} " for v, w in zip(values, widths)) + "│"
    return "\n".join([line("┌", "┬", "┐"), cells(columns), line("├", "┼", "┤"), *(cells(r) for r in rows),
                      line("└", "┴", "┘")])


QUORUM_STATUS_COLUMNS = ["Node Name", "Raft State", "Log Index", "Commit Index", "Snapshot Index", "Term",
                         "Machine Version"]


@verb("quorum_status", "quorum_status [--vhost <vhost>] <queue>", (1, 1),
      help="Displays quorum status of a quorum queue (through a node's control socket).")
def quorum_status(ctx, args):
    (name,) = args
    _local_only(ctx, "quorum_status")
    ctx.out.info(f"Status of quorum queue {name} on node {_node_name(ctx)} ...")
    try:
        rows = ctx.api.get(f"/quorum-queues/{q(ctx.vhost)}/{q(name)}/status") or []
    except HttpError as err:
        raise _refusal(err) from None
    ctx.out.flush()
    if ctx.out.json:
        ctx.out.table(QUORUM_STATUS_COLUMNS, [], rows)  # (one member a line, as rabbitmq-queues)
        return
    print(pretty_table(QUORUM_STATUS_COLUMNS, [[str(r.get(c, "")) for c in QUORUM_STATUS_COLUMNS] for r in rows]),
          flush=True)


def _change_members(ctx, args, verb: str, adding: bool, route: str) -> None:
    """add_member and delete_member (rabbitmq-queues'), add_replica and delete_replica
    (rabbitmq-streams'): the same banner, the same refusals."""
    name, node = args
    _local_only(ctx, verb)
    ctx.out.info(f"Adding a replica for queue {name} on node {node}..." if adding
                 else f"Removing a replica of queue {name} on node {node}...")
    path = route.format(vhost=q(ctx.vhost), name=q(name), node=q(node))
    try:
        if adding:
            ctx.api.put(path, None)
        else:
            ctx.api.delete(path)
    except HttpError as err:
        raise _refusal(err) from None


@verb("add_member", "add_member [--vhost <vhost>] <queue> <node>", (2, 2),
      help="Adds a quorum queue member (replica) on the given node.")
def add_member(ctx, args):
    _change_members(ctx, args, "add_member", True, "/quorum-queues/{vhost}/{name}/members/{node}")


@verb("delete_member", "delete_member [--vhost <vhost>] <queue> <node>", (2, 2),
      help="Removes a quorum queue member (replica) on the given node (its leader's moves first).")
def delete_member(ctx, args):
    _change_members(ctx, args, "delete_member", False, "/quorum-queues/{vhost}/{name}/members/{node}")


# rabbitmq-streams' verbs: a stream's replicas change as a quorum queue's members do.
@verb("add_replica", "add_replica [--vhost <vhost>] <queue> <node>", (2, 2),
      help="Adds a stream queue replica on the given node.")
def add_replica(ctx, args):
    _change_members(ctx, args, "add_replica", True, "/stream-replicas/{vhost}/{name}/{node}")


@verb("delete_replica", "delete_replica [--vhost <vhost>] <queue> <node>", (2, 2),
      help="Removes a stream queue replica on the given node.")
def delete_replica(ctx, args):
    _change_members(ctx, args, "delete_replica", False, "/stream-replicas/{vhost}/{name}/{node}")


def _outcomes(ctx, outcomes: list, errors_only: bool) -> None:
    outcomes = [o for o in outcomes if not errors_only or o["result"] != "ok"]
    rows = [[o["vhost"], o["name"], str(o["size"]), _outcome_text(o["result"])] for o in outcomes]
    json_rows = [{"vhost": o["vhost"], "name": o["name"], "size": o["size"], "result": _outcome_text(o["result"])}
                 for o in outcomes]
    ctx.out.table(["vhost", "name", "size", "result"], rows, json_rows, empty_line=True)


def _outcome_text(result: str) -> str:
    """rabbitmq-queues' words for a queue's result (format_result)."""
    if result == "ok":
        return "ok"
    if result == "last_node":
        return "error: the last node cannot be removed"
    if result == "timeout":
        return "error: the operation timed out and may not have been completed"
    return f"error: {result}"


@verb("grow", "grow <node> <all | even> [--vhost-pattern <pattern>] [--queue-pattern <pattern>] [--errors-only]",
      (2, 2), options=("vhost-pattern", "queue-pattern", "errors-only"),
      help="Grows quorum queue clusters by adding a member (replica) on the specified node for all matching queues.")
def grow(ctx, args):
    node, strategy = args
    if strategy not in ("all", "even"):
        raise UsageError(f'Error (argument validation): "strategy \'{strategy}\' is not recognised."\n'
                         f"Arguments given:\n\t{' '.join(['grow', *args])}\n\n{verb_help('grow')}")
    _local_only(ctx, "grow")
    ctx.out.info(f"Growing {strategy} quorum queues on {node}...")
    body = {"node": node, "strategy": strategy, "vhost_pattern": ctx.options.get("vhost-pattern", ".*"),
            "queue_pattern": ctx.options.get("queue-pattern", ".*")}
    try:
        outcomes = ctx.api.post("/quorum-queues/grow", body) or []
    except HttpError as err:
        raise _refusal(err) from None
    _outcomes(ctx, outcomes, bool(ctx.options.get("errors-only")))


@verb("shrink", "shrink <node> [--errors-only]", (1, 1), options=("errors-only",),
      help="Shrinks quorum queue clusters by removing any members (replicas) on the given node.")
def shrink(ctx, args):
    (node,) = args
    _local_only(ctx, "shrink")
    ctx.out.info(f"Shrinking quorum queues on {node}...")
    try:
        outcomes = ctx.api.post("/quorum-queues/shrink", {"node": node}) or []
    except HttpError as err:
        raise _refusal(err) from None
    _outcomes(ctx, outcomes, bool(ctx.options.get("errors-only")))


REBALANCE_COLUMNS = ["Node name", "Number of quorum queues", "Number of replicated classic queues"]


@verb("rebalance", "rebalance < all | classic | quorum > [--vhost-pattern <pattern>] [--queue-pattern <pattern>]",
      (1, 1), options=("vhost-pattern", "queue-pattern"),
      help="Re-balances leaders of replicated queues across up-and-running cluster nodes.")
def rebalance(ctx, args):
    """rabbitmq-queues' table: one row per node leading a queue rebalanced, a line between
    rows; none: its one-cell `Output` table of `[]`. JSON: its {node, result, value} with each
    row as [column, value] pairs (an Erlang proplist as its CLI encodes one)."""
    (queue_type,) = args
    if queue_type not in ("all", "classic", "quorum"):
        raise Failed(f"type {queue_type} is not supported. Try one of all, classic, quorum.")
    _local_only(ctx, "rebalance")
    ctx.out.info(f"Re-balancing leaders of {queue_type} queues...")
    body = {"type": queue_type, "vhost_pattern": ctx.options.get("vhost-pattern", ".*"),
            "queue_pattern": ctx.options.get("queue-pattern", ".*")}
    try:
        rows = ctx.api.post("/quorum-queues/rebalance", body) or []
    except HttpError as err:
        raise _refusal(err) from None
    if ctx.out.json:
        print(compact_json({"node": _node_name(ctx), "result": "ok",
                            "value": [[[c, row[c]] for c in REBALANCE_COLUMNS] for row in rows]}), flush=True)
        return
    ctx.out.flush()
    if not rows:
        print(pretty_table(["Output"], [["[]"]]), flush=True)
        return
    lines = pretty_table(REBALANCE_COLUMNS, [[str(row[c]) for c in REBALANCE_COLUMNS] for row in rows]).split("\n")
    between, cells = lines[2], lines[3:-1]
    print("\n".join([*lines[:3], *(f"{between}\n{line}" if i else line for i, line in enumerate(cells)), lines[-1]]),
          flush=True)


@verb("check_if_node_is_quorum_critical", "check_if_node_is_quorum_critical",
      help="Health check that exits with a non-zero code if there are queues with minimum online quorum "
           "(queues that would lose their quorum if the target node is shut down).")
def check_if_node_is_quorum_critical(ctx, args):
    node = _node_name(ctx)
    ctx.out.info(f"Checking if node {node} is critical for quorum of any quorum queues ...")
    try:
        answer = ctx.api.get("/health/checks/node-is-quorum-critical") or {}
    except HttpError as err:
        if err.status != 503:
            raise
        answer = err.body
    ctx.out.flush()
    queues = answer.get("queues") or []
    if answer.get("status") == "ok":
        if answer.get("reason") == "single node cluster":
            text = f"Node {node} seems to be the only one in a single node cluster, the check does not apply"
            result = {"result": "ok", "message": "Target node seems to be the only one in a single node cluster, "
                                                 "the check does not apply"}
        else:
            text, result = f"Node {node} reported no quorum queues with minimum quorum", {"result": "ok"}
        if ctx.out.json:
            print(compact_json(result), flush=True)
        elif not ctx.out.silent:
            print(text, flush=True)
        return
    if ctx.out.json:
        print(compact_json({"message": f"Node {node} reported local queues with minimum online quorum",
                            "queues": queues, "result": "error"}), flush=True)
        raise CtlError(EX_UNAVAILABLE, "")
    raise CtlError(EX_UNAVAILABLE, "" if ctx.out.silent else "\n".join(
        f"{queue['readable_name']} would lose quorum if node {node} is stopped" for queue in queues))


@verb("help", "help [<command>]", (0, 1), help="Displays usage information for a command.")
def help_verb(ctx, args):
    if args:
        name = args[0]
        if name not in VERBS:
            raise unknown_verb(name)
        print(verb_help(name))
    else:
        print(general_usage())


# --- argument parsing -----------------------------------------------------------------------

GLOBAL_VALUE_OPTIONS = {"host": "host", "port": "port", "user": "user", "username": "user",
                        "password": "password", "formatter": "formatter", "vhost": "vhost",
                        "timeout": "timeout", "data-dir": "data_dir"}
# Any of these names a broker over TCP with a user; without them, the local control socket.
REMOTE_SETTINGS = ("host", "port", "user", "password")
GLOBAL_FLAGS = {"quiet", "silent", "no-table-headers", "help"}
SHORT = {"p": "vhost", "q": "quiet", "s": "silent", "t": "timeout", "?": "help", "h": "help"}
VERB_SHORT = {"e": "if-empty", "u": "if-unused"}
VERB_VALUE_OPTIONS = {"priority", "apply-to", "missing-exchange", "vhost-pattern", "queue-pattern"}
VERB_FLAGS = {"if-empty", "if-unused", "global", "online", "offline", "errors-only"}
FORMATTERS = ("table", "json")

GLOBAL_HELP = f"""\
Global options (accepted anywhere on the line):
  --host <host>            management API host (default $WARRENCTL_HOST or 127.0.0.1)
  --port <port>            management API port (default $WARRENCTL_PORT or 15672)
  --user <user>            user to authenticate as (default guest)
  --password <password>    its password (default guest)
  --data-dir <dir>         the local broker's data directory, where its control socket is
                           (default $WARREN_DATA_DIR or ~/.local/share/warren)
  Without --host, --port, --user and --password (and $WARRENCTL_HOST/PORT), warrenctl talks
  to the local broker through the control socket in its data directory, with full
  authority as rabbitmqctl has; without that socket, to 127.0.0.1:15672 as guest.
  -p, --vhost <vhost>      virtual host for vhost-scoped commands (default /)
  --formatter table|json   output format (default table)
  -q, --quiet              suppress informational messages
  -s, --silent             suppress informational messages and table header row
  --no-table-headers       suppress the table header row
  -t, --timeout <seconds>  HTTP timeout (default 60)
  -?, -h, --help           display help ({PROG} help <command> for one command)"""


def general_usage() -> str:
    lines = [f"Usage\n\n{PROG} [--host <host>] [--port <port>] [--user <user> --password <password>] "
             "[--formatter table|json] [--quiet] <command> [<command options>]", "", "Available commands:", ""]
    width = max(len(n) for n in VERBS)
    lines += [f"   {n.ljust(width)}  {VERBS[n]['help']}" for n in sorted(VERBS)]
    lines += ["", GLOBAL_HELP, "",
              "Exit codes: 0 ok, 64 usage, 65 bad data or no such vhost, 67 no such user, "
              "69 broker unreachable, 70 failure, 77 authentication failed."]
    return "\n".join(lines)


def verb_help(name) -> str:
    spec = VERBS[name]
    text = f"Usage\n\n{PROG} [--host <host>] [--port <port>] [--quiet] {spec['usage']}\n\n{spec['help']}"
    if spec["columns"]:
        text += f"\n\n<column> must be one of {', '.join(sorted(spec['columns']))}"
    return text + "\n\n" + GLOBAL_HELP


def unknown_verb(name) -> UsageError:
    msg = f"\nCommand '{name}' not found. "
    close = difflib.get_close_matches(name, list(VERBS), n=1, cutoff=0.6)
    if close:
        msg += f"\nDid you mean '{close[0]}'? "
    return UsageError(msg + f"\n\nRun '{PROG} help' to list the commands.")


def parse(argv):
    """(verb, positional args, global settings, verb options)."""
    settings = {"host": os.environ.get("WARRENCTL_HOST", "127.0.0.1"),
                "port": os.environ.get("WARRENCTL_PORT", "15672"),
                "user": "guest", "password": "guest", "formatter": "table", "vhost": "/", "timeout": "60"}
    # "remote" is set when a flag or variable names the broker or the user (see REMOTE_SETTINGS).
    flags, options, positional = set(), {}, []
    if "WARRENCTL_HOST" in os.environ or "WARRENCTL_PORT" in os.environ:
        flags.add("remote")
    i = 0
    only_positional = False
    while i < len(argv):
        arg = argv[i]
        i += 1
        if only_positional or arg == "-" or not arg.startswith("-") or _is_negative_number(arg):
            positional.append(arg)
            continue
        if arg == "--":
            only_positional = True
            continue
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
        else:
            name, eq, value = arg[1:2], "", arg[2:]
            if value:
                eq = "="
            if name in SHORT:
                name = SHORT[name]
            elif name in VERB_SHORT and not value:
                name = VERB_SHORT[name]
            else:
                raise UsageError(f"Error (argument validation): Invalid options for this command:\n{arg}")
        if name in GLOBAL_VALUE_OPTIONS or name in VERB_VALUE_OPTIONS:
            if not eq:
                if i >= len(argv):
                    raise UsageError(f"Error (argument validation): option --{name} needs a value")
                value = argv[i]
                i += 1
            if name == "user" and positional[:1] == ["list_user_limits"]:
                options["user"] = value  # that verb's own --user (the API user: --username)
            elif name in GLOBAL_VALUE_OPTIONS:
                settings[GLOBAL_VALUE_OPTIONS[name]] = value
                if GLOBAL_VALUE_OPTIONS[name] in REMOTE_SETTINGS:
                    flags.add("remote")
            else:
                options[name] = value
        elif name in GLOBAL_FLAGS:
            flags.add(name)
        elif name in VERB_FLAGS:
            options[name] = True
        else:
            raise UsageError(f"Error (argument validation): Invalid options for this command:\n{arg}")
    verb_name, args = (positional[0], positional[1:]) if positional else (None, [])
    return verb_name, args, settings, flags, options


def _is_negative_number(arg) -> bool:
    try:
        float(arg)
        return True
    except ValueError:
        return False


class Context:
    """What a verb runs with (run() sets it up)."""

    vhost: str
    timeout: float
    options: dict[str, str | bool]  # the verb's own options: --name=value, or True for a flag
    out: Output
    api: Api


def _local_control_socket(data_dir: str | None) -> str | None:
    """The local broker's control socket, if there is one (else None: the API over TCP)."""
    path = local.control_socket(local.data_dir(data_dir))
    try:
        return path if stat.S_ISSOCK(os.stat(path).st_mode) else None
    except OSError:
        return None


def run(argv) -> int:
    verb_name, args, settings, flags, options = parse(argv)
    if verb_name is None:
        if "help" in flags:
            print(general_usage())
            return EX_OK
        raise UsageError(general_usage())
    if verb_name not in VERBS:
        raise unknown_verb(verb_name)
    if "help" in flags:
        print(verb_help(verb_name))
        return EX_OK
    spec = VERBS[verb_name]
    lo, hi = spec["args"]
    if len(args) < lo:
        raise UsageError(f"Error (argument validation): not enough arguments.\n\n{verb_help(verb_name)}")
    if hi is not None and len(args) > hi:
        raise UsageError(f"Error (argument validation): too many arguments.\n\n{verb_help(verb_name)}")
    bad = [o for o in options if o not in spec["options"]]
    if bad:
        raise UsageError("Error (argument validation): Invalid options for this command:\n"
                         + "\n".join(f"--{o}" for o in bad) + f"\n\n{verb_help(verb_name)}")
    if settings["formatter"] not in FORMATTERS:
        raise UsageError(f"Error (argument validation): formatter '{settings['formatter']}' is not supported "
                         f"(use one of: {', '.join(FORMATTERS)})")
    try:
        port = int(settings["port"])
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise UsageError(f"Error (argument validation): --port must be a port number, not '{settings['port']}'") \
            from None
    try:
        timeout = float(settings["timeout"])
    except ValueError:
        raise UsageError(f"Error (argument validation): --timeout must be a number of seconds, "
                         f"not '{settings['timeout']}'") from None
    ctx = Context()
    ctx.vhost = settings["vhost"]
    ctx.timeout = timeout
    ctx.options = options
    ctx.out = Output(settings["formatter"], "quiet" in flags, "silent" in flags, "no-table-headers" not in flags)
    ctx.api = Api(settings["host"], port, settings["user"], settings["password"], timeout, ctx.out.flush,
                  None if "remote" in flags else _local_control_socket(settings.get("data_dir")))
    try:
        spec["fn"](ctx, args)
    except HttpError as err:
        reason = err.reason or err.error
        raise CtlError(EX_SOFTWARE, f"Error:\n{reason} (HTTP {err.status})") from None
    except CtlError as err:
        if err.code not in (EX_UNAVAILABLE, EX_NOPERM) or isinstance(err, Failed):
            ctx.out.flush()  # the banner, then the error, as rabbitmqctl
        raise
    ctx.out.flush()
    return EX_OK


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    allow_nesting()  # arguments and client properties as deep as the broker accepts print too
    try:
        code = run(argv)
    except CtlError as err:
        sys.stdout.flush()
        print(err.message, file=sys.stderr)
        code = err.code
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # Output piped into something that stopped reading (e.g. head): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EX_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
