"""Which member runs a shovel or federation link (warren/cluster/link_owners.py), against a real
etcd: members here are LinkOwners services of their own, each on its own loop task and lease, and
the links are the smallest things that can run (what begin() and pause() did, in order). The
brokers' shovels and links on a real cluster are tests/cluster/test_links.py's."""

from __future__ import annotations

import asyncio
import uuid

from warren.cluster.config import ClusterConfig
from warren.cluster.etcd import Etcd
from warren.cluster.link_owners import LinkOwners
from warren.cluster.tasks import cancelled


class Link:
    def __init__(self, key: str, eligible: bool = True):
        self.link_key = key
        self.may_run = eligible
        self.calls: list[str] = []

    def eligible(self) -> bool:
        return self.may_run

    def begin(self) -> None:
        self.calls.append("begin")

    def pause(self) -> None:
        self.calls.append("pause")

    @property
    def running(self) -> bool:
        return bool(self.calls) and self.calls[-1] == "begin"


def owners(etcd, prefix: str, node: str, ttl: int = 2, linked=lambda node: True) -> LinkOwners:
    config = ClusterConfig(node, tuple(etcd.endpoints), key_prefix=prefix, liveness_ttl=ttl)
    return LinkOwners(config, Etcd(list(config.endpoints)), linked)


async def stopped(*members: LinkOwners) -> None:
    """Stop the services (a clean stop: their leases revoked) and close their clients."""
    for member in members:
        await member.stop()
        await member.etcd.close()


async def until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_one_member_runs_a_link_and_another_takes_it_over_when_its_lease_expires(etcd):
    async def main() -> None:
        prefix = uuid.uuid4().hex
        a, b = owners(etcd, prefix, "a@h"), owners(etcd, prefix, "b@h")
        la, lb = Link("shovel/%2F/s"), Link("shovel/%2F/s")
        a.want(la)
        await a.start()
        await until(lambda: la.running)
        b.want(lb)
        await b.start()
        await asyncio.sleep(1.5)  # (b has read the keys and tried)
        assert (la.calls, lb.calls) == (["begin"], [])
        # a dies: its task ends without revoking, as after kill -9; b claims once the lease is gone.
        await cancelled(a._task)
        started = asyncio.get_running_loop().time()
        await until(lambda: lb.running)
        assert 1.0 < asyncio.get_running_loop().time() - started < 6.0
        await stopped(b)
        await a.etcd.close()
    asyncio.run(main())


def test_a_stopped_member_lets_go_at_once_and_a_dropped_link_runs_nowhere(etcd):
    async def main() -> None:
        prefix = uuid.uuid4().hex
        a, b = owners(etcd, prefix, "a@h", ttl=30), owners(etcd, prefix, "b@h", ttl=30)
        la, lb = Link("x"), Link("x")
        a.want(la)
        await a.start()
        await until(lambda: la.running)
        b.want(lb)
        await b.start()
        await a.stop()  # (a clean stop revokes: no 30 s wait)
        assert la.calls == ["begin", "pause"]
        await until(lambda: lb.running, timeout=5)
        b.drop(lb)
        await until(lambda: not b.owners, timeout=5)  # (its key went)
        assert lb.calls == ["begin"]  # (a dropped link stops itself)
        await stopped(b)
        await a.etcd.close()
    asyncio.run(main())


def test_a_link_runs_only_where_it_is_eligible_and_moves_when_that_changes(etcd):
    """A federated queue's link runs where its queue is served, and moves with it."""
    async def main() -> None:
        prefix = uuid.uuid4().hex
        a, b = owners(etcd, prefix, "a@h", ttl=30), owners(etcd, prefix, "b@h", ttl=30)
        la, lb = Link("q", eligible=False), Link("q", eligible=True)
        a.want(la)
        b.want(lb)
        await a.start()
        await b.start()
        await until(lambda: lb.running)
        assert la.calls == []
        la.may_run, lb.may_run = True, False  # (the queue's leader moved from b to a)
        await until(lambda: la.running and not lb.running, timeout=5)
        assert lb.calls == ["begin", "pause"]
        await stopped(a, b)
    asyncio.run(main())


def test_a_restart_on_the_member_that_runs_it_keeps_it_there(etcd):
    async def main() -> None:
        prefix = uuid.uuid4().hex
        a = owners(etcd, prefix, "a@h", ttl=30)
        old, fresh = Link("r"), Link("r")
        a.want(old)
        await a.start()
        await until(lambda: old.running)
        a.drop(old)   # (Shovel.stop, then the fresh one's start_soon: shovel.restart)
        a.want(fresh)
        assert fresh.calls == ["begin"] and a.runs(fresh)
        await asyncio.sleep(1.5)
        assert a.owners == {"r": "a@h"} and a.runs(fresh)
        await stopped(a)
    asyncio.run(main())


def test_a_holder_whose_node_link_ended_is_taken_over_at_once_and_stops_if_alive(etcd):
    """A killed member's node links end at once: its links move without waiting for its lease;
    were it alive after all, it sees its key taken and stops its own."""
    async def main() -> None:
        prefix = uuid.uuid4().hex
        down: set[str] = set()
        a = owners(etcd, prefix, "a@h", ttl=30)
        b = owners(etcd, prefix, "b@h", ttl=30, linked=lambda node: node not in down)
        la, lb = Link("t"), Link("t")
        a.want(la)
        await a.start()
        await until(lambda: la.running)
        b.want(lb)
        await b.start()
        await asyncio.sleep(1.0)
        assert lb.calls == []
        b.peer_lost("a@h")  # (a link that is back within the grace changes nothing)
        await asyncio.sleep(1.5)
        assert lb.calls == [] and la.running
        down.add("a@h")
        started = asyncio.get_running_loop().time()
        b.peer_lost("a@h")
        await until(lambda: lb.running and not la.running, timeout=5)
        assert asyncio.get_running_loop().time() - started < 2.0
        assert la.calls == ["begin", "pause"]
        await stopped(a, b)
    asyncio.run(main())


def test_a_link_made_again_where_it_may_not_run_is_let_go_at_once(etcd):
    """A federated queue deleted and made again on another member (a vhost deleted and its
    definitions imported again): the old member lets go of its key, the new home claims it."""
    async def main() -> None:
        prefix = uuid.uuid4().hex
        a, b = owners(etcd, prefix, "a@h", ttl=30), owners(etcd, prefix, "b@h", ttl=30)
        old = Link("q")
        a.want(old)
        await a.start()
        await until(lambda: old.running)
        b.want(Link("q", eligible=False))
        await b.start()
        a.drop(old)
        again_a, again_b = Link("q", eligible=False), Link("q")
        a.want(again_a)
        b.want(again_b)
        await until(lambda: again_b.running, timeout=3)
        assert again_a.calls == []
        await stopped(a, b)
    asyncio.run(main())
