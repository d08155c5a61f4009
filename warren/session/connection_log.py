"""RabbitMQ's connection and channel log lines (rabbit_reader and rabbit_channel, 3.10.8),
word for word, written only when a connection starts, opens, fails or ends: nothing per frame
or message.

Where RabbitMQ names the reader process of a connection (<0.689.0>), Warren names the
connection's id, <0.N.0> with N counting connections from 1: it is also put in the lines'
pid field (warren.cli.logs), so one connection's lines can be found as in RabbitMQ's log.
Its name is RabbitMQ's, "PEER -> LOCAL" ("127.0.0.1:52976 -> 127.0.0.1:5672", IPv6 addresses
in brackets).

The lines, in the order a connection meets them:

    [info]    accepting AMQP connection <P> (NAME)                  (its first bytes; debug if none came)
    [info]    connection <P> (NAME): user 'U' authenticated and granted access to vhost 'V'
    [error]   Error on AMQP connection <P> (NAME, state: starting):
              PLAIN login refused: user 'U' - invalid credentials
    [error]   Error on AMQP connection <P> (NAME, user: 'U', state: opening):
              vhost v not found
    [error]   Error on AMQP connection <P> (NAME, vhost: 'V', user: 'U', state: running), channel 0:
               operation channel.open caused a connection exception channel_error: "..."
    [error]   Channel error on connection <P> (NAME, vhost: 'V', user: 'U'), channel 1:
              operation queue.declare caused a channel exception not_found: no queue 'q' in vhost '/'
    and one of these when it ends:
    [info]    closing AMQP connection <P> (NAME, vhost: 'V', user: 'U')    (either side sent connection.close)
    [warning] closing AMQP connection <P> (NAME, vhost: 'V', user: 'U'):
              client unexpectedly closed TCP connection
    [error]   closing AMQP connection <P> (NAME):
              missed heartbeats from client, timeout: 60s      (or {handshake_timeout,handshake},
                                                                {bad_header,<<"GET / HT">>}, ...)
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Protocol

from ..amqp import spec
from ..amqp.constants import REPLY_NAMES
from ..amqp.erlang import erl_binary, erl_string

if TYPE_CHECKING:
    from ..broker.auth import User
    from ..broker.ports import Transport
    from ..broker.vhost import VHost

log = logging.getLogger("warren.connection")
channel_log = logging.getLogger("warren.channel")

_ids = itertools.count(1)


class LoggedConnection(Protocol):
    """What the lines say of a connection (warren.session.connection.Connection, which
    imports this module)."""

    log_id: str            # its id in the log (new_id())
    peer: tuple[str, int]
    transport: Transport   # (its local address)
    user: User | None      # once logged in
    vhost: VHost | None    # once open
    data_seen: bool        # it has sent a byte
    end_logged: bool       # its last line is written


def new_id() -> str:
    """A connection's id, shaped like the Erlang pid RabbitMQ names: <0.N.0>."""
    return f"<0.{next(_ids)}.0>"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # rabbit_misc:ntoab


def name(conn: LoggedConnection) -> str:
    """RabbitMQ's connection name in its log: "PEER -> LOCAL"."""
    peer, local = conn.peer, conn.transport.local
    return f"{_address(peer[0], peer[1])} -> {_address(local[0], local[1])}"


def method_name(class_id: int, method_id: int) -> str:
    """The method as RabbitMQ's logs name it (its record's atom: queue.declare, connection.start_ok),
    "none" when there is none."""
    cls = spec.BY_ID.get((class_id << 16) | method_id)
    return cls.NAME.replace("-", "_") if cls is not None else "none"


def error_name(code: int) -> str:
    """The AMQP error's name as RabbitMQ's logs write it: not_found, channel_error."""
    return REPLY_NAMES.get(code, "internal_error").lower()


def _say(conn: LoggedConnection, level: int, text: str, logger: logging.Logger = log) -> None:
    logger.log(level, "%s", text, extra={"erl_pid": conn.log_id})


def _who(conn: LoggedConnection) -> str:
    # rabbit_reader's closing lines name the vhost and user once the user has logged in.
    user, vhost = conn.user, conn.vhost
    if user is None:
        return ""
    return f", vhost: '{vhost.name if vhost is not None else 'none'}', user: '{user.name}'"


def accepting(conn: LoggedConnection, level: int = logging.INFO) -> None:
    conn.data_seen = True
    if log.isEnabledFor(level):
        _say(conn, level, f"accepting AMQP connection {conn.log_id} ({name(conn)})")


def granted(conn: LoggedConnection) -> None:
    if log.isEnabledFor(logging.INFO):
        assert conn.user is not None and conn.vhost is not None
        _say(conn, logging.INFO, f"connection {conn.log_id} ({name(conn)}): user '{conn.user.name}' "
                                 f"authenticated and granted access to vhost '{conn.vhost.name}'")


def login_refused(conn: LoggedConnection, mechanism: str, reason: str) -> None:
    _say(conn, logging.ERROR, f"Error on AMQP connection {conn.log_id} ({name(conn)}, state: starting):\n"
                              f"{mechanism} login refused: {reason}")


def handshake_refused(conn: LoggedConnection, state: str, text: str) -> None:
    """A refusal of connection.open (not_allowed: no such vhost, no access, a limit)."""
    user = conn.user.name if conn.user is not None else "none"
    _say(conn, logging.ERROR, f"Error on AMQP connection {conn.log_id} ({name(conn)}, user: '{user}', "
                              f"state: {state}):\n{text}")


def amqp_error_term(code: int, text: str, class_id: int, method_id: int) -> str:
    """RabbitMQ's #amqp_error{} record as ~p prints it (on one line)."""
    method = method_name(class_id, method_id)
    return f"{{amqp_error,{error_name(code)},{erl_string(text)},{method if method == 'none' else repr(method)}}}"


def connection_exception(code: int, text: str, class_id: int, method_id: int) -> str:
    """rabbit_reader's format_hard_error of an #amqp_error{}."""
    return (f"operation {method_name(class_id, method_id)} caused a connection exception "
            f"{error_name(code)}: {erl_string(text)}")


def hard_error(conn: LoggedConnection, state: str, channel: int, detail: str) -> None:
    """The connection is closed with an error (rabbit_reader's log_hard_error)."""
    _say(conn, logging.ERROR, f"Error on AMQP connection {conn.log_id} ({name(conn)}{_who(conn)}, "
                              f"state: {state}), channel {channel}:\n {detail}")


def channel_error(conn: LoggedConnection, channel: int, code: int, text: str, class_id: int, method_id: int) -> None:
    """A channel is closed with an error (rabbit_channel's handle_exception)."""
    if channel_log.isEnabledFor(logging.ERROR):
        _say(conn, logging.ERROR,
             f"Channel error on connection {conn.log_id} ({name(conn)}{_who(conn)}), channel {channel}:\n"
             f"operation {method_name(class_id, method_id)} caused a channel exception {error_name(code)}: {text}",
             channel_log)


def bad_header(header: bytes) -> str:
    """The reason a connection that did not start with AMQP's header is closed for."""
    return "{bad_header," + erl_binary(header).decode("latin-1") + "}"


def ended(conn: LoggedConnection, reason: str | None = None, clean: bool = False) -> None:
    """The connection is over: RabbitMQ's last line for it, once. `reason` (an error in
    RabbitMQ's words) makes it an error line; `clean` (a connection.close was sent, by either
    side) an info line; else the client went away: a warning. A connection that never sent a
    byte (a TCP health check) is a debug line."""
    if conn.end_logged:
        return
    conn.end_logged = True
    if not conn.data_seen:
        if reason is None:
            accepting(conn, logging.DEBUG)
            if log.isEnabledFor(logging.DEBUG):
                _say(conn, logging.DEBUG, f"closing AMQP connection {conn.log_id} ({name(conn)}):\n"
                                          "connection_closed_with_no_data_received")
            return
        accepting(conn)
    if reason is not None:
        _say(conn, logging.ERROR, f"closing AMQP connection {conn.log_id} ({name(conn)}):\n{reason}")
    elif clean:
        if log.isEnabledFor(logging.INFO):
            _say(conn, logging.INFO, f"closing AMQP connection {conn.log_id} ({name(conn)}{_who(conn)})")
    else:
        _say(conn, logging.WARNING, f"closing AMQP connection {conn.log_id} ({name(conn)}{_who(conn)}):\n"
                                    "client unexpectedly closed TCP connection")
