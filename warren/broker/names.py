"""Server-generated names (amq.gen-... queues, amq.ctag-... consumer tags), as RabbitMQ makes them."""

import base64
import os


def server_named(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
