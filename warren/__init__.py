"""Warren: an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged."""

__version__ = "0.1.0"
