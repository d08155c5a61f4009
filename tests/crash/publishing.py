"""A publisher for kill -9 tests: publishes numbered messages with confirms until told to
stop or cut off by the crash, recording every number the broker confirmed."""

import signal
import threading
import time

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


def kill_while_running(broker, restart_broker, stop: threading.Event, targets: list, seconds: float):
    """One kill -9 round: start a thread per (target, args), let them run `seconds`, SIGKILL
    the broker under them, stop and join them, and return the broker restarted on its data."""
    threads = [threading.Thread(target=target, args=args) for target, args in targets]
    for t in threads:
        t.start()
    time.sleep(seconds)
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()
    stop.set()
    for t in threads:
        t.join(10)
    return restart_broker(broker, sig=signal.SIGKILL)
