"""A client's SASL answer (connection.start-ok's response): the user name and password of
PLAIN and AMQPLAIN. Which mechanisms there are and which are offered is
warren.broker.auth_mechanisms'; EXTERNAL takes its name from the TLS session
(warren.session.connection)."""

from ..amqp.codec import DecodeError, decode_table


def credentials(mechanism: str, response: bytes):
    """(username, password) from a start-ok response, or None if it cannot be parsed."""
    user: object  # bytes (PLAIN), or whatever field value an AMQPLAIN table holds
    password: object
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        _authzid, user, password = parts
    elif mechanism == "AMQPLAIN":
        try:
            table = decode_table(response)  # a field table without its length prefix
        except DecodeError:
            return None
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if user is None or password is None:
            return None
    else:
        return None
    try:
        return _text(user), _text(password)
    except UnicodeDecodeError:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
