"""The home's end of a node link: what another member asks of this node's queues, carried out
through the same queue calls and operations a channel uses (warren.broker.ops), with the
other node's consumers as consumers of the queue like any other.

The other node checked permissions and exclusivity against its own copy of the metadata (the
cluster's); here the queue's state decides: exclusive consumers, if-unused, counts. A consumer
of the other node gets no more than the credit its node granted (LinkConsumer.ready), and
what it holds unacked comes back (requeued, redelivered) when the link ends, as a channel's
does when it closes.

A replicated queue's deliveries are named by their message ids (the complement, ~id, so that
they never meet another queue's counter): a consumer of another node keeps them across
leaders. It names itself by a *holder* key that outlives the link (written into the queue's
log with what it is handed) and, re-attaching to a new leader, claims what it still holds
(warren.store.replicated's parked messages)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from ..broker import federation, ops, shovel
from ..broker.auth import User
from ..broker.consumer import Consumer, check_consume_arguments
from ..broker.credit import Credit
from ..broker.enqueue import enqueue
from ..broker.errors import AMQPError, access_refused, internal_error, not_found
from ..broker.limits import usage
from ..broker.queues import CONSUMER_ARGUMENTS
from ..broker.queues.quorum import QuorumQueue
from ..store.replicated import ReplicatedQueueStore
from ..store.settlement import MOVED, SETTLED, Settlement, Wake
from .node_link import Link, Meta, message_from
from .replicas import Replicas, replicas_of

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.queues.base import Queue
    from ..store.queued_message import QueuedMessage

log = logging.getLogger("warren.cluster.link")

# What a close of connections asked by another node may match (ConnectionInfo's fields).
CLOSE_FIELDS = frozenset(("name", "user", "vhost"))

# Who acts here for another node (its checks were made there, against the cluster's metadata).
NODE_USER = User("node-link", "", ("administrator",))


class LinkConsumer(Consumer):
    """A consumer of another node: served while its node's credit lasts."""

    __slots__ = ("granted", "cid", "holder")
    remote = True  # (its node lists it, as one of its channel's)
    granted: int  # deliveries its node let it have, not sent yet
    cid: int      # its id on the link
    holder: str   # its key across leaders (a replicated queue's), or ""

    def ready(self) -> bool:
        return self.granted > 0 and self.gate.delivering

    def has_credit(self) -> bool:
        return self.granted > 0


class HomeSession:
    """One incoming link: a DeliverySink for its consumers and a SyncWaiter for its publishes."""

    def __init__(self, broker: Broker, link: Link):
        self.broker = broker
        self.link = link
        self.consumers: dict[int, LinkConsumer] = {}
        self.unacked: dict[int, tuple[QueuedMessage, Queue, LinkConsumer | None]] = {}
        self.next_did = 0
        self.publishes: deque[tuple[int, Settlement]] = deque()  # (seq, settlement) not answered yet
        self.waiting = False
        self._kicked: set[Queue] = set()
        self.paused = False  # reading the link waits for the store or an alarm
        # A replicated queue's deliveries (and basic.get answers) wait for the commit of what
        # records them, as a connection's do (warren.session.gated_output), in order:
        # (point or None, frame meta, blobs, the unacked entry to forget if it never leaves).
        self.held: deque[tuple[Settlement | None, Meta, tuple, int | None]] = deque()
        self._unasked: list[Settlement] = []  # their points, asked to wake it at the tick's end
        link.on_frame = self.handle
        link.on_read = self.read_done
        link.on_lost = self.lost
        link.on_drained = self._drained

    # frames ---------------------------------------------------------------------------------
    def handle(self, meta: Meta, blobs: list[bytes]) -> None:
        op = meta.get("op")
        try:
            handler = _HANDLERS[op]  # type: ignore[index]
        except KeyError:
            self.link.abort(f"unknown operation {op!r}")
            return
        rid = meta.get("rid")
        try:
            answer = handler(self, meta, blobs)
        except AMQPError as err:
            if rid is not None:
                self.link.send({"op": "reply", "rid": rid, "error": [err.code, err.text]})
        except (KeyError, TypeError, ValueError) as err:
            self.link.abort(f"malformed {op!r}: {err!r}")
            return
        else:
            if rid is not None and answer is not None:
                self.link.send({"op": "reply", "rid": rid, **answer[0]}, *answer[1])

    def read_done(self) -> None:
        """After the frames of one read: what they freed is delivered, what they published and
        delivered is written (one write and fsync for the read, as for a connection's), and
        the publishes already safe are answered."""
        if self._kicked:
            kicked, self._kicked = self._kicked, set()
            for queue in kicked:
                queue.deliver_ready()
        self.broker.durability.flush()
        if self.publishes and not self.waiting:
            self.store_synced()
        self._check_flow()

    def _queue(self, meta: Meta) -> Queue:
        vhost = self.broker.metadata.vhosts.get(meta["vhost"])
        queue = None if vhost is None else vhost.queues.get(meta["queue"])
        if queue is None or queue.remote:
            raise not_found(f"no queue '{meta['queue']}' in vhost '{meta['vhost']}'")
        return queue

    # publishes ------------------------------------------------------------------------------
    def _publish(self, meta: Meta, blobs: list[bytes]) -> None:
        route, header, body = blobs
        vhost = self.broker.metadata.vhosts.get(meta["vhost"])
        named = [] if vhost is None else [q for name in meta["queues"] if (q := vhost.queues.get(name)) is not None]
        queues = [q for q in named if q.writable_here]
        message = message_from(route, header, body)
        message.ttl = meta.get("ttl")
        if meta.get("cc") is not None:
            message.cc_keys = tuple(meta["cc"])
        origin = meta.get("from")
        if origin is not None and len(queues) == 1 and queues[0].gated:  # (a replicated queue's leader)
            settlement = cast(QuorumQueue, queues[0]).publish_from(message, (str(origin), int(meta["n"])),
                                                                   int(meta["low"]))
        else:
            settlement = enqueue(message, queues, True, None) if queues else SETTLED
        if len(queues) < len(named):
            # A queue the other node thinks is here is not (a replicated queue's leader moved,
            # and one of the two nodes has not heard yet): never a confirm of nothing; a quorum
            # queue's publisher sends it again to the next leader.
            settlement = MOVED
        self.publishes.append((meta["seq"], settlement))

    def _check_flow(self) -> None:
        """Publishes from the other node are read no faster than this node's store writes them,
        and not at all during a resource alarm (as a connection's: its publishers are then held
        by the other node, whose link to here stops draining)."""
        persister = self.broker.persister
        if self.paused or not (self.broker.alarms or persister is not None and persister.over):
            return
        self.paused = True
        self.link.hold_reading("flow")
        if persister is not None:
            persister.subscribe_flow(self._flow_changed)
        self.broker.alarms.subscribe(self._flow_changed)

    def _flow_changed(self, over: bool = False) -> None:
        persister = self.broker.persister
        if not self.paused or self.broker.alarms or persister is not None and persister.over:
            return
        self._stop_waiting()
        self.link.release_reading("flow")

    def _stop_waiting(self) -> None:
        self.paused = False
        if self.broker.persister is not None:
            self.broker.persister.unsubscribe_flow(self._flow_changed)
        self.broker.alarms.unsubscribe(self._flow_changed)

    def store_synced(self) -> None:
        """Answer the publishes that are decided, in order (confirms are per message there)."""
        self.waiting = False
        publishes = self.publishes
        seqs, oks, moved = [], [], []
        while publishes:
            seq, settlement = publishes[0]
            status = settlement.status()
            if status is None:
                self.waiting = True
                settlement.notify(self)
                break
            publishes.popleft()
            seqs.append(seq)
            oks.append(status)
            if not status and getattr(settlement, "moved", False):
                moved.append(seq)  # (not taken, or its leader stopped leading: its fate is the next leader's)
        if seqs:  # (one frame for all of them)
            self.link.send({"op": "settled", "seqs": seqs, "oks": oks, **({"moved": moved} if moved else {})})

    # consumers ------------------------------------------------------------------------------
    def _consume(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        queue = self._queue(meta)
        arguments = meta.get("arguments") or None
        caps = queue.CAPABILITIES
        check_consume_arguments(arguments, queue.describe(), caps.consumer_arguments, CONSUMER_ARGUMENTS, caps.module)
        if queue.consumers.exclusive_refused(meta["exclusive"]):
            raise access_refused(f"{queue.describe()} in exclusive use")
        consumer = LinkConsumer(meta["tag"], self, queue, meta["no_ack"], meta["exclusive"], arguments, 0, Credit(),
                                b"", self.link)
        consumer.granted = 0
        consumer.cid = meta["cid"]
        consumer.holder = str(meta.get("holder") or "")
        self.consumers[consumer.cid] = consumer
        if consumer.holder and isinstance(queue.store, ReplicatedQueueStore):  # (before it may be handed any)
            self._claim(cast(QuorumQueue, queue), consumer, {int(off) for off in meta.get("held") or ()},
                        {int(off) for off in meta.get("acked") or ()})
        queue.add_consumer(consumer)
        return {}, ()

    def _claim(self, queue: QuorumQueue, consumer: LinkConsumer, held: set[int], acked: set[int]) -> None:
        """A consumer re-attaching after its queue's leader changed: what it still holds stays
        its own (acked here later), what it acked lately is settled (the ack may have died
        with the old leader), and the rest goes back."""
        for off, qm in queue.claim(consumer.holder, held | acked).items():
            if off in held:
                self.unacked[~off] = (qm, queue, consumer)
                consumer.unacked += 1
            elif off in acked:
                queue.ack(qm)
            else:
                queue.reject(qm, True)
                self._kicked.add(queue)

    def _credit(self, meta: Meta, blobs: list[bytes]) -> None:
        consumer = self.consumers.get(meta["cid"])
        if consumer is not None:
            consumer.granted += int(meta["n"])
            self._kicked.add(consumer.queue)

    def _cancel(self, meta: Meta, blobs: list[bytes]) -> None:
        consumer = self.consumers.pop(meta["cid"], None)
        if consumer is not None:
            ops.cancel(consumer)
            self._kicked.add(consumer.queue)

    def deliver(self, consumer: Consumer, qm: QueuedMessage) -> None:  # (DeliverySink)
        assert isinstance(consumer, LinkConsumer)
        consumer.granted -= 1
        if consumer.holder:
            did = ~qm.off
        else:
            self.next_did += 1
            did = self.next_did
        queue = consumer.queue
        if consumer.no_ack:
            queue.delivered(qm, True)
        else:
            self.unacked[did] = (qm, queue, consumer)
            consumer.unacked += 1
            queue.delivered(qm, False, holder=consumer.holder)
        message = qm.message
        self._send_when_committed(queue, {"op": "deliver", "cid": consumer.cid, "did": did,
                                          "redelivered": qm.redelivered},
                                  (message.route, message.header, _octets(message.body)),
                                  None if consumer.no_ack else did)

    def _send_when_committed(self, queue: Queue, meta: Meta, blobs: tuple, did: int | None) -> None:
        point = queue.delivery_gate() if queue.gated else None
        if point is None and not self.held:
            self.link.send(meta, *blobs)
            return
        self.held.append((point, meta, blobs, did))
        unasked = self._unasked
        if point is not None and (not unasked or unasked[-1] is not point):
            if not unasked:
                asyncio.get_running_loop().call_soon(self._ask)
            unasked.append(point)

    def _ask(self) -> None:
        """(The tick's end: its points are fixed where its deliveries were recorded.)"""
        unasked, self._unasked = self._unasked, []
        wake = Wake(self._committed)
        for point in unasked:
            point.notify(wake)
        self._send_held()

    def _send_held(self) -> None:
        """Send the held deliveries whose point is committed, in order; drop those whose
        queue's leader moved first (the new leader hands them out again)."""
        held = self.held
        while held:
            point, meta, blobs, did = held[0]
            status = True if point is None else point.status()
            if status is None:
                return
            held.popleft()
            if status:
                self.link.send(meta, *blobs)
            elif did is not None and (entry := self.unacked.pop(did, None)) is not None and entry[2] is not None:
                entry[2].unacked -= 1
                self._kicked.add(entry[1])

    def _committed(self) -> None:
        self._send_held()
        if self._kicked:
            self.read_done()

    def consumer_cancelled(self, consumer: Consumer) -> None:  # (DeliverySink: the queue went away)
        assert isinstance(consumer, LinkConsumer)
        if self.consumers.pop(consumer.cid, None) is not None:
            self.link.send({"op": "cancelled", "cid": consumer.cid})

    # settling -------------------------------------------------------------------------------
    def _settle(self, meta: Meta, blobs: list[bytes]) -> None:
        ack, requeue = meta["ack"], meta["requeue"]
        for did in meta["dids"]:
            entry = self.unacked.pop(did, None)
            if entry is not None:
                qm, queue, consumer = entry
                ops.settle(qm, queue, consumer, ack, requeue)
                if not ack:
                    self._kicked.add(queue)

    def _settle_parked(self, meta: Meta, blobs: list[bytes]) -> None:
        """Settlements of a replicated queue's deliveries made before its leader changed (or
        before their consumer re-attached): by message id, wherever the message is held here."""
        queue = self._queue(meta)
        store = queue.store
        for off, ack, requeue in zip(meta["offs"], meta["acks"], meta["requeues"]):
            entry = self.unacked.pop(~int(off), None)
            if entry is not None:
                ops.settle(entry[0], entry[1], entry[2], bool(ack), bool(requeue))
            elif isinstance(store, ReplicatedQueueStore) and (
                    (parked := store.unpark(int(off))) is not None
                    or (parked := cast(QuorumQueue, queue).claim("", [int(off)]).get(int(off))) is not None):
                ops.settle(parked, queue, None, bool(ack), bool(requeue))
            self._kicked.add(queue)

    def _give_back(self, meta: Meta, blobs: list[bytes]) -> None:
        """Deliveries that reached no client (their consumer had gone): back in place, as if
        never delivered."""
        for did in meta["dids"]:
            entry = self.unacked.pop(did, None)
            if entry is not None:
                qm, queue, consumer = entry
                if consumer is not None:
                    consumer.unacked -= 1
                queue.give_back(qm)
                self._kicked.add(queue)

    # the rest of a queue's operations ------------------------------------------------------
    def _get(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple] | None:
        queue = self._read_queue(meta)
        qm = queue.get()
        if qm is None:
            return {"empty": True}, ()
        no_ack = meta["no_ack"]
        queue.delivered(qm, no_ack, True)
        self.next_did += 1
        if not no_ack:
            self.unacked[self.next_did] = (qm, queue, None)
        message = qm.message
        answer = {"did": self.next_did, "redelivered": qm.redelivered, "messages": queue.message_count}
        octets = (message.route, message.header, _octets(message.body))
        if queue.gated:  # (answered once committed, as a delivery is)
            self._send_when_committed(queue, {"op": "reply", "rid": meta["rid"], **answer}, octets,
                                      None if no_ack else self.next_did)
            return None
        return answer, octets

    def _read_queue(self, meta: Meta) -> Queue:
        """The queue a get or its counts read: not a quorum queue's leader not proven yet (its
        log may lack what is committed); the 404 makes the asker wait for it (_when_led)."""
        replicas = replicas_of(self.broker)
        led = None if replicas is None else replicas.led.get((meta["vhost"], meta["queue"]))
        if led is not None and not led.state.proven:
            raise not_found(f"queue '{meta['queue']}' in vhost '{meta['vhost']}' has no proven leader yet")
        return self._queue(meta)

    def _counts(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        queue = self._read_queue(meta)
        queue.touch()
        messages, consumers = queue.declare_ok_counts()
        return {"messages": messages, "consumers": consumers}, ()

    def _stats(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        """The counts of some of this node's queues, and their single active consumer's tag
        (null for one that is not here)."""
        out: list[list[int] | None] = []
        for vhost_name, name in meta["queues"]:
            vhost = self.broker.metadata.vhosts.get(vhost_name)
            queue = None if vhost is None else vhost.queues.get(name)
            if queue is None or queue.remote:
                out.append(None)
            else:
                ready, unacked, ready_bytes = queue.message_counts()
                out.append([ready, unacked, ready_bytes, queue.consumer_count, queue.single_active_consumer_tag])
        return {"stats": out}, ()

    def _purge(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        return {"count": self._queue(meta).purge()}, ()

    def _delete(self, meta: Meta, blobs: list[bytes]) -> None:
        """Through the cluster's log, as a delete made here: answered once it is applied."""
        vhost = self.broker.metadata.vhosts.get(meta["vhost"])
        if vhost is None:
            raise not_found(f"no vhost '{meta['vhost']}'")
        actor = ops.Actor(self.broker, NODE_USER, vhost, None, trusted=True)
        rid, link = meta["rid"], self.link
        self._queue(meta)

        def done(result: Any, error: BaseException | None) -> None:
            if isinstance(error, AMQPError):
                link.send({"op": "reply", "rid": rid, "error": [error.code, error.text]})
            elif error is not None:
                link.send({"op": "reply", "rid": rid, "error": [541, str(error)]})
            else:
                link.send({"op": "reply", "rid": rid, "count": result, "revision": self.broker.metadata.revision})
        log_ = self.broker.metadata.log
        if log_ is None:
            raise internal_error("this node is not a cluster member")
        log_.submit(lambda: ops.delete_queue.change(actor, meta["queue"], meta["if_unused"], meta["if_empty"]), done)
        return None

    def _applied(self, meta: Meta, blobs: list[bytes]) -> None:
        """Answered once this node has applied the metadata log up to the revision (the other
        node answers its client's change then: NodeLinks.replicated)."""
        rid, link, revision = meta["rid"], self.link, int(meta["revision"])
        log_ = self.broker.metadata.log
        if log_ is None:
            raise internal_error("this node is not a cluster member")
        log_.when_applied(revision, lambda: link.send({"op": "reply", "rid": rid}))

    # what the other node asks of this node's connections ------------------------------------
    def _usage(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        """This node's counts for the limits of a connection or channel opening there."""
        vhost = meta["vhost"]
        return {"usage": list(usage(self.broker, None if vhost is None else str(vhost), str(meta["user"])))}, ()

    def _records(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        """The management API's records of this node's connections, channels or consumers
        (none while the API does not run here), as one JSON blob."""
        source = getattr(self.broker.node_links, "records_source", None)
        kind, where = str(meta["kind"]), dict(meta["where"])
        try:
            blob = json.dumps([] if source is None else source(kind, where), default=str).encode()
        except Exception as err:  # (the asking node's API answers without this node's)
            log.exception("node link: the records asked for could not be made")
            raise internal_error(f"records of node '{self.broker.config.node_name}': {err!r}") from None
        return {}, (blob,)

    def _close(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        """Close this node's connections whose records match (an administrator's close, a
        deleted user's or vhost's connections)."""
        where = dict(meta["where"])
        if not set(where) <= CLOSE_FIELDS:
            raise ValueError(f"connections are closed by {sorted(CLOSE_FIELDS)}, not {sorted(where)}")
        closed = 0
        for conn in list(self.broker.connections):
            info = conn.info()
            if all(getattr(info, field) == value for field, value in where.items()):
                conn.force_close(str(meta["reason"]))
                closed += 1
        return {"closed": closed}, ()

    def _restart_link(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        """Restart a shovel or federation link if this node runs it (an API's restart through
        another node)."""
        vhost = self.broker.vhosts.get(str(meta["vhost"]))
        restarted = False
        if vhost is not None:
            name = str(meta["name"])
            restarted = (shovel.restart(self.broker, vhost, name) if meta["kind"] == "shovel"
                         else federation.restart(self.broker, vhost, name))
        return {"restarted": restarted}, ()

    # replicated queues (warren.cluster.replicas) -----------------------------------------
    def _replicas(self) -> Replicas:
        replicas = replicas_of(self.broker)
        if replicas is None:
            raise internal_error("this node keeps no replicated queues")
        return replicas

    def _follow(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple] | None:
        answer = self._replicas().follow(self._peer(), self.link, meta)
        return None if answer is None else (answer, ())  # (None: the replicas answer once their leader is proven)

    def _ready(self, meta: Meta, blobs: list[bytes]) -> None:
        self._replicas().ready(self._peer(), meta)

    def _replica_ack(self, meta: Meta, blobs: list[bytes]) -> None:
        self._replicas().acknowledged(self._peer(), meta)

    def _quorum_status(self, meta: Meta, blobs: list[bytes]) -> tuple[dict, tuple]:
        return {"rows": self._replicas().status((str(meta["vhost"]), str(meta["queue"])))}, ()

    def _peer(self) -> str:
        assert self.link.peer is not None  # (frames are handled once the link is up)
        return self.link.peer

    # the link's end -------------------------------------------------------------------------
    def lost(self) -> None:
        """The other node is gone (or cut off): its consumers go, what they held comes back."""
        kicked: set[Queue] = set()
        for qm, queue, consumer in self.unacked.values():
            ops.settle(qm, queue, consumer, False, True, closed=True)
            kicked.add(queue)
        self.unacked.clear()
        self.held.clear()
        self._unasked.clear()
        for consumer in list(self.consumers.values()):
            ops.cancel(consumer)
            kicked.add(consumer.queue)
        self.consumers.clear()
        self.publishes.clear()
        replicas = replicas_of(self.broker)
        if replicas is not None and self.link.peer is not None:
            replicas.session_lost(self.link.peer, self.link)
        if self.paused:
            self._stop_waiting()
        for queue in kicked:
            queue.deliver_ready()
        self.broker.durability.flush()

    def _drained(self) -> None:
        for queue in {c.queue for c in self.consumers.values()}:
            queue.deliver_ready()


def _octets(body) -> bytes:
    return body if isinstance(body, bytes) else bytes(body)


_HANDLERS = {
    "publish": HomeSession._publish, "consume": HomeSession._consume, "credit": HomeSession._credit,
    "cancel": HomeSession._cancel, "settle": HomeSession._settle, "give_back": HomeSession._give_back,
    "settle_parked": HomeSession._settle_parked,
    "get": HomeSession._get, "counts": HomeSession._counts, "purge": HomeSession._purge,
    "delete": HomeSession._delete, "stats": HomeSession._stats, "applied": HomeSession._applied,
    # (the management API's listings and closes, and the limits' counts)
    "usage": HomeSession._usage, "records": HomeSession._records, "close": HomeSession._close,
    "restart_link": HomeSession._restart_link,
    "follow": HomeSession._follow, "ready": HomeSession._ready, "replica_ack": HomeSession._replica_ack,
    "quorum_status": HomeSession._quorum_status,
}
