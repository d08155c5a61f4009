"""The members of a cluster's quorum queues, as RabbitMQ's `rabbitmq-queues` changes and shows
them (rabbit_quorum_queue.erl, v3.10): add_member, delete_member, grow, shrink, quorum_status,
rebalance (rabbit_amqqueue.erl's), and which queues would lose their quorum if this node
stopped. Every way in (the management API's routes for warrenctl, the health check) calls these.

A change of members is a change of the queue's record in etcd (Replicas.change_members, a
guarded transaction any node may send); every node applies it from its watch: a node added
makes its replica log and follows the leader (in the ISR once caught up), a node removed stops
following and deletes its log, and the leader counts its majority over the new members.
Removing the leader moves leadership first, as Ra does: the same transaction names the first
running in-sync member leader, in a new epoch (an election, as a leader's death makes one);
rebalance moves leadership the same way, to another running in-sync member.

On a node alone a quorum queue has one member, this node: the answers are RabbitMQ's for a
one-node queue (adding another node: node_not_running; removing this one: last_node;
rebalance: every queue stays this node's), and quorum_status is refused (such a queue keeps no
replicated log to show).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..broker.errors import AMQPError
from .replicas import Record, replicas_of

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.queues.base import Queue
    from .replicas import Replicas

log = logging.getLogger("warren.cluster.queue_members")

STATUS_TIMEOUT = 5.0  # seconds quorum_status waits for the leader's answer


class MembersError(Exception):
    """A refusal, named as rabbit_quorum_queue names it (the CLI prints the name)."""

    def __init__(self, error: str, reason: str = ""):
        super().__init__(reason or error)
        self.error = error
        self.reason = reason or error


# RabbitMQ's CLI texts for the errors it words (the others print as their name).
CLASSIC_STATUS = "Cannot get quorum status of a classic queue"
CLASSIC_MEMBERS = "Cannot add members to a classic queue"  # (sic for delete_member too)
# rabbitmq-streams' (add_replica, delete_replica)
REPLICAS_OF = {("add", "classic"): "Cannot add replicas to a classic queue",
               ("add", "quorum"): "Cannot add replicas to a quorum queue",
               ("delete", "classic"): "Cannot delete replicas from a classic queue",
               ("delete", "quorum"): "Cannot delete replicas from a quorum queue"}
LAST_STREAM_MEMBER = "Cannot delete the last member of a stream"


@dataclass(frozen=True)
class Outcome:
    """One queue's line of grow and shrink: its size after (or, on an error, as it was)."""

    vhost: str
    name: str
    size: int
    error: str | None = None


def _replicated_queue(broker: Broker, vhost: str, name: str, classic_text: str, kind: str = "quorum",
                  verb: str = "add") -> Queue:
    """The queue whose members a verb for queues of `kind` changes (rabbitmq-queues' verbs:
    quorum queues; rabbitmq-streams' add_replica and delete_replica: streams)."""
    v = broker.vhosts.get(vhost)
    queue = None if v is None else v.queues.get(name)
    if queue is None:
        raise MembersError("not_found")
    if kind == "stream" and queue.queue_type in ("classic", "quorum"):
        raise MembersError(f"{queue.queue_type}_queue_not_supported", REPLICAS_OF[verb, queue.queue_type])
    if queue.queue_type == "classic":
        raise MembersError("classic_queue_not_supported", classic_text)
    if queue.queue_type != kind:
        raise MembersError("not_supported", f"{queue.describe()} is a {queue.queue_type}: only "
                                            f"{'streams' if kind == 'stream' else 'quorum queues'} have their "
                                            "members changed this way")
    return queue


def _members(broker: Broker, queue: Queue) -> tuple[str, ...]:
    return queue.members or (broker.config.node_name,)


def running_nodes(broker: Broker) -> set[str]:
    """The cluster's running members (this node counted), or this node alone."""
    replicas = replicas_of(broker)
    here = {broker.config.node_name}
    return here if replicas is None else here | set(replicas.links.membership.running)


def _record_of(broker: Broker, queue: Queue) -> tuple[Replicas, tuple[str, str]]:
    """The cluster's replicated queues and this queue's key among them."""
    replicas = replicas_of(broker)
    key = (queue.vhost.name, queue.name)
    if replicas is None or key not in replicas.records:
        raise MembersError("not_found")
    return replicas, key


async def add_member(broker: Broker, vhost: str, name: str, node: str, kind: str = "quorum") -> None:
    """rabbitmq-queues add_member; with kind "stream", rabbitmq-streams add_replica."""
    queue = _replicated_queue(broker, vhost, name, CLASSIC_MEMBERS, kind)
    if node not in running_nodes(broker):  # (before "already a member", as RabbitMQ's)
        raise MembersError("node_not_running")
    if node in _members(broker, queue):
        return  # (idempotent, as RabbitMQ)
    replicas, key = _record_of(broker, queue)

    def added(record: Record) -> Record | None:
        return None if node in record.members else replace(record, members=(*record.members, node))
    await replicas.change_members(key, added)


async def delete_member(broker: Broker, vhost: str, name: str, node: str, kind: str = "quorum") -> None:
    """rabbitmq-queues delete_member; with kind "stream", rabbitmq-streams delete_replica."""
    queue = _replicated_queue(broker, vhost, name, CLASSIC_MEMBERS, kind, "delete")
    last = MembersError("last_node") if kind == "quorum" else MembersError("last_stream_member", LAST_STREAM_MEMBER)
    if kind == "stream" and node not in running_nodes(broker):  # (rabbit_stream_queue asks first)
        raise MembersError("node_not_running")
    members = _members(broker, queue)
    if node not in members:
        return  # (idempotent, as RabbitMQ)
    if members == (node,):
        raise last
    replicas, key = _record_of(broker, queue)
    running = running_nodes(broker)

    def removed(record: Record) -> Record | None:
        if node not in record.members:
            return None
        if record.members == (node,):
            raise last
        members = tuple(n for n in record.members if n != node)
        isr = tuple(n for n in record.isr if n != node)
        if record.leader != node:
            return replace(record, members=members, isr=isr)
        # The leader goes: leadership moves first, to an in-sync member that runs (it holds
        # every committed entry), in a new epoch.
        successors = sorted(n for n in isr if n in running)
        if not successors:
            raise MembersError("no_in_sync_member", f"no other running member of {queue.describe()} holds "
                                                    "everything committed: its leader cannot be removed now")
        return Record(members, successors[0], record.epoch + 1, isr)
    await replicas.change_members(key, removed)


def _matches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error as err:
        raise MembersError("invalid_pattern", f"invalid regular expression '{pattern}': {err}") from None


async def grow(broker: Broker, node: str, strategy: str, vhost_pattern: str = ".*",
               queue_pattern: str = ".*") -> list[Outcome]:
    """A member on `node` for every matching quorum queue that has none there (`even`: only
    those with an even number of members); nothing when `node` does not run."""
    if strategy not in ("all", "even"):
        raise MembersError("invalid_strategy", f"strategy '{strategy}' is not recognised.")
    _matches(vhost_pattern, "")
    _matches(queue_pattern, "")
    if node not in running_nodes(broker):
        return []
    out = []
    for queue in _quorum_queues(broker):
        members = _members(broker, queue)
        if node in members or (strategy == "even" and len(members) % 2) \
                or not _matches(vhost_pattern, queue.vhost.name) or not _matches(queue_pattern, queue.name):
            continue
        try:
            await add_member(broker, queue.vhost.name, queue.name, node)
        except (MembersError, AMQPError) as err:
            out.append(Outcome(queue.vhost.name, queue.name, len(members), _error_name(err)))
        else:
            out.append(Outcome(queue.vhost.name, queue.name, len(members) + 1))
    return out


async def shrink(broker: Broker, node: str) -> list[Outcome]:
    """Every quorum queue's member on `node` removed (a queue whose only member it is: last_node)."""
    out = []
    for queue in _quorum_queues(broker):
        members = _members(broker, queue)
        if node not in members:
            continue
        try:
            await delete_member(broker, queue.vhost.name, queue.name, node)
        except (MembersError, AMQPError) as err:
            out.append(Outcome(queue.vhost.name, queue.name, len(members), _error_name(err)))
        else:
            out.append(Outcome(queue.vhost.name, queue.name, len(members) - 1))
    return out


def _error_name(err: Exception) -> str:
    return err.error if isinstance(err, MembersError) else str(err)


def _quorum_queues(broker: Broker) -> list[Queue]:
    return [queue for vhost in list(broker.vhosts.values()) for queue in list(vhost.queues.values())
            if queue.queue_type == "quorum"]


REBALANCE_TYPES = ("all", "classic", "quorum")


@dataclass(frozen=True)
class Leaders:
    """One line of rebalance's answer: how many of the queues rebalanced a node leads after."""

    node: str
    quorum: int
    classic: int = 0  # (replicated classic queues: mirrored ones, which Warren has none of)


@dataclass
class _LedQueue:
    """One queue in rebalance's count of its leader's queues (RabbitMQ's {Length, Q, Migrated})."""

    length: int
    queue: Queue
    tried: bool = False  # moved here, or not movable: not tried again


_rebalancing: set[int] = set()  # the brokers (their id) rebalancing now


async def rebalance(broker: Broker, queue_type: str, vhost_pattern: str = ".*",
                    queue_pattern: str = ".*") -> list[Leaders]:
    """RabbitMQ's rabbit_amqqueue:rebalance: the matching replicated queues of the type
    (`all`: quorum queues and mirrored classic ones; Warren's classic queues are never
    mirrored, so `classic` moves nothing) grouped by leader; while a node leads more than
    ceil(count / running nodes), its shortest queue (the shortest replica log here) moves to
    the member with the fewest, one queue at a time, each tried once. The answer: every node
    that leads one of them, in RabbitMQ's order (node names descending).

    A move is the record's transaction delete_member makes for a leader (a new epoch, the
    destination leading; the old leader steps down as it sees it), to a member that runs and
    is in sync (it holds every committed entry): RabbitMQ's candidates are every member but
    drained nodes, and a transfer to one that cannot lead fails; here such a member is no
    candidate, and a queue without one, or whose record changed meanwhile, is not moved. One
    rebalance at a time per node (RabbitMQ's lock is the cluster's)."""
    if queue_type not in REBALANCE_TYPES:
        raise MembersError("invalid_type", f"type {queue_type} is not supported. Try one of all, classic, quorum.")
    _matches(vhost_pattern, "")
    _matches(queue_pattern, "")
    if id(broker) in _rebalancing:
        log.warning("Queue rebalance operation is in progress, please wait.")
        raise MembersError("rebalance_in_progress")
    _rebalancing.add(id(broker))
    try:
        log.info("Starting queue rebalance operation: '%s' for vhosts matching '%s' and queues matching '%s'",
                 queue_type, vhost_pattern, queue_pattern)
        replicas = replicas_of(broker)
        here = broker.config.node_name
        by_node: dict[str, list[_LedQueue]] = {}
        queues = [] if queue_type == "classic" else [
            queue for queue in _quorum_queues(broker)
            if (replicas is None or (queue.vhost.name, queue.name) in replicas.records)
            and _matches(vhost_pattern, queue.vhost.name) and _matches(queue_pattern, queue.name)]
        for queue in queues:
            key = (queue.vhost.name, queue.name)
            leader = here if replicas is None else replicas.records[key].leader
            by_node.setdefault(leader, []).append(_LedQueue(_log_length(replicas, key), queue))
        for entries in by_node.values():
            entries.sort(key=lambda entry: entry.length)
        running = running_nodes(broker)
        most = -(-len(queues) // len(running))  # MaxQueuesDesired
        while await _move_one(broker, by_node, most, running):
            pass
        log.info("Finished queue rebalance operation")
        return [Leaders(node, len(by_node[node])) for node in sorted(by_node, reverse=True)]
    finally:
        _rebalancing.discard(id(broker))


def _log_length(replicas: Replicas | None, key: tuple[str, str]) -> int:
    """The entries this node's replica of the queue holds (RabbitMQ's queue_length: its Ra
    log's here, 0 without one)."""
    held = None if replicas is None else replicas.led.get(key) or replicas.followed.get(key)
    return 0 if held is None else held.log.end - held.log.first


async def _move_one(broker: Broker, by_node: dict[str, list[_LedQueue]], most: int, running: set[str]) -> bool:
    """maybe_migrate: the first node (by name) leading more than `most` whose shortest queue
    was not tried yet has it moved, or marked not movable. False: nothing left to try."""
    replicas = replicas_of(broker)
    for node in sorted(by_node):
        entries = by_node[node]
        if len(entries) <= most or entries[0].tried:
            continue
        entry = entries.pop(0)
        entry.tried = True
        key = (entry.queue.vhost.name, entry.queue.name)
        record = None if replicas is None else replicas.records.get(key)
        candidates = [] if record is None else [n for n in record.members
                                                if n != node and n in running and n in record.isr]
        if replicas is None or not candidates:
            by_node[node].append(entry)
            return True
        destination = min(candidates, key=lambda n: len(by_node.get(n, ())))
        log.info("Migrating queue %s from node %s with %d queues to node %s with %d queues",
                 entry.queue.describe(), node, len(entries) + 1, destination, len(by_node.get(destination, ())))

        def moved(current: Record) -> Record | None:
            if current.leader != node or destination not in current.isr or destination not in running_nodes(broker):
                return None
            return Record(current.members, destination, current.epoch + 1, current.isr)
        try:
            changed = await replicas.change_members(key, moved)
        except AMQPError as err:
            log.warning("Error migrating queue %s: %s", entry.queue.describe(), err)
            changed = None
        else:
            if changed is None:
                log.warning("Error migrating queue %s: its leader or in-sync members changed", entry.queue.describe())
        if changed is None:
            by_node[node].append(entry)
        else:
            log.info("Queue %s migrated to %s", entry.queue.describe(), destination)
            by_node.setdefault(destination, []).append(entry)
        return True
    return False


async def status(broker: Broker, vhost: str, name: str) -> list[dict[str, Any]]:
    """quorum_status's rows, one per member in the record's order, as the leader knows them."""
    queue = _replicated_queue(broker, vhost, name, CLASSIC_STATUS)
    replicas = replicas_of(broker)
    if replicas is None or (vhost, name) not in replicas.records:
        raise MembersError("not_replicated", f"{queue.describe()} has a single member on a node alone: "
                                             "it keeps no replicated log to show")
    leader = replicas.records[(vhost, name)].leader
    if leader == broker.config.node_name:
        return replicas.status((vhost, name))
    peer = replicas.links.peer(leader)
    answer: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()

    def done(result: Any, error: BaseException | None) -> None:
        if not answer.done():
            answer.set_exception(error) if error is not None else answer.set_result(result)
    peer.request({"op": "quorum_status", "vhost": vhost, "queue": name}, done, lambda meta: list(meta["rows"]))
    try:
        return await asyncio.wait_for(answer, STATUS_TIMEOUT)
    except asyncio.TimeoutError:
        raise MembersError("timeout", f"the leader of {queue.describe()}, node {leader}, did not answer") from None


def quorum_critical(broker: Broker) -> list[Queue]:
    """This node's quorum queues (it holds a member) that would lose their quorum if it
    stopped: those with no more members running than a bare majority (RabbitMQ's
    filter_quorum_critical)."""
    here = broker.config.node_name
    running = running_nodes(broker)
    out = []
    for queue in _quorum_queues(broker):
        members = _members(broker, queue)
        if here in members and len([n for n in members if n in running]) <= len(members) // 2 + 1:
            out.append(queue)
    return out


def single_node_cluster(broker: Broker) -> bool:
    """Whether this node is its cluster's only member (RabbitMQ's is_single_node_cluster)."""
    replicas = replicas_of(broker)
    return replicas is None or set(replicas.links.membership.members) <= {broker.config.node_name}
