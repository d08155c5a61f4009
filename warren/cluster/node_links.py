"""A member's node links (one of its server's services): it listens on its distribution port
for the other members' links, and dials one link to each member whose queues its clients use
(a Peer), again whenever one ends, for as long as that node is a member.

A Peer is this node's side of a link to a home: its requests wait for their replies (by id),
its publishes for their settlements (by sequence number: a RemoteSettlement is a settlement
handle like a store batch, so a channel confirms them unchanged), and its consumers get
deliveries within the credit it grants. When the link ends what waited fails as a dead queue
fails in RabbitMQ: requests with the home-down 404, publishes nacked, consumers cancelled
(basic.cancel to clients that asked for it)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Callable

from ..amqp.message import Message
from ..broker.errors import AMQPError, internal_error
from ..broker.limits import NONE as NO_USAGE
from ..broker.records import Usage
from ..broker.metadata.commands import DeleteQueue
from ..store.settlement import Decision
from .etcd import EtcdError, absent, put_op
from .node_link import Link, Meta, message_from
from .queue_home import HomeSession
from .replicas import replicas_of
from .tasks import cancelled
from .remote_queue import Holding, RemoteMessage, RemoteQueue, RemoteQuorumQueue, home_down

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..broker.queue_flow import QueueCredit
    from ..broker.consumer import Consumer
    from .config import ClusterConfig
    from .etcd import Etcd
    from .membership import Membership

log = logging.getLogger("warren.cluster.link")

Done = Callable[[Any, "BaseException | None"], None]
RETRY = 0.5     # seconds between two dials of a member
WINDOW = 256    # deliveries a consumer without a prefetch limit may have on their way
STATS_INTERVAL = 1.0  # seconds between two reads of other nodes' queues' counts
STARTUP_WAIT = 3.0  # seconds a starting node waits for its links to the running members
APPLIED_WAIT = 1.0  # seconds a change's answer waits for the other members to apply it
ASK_TIMEOUT = 1.0   # seconds a question to every member waits for their answers: a member
#                     that has not answered by then is left out (as RabbitMQ's API leaves out
#                     a node it cannot reach)

# What the management API shows of a node's own connections, channels and consumers, as
# JSON-ready records: (kind, filter) -> records (warren.mgmt.peers.source, when the API runs).
RecordsSource = Callable[[str, "dict[str, Any]"], "list[Any]"]


class RemoteSettlement(Decision):
    """A publish to a queue of another node: safe once its home says so (False: the home
    refused it; or, `moved`, the link ended first, or the queue's leader had moved, and its
    fate is unknown: a nack, as RabbitMQ's channel nacks what a classic queue that died held
    unconfirmed; a quorum queue's publisher sends it again to the next leader instead,
    QuorumPublisher)."""

    __slots__ = ("moved",)

    def __init__(self) -> None:
        super().__init__()
        self.moved = False


class RemoteConsumer:
    """This node's record of one of its consumers of a queue of another node."""

    __slots__ = ("consumer", "queue", "cid", "in_flight", "reserved", "open", "holding")

    def __init__(self, consumer: Consumer, queue: RemoteQueue, cid: int):
        self.consumer = consumer
        self.queue = queue
        self.cid = cid
        self.in_flight = 0  # credit granted, deliveries not arrived yet
        self.reserved = 0   # of those, counted in its channel's global credit (basic.qos global)
        self.open = False   # the home accepted it
        self.holding: Holding | None = None  # what it holds across leaders (a replicated queue's)


class Peer:
    """This node's link to one home, and what waits on it."""

    def __init__(self, links: NodeLinks, node: str):
        self.links = links
        self.node = node
        self.link: Link | None = None
        self.generation = 0
        self.requests: dict[int, tuple[Done, Callable[[Meta, list[bytes]], Any], Meta]] = {}
        self.settlements: dict[int, RemoteSettlement] = {}
        self.consumers: dict[int, RemoteConsumer] = {}
        self.by_consumer: dict[Consumer, RemoteConsumer] = {}
        self.held: set[QueueCredit] = set()  # stand-ins' publishers held until the link drains
        self._last_publish: tuple[Message, Meta, RemoteSettlement] | None = None
        self._last_settle: Meta | None = None
        self._ids = itertools.count(1)
        self._task: asyncio.Task | None = None

    @property
    def up(self) -> bool:
        return self.link is not None

    @property
    def busy(self) -> bool:
        return self.link is not None and not self.link.delivering

    def _drained(self) -> None:
        held, self.held = self.held, set()
        for credit in held:
            credit.release()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dial_forever())

    async def stop(self) -> None:
        await cancelled(self._task)
        if self.link is not None:
            self.link.close()

    async def _dial_forever(self) -> None:
        while True:
            address = self.links.address(self.node)
            if address is not None:
                link = None
                try:
                    link = await self.links.dial(*address)
                    peer = await asyncio.wait_for(asyncio.shield(link.ready), 5)
                    if link.closed:
                        pass  # (ended as soon as it was up: dialled again)
                    elif peer != self.node:
                        link.abort(f"dialled {self.node} at {address}, {peer} answered")
                    else:
                        self._linked(link)
                        closed = asyncio.get_running_loop().create_future()

                        def lost() -> None:
                            self._lost()
                            if not closed.done():
                                closed.set_result(None)
                        link.on_lost = lost
                        await closed
                except (OSError, asyncio.TimeoutError, ConnectionError) as err:
                    log.debug("node link to %s at %s: %s", self.node, address, err)
                    if link is not None and not link.closed:
                        link.abort(f"no handshake: {err!r}")
            await asyncio.sleep(RETRY)

    def _linked(self, link: Link) -> None:
        self.generation += 1
        self.link = link
        link.on_frame = self._handle
        link.on_drained = self._drained
        log.info("node link to %s up", self.node)

    def _lost(self) -> None:
        """The home cannot be reached: fail what waits for it, as a dead queue does."""
        log.warning("node link to %s lost", self.node)
        self.link = None
        self._drained()
        replicas = replicas_of(self.links.broker)
        if replicas is not None:
            replicas.peer_lost(self.node)
        for listener in self.links.on_peer_lost:
            listener(self.node)
        requests, self.requests = self.requests, {}
        for done, _, meta in requests.values():
            done(None, self._down(meta))
        settlements, self.settlements = self.settlements, {}
        for settlement in settlements.values():
            settlement.moved = True
            settlement.decide(False)
        consumers, self.consumers = self.consumers, {}
        self.by_consumer.clear()
        for state in consumers.values():
            self._release(state)
            self._gone(state)

    def _gone(self, state: RemoteConsumer) -> None:
        """A consumer this home no longer serves: cancelled, unless its queue is replicated
        (it waits for the queue's next leader: RemoteQuorumQueue.orphan)."""
        consumer, queue = state.consumer, state.queue
        if consumer not in queue.consumers:
            return
        if isinstance(queue, RemoteQuorumQueue) and not queue.deleted:
            queue.orphan(consumer)
            return
        queue.consumers.remove(consumer)
        consumer.channel.consumer_cancelled(consumer)

    # sending -------------------------------------------------------------------------------
    def request(self, meta: Meta, done: Done, answer: Callable[[Meta], Any],
                blobs_answer: Callable[[Meta, list[bytes]], Any] | None = None) -> None:
        link = self.link
        if link is None:  # (answered later, as a reply would be: a waiting channel is not re-entered)
            asyncio.get_running_loop().call_soon(done, None, self._down(meta))
            return
        rid = next(self._ids)
        self.requests[rid] = (done, blobs_answer or (lambda meta, blobs: answer(meta)), meta)
        link.send({**meta, "rid": rid})

    def _down(self, meta: Meta) -> AMQPError:
        return home_down(self.node, str(meta.get("queue")), str(meta.get("vhost")))

    def publish(self, queue: RemoteQueue, message: Message, origin: tuple[str, int, int] | None = None
                ) -> RemoteSettlement:
        """`origin`: a replicated queue's publish (publisher, number, the publisher's lowest
        unanswered number), so that its next leader knows it if it is sent again (a frame of
        its own)."""
        link = self.link
        last = self._last_publish
        if (origin is None and link is not None and last is not None and last[0] is message
                and link.pending(last[1])):
            last[1]["queues"].append(queue.name)  # (one frame, one body, for its queues on this home)
            return last[2]
        settlement = RemoteSettlement()
        if link is None:
            settlement.safe, settlement.moved = False, True
            return settlement
        seq = next(self._ids)
        self.settlements[seq] = settlement
        meta: Meta = {"op": "publish", "seq": seq, "vhost": queue.vhost.name, "queues": [queue.name]}
        if origin is not None:
            meta["from"], meta["n"], meta["low"] = origin
        if message.ttl is not None:
            meta["ttl"] = message.ttl
        if message.cc_keys is not None:
            meta["cc"] = list(message.cc_keys)
        body = message.body
        link.send(meta, message.route, message.header, body if isinstance(body, bytes) else bytes(body))
        self._last_publish = (message, meta, settlement) if origin is None else None
        return settlement

    def consume(self, queue: RemoteQueue, consumer: Consumer, done: Done) -> None:
        cid = next(self._ids)
        state = RemoteConsumer(consumer, queue, cid)
        self.consumers[cid] = state
        self.by_consumer[consumer] = state

        def accepted(meta: Meta) -> None:
            state.open = True
            return None

        def finished(result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.consumers.pop(cid, None)
                self.by_consumer.pop(consumer, None)
            done(result, error)
        meta: Meta = {"op": "consume", "vhost": queue.vhost.name, "queue": queue.name, "cid": cid,
                      "tag": consumer.tag, "no_ack": consumer.no_ack, "exclusive": consumer.exclusive,
                      "arguments": _jsonable(consumer.arguments)}
        if isinstance(queue, RemoteQuorumQueue) and not consumer.no_ack:
            state.holding = holding = queue.holding(consumer)
            meta["holder"], meta["held"], meta["acked"] = holding.holder, list(holding.held), list(holding.acked)
            holding.acked.clear()
        self.request(meta, finished, accepted)

    def cancel(self, consumer: Consumer) -> None:
        state = self.by_consumer.pop(consumer, None)
        if state is None:
            return
        self.consumers.pop(state.cid, None)
        self._release(state)
        if self.link is not None:
            self.link.send({"op": "cancel", "cid": state.cid})

    def grant(self, consumer: Consumer) -> None:
        """Let the home send `consumer` what it may take now: its prefetch and its channel's
        global limit less what it holds and what is on its way, or a window without either."""
        state = self.by_consumer.get(consumer)
        link = self.link
        if state is None or not state.open or link is None or not consumer.gate.delivering:
            return
        room = WINDOW - state.in_flight
        credit = consumer.credit
        if not consumer.no_ack:
            if consumer.prefetch:
                room = min(room, consumer.prefetch - consumer.unacked - state.in_flight)
            if credit.limit:
                room = min(room, credit.limit - credit.used)
        elif state.in_flight > WINDOW // 2:
            return  # (a window is granted in halves, not a message at a time)
        if room <= 0:
            return
        state.in_flight += room
        if credit.limit and not consumer.no_ack:
            credit.used += room  # reserved: the channel's other consumers see it taken
            state.reserved += room
        link.send({"op": "credit", "cid": state.cid, "n": room})

    def _release(self, state: RemoteConsumer) -> None:
        if state.reserved:
            state.consumer.credit.used -= state.reserved
            state.reserved = 0

    def settle(self, qm: RemoteMessage, ack: bool, requeue: bool) -> None:
        link = self.link
        if link is None or qm.link != self.generation or qm.home != self.node:
            return  # (the link it came on ended: its home has given it back already)
        last = self._last_settle
        if last is not None and link.pending(last) and (last["ack"], last["requeue"]) == (ack, requeue):
            last["dids"].append(qm.seq)  # (a multiple ack, or acks of one tick: one frame)
            return
        self._last_settle = {"op": "settle", "dids": [qm.seq], "ack": ack, "requeue": requeue}
        link.send(self._last_settle)

    def get(self, queue: RemoteQueue, no_ack: bool, done: Done) -> None:
        generation = self.generation

        def got(meta: Meta, blobs: list[bytes]) -> tuple[RemoteMessage | None, int]:
            if meta.get("empty"):
                return None, 0
            route, header, body = blobs
            qm = RemoteMessage(meta["did"], message_from(route, header, body), meta["redelivered"], generation,
                               self.node)
            queue.delivered(qm, no_ack, True)  # (handed out: its stats here, as ops.get's)
            return qm, int(meta["messages"])
        self.request({"op": "get", "vhost": queue.vhost.name, "queue": queue.name, "no_ack": no_ack}, done,
                     lambda meta: None, got)

    # receiving -----------------------------------------------------------------------------
    def _handle(self, meta: Meta, blobs: list[bytes]) -> None:
        op = meta.get("op")
        try:
            if op == "deliver":
                self._deliver(meta, blobs)
            elif op == "settled":
                settlements = self.settlements
                for seq in meta.get("moved", ()):  # (not decided there: its publisher sends it again: QuorumPublisher)
                    if seq in settlements:
                        settlements[seq].moved = True
                for seq, ok in zip(meta["seqs"], meta["oks"]):
                    settlement = settlements.pop(seq, None)
                    if settlement is not None:
                        settlement.decide(ok)
            elif op == "reply":
                self._reply(meta, blobs)
            elif op == "cancelled":
                self._cancelled(meta["cid"])
            elif op == "entries" and (replicas := replicas_of(self.links.broker)) is not None:
                replicas.entries(self.node, meta, blobs)
            elif op == "release" and (replicas := replicas_of(self.links.broker)) is not None:
                replicas.release(self.node, meta)
            elif op == "commit" and (replicas := replicas_of(self.links.broker)) is not None:
                replicas.commit(self.node, meta)
            else:
                raise ValueError(f"unknown operation {op!r}")
        except (KeyError, TypeError, ValueError) as err:
            if self.link is not None:
                self.link.abort(f"malformed {op!r}: {err!r}")

    def _reply(self, meta: Meta, blobs: list[bytes]) -> None:
        entry = self.requests.pop(meta["rid"], None)
        if entry is None:
            return
        done, answer, _ = entry
        error = meta.get("error")
        if error is not None:
            done(None, AMQPError(int(error[0]), str(error[1])))
            return
        try:
            result = answer(meta, blobs)
        except Exception as err:  # (its waiter gets an answer all the same: a 541)
            log.exception("node link to %s: an answer could not be read", self.node)
            done(None, internal_error(f"the answer of node '{self.node}' could not be read: {err!r}"))
        else:
            done(result, None)

    def _deliver(self, meta: Meta, blobs: list[bytes]) -> None:
        state = self.consumers.get(meta["cid"])
        if state is None:  # cancelled meanwhile: it goes back as if never sent
            if self.link is not None:
                self.link.send({"op": "give_back", "dids": [meta["did"]]})
            return
        state.in_flight -= 1
        consumer = state.consumer
        if state.reserved:
            state.reserved -= 1
            consumer.credit.used -= 1  # (counted again as the channel delivers it)
        route, header, body = blobs
        did = meta["did"]
        qm = RemoteMessage(did, message_from(route, header, body), meta["redelivered"], self.generation, self.node,
                           state.holding)
        if state.holding is not None:
            state.holding.held[~did] = qm
        consumer.channel.deliver(consumer, qm)
        if consumer.no_ack or state.in_flight <= WINDOW // 2:  # (a prefetch above the window: its next half)
            self.grant(consumer)

    def _cancelled(self, cid: int) -> None:
        """The home cancelled it (its queue was deleted there)."""
        state = self.consumers.pop(cid, None)
        if state is None:
            return
        self.by_consumer.pop(state.consumer, None)
        self._release(state)
        self._gone(state)


class NodeLinks:
    """The service: the listener, and a Peer per member this node's clients reach."""

    def __init__(self, config: ClusterConfig, etcd: Etcd, membership: Membership, broker: Broker,
                 host: str | None, port: int):
        self.config = config
        self.etcd = etcd
        self.membership = membership
        self.broker = broker
        self.host = host
        self.port = port
        self.secret = b""
        self.peers: dict[str, Peer] = {}
        self.sessions: set[HomeSession] = set()
        self._server: asyncio.base_events.Server | None = None
        self._task: asyncio.Task | None = None
        self.records_source: RecordsSource | None = None  # (none while the API does not run here)
        self.on_peer_lost: list[Callable[[str], None]] = []  # told of a member whose link to this one ended
        membership.on_stopped.append(self._stopped)

    def peer(self, node: str) -> Peer:
        peer = self.peers.get(node)
        if peer is None:
            peer = self.peers[node] = Peer(self, node)
            if self.secret:
                peer.start()
        return peer

    def address(self, node: str) -> tuple[str, int] | None:
        record = self.membership.running.get(node)
        dist = record.get("dist") if record else None
        if not (isinstance(dist, list) and len(dist) == 2):
            return None
        return str(dist[0]), int(dist[1])

    async def dial(self, host: str, port: int) -> Link:
        loop = asyncio.get_running_loop()
        _, link = await asyncio.wait_for(
            loop.create_connection(lambda: Link(self.secret, self.config.node_name, True), host, port), 5)
        return link

    # service -------------------------------------------------------------------------------
    async def start(self, server=None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accepted, self.host, self.port, reuse_address=True)
        log.info("node links: listening on %s:%d", self.host or "*", self.port)
        self._task = loop.create_task(self._follow_members())
        # Serve once the running members are linked (their queues are "down" until then),
        # or after STARTUP_WAIT (etcd may be down: the links come when it is back).
        deadline = loop.time() + STARTUP_WAIT
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            running = [n for n in self.membership.running if n != self.config.node_name]
            if self.secret and self.membership.synced.is_set() and all(self.peer(n).up for n in running):
                break

    async def _follow_members(self) -> None:
        """The cluster's secret first; then a link to every other member, dialled again while
        it is one, and the counts of other nodes' queues for the API every STATS_INTERVAL."""
        self.secret = await self._secret()
        for peer in self.peers.values():
            peer.start()
        loop = asyncio.get_running_loop()
        next_stats = 0.0
        while True:
            for node in list(self.membership.members):
                if node != self.config.node_name:
                    self.peer(node)
            if loop.time() >= next_stats:
                next_stats = loop.time() + STATS_INTERVAL
                try:
                    self._refresh_stats()
                except Exception:  # (the links go on)
                    log.exception("node links: reading other nodes' queue counts failed")
            await asyncio.sleep(RETRY)

    # questions to every other running member ----------------------------------------------
    def ask_members(self, meta: Meta, answer: Callable[[Meta, list[bytes]], Any],
                    done: Callable[[dict[str, Any]], None], timeout: float = ASK_TIMEOUT) -> bool:
        """Send `meta` to every other running member linked now; `done({node: answer(reply)})`
        once each has answered or after `timeout` (then without those that have not). False,
        and no call of done, when there is none to ask."""
        me = self.config.node_name
        peers = [peer for node in self.membership.running if node != me
                 for peer in (self.peers.get(node),) if peer is not None and peer.up]
        if not peers:
            return False
        results: dict[str, Any] = {}
        waiting = {peer.node for peer in peers}
        finished = False

        def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                timer.cancel()
                done(results)

        timer = asyncio.get_running_loop().call_later(timeout, finish)
        for peer in peers:
            def replied(result: Any, error: BaseException | None, node: str = peer.node) -> None:
                if finished:
                    return
                waiting.discard(node)
                if error is None:
                    results[node] = result
                else:
                    log.warning("node %s could not answer %r: %s", node, meta.get("op"), error)
                if not waiting:
                    finish()
            peer.request(meta, replied, lambda meta: None, answer)
        return True

    async def ask(self, meta: Meta, answer: Callable[[Meta, list[bytes]], Any],
                  timeout: float = ASK_TIMEOUT) -> dict[str, Any]:
        """ask_members, awaited: every answer by node ({} with no member to ask)."""
        answers: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if not self.ask_members(meta, answer, answers.set_result, timeout):
            return {}
        return await answers

    def usage_elsewhere(self, vhost: str | None, user: str, done: Callable[[Usage], None]) -> bool:
        """(warren.broker.node.NodeLinks: what the limits count on the other members.)"""
        def summed(answers: dict[str, Usage]) -> None:
            total = NO_USAGE
            for usage in answers.values():
                total = total.plus(usage)
            done(total)
        return self.ask_members({"op": "usage", "vhost": vhost, "user": user},
                                lambda meta, blobs: Usage(*(int(n) for n in meta["usage"])), summed)

    async def records(self, kind: str, where: dict[str, Any]) -> list[Any]:
        """The other members' records of a kind (warren.mgmt.peers), those that answer in time."""
        answers = await self.ask({"op": "records", "kind": kind, "where": where},
                                 lambda meta, blobs: json.loads(blobs[0]) if blobs else [])
        return [record for node in sorted(answers) for record in answers[node]]

    async def close_connections(self, where: dict[str, Any], reason: str) -> int:
        """Close the other members' connections whose records match `where` (field: value),
        as an administrator closes them; how many were closed."""
        answers = await self.ask({"op": "close", "where": where, "reason": reason},
                                 lambda meta, blobs: int(meta["closed"]))
        return sum(answers.values())

    async def restart_link(self, kind: str, vhost: str, name: str) -> bool:
        """Restart the shovel (kind "shovel", by name) or federation link ("federation", by
        id) that another member runs: whether one did."""
        answers = await self.ask({"op": "restart_link", "kind": kind, "vhost": vhost, "name": name},
                                 lambda meta, blobs: bool(meta["restarted"]))
        return any(answers.values())

    def _stopped(self, node: str) -> None:
        """A member stopped running: its transient and exclusive queues go (RabbitMQ deletes
        them when it sees their node go down); its durable ones stay, down until it is back.
        One running member makes the change: the first of them by name."""
        me = self.config.node_name
        if node == me or min([*self.membership.running, me]) != me:
            return
        for vhost in self.broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                if isinstance(queue, RemoteQueue) and queue.home == node and (queue.exclusive or not queue.durable):
                    log.info("%s goes with its node %s", queue.describe(), node)
                    self.broker.metadata.submit(DeleteQueue(vhost.name, queue.name))

    def online(self, nodes: list[str]) -> list[str]:
        """(warren.broker.node.NodeLinks)"""
        return [node for node in nodes if node in self.membership.running]

    def placement(self, size: int | None, balanced: bool = False) -> tuple[str, ...]:
        """The members of a replicated queue declared here, its leader first
        (warren.broker.node.NodeLinks): this node and the others holding fewest replicas,
        running ones first (rabbit_queue_location); led from here, or (`balanced`) by the
        running member leading fewest (of those this node's links reach: it answers the declare)."""
        me = self.config.node_name
        replicas: dict[str, int] = {}
        leading: dict[str, int] = {}
        for vhost in self.broker.vhosts.values():
            for queue in vhost.queues.values():
                members = getattr(queue, "members", None)
                if members:
                    leader = getattr(queue, "home", None) or me
                    leading[leader] = leading.get(leader, 0) + 1
                for node in members or ():
                    replicas[node] = replicas.get(node, 0) + 1
        running = self.membership.running
        others = sorted((node for node in self.membership.members if node != me),
                        key=lambda node: (node not in running, replicas.get(node, 0), node))
        members = (me, *(others if size is None else others[:size - 1]))
        if balanced:
            reachable = [n for n in members if n == me or n in running and self.peer(n).up]
            leader = min(reachable, key=lambda n: leading.get(n, 0))
            members = (leader, *(n for n in members if n != leader))
        return members

    def replicated(self, revision: int, then: Callable[[], None]) -> None:
        """Call `then` once every member linked to this node has applied the metadata log up
        to `revision` (MetadataLog.replicated), or after APPLIED_WAIT: a member that does not
        answer (stopped, cut off) does not hold this node's clients longer, and once its lease
        ran out (it is not running) it is not waited for at all."""
        if not self.ask_members({"op": "applied", "revision": revision}, lambda meta, blobs: None,
                                lambda answers: then(), APPLIED_WAIT):
            then()

    def _refresh_stats(self) -> None:
        by_home: dict[str, list[RemoteQueue]] = {}
        for vhost in self.broker.vhosts.values():
            if vhost.remote_queues:
                for queue in vhost.queues.values():
                    if isinstance(queue, RemoteQueue):
                        by_home.setdefault(queue.home, []).append(queue)
        for home, queues in by_home.items():
            peer = self.peer(home)
            if peer.up:
                def answer(meta: Meta, queues: list[RemoteQueue] = queues) -> None:
                    for queue, stats in zip(queues, meta["stats"]):
                        if stats is not None:
                            queue.stats_from_home(*stats)
                peer.request({"op": "stats", "queues": [[q.vhost.name, q.name] for q in queues]},
                             lambda result, error: None, answer)

    async def stop(self) -> None:
        await cancelled(self._task)
        if self._server is not None:
            self._server.close()
        for peer in list(self.peers.values()):
            await peer.stop()
        for session in list(self.sessions):
            session.link.close()

    def _accepted(self) -> Link:
        # (Before the secret is known no link is accepted: the other node dials again.)
        link = Link(self.secret or None, self.config.node_name, False)

        def ready(future: asyncio.Future) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            session = HomeSession(self.broker, link)
            self.sessions.add(session)
            lost = session.lost

            def ended() -> None:
                self.sessions.discard(session)
                lost()
            link.on_lost = ended
        link.ready.add_done_callback(ready)
        return link

    async def _secret(self) -> bytes:
        """The cluster's secret: made by the first member that needs it, read by the others."""
        key = self.config.keys.root + b"node-link-secret"
        while True:
            try:
                await self.etcd.txn([absent(key)], [put_op(key, os.urandom(32).hex().encode())])
                _, kvs = await self.etcd.get(key)
                if kvs:
                    return kvs[0].value
            except EtcdError as err:
                log.warning("node links: cannot read the cluster's secret from etcd yet: %s", err)
            await asyncio.sleep(RETRY)


def advertised_host(listen_host: str | None, node_name: str) -> str:
    """The address other members dial: the listener's own, or for a wildcard one the node
    name's host part (as RabbitMQ's nodes reach rabbit@HOST)."""
    if listen_host and listen_host not in ("0.0.0.0", "::"):
        return listen_host
    host = node_name.partition("@")[2] or socket.gethostname()
    return host


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
