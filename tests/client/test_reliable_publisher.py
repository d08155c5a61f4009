"""warren.client.ReliablePublisher against a real `warren server`: confirms, nacks, returns,
a missing exchange, the SQLite outbox (including recovery after kill -9), the blocking facade
and a broker restart."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pika
import pytest

from tests.conftest import free_port, get_all
from warren.client import (ConfirmTimeout, ExchangeNotFound, Nacked, OutboxLocked,
                           ReliablePublisher, Returned)
from warren.client import blocking
from warren.client.outbox import Outbox

pytestmark = pytest.mark.timeout(60)


def declare(broker, name, **arguments):
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=arguments or None)
    conn.close()


def take(broker, name) -> list:
    """(body, message_id) of every message of queue `name`, which is deleted afterwards."""
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    got = [(body, props.message_id) for _, props, body in get_all(ch, name)]
    ch.queue_delete(name)
    conn.close()
    return got


@pytest.mark.asyncio
async def test_publish_is_confirmed_with_message_id(broker, uid):
    q = f"rp-{uid}"
    declare(broker, q)
    async with ReliablePublisher(broker.url) as pub:
        generated = await pub.publish(b"one", routing_key=q)
        given = await pub.publish(b"two", routing_key=q, message_id="mine-2",
                                  properties={"headers": {"k": 1}, "content_type": "text/plain"})
        await pub.flush()
        assert await pub.unconfirmed() == []
    assert len(generated) == 32 and given == "mine-2"
    assert take(broker, q) == [(b"one", generated), (b"two", "mine-2")]


@pytest.mark.asyncio
async def test_concurrent_publishes_and_flush(broker, uid):
    q = f"rp-{uid}"
    declare(broker, q)
    async with ReliablePublisher(broker.url, max_in_flight=16) as pub:
        tasks = [asyncio.create_task(pub.publish(str(i).encode(), routing_key=q)) for i in range(100)]
        await asyncio.sleep(0)
        await pub.flush(timeout=20)
        assert all(t.done() for t in tasks)
        ids = [t.result() for t in tasks]
    got = take(broker, q)
    assert sorted(b for b, _ in got) == sorted(str(i).encode() for i in range(100))
    assert sorted(m for _, m in got) == sorted(ids) and len(set(ids)) == 100


@pytest.mark.asyncio
async def test_nack_is_retried_then_raised(broker, uid):
    q = f"rp-{uid}"
    declare(broker, q, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    async with ReliablePublisher(broker.url, nack_attempts=3) as pub:
        await pub.publish(b"fits", routing_key=q)
        with pytest.raises(Nacked) as err:
            await pub.publish(b"full", routing_key=q, message_id="full-1")
        assert err.value.message_id == "full-1" and "3 times" in str(err.value)
    assert [b for b, _ in take(broker, q)] == [b"fits"]


@pytest.mark.asyncio
async def test_unroutable_mandatory_raises_returned(broker, uid):
    async with ReliablePublisher(broker.url) as pub:
        with pytest.raises(Returned) as err:
            await pub.publish(b"lost", exchange="amq.direct", routing_key=f"nobody-{uid}")
        assert "NO_ROUTE" in str(err.value)
    async with ReliablePublisher(broker.url, mandatory=False) as pub:
        await pub.publish(b"dropped", exchange="amq.direct", routing_key=f"nobody-{uid}")


@pytest.mark.asyncio
async def test_missing_exchange_raises_and_publisher_keeps_working(broker, uid):
    q = f"rp-{uid}"
    declare(broker, q)
    async with ReliablePublisher(broker.url, confirm_timeout=15) as pub:
        with pytest.raises(ExchangeNotFound) as err:
            await pub.publish(b"x", exchange=f"missing-{uid}", routing_key=q)
        assert f"missing-{uid}" in str(err.value)
        await pub.publish(b"after", routing_key=q)
        # Good messages in flight on the same channel as a bad one are resent, not failed.
        results = await asyncio.gather(
            *(pub.publish(f"g{i}".encode(), routing_key=q) for i in range(20)),
            pub.publish(b"bad", exchange=f"missing-{uid}"),
            *(pub.publish(f"h{i}".encode(), routing_key=q) for i in range(20)),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], ExchangeNotFound), errors
    got = take(broker, q)
    # Confirms lost with the closed channel make resends: duplicates (same message_id),
    # never a loss.
    expected = {b"after"} | {f"g{i}".encode() for i in range(20)} | {f"h{i}".encode() for i in range(20)}
    assert {b for b, _ in got} == expected
    assert len({m for _, m in got}) == len(expected)


@pytest.mark.asyncio
async def test_a_missing_exchange_is_declared_when_told_how(broker, uid, tmp_path):
    q = f"rp-{uid}"
    declare(broker, q)
    exchanges = {f"orders-{uid}": "fanout",
                 f"events-{uid}": {"type": "topic", "durable": False},
                 f"amq.mine-{uid}": "fanout"}  # a reserved name: the broker refuses it
    async with ReliablePublisher(broker.url, exchanges=exchanges, confirm_timeout=15) as pub:
        # The first publish to each finds it missing (404), declares it and sends again:
        # unroutable until bound, which says the exchange is there now.
        with pytest.raises(Returned):
            await pub.publish(b"first", exchange=f"orders-{uid}")
        with pytest.raises(ExchangeNotFound):  # not one we know how to declare
            await pub.publish(b"x", exchange=f"unknown-{uid}")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.exchange_declare(f"orders-{uid}", "fanout", passive=True)
    ch.queue_bind(q, f"orders-{uid}")
    conn.close()
    async with ReliablePublisher(broker.url, exchanges=exchanges, outbox=str(tmp_path / "o.db"),
                                 resend_delay=0.2) as pub:
        await pub.publish(b"second", exchange=f"orders-{uid}")
        await pub.publish(b"event", exchange=f"events-{uid}", routing_key="a.b")
        await pub.flush(timeout=15)
        parked = await pub.unconfirmed()
        # events: declared (topic, transient), then returned unroutable: parked.
        assert [m.body for m in parked] == [b"event"] and "NO_ROUTE" in parked[0].error
        # A declaration the broker refuses parks the message with the reason.
        await pub.publish(b"refused", exchange=f"amq.mine-{uid}")
        await pub.flush(timeout=15)
        refused = [m for m in await pub.unconfirmed() if m.body == b"refused"]
        assert refused and "declaring it failed" in refused[0].error, refused
        assert "ACCESS_REFUSED" in refused[0].error
    # The 404s close the shared channel: "second" may have been resent (a duplicate with the
    # same id), never lost.
    got = take(broker, q)
    assert {b for b, _ in got} == {b"second"} and len({m for _, m in got}) == 1
    with pytest.raises(ValueError):
        ReliablePublisher(broker.url, exchanges={"x": {"kind": "topic"}})


@pytest.mark.asyncio
async def test_outbox_publishes_everything_and_empties(broker, uid, tmp_path):
    q = f"rp-{uid}"
    declare(broker, q)
    path = str(tmp_path / "outbox.db")
    started = time.monotonic()
    async with ReliablePublisher(broker.url, outbox=path) as pub:
        ids = [await pub.publish(f"m{i}".encode(), routing_key=q) for i in range(200)]
        stored = time.monotonic() - started
        await pub.flush(timeout=30)
        assert await pub.unconfirmed() == []
    print(f"200 sequential outbox publishes: {stored:.2f}s stored, "
          f"{time.monotonic() - started:.2f}s confirmed")
    assert stored < 20  # one fsync each: not absurdly slow
    got = take(broker, q)
    assert sorted(got) == sorted((f"m{i}".encode(), ids[i]) for i in range(200))
    outbox = Outbox(path)
    assert outbox.count() == (0, 0)
    outbox.close()


@pytest.mark.asyncio
async def test_outbox_parks_missing_exchange_and_unpark_resends(broker, uid, tmp_path):
    q = f"rp-{uid}"
    declare(broker, q)
    ex = f"later-{uid}"
    async with ReliablePublisher(broker.url, outbox=str(tmp_path / "o.db")) as pub:
        mid = await pub.publish(b"waits", exchange=ex, routing_key=q)
        await pub.publish(b"direct", routing_key=q)
        await pub.flush(timeout=20)
        [parked] = await pub.unconfirmed()
        assert (parked.message_id, parked.body) == (mid, b"waits")
        assert parked.parked and "not found" in parked.error
        assert await pub.unconfirmed(older_than=3600) == []
        conn = pika.BlockingConnection(broker.pika_params())
        ch = conn.channel()
        ch.exchange_declare(ex, "direct")
        ch.queue_bind(q, ex, routing_key=q)
        assert await pub.unpark() == 1
        await pub.flush(timeout=20)
        assert await pub.unconfirmed() == []
        ch.exchange_delete(ex)
        conn.close()
    got = take(broker, q)
    # "direct" may come twice: it goes out on the channel the 404 closes, and aio-pika reopening
    # that channel can race a frame into a connection close (504 "expected 'channel.open'", as
    # RabbitMQ answers), after which the outbox resends it: at least once, its message id kept.
    # (Seen once in CI.) The parked message is sent once, by unpark().
    assert sorted({b for b, _ in got}) == [b"direct", b"waits"]
    assert [b for b, _ in got].count(b"waits") == 1
    assert len({m for b, m in got if b == b"direct"}) == 1


@pytest.mark.asyncio
async def test_outbox_back_pressure_when_broker_unreachable(tmp_path):
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    async with ReliablePublisher(url, outbox=str(tmp_path / "o.db"), outbox_limit=5) as pub:
        for i in range(5):
            await pub.publish(b"%d" % i, routing_key="q")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pub.publish(b"6th", routing_key="q"), 0.5)
        assert len(await pub.unconfirmed()) == 5
        # A second process (or publisher) on the same outbox would send every row twice.
        with pytest.raises(OutboxLocked):
            async with ReliablePublisher(url, outbox=str(tmp_path / "o.db")):
                pass
        with pytest.raises(TypeError):
            await pub.publish(b"x", properties={"no_such_property": 1})


CRASHING_PUBLISHER = textwrap.dedent("""
    import asyncio, sys
    from warren.client import ReliablePublisher

    async def main(url, path, queue, n):
        async with ReliablePublisher(url, outbox=path) as pub:
            for i in range(n):
                await pub.publish(b"crash-%d" % i, routing_key=queue, message_id="id-%d" % i)
            print("stored", flush=True)
            await asyncio.sleep(3600)  # killed here, nothing confirmed

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
""")


@pytest.mark.asyncio
async def test_outbox_recovers_after_kill_9(broker, uid, tmp_path):
    q = f"rp-{uid}"
    declare(broker, q)
    path = str(tmp_path / "crash.db")
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/"  # nothing listens there
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_PUBLISHER, dead, path, q, "50"],
                            stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        assert proc.stdout.readline().strip() == "stored"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = await ReliablePublisher.recover(broker.url, outbox=path)
    assert left == []
    got = take(broker, q)
    assert sorted(got) == sorted((b"crash-%d" % i, "id-%d" % i) for i in range(50))


def test_blocking_facade(broker, uid, tmp_path):
    q = f"rp-{uid}"
    declare(broker, q)
    with blocking.ReliablePublisher(broker.url) as pub:
        mid = pub.publish(b"sync", routing_key=q)
        pub.flush()
        with pytest.raises(blocking.Returned):
            pub.publish(b"lost", exchange="amq.direct", routing_key=f"nobody-{uid}")
    with blocking.ReliablePublisher(broker.url, outbox=str(tmp_path / "b.db")) as pub:
        mid2 = pub.publish(b"via outbox", routing_key=q)
        pub.flush(timeout=20)
        assert pub.unconfirmed() == []
    assert take(broker, q) == [(b"sync", mid), (b"via outbox", mid2)]


@pytest.mark.asyncio
async def test_confirm_timeout_and_resend_across_broker_restart(make_broker, uid):
    own = make_broker()
    q = f"rp-{uid}"
    declare(own, q)
    url = own.url + "?reconnect_interval=0.2"
    async with ReliablePublisher(url, confirm_timeout=20) as pub:
        await pub.publish(b"before", routing_key=q)
        own.stop(signal.SIGKILL)
        # Published while the broker is down: resent once it is back on the same port.
        pending = [asyncio.create_task(pub.publish(b"during-%d" % i, routing_key=q))
                   for i in range(10)]
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in pending)
        assert len(await pub.unconfirmed()) == 10
        again = make_broker(data_dir=own.data_dir, port=own.port)
        await asyncio.wait_for(asyncio.gather(*pending), 20)
    bodies = sorted(b for b, _ in take(again, q))
    # The durable queue kept "before"; a resend may duplicate (same message_id), never lose.
    assert set(bodies) == {b"before"} | {b"during-%d" % i for i in range(10)}
    async with ReliablePublisher(url, confirm_timeout=0.5) as pub:
        again.stop(signal.SIGKILL)
        with pytest.raises(ConfirmTimeout):
            await pub.publish(b"never", routing_key=q)


@pytest.mark.asyncio
async def test_outbox_resends_across_broker_restart(make_broker, uid, tmp_path):
    own = make_broker()
    q = f"rp-{uid}"
    declare(own, q)
    url = own.url + "?reconnect_interval=0.2"
    async with ReliablePublisher(url, outbox=str(tmp_path / "o.db"), confirm_timeout=1,
                                 resend_delay=0.2) as pub:
        await pub.publish(b"before", routing_key=q)
        await pub.flush(timeout=10)
        own.stop(signal.SIGKILL)
        ids = [await pub.publish(b"during-%d" % i, routing_key=q) for i in range(20)]
        await asyncio.sleep(1.5)  # at least one ConfirmTimeout round
        stuck = await pub.unconfirmed()
        assert sorted(m.message_id for m in stuck) == sorted(ids)
        again = make_broker(data_dir=own.data_dir, port=own.port)
        await pub.flush(timeout=20)
        assert await pub.unconfirmed() == []
    got = take(again, q)
    assert {b for b, _ in got} == {b"before"} | {b"during-%d" % i for i in range(20)}
