"""Bodies of odd sizes around frame_max (frame_max - 8 fills a frame, frame_max - 7 is one
octet over, 0 octets, several frames and one octet) arriving intact through publish,
basic.get, consume and a restart, with pika and with raw frames sent in reads that cut
frames anywhere."""

import base64
import random
import time

import pika
import pytest
import requests
from pamqp import commands

import rawamqp
from conftest import EXTERNAL

FRAME_MAX = 131072
LIMIT = FRAME_MAX - 8  # the payload of a full body frame
SIZES = [0, 1, LIMIT - 1, LIMIT, LIMIT + 1, 2 * LIMIT, 3 * LIMIT + 1, (3 << 20) + 1]
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def body_of(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def bodies() -> list[bytes]:
    return [body_of(size, i) for i, size in enumerate(SIZES)]


def get_all(ch, queue) -> list[bytes]:
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def consume_all(ch, queue, count) -> list[bytes]:
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {count} delivered"
        ch.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == count:
            break
    ch.cancel()
    return got


@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
def test_pika_publish_get_and_consume(broker, uid, frame_max):
    expected = bodies()
    queue = f"big-{uid}"
    with pika.BlockingConnection(broker.pika_params(frame_max=frame_max)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for body in expected:
            ch.basic_publish("", queue, body, PERSISTENT)
        assert get_all(ch, queue) == expected
        for body in expected:
            ch.basic_publish("", queue, body, PERSISTENT)
        assert consume_all(ch, queue, len(expected)) == expected
        ch.queue_delete(queue)


def test_persistent_bodies_survive_a_restart(make_broker, restart_broker, uid):
    b = make_broker()
    expected = bodies()
    queue = f"big-{uid}"
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for body in expected:
            ch.basic_publish("", queue, body, PERSISTENT)
    b = restart_broker(b)
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        assert get_all(ch, queue) == expected


def test_bodies_paged_out_and_read_back(make_broker, uid):
    """More big bodies than the memory window holds (64 MiB), transient and persistent
    alternately: those past the window are read back from the queue's segment files."""
    b = make_broker()
    queue = f"paged-{uid}"
    expected = [body_of((5 << 20) + i, i) for i in range(20)]
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for i, body in enumerate(expected):
            ch.basic_publish("", queue, body, PERSISTENT if i % 2 else None)
        assert consume_all(ch, queue, len(expected)) == expected


def _raw_client(broker) -> rawamqp.RawClient:
    raw = rawamqp.RawClient(broker.host, broker.port, timeout=20)
    raw.handshake()
    raw.open_channel(1)
    return raw


def _send_in_pieces(raw: rawamqp.RawClient, data: bytes, seed: int) -> None:
    """Send `data` in writes of random sizes with pauses, so the broker's reads cut frames at
    random places (the frame head, the payload, the frame end)."""
    rng = random.Random(seed)
    pos = 0
    while pos < len(data):
        n = rng.choice([1, 3, 7, 8, 100, 4096, 65536, 200_000])
        raw.send(data[pos:pos + n])
        pos += n
        if rng.random() < 0.2:
            time.sleep(0.002)


@pytest.mark.parametrize("seed", [1, 2])
def test_raw_frames_cut_anywhere(broker, uid, seed):
    expected = bodies()
    queue = f"raw-{uid}-{seed}"
    with _raw_client(broker) as raw:
        raw.call(1, commands.Queue.Declare(queue=queue))
        stream = b""
        for body in expected:
            raw_frames = pika_frames(queue, body)
            stream += raw_frames
        _send_in_pieces(raw, stream, seed)
        got = []
        for _ in expected:
            raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
            raw.expect(commands.Basic.GetOk, 1, timeout=20)
            _header, body = raw.read_content(timeout=20)
            got.append(body)
        assert [len(b) for b in got] == [len(b) for b in expected]
        assert got == expected
        raw.call(1, commands.Queue.Delete(queue=queue))


def pika_frames(queue: str, body: bytes, frame_size: int = LIMIT) -> bytes:
    """basic.publish to `queue`, its header and body frames of frame_size, as bytes."""
    from pamqp import frame as pframe, header as pheader
    from pamqp.body import ContentBody
    return b"".join([
        pframe.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1),
        pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), 1),
        *(pframe.marshal(ContentBody(body[i:i + frame_size]), 1) for i in range(0, len(body), frame_size)),
    ])


def test_raw_body_in_frames_of_one_octet_and_of_the_maximum(broker, uid):
    queue = f"raw-split-{uid}"
    body = body_of(LIMIT + 1, 5)
    with _raw_client(broker) as raw:
        raw.call(1, commands.Queue.Declare(queue=queue))
        raw.send(pika_frames(queue, body[:300], frame_size=1))
        raw.send(pika_frames(queue, body, frame_size=LIMIT))
        got = []
        for _ in range(2):
            raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
            raw.expect(commands.Basic.GetOk, 1)
            got.append(raw.read_content()[1])
        assert got == [body[:300], body]
        raw.call(1, commands.Queue.Delete(queue=queue))


def test_a_big_persistent_message_is_confirmed_after_its_consumer_vanishes(broker, uid):
    """A 1 MiB persistent message delivered to a consumer whose socket then simply goes (no
    connection.close): requeued, it is confirmed to its publisher promptly (Warren: a record
    held back, written by the requeue, must not wait for some other traffic's flush)."""
    queue = f"vanish-{uid}"
    consumer = rawamqp.connect(broker)
    consumer.call(1, commands.Channel.Open())
    consumer.call(1, commands.Queue.Declare(queue=queue, durable=True))
    consumer.call(1, commands.Basic.Qos(prefetch_count=1))
    consumer.call(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
    publisher = rawamqp.connect(broker)
    publisher.call(1, commands.Channel.Open())
    publisher.call(1, commands.Confirm.Select())
    try:
        publisher.publish(1, "", queue, body_of(1 << 20, 7), properties=commands.Basic.Properties(delivery_mode=2))
        consumer.expect(commands.Basic.Deliver, 1)
        consumer.sock.close()
        assert publisher.expect(commands.Basic.Ack, 1, timeout=5).delivery_tag == 1
        publisher.call(1, commands.Queue.Delete(queue=queue))
    finally:
        publisher.sock.close()


# A body of 256 KiB or more is kept as the parts it arrived in (warren.amqp.body): every way a
# message is handed on carries it whole.
SPLIT_SIZES = [(1 << 20) + 3, 5 * LIMIT + 1]


@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
def test_split_bodies_through_streams_quorum_queues_dead_letters_returns_and_tx(broker, uid, frame_max):
    expected = [body_of(size, i) for i, size in enumerate(SPLIT_SIZES)]
    stream, quorum, work, dlq = (f"split-{kind}-{uid}" for kind in ("stream", "quorum", "work", "dlq"))
    with pika.BlockingConnection(broker.pika_params(frame_max=frame_max)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare(dlq)
        ch.queue_declare(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        for body in expected:
            for queue in (stream, quorum, work):
                ch.basic_publish("", queue, body, PERSISTENT)
        ch.basic_qos(prefetch_count=10)
        got = []
        for method, _props, body in ch.consume(stream, arguments={"x-stream-offset": "first"},
                                                inactivity_timeout=10):
            assert method is not None, f"only {len(got)} read from the stream"
            ch.basic_ack(method.delivery_tag)
            got.append(body)
            if len(got) == len(expected):
                break
        ch.cancel()
        assert got == expected
        assert get_all(ch, quorum) == expected
        for _ in expected:
            method, _props, _body = ch.basic_get(work)
            ch.basic_reject(method.delivery_tag, requeue=False)
        assert get_all(ch, dlq) == expected
        with pytest.raises(pika.exceptions.UnroutableError) as returned:
            ch.basic_publish("", f"nowhere-{uid}", expected[0], mandatory=True)
        assert [m.body for m in returned.value.messages] == expected[:1]
        for queue in (stream, quorum, work, dlq):
            ch.queue_delete(queue)
    with pika.BlockingConnection(broker.pika_params(frame_max=frame_max)) as conn:
        ch = conn.channel()
        ch.queue_declare(work)
        ch.tx_select()
        for body in expected:
            ch.basic_publish("", work, body)
        ch.tx_commit()
        assert get_all(ch, work) == expected
        ch.queue_delete(work)


def test_a_split_body_through_the_management_api_get(broker, uid):
    if EXTERNAL:
        pytest.skip("needs Warren's management API (RabbitMQ's node here runs without it)")
    body = body_of(SPLIT_SIZES[0], 3)
    queue = f"split-http-{uid}"
    with pika.BlockingConnection(broker.pika_params()) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, body)
        r = requests.post(f"{broker.api}/queues/%2F/{queue}/get", auth=("guest", "guest"), timeout=30,
                          json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})
        assert r.status_code == 200, r.text
        [message] = r.json()
        assert (message["payload_bytes"], base64.b64decode(message["payload"])) == (len(body), body)
        ch.queue_delete(queue)
