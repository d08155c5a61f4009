"""Which member runs each shovel and federation link.

RabbitMQ runs a dynamic shovel, and a federated exchange's link to one upstream, on one node of
its cluster (a mirrored_supervisor's child) and starts it on another node when that one goes
down; a federated queue's links run where the queue is. Every Warren member holds every link
(the definitions are everywhere) and runs those whose key it holds in etcd: a key on a lease of
its own, written by the first member to find it absent (a transaction), deleted when the link
goes (LINGER later), and by etcd when the lease expires (the member died, stopped, or was cut off from etcd for
the lease's TTL). Every member watches the keys and claims a link whose key went.

A killed member's node links end at once: its links need not wait for its lease to expire.
Once a member's link to the holder has stayed down LINK_GRACE, it takes the key over in a
transaction on who holds it (RabbitMQ starts a dead node's child as soon as it sees the node
down); a holder that is alive after all (cut off from this member only) sees its key change in
its watch and stops its own.

A member that has not renewed its lease stops its links before the lease can have expired (and
again when etcd says it has), so a link runs on two members at once only for a watch's or a
renewal's round trip: a stopped link gives back what it had not settled, at worst a message
goes twice; none is lost.

A federated queue's link is claimed only where the queue is served (a classic queue's home, a
quorum queue's leader) and let go when it is not any more."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol

from .config import ClusterConfig
from .etcd import Etcd, EtcdError, absent, delete_op, put_op, value_is
from .tasks import cancelled, first_failure

log = logging.getLogger("warren.cluster")

RETRY = 1.0     # seconds between two attempts to reach etcd
RECHECK = 1.0   # seconds between two looks at which links may be claimed here (a queue's leader moves)
MARGIN = 0.5    # seconds before the lease could expire that the links stop, unrenewed
LINK_GRACE = 0.1  # seconds a lost node link to a holder may stay down before its links are taken over
# Seconds a member keeps the key of a link that stopped for good here (its shovel or policy
# went, or a shovel deleted itself) before deleting it: the other members apply that change
# within milliseconds, and a member that has not yet would claim the link and start it again.
LINGER = 2.0


class Link(Protocol):
    """A shovel or a federation link as its owners see it (warren.broker.shovel.Shovel)."""

    @property
    def link_key(self) -> str: ...

    def eligible(self) -> bool:
        """Whether this member may run it (a federated queue's link: where its queue is served)."""

    def begin(self) -> None:
        """Run here now."""

    def pause(self) -> None:
        """Stop running here (another member runs it, or may): what it holds goes back."""


class LinkOwners:
    """A service of a cluster member's server (start/stop), and the broker's `link_owners`."""

    def __init__(self, config: ClusterConfig, etcd: Etcd, linked: Callable[[str], bool] = lambda node: True):
        self.config = config
        self.etcd = etcd
        self.linked = linked  # whether this member's node link to a member is up
        self.prefix = config.keys.root + b"links/"
        self.me = config.node_name
        self.wanted: dict[str, Link] = {}   # every link this member holds, by key
        self.owners: dict[str, str] = {}    # key -> the member holding it, as last read
        self.running: dict[str, Link] = {}  # the links this member runs
        self._leaving: dict[str, float] = {}  # key -> when to let go of a link that went here
        self._unlinked: set[str] = set()  # members whose links to take over (their node link is down)
        self._read = False  # whether `owners` is etcd's, read since the lease was granted
        self._lease = 0
        self._valid_until = 0.0             # loop time before which the lease cannot have expired
        self._expiry: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, server=None) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)
        self._let_go_all()
        await self._revoke()  # (a clean stop: the others take the links over at once)

    # ------------------------------------------------------------------ the broker's side
    def want(self, link: Link) -> None:
        """A link this member holds (new, or restarted here): it runs here once claimed, at
        once if this member runs its key already."""
        key = link.link_key
        self.wanted[key] = link
        if key in self.running and self.running[key] is not link and link.eligible():  # (a restart, here)
            self.running[key] = link
            link.begin()
            return
        self._wake.set()

    def drop(self, link: Link) -> None:
        """The link stopped for good here (its definition went, or it restarts): its key goes
        unless it is wanted again meanwhile."""
        key = link.link_key
        if self.wanted.get(key) is link:
            del self.wanted[key]
        if self.running.get(key) is link:
            self._wake.set()

    def runs(self, link: Link) -> bool:
        return self.running.get(link.link_key) is link

    def peer_lost(self, node: str) -> None:
        """(NodeLinks.on_peer_lost) The node link to `node` ended: its links are taken over
        unless it is back within LINK_GRACE."""
        def unreachable() -> None:
            if not self.linked(node):
                self._unlinked.add(node)
                self._wake.set()
        asyncio.get_running_loop().call_later(LINK_GRACE, unreachable)

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        while True:
            try:
                await self._revoke()  # (the last lease's keys go at once, for any member to claim)
                asked = asyncio.get_running_loop().time()
                self._lease = await self.etcd.grant(self.config.liveness_ttl)
                self._renewed(asked, self.config.liveness_ttl)
                self._read = False  # (what it knew of the keys may be old: nothing is placed until read again)
                # Node links lost under the last lease are no reason to take over now: a member
                # cut off saw them all end, and its links to them may not be up again yet.
                self._unlinked.clear()
                await first_failure(self._renew(), self._follow(), self._place())
            except EtcdError as err:
                log.warning("cluster %s: links: etcd: %s; their keys are claimed again", self.config.cluster_name,
                            err)
            except Exception:
                log.exception("cluster %s: links: placing them failed; trying again", self.config.cluster_name)
            self._let_go_all()
            await asyncio.sleep(RETRY)

    async def _revoke(self) -> None:
        lease, self._lease = self._lease, 0
        if lease:
            try:
                await self.etcd.revoke(lease)
            except EtcdError:
                pass  # (expired already, or etcd out of reach: it expires on its own)

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.liveness_ttl / 3)
            sent = loop.time()
            ttl = await self.etcd.keepalive(self._lease)
            if ttl <= 0:
                raise EtcdError(f"lease {self._lease:x} expired")
            self._renewed(sent, ttl)

    def _renewed(self, sent: float, ttl: float) -> None:
        """The lease lasts `ttl` seconds from `sent` at least: the links stop before that
        unless it is renewed again."""
        self._valid_until = sent + ttl
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = asyncio.get_running_loop().call_at(self._valid_until - MARGIN, self._unrenewed)

    def _unrenewed(self) -> None:
        self._expiry = None
        if self.running:
            log.warning("cluster %s: links: the lease was not renewed in time: this node stops its %d links",
                        self.config.cluster_name, len(self.running))
        self._let_go_all()

    async def _follow(self) -> None:
        revision, kvs = await self.etcd.get(self.prefix, prefix=True)
        self.owners = {kv.key[len(self.prefix):].decode(): kv.value.decode() for kv in kvs}
        for key in [key for key in self.running if self.owners.get(key) != self.me]:
            self.running.pop(key).pause()  # (another member's now)
        self._read = True
        self._wake.set()
        async for revision, events in self.etcd.watch(self.prefix, revision + 1, prefix=True):
            for event in events:
                key = event.kv.key[len(self.prefix):].decode()
                if event.deleted:
                    self.owners.pop(key, None)
                    self._wake.set()
                else:
                    self.owners[key] = event.kv.value.decode()
                if self.owners.get(key) != self.me and key in self.running:
                    self.running.pop(key).pause()  # (taken over, or its lease expired under it)

    async def _place(self) -> None:
        """Claim the links this member may run and nobody holds, let go of those it runs and
        no longer holds or may run: on a change, and every RECHECK seconds."""
        loop = asyncio.get_running_loop()
        while True:
            # (a timer rather than wait_for: Python 3.11's wait_for can swallow the task's cancel)
            recheck = loop.call_later(RECHECK, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                recheck.cancel()
            self._wake.clear()
            now = loop.time()
            if now >= self._valid_until - MARGIN or not self._read:
                continue  # (unrenewed, or the keys not read yet: claim nothing)
            for key, link in list(self.running.items()):
                wanted = self.wanted.get(key) is link
                if wanted and link.eligible():
                    continue
                del self.running[key]
                if wanted:  # (it may run elsewhere now)
                    link.pause()
                    await self._release(key)
                else:  # (stopped for good: its key stays while the other members apply that too)
                    self._leaving[key] = now + LINGER
            for key, until in list(self._leaving.items()):
                if key in self.wanted or now >= until:
                    del self._leaving[key]
                    if key not in self.wanted:
                        await self._release(key)
            unlinked, self._unlinked = self._unlinked, set()
            for key, link in list(self.wanted.items()):
                if key in self.running:
                    continue
                owner, eligible = self.owners.get(key), link.eligible()
                if owner == self.me:  # (still this member's: stopped unrenewed, or made again)
                    if eligible:
                        self._begin(key, link)
                    else:  # (a queue made again elsewhere: its home runs its link)
                        await self._release(key)
                elif not eligible:
                    continue
                elif owner is None:
                    await self._claim(key, link)
                elif owner in unlinked and not self.linked(owner):
                    await self._claim(key, link, owner)

    async def _claim(self, key: str, link: Link, holder: str | None = None) -> None:
        """Claim a link nobody holds, or that `holder` holds (taken over)."""
        etcd_key = self.prefix + key.encode()
        held = absent(etcd_key) if holder is None else value_is(etcd_key, holder.encode())
        result = await self.etcd.txn([held], [put_op(etcd_key, self.me.encode(), self._lease)])
        if not result.succeeded:
            return  # (another member's: the watch tells whose)
        self.owners[key] = self.me
        if self.wanted.get(key) is link and link.eligible() and asyncio.get_running_loop().time() < self._valid_until:
            self._begin(key, link)
        else:
            await self._release(key)

    def _begin(self, key: str, link: Link) -> None:
        self.running[key] = link
        log.info("cluster %s: links: %s runs on this node", self.config.cluster_name, key)
        link.begin()

    async def _release(self, key: str) -> None:
        """Delete the key if this member holds it."""
        etcd_key = self.prefix + key.encode()
        await self.etcd.txn([value_is(etcd_key, self.me.encode())], [delete_op(etcd_key)])

    def _let_go_all(self) -> None:
        """Stop every link running here (the lease may be gone): the loop claims them again."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._valid_until = 0.0
        running, self.running = self.running, {}
        for link in running.values():
            link.pause()

