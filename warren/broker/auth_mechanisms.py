"""The SASL mechanisms Warren has: PLAIN and AMQPLAIN (RabbitMQ's default), and EXTERNAL (the
client certificate's name, as rabbitmq_auth_mechanism_ssl), offered when auth_mechanisms
lists them. The session offers them and reads a client's answer (warren.session.sasl); the
management API lists them (GET /api/nodes); the config file names them."""

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
