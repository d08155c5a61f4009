"""warren.client.CountingPublisher (seed 002's scenario 1: the upstream resends) against a
real broker: outcomes reported in number order as contiguous runs, acks, nacks, returns,
a lost channel, timeouts while the broker is down, numbering that goes on across them."""

import asyncio
import signal

import pytest

from tests.client.test_reliable_publisher import declare, take
from warren.client import CountingPublisher, Outcome
from warren.client import blocking

pytestmark = pytest.mark.timeout(60)


class Ledger:
    """What an upstream would be told: one outcome per number, from the reported runs."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, Outcome]] = []

    def __call__(self, first: int, last: int, outcome: Outcome) -> None:
        expected = self.runs[-1][1] + 1 if self.runs else 1
        assert first == expected and last >= first, (first, last, self.runs)
        self.runs.append((first, last, outcome))

    def outcomes(self) -> list[Outcome]:
        return [o for first, last, o in self.runs for _ in range(first, last + 1)]


@pytest.mark.asyncio
async def test_acks_and_nacks_are_reported_in_order(broker, uid):
    q = f"cp-{uid}"
    declare(broker, q, **{"x-max-length": 100, "x-overflow": "reject-publish"})
    ledger = Ledger()
    async with CountingPublisher(broker.url, ledger, max_in_flight=64) as pub:
        numbers = [await pub.send(b"%d" % i, routing_key=q) for i in range(300)]
        await pub.flush(timeout=20)
        assert numbers == list(range(1, 301))
        assert pub.last_sent == pub.last_settled == 300 and pub.unsettled == 0
    assert ledger.outcomes() == [Outcome.ACK] * 100 + [Outcome.NACK] * 200
    assert sorted(int(b) for b, _ in take(broker, q)) == list(range(100))


@pytest.mark.asyncio
async def test_returned_and_lost_then_numbering_goes_on(broker, uid):
    q = f"cp-{uid}"
    declare(broker, q)
    ledger = Ledger()
    async with CountingPublisher(broker.url, ledger, confirm_timeout=10) as pub:
        await pub.send(b"ok", routing_key=q)
        await pub.send(b"unroutable", exchange="amq.direct", routing_key=f"nobody-{uid}")
        await pub.flush(timeout=10)
        # A missing exchange closes the channel (404): that message is lost for the
        # upstream to resend; the channel is reopened for the next ones.
        await pub.send(b"nowhere", exchange=f"missing-{uid}")
        await pub.flush(timeout=10)
        await pub.send(b"after", routing_key=q, properties={"headers": {"k": 1}})
        await pub.flush(timeout=10)
    assert ledger.outcomes() == [Outcome.ACK, Outcome.RETURNED, Outcome.LOST, Outcome.ACK]
    assert sorted(b for b, _ in take(broker, q)) == [b"after", b"ok"]


@pytest.mark.asyncio
async def test_timeouts_while_the_broker_is_down(make_broker, uid):
    own = make_broker()
    q = f"cp-{uid}"
    declare(own, q)
    ledger = Ledger()
    async with CountingPublisher(own.url + "?reconnect_interval=0.2", ledger,
                                 confirm_timeout=1) as pub:
        await pub.send(b"before", routing_key=q)
        await pub.flush(timeout=10)
        own.stop(signal.SIGKILL)
        for i in range(5):
            await pub.send(b"down-%d" % i, routing_key=q)
        await pub.flush(timeout=10)
        assert pub.last_settled == 6
        again = make_broker(data_dir=own.data_dir, port=own.port)
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # the upstream resends until acked
            number = await pub.send(b"after", routing_key=q)
            await pub.flush(timeout=10)
            if ledger.outcomes()[number - 1] is Outcome.ACK:
                break
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.2)
    outcomes = ledger.outcomes()
    assert outcomes[0] is Outcome.ACK and outcomes[-1] is Outcome.ACK
    # Not confirmed while the broker was down: timed out or lost, never acked.
    assert all(o in (Outcome.TIMEOUT, Outcome.LOST) for o in outcomes[1:6]), outcomes
    bodies = [b for b, _ in take(again, q)]
    # A resend the broker had taken before its confirm timed out is a duplicate, as the
    # seed's upstream accepts; "before" survived the restart.
    assert bodies[0] == b"before" and set(bodies) == {b"before", b"after"}


def test_blocking_counting_publisher(broker, uid):
    q = f"cp-{uid}"
    declare(broker, q)
    ledger = Ledger()
    with blocking.CountingPublisher(broker.url, ledger) as pub:
        assert [pub.send(b"%d" % i, routing_key=q) for i in range(10)] == list(range(1, 11))
        pub.flush(timeout=10)
        assert pub.last_sent == pub.last_settled == 10
    assert ledger.outcomes() == [Outcome.ACK] * 10
    assert len(take(broker, q)) == 10
