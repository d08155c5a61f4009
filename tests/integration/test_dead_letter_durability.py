"""A persistent message dead-lettered from a durable queue to a durable queue leaves its source
only once its copy is safely in the target (Warren only: RabbitMQ's classic queues let go at
once). Shown with a target whose segment file cannot grow (RLIMIT_FSIZE): its write fails, and
the message stays in the source instead of being lost; see tests/crash/test_dead_letter_kill9.py
for kill -9 while dead-lettering."""

import signal
import time

import pika

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _fill_until_nacked(ch, queue) -> int:
    """Publish 100 KB persistent messages until one is nacked (the file limit is reached)."""
    for i in range(100):
        try:
            ch.basic_publish("", queue, b"f" * 100_000, PERSISTENT)
        except pika.exceptions.NackError:
            return i
    raise AssertionError("writes past the file size limit never failed")


def test_failed_dead_letter_write_keeps_the_message(make_broker, restart_broker, uid):
    b = make_broker(rlimit_fsize=1 << 20)
    work, dlq = f"work-{uid}", f"dlq-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        ch.queue_declare(work, durable=True,
                         arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        ch.confirm_delivery()
        ch.basic_publish("", work, b"precious", PERSISTENT)
        filled = _fill_until_nacked(ch, dlq)
        assert filled > 3
        method, _props, body = ch.basic_get(work)
        assert body == b"precious" and not method.redelivered
        ch.basic_reject(method.delivery_tag, requeue=False)  # to the DLQ, whose write fails
        for _ in range(100):
            method, _props, body = ch.basic_get(work)
            if method is not None:
                break
            conn.sleep(0.02)
        # It came back to its source, as a redelivery, rather than vanishing.
        assert body == b"precious" and method.redelivered
        ch.basic_nack(method.delivery_tag, requeue=True)
    b = restart_broker(b, sig=signal.SIGKILL)
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(work, auto_ack=True)
        assert body == b"precious"
        assert ch.queue_declare(dlq, passive=True).method.message_count == filled


def test_dead_lettered_copy_survives_while_source_settles(make_broker, restart_broker, uid):
    """The ordinary case: rejected and expired persistent messages are in the durable DLQ
    after a kill -9 that follows the dead-lettering, and gone from their sources."""
    b = make_broker()
    work, ttl, dlq = f"work-{uid}", f"ttl-{uid}", f"dlq-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        dl = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
        ch.queue_declare(work, durable=True, arguments=dl)
        ch.queue_declare(ttl, durable=True, arguments={**dl, "x-message-ttl": 1})
        ch.confirm_delivery()
        ch.basic_publish("", work, b"rejected", PERSISTENT)
        ch.basic_publish("", ttl, b"expired", PERSISTENT)
        method, _props, _body = ch.basic_get(work)
        ch.basic_reject(method.delivery_tag, requeue=False)
        for _ in range(100):
            if ch.queue_declare(dlq, passive=True).method.message_count == 2:
                break
            conn.sleep(0.02)
        # The copies are in the DLQ's memory now, and on disk after the next fsync: a
        # confirmed publish waits for one, and its confirm leaves after the sources' settle
        # marks are written (before it, a crash would leave a message in both: at least once).
        ch.queue_declare(f"sync-{uid}", durable=True)
        ch.basic_publish("", f"sync-{uid}", b"sync", PERSISTENT)
    b = restart_broker(b, sig=signal.SIGKILL)
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        got = []
        while (m := ch.basic_get(dlq, auto_ack=True))[0] is not None:
            got.append((m[2], m[1].headers["x-death"][0]["reason"]))
        assert sorted(got) == [(b"expired", "expired"), (b"rejected", "rejected")]
        assert [ch.queue_declare(q, passive=True).method.message_count for q in (work, ttl)] == [0, 0]


# Long enough that a kill -9 and a restart on a loaded machine (CI's two workers) fit in it.
TTL_MS = 8000


def test_ttl_counts_from_the_publish_across_a_restart(make_broker, restart_broker, uid):
    """The TTL deadline is kept in the message's record: after a kill -9 and a restart the
    message still expires when it would have (RabbitMQ keeps it in its queue index too), not
    a whole TTL after the restart."""
    b = make_broker()
    q, dlq = f"ttl-{uid}", f"dlq-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        ch.queue_declare(q, durable=True, arguments={"x-message-ttl": TTL_MS, "x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": dlq})
        ch.confirm_delivery()
        ch.basic_publish("", q, b"timed", PERSISTENT)
        published = time.monotonic()
    time.sleep(2)
    b = restart_broker(b, sig=signal.SIGKILL)
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 1  # not expired yet
        while (m := ch.basic_get(dlq, auto_ack=True))[0] is None:
            assert time.monotonic() - published < TTL_MS / 1000 + 1.5, "the TTL started again at the restart"
            conn.sleep(0.05)
        assert m[2] == b"timed" and m[1].headers["x-death"][0]["reason"] == "expired"
        assert time.monotonic() - published > TTL_MS / 1000 - 0.1
