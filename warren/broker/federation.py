"""Federation (RabbitMQ's federation plugin): an exchange or queue that a policy federates
with upstreams (warren.broker.federation_upstreams) gets one link per upstream, a client of
the operations layer here and of an AMQP connection to the upstream broker.

An exchange link is a shovel (warren.broker.shovel.Shovel: the same delivery, settlement
and restart rules, ack-mode on-confirm by default) whose source is a queue it declares on
the upstream, "federation: X -> CLUSTER[:VHOST:X]", bound through an internal exchange of
type x-federation-upstream to the upstream exchange with every binding of the downstream
exchange (its routing key and arguments, an x-bound-from entry prepended), and whose
destination is the downstream exchange here: each message is republished with its routing
key and an x-received-from entry prepended, unless it has made max-hops hops or has been
here before. Bindings made and removed downstream are mirrored upstream as they happen.
(rabbit_federation_exchange_link.) A queue link (rabbit_federation_queue_link) consumes from
the upstream queue, with x-priority -1, only while the queue here is empty and has a consumer
with capacity, and moves what it gets into that queue.

Links follow the metadata: after every command that can change them (policies, upstream
parameters, exchanges, bindings) `reconcile` starts what should run and stops what should
not; a stopped link deletes what it declared upstream (resource-cleanup-mode default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from ..amqp.codec import shortstr, typed_int
from ..amqp import reencode as rt
from ..amqp.uri import Direct, Network, parse as parse_uri, remove_credentials
from ..store.settlement import SETTLED, Settlement
from . import ops
from .erlhash import Atom, phash2
from .exchanges.base import freeze
from .federation_plan import ExchangePlan, QueuePlan
from .federation_headers import bound_from, queue_link_header, should_forward, with_received_from
from .federation_upstreams import Upstream, upstreams_for
from .links import link_key
from .policy import FEDERATION_KEYS
from .shovel import Shovel
from .shovel_config import Config

if TYPE_CHECKING:
    from ..amqp.message import Message
    from ..store.queued_message import QueuedMessage
    from .node import Node
    from .ports import Timer
    from .shovel import RemoteDelivery
    from .shovel_links import FederationUpstream, Opened, ShovelLinks, UpstreamQueue
    from .vhost import VHost

PURPOSE = ("x-internal-purpose", "federation")
DEMAND_CHECK = 0.05  # seconds between a queue link's looks at its queue's consumers


class FederationLink(Shovel):
    """One upstream of one federated exchange or queue: a shovel from the upstream (its
    source, opened by the node's ShovelLinks) to the exchange or queue here."""

    kind = ""  # "exchange" or "queue"

    def __init__(self, broker: Node, vhost: str, target: str, upstream: Upstream, policy: str, config: Config):
        super().__init__(broker, vhost, f"{target} -> {upstream.name}", None, config)
        self.target = target      # the federated exchange's or queue's name
        self.upstream = upstream
        self.policy = policy
        self.upstream_vhost = ""
        self.error: str | None = None

    @property
    def link_key(self) -> str:
        return link_key("federation", self.kind, self.vhost, self.target, self.upstream.name)

    def describe(self) -> str:
        return (f"Federation link for {self.kind} '{self.target}' in vhost '{self.vhost}' "
                f"(upstream '{self.upstream.name}')")

    @property
    def connection_name(self) -> str:
        return f"Federation link (upstream: {self.upstream.name}, policy: {self.policy})"

    def _endpoint(self, uri: str) -> Direct | Network:
        # An upstream URI without a vhost means the downstream's (rabbit_federation_upstream:to_params).
        return parse_uri(uri, self.vhost)

    def _source_started(self, queue_length: int) -> bool:
        self.error = None
        return super()._source_started(0)

    def _link_failed(self, side: str, endpoint: Network, reason: str) -> None:
        self.error = reason  # (a federation link's status says why, unlike a shovel's)
        super()._link_failed(side, endpoint, reason)

    def remote_closed(self, end, reason: str) -> None:
        if end is self.src_end or end is self.dest_end:
            self.error = reason
        super().remote_closed(end, reason)

    def _received_from(self, qm: QueuedMessage | RemoteDelivery) -> list[tuple[bytes, bytes]]:
        """The table this link puts first in x-received-from: the upstream's URI (without
        credentials) and the federated exchange's or queue's name (rabbit_federation_upstream:
        params_table), whether it came redelivered."""
        return [(b"uri", rt.longstr_value(remove_credentials(self.src_uri).encode())),
                (self.kind.encode(), rt.longstr_value(self.target.encode())),
                (b"redelivered", b"t\x01" if getattr(qm, "redelivered", False) else b"t\x00")]

    def stop(self, cleanup: bool = True) -> None:
        """Stop for good; with `cleanup` (resource-cleanup-mode default) what it declared
        upstream for itself goes too."""
        end = cast("FederationUpstream | UpstreamQueue | None", self.src_end)
        if end is not None and cleanup and self.upstream.resource_cleanup_mode != "never":
            end.cleanup()
        super().stop()

    def link_status(self, node: str) -> dict:
        """As /api/federation-links shows it (rabbit_federation_status, formatted by the
        management plugin)."""
        status = "running" if self.state == "running" else ("error" if self.error else "starting")
        out: dict[str, Any] = {"node": node, self.kind: self.target, f"upstream_{self.kind}": self.upstream_name}
        if self.kind == "queue":
            out["consumer_tag"] = self.upstream.consumer_tag
        out.update({"type": self.kind, "vhost": self.vhost, "upstream": self.upstream.name, "id": link_id(self),
                    "status": status})
        if status == "running":
            out["local_connection"] = self.connection_name
        if status == "error":
            out["error"] = self.error
        out.update({"uri": remove_credentials(self.src_uri), "timestamp": self.timestamp})
        return out

    @property
    def upstream_name(self) -> str:
        """What the federated exchange or queue is called upstream."""
        return self.upstream.exchange_name if self.kind == "exchange" else self.upstream.queue_name

    def restarted(self) -> FederationLink:
        """A new link for the same target and upstream (restart_federation_link)."""
        raise NotImplementedError


class ExchangeLink(FederationLink):
    """One upstream of one federated exchange."""

    kind = "exchange"

    def __init__(self, broker: Node, vhost: str, exchange: str, upstream: Upstream, policy: str):
        config = Config(src_uris=upstream.uris, dest_uris=("amqp:///" + quote(vhost, safe=""),),
                        dest_exchange=exchange, ack_mode=upstream.ack_mode, prefetch=upstream.prefetch_count,
                        reconnect_delay=upstream.reconnect_delay)
        super().__init__(broker, vhost, exchange, upstream, policy, config)
        self.exchange = exchange
        # The internal exchange's suffix last set up (the next start takes the other). Kept in
        # memory only: after a restart here the upstream end sees which one is in use.
        self.suffix = "A"
        self.upstream_cluster: str | None = None  # the upstream's cluster_name (server properties)
        self.bound: set[tuple[str, Any]] = set()  # (routing key, frozen arguments) bound upstream
        self.plan: ExchangePlan | None = None

    def restarted(self) -> ExchangeLink:
        fresh = ExchangeLink(self.broker, self.vhost, self.exchange, self.upstream, self.policy)
        fresh.suffix = self.suffix
        return fresh

    # ----------------------------------------------------------- starting
    def _open_source(self, links: ShovelLinks, endpoint: Network, opened: Opened) -> None:
        self.upstream_vhost = endpoint.vhost
        self.plan = self._plan(endpoint)
        self.config.src_queue = self.plan.queue
        links.open_upstream(self, endpoint, self.plan, opened)

    def _plan(self, endpoint: Network) -> ExchangePlan:
        x = self.broker.vhosts[self.vhost].exchanges[self.exchange]
        up = self.upstream
        cluster = self.broker.cluster_name
        queue = upstream_queue_name(up.exchange_name, endpoint.vhost, self.exchange, self.vhost, cluster)
        old = self.suffix
        new = "B" if old == "A" else "A"
        queue_args: dict[str, Any] = {}
        if up.expires is not None:
            queue_args["x-expires"] = typed_int("long", int(up.expires))
        if up.message_ttl is not None:
            queue_args["x-message-ttl"] = typed_int("long", int(up.message_ttl))
        if up.ha_policy is not None:
            queue_args["x-ha-policy"] = up.ha_policy
        queue_args[PURPOSE[0]] = PURPOSE[1]
        return ExchangePlan(
            exchange=up.exchange_name, exchange_type=x.type_name, durable=x.durable, auto_delete=x.auto_delete,
            internal=x.internal, exchange_arguments=dict(x.arguments), queue=queue, queue_arguments=queue_args,
            internal_exchange=f"{queue} {new}", old_internal_exchange=f"{queue} {old}",
            internal_arguments={"x-max-hops": typed_int("long", int(up.max_hops)), "x-downstream-name": cluster,
                                "x-downstream-vhost": self.vhost, PURPOSE[0]: PURPOSE[1]},
            # (an exchange link's consumer has a server-named tag: consumer-tag is a queue link's)
            prefetch=int(up.prefetch_count), no_ack=up.ack_mode == "no-ack", consumer_tag="",
            bindings=self._upstream_bindings(new), bind_nowait=up.bind_nowait,
            old_bindings=self._upstream_bindings(old))

    def _source_started(self, queue_length: int) -> bool:
        if self.plan is not None:
            # (set up: the active one now; the end may have swapped the plan's two)
            self.suffix = self.plan.internal_exchange[-1]
        self.bound = {(key, freeze(args)) for key, args in self.plan.bindings} if self.plan else set()
        end = cast("FederationUpstream | None", self.src_end)
        self.upstream_cluster = end.cluster_name if end is not None else None
        started = super()._source_started(queue_length)
        self.sync_bindings()  # (bindings made while it connected)
        return started

    # ----------------------------------------------------------- bindings
    def _upstream_bindings(self, suffix: str) -> list[tuple[str, dict]]:
        """The downstream exchange's bindings as this link binds them upstream (each (key,
        arguments) once; those that should go no further left out)."""
        vhost = self.broker.vhosts.get(self.vhost)
        x = vhost.exchanges.get(self.exchange) if vhost is not None else None
        if x is None:
            return []
        cluster = self.broker.cluster_name
        down = f"{self.vhost}:{self.exchange} {suffix}"
        seen: dict[tuple[str, Any], tuple[str, dict]] = {}
        for b in x.bindings.values():
            args = bound_from(b.arguments, int(self.upstream.max_hops), self.upstream_cluster, self.upstream_vhost,
                              cluster, self.vhost, down)
            if args is None:
                continue
            seen.setdefault((b.routing_key, freeze(args)), (b.routing_key, args))
        return list(seen.values())

    def sync_bindings(self) -> None:
        """Bind upstream what is bound here and is not there yet, unbind what is gone."""
        end = cast("FederationUpstream | None", self.src_end)
        if end is None or not self.active:
            return
        wanted = {(key, freeze(args)): (key, args) for key, args in self._upstream_bindings(self.suffix)}
        for ident in self.bound - wanted.keys():
            end.unbind(ident[0], dict(ident[1]))
        for ident in wanted.keys() - self.bound:
            end.bind(*wanted[ident])
        self.bound = set(wanted)

    # ----------------------------------------------------------- forwarding
    def _forward(self, qm: QueuedMessage | RemoteDelivery) -> Settlement:
        message: Message = qm.message
        if not should_forward(message.headers, int(self.upstream.max_hops), self.broker.cluster_name, self.vhost):
            return SETTLED  # (acked and dropped, as RabbitMQ's link does)
        info = self._received_from(qm)
        if self.upstream_cluster is not None:
            info.append((b"cluster-name", rt.longstr_value(self.upstream_cluster.encode())))
        info.append((b"vhost", rt.longstr_value(self.upstream_vhost.encode())))
        header = with_received_from(message.header, info, clear_user_id=not self.upstream.trust_user_id)
        assert self.dest_actor is not None
        route = message.route if message.exchange == self.exchange else (
            shortstr(self.exchange) + shortstr(message.routing_key))
        ops.check_message_size(self.broker, len(message.body))
        return ops.publish(self.dest_actor, self.exchange, message.routing_key, route, header, message.body)[2]


class QueueLink(FederationLink):
    """One upstream of one federated queue (rabbit_federation_queue_link): it consumes from
    the upstream queue (with x-priority -1, so the upstream's own consumers come first) only
    while the queue here is empty and has a consumer with capacity, and moves what it gets
    into the queue here through the default exchange."""

    kind = "queue"

    def __init__(self, broker: Node, vhost: str, queue: str, upstream: Upstream, policy: str):
        config = Config(src_uris=upstream.uris, dest_uris=("amqp:///" + quote(vhost, safe=""),),
                        dest_queue=None, dest_exchange="", dest_exchange_key=queue, ack_mode=upstream.ack_mode,
                        prefetch=upstream.prefetch_count, reconnect_delay=upstream.reconnect_delay,
                        src_queue=upstream.queue_name)
        super().__init__(broker, vhost, queue, upstream, policy, config)
        self.queue_name = queue
        self.consuming = False
        self._watch: Timer | None = None

    def restarted(self) -> QueueLink:
        return QueueLink(self.broker, self.vhost, self.queue_name, self.upstream, self.policy)

    def eligible(self) -> bool:
        """Where the queue is served (on a cluster: a classic queue's home, a quorum queue's
        leader), which knows its consumers' demand, as RabbitMQ runs the link on the queue's
        node."""
        vhost = self.broker.vhosts.get(self.vhost)
        queue = vhost.queues.get(self.queue_name) if vhost is not None else None
        return queue is not None and queue.writable_here

    def _open_source(self, links: ShovelLinks, endpoint: Network, opened: Opened) -> None:
        self.upstream_vhost = endpoint.vhost
        q = self.broker.vhosts[self.vhost].queues[self.queue_name]
        plan = QueuePlan(queue=self.upstream.queue_name, durable=q.durable, auto_delete=q.auto_delete,
                         arguments=dict(q.arguments), prefetch=int(self.upstream.prefetch_count),
                         no_ack=self.upstream.ack_mode == "no-ack", consumer_tag=self.upstream.consumer_tag)
        links.open_upstream_queue(self, endpoint, plan, opened)

    def _source_started(self, queue_length: int) -> bool:
        self.consuming = False
        started = super()._source_started(queue_length)
        if started:
            self._check_demand()
        return started

    def _check_demand(self) -> None:
        """rabbit_federation_queue:consumer_state_changed, looked at every DEMAND_CHECK
        seconds: consume upstream while the queue is empty and one of its consumers (of
        priority 0 or more) can take a message; cancel that consumer otherwise."""
        self._watch = None
        end = cast("UpstreamQueue | None", self.src_end)
        if end is None or not self.active:
            return
        vhost = self.broker.vhosts.get(self.vhost)
        queue = vhost.queues.get(self.queue_name) if vhost is not None else None
        run = queue is not None and not len(queue.store) and any(
            c.priority >= 0 and c.has_credit() for c in queue.consumers)
        if run != self.consuming:
            self.consuming = run
            end.consume(run)
        scheduler = self.broker.scheduler
        if scheduler is not None:
            self._watch = scheduler.call_later(DEMAND_CHECK, self._check_demand)

    def _halt(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super()._halt()

    def _forward(self, qm: QueuedMessage | RemoteDelivery) -> Settlement:
        message: Message = qm.message
        header = queue_link_header(message, self._received_from(qm), not self.upstream.trust_user_id)
        assert self.dest_actor is not None
        ops.check_message_size(self.broker, len(message.body))
        return ops.publish(self.dest_actor, "", self.queue_name, shortstr("") + shortstr(self.queue_name), header,
                           message.body)[2]


def link_id(link: FederationLink) -> str:
    """rabbit_federation_status:unique_id: erlang:phash2 of {#resource{}, upstream name,
    upstream exchange or queue name} in 8 hex digits, as RabbitMQ's (stable across restarts)."""
    key = ((Atom("resource"), link.vhost, Atom(link.kind), link.target), link.upstream.name, link.upstream_name)
    return f"{phash2(key):08x}"


def upstream_queue_name(upstream_exchange: str, upstream_vhost: str, exchange: str, vhost: str, cluster: str) -> str:
    """rabbit_federation_exchange_link:upstream_queue_name."""
    if vhost == upstream_vhost:
        down = "" if exchange == upstream_exchange else f":{exchange}"
    else:
        down = f":{vhost}:{exchange}"
    return f"federation: {upstream_exchange} -> {cluster}{down}"


# ================================================================ the links of a vhost
def reconcile(broker: Node, vhost: VHost) -> None:
    """Start the links the vhost's policies and upstreams ask for, stop the others, and
    mirror binding changes (called after every metadata command that may change them)."""
    links = vhost.federation_links
    if not links and not vhost.federation:
        return
    wanted: dict[tuple[str, str, str], tuple[Upstream, str]] = {}
    for kind, table in (("exchange", vhost.exchanges), ("queue", vhost.queues)):
        for target in table.values():
            policy = target.policy
            if policy is None or not any(k in FEDERATION_KEYS for k in policy.definition):
                continue
            for up in upstreams_for(vhost, policy.definition, target.name):
                wanted[(kind, target.name, up.name)] = (up, policy.name)
    for key in list(links):
        link = links[key]
        want = wanted.get(key)
        if want is None or want[0] != link.upstream or want[1] != link.policy:
            del links[key]
            link.stop(cleanup=want is None)
    for key, (up, policy_name) in wanted.items():
        link = links.get(key)
        if link is None:
            kind, name, _ = key
            cls = ExchangeLink if kind == "exchange" else QueueLink
            link = links[key] = cls(broker, vhost.name, name, up, policy_name)
            link.start_soon()
        elif isinstance(link, ExchangeLink):
            link.sync_bindings()


def start_all(broker: Node) -> None:
    """The broker's loop runs (Broker.set_scheduler): start the links its definitions
    brought back."""
    for link in statuses(broker):
        link.start_soon()


def vhost_deleted(vhost: VHost) -> None:
    """Its links stop, deleting what they declared upstream (as the exchanges and queues
    they federated went)."""
    for link in vhost.federation_links.values():
        link.stop()
    vhost.federation_links.clear()


def statuses(broker: Node, vhost: VHost | None = None) -> list[FederationLink]:
    vhosts = [vhost] if vhost is not None else list(broker.vhosts.values())
    return [link for v in vhosts for link in v.federation_links.values()]


def restart(broker: Node, vhost: VHost, link_id_: str) -> bool:
    """restart_federation_link: the link stops (keeping what it declared upstream) and
    starts again; False if this node runs no such link (on a cluster, another member may)."""
    for key, link in list(vhost.federation_links.items()):
        if link_id(link) == link_id_ and link.runs_here():
            link.stop(cleanup=False)
            fresh = vhost.federation_links[key] = link.restarted()
            fresh.start_soon()
            return True
    return False
