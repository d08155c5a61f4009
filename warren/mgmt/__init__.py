"""The operator surface: RabbitMQ's management HTTP API (and later the web page and metrics)."""
