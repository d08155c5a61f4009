"""A quorum queue's leader hands a message out only once its log has committed the entry that
records the delivery, as RabbitMQ's quorum queues deliver only what their Raft log applied:
otherwise a leader that dies (or is replaced) just after a delivery leaves a successor that
hands the same message out again as new (warren.session.gated_output).

A queue of two members (a majority of two is both) whose follower is paused (SIGSTOP) can
commit nothing: a consumer or a basic.get, on the leader's node or on the node that holds no
replica, gets nothing until the follower runs again."""

from __future__ import annotations

import signal
import threading
import time

import pika
import pytest
import requests

from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import wait_for
from .total_queue import AUTH, QQ, leader

TWO = {**QQ, "x-quorum-initial-group-size": 2}


def fill(node, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(node.pika_params())
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=TWO)
    channel.confirm_delivery()
    for n in range(count):
        channel.basic_publish("", queue, str(n).encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()


@pytest.mark.parametrize("how", ["consume", "get"])
@pytest.mark.parametrize("where", ["leader", "other node"])
def test_nothing_is_delivered_while_the_delivery_cannot_be_committed(three, how, where):  # noqa: F811
    fill(three[0], "qq-gated", 3)
    members = requests.get(f"{three[0].api}/queues/%2F/qq-gated", auth=AUTH, timeout=5).json()["members"]
    a = three[0]
    [b] = [n for n in three if n.name in members and n is not a]
    [c] = [n for n in three if n.name not in members]
    assert leader(c, "qq-gated") == a.name
    node = a if where == "leader" else c
    connection = pika.BlockingConnection(node.pika_params(heartbeat=0))
    channel = connection.channel()
    got: list[bytes] = []
    b.proc.send_signal(signal.SIGSTOP)
    try:
        if how == "consume":
            channel.basic_consume("qq-gated", lambda ch, method, props, body: got.append(body), auto_ack=True)
            connection.process_data_events(time_limit=1.5)
        else:
            def fetch() -> None:
                method, _, body = channel.basic_get("qq-gated", auto_ack=True)
                got.append(body)
            fetching = threading.Thread(target=fetch, daemon=True)
            fetching.start()
            fetching.join(1.5)
        assert got == [], "delivered before the follower could hold the entry recording it"
    finally:
        b.proc.send_signal(signal.SIGCONT)
    started = time.monotonic()
    if how == "consume":
        wait_for(lambda: connection.process_data_events(time_limit=0.1) or len(got) == 3, timeout=15,
                 what="the deliveries once committed")
        assert got == [b"0", b"1", b"2"]
    else:
        fetching.join(15)
        assert got == [b"0"]
    print(f"delivered {time.monotonic() - started:.2f} s after the follower ran again")
    connection.close()
