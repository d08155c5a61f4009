"""Message durability with real clients: what survives a restart (SIGTERM and SIGKILL), the
redelivered flag across restarts, paging of deep queues, disk space reclaimed, nacks when the
disk cannot be written, and group-commit confirms. Every test starts its own broker on a
fresh data directory (Warren only)."""

import glob
import hashlib
import os
import signal
import time

import pika
import pytest
from pamqp import commands, frame as pframe, header as pheader
from pamqp.body import ContentBody

import rawamqp

SIGNALS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]
PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def connect(b) -> pika.BlockingConnection:
    return pika.BlockingConnection(b.pika_params())


def queue_dir(b, queue, vhost="/") -> str:
    """Where the broker keeps a durable queue's segments: <data>/queues/<sha1(vhost NUL name)>."""
    digest = hashlib.sha1(f"{vhost}\0{queue}".encode()).hexdigest()[:24]
    return os.path.join(b.data_dir, "queues", digest)


def seg_files(directory) -> list:
    return sorted(glob.glob(os.path.join(directory, "*.seg")))


def paging_files(b) -> list:
    return sorted(glob.glob(os.path.join(b.data_dir, "paging", "*", "*.seg")))


def message_count(ch, queue) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def sync(ch) -> None:
    """A round trip: everything sent before has been handled (and written) by the broker."""
    ch.exchange_declare("amq.direct", passive=True)


def get_all(ch, queue, ack=True) -> list:
    """(method, properties, body) of every ready message, taken with basic.get and acked."""
    got = []
    while True:
        method, props, body = ch.basic_get(queue)
        if method is None:
            return got
        if ack:
            ch.basic_ack(method.delivery_tag)
        got.append((method, props, body))


def expect_gone(conn, queue) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(queue, passive=True)
    assert (err.value.reply_code, err.value.reply_text) == (404, f"NOT_FOUND - no queue '{queue}' in vhost '/'")


def consume_all(conn, ch, queue, n, prefetch=500) -> list:
    """Consume `n` messages with manual acks (acked in batches); returns their bodies."""
    ch.basic_qos(prefetch_count=prefetch)
    bodies = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        assert method is not None, f"only {len(bodies)} of {n} messages arrived"
        bodies.append(body)
        if len(bodies) % 100 == 0 or len(bodies) == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(bodies) == n:
            break
    ch.cancel()
    sync(ch)
    return bodies


# ------------------------------------------------------------------------ restarts

RICH = dict(
    content_type="application/json", content_encoding="gzip", delivery_mode=2, priority=7,
    correlation_id="corr-1", reply_to="replies", expiration="3600000", message_id="msg-1",
    timestamp=1700000000, type="order", user_id="guest", app_id="tests", cluster_id="c1",
    headers={"s": "text", "n": 42, "big": 2 ** 40, "neg": -3, "yes": True, "list": [1, "two", False],
             "nested": {"k": "v", "deeper": {"x": 1}}},
)


def props_dict(props) -> dict:
    return {k: getattr(props, k) for k in RICH}


@pytest.mark.parametrize("sig", SIGNALS)
def test_persistent_messages_in_durable_queues_survive(make_broker, restart_broker, uid, sig):
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    dq, tq, eq, qae, qe = (f"{n}-{uid}" for n in ("dq", "tq", "eq", "qae", "qe"))
    ch.queue_declare(dq, durable=True)
    ch.queue_declare(tq, durable=False)
    ch.queue_declare(eq, durable=True, exclusive=True)
    # an alternate exchange, and an exchange-to-exchange binding, leading to durable queues
    ch.exchange_declare(f"ae-{uid}", "fanout", durable=True)
    ch.exchange_declare(f"x-{uid}", "direct", durable=True, arguments={"alternate-exchange": f"ae-{uid}"})
    ch.exchange_declare(f"dst-{uid}", "topic", durable=True)
    ch.queue_declare(qae, durable=True)
    ch.queue_declare(qe, durable=True)
    ch.queue_bind(qae, f"ae-{uid}")
    ch.exchange_bind(f"dst-{uid}", f"x-{uid}", "e2e")
    ch.queue_bind(qe, f"dst-{uid}", "#")

    big = bytes(range(256)) * 1024  # 256 KiB: several body frames
    expected = []  # (body, properties) of the persistent messages of dq, in order
    for i, (body, persistent) in enumerate([(b"first", True), (b"t1", False), (b"", True), (big, True),
                                            (b"t2", None), (b"\x00\xff binary", True), (b"t3", False),
                                            (b"last", True)]):
        if persistent:
            props = pika.BasicProperties(**{**RICH, "message_id": f"msg-{i}"})
            expected.append((body, props_dict(props)))
        elif persistent is None:
            props = pika.BasicProperties(content_type="text/plain")  # no delivery mode: transient
        else:
            props = pika.BasicProperties(delivery_mode=1)
        ch.basic_publish("", dq, body, props)
    for q in (tq, eq):
        ch.basic_publish("", q, b"lost", PERSISTENT)
    ch.basic_publish(f"x-{uid}", "unrouted", b"via-ae", PERSISTENT)
    ch.basic_publish(f"x-{uid}", "e2e", b"via-e2e", PERSISTENT)
    ch.basic_publish(f"x-{uid}", "e2e", b"via-e2e-transient", TRANSIENT)
    assert message_count(ch, dq) == 8
    sync(ch)
    if sig == signal.SIGTERM:
        conn.close()

    b = restart_broker(b, sig=sig)
    conn = connect(b)
    ch = conn.channel()
    assert message_count(ch, dq) == len(expected)
    got = get_all(ch, dq)
    assert [body for _, _, body in got] == [body for body, _ in expected]
    for (method, props, body), (_, want) in zip(got, expected):
        assert props_dict(props) == want
        assert (method.exchange, method.routing_key, method.redelivered) == ("", dq, False)
    assert [(m.exchange, m.routing_key, body) for m, _, body in get_all(ch, qae)] == [
        (f"x-{uid}", "unrouted", b"via-ae")]
    assert [(m.exchange, m.routing_key, body) for m, _, body in get_all(ch, qe)] == [
        (f"x-{uid}", "e2e", b"via-e2e")]
    for q in (tq, eq):
        expect_gone(conn, q)
    # Queues, exchanges and bindings are all back: routing works as before.
    ch = conn.channel()
    ch.basic_publish(f"x-{uid}", "nowhere", b"again-ae", PERSISTENT)
    ch.basic_publish(f"x-{uid}", "e2e", b"again-e2e", PERSISTENT)
    assert [body for _, _, body in get_all(ch, qae)] == [b"again-ae"]
    assert [body for _, _, body in get_all(ch, qe)] == [b"again-e2e"]
    conn.close()
    # Everything was acked: nothing comes back after one more restart.
    b = restart_broker(b, sig=signal.SIGKILL)
    with connect(b) as conn:
        ch = conn.channel()
        assert [message_count(ch, q) for q in (dq, qae, qe)] == [0, 0, 0]


def test_confirmed_message_survives_immediate_sigkill(make_broker, restart_broker, uid):
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    q = f"dq-{uid}"
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, f"confirmed-{i}".encode(), PERSISTENT)  # returns once acked
    b.proc.send_signal(signal.SIGKILL)  # no round trip: the kill follows the last ack at once
    b = restart_broker(b, sig=signal.SIGKILL)
    with connect(b) as conn:
        ch = conn.channel()
        assert [body for _, _, body in get_all(ch, q)] == [b"confirmed-0", b"confirmed-1", b"confirmed-2"]


@pytest.mark.parametrize("sig", SIGNALS)
def test_deleted_queue_messages_do_not_come_back(make_broker, restart_broker, uid, sig):
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    q, purged = f"dq-{uid}", f"purged-{uid}"
    ch.queue_declare(q, durable=True)
    ch.queue_declare(purged, durable=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, f"old-{i}".encode(), PERSISTENT)
        ch.basic_publish("", purged, f"old-{i}".encode(), PERSISTENT)
    assert ch.queue_delete(q).method.message_count == 5
    assert ch.queue_purge(purged).method.message_count == 5
    ch.queue_declare(q, durable=True)  # the same name again: a new, empty queue
    assert message_count(ch, q) == 0
    ch.basic_publish("", q, b"new", PERSISTENT)
    ch.basic_publish("", purged, b"after-purge", PERSISTENT)
    if sig == signal.SIGTERM:
        conn.close()
    b = restart_broker(b, sig=sig)
    with connect(b) as conn:
        ch = conn.channel()
        assert [body for _, _, body in get_all(ch, q)] == [b"new"]
        assert [body for _, _, body in get_all(ch, purged)] == [b"after-purge"]


# ----------------------------------------------------------------- redelivered flag

def test_redelivered_flag_survives_sigkill(make_broker, restart_broker, uid):
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    q = f"dq-{uid}"
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(12):
        ch.basic_publish("", q, str(i).encode(), PERSISTENT)
    # basic.get: 0 and 1 left unacked, 2 acked, 3 nacked back to the queue
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(4)]
    ch.basic_ack(tags[2])
    ch.basic_nack(tags[3], requeue=True)
    # a consumer gets 3 (redelivered), 4 and 5 (its prefetch); it is cancelled, then 5 is acked
    ch.basic_qos(prefetch_count=3)
    seen = []
    for method, _props, body in ch.consume(q, inactivity_timeout=2):
        seen.append((body, method.redelivered, method.delivery_tag))
        if len(seen) == 3:
            break
    ch.cancel()
    assert [s[:2] for s in seen] == [(b"3", True), (b"4", False), (b"5", False)]
    ch.basic_ack(seen[2][2])
    # 6 is taken and nacked back: never delivered again before the crash
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"6", False)
    ch.basic_nack(method.delivery_tag, requeue=True)
    sync(ch)

    b = restart_broker(b, sig=signal.SIGKILL)
    with connect(b) as conn:
        ch = conn.channel()
        assert message_count(ch, q) == 10
        got = [(body, m.redelivered) for m, _, body in get_all(ch, q)]
    assert got == [(b"0", True), (b"1", True), (b"3", True), (b"4", True), (b"6", True)] + [
        (str(i).encode(), False) for i in range(7, 12)]


def test_redelivered_flag_survives_clean_restart_and_second_crash(make_broker, restart_broker, uid):
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    q = f"dq-{uid}"
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, str(i).encode(), PERSISTENT)
    ch.basic_get(q)
    conn.close()  # the unacked message goes back to the queue, redelivered
    b = restart_broker(b)
    conn = connect(b)
    ch = conn.channel()
    method, _, body = ch.basic_get(q)  # taken again, unacked, then a crash
    assert (body, method.redelivered) == (b"0", True)
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"1", False)
    sync(ch)
    b = restart_broker(b, sig=signal.SIGKILL)
    with connect(b) as conn:
        ch = conn.channel()
        assert [(body, m.redelivered) for m, _, body in get_all(ch, q)] == [
            (b"0", True), (b"1", True), (b"2", False)]


# -------------------------------------------------------------------------- paging

def test_paging_deep_queues(make_broker, restart_broker, uid):
    b = make_broker("--queue-window", "100")
    conn = connect(b)
    ch = conn.channel()
    dq, tq = f"dq-{uid}", f"tq-{uid}"
    ch.queue_declare(dq, durable=True)
    ch.queue_declare(tq, durable=False)
    ch.exchange_declare(f"fan-{uid}", "fanout")
    ch.queue_bind(dq, f"fan-{uid}")
    ch.queue_bind(tq, f"fan-{uid}")
    n = 5000
    bodies = [f"{i:05d}".encode().ljust(2048 + i % 7, b"~") for i in range(n)]  # ~10 MiB per queue
    for i, body in enumerate(bodies):
        ch.basic_publish(f"fan-{uid}", "", body, PERSISTENT if i % 2 else TRANSIENT)
    assert message_count(ch, dq) == n and message_count(ch, tq) == n
    # Both queues page: their messages beyond the window are in segment files.
    durable_segs = seg_files(queue_dir(b, dq))
    paged = paging_files(b)
    assert len(durable_segs) >= 2 and len(paged) >= 2
    assert sum(os.path.getsize(p) for p in durable_segs) > (n - 100) * 2048
    assert sum(os.path.getsize(p) for p in paged) > (n - 100) * 2048
    assert consume_all(conn, ch, dq, n) == bodies
    assert consume_all(conn, conn.channel(), tq, n) == bodies
    ch = conn.channel()
    assert message_count(ch, dq) == 0 and message_count(ch, tq) == 0
    # Acked: at most the segment each queue is still writing to remains.
    assert len(seg_files(queue_dir(b, dq))) <= 1
    assert len(paging_files(b)) <= 1
    ch.queue_delete(tq)
    assert paging_files(b) == []
    conn.close()
    # After a restart the durable queue is empty (every ack was recorded).
    b = restart_broker(b, "--queue-window", "100", sig=signal.SIGKILL)
    with connect(b) as conn:
        assert message_count(conn.channel(), dq) == 0


def test_paged_persistent_messages_survive_restart(make_broker, restart_broker, uid):
    b = make_broker("--queue-window", "100")
    conn = connect(b)
    ch = conn.channel()
    q = f"dq-{uid}"
    ch.queue_declare(q, durable=True)
    n = 3000
    for i in range(n):
        ch.basic_publish("", q, f"m{i}".encode(), PERSISTENT if i % 3 else TRANSIENT)
    # some delivered and left unacked, some acked, from the window and from the disk tail
    ch.basic_qos(prefetch_count=300)
    for method, _props, body in ch.consume(q, inactivity_timeout=2):
        assert body == f"m{method.delivery_tag - 1}".encode()
        if method.delivery_tag == 300:
            break
    ch.cancel()
    for tag in range(1, 151):
        ch.basic_ack(tag)
    sync(ch)
    b = restart_broker(b, "--queue-window", "100", sig=signal.SIGKILL)
    conn = connect(b)
    ch = conn.channel()
    expected = [i for i in range(150, n) if i % 3]
    assert message_count(ch, q) == len(expected)
    got = [(int(body[1:]), method.redelivered) for method, _, body in get_all(ch, q)]
    assert got == [(i, i < 300) for i in expected]
    conn.close()


# ------------------------------------------------------------------- reclaiming disk

@pytest.mark.parametrize("window", [None, "50"], ids=["in-memory", "paged"])
def test_disk_space_reclaimed(make_broker, restart_broker, uid, window):
    args = ("--queue-window", window) if window else ()
    b = make_broker(*args)
    conn = connect(b)
    ch = conn.channel()
    q = f"dq-{uid}"
    ch.queue_declare(q, durable=True)
    directory = queue_dir(b, q)
    body = b"x" * 32768
    n = 800  # 25 MiB: four 8 MiB segments

    def fill():
        for i in range(n):
            ch.basic_publish("", q, i.to_bytes(4, "big") + body, PERSISTENT)
        assert message_count(ch, q) == n
        files = seg_files(directory)
        assert len(files) >= 4
        assert sum(os.path.getsize(p) for p in files) > n * len(body)

    # consumed and acked: segments go as soon as all their messages are acked
    fill()
    before = len(seg_files(directory))
    first = consume_all(conn, ch, q, n // 2, prefetch=200)
    assert len(seg_files(directory)) < before
    rest = consume_all(conn, conn.channel(), q, n - n // 2, prefetch=200)
    assert [int.from_bytes(x[:4], "big") for x in first + rest] == list(range(n))
    assert len(seg_files(directory)) <= 1
    ch = conn.channel()
    # purged
    fill()
    assert ch.queue_purge(q).method.message_count == n
    sync(ch)
    assert len(seg_files(directory)) <= 1
    conn.close()
    b = restart_broker(b, *args, sig=signal.SIGKILL)
    conn = connect(b)
    ch = conn.channel()
    assert message_count(ch, q) == 0
    assert seg_files(directory) == []  # nothing live: recovery removed the last segment too
    # deleted
    fill()
    assert ch.queue_delete(q).method.message_count == n
    assert not os.path.exists(directory)
    conn.close()


# --------------------------------------------------------------- write failure: nack

def read_confirms(client, outcomes: dict, upto: int) -> None:
    """Read basic.ack/nack frames until every tag up to `upto` is settled, recording each
    tag's outcome ('ack' or 'nack') in `outcomes`; no tag may be settled twice."""
    while len(outcomes) < upto:
        method = client.read_frame().value
        assert isinstance(method, (commands.Basic.Ack, commands.Basic.Nack)), method
        kind = "ack" if isinstance(method, commands.Basic.Ack) else "nack"
        last = max(outcomes, default=0)
        tags = range(last + 1, method.delivery_tag + 1) if method.multiple else [method.delivery_tag]
        for tag in tags:
            assert tag not in outcomes, f"tag {tag} settled twice"
            outcomes[tag] = kind


def test_failed_writes_are_nacked(make_broker, restart_broker, uid):
    limit = 1 << 20
    b = make_broker(rlimit_fsize=limit)
    client = rawamqp.connect(b)
    client.open_channel(1)
    q = f"dq-{uid}"
    client.call(1, commands.Queue.Declare(queue=q, durable=True))
    client.call(1, commands.Confirm.Select())
    persistent = commands.Basic.Properties(delivery_mode=2)
    outcomes = {}
    tag = 0
    first_nack = None
    while first_nack is None or tag < first_nack + 10:
        assert tag < 2 * limit // 10000, "writes past the file size limit never failed"
        for _ in range(10):
            tag += 1
            client.publish(1, "", q, tag.to_bytes(4, "big") + b"p" * 10000, properties=persistent)
        read_confirms(client, outcomes, tag)
        nacked = [t for t, kind in outcomes.items() if kind == "nack"]
        if nacked and first_nack is None:
            first_nack = min(nacked)
    assert client.frames_until_quiet(0.2) == []  # nothing more: no second answer to any publish
    # Every publish got exactly one answer: acks up to the first failure, nacks from then on.
    assert sorted(outcomes) == list(range(1, tag + 1))
    assert [outcomes[t] for t in range(1, tag + 1)] == ["ack"] * (first_nack - 1) + ["nack"] * (tag - first_nack + 1)
    assert first_nack > 50  # the limit was reached, not something earlier
    # The broker keeps serving: other connections, other queues, even persistent messages
    # whose (new) segment file can still be written.
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        other = ch.queue_declare(f"other-{uid}", durable=True).method.queue
        ch.basic_publish("", other, b"still fine", PERSISTENT)  # raises NackError on a nack
        ch.basic_publish("", other, b"transient", TRANSIENT)
        assert [body for _, _, body in get_all(ch, other)] == [b"still fine", b"transient"]
    client.close()
    assert "write to " in b.log() and "File too large" in b.log()

    # Without the limit: every confirmed message is intact, in order; a nacked one may be
    # there too (if its record was complete on disk), but only after them.
    b = restart_broker(b, sig=signal.SIGKILL)
    with connect(b) as conn:
        got = [body for _, _, body in get_all(conn.channel(), q)]
    numbers = [int.from_bytes(body[:4], "big") for body in got]
    assert numbers == list(range(1, len(numbers) + 1))
    assert first_nack - 1 <= len(numbers) < tag
    assert all(body[4:] == b"p" * 10000 for body in got)


# ------------------------------------------------------------------- group commit

def test_group_commit_acks_many_publishes_at_once(make_broker, uid):
    b = make_broker()
    client = rawamqp.connect(b)
    client.open_channel(1)
    q = f"dq-{uid}"
    client.call(1, commands.Queue.Declare(queue=q, durable=True))
    client.call(1, commands.Confirm.Select())
    n = 2000
    burst = b"".join(
        pframe.marshal(commands.Basic.Publish(exchange="", routing_key=q), 1)
        + pframe.marshal(pheader.ContentHeader(0, 100, commands.Basic.Properties(delivery_mode=2)), 1)
        + pframe.marshal(ContentBody(i.to_bytes(4, "big") * 25), 1)
        for i in range(n))
    client.send(burst)
    acks = []
    settled = 0
    while settled < n:
        method = client.read_frame().value
        assert isinstance(method, commands.Basic.Ack), method
        assert method.delivery_tag > settled
        assert method.multiple == (method.delivery_tag - settled > 1)
        acks.append(method)
        settled = method.delivery_tag
    assert settled == n
    # One ack per group commit, not per message.
    assert len(acks) <= n // 10, f"{len(acks)} ack frames for {n} publishes"
    assert sum(1 for a in acks if a.multiple) >= len(acks) // 2

    # A lone publish on an idle broker waits for one fsync only, not for a timer.
    delays = []
    for i in range(5):
        time.sleep(0.05)
        started = time.monotonic()
        client.publish(1, "", q, b"lone", properties=commands.Basic.Properties(delivery_mode=2))
        method = client.expect(commands.Basic.Ack, 1)
        delays.append(time.monotonic() - started)
        assert (method.delivery_tag, method.multiple) == (n + i + 1, False)
    assert sorted(delays)[2] < 0.2, delays
    client.close()
