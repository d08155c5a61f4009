"""SASL mechanisms: PLAIN and AMQPLAIN (RabbitMQ's default), and EXTERNAL (the client
certificate's name, as rabbitmq_auth_mechanism_ssl), when auth_mechanisms lists it."""

from ..amqp.codec import DecodeError, decode_table

# Every mechanism Warren has, in the order connection.start lists those offered.
KNOWN = ("PLAIN", "AMQPLAIN", "EXTERNAL")
DEFAULT = ("PLAIN", "AMQPLAIN")  # RabbitMQ's default auth_mechanisms
# RabbitMQ's descriptions (GET /api/nodes).
DESCRIPTIONS = {"PLAIN": "SASL PLAIN authentication mechanism", "AMQPLAIN": "QPid AMQPLAIN mechanism",
                "EXTERNAL": "TLS peer verification-based authentication plugin. "
                            "Used in combination with the EXTERNAL SASL mechanism."}
# Names RabbitMQ knows (registered, or atoms it has) but does not offer: a start-ok naming
# one is "invalid", any other name "unknown".
_REGISTERED = frozenset((*KNOWN, "RABBIT-CR-DEMO"))


def offered(configured, tls: bool) -> list[str]:
    """The mechanisms connection.start offers: those configured, EXTERNAL only over TLS (as
    rabbit_auth_mechanism_ssl:should_offer, also when the client sent no certificate: the
    login is then refused with a reason in the log)."""
    return [m for m in KNOWN if m in configured and (m != "EXTERNAL" or tls)]


def known(mechanism: str) -> bool:
    """Whether RabbitMQ would call a mechanism it does not offer "invalid" (else "unknown")."""
    return mechanism in _REGISTERED


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
