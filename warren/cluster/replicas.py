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

Each queue's leader, epoch and in-sync set (ISR) live in etcd, in the queue's record, changed
only by transactions guarded by the record's revision (the rules' fencing): its first leader
and epoch are the declare's and need no record. When a leader stops running, the first running
ISR member by name elects itself (epoch + 1, the old leader out of the ISR); a leader drops a
follower that lagged MAX_LAG seconds from the ISR, and takes it back once it holds everything
committed. Every node watches the records: the new leader takes the queue's place in its tables
(its store rebuilt from its log), the old one (if it runs) gives it up for a stand-in and
follows, and the other nodes' stand-ins point at the new leader.

Consumers survive a leader: what each is handed is in the log with its holder key
(warren.store.replicated), a new leader keeps what consumers of running nodes held for them
(PARK_GRACE at most), and their nodes re-attach them to it (RemoteQuorumQueue.resume, adopt)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

from ..broker.errors import internal_error, not_found
from ..broker.queues import TYPES
from ..broker.queues.quorum import QuorumQueue
from .etcd import EtcdError, absent, mod_revision_is, put_op
from ..store.replica_log import ReplicaLog
from ..store.replicated import NOOP, ReplicatedQueueStore
from ..store.replicated_stream import ChunkIndex, ReplicatedStream
from .remote_queue import RemoteQueue, RemoteQuorumQueue
from .stream_replica import RemoteStreamQueue, ReplicatedStreamQueue
from .replication import Follower, Leader, ReplicationError
from .tasks import cancelled

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.metadata.commands import DeclareQueue
    from ..broker.queues.base import Queue
    from ..broker.vhost import VHost
    from .config import ClusterConfig
    from .etcd import Etcd
    from .membership import Membership
    from .node_link import Link, Meta

log = logging.getLogger("warren.cluster.replicas")

FIRST_EPOCH = 1
RETRY = 0.5          # seconds between two looks at followers that are not linked
FRAME_ENTRIES = 256  # entries shipped in one frame at most
MAX_LAG = 10.0       # seconds a follower may stay behind before it leaves the ISR
LINK_GRACE = 0.1     # seconds a leader's lost link may stay down before its followers elect (a killed node's ends at once)
FOLLOW_AGAIN = 0.05  # seconds before a follower refused by its leader asks again (a leader not leading yet, or unproven)
PARK_GRACE = 10.0    # seconds a new leader keeps what consumers of running nodes held for them
MACHINE_VERSION = 2  # (quorum_status's column: RabbitMQ 3.10's rabbit_fifo version)
CHANGE_ATTEMPTS = 20  # transactions a change of a record's members tries before it gives up
# A replica log's segment size (whole segments are released); smaller in tests.
SEGMENT_SIZE = int(os.environ.get("WARREN_REPLICA_SEGMENT_BYTES", 64 << 20))

Key = tuple[str, str]  # (vhost, queue)


@dataclass(frozen=True)
class Record:
    """A replicated queue's record in etcd; `revision` 0: none written yet (the declare's)."""

    members: tuple[str, ...]
    leader: str
    epoch: int
    isr: tuple[str, ...]
    revision: int = 0

    def value(self) -> bytes:
        return json.dumps({"members": list(self.members), "leader": self.leader, "epoch": self.epoch,
                           "isr": list(self.isr)}).encode()


class Led:
    """A queue this node leads."""

    def __init__(self, key: Key, log_: ReplicaLog, store: ReplicatedQueueStore | ReplicatedStream, state: Leader):
        self.key = key
        self.log = log_
        self.store = store
        self.state = state
        self.links: dict[str, Link] = {}  # follower node -> the link its entries go on
        self.released = 0  # the release cursor last applied
        self.told: dict[str, int] = {}  # a stream's: the commit point each follower was last sent
        self.segments = len(log_.segments)  # (a new one: retention is applied)
        # A quorum queue's leader before it is proven (warren.cluster.replication): the
        # followers' follow requests it answers once it is, by node (their link, request id).
        self.waiting: dict[str, tuple[Link, int]] = {}
        self.hand_to: str | None = None  # a more up-to-date member it hands the queue over to


class Followed:
    """A queue this node keeps a replica of."""

    def __init__(self, key: Key, leader: str, log_: ReplicaLog, state: Follower):
        self.key = key
        self.leader = leader
        self.log = log_
        self.state = state
        self.asking: object | None = None  # the follow request on its way (an answer to another is stale)
        self.refused = 0  # follow requests refused in a row (the first is asked again soon, the rest at RETRY)
        self.stream: ReplicatedStream | None = None  # a stream's replica, read here


class Links(Protocol):
    """What the replicated queues use of the node links (warren.cluster.node_links.NodeLinks)."""

    config: ClusterConfig
    etcd: Etcd
    membership: Membership

    def peer(self, node: str) -> Any: ...


class Replicas:
    """The service (MetadataStore.replicas; started with the node's other cluster services)."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.links: Links  # (warren.cluster.node_links.NodeLinks, set before the services start)
        self.node = broker.config.node_name
        self.led: dict[Key, Led] = {}
        self.followed: dict[Key, Followed] = {}
        self.records: dict[Key, Record] = {}  # as etcd has them (or the declare's)
        self.incarnations: dict[str, Key] = {}  # a record's name in etcd -> its queue
        self._to_ship: set[Led] = set()
        self._shipping = False
        self._flushing = False
        self._electing: set[Key] = set()  # records being written by this node's elections
        self._records_read = False  # the records as etcd had them at the start
        # Queues this node leads, or a record read at the start names it leader of, since it
        # (re)started: it leads in an epoch of its own first (its old one may hold entries its
        # followers have and it lost), asked for until the write succeeds.
        self._to_renew: set[Key] = set()
        self._tasks: list[asyncio.Task] = []
        self.started = False  # (a declare before the start is the recovery's: a restart)

    # ---------------------------------------------------------------- MetadataStore's hooks
    def _log(self, vhost: str, name: str, scanned: Callable[[int, bytes], None] | None = None) -> ReplicaLog:
        persister = self.broker.persister
        if persister is None:
            raise not_found("a replicated queue needs a data directory")
        return ReplicaLog(persister, persister.replica_dir(vhost, name), SEGMENT_SIZE, scanned)

    def replica(self, vhost: VHost, cmd: DeclareQueue) -> tuple[ReplicatedQueueStore | ReplicatedStream, type | None] | None:
        """This node's own copy of a new replicated queue: its store and, if not its type's,
        its class (a stream's replica); None when this node keeps a stand-in (stand_in)."""
        assert cmd.members is not None
        if _is_stream(cmd):
            return (self.stream_store(vhost, cmd), ReplicatedStreamQueue) if self.node in cmd.members else None
        return (self.leader_store(vhost, cmd), None) if cmd.node == self.node else None

    def stream_store(self, vhost: VHost, cmd: DeclareQueue) -> ReplicatedStream:
        """A stream's replica on this member: led from here, or following its leader."""
        assert cmd.members is not None and cmd.node is not None
        key = (vhost.name, cmd.name)
        chunks = ChunkIndex()
        log_ = self._log(*key, chunks.scanned)
        epoch = max(FIRST_EPOCH, log_.history.last_epoch)
        stream = ReplicatedStream(log_, epoch, chunks)
        stream.leader = cmd.node
        self._declared(key, cmd)
        if cmd.node == self.node:
            stream.lead(epoch)
            self._lead(key, log_, stream, self._leader_state(replace(self.records[key], epoch=epoch), log_))
        else:
            self._follow_log(key, cmd.node, log_, FIRST_EPOCH).stream = stream
        return stream

    def leader_store(self, vhost: VHost, cmd: DeclareQueue) -> ReplicatedQueueStore:
        assert cmd.members is not None
        key = (vhost.name, cmd.name)
        log_ = self._log(*key)
        # (A restarted node's log may hold later epochs than the declare's: the record, read at
        # start, says which it leads in, if any.)
        epoch = max(FIRST_EPOCH, log_.history.last_epoch)
        store = ReplicatedQueueStore.recover(log_, epoch)
        self._declared(key, cmd)
        state = self._leader_state(replace(self.records[key], epoch=epoch), log_, majority=True)
        led = self._lead(key, log_, store, state)
        if self.started and log_.end == 0 and not log_.history.starts:
            state.prove()  # (a new queue: no member's log holds anything)
        else:  # (restarted: its followers may hold entries of its epoch it lost, so it leads in a new one)
            self._to_renew.add(key)
            store.held = []
        return store

    def _leader_state(self, record: Record, log_: ReplicaLog, majority: bool = False) -> Leader:
        """This node's bookkeeping as the leader the record names, over its log as it is
        (`majority`: a quorum queue's, under Raft's rules, unproven)."""
        return Leader(self.node, record.members, record.isr, record.epoch, log_.history, log_.end, log_.durable,
                      time.monotonic(), majority)

    def _declared(self, key: Key, cmd: DeclareQueue) -> None:
        """The queue's record as its declare makes it (etcd's, read at start or watched, wins)."""
        assert cmd.members is not None and cmd.node is not None
        self.records[key] = Record(cmd.members, cmd.node, FIRST_EPOCH, cmd.members)
        self.incarnations[cmd.incarnation or f"{key[0]}/{key[1]}"] = key

    def _lead(self, key: Key, log_: ReplicaLog, store: ReplicatedQueueStore | ReplicatedStream, state: Leader) -> Led:
        led = Led(key, log_, store, state)
        log_.on_durable = lambda durable: self._committed(led, led.state.synced(durable))
        log_.on_append = lambda: self._appended(led)
        log_.shipping = True
        self.led[key] = led
        if isinstance(store, ReplicatedStream):  # (readers wait for nothing its disk and majority hold)
            self._committed(led, state.synced(log_.durable))
            store.on_retention = lambda: self._release(led) if self.led.get(led.key) is led else None
        return led

    def stand_in(self, vhost: VHost, cmd: DeclareQueue) -> RemoteQueue:
        """The stand-in of a quorum queue another node leads (this node may follow it), or of a
        stream this node holds no replica of."""
        assert cmd.members is not None and cmd.node is not None
        queue = (RemoteStreamQueue if _is_stream(cmd) else RemoteQuorumQueue).stand_in(self.broker, vhost, cmd)
        queue.members = cmd.members
        key = (vhost.name, cmd.name)
        queue.incarnation = cmd.incarnation
        self._declared(key, cmd)
        if self.node in cmd.members:
            log_ = self._log(*key)
            self._follow_log(key, cmd.node, log_, FIRST_EPOCH)
        return queue

    def _follow_log(self, key: Key, leader: str, log_: ReplicaLog, epoch: int) -> Followed:
        state = Follower(log_.history, log_.end, log_.durable, max(epoch, log_.history.last_epoch))
        followed = Followed(key, leader, log_, state)
        log_.on_durable = lambda durable: self._acknowledge(followed, durable)
        log_.on_append = None
        log_.shipping = False
        log_.shipped(log_.end)
        self.followed[key] = followed
        return followed

    def removed(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        led = self.led.pop(key, None)
        if led is not None:
            self._to_ship.discard(led)  # (its store destroyed its log with the queue)
        followed = self.followed.pop(key, None)
        if followed is not None:
            followed.log.destroy()
        self.records.pop(key, None)
        for incarnation, known in list(self.incarnations.items()):
            if known == key:
                del self.incarnations[incarnation]

    # ---------------------------------------------------------------- service
    async def start(self, server=None) -> None:
        """The records first (a node that led a queue before it stopped may lead it no more),
        for a few seconds at most (etcd may be down: the watch applies them later)."""
        loop = asyncio.get_running_loop()
        self.links.membership.on_stopped.append(self._stopped)
        read = loop.create_future()
        self.started = True
        self._tasks = [loop.create_task(self._follow_forever()), loop.create_task(self._watch_records(read))]
        try:
            await asyncio.wait_for(asyncio.shield(read), 5)
        except asyncio.TimeoutError:
            log.error("replicated queues: their records could not be read from etcd yet")

    async def stop(self) -> None:
        await cancelled(*self._tasks)

    async def _follow_forever(self) -> None:
        while True:
            try:
                await self._look_around()
            except Exception:  # (a bug must not end the loop every replicated queue needs)
                log.exception("replicated queues: looking at followers and leaders failed")
            await asyncio.sleep(RETRY)

    async def _look_around(self) -> None:
        if not self._records_read:
            return  # (a restarted follower knows no epoch newer than its log's: it would follow an old leader)
        membership = self.links.membership
        if membership.synced.is_set() and self.node in membership.running:  # (a view of etcd's, read whole)
            for node in {r.leader for r in self.records.values()} - set(membership.running) - {self.node}:
                self._elect_for(node)  # (again: an election that failed, or a hand-over to a node that died)
        for key in list(self._to_renew):  # (not asked yet, or its write failed: again, from the record as it is now)
            self._renew(key)
        for followed in list(self.followed.values()):
            if followed.state.leader_epoch is None and followed.asking is None:
                self._follow(followed)
        self._resume_orphans()
        now = time.monotonic()
        for led in list(self.led.values()):
            record = self.records.get(led.key)
            if (record is not None and record.leader == self.node and led.key not in self._electing
                    and led.hand_to is not None and record.epoch == led.state.epoch):  # (its first try failed)
                self._elect(led.key, replace(record, leader=led.hand_to, epoch=record.epoch + 1,
                                             isr=_with(record.isr, led.hand_to)))
            if isinstance(led.store, ReplicatedQueueStore):  # (a stream's retention applies at a new segment)
                self._release(led)
            lagging = led.state.lagging(now, MAX_LAG)
            if lagging:
                await self._change_isr(led, tuple(n for n in led.state.isr if n not in lagging), lagging)
            for node in led.state.catching_up():
                led.state.grow(node)
                await self._change_isr(led, tuple(sorted(led.state.isr)), set())

    def _resume_orphans(self) -> None:
        """Consumers, settlements and publishes of stand-ins that wait for their queue's
        leader: to it, once the link to it is up."""
        for vhost_name, name in list(self.records):
            vhost = self.broker.vhosts.get(vhost_name)
            queue = None if vhost is None else vhost.queues.get(name)
            if isinstance(queue, RemoteQuorumQueue) and (queue.orphans or queue.pending or queue.publisher.resend_due
                                                         or queue.waiting_calls):
                queue.resume()
            elif isinstance(queue, QuorumQueue) and queue.publisher is not None and queue.publisher.resend_due:
                queue.publisher.resend()  # (one its log would have taken out of order: sent again)

    def _release(self, led: Led) -> None:
        """Whole segments below the release cursor (and, for a quorum queue, the committed
        offset: a stream's retention is by size and age alone) go, here and at the followers."""
        cursor = led.store.release_cursor()
        if isinstance(led.store, ReplicatedQueueStore):
            cursor = min(cursor, led.state.committed)
        if cursor <= led.released:
            return
        led.released = cursor
        led.log.drop_before(cursor)
        if isinstance(led.store, ReplicatedStream):
            led.store.released()
        vhost, name = led.key
        for node, link in list(led.links.items()):
            progress = led.state.followers.get(node)
            if progress is not None and progress.sent < led.log.first:
                led.state.unlinked(node)  # (behind what is released: it follows again, from the first entry)
            link.send({"op": "release", "vhost": vhost, "queue": name, "cursor": cursor, "first": led.log.first})

    def release(self, node: str, meta: Meta) -> None:
        """The leader on `node` released its log below a cursor, and its log starts at `first`
        (Peer: a frame of its link)."""
        followed = self.followed.get((meta["vhost"], meta["queue"]))
        if followed is not None and followed.leader == node:
            cursor = int(meta["cursor"])
            # Behind what the leader holds: follow again, to start where its log does. (Behind
            # the cursor only, it catches up as it is: a follower back from a restart under a
            # consumer that keeps the queue short is always behind the cursor for a while.)
            if followed.log.end < int(meta.get("first", cursor)):
                followed.state.leader_epoch = None
            followed.log.drop_before(min(cursor, followed.log.durable))
            if followed.stream is not None:
                followed.stream.released()

    # ---------------------------------------------------------------- records, elections
    def _record_key(self, key: Key) -> bytes:
        """A record is named by its queue's incarnation: a queue deleted and declared again
        never reads the record of the one before."""
        incarnation = next((i for i, known in self.incarnations.items() if known == key), "")
        return self.links.config.keys.root + b"queues/" + urllib.parse.quote(incarnation, safe="").encode()

    def _key_of(self, record_key: bytes) -> Key | None:
        prefix = self.links.config.keys.root + b"queues/"
        return self.incarnations.get(urllib.parse.unquote(record_key[len(prefix):].decode(errors="replace")))

    async def _write(self, key: Key, record: Record) -> int:
        """The guarded transaction: the revision at which `record` is now etcd's (the watch
        applies it), 0 if it is not. It is guarded by the revision of the record it was made
        from (`record.revision`), not by the one this node knows when the write goes: an
        election decided on a record that a newer one (another node's election) replaced
        meanwhile must fail, or two nodes would lead in one epoch."""
        if key not in self.records:
            return 0
        etcd_key = self._record_key(key)
        guard = absent(etcd_key) if record.revision == 0 else mod_revision_is(etcd_key, record.revision)
        try:
            result = await self.links.etcd.txn([guard], [put_op(etcd_key, record.value())])
        except EtcdError as err:
            log.warning("%s: the queue's record could not be written: %s", key, err)
            return 0
        return result.revision if result.succeeded else 0

    def _elect(self, key: Key, record: Record) -> None:
        """Write a new leader's record (an election, a hand-over, a restarted leader's new
        epoch) and apply it here at once, without waiting for the watch."""
        async def elect() -> None:
            try:
                revision = await self._write(key, record)
            finally:
                self._electing.discard(key)
            if revision and key in self.records:
                self._record_read(self._record_key(key), record.value(), revision)
        self._electing.add(key)
        asyncio.get_running_loop().create_task(elect())

    async def _change_isr(self, led: Led, isr: tuple[str, ...], dropped: set[str]) -> None:
        record = self.records.get(led.key)
        if record is None or record.leader != self.node or record.epoch != led.state.epoch:
            return
        if await self._write(led.key, replace(record, isr=isr)):
            if dropped and led.state.shrunk(dropped):
                self._committed(led, True)
            if dropped:
                log.warning("%s: %s left the in-sync replicas (behind for %.0f s)", led.key, sorted(dropped), MAX_LAG)
        else:
            for node in set(isr) - set(record.isr):
                self._committed(led, led.state.grow_failed(node))

    def _stopped(self, node: str) -> None:
        """A member stopped running (or its link stayed down: _unreachable): the queues it led
        elect a new leader, the first running in-sync member by name (this node, if so), and
        what its consumers held of queues this node took over goes back."""
        for led in list(self.led.values()):
            store = led.store
            if isinstance(store, ReplicatedQueueStore) and any(h.partition("/")[0] == node for h in store.parked):
                self._give_up(led.key, store, node)
        self._elect_for(node)

    def _renew(self, key: Key) -> None:
        """A new epoch for this node, the record's leader (guarded by the record it knows:
        etcd's, once read, wins); nothing to ask for once another node leads."""
        record = self.records.get(key)
        replica = self.led.get(key) or self.followed.get(key)
        if record is None or record.leader != self.node or replica is None:
            self._to_renew.discard(key)
        elif key not in self._electing:
            epoch = max(record.epoch, replica.log.history.last_epoch) + 1
            self._elect(key, replace(record, epoch=epoch, isr=_with(record.isr, self.node)))

    def _elect_for(self, node: str) -> None:
        """The queues `node` leads, which stopped running: this node elects itself for those
        whose first running candidate by name it is."""
        running = self.links.membership.running
        for key, record in list(self.records.items()):
            followed = self.followed.get(key)
            if record.leader != node or followed is None or key in self._electing:
                continue
            # (A quorum queue's candidate is any running member: it proves itself, or hands the
            # queue over to a more up-to-date one. A stream's holds everything committed.)
            quorum = followed.stream is None
            candidates = sorted(n for n in (record.members if quorum else record.isr)
                                if n != node and (n in running or n == self.node))
            if candidates and candidates[0] == self.node:
                self._elect(key, replace(record, leader=self.node, epoch=record.epoch + 1,
                                         isr=_with(tuple(n for n in record.isr if n != node), self.node)))

    async def _watch_records(self, read: asyncio.Future) -> None:
        prefix = self.links.config.keys.root + b"queues/"
        while True:
            try:
                revision, kvs = await self.links.etcd.get(prefix, prefix=True)
                for kv in kvs:
                    self._record_read(kv.key, kv.value, kv.mod_revision, fresh=False)
                self._records_read = True
                if not read.done():
                    read.set_result(None)
                async for _, events in self.links.etcd.watch(prefix, revision + 1, prefix=True):
                    for event in events:
                        if not event.deleted:
                            self._record_read(event.kv.key, event.kv.value, event.kv.mod_revision)
            except EtcdError as err:
                log.warning("replicated queues: following their records: %s", err)
                await asyncio.sleep(RETRY)
            except Exception:  # (read again from the start: a bug must not stop every election)
                log.exception("replicated queues: following their records failed")
                await asyncio.sleep(RETRY)

    def _record_read(self, etcd_key: bytes, value: bytes, revision: int, fresh: bool = True) -> None:
        """`fresh`: a change seen as it was made (watched, or written here), not read at the
        start (or after etcd was lost), when it may name an epoch this node led before it
        restarted."""
        key = self._key_of(etcd_key)
        if key is None or key not in self.records:
            return  # (a queue this node does not have: deleted, or not declared here yet)
        record = self._parsed(value, revision)
        if record is None:
            log.error("%s: the queue's record cannot be read: %r", key, value[:200])
            return
        before = self.records[key]
        if record.revision <= before.revision:
            return
        self.records[key] = record
        if record.leader != before.leader or record.epoch != before.epoch:
            self._leader_changed(key, record, before.leader, fresh)
        if record.members != before.members:
            self._members_changed(key, record)

    def _members_changed(self, key: Key, record: Record) -> None:
        """add_member, delete_member (warren.cluster.queue_members): a node added follows the
        queue (its log made), one removed stops and deletes its log; the leader counts its
        majority over the new members."""
        vhost = self.broker.vhosts.get(key[0])
        queue = None if vhost is None else vhost.queues.get(key[1])
        if queue is not None:
            queue.members = record.members
        led = self.led.get(key)
        if led is not None and record.leader == self.node:
            for node in set(led.links) - set(record.members):
                del led.links[node]
            self._committed(led, led.state.members_changed(record.members, record.isr))
            self._decide_alone(led)
            log.info("%s: members now %s", key, list(record.members))
        followed = self.followed.get(key)
        if isinstance(queue, (ReplicatedStreamQueue, RemoteStreamQueue)):
            self._stream_members_changed(key, record, queue)
        elif self.node not in record.members and followed is not None:
            del self.followed[key]
            followed.log.destroy()
            log.info("%s: no longer a member here; its replica is deleted", key)
        elif self.node in record.members and led is None and followed is None:
            self._follow_log(key, record.leader, self._log(*key), record.epoch)
            log.info("%s: a member here now; following %s", key, record.leader)

    def _stream_members_changed(self, key: Key, record: Record, queue: Queue) -> None:
        """add_replica, delete_replica (rabbitmq-streams): a node added makes a replica of its
        own, which follows the leader from the start of the leader's log, and the stream is a
        ReplicatedStreamQueue here from now on; a node removed (never its leader: the leader
        moved first) gives it up for a stand-in, its readers cancelled, and deletes it."""
        vhost_name, name = key
        vhost = cast("VHost", queue.vhost)
        if self.node not in record.members and isinstance(queue, ReplicatedStreamQueue) and key not in self.led:
            self.followed.pop(key, None)
            stand_in = RemoteStreamQueue(vhost, name, queue.durable, None, False, queue.arguments, record.leader,
                                         self.broker)
            stand_in.members, stand_in.incarnation = record.members, queue.incarnation
            self.broker.metadata.replace_queue(vhost_name, name, stand_in)
            queue.replica.destroy()
            log.info("%s: no longer a member here; its replica is deleted", key)
        elif self.node in record.members and isinstance(queue, RemoteStreamQueue):
            chunks = ChunkIndex()
            log_ = self._log(*key, chunks.scanned)
            stream = ReplicatedStream(log_, max(FIRST_EPOCH, log_.history.last_epoch), chunks)
            stream.leader = record.leader
            self._follow_log(key, record.leader, log_, record.epoch).stream = stream
            replica = ReplicatedStreamQueue(vhost, name, queue.durable, None, False, queue.arguments, stream)
            replica.members, replica.incarnation = record.members, queue.incarnation
            self.broker.metadata.replace_queue(vhost_name, name, replica)
            log.info("%s: a replica here now; following %s", key, record.leader)

    async def change_members(self, key: Key, change: Callable[[Record], Record | None]) -> Record | None:
        """Rewrite a queue's record as `change` says (None: nothing to change), from etcd's
        newest, again if another transaction came first. The record written, or None."""
        for _ in range(CHANGE_ATTEMPTS):
            declared = self.records.get(key)
            if declared is None:
                raise not_found(f"no replicated queue '{key[1]}' in vhost '{key[0]}'")
            etcd_key = self._record_key(key)
            try:
                _, kvs = await self.links.etcd.get(etcd_key)
            except EtcdError as err:
                raise internal_error(f"the queue's record could not be read from etcd: {err}") from None
            current = declared if not kvs else self._parsed(kvs[0].value, kvs[0].mod_revision)
            if current is None:
                raise internal_error(f"the record of queue '{key[1]}' in vhost '{key[0]}' cannot be read")
            changed = change(current)
            if changed is None:
                return None
            guard = absent(etcd_key) if not kvs else mod_revision_is(etcd_key, current.revision)
            try:
                result = await self.links.etcd.txn([guard], [put_op(etcd_key, changed.value())])
            except EtcdError as err:
                raise internal_error(f"the queue's record could not be written to etcd: {err}") from None
            if result.succeeded:
                self._record_read(etcd_key, changed.value(), result.revision)  # (before the watch: answered as done)
                return changed
            await asyncio.sleep(0.05)
        raise internal_error(f"the record of queue '{key[1]}' in vhost '{key[0]}' kept changing: try again")

    @staticmethod
    def _parsed(value: bytes, revision: int) -> Record | None:
        try:
            data = json.loads(value)
            return Record(tuple(data["members"]), str(data["leader"]), int(data["epoch"]), tuple(data["isr"]),
                          revision)
        except (ValueError, KeyError, TypeError):
            return None

    def _leader_changed(self, key: Key, record: Record, lost: str, fresh: bool = True) -> None:
        vhost_name, name = key
        vhost = self.broker.vhosts.get(vhost_name)
        queue = None if vhost is None else vhost.queues.get(name)
        if vhost is None or queue is None:
            return
        led = self.led.get(key)
        followed = self.followed.get(key)
        if isinstance(queue, ReplicatedStreamQueue):
            self._stream_leader_changed(key, record, led, followed)
            return
        if record.leader == self.node and not fresh and (led is not None or followed is not None):
            # (This node may have led in that epoch before it restarted and lost entries its
            # followers hold: it leads in a new one, proven, or not at all.)
            self._to_renew.add(key)
            self._renew(key)
            return
        if record.leader == self.node:
            self._to_renew.discard(key)
        if record.leader == self.node and led is not None:  # leading still, in a new epoch: it proves itself
            led.hand_to = None
            self._refuse_waiting(led)
            led.state = self._leader_state(record, led.log, majority=True)
            cast(ReplicatedQueueStore, led.store).lead(record.epoch)
            self._decide_alone(led)
            return
        if record.leader == self.node and followed is not None:  # elected: the queue is here now
            del self.followed[key]
            log_ = followed.log
            running = self.links.membership.running
            store = ReplicatedQueueStore.recover(
                log_, record.epoch, lambda holder: (node := holder.partition("/")[0]) != lost and node in running)
            state = self._leader_state(record, log_, majority=True)
            led = self._lead(key, log_, store, state)
            leader_queue = cast(QuorumQueue, TYPES["quorum"](vhost, name, queue.durable, None, False, queue.arguments,
                                                             store))
            leader_queue.members, leader_queue.incarnation = record.members, queue.incarnation
            leader_queue.unacked_count = sum(map(len, store.parked.values()))  # (held by consumers still there)
            store.log_returns()
            if isinstance(queue, RemoteQuorumQueue):  # this node's consumers of it stay, its own now
                queue.adopt(leader_queue)
            self.broker.metadata.replace_queue(vhost_name, name, leader_queue)
            leader_queue.deliver_ready()
            if store.parked:  # (the other nodes' consumers have a while to re-attach and claim theirs)
                asyncio.get_running_loop().call_later(PARK_GRACE, self._give_up, key, store, None)
            log.warning("%s: leader now (epoch %d)", key, record.epoch)
            self._decide_alone(led)
            return
        if led is not None:  # another node leads now: give the queue up, follow it
            del self.led[key]
            self._to_ship.discard(led)
            led.store.fail()
            self._refuse_waiting(led)
            if not led.state.proven:  # (what it wrote unproven no follower has: its position is as reported)
                led.log.truncate(led.state.epoch_start)
            stand_in = RemoteQuorumQueue(vhost, name, queue.durable, None, False, queue.arguments, record.leader,
                                         self.broker)
            stand_in.members, stand_in.incarnation = record.members, queue.incarnation
            stand_in.inherit(queue)
            self.broker.metadata.replace_queue(vhost_name, name, stand_in)
            stand_in.resume()
            self._follow(self._follow_log(key, record.leader, led.log, record.epoch))
            log.warning("%s: %s leads it now (epoch %d); following", key, record.leader, record.epoch)
            return
        if followed is not None:
            followed.leader = record.leader
            followed.state.knows(record.epoch)
            followed.state.leader_epoch = None
            followed.asking = None  # (a request the old one holds is answered to no one)
            self._follow(followed)  # (at once: the new leader commits nothing without a majority)
        if isinstance(queue, RemoteQueue):
            queue.home = record.leader
        if isinstance(queue, RemoteQuorumQueue):
            queue.resume()

    def _stream_leader_changed(self, key: Key, record: Record, led: Led | None, followed: Followed | None) -> None:
        """A stream's replica here stays the queue, its readers with it: it leads now, or
        follows the new leader (what it appended and did not commit is nacked)."""
        if led is not None:
            stream = cast(ReplicatedStream, led.store)
            if record.leader == self.node:  # (restarted, leading still: in the record's epoch)
                led.state = self._leader_state(record, led.log)
                stream.lead(record.epoch)
                return
            del self.led[key]
            self._to_ship.discard(led)
            stream.leader = record.leader
            stream.follow()
            followed = self._follow_log(key, record.leader, led.log, record.epoch)
            followed.stream = stream
            self._follow(followed)
            log.warning("%s: %s leads the stream now (epoch %d); following", key, record.leader, record.epoch)
            return
        if followed is None or followed.stream is None:
            return
        stream = followed.stream
        stream.leader = record.leader
        if record.leader != self.node:
            followed.leader = record.leader
            followed.state.knows(record.epoch)
            followed.state.leader_epoch = None
            followed.asking = None
            self._follow(followed)
            return
        del self.followed[key]
        log_ = followed.log
        state = self._leader_state(record, log_)
        stream.lead(record.epoch)
        self._lead(key, log_, stream, state)
        log.warning("%s: stream leader now (epoch %d)", key, record.epoch)

    def _give_up(self, key: Key, store: ReplicatedQueueStore, node: str | None) -> None:
        """What consumers held when this node took the queue over and have not claimed (those
        of `node`, which stopped running, or every one once PARK_GRACE is over) goes back."""
        led = self.led.get(key)
        vhost = self.broker.vhosts.get(key[0])
        queue = None if vhost is None else vhost.queues.get(key[1])
        if led is None or led.store is not store or queue is None or queue.remote:
            return
        for holder in [h for h in store.parked if node is None or h.partition("/")[0] == node]:
            for qm in store.claim(holder).values():
                queue.reject(qm, True)
        queue.deliver_ready()

    # ---------------------------------------------------------------- a follower's side
    def _follow(self, followed: Followed) -> None:
        peer = self.links.peer(followed.leader)
        if not peer.up or followed.asking is not None:
            return
        token = followed.asking = object()
        vhost, name = followed.key

        def answered(result: Any, error: BaseException | None) -> None:
            if followed.asking is not token:
                return  # (asked another leader since)
            followed.asking = None
            if error is not None or self.followed.get(followed.key) is not followed:
                if error is not None:
                    log.debug("following %s on %s: %s", followed.key, followed.leader, error)
                    followed.refused += 1
                    asyncio.get_running_loop().call_later(FOLLOW_AGAIN if followed.refused == 1 else RETRY,
                                                          self._follow_again, followed)
                return
            followed.refused = 0
            epoch, starts, end, first = result
            cut = followed.state.synchronise(epoch, [tuple(s) for s in starts], end)
            if cut is None:
                return
            if cut < first:  # (behind what the leader released: start again where it starts)
                followed.log.restart_at(first)
                cut = first
            followed.log.truncate(cut)
            if followed.stream is not None:
                followed.stream.truncated(cut)
            followed.state.log_end = followed.log.end  # (the log is the truth: a cut below its head keeps it)
            if peer.link is not None:
                peer.link.send({"op": "ready", "vhost": vhost, "queue": name, "cut": cut,
                                "durable": followed.log.durable})
        # (Its log's position: a quorum queue's unproven leader needs it. Its epoch is the
        # newest it knows, so it refuses every older leader's entries from now on.)
        peer.request({"op": "follow", "vhost": vhost, "queue": name, "epoch": followed.state.epoch,
                      "last": followed.log.history.last_epoch, "end": followed.log.end}, answered,
                     lambda meta: (int(meta["epoch"]), meta["starts"], int(meta["end"]), int(meta["first"])))

    def _follow_again(self, followed: Followed) -> None:
        if self.followed.get(followed.key) is followed and followed.state.leader_epoch is None:
            self._follow(followed)

    def entries(self, node: str, meta: Meta, blobs: list[bytes]) -> None:
        """Entries from the leader on `node` (Peer: a frame of the link to it)."""
        followed = self.followed.get((meta["vhost"], meta["queue"]))
        if followed is None or followed.leader != node:
            return
        epochs, kinds = meta["epochs"], meta["kinds"]
        if followed.log.end != followed.state.log_end:
            log.error("replica of %s: the log ends at %d, the follower at %d; following again", followed.key,
                      followed.log.end, followed.state.log_end)
            followed.state = Follower(followed.log.history, followed.log.end, followed.log.durable,
                                      followed.state.epoch)
            return
        try:
            accepted = followed.state.check(int(meta["epoch"]), int(meta["first"]), [int(e) for e in epochs])
        except ReplicationError as err:
            log.warning("replica of %s: %s; following again", followed.key, err)
            followed.state.leader_epoch = None
            return
        if not accepted:
            return
        stream = followed.stream
        for epoch, kind, payload in zip(epochs, kinds, blobs):
            offset = followed.log.append(int(epoch), int(kind), payload)  # (the log keeps the history: see Follower.check)
            if stream is not None:
                stream.chunks.scanned(offset, payload)
        followed.state.log_end = followed.log.end
        if stream is not None:
            stream.leader_says(int(meta.get("committed", 0)))
        if not self._flushing:  # (one write and fsync for what this tick brought, every queue's)
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        self.broker.durability.flush()

    def _acknowledge(self, followed: Followed, durable: int) -> None:
        followed.state.synced(durable)
        if followed.stream is not None:
            followed.stream.durable_moved()
        peer = self.links.peer(followed.leader)
        if followed.state.leader_epoch is not None and peer.link is not None:
            vhost, name = followed.key
            peer.link.send({"op": "replica_ack", "vhost": vhost, "queue": name, "durable": followed.state.durable})

    def peer_lost(self, node: str) -> None:
        """The link to `node` ended: what follows a queue it leads follows again later."""
        for followed in self.followed.values():
            if followed.leader == node:
                followed.state.leader_epoch = None
        # A killed node's links end at once: its queues need not wait for its lease (5 s) to
        # elect. Safe under the rules whatever the cause (an old leader cannot commit without
        # its successor); a link that is back within the grace elects nothing.
        asyncio.get_running_loop().call_later(LINK_GRACE, self._unreachable, node)

    def _unreachable(self, node: str) -> None:
        if not self.links.peer(node).up:
            self._stopped(node)

    # ---------------------------------------------------------------- a leader's side
    def _led(self, meta: Meta) -> Led:
        led = self.led.get((meta["vhost"], meta["queue"]))
        if led is None:
            raise not_found(f"this node does not lead queue '{meta['queue']}' in vhost '{meta['vhost']}'")
        return led

    def follow(self, node: str, link: Link, meta: Meta) -> dict | None:
        """A follower on `node` links (HomeSession: a request on its link): what it synchronises
        with; None: answered later, once this unproven leader is proven (_decide)."""
        led = self._led(meta)
        state = led.state
        if node not in state.members:  # (added or removed, and this leader has not seen it yet)
            raise not_found(f"node '{node}' is not a member of queue '{meta['queue']}' in vhost '{meta['vhost']}'")
        if not state.proven:
            if led.key in self._to_renew or led.hand_to is not None or int(meta.get("epoch", -1)) != state.epoch:
                raise not_found(f"queue '{meta['queue']}' in vhost '{meta['vhost']}' has no leader in epoch "
                                f"{meta.get('epoch')} on node '{self.node}' yet")
            led.waiting[node] = (link, int(meta["rid"]))
            if state.reported(node, int(meta["last"]), int(meta["end"])):
                self._decide(led)
            return None
        if int(meta.get("epoch", 0)) > state.epoch:  # (it knows this leader was replaced: it asks the next)
            raise not_found(f"queue '{meta['queue']}' in vhost '{meta['vhost']}' has a leader newer than "
                            f"epoch {state.epoch}")
        return self._welcome(led, node, link)

    def _welcome(self, led: Led, node: str, link: Link) -> dict:
        epoch, starts, end = led.state.welcome(node)
        led.links[node] = link
        return {"epoch": epoch, "starts": [list(s) for s in starts], "end": end, "first": led.log.first}

    def _decide(self, led: Led) -> None:
        """A majority reported: this leader is proven (it writes its first entry and answers
        its followers), or hands the queue over to the most up-to-date member."""
        state = led.state
        best = state.best()
        if best != self.node:
            led.hand_to = best
            self._refuse_waiting(led)
            record = self.records.get(led.key)
            if record is not None and record.leader == self.node and record.epoch == state.epoch:
                self._elect(led.key, replace(record, leader=best, epoch=record.epoch + 1, isr=_with(record.isr, best)))
            log.warning("%s: %s holds more of the log (its last epoch and end %s, here %s); handing the queue "
                        "over to it", led.key, best, state.reports[best], state.position)
            return
        moved = state.prove()
        led.log.append(state.epoch, NOOP, b"")
        waiting, led.waiting = led.waiting, {}
        for node, (link, rid) in waiting.items():
            if node in state.members:
                link.send({"op": "reply", "rid": rid, **self._welcome(led, node, link)})
            else:  # (removed meanwhile)
                err = not_found(f"node '{node}' is not a member of queue '{led.key[1]}' in vhost '{led.key[0]}'")
                link.send({"op": "reply", "rid": rid, "error": [err.code, err.text]})
        self._committed(led, moved)

    def _decide_alone(self, led: Led) -> None:
        """An unproven leader that needs no report (its own is a majority: one member, or the
        members changed) decides now."""
        if (not led.state.proven and led.key not in self._to_renew and led.hand_to is None and led.state.majority
                and led.state.decided()):
            self._decide(led)

    def _refuse_waiting(self, led: Led) -> None:
        """Follow requests waiting for this leader's proof: refused (they ask again)."""
        waiting, led.waiting = led.waiting, {}
        err = not_found(f"queue '{led.key[1]}' in vhost '{led.key[0]}' changed leader")
        for link, rid in waiting.values():
            link.send({"op": "reply", "rid": rid, "error": [err.code, err.text]})

    def status(self, key: Key) -> list[dict[str, Any]]:
        """quorum_status's rows as this leader knows them (RabbitMQ's columns, one row per
        member in the record's order): a follower's log index is what it acknowledged on disk;
        a member not following now is `noproc` (its node runs) or `nodedown`."""
        led = self.led.get(key)
        if led is None:
            raise not_found(f"this node does not lead queue '{key[1]}' in vhost '{key[0]}'")
        state = led.state
        running = set(self.links.membership.running) | {self.node}
        rows: list[dict[str, Any]] = []
        for node in self.records[key].members:
            progress = state.followers.get(node)
            if node == self.node:
                role, index = "leader", state.log_end
            elif progress is not None:
                role, index = "follower", progress.durable
            else:
                rows.append({"Node Name": node, "Raft State": "noproc" if node in running else "nodedown",
                             "Log Index": "", "Commit Index": "", "Snapshot Index": "", "Term": "",
                             "Machine Version": ""})
                continue
            rows.append({"Node Name": node, "Raft State": role, "Log Index": index,
                         "Commit Index": min(index, state.committed), "Snapshot Index": "undefined",
                         "Term": state.epoch, "Machine Version": MACHINE_VERSION})
        return rows

    def ready(self, node: str, meta: Meta) -> None:
        led = self._led(meta)
        link = led.links.get(node)
        if int(meta["cut"]) < led.log.first:  # (released below its cut since its follow was answered)
            if link is not None:  # (its log ends before this one starts: it follows again, from the start)
                link.send({"op": "release", "vhost": meta["vhost"], "queue": meta["queue"], "cursor": led.released,
                           "first": led.log.first})
            return
        led.told.pop(node, None)  # (a stream's follower back: its readers wait for the commit point)
        self._committed(led, led.state.ready(node, int(meta["cut"]), int(meta["durable"]), time.monotonic()))
        if led.released and link is not None:  # (what it may drop of what it kept while away)
            link.send({"op": "release", "vhost": meta["vhost"], "queue": meta["queue"], "cursor": led.released,
                       "first": led.log.first})
        self._ship_soon(led)

    def acknowledged(self, node: str, meta: Meta) -> None:
        led = self.led.get((meta["vhost"], meta["queue"]))
        if led is not None:
            self._committed(led, led.state.acknowledged(node, int(meta["durable"]), time.monotonic()))

    def session_lost(self, node: str, link: Link) -> None:
        """The link a follower on `node` came on ended: its progress goes until it follows again,
        and its report with it (the most up-to-date member to hand the queue over to must be
        in reach; a report left out is always safe)."""
        for led in self.led.values():
            if led.waiting.get(node, (None,))[0] is link:
                del led.waiting[node]
                led.state.reports.pop(node, None)
            if led.links.get(node) is not None:
                del led.links[node]
                led.state.unlinked(node)

    def commit(self, node: str, meta: Meta) -> None:
        """A stream's leader on `node` says what is committed (Peer: a frame of its link)."""
        followed = self.followed.get((meta["vhost"], meta["queue"]))
        if followed is not None and followed.leader == node and followed.stream is not None:
            followed.stream.leader_says(int(meta["committed"]))

    def _committed(self, led: Led, moved: bool) -> None:
        if moved:
            led.store.commit(led.state.committed)
            if isinstance(led.store, ReplicatedStream):  # (its followers' readers wait for it)
                self._ship_soon(led)

    def _appended(self, led: Led) -> None:
        led.state.log_end = led.log.end  # (the log wrote it and keeps the history: see Follower.check)
        self._ship_soon(led)
        if len(led.log.segments) != led.segments:  # (a new segment: a stream's retention applies now)
            led.segments = len(led.log.segments)
            self._release(led)

    def _ship_soon(self, led: Led) -> None:
        self._to_ship.add(led)
        if not self._shipping:
            self._shipping = True
            asyncio.get_running_loop().call_soon(self._ship)

    def _ship(self) -> None:
        """What each leader appended this tick, to each of its followers: one frame per queue
        (or per FRAME_ENTRIES) and follower."""
        self._shipping = False
        # What was appended outside a channel's or a link's read (a delivery as a link drains,
        # a timer, a takeover) is written and synced now too: a publish waiting for its
        # confirm may be behind it, and nothing else would start the group commit.
        self.broker.durability.flush()
        to_ship, self._to_ship = self._to_ship, set()
        for led in to_ship:
            vhost, name = led.key
            committed = led.state.committed
            stream = isinstance(led.store, ReplicatedStream)
            for node, link in list(led.links.items()):
                span = led.state.to_send(node)
                if span is not None:
                    for first in range(span[0], span[1], FRAME_ENTRIES):
                        entries = list(led.log.entries(first, min(first + FRAME_ENTRIES, span[1])))
                        link.send({"op": "entries", "vhost": vhost, "queue": name, "epoch": led.state.epoch,
                                   "first": first, "epochs": [e.epoch for e in entries],
                                   "kinds": [e.kind for e in entries], **({"committed": committed} if stream else {})},
                                  *[e.payload for e in entries])
                elif stream and led.told.get(node, -1) < committed:
                    link.send({"op": "commit", "vhost": vhost, "queue": name, "committed": committed})
                led.told[node] = committed
            followers = led.state.followers
            led.log.shipped(min((followers[n].sent for n in led.links if n in followers), default=led.log.end))


def _with(isr: tuple[str, ...], leader: str) -> tuple[str, ...]:
    """A new record's ISR, which holds its leader (a quorum queue's may be any member)."""
    return isr if leader in isr else (*isr, leader)


def _is_stream(cmd: DeclareQueue) -> bool:
    return (cmd.arguments or {}).get("x-queue-type") == "stream"


def replicas_of(broker: Broker) -> Replicas | None:
    """The node's replicated queues (MetadataStore.replicas, as the cluster's layer made it)."""
    return cast("Replicas | None", broker.metadata.replicas)
