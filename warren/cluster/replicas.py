"""A cluster member's replicated queues (quorum queues): the ones it leads, whose store is a
ReplicatedQueueStore over the queue's replica log, and the ones it follows, whose log it keeps
as the leader ships it (warren.cluster.replication has the rules, warren.store.replica_log the
log on disk).

Replication uses the node links: a follower asks its leader to `follow` the queue over its
own link to the leader's node (Peer.request), gets the leader's epoch history, cuts its log
where they differ and says it is `ready`; the leader then ships `entries` back over that link
(one frame per queue and tick), and the follower acknowledges what its disk holds
(`replica_ack`, after its group commit). The leader's store is committed as the rules say,
which confirms the publishes waiting for it. A link that ends is followed again when it is up.

Not yet: the queue's record in etcd (its in-sync set and epoch changed by transactions), so
no ISR shrink (a member that stays away holds confirms) and no election (a leader's death
leaves the queue down until it is back): see docs/design-replicated-queues.md."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, cast

from ..broker.errors import not_found
from ..store.replica_log import ReplicaLog
from ..store.replicated import ReplicatedQueueStore
from .remote_queue import RemoteQuorumQueue
from .replication import Follower, Leader, ReplicationError
from .tasks import cancelled

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.metadata.commands import DeclareQueue
    from ..broker.vhost import VHost
    from .node_link import Link, Meta
    from .node_links import NodeLinks

log = logging.getLogger("warren.cluster.replicas")

FIRST_EPOCH = 1
RETRY = 0.5          # seconds between two looks at followers that are not linked
FRAME_ENTRIES = 256  # entries shipped in one frame at most

Key = tuple[str, str]  # (vhost, queue)


class Led:
    """A queue this node leads."""

    def __init__(self, key: Key, log_: ReplicaLog, store: ReplicatedQueueStore, state: Leader):
        self.key = key
        self.log = log_
        self.store = store
        self.state = state
        self.links: dict[str, Link] = {}  # follower node -> the link its entries go on


class Followed:
    """A queue this node keeps a replica of."""

    def __init__(self, key: Key, leader: str, log_: ReplicaLog, state: Follower):
        self.key = key
        self.leader = leader
        self.log = log_
        self.state = state
        self.asking = False  # a follow request is on its way


class Replicas:
    """The service (MetadataStore.replicas; started with the node's other cluster services)."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.links: NodeLinks  # (set once the node links are made, before the services start)
        self.node = broker.config.node_name
        self.led: dict[Key, Led] = {}
        self.followed: dict[Key, Followed] = {}
        self._to_ship: set[Led] = set()
        self._shipping = False
        self._flushing = False
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------- MetadataStore's hooks
    def _log(self, vhost: str, name: str) -> ReplicaLog:
        persister = self.broker.persister
        if persister is None:
            raise not_found("a replicated queue needs a data directory")
        return ReplicaLog(persister, persister.replica_dir(vhost, name))

    def leader_store(self, vhost: VHost, cmd: DeclareQueue) -> ReplicatedQueueStore:
        assert cmd.members is not None
        key = (vhost.name, cmd.name)
        log_ = self._log(*key)
        store = ReplicatedQueueStore.recover(log_, FIRST_EPOCH)
        state = Leader(self.node, cmd.members, cmd.members, FIRST_EPOCH, log_.history, log_.end, log_.end,
                       time.monotonic())
        led = Led(key, log_, store, state)
        log_.on_durable = lambda durable: self._committed(led, led.state.synced(durable))
        log_.on_append = lambda: self._appended(led)
        self.led[key] = led
        return store

    def stand_in(self, vhost: VHost, cmd: DeclareQueue) -> RemoteQuorumQueue:
        assert cmd.members is not None and cmd.node is not None
        queue = RemoteQuorumQueue.stand_in(self.broker, vhost, cmd)
        queue.members = cmd.members
        if self.node in cmd.members:
            key = (vhost.name, cmd.name)
            log_ = self._log(*key)
            state = Follower(log_.history, log_.end, log_.end, FIRST_EPOCH)
            followed = Followed(key, cmd.node, log_, state)
            log_.on_durable = lambda durable: self._acknowledge(followed, durable)
            self.followed[key] = followed
        return queue

    def removed(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        led = self.led.pop(key, None)
        if led is not None:
            self._to_ship.discard(led)  # (its store destroyed its log with the queue)
        followed = self.followed.pop(key, None)
        if followed is not None:
            followed.log.destroy()

    # ---------------------------------------------------------------- service
    async def start(self, server=None) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow_forever())

    async def stop(self) -> None:
        await cancelled(self._task)

    async def _follow_forever(self) -> None:
        while True:
            for followed in list(self.followed.values()):
                if followed.state.leader_epoch is None and not followed.asking:
                    self._follow(followed)
            await asyncio.sleep(RETRY)

    # ---------------------------------------------------------------- a follower's side
    def _follow(self, followed: Followed) -> None:
        peer = self.links.peer(followed.leader)
        if not peer.up:
            return
        followed.asking = True
        vhost, name = followed.key

        def answered(result: Any, error: BaseException | None) -> None:
            followed.asking = False
            if error is not None or self.followed.get(followed.key) is not followed:
                if error is not None:
                    log.debug("following %s on %s: %s", followed.key, followed.leader, error)
                return
            epoch, starts, end = result
            cut = followed.state.synchronise(epoch, [tuple(s) for s in starts], end)
            if cut is None:
                return
            followed.log.truncate(cut)
            if peer.link is not None:
                peer.link.send({"op": "ready", "vhost": vhost, "queue": name, "cut": cut,
                                "durable": followed.log.durable})
        peer.request({"op": "follow", "vhost": vhost, "queue": name}, answered,
                     lambda meta: (int(meta["epoch"]), meta["starts"], int(meta["end"])))

    def entries(self, node: str, meta: Meta, blobs: list[bytes]) -> None:
        """Entries from the leader on `node` (Peer: a frame of the link to it)."""
        followed = self.followed.get((meta["vhost"], meta["queue"]))
        if followed is None or followed.leader != node:
            return
        epochs, kinds = meta["epochs"], meta["kinds"]
        try:
            accepted = followed.state.accept(int(meta["epoch"]), int(meta["first"]), epochs)
        except ReplicationError as err:
            log.warning("replica of %s: %s; following again", followed.key, err)
            followed.state.leader_epoch = None
            return
        if not accepted:
            return
        for epoch, kind, payload in zip(epochs, kinds, blobs):
            followed.log.append(int(epoch), int(kind), payload)
        if not self._flushing:  # (one write and fsync for what this tick brought, every queue's)
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        self.broker.durability.flush()

    def _acknowledge(self, followed: Followed, durable: int) -> None:
        followed.state.synced(durable)
        peer = self.links.peer(followed.leader)
        if followed.state.leader_epoch is not None and peer.link is not None:
            vhost, name = followed.key
            peer.link.send({"op": "replica_ack", "vhost": vhost, "queue": name, "durable": followed.state.durable})

    def peer_lost(self, node: str) -> None:
        """The link to `node` ended: what follows a queue it leads follows again later."""
        for followed in self.followed.values():
            if followed.leader == node:
                followed.state.leader_epoch = None

    # ---------------------------------------------------------------- a leader's side
    def _led(self, meta: Meta) -> Led:
        led = self.led.get((meta["vhost"], meta["queue"]))
        if led is None:
            raise not_found(f"this node does not lead queue '{meta['queue']}' in vhost '{meta['vhost']}'")
        return led

    def follow(self, node: str, link: Link, meta: Meta) -> dict:
        """A follower on `node` links (HomeSession: a request on its link): what it synchronises with."""
        led = self._led(meta)
        epoch, starts, end = led.state.welcome(node)
        led.links[node] = link
        return {"epoch": epoch, "starts": [list(s) for s in starts], "end": end}

    def ready(self, node: str, meta: Meta) -> None:
        led = self._led(meta)
        self._committed(led, led.state.ready(node, int(meta["cut"]), int(meta["durable"]), time.monotonic()))
        self._ship_soon(led)

    def acknowledged(self, node: str, meta: Meta) -> None:
        led = self.led.get((meta["vhost"], meta["queue"]))
        if led is not None:
            self._committed(led, led.state.acknowledged(node, int(meta["durable"]), time.monotonic()))

    def session_lost(self, node: str) -> None:
        """The link a follower on `node` came on ended: its progress goes until it follows again."""
        for led in self.led.values():
            if led.links.get(node) is not None:
                del led.links[node]
                led.state.unlinked(node)

    def _committed(self, led: Led, moved: bool) -> None:
        if moved:
            led.store.commit(led.state.committed)

    def _appended(self, led: Led) -> None:
        led.state.append()  # (the log wrote it in this epoch: the leader's count follows)
        self._ship_soon(led)

    def _ship_soon(self, led: Led) -> None:
        self._to_ship.add(led)
        if not self._shipping:
            self._shipping = True
            asyncio.get_running_loop().call_soon(self._ship)

    def _ship(self) -> None:
        """What each leader appended this tick, to each of its followers: one frame per queue
        (or per FRAME_ENTRIES) and follower."""
        self._shipping = False
        to_ship, self._to_ship = self._to_ship, set()
        for led in to_ship:
            vhost, name = led.key
            for node, link in list(led.links.items()):
                span = led.state.to_send(node)
                if span is None:
                    continue
                for first in range(span[0], span[1], FRAME_ENTRIES):
                    entries = list(led.log.entries(first, min(first + FRAME_ENTRIES, span[1])))
                    link.send({"op": "entries", "vhost": vhost, "queue": name, "epoch": led.state.epoch,
                               "first": first, "epochs": [e.epoch for e in entries],
                               "kinds": [e.kind for e in entries]}, *[e.payload for e in entries])


def replicas_of(broker: Broker) -> Replicas | None:
    """The node's replicated queues (MetadataStore.replicas, as the cluster's layer made it)."""
    return cast("Replicas | None", broker.metadata.replicas)
