"""The node's metadata and the one place it changes: MetadataStore.apply carries out a
command (warren.broker.metadata.commands) and records what it changed for the definitions
journal.

Every way in - the AMQP channel through the operations layer, the management API, warrenctl,
definitions imports, recovery at start-up, shovels and the queues' own rules (auto-delete,
exclusive queues, x-expires) - changes metadata by applying a command; nothing else writes
these tables. The journal on disk holds the result of each command (the changed objects in
the definitions format, warren.store.definitions), recovery installs the snapshot it makes
(warren.broker.definitions.load, which applies commands), and an export takes one.

Reads stay direct (`store.vhosts[name].queues`...): a lookup on the publish path must not
pay for a call. A cluster puts the commands in its consensus log before they are applied
here, on every node; a single node applies them at once."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from ..auth import Permission, TopicPermission, User
from ..definitions import changes, export
from ..errors import internal_error, not_found
from ..policy import apply_all
from ..queues import checked_type
from ..vhost import VHost
from .. import federation, shovel
from . import change, commands as c
from .change import ClusterLog

if TYPE_CHECKING:
    from ..node import Node
    from ...store.definitions import DefinitionsFile

log = logging.getLogger("warren.definitions")
T = TypeVar("T")


class Replicas(Protocol):
    """A cluster member's replicated queues, as the cluster's layer keeps them
    (warren.cluster.replicas.Replicas)."""

    def stand_in(self, vhost: VHost, cmd: c.DeclareQueue) -> Any:
        """The stand-in of a new replicated queue another node leads (and, on one of its
        members, its replica here)."""

    def replica(self, vhost: VHost, cmd: c.DeclareQueue) -> tuple[Any, type | None] | None:
        """This node's own copy of a new replicated queue: its store and, if not its type's,
        its class; None when this node keeps a stand-in."""

    def removed(self, vhost: str, name: str) -> None:
        """A replicated queue was deleted: its replica here goes."""


def _log_failure(result: Any, error: BaseException | None) -> None:
    if error is not None:
        log.error("a change this node made could not go through the cluster's log: %s", error)


class MetadataStore:
    """vhosts (with their exchanges, queues, bindings, policies, limits and shovels), users,
    permissions, topic permissions and global parameters."""

    def __init__(self, broker: Node):
        self.broker = broker  # the node the vhosts' queues run on (stores, timers, counters)
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}
        # (user, vhost, exchange) -> TopicPermission; empty on most brokers, so a publish to a
        # topic exchange tests it for truth before looking its key up.
        self.topic_permissions: dict[tuple[str, str, str], TopicPermission] = {}
        # name -> JSON value; cluster_name among them once it is set (and only then exported).
        self.global_parameters: dict[str, Any] = {}
        # Where durable definitions are saved, or None without a data dir. apply() only
        # records what changed (changes, or all_changed); the session layer calls flush()
        # before it sends any reply, so a declare-ok follows the write.
        self.disk: DefinitionsFile | None = None
        self.changes: dict = {}  # (kind, key) -> Binding or None
        self.all_changed = False
        self.save_failing = False
        # A cluster member's log (warren.cluster.metadata_log), None on a node alone. On a
        # member every change goes through it, and apply() is only what the log calls
        # (from_log) or local recovery: a change applied here alone would be this node's only.
        self.log: ClusterLog | None = None
        self.from_log = False
        self.revision = 0  # the last change of the cluster's log these tables include
        # On a cluster member, what makes the stand-in of a queue of another node (given by
        # the cluster's layer, above this one: warren.cluster.remote_queue).
        self.stand_in: Callable[[VHost, c.DeclareQueue], Any] | None = None
        # A cluster member's replicated queues (warren.cluster.replicas): the store of one this
        # node leads, the stand-in (and replica) of one another node leads.
        self.replicas: Replicas | None = None

    @property
    def member(self) -> bool:
        """Whether this node is a cluster member, from before its definitions are recovered (its
        log is set later, when the services start: a save before then must keep what a
        member's journal keeps, or the next start recovers its replicated queues as local ones)."""
        return self.replicas is not None

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last flush."""
        return self.all_changed or bool(self.changes)

    @property
    def cluster_name(self) -> str:
        name = self.global_parameters.get(c.CLUSTER_NAME)
        if isinstance(name, str):
            return name
        config = self.broker.config
        return config.cluster_name or config.default_cluster_name or config.node_name

    # ------------------------------------------------------------------ commands
    def apply(self, command: c.Command) -> Any:
        """Carry out a command; what it returns is the command's (see each handler)."""
        if self.log is not None and not self.from_log:
            raise internal_error(f"{type(command).__name__} would change this node's metadata alone: "
                                 "on a cluster it must go through the cluster's log")
        result = _HANDLERS[type(command)](self, command)
        if type(command) in _FEDERATION_INPUTS:
            vhost = self.vhosts.get(command.policy.vhost if isinstance(command, c.SetPolicy)
                                    else command.vhost)  # type: ignore[union-attr]
            if vhost is not None and (vhost.federation or vhost.federation_links):
                federation.reconcile(self.broker, vhost)
        return result

    def run(self, operation: change.Change[T]) -> T:
        """An operation's change (warren.broker.metadata.change), carried out at once."""
        return change.run(self, operation)

    def submit(self, command: c.Command, then: Callable[[], None] | None = None) -> None:
        """A change the node makes on its own (an exclusive queue's owner gone, an auto-delete,
        x-expires): applied at once alone, sent to the cluster's log on a member; `then()`
        once this node has applied it (or it failed)."""
        if self.log is None:
            self.apply(command)
            if then is not None:
                then()
            return

        def done(result: Any, error: BaseException | None) -> None:
            _log_failure(result, error)
            if then is not None:
                then()
        self.log.submit(lambda: change.command(command), done)

    def vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise not_found(f"no vhost '{name}'")
        return vhost

    def _put_vhost(self, cmd: c.PutVHost) -> bool:
        """Whether the vhost was created."""
        vhost = self.vhosts.get(cmd.name)
        created = changed = vhost is None
        if vhost is None:
            vhost = self.vhosts[cmd.name] = VHost(cmd.name, self.broker)
            vhost.default_queue_type = cmd.default_queue_type
        for attribute in ("description", "tags", "missing_exchange"):
            value = getattr(cmd, attribute)
            if value is not c.KEEP and value != getattr(vhost, attribute):
                setattr(vhost, attribute, value)
                changed = True
        if changed:
            self.record("vhost", cmd.name)
        return created

    def _delete_vhost(self, cmd: c.DeleteVHost) -> VHost | None:
        vhost = self.vhosts.get(cmd.name)
        if vhost is None:
            return None
        for queue in list(vhost.queues.values()):  # their stores (and files) go too
            vhost.remove_queue(queue)
        del self.vhosts[cmd.name]
        shovel.vhost_deleted(self.broker, vhost)  # its shovel parameters go with it
        federation.vhost_deleted(vhost)
        for exchange in vhost.exchanges.values():  # (their counts stay in the node's totals)
            self.broker.stats.retired.exchange_deleted(exchange)
        for key in [k for k in self.permissions if k[1] == cmd.name]:
            del self.permissions[key]
        for tkey in [k for k in self.topic_permissions if k[1] == cmd.name]:
            del self.topic_permissions[tkey]
        self.record()
        return vhost

    def _put_user(self, cmd: c.PutUser) -> bool:
        """Whether the user is new."""
        user, old = cmd.user, self.users.get(cmd.user.name)
        if old is not None and not user.limits:  # a new password or tags keep the limits (RabbitMQ)
            user.limits = old.limits
        self.users[user.name] = user
        self.record("user", user.name)
        return old is None

    def _delete_user(self, cmd: c.DeleteUser) -> User | None:
        user = self.users.pop(cmd.name, None)
        if user is not None:
            for key in [k for k in self.permissions if k[0] == cmd.name]:
                del self.permissions[key]
                self.record("permission", key)
            for tkey in [k for k in self.topic_permissions if k[0] == cmd.name]:
                del self.topic_permissions[tkey]
                self.record("topic_permission", tkey)
            self.record("user", cmd.name)
        return user

    def _set_user_limits(self, cmd: c.SetUserLimits) -> None:
        user = self.users[cmd.user]
        if user.limits != cmd.limits:
            user.limits = dict(cmd.limits)
            self.record("user", cmd.user)

    def _set_permissions(self, cmd: c.SetPermissions) -> None:
        self.permissions[(cmd.user, cmd.vhost)] = Permission(cmd.configure, cmd.write, cmd.read)
        self.record("permission", (cmd.user, cmd.vhost))

    def _clear_permissions(self, cmd: c.ClearPermissions) -> bool:
        if self.permissions.pop((cmd.user, cmd.vhost), None) is None:
            return False
        self.record("permission", (cmd.user, cmd.vhost))
        return True

    def _set_topic_permissions(self, cmd: c.SetTopicPermissions) -> None:
        key = (cmd.user, cmd.vhost, cmd.exchange)
        self.topic_permissions[key] = TopicPermission(cmd.write, cmd.read, cmd.user, cmd.vhost)
        self.record("topic_permission", key)

    def _clear_topic_permissions(self, cmd: c.ClearTopicPermissions) -> bool:
        keys = ([(cmd.user, cmd.vhost, cmd.exchange)] if cmd.exchange is not None else
                [k for k in self.topic_permissions if k[0] == cmd.user and k[1] == cmd.vhost])
        found = False
        for key in keys:
            if self.topic_permissions.pop(key, None) is not None:
                self.record("topic_permission", key)
                found = True
        return found

    def _declare_exchange(self, cmd: c.DeclareExchange):
        """(exchange, created)."""
        return self.vhost(cmd.vhost).declare_exchange(cmd.name, cmd.type, cmd.durable, cmd.auto_delete,
                                                      cmd.internal, cmd.arguments)

    def _delete_exchange(self, cmd: c.DeleteExchange) -> bool:
        """Whether it existed."""
        return self.vhost(cmd.vhost).delete_exchange(cmd.name, cmd.if_unused)

    def _declare_queue(self, cmd: c.DeclareQueue):
        """(queue, created). A queue of another node (on a cluster) gets its stand-in here."""
        vhost = self.vhost(cmd.vhost)
        if cmd.members and cmd.name not in vhost.queues:
            if self.replicas is None:
                raise internal_error(f"queue '{cmd.name}' is replicated: this node is not in a cluster")
            queue_type = checked_type(vhost.name, cmd.name, cmd.durable, cmd.owner is not None, cmd.auto_delete,
                                      cmd.arguments)
            queue_type.check_store_arguments(cmd.arguments or {})  # (make_store's checks: the store is made here)
            replica = self.replicas.replica(vhost, cmd)
            if replica is None:
                q = self.replicas.stand_in(vhost, cmd)
                vhost.add_queue(q)
                return q, True
            q, created = vhost.declare_queue(cmd.name, cmd.durable, cmd.owner, cmd.auto_delete, cmd.arguments,
                                             *replica)
            q.members, q.incarnation = cmd.members, cmd.incarnation
            return q, created
        if cmd.node not in (None, self.broker.config.node_name) and cmd.name not in vhost.queues:
            if self.stand_in is None:
                raise internal_error(f"queue '{cmd.name}' lives on node '{cmd.node}': this node is not in a cluster")
            # (Checked as its home checks it: a queue its home refuses is made nowhere.)
            checked_type(vhost.name, cmd.name, cmd.durable, cmd.owner is not None, cmd.auto_delete, cmd.arguments)
            q = self.stand_in(vhost, cmd)
            vhost.add_queue(q)
            return q, True
        return vhost.declare_queue(cmd.name, cmd.durable, cmd.owner, cmd.auto_delete, cmd.arguments)

    def _delete_queue(self, cmd: c.DeleteQueue) -> int:
        """The ready count the queue had (0: there was none)."""
        vhost = self.vhosts.get(cmd.vhost)
        queue = None if vhost is None else vhost.queues.get(cmd.name)
        if queue is None:
            return 0
        count = vhost.remove_queue(queue)  # type: ignore[union-attr]
        if self.replicas is not None:
            self.replicas.removed(cmd.vhost, cmd.name)
        return count

    def replace_queue(self, vhost: str, name: str, queue: Any) -> None:
        """A replicated queue's leader moved to or from this node (the cluster's record of it,
        not a command: every node learns it from etcd): `queue` replaces what this node held."""
        v = self.vhost(vhost)
        old = v.queues.get(name)
        if old is not None:
            v.replace_queue(old, queue)

    def _ends(self, cmd: c.Bind | c.Unbind):
        vhost = self.vhost(cmd.vhost)
        source = vhost.exchange(cmd.source)  # a missing source is reported first
        dest = vhost.queue(cmd.destination) if cmd.dest_kind == "queue" else vhost.exchange(cmd.destination)
        return vhost, source, dest

    def _bind(self, cmd: c.Bind) -> None:
        vhost, source, dest = self._ends(cmd)
        vhost.bind(source, dest, cmd.routing_key, cmd.arguments or {})

    def _unbind(self, cmd: c.Unbind) -> None:
        vhost, source, dest = self._ends(cmd)
        vhost.unbind(source, dest, cmd.routing_key, cmd.arguments or {})

    def _set_policy(self, cmd: c.SetPolicy) -> bool:
        """Whether the policy is new."""
        vhost = self.vhost(cmd.policy.vhost)
        table = vhost.operator_policies if cmd.operator else vhost.policies
        created = cmd.policy.name not in table
        table[cmd.policy.name] = cmd.policy
        apply_all(vhost)
        self.record("operator_policy" if cmd.operator else "policy", (vhost.name, cmd.policy.name))
        return created

    def _clear_policy(self, cmd: c.ClearPolicy) -> bool:
        vhost = self.vhost(cmd.vhost)
        table = vhost.operator_policies if cmd.operator else vhost.policies
        if table.pop(cmd.name, None) is None:
            return False
        apply_all(vhost)
        self.record("operator_policy" if cmd.operator else "policy", (vhost.name, cmd.name))
        return True

    def _set_vhost_limits(self, cmd: c.SetVHostLimits) -> bool:
        """Whether the vhost had no "limits" parameter before."""
        vhost = self.vhost(cmd.vhost)
        had = vhost.limits is not None
        vhost.limits = None if cmd.limits is None else dict(cmd.limits)
        self.record("vhost_limits", vhost.name)
        return not had

    def _set_shovel(self, cmd: c.SetShovel) -> bool:
        """Whether the shovel is new. The same value again changes nothing (RabbitMQ notifies
        only a changed parameter)."""
        vhost = self.vhost(cmd.vhost)
        old = vhost.shovels.get(cmd.name)
        if old is not None and old.value == cmd.value:
            return False
        if old is not None:
            old.stop()
        worker = vhost.shovels[cmd.name] = shovel.Shovel(self.broker, vhost.name, cmd.name, cmd.value, cmd.config)
        self.record()  # rare: the next flush rewrites the definitions
        worker.start_soon()
        return old is None

    def _clear_shovel(self, cmd: c.ClearShovel) -> bool:
        """Whether there was one: it stops (what it has in flight is settled as its confirms
        arrive, what it holds undelivered goes back to the source)."""
        vhost = self.vhosts.get(cmd.vhost)
        worker = None if vhost is None else vhost.shovels.pop(cmd.name, None)
        if worker is None:
            return False
        worker.stop()
        self.record()
        return True

    def _set_federation(self, cmd: c.SetFederationParameter) -> bool:
        """Whether it is new."""
        vhost = self.vhost(cmd.vhost)
        key = (cmd.component, cmd.name)
        new = key not in vhost.federation
        vhost.federation[key] = cmd.value
        self.record()
        return new

    def _clear_federation(self, cmd: c.ClearFederationParameter) -> bool:
        vhost = self.vhosts.get(cmd.vhost)
        if vhost is None or vhost.federation.pop((cmd.component, cmd.name), None) is None:
            return False
        self.record()
        return True

    def _set_global(self, cmd: c.SetGlobalParameter) -> bool:
        """Whether it is new. A new cluster_name is announced by new connections."""
        created = cmd.name not in self.global_parameters
        self.global_parameters[cmd.name] = cmd.value
        self.record("global_parameter", cmd.name)
        return created

    def _clear_global(self, cmd: c.ClearGlobalParameter) -> bool:
        if self.global_parameters.pop(cmd.name, _ABSENT) is _ABSENT:
            return False
        self.record("global_parameter", cmd.name)
        return True

    def _batch(self, cmd: c.Batch) -> list:
        """Each command in order, each as apply() carries it out (federation's links
        reconciled after each); the first failure stops the batch, what it did stays."""
        results = []
        for index, command in enumerate(cmd.commands):
            try:
                results.append(self.apply(command))
            except Exception as err:
                raise c.BatchStopped(index, err) from err
        return results

    # ------------------------------------------------------------------ the journal
    def record(self, kind: str | None = None, key=None, binding=None) -> None:
        """A command changed something that survives a restart (no I/O here): the object `key`
        of `kind` ("vhost": name, "user": name, "permission": (user, vhost),
        "topic_permission": (user, vhost, exchange), "vhost_limits": vhost name,
        "global_parameter": name, "policy"/"operator_policy"/"exchange"/"queue": (vhost,
        name), "binding": (vhost, source, Binding.key) with the Binding), or, without a kind,
        anything (the next flush rewrites all definitions: for rare, sweeping changes)."""
        if kind is None or self.disk is None:
            self.all_changed = True
        elif not self.all_changed:
            self.changes[(kind, key)] = binding

    def applied(self, revision: int) -> None:
        """The tables include the cluster log's changes up to `revision` (saved with them)."""
        self.revision = revision
        self.record("cluster", "revision")

    def recovered(self, complete: bool) -> None:
        """Recovery replayed what the disk holds: nothing to write, unless something could not
        be recovered (then the next flush rewrites the file, so that it matches the tables)."""
        self.flushed()
        if not complete:
            self.record()

    def flushed(self) -> None:
        """The stored definitions match the broker (nothing left to write)."""
        self.all_changed = False
        self.changes = {}

    def flush(self) -> None:
        """Make the definitions changed since the last flush durable: the journal gets one
        record per changed object (cost independent of how many definitions exist); a store
        without a journal, or a sweeping change, gets all the definitions."""
        if not self.dirty:
            return
        disk = self.disk
        if disk is None:
            self.flushed()
            return
        append: Callable | None = getattr(disk, "append", None)
        try:
            if self.all_changed or append is None:
                disk.save(export(self.broker))
            else:
                try:
                    append(changes(self.broker, self.changes))
                except BaseException:
                    # The journal may hold a torn record: the next try rewrites everything.
                    self.all_changed = True
                    self.changes = {}
                    raise
        except (OSError, TypeError, ValueError) as err:
            if not self.save_failing:  # once, not on every retry
                log.error("cannot save definitions to %s: %s", getattr(disk, "path", disk), err)
            self.save_failing = True
            return  # still dirty: the next flush tries again
        if self.save_failing:
            log.info("definitions saved again to %s", getattr(disk, "path", disk))
            self.save_failing = False
        self.flushed()
        if append is not None and disk.needs_compaction():
            try:
                disk.save(export(self.broker))
            except (OSError, TypeError, ValueError) as err:
                # The changes are durable in the journal; compaction is tried again later.
                log.error("cannot compact definitions into %s: %s", getattr(disk, "path", disk), err)


_ABSENT = object()

_HANDLERS: dict[type, Callable[[MetadataStore, Any], Any]] = {
    c.PutVHost: MetadataStore._put_vhost, c.DeleteVHost: MetadataStore._delete_vhost,
    c.PutUser: MetadataStore._put_user, c.DeleteUser: MetadataStore._delete_user,
    c.SetUserLimits: MetadataStore._set_user_limits,
    c.SetPermissions: MetadataStore._set_permissions, c.ClearPermissions: MetadataStore._clear_permissions,
    c.SetTopicPermissions: MetadataStore._set_topic_permissions,
    c.ClearTopicPermissions: MetadataStore._clear_topic_permissions,
    c.DeclareExchange: MetadataStore._declare_exchange, c.DeleteExchange: MetadataStore._delete_exchange,
    c.DeclareQueue: MetadataStore._declare_queue, c.DeleteQueue: MetadataStore._delete_queue,
    c.Bind: MetadataStore._bind, c.Unbind: MetadataStore._unbind,
    c.SetPolicy: MetadataStore._set_policy, c.ClearPolicy: MetadataStore._clear_policy,
    c.SetVHostLimits: MetadataStore._set_vhost_limits,
    c.SetShovel: MetadataStore._set_shovel, c.ClearShovel: MetadataStore._clear_shovel,
    c.SetFederationParameter: MetadataStore._set_federation,
    c.ClearFederationParameter: MetadataStore._clear_federation,
    c.SetGlobalParameter: MetadataStore._set_global, c.ClearGlobalParameter: MetadataStore._clear_global,
    c.Batch: MetadataStore._batch,
}
# The commands that may start, stop or change federation links (or their bindings).
_FEDERATION_INPUTS = frozenset({c.SetPolicy, c.ClearPolicy, c.DeclareExchange, c.DeleteExchange, c.DeclareQueue,
                                c.DeleteQueue, c.Bind, c.Unbind, c.SetFederationParameter,
                                c.ClearFederationParameter})
