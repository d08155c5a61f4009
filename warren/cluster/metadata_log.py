"""The cluster's metadata log in etcd: every change of metadata made on any node, in one order,
applied by every node.

The log is one etcd key; each change is a put of it, so etcd's revision of the put is the
change's place in the log and a watch of the key from a revision replays every change since.
A node carries an operation out (warren.broker.metadata.change) against its metadata as of
the last change it applied, and writes the command it yields in a transaction guarded by that
revision: when another change got in first, the transaction fails, the node applies what it
missed and runs the operation again, so every command was checked against the metadata it
changes (etcd's revisions are the fencing tokens). The node that wrote a change answers its
client once it has applied the change from the log, like every other node, and the other
running members linked to it say they have too (at most a second: NodeLinks.replicated), so
what a client changed through one node is there when it goes on through another. A node cut from
etcd's majority writes nothing: its operations fail after TIMEOUT with a clear error.

The revision a node's metadata includes is saved with its definitions (MetadataStore.revision),
so a restarted node goes on from there; a node whose revision etcd no longer keeps catches up
from the latest snapshot (warren.cluster.metadata_snapshot, which also says who compacts etcd's
history, and when)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..broker import definitions
from ..broker.errors import internal_error
from ..broker.metadata.commands import Command, DeleteQueue
from ..broker.metadata import change
from ..broker.metadata.change import Change, Done
from ..broker.metadata.store import MetadataStore
from . import command_codec
from .config import ClusterConfig
from .etcd import Compacted, Etcd, EtcdError, mod_revision_is, put_op
from .metadata_snapshot import CHECK, SNAPSHOT_EVERY, Snapshots, SnapshotMissing, catch_up
from .tasks import cancelled

log = logging.getLogger("warren.cluster")

TIMEOUT = 15.0   # seconds an operation may wait for etcd before it fails
RETRY = 0.5      # seconds between two attempts to reach etcd


@dataclass
class _Proposal:
    operation: Callable[[], Change[Any]]
    done: Done
    deadline: float
    id: str = ""
    change: Change[Any] | None = None  # the running operation, once its command is written
    applied: asyncio.Event = field(default_factory=asyncio.Event)


class MetadataLog:
    """A cluster member's log (warren.broker.metadata.change.ClusterLog), and one of its
    server's services: it follows the log from the revision the node's metadata includes."""

    def __init__(self, config: ClusterConfig, etcd: Etcd, store: MetadataStore, seed: list[Command] = ()):  # type: ignore[assignment]
        self.config = config
        self.etcd = etcd
        self.store = store
        # A new member's defaults (the default user and vhost, the cluster's id): written to
        # the log if it is empty once read, so a cluster's first node makes them for all.
        self.seed = list(seed)
        self._seeding = 0  # of the seed's changes, those not answered yet
        self.key = config.keys.root + b"metadata/log"
        self.caught_up = asyncio.Event()  # the node has applied what the log held when it started
        self._queue: asyncio.Queue[_Proposal] = asyncio.Queue()
        self._written: dict[str, _Proposal] = {}  # id -> proposal whose command is in the log
        self._advanced = asyncio.Event()          # set (and replaced) each time a change is applied
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task] = []
        self._waits: set[asyncio.Task] = set()
        # The other running members' confirmation that they applied a revision (NodeLinks):
        # a change is answered once they have it too, so what a client changed through one
        # node is there through every node (as RabbitMQ's metadata transactions are).
        self.replicated: Callable[[int, Callable[[], None]], None] | None = None
        self.snapshots = Snapshots(etcd, config.keys.root)
        # Whether this node is the one that snapshots and compacts (the first running member).
        self.compacts: Callable[[], bool] = lambda: False
        self.compacted = 0  # the revision this node last compacted etcd's history to
        self._snapshot_at = time.monotonic()  # when this node last looked at the snapshot

    @property
    def revision(self) -> int:
        return self.store.revision

    # ----------------------------------------------------------------- service
    async def start(self, server=None) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow()), loop.create_task(self._write()),
                       loop.create_task(self._compact_forever())]
        self.store.log = self
        try:  # serve with the metadata the cluster has (a first node: its defaults), when etcd answers soon
            await asyncio.wait_for(self._ready(), 5)
        except asyncio.TimeoutError:
            log.error("cluster %s: the metadata log could not be read yet; serving what this node has%s",
                      self.config.cluster_name, "" if self.store.vhosts else " (nothing: it has never joined)")

    async def _ready(self) -> None:
        await self.caught_up.wait()
        while self._seeding:
            await self._advanced.wait()

    async def stop(self) -> None:
        await cancelled(*self._tasks, *self._waits)
        self._tasks = []
        await self.etcd.close()  # (the last of the node's services to use it)

    # ------------------------------------------------------------ ClusterLog
    def submit(self, operation: Callable[[], Change[Any]], done: Done) -> None:
        self._queue.put_nowait(_Proposal(operation, done, time.monotonic() + TIMEOUT))

    def when_applied(self, revision: int, then: Callable[[], None]) -> None:
        if self.revision >= revision:
            then()
            return

        async def wait() -> None:
            await self._applied_past(revision - 1, time.monotonic() + TIMEOUT)
            then()
        task = asyncio.get_running_loop().create_task(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    # ----------------------------------------------------------------- writing
    async def _write(self) -> None:
        """One operation at a time, in the order they came: a client's changes keep their order."""
        while True:
            proposal = await self._queue.get()
            try:
                await self._propose(proposal)
            except asyncio.CancelledError:
                raise
            except BaseException as err:  # never leave a client waiting
                log.exception("cluster %s: a change failed", self.config.cluster_name)
                _finish(proposal, None, err)

    async def _propose(self, proposal: _Proposal) -> None:
        while True:
            if time.monotonic() > proposal.deadline:
                _finish(proposal, None, internal_error("the cluster's metadata store (etcd) did not answer in time"))
                return
            seen = self.revision
            change = proposal.operation()
            try:
                command = next(change)
            except StopIteration as stop:  # nothing to change (a passive declare)
                _finish(proposal, stop.value, None)
                return
            except Exception as err:  # refused against the metadata as it is
                _finish(proposal, None, err)
                return
            proposal.id = f"{self.config.node_name}/{next(self._ids)}"
            entry = json.dumps({"node": self.config.node_name, "id": proposal.id,
                                "command": command_codec.encode(command).decode()}).encode()
            # Known before the write: the watch may bring the entry back before etcd's answer.
            proposal.change = change
            self._written[proposal.id] = proposal
            try:
                result = await self.etcd.txn([mod_revision_is(self.key, seen)], [put_op(self.key, entry)])
            except EtcdError as err:
                # (Whether it was written is unknown: if it was, it is applied as any other node's.)
                self._written.pop(proposal.id, None)
                change.close()
                log.warning("cluster %s: cannot write to the metadata log: %s", self.config.cluster_name, err)
                await asyncio.sleep(RETRY)
                continue
            if not result.succeeded:  # another change got in first: catch up, check again
                self._written.pop(proposal.id, None)
                change.close()
                await self._applied_past(seen, proposal.deadline)
                continue
            # Answered by _follow once this node has applied it (or at the deadline).
            try:
                await asyncio.wait_for(proposal.applied.wait(), max(0.0, proposal.deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self._written.pop(proposal.id, None)
                _finish(proposal, None, internal_error(
                    "the change is in the cluster's metadata log but this node has not applied it in time"))
            return

    async def _applied_past(self, revision: int, deadline: float) -> None:
        while self.revision <= revision and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._advanced.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return

    # ---------------------------------------------------------------- following
    async def _follow(self) -> None:
        while True:
            try:
                now, kvs = await self.etcd.get(self.key)
                head = kvs[0].mod_revision if kvs else 0  # the last change in the log
                if self.revision > head:
                    log.error("cluster %s: this node's metadata includes change %d, the log ends at %d: "
                              "is this the cluster's etcd?", self.config.cluster_name, self.revision, head)
                if self.revision >= head:
                    self._caught_up(head)
                # (Missing nothing, it watches from etcd's revision now: the history before it
                # may be compacted, by this cluster or another one on the same etcd.)
                start = now + 1 if self.revision == head else self.revision + 1
                async for _, events in self.etcd.watch(self.key, start):
                    for event in events:
                        if not event.deleted and event.kv.mod_revision > self.revision:
                            self._apply(event.kv.mod_revision, event.kv.value)
                    if self.revision >= head:
                        self._caught_up(head)
            except Compacted as err:
                await self._catch_up(err.revision)
            except EtcdError as err:
                log.warning("cluster %s: following the metadata log: %s", self.config.cluster_name, err)
                await asyncio.sleep(RETRY)
            except Exception:  # (never stop following: a node that stops applies nothing more)
                log.exception("cluster %s: following the metadata log failed; following again",
                              self.config.cluster_name)
                await asyncio.sleep(RETRY)

    async def _catch_up(self, compacted: int) -> None:
        """etcd's history no longer goes back to this node's revision: its tables are brought
        to the latest snapshot, and it follows the log from there."""
        try:
            revision, data = await self.snapshots.read()
        except (SnapshotMissing, EtcdError, ValueError) as err:
            log.warning("cluster %s: the metadata log was compacted past this node's revision %d (to %d) and "
                        "its snapshot cannot be read yet: %s", self.config.cluster_name, self.revision, compacted, err)
            await asyncio.sleep(RETRY)
            return
        if revision <= self.revision:  # (another cluster on the same etcd compacted it: wait for a newer one)
            log.warning("cluster %s: etcd's history was compacted to %d, past this node's revision %d, and the "
                        "latest snapshot is of revision %d: waiting for a newer one", self.config.cluster_name,
                        compacted, self.revision, revision)
            await asyncio.sleep(CHECK)
            return
        before = self.revision
        deleted, put = catch_up(self.store, data, revision)
        log.warning("cluster %s: the metadata log was compacted past this node's revision %d: caught up from "
                    "the snapshot of revision %d (%d objects deleted, %d put)", self.config.cluster_name, before,
                    revision, deleted, put)
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    # ---------------------------------------------------------------- compacting
    async def _compact_forever(self) -> None:
        while True:
            await asyncio.sleep(CHECK)
            if not self.compacts() or not self.caught_up.is_set():
                continue
            try:
                await self._compact()
            except EtcdError as err:
                log.warning("cluster %s: compacting etcd's history: %s", self.config.cluster_name, err)
            except Exception:  # (a bug must not end the loop: the history would grow for good)
                log.exception("cluster %s: compacting etcd's history failed", self.config.cluster_name)

    async def _compact(self) -> None:
        """Once etcd's revision is 2 x history past the last compaction (or SNAPSHOT_EVERY
        after the last snapshot: another cluster on the same etcd may compact it): a snapshot
        of these tables if they changed since the latest; then, if due, the history before the
        older of its revision and etcd's revision less history goes."""
        history = self.config.history
        now, _ = await self.etcd.get(self.key)
        due = now - self.compacted >= 2 * history
        if not due and time.monotonic() - self._snapshot_at < SNAPSHOT_EVERY:
            return
        head = await self.snapshots.head()
        self._snapshot_at = time.monotonic()
        if self.revision > head.revision:
            revision = self.revision  # (export() is of the tables as of this revision: nothing awaits between)
            if await self.snapshots.write(revision, definitions.export(self.store.broker), head):
                log.info("cluster %s: snapshot of the metadata at revision %d written", self.config.cluster_name,
                         revision)
            head = await self.snapshots.head()
        target = min(head.revision, now - history)
        if due and target > self.compacted:
            await self.etcd.compact(target)
            log.info("cluster %s: etcd's history compacted to revision %d", self.config.cluster_name, target)
            self.compacted = target

    def _caught_up(self, head: int) -> None:
        if not self.caught_up.is_set():
            self.caught_up.set()
            self._forget_own_queues()
            if head == 0:  # nobody wrote the log yet: this node's defaults are the cluster's
                for command in self.seed:
                    self._seeding += 1
                    self.submit(functools.partial(change.command, command), self._seeded)
            self.seed = []

    def _forget_own_queues(self) -> None:
        """This node's queues that did not outlive its last run (exclusive ones, whose owners
        were its connections, and transient ones) leave the cluster's tables, as RabbitMQ
        deletes them when their node goes down."""
        me = self.config.node_name
        for vhost in self.store.vhosts.values():
            for queue in vhost.queues.values():
                if not getattr(queue, "remote", False) and (queue.owner is not None or not queue.durable):
                    if queue.owner is None or queue.owner.node == me:
                        self.store.submit(DeleteQueue(vhost.name, queue.name))

    def _seeded(self, result: Any, error: BaseException | None) -> None:
        self._seeding -= 1
        if error is not None:
            log.error("the cluster's defaults could not be written: %s", error)

    def _apply(self, revision: int, value: bytes) -> None:
        store = self.store
        try:
            entry = json.loads(value)
            command = command_codec.decode(entry["command"].encode())
            proposal = self._written.pop(entry["id"], None) if entry.get("node") == self.config.node_name else None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            log.error("cluster %s: log entry %d cannot be read, skipped: %s", self.config.cluster_name, revision, err)
            proposal, command = None, None
        result: Any = None
        error: BaseException | None = None
        if command is not None:
            store.from_log = True
            try:
                result = store.apply(command)
            except Exception as err:  # refused the same way on every node
                error = err
            finally:
                store.from_log = False
        store.applied(revision)
        if proposal is not None and proposal.change is not None:
            self._resume(proposal, revision, result, error)
        elif error is not None:
            log.debug("cluster %s: log entry %d refused here too: %s", self.config.cluster_name, revision, error)
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    def _resume(self, proposal: _Proposal, revision: int, result: Any, error: BaseException | None) -> None:
        """The operation that wrote the change: what follows its command, then its answer
        (once the other running members have applied it too)."""
        assert proposal.change is not None
        try:
            if error is not None:
                proposal.change.throw(error)
            else:
                proposal.change.send(result)
            error = internal_error("an operation yielded a second command")  # (ops yield one)
            result = None
        except StopIteration as stop:
            result, error = stop.value, None
        except Exception as err:
            result, error = None, err
        proposal.applied.set()
        if self.replicated is None:
            _finish(proposal, result, error)
        else:
            self.replicated(revision, functools.partial(_finish, proposal, result, error))


def _finish(proposal: _Proposal, result: Any, error: BaseException | None) -> None:
    done, proposal.done = proposal.done, _answered
    try:
        done(result, error)
    except Exception:  # the answer's failure is its own: the log goes on
        log.exception("answering a change of metadata failed")


def _answered(result: Any, error: BaseException | None) -> None:
    """A proposal is answered once."""
