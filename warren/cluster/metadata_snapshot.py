"""Snapshots of the cluster's metadata, and the compaction of etcd's history behind them.

etcd keeps every revision of every key until it is compacted, and the metadata log is one key
put once per change (warren.cluster.metadata_log): uncompacted, its history grows until etcd's
quota (2 GiB by default) refuses every write. So the cluster compacts it, behind a snapshot:

- One member at a time (`MetadataLog`: the first running member by name) looks every CHECK
  seconds. Once etcd's revision is 2 x `history` (warren.metadata_history) past what it last
  compacted to, it writes a snapshot of its tables (the definitions a member's journal keeps,
  with the revision of the log they include) if they changed since the latest one, then
  compacts etcd's history to the older of that snapshot's revision and etcd's revision less
  `history`: a member less than `history` revisions behind catches up from the log itself.
  It also snapshots changed tables every SNAPSHOT_EVERY seconds: another cluster on the same
  etcd compacts this one's history too (a member not behind watches from etcd's revision now,
  and is not affected).
- A member further behind (stopped or cut off from etcd for that long, or new) finds its
  revision compacted: it reads the latest snapshot and brings its tables to it (`catch_up`:
  what the snapshot lacks is deleted, what it has new or changed is put, by the commands the
  log's entries would have carried), then follows the log from the snapshot's revision.

A snapshot is zlib-compressed JSON in parts of at most PART bytes (etcd takes requests of
1.5 MiB), under a key of its revision; the head key names the latest one and its digest."""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..broker import definitions
from ..broker.metadata import commands as c
from ..broker.parameters import OPERATOR_POLICY, VHOST_LIMITS
from ..store.definitions import identity
from .etcd import Etcd, mod_revision_is, put_op

if TYPE_CHECKING:
    from ..broker.metadata.store import MetadataStore

log = logging.getLogger("warren.cluster")

PART = 512 * 1024  # bytes of a snapshot per etcd key
CHECK = 5.0        # seconds between two looks of the compacting member
SNAPSHOT_EVERY = 300.0  # seconds after which a changed table is snapshot even with no compaction due


class SnapshotMissing(Exception):
    """No snapshot, or one replaced while it was read: read the head again."""


@dataclass(frozen=True)
class Head:
    revision: int      # the metadata log's revision the snapshot includes
    parts: int
    digest: str        # sha256 of the compressed snapshot
    mod_revision: int  # the head key's own (0: no snapshot yet)


class Snapshots:
    """A cluster's snapshots in etcd (under `root`)."""

    def __init__(self, etcd: Etcd, root: bytes):
        self.etcd = etcd
        self.head_key = root + b"metadata/snapshot"
        self.parts_prefix = root + b"metadata/snapshots/"

    def _parts(self, revision: int) -> bytes:
        return self.parts_prefix + b"%020d/" % revision

    async def head(self) -> Head:
        _, kvs = await self.etcd.get(self.head_key)
        if not kvs:
            return Head(0, 0, "", 0)
        value = json.loads(kvs[0].value)
        return Head(int(value["revision"]), int(value["parts"]), str(value["digest"]), kvs[0].mod_revision)

    async def read(self) -> tuple[int, dict]:
        """(the revision, the definitions) of the latest snapshot."""
        head = await self.head()
        if not head.revision:
            raise SnapshotMissing("no snapshot of the metadata was ever written")
        _, kvs = await self.etcd.get(self._parts(head.revision), prefix=True)
        blob = b"".join(kv.value for kv in kvs)
        if len(kvs) != head.parts or hashlib.sha256(blob).hexdigest() != head.digest:
            raise SnapshotMissing(f"the snapshot at revision {head.revision} was replaced while it was read")
        return head.revision, json.loads(zlib.decompress(blob))

    async def write(self, revision: int, data: dict, before: Head) -> bool:
        """Write a snapshot of the tables at `revision` as the latest, unless another member
        replaced `before` meanwhile (False); the one before goes."""
        blob = zlib.compress(json.dumps(data, separators=(",", ":"), default=str).encode())
        parts = [blob[i:i + PART] for i in range(0, len(blob), PART)] or [b""]
        prefix = self._parts(revision)
        for n, part in enumerate(parts):
            await self.etcd.txn([], [put_op(prefix + b"%06d" % n, part)])
        head = json.dumps({"revision": revision, "parts": len(parts), "digest": hashlib.sha256(blob).hexdigest()})
        written = await self.etcd.txn([mod_revision_is(self.head_key, before.mod_revision)],
                                      [put_op(self.head_key, head.encode())])
        if not written.succeeded:  # (another member's is the latest: this one was never named)
            await self.etcd.delete_prefix(prefix)
            return False
        if before.revision and before.revision != revision:
            await self.etcd.delete_prefix(self._parts(before.revision))
        return True


# ------------------------------------------------------------------ catching up
# The order commands that delete go in: what refers to something before it.
_DELETE_ORDER = ("bindings", "queues", "exchanges", "parameters", "policies", "topic_permissions", "permissions",
                 "vhosts", "users", "global_parameters")
_REMADE = ("exchanges", "queues")  # changed ones are deleted and declared again (the others are put over)


def catch_up(store: MetadataStore, data: dict, revision: int) -> tuple[int, int]:
    """Bring this member's tables to the snapshot `data` of the log at `revision`, as the log's
    entries since its own revision would have: (objects deleted, objects put)."""
    broker = store.broker
    deletes, puts = _plan(definitions.export(broker), data)
    store.from_log = True
    try:
        for command in deletes:
            try:
                store.apply(command)
            except Exception as err:  # (gone with what held it: a vhost, an exchange)
                log.debug("catching up from a snapshot: %s: %s", command, err)
        definitions.load(broker, puts, on_error=lambda kind, item, why: log.error(
            "catching up from a snapshot: %s %s: %s", kind, item.get("name", item), why))
    finally:
        store.from_log = False
    store.applied(revision)
    store.record()  # (the definitions file is written anew)
    return len(deletes), sum(len(items) for items in puts.values())


def _plan(local: dict, snapshot: dict) -> tuple[list[c.Command], dict[str, list]]:
    """The commands that delete what the snapshot lacks (or changed beyond a put), and the
    definitions to load for what it has new or changed."""
    deletes: dict[str, list[c.Command]] = {kind: [] for kind in _DELETE_ORDER}
    puts: dict[str, list] = {}
    remade: set[tuple[str, str]] = set()  # (vhost, name) of exchanges and queues deleted to be made again
    for kind in _DELETE_ORDER:
        if kind == "bindings":
            continue
        have = _index(kind, local)
        want = _index(kind, snapshot)
        for key, item in have.items():
            if key not in want:
                deletes[kind].append(_deletion(kind, item))
            elif kind in _REMADE and _same(kind, item) != _same(kind, want[key]):
                deletes[kind].append(_deletion(kind, item))
                remade.add(key)
        puts[kind] = [item for key, item in want.items()
                      if key not in have or key in remade or (kind not in _REMADE and item != have[key])]
    have_bindings = _index("bindings", local)
    want_bindings = _index("bindings", snapshot)
    deletes["bindings"] = [_deletion("bindings", item) for key, item in have_bindings.items()
                           if key not in want_bindings]
    puts["bindings"] = [item for key, item in want_bindings.items()
                        if key not in have_bindings or (key[0], key[1]) in remade or (key[0], key[3]) in remade]
    return [command for kind in _DELETE_ORDER for command in deletes[kind]], puts


def _index(kind: str, data: dict) -> dict[Any, dict]:
    items = data.get(kind) or ()
    return {identity(kind, item): item for item in items if isinstance(item, dict)}


def _same(kind: str, item: dict) -> dict:
    """What must be equal for an exchange or queue to be the same one: a replicated queue's
    incarnation says it (its members change through its record, not the log)."""
    if kind == "queues" and item.get("incarnation"):
        return {"incarnation": item["incarnation"]}
    return item


def _deletion(kind: str, item: dict) -> c.Command:
    vhost = item.get("vhost", "/")
    if kind == "bindings":
        return c.Unbind(vhost, item["source"], item.get("destination_type", "queue"), item["destination"],
                        item.get("routing_key", ""), definitions.typed_arguments(item))
    if kind == "queues":
        return c.DeleteQueue(vhost, item["name"])
    if kind == "exchanges":
        return c.DeleteExchange(vhost, item["name"])
    if kind == "policies":
        return c.ClearPolicy(vhost, item["name"])
    if kind == "parameters":
        component = item.get("component")
        if component == OPERATOR_POLICY:
            return c.ClearPolicy(vhost, item["name"], operator=True)
        if component == VHOST_LIMITS:
            return c.SetVHostLimits(vhost, None)
        if component == "shovel":
            return c.ClearShovel(vhost, item["name"])
        return c.ClearFederationParameter(vhost, str(component), item["name"])
    if kind == "topic_permissions":
        return c.ClearTopicPermissions(item["user"], vhost, item["exchange"])
    if kind == "permissions":
        return c.ClearPermissions(item["user"], vhost)
    if kind == "vhosts":
        return c.DeleteVHost(item["name"])
    if kind == "users":
        return c.DeleteUser(item["name"])
    return c.ClearGlobalParameter(item["name"])
