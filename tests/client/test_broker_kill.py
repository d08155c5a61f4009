"""The broker is kill -9ed in the middle of a long publish and restarted on the same port and
data directory: the ReliablePublisher reconnects and resends, and every message it confirmed
to its caller (or took into its outbox) is in the queue afterwards, duplicates carrying the
same message_id."""

import asyncio
import signal

import pytest

from tests.client.test_reliable_publisher import declare, take
from warren.client import ReliablePublisher

pytestmark = pytest.mark.timeout(90)

MESSAGES = 2000


async def kill_and_restart(make_broker, own, when):
    """SIGKILL `own` once `await when()` is true, restart it after a moment; return the new
    one."""
    while not await when():
        await asyncio.sleep(0.005)
    own.stop(signal.SIGKILL)
    await asyncio.sleep(0.3)
    return await asyncio.to_thread(make_broker, data_dir=own.data_dir, port=own.port)


def check(got, ids):
    by_id = {}
    for body, message_id in got:
        assert by_id.setdefault(message_id, body) == body, "one id, two bodies"
    missing = set(ids) - set(by_id)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"


@pytest.mark.asyncio
async def test_confirmed_publishes_survive_a_broker_kill(make_broker, uid):
    own = make_broker()
    q = f"bk-{uid}"
    declare(own, q)
    confirmed: list[str] = []
    async with ReliablePublisher(own.url + "?reconnect_interval=0.2", max_in_flight=100,
                                 confirm_timeout=30) as pub:
        async def worker(first):
            for i in range(first, MESSAGES, 10):
                confirmed.append(await pub.publish(b"m%d" % i, routing_key=q,
                                                   message_id=f"m{i}"))

        workers = asyncio.gather(*(worker(k) for k in range(10)))
        async def a_third_confirmed():
            return len(confirmed) >= MESSAGES // 3

        again = await kill_and_restart(make_broker, own, a_third_confirmed)
        assert len(confirmed) < MESSAGES, "the kill came after the last confirm"
        await asyncio.wait_for(workers, 60)
        await pub.flush(timeout=10)
    assert len(confirmed) == MESSAGES
    check(take(again, q), confirmed)


@pytest.mark.asyncio
async def test_outbox_messages_survive_a_broker_kill(make_broker, uid, tmp_path):
    own = make_broker()
    q = f"bk-{uid}"
    declare(own, q)
    async with ReliablePublisher(own.url + "?reconnect_interval=0.2", max_in_flight=100,
                                 outbox=str(tmp_path / "o.db"), confirm_timeout=5,
                                 resend_delay=0.2) as pub:
        ids = await asyncio.gather(*(pub.publish(b"m%d" % i, routing_key=q, message_id=f"m{i}")
                                     for i in range(MESSAGES)))

        async def a_third_confirmed():
            return len(await pub.unconfirmed()) <= MESSAGES * 2 // 3

        # Killed while the outbox is being sent: some confirmed, some in flight, some not sent.
        again = await kill_and_restart(make_broker, own, a_third_confirmed)
        await pub.flush(timeout=60)
        assert await pub.unconfirmed() == []
    check(take(again, q), ids)
