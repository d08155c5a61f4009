"""A publisher for kill -9 tests: publishes numbered messages with confirms until told to
stop or cut off by the crash, recording every number the broker confirmed."""

import threading

import pika


def confirmed_publisher(params, queue: str, stop: threading.Event, confirmed: list, first: int,
                        persistent: bool = True) -> None:
    """Publish str(n) for n = first, first + 1, ... to `queue` (default exchange), waiting for
    each confirm; every n appended to `confirmed` was acked by the broker."""
    props = pika.BasicProperties(delivery_mode=2) if persistent else None
    try:
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()
        i = first
        while not stop.is_set():
            ch.basic_publish("", queue, str(i).encode(), props)
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        pass  # the broker was killed
