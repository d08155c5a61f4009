"""Which nodes are in the cluster and which of them run, as etcd knows it.

A node that joins writes its member record (kept until warrenctl forget_cluster_node
removes it: a stopped node is still a member, shown as not running, as in RabbitMQ) and a
running record on a lease it renews; one that stops revokes the lease, one that dies stops
renewing it and is not running once the lease expires (config.LIVENESS_TTL). It also
registers where RabbitMQ's etcd peer discovery does, with that backend's own lease
(cluster_formation.etcd.node_ttl). Every node watches the cluster's keys, so each has the
same view within a watch's delay.

The running record also carries the node's resource alarms, so that every member blocks its
publishers while any running member has one (RabbitMQ's rabbit_alarm tells every node of
every node's alarms) and a node that stops running takes its alarms with it (RabbitMQ clears
a down node's). etcd rather than the node links: the alarm then reaches every member the
watch reaches (a member just starting reads it with the rest of the view, a link need not be
up), in one put and one watch event (milliseconds); a node cut off from etcd cannot tell the
others of an alarm, but its own connections are blocked all the same and, its lease running
out, it is not running for the others within LIVENESS_TTL anyway. Its view of the others'
alarms is then the last it read, as is its view of who runs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import time
from enum import Enum
from typing import Any, Callable

from .. import __version__
from ..broker.alarms import Alarms
from ..broker.node_config import NodeConfig
from .config import ClusterConfig
from .etcd import Etcd, EtcdError, absent, delete_op, put_op
from .tasks import cancelled, first_failure

log = logging.getLogger("warren.cluster")

RETRY = 1.0  # seconds between two attempts to reach etcd
STALL = 0.4  # of the liveness TTL: a sync that long means a stalled disk


class Forget(Enum):
    """What forgetting a node came to."""
    FORGOTTEN = "forgotten"
    RUNNING = "running"        # it runs (its running record lives): it must stop first
    NOT_MEMBER = "not_member"  # no such member


class Membership:
    """A service of the node's server (start/stop); `members` and `running` are the view."""

    def __init__(self, config: ClusterConfig, etcd: Etcd, identity: dict[str, Any], node: NodeConfig,
                 alarms: Alarms | None = None, disk_stalled: Callable[[float], bool] | None = None):
        self.config = config
        self.etcd = etcd
        self.identity = identity  # what the running record tells the other nodes
        self.node = node  # whose default cluster name is the cluster's (see _apply)
        self.alarms = alarms  # this node's resource alarms go out, the others' come in
        # Whether the node's disk has not finished a sync for that many seconds: it then stops
        # renewing its lease, so that it stops running for the others (its replicated queues
        # are led elsewhere) rather than hold up every confirm (LavinMQ's lesson).
        self.disk_stalled = disk_stalled
        self._said_stalled = False
        self.members: dict[str, dict] = {}  # node -> its member record
        self.running: dict[str, dict] = {}  # node -> its running record
        self.registered = asyncio.Event()   # set while this node's records are in etcd
        self.synced = asyncio.Event()       # set once the view was read
        self.error: str | None = None       # why etcd cannot be used, while it cannot
        self.on_stopped: list[Callable[[str], None]] = []  # told of a node that stopped running
        self._leases: list[int] = []
        self._task: asyncio.Task | None = None
        self._running_record: dict[str, Any] = {}  # as last written
        self._alarms_changed = asyncio.Event()  # this node's may differ from the record's

    async def start(self, server=None) -> None:
        if self.alarms is not None:
            self.alarms.subscribe(self._alarms_changed.set)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.alarms is not None:
            self.alarms.unsubscribe(self._alarms_changed.set)
        await cancelled(self._task)
        for lease in self._leases:  # a clean stop: not running at once, not after the lease
            try:
                await self.etcd.revoke(lease)
            except EtcdError:
                pass
        self._leases = []

    async def forget(self, node: str) -> Forget:
        """Remove a node that does not run from the cluster (warrenctl forget_cluster_node).
        One transaction: a node that starts meanwhile is refused, never half forgotten. A
        forgotten node that starts again joins again (it writes its member record anew)."""
        keys = self.config.keys
        if node == self.config.node_name:
            return Forget.RUNNING
        result = await self.etcd.txn([absent(keys.running_key(node))], [delete_op(keys.member_key(node))])
        if not result.succeeded:
            return Forget.RUNNING
        # (etcd's JSON gateway leaves out zero counts)
        deleted = int(result.responses[0].get("response_delete_range", {}).get("deleted", 0))
        if not deleted:
            return Forget.NOT_MEMBER
        self.members.pop(node, None)  # this node's view at once; the others' from the watch
        return Forget.FORGOTTEN

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        while True:
            try:
                while self._stalled():  # (not running again until its disk is back)
                    await asyncio.sleep(RETRY)
                await self._register()
                await first_failure(self._renew(), self._follow(), self._publish_alarms())
            except EtcdError as err:
                if self.error != str(err):
                    log.error("cluster %s: etcd: %s; trying again", self.config.cluster_name, err)
                self.error = str(err)
            self.registered.clear()
            await asyncio.sleep(RETRY)

    async def _register(self) -> None:
        keys, node = self.config.keys, self.config.node_name
        liveness = await self.etcd.grant(self.config.liveness_ttl)
        discovery = await self.etcd.grant(self.config.node_ttl)
        self._leases = [liveness, discovery]
        member = {"node": node, "joined": int(time.time() * 1000)}
        known = self.members.get(node)
        if known is not None:
            member = known
        running = {"node": node, "os_pid": str(os.getpid()), "started": int(time.time() * 1000),
                   "warren_version": __version__, "python_version": platform.python_version(), **self.identity,
                   "alarms": self._own_alarms()}
        # RabbitMQ's registration value: its node, lease id and TTL.
        registration = {"node": node, "lease_id": discovery, "ttl": self.config.node_ttl}
        await self.etcd.txn([], [put_op(keys.member_key(), _json(member)),
                                 put_op(keys.running_key(), _json(running), liveness),
                                 put_op(keys.discovery_key(), _json(registration), discovery)])
        self._running_record = running
        if self.error is not None:
            log.info("cluster %s: etcd reachable again", self.config.cluster_name)
        self.error = None
        self.registered.set()
        log.info("node %s joined cluster %s", node, self.config.cluster_name)

    async def _renew(self) -> None:
        """Keep the leases alive; one that expired (the node was cut off for longer than its
        TTL) means registering again."""
        while True:
            await asyncio.sleep(self.config.liveness_ttl / 3)
            if self._stalled():
                continue
            for lease in self._leases:
                if await self.etcd.keepalive(lease) <= 0:
                    raise EtcdError(f"lease {lease:x} expired")

    def _stalled(self) -> bool:
        stalled = self.disk_stalled is not None and self.disk_stalled(self.config.liveness_ttl * STALL)
        if stalled and not self._said_stalled:
            log.error("node %s: its disk has not finished a sync for %.0f s: its lease is not renewed until it "
                      "does (the other nodes see it stopped)", self.config.node_name, self.config.liveness_ttl * STALL)
        elif not stalled and self._said_stalled:
            log.warning("node %s: its disk syncs again", self.config.node_name)
        self._said_stalled = stalled
        return stalled

    def _own_alarms(self) -> list[str]:
        return sorted(self.alarms) if self.alarms is not None else []

    async def _publish_alarms(self) -> None:
        """Write this node's running record again whenever its alarms change (on its lease)."""
        while True:
            await self._alarms_changed.wait()
            self._alarms_changed.clear()
            alarms = self._own_alarms()
            if alarms == self._running_record.get("alarms"):
                continue  # (another node's alarms changed, or this one's changed back)
            record = {**self._running_record, "alarms": alarms}
            await self.etcd.txn([], [put_op(self.config.keys.running_key(), _json(record), self._leases[0])])
            self._running_record = record

    async def _follow(self) -> None:
        revision, kvs = await self.etcd.get(self.config.keys.root, prefix=True)
        self.members.clear()
        self.running.clear()
        for kv in kvs:
            self._apply(kv.key, kv.value, False, follow_alarms=False)
        self._follow_alarms()  # once the whole view is read (a node not read yet is no node cleared)
        self.synced.set()
        async for revision, events in self.etcd.watch(self.config.keys.root, revision + 1, prefix=True):
            for event in events:
                self._apply(event.kv.key, event.kv.value, event.deleted)

    def _apply(self, key: bytes, value: bytes, deleted: bool, follow_alarms: bool = True) -> None:
        keys = self.config.keys
        for prefix, table in ((keys.members, self.members), (keys.running, self.running)):
            if key.startswith(prefix):
                node = key[len(prefix):].decode(errors="replace")
                if deleted:
                    if table.pop(node, None) is not None and table is self.running:
                        for listener in self.on_stopped:
                            listener(node)
                        if follow_alarms:
                            self._follow_alarms()
                    return
                try:
                    record = json.loads(value)
                except ValueError:
                    log.error("cluster %s: unreadable record at %r", self.config.cluster_name, key)
                    return
                if isinstance(record, dict):
                    table[node] = record
                if table is self.members:
                    self._name_the_cluster()
                elif follow_alarms:
                    self._follow_alarms()
                return

    def _follow_alarms(self) -> None:
        """The other running members' alarms, from their running records, into this node's
        Alarms (which tells the connections); logged as RabbitMQ logs another node's."""
        if self.alarms is None:
            return
        before = self.alarms.others
        self.alarms.set_others({node: _resources(record) for node, record in self.running.items()
                                if node != self.config.node_name})
        after = self.alarms.others
        for node in sorted(set(before) | set(after)):
            for resource in sorted(after.get(node, frozenset()) - before.get(node, frozenset())):
                log.warning("%s resource limit alarm set on node '%s'.\n"
                            "*** Publishers will be blocked until this alarm clears ***", resource, node)
            for resource in sorted(before.get(node, frozenset()) - after.get(node, frozenset())):
                if node in self.running:
                    log.warning("%s resource limit alarm cleared on node '%s'", resource, node)
                else:
                    log.warning("%s resource limit alarm cleared for dead node '%s'", resource, node)

    def _name_the_cluster(self) -> None:
        """As RabbitMQ's default cluster name is its first node's name, every member names the
        cluster after the member that joined first (until cluster_name is set)."""
        first = min(self.members.items(), key=lambda item: (item[1].get("joined", 0), item[0]), default=None)
        if first is not None:
            self.node.default_cluster_name = first[0]


def _resources(record: dict) -> list[str]:
    """The alarms a running record lists (none in a record that lists none, or not as a list)."""
    alarms = record.get("alarms")
    return [a for a in alarms if isinstance(a, str)] if isinstance(alarms, list) else []


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
