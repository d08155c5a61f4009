#!/usr/bin/env python3
"""Replicated quorum queues on a three-node cluster: Warren (three etcd members and three nodes)
against RabbitMQ 3.10 (three clustered nodes), on this machine, in the same invocation.

    /work/venv/bin/python bench/cluster_quorum.py [--messages 20000] [--window 100]
        [--prefetch 100] [--ack-every 25] [--repeat 1] [--rounds 3] [--target both]
        [--phases across,leader,failover] [--json FILE] [--keep-tmp] [--py-spy DIR]

(Needs bench/loadgen, made as bench/cluster.py makes it, and aiormq, aio-pika's AMQP core: run it
with the project's venv.) The clusters are bench/cluster.py's, with their management APIs on
(the queue's leader and members are read there: GET /api/queues/%2F/NAME).

Every queue is durable, `x-queue-type: quorum`, three members; the messages 1 KiB persistent.

  across    declared through node 3 (its leader: node 3 on both brokers, the declaring node),
            a loadgen publisher on node 1 (publisher confirms, at most --window unconfirmed),
            a loadgen consumer on node 2 (prefetch --prefetch, manual acks with multiple=true
            every --ack-every), --messages messages: msg/s end to end (first publish to last
            ack), the publisher's confirmed msg/s, confirm latency (publish to basic.ack)
            p50/p99, publish to delivery p50/p99, broker CPU per message;
  leader    the same with the queue declared through node 1 and both clients on its leader;
  failover  a queue declared through node 1; an aiormq publisher (ids 0, 1, 2, ... in the body,
            --window unconfirmed, a nacked, returned or lost publish sent again as a new attempt
            of its id) and an aiormq consumer (prefetch --prefetch, manual acks), each on one of
            the two nodes that do not lead the queue, run all through --rounds rounds of: confirms
            flowing for 2 s, kill -9 of the leader node's processes (Warren: the node's process
            group; RabbitMQ: the node's, beam and its port programs), the time to the first
            confirm of a publish sent after the kill (and to the first confirm, and delivery, of
            any), the node started again on its data, every member back online. The clients move
            to the new non-leaders between rounds (not timed). Then the checker (Jepsen's total
            queue): whatever the consumer did not get is read with basic.get; lost = confirmed
            ids never read (must be 0), unexpected = ids read that were never published,
            duplicated = ids read more than once (of which: ids confirmed at their first
            attempt, so a redelivery, not a publish sent twice; and reads of an id read before
            that were not flagged redelivered).

Progress goes to stderr, a Markdown table (medians over --repeat rounds of across/leader and
over the failover rounds, each value in brackets) to stdout. The brokers alternate their order
per --repeat round. --py-spy DIR records each Warren node during across/leader (raw stacks; the
sampling slows Warren, so the figures of such a run are not comparable).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tools"))

from cluster import NODES, RabbitCluster, WarrenCluster, cell, queue_run  # noqa: E402
from rabbitmq_node import kill_all_children  # noqa: E402
from run import LOADGEN, fmt_num, log  # noqa: E402

QQ = {"x-queue-type": "quorum"}
BODY_SIZE = 1024
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


# --------------------------------------------------------------------------
# the queue's record, through any node's management API


def queue_info(cluster, queue: str, skip: int | None = None) -> dict | None:
    """GET /api/queues/%2F/QUEUE from the first node (other than `skip`) that answers 200."""
    for i in range(NODES):
        if i == skip:
            continue
        req = urllib.request.Request(f"{cluster.api(i)}/queues/%2F/{urllib.parse.quote(queue, safe='')}",
                                     headers={"Authorization": AUTH})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError):
            continue
    return None


def leader_of(cluster, queue: str, skip: int | None = None) -> int | None:
    info = queue_info(cluster, queue, skip)
    name = info.get("leader") if info else None
    return cluster.names.index(name) if name in cluster.names else None


def wait_for(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.1)


def all_online(cluster, queue: str) -> bool:
    info = queue_info(cluster, queue)
    return bool(info) and info.get("leader") in cluster.names and \
        sorted(info.get("online") or []) == sorted(cluster.names) and \
        sorted(info.get("members") or []) == sorted(cluster.names)


def declare(cluster, node: int, queue: str) -> int:
    """Declare the quorum queue through `node`; wait until all three members are online;
    its leader's index."""
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[node]))
    conn.channel().queue_declare(queue, durable=True, arguments=QQ)
    conn.close()
    wait_for(f"{cluster.name} {queue}: three members online", lambda: all_online(cluster, queue), 60)
    leader = leader_of(cluster, queue)
    assert leader is not None
    return leader


# --------------------------------------------------------------------------
# across and leader: loadgen clients (bench/cluster.py's queue_run)


def measure_flow(cluster, args, round_no: int) -> dict:
    metrics: dict[str, float | None] = {}
    raw: dict[str, dict] = {}
    for placement in ("across", "leader"):
        if placement not in args.phase_set:
            continue
        queue = f"bench.r{round_no}.qq.{placement}"
        home = 2 if placement == "across" else 0
        leader = declare(cluster, home, queue)
        pub, cons = (0, 1) if placement == "across" else (leader, leader)
        if placement == "across" and leader in (pub, cons):
            log(f"{cluster.name}: {queue} led by node {leader + 1}, a client's node")
        m, r = queue_run(cluster, args, queue, home, pub, cons, f"r{round_no + 1}-{placement}",
                         queue_type="quorum")
        m["leader_node"] = leader + 1
        metrics.update({f"{placement}_{k}": v for k, v in m.items()})
        raw[placement] = r
        log(f"{cluster.name} round {round_no + 1}: {placement} (leader node {leader + 1}): "
            f"{m['rate']:.0f} msg/s end to end, confirm p50 {m['confirm_p50_ms']:.2f} ms "
            f"p99 {m['confirm_p99_ms']:.2f} ms, broker CPU {m['cpu_us']:.0f} µs/msg")
    return {"metrics": metrics, "raw": raw}


# --------------------------------------------------------------------------
# failover: aiormq clients in a thread of their own, the kills from the main thread


class Load:
    """A confirming publisher and a manually acking consumer of one queue, each on the node the
    main thread names (pub_node, cons_node), reconnecting there when their connection,
    channel or consumer ends; every publish's id, attempt, confirm and delivery counted."""

    def __init__(self, ports: list[int], queue: str, window: int, prefetch: int, ack_every: int):
        self.ports, self.queue = ports, queue
        self.window, self.prefetch, self.ack_every = window, prefetch, ack_every
        self.pub_node = self.cons_node = 0
        self.pub_on: int | None = None
        self.cons_on: int | None = None
        self.attempts: collections.Counter[int] = collections.Counter()
        self.confirmed: set[int] = set()
        self.received: collections.Counter[int] = collections.Counter()
        self.redelivered = 0
        self.unflagged = 0  # deliveries of an id read before, without the redelivered flag
        self.nacked = self.returned = self.returned_after_ack = self.lost_publishes = 0
        self.retry: collections.deque[int] = collections.deque()
        self.acked_at: dict[int, float] = {}
        self.acked_attempts: set[str] = set()
        self.returned_attempts: set[str] = set()
        self.kills: list[float] = []
        self.last_confirm = 0.0
        self.kill_at = float("inf")  # set by the main thread just before a kill
        self.acks_after_kill: list[tuple[float, float, int]] = []  # (acked, sent, id)
        self.after_kill: dict[str, float] = {}  # the first delivery after the kill
        self.stopping = False  # publisher: no new publishes
        self.done = False      # consumer: stop
        self.publisher_idle = threading.Event()
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="failover-load", daemon=True)

    def _url(self, node: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.ports[node]}/"

    def _run(self) -> None:
        channel_log = logging.getLogger("aiormq.channel")
        channel_log.propagate = False  # (a broker's cancel is logged as a warning: expected here)
        channel_log.addHandler(logging.NullHandler())
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # (returned futures never awaited)
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.gather(self._publisher(), self._consumer()))

    def start(self) -> None:
        self.thread.start()

    def mark_kill(self) -> float:
        self.after_kill, self.acks_after_kill = {}, []
        self.kill_at = time.monotonic()
        self.kills.append(self.kill_at)
        return self.kill_at

    def first_ack_after_kill(self, sent_after: bool) -> float | None:
        """When the first publish (sent after the kill, if `sent_after`) was acked after the kill
        and stayed confirmed (not returned after its ack)."""
        return next((acked for acked, sent, i in list(self.acks_after_kill)
                     if i in self.confirmed and (sent > self.kill_at or not sent_after)), None)

    def _returned(self, attempt: str) -> None:
        """A basic.return of the publish `attempt` ("id.attempt", its message-id). One that came
        after its publish's basic.ack (aiormq then drops it unseen) means the id is not
        confirmed after all: it is sent again."""
        self.returned_attempts.add(attempt)
        if attempt in self.acked_attempts:
            self.returned_after_ack += 1
            i = int(attempt.split(".")[0])
            if i in self.confirmed:
                self.confirmed.discard(i)
                self.retry.append(i)

    def _watch_returns(self, channel) -> None:
        """Every basic.return of `channel` seen here first: aiormq matches a return to its
        publish by message-id only while the publish awaits its confirm."""
        from aiormq.channel import Returning
        from aiormq.exceptions import PublishError

        async def on_return(frame) -> None:
            header = await channel._Channel__get_content_header()
            message = await channel._read_content(frame, header)
            attempt = message.header.properties.message_id
            self._returned(attempt)
            tag = channel.message_id_delivery_tag.get(attempt)
            confirmation = channel.confirmations.pop(tag, None) if tag is not None else None
            if confirmation is not None and not confirmation.done():
                channel.confirmations[tag] = Returning()
                confirmation.set_exception(PublishError(message, frame))
        channel._on_return_frame = on_return

    async def _publisher(self) -> None:
        import aiormq
        from aiormq.abc import Basic
        next_id = 0
        retry = self.retry
        while not self.stopping:
            node = self.pub_node
            try:
                conn = await asyncio.wait_for(aiormq.connect(self._url(node)), 10)
                channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
                self._watch_returns(channel)
            except Exception:
                await asyncio.sleep(0.2)
                continue
            self.pub_on = node
            window = asyncio.Semaphore(self.window)
            broken = asyncio.Event()
            tasks: set[asyncio.Task] = set()

            async def publish(i: int) -> None:
                sent = time.monotonic()
                self.attempts[i] += 1
                attempt = f"{i}.{self.attempts[i]}"
                try:
                    answer = await channel.basic_publish(
                        str(i).encode().ljust(BODY_SIZE, b"."), routing_key=self.queue,
                        properties=Basic.Properties(delivery_mode=2, message_id=attempt), mandatory=True)
                    if isinstance(answer, Basic.Ack) and attempt in self.returned_attempts:
                        self.returned += 1  # (returned, then acked: not in the queue)
                        retry.append(i)
                    elif isinstance(answer, Basic.Ack):
                        self.acked_attempts.add(attempt)
                        now = time.monotonic()
                        self.confirmed.add(i)
                        self.acked_at[i] = now
                        self.last_confirm = now
                        if now > self.kill_at and len(self.acks_after_kill) < 100_000:
                            self.acks_after_kill.append((now, sent, i))
                    else:
                        self.nacked += 1
                        retry.append(i)
                except aiormq.exceptions.PublishError:  # (returned: unroutable for now)
                    self.returned += 1
                    retry.append(i)
                except aiormq.exceptions.DeliveryError:  # (aiormq raises a basic.nack)
                    self.nacked += 1
                    retry.append(i)
                except Exception as err:  # (the channel or connection gone: its fate unknown)
                    if len(self.errors) < 5 and not broken.is_set():
                        self.errors.append(f"publisher on node {node + 1}: {err!r}")
                    self.lost_publishes += 1
                    retry.append(i)
                    broken.set()
                finally:
                    window.release()

            while not self.stopping and not broken.is_set() and self.pub_node == node and not conn.is_closed:
                await window.acquire()
                if self.stopping or broken.is_set():
                    window.release()
                    break
                if retry:
                    i = retry.popleft()
                else:
                    i, next_id = next_id, next_id + 1
                task = asyncio.create_task(publish(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks), timeout=60)
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:
                pass
            self.pub_on = None
        self.publisher_idle.set()

    async def _consumer(self) -> None:
        import aiormq
        while not self.done:
            node = self.cons_node
            try:
                conn = await asyncio.wait_for(aiormq.connect(self._url(node)), 10)
                channel = await conn.channel()
                await channel.basic_qos(prefetch_count=self.prefetch)
            except Exception:
                await asyncio.sleep(0.2)
                continue
            cancelled = asyncio.Event()
            channel.on_consumer_cancel_callbacks.add(lambda frame: cancelled.set())
            pending = {"tag": 0, "count": 0}

            async def on_message(message) -> None:
                i = int(message.body[:message.body.index(b".")])
                if self.received[i] and not message.delivery.redelivered:
                    self.unflagged += 1
                self.received[i] += 1
                if message.delivery.redelivered:
                    self.redelivered += 1
                if time.monotonic() > self.kill_at:
                    self.after_kill.setdefault("delivery", time.monotonic())
                pending["tag"], pending["count"] = message.delivery.delivery_tag, pending["count"] + 1
                if pending["count"] >= self.ack_every:
                    pending["count"] = 0
                    await channel.basic_ack(pending["tag"], multiple=True)

            try:
                await channel.basic_consume(self.queue, on_message, no_ack=False)
                self.cons_on = node
                while not (self.done or cancelled.is_set() or conn.is_closed or channel.is_closed
                           or self.cons_node != node):
                    await asyncio.sleep(0.05)
                    if pending["count"]:  # (the tail of a burst acked too)
                        pending["count"] = 0
                        await channel.basic_ack(pending["tag"], multiple=True)
            except Exception:
                pass
            self.cons_on = None
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:
                pass


def failover(cluster, args) -> dict:
    queue = "bench.qq.failover"
    leader = declare(cluster, 0, queue)
    load = Load(cluster.ports, queue, args.window, args.prefetch, args.ack_every)
    rounds: list[dict] = []
    try:
        others = [i for i in range(NODES) if i != leader]
        load.pub_node, load.cons_node = others
        load.start()
        for r in range(args.rounds):
            if r:  # (wait_for wants a true value: node 1 is index 0)
                leader = wait_for(f"{cluster.name}: {queue}'s leader",
                                  lambda: [leader_of(cluster, queue)] if leader_of(cluster, queue) is not None
                                  else None, 60)[0]
            others = [i for i in range(NODES) if i != leader]
            load.pub_node, load.cons_node = others
            wait_for(f"{cluster.name}: clients on nodes {others}",
                     lambda: (load.pub_on, load.cons_on) == tuple(others), 60)
            wait_for(f"{cluster.name}: confirms flowing",
                     lambda: time.monotonic() - load.last_confirm < 0.2, 60)
            time.sleep(2.0)
            if time.monotonic() - load.last_confirm > 0.5:
                raise RuntimeError(f"{cluster.name}: confirms stopped before the kill")
            confirmed0 = len(load.confirmed)
            killed = load.mark_kill()
            cluster.kill(leader)
            log(f"{cluster.name} failover round {r + 1}: killed node {leader + 1} (the leader)")
            try:
                wait_for(f"{cluster.name}: a confirm of a publish sent after the kill",
                         lambda: load.first_ack_after_kill(True) is not None, args.failover_timeout)
                time.sleep(0.5)  # (a basic.return after its ack comes within this)
            finally:
                t_restart = time.monotonic()
                cluster.restart(leader)
            new_leader = leader_of(cluster, queue)
            wait_for(f"{cluster.name}: node {leader + 1} back online in {queue}",
                     lambda: all_online(cluster, queue), 120)
            ak = load.after_kill
            res = {"killed": leader + 1, "new_leader": (new_leader + 1) if new_leader is not None else None,
                   "confirm_sent_after_s": load.first_ack_after_kill(True) - killed,
                   "confirm_any_s": load.first_ack_after_kill(False) - killed,
                   "delivery_s": ak["delivery"] - killed if "delivery" in ak else None,
                   "restart_to_online_s": time.monotonic() - t_restart,
                   "confirmed_before": confirmed0}
            rounds.append(res)
            log(f"{cluster.name} failover round {r + 1}: next confirm of a publish sent after the kill "
                f"{res['confirm_sent_after_s']:.3f} s, of any {fmt_num(res['confirm_any_s'])} s, "
                f"next delivery {fmt_num(res['delivery_s'])} s; new leader node {res['new_leader']}; "
                f"restarted node online after {res['restart_to_online_s']:.1f} s")
        time.sleep(1.0)
    finally:
        load.stopping = True
        load.publisher_idle.wait(90)
        # the consumer reads what it can; then the rest is read with basic.get
        end = time.monotonic() + 30
        while time.monotonic() < end and not load.confirmed <= set(load.received):
            time.sleep(0.2)
        time.sleep(1.0)
        load.done = True
        load.thread.join(30)
    got = collections.Counter(load.received)
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[0]))
    ch = conn.channel()
    drained = 0
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        i = int(body[:body.index(b".")])
        if got[i] and not method.redelivered:
            load.unflagged += 1
        got[i] += 1
        drained += 1
    info = queue_info(cluster, queue) or {}
    ch.queue_delete(queue)
    conn.close()
    duplicated = {i for i, n in got.items() if n > 1}
    counts = {"published": len(load.attempts), "confirmed": len(load.confirmed),
              "lost": len(load.confirmed - set(got)), "unexpected": len(set(got) - set(load.attempts)),
              "duplicated": len(duplicated),
              "duplicated_first_attempt": sum(1 for i in duplicated if load.attempts[i] == 1),
              "redelivered": load.redelivered, "unflagged": load.unflagged, "drained_after": drained, "nacked": load.nacked,
              "returned": load.returned, "returned_after_ack": load.returned_after_ack,
              "publishes_lost_with_a_connection": load.lost_publishes,
              "left_unacked": info.get("messages_unacknowledged")}
    log(f"{cluster.name} failover checker: {counts}")
    for error in load.errors:
        log(f"{cluster.name} failover: {error}")
    lost = sorted(load.confirmed - set(got))
    if lost:  # when the lost ones were confirmed, from the nearest kill before
        near = [load.acked_at[i] - max((k for k in load.kills if k <= load.acked_at[i]), default=0.0)
                for i in lost]
        log(f"{cluster.name} lost ids {lost[:5]}...{lost[-5:]}, confirmed after the kill before them: "
            f"min {min(near):.3f} s, median {statistics.median(near):.3f} s, max {max(near):.3f} s")
    metrics: dict[str, float | None] = {
        "fo_confirm_sent_after_s": statistics.median(x["confirm_sent_after_s"] for x in rounds),
        "fo_confirm_any_s": statistics.median(x["confirm_any_s"] for x in rounds),
        "fo_delivery_s": statistics.median(x["delivery_s"] for x in rounds if x["delivery_s"] is not None)
        if any(x["delivery_s"] is not None for x in rounds) else None,
        "fo_restart_to_online_s": statistics.median(x["restart_to_online_s"] for x in rounds)}
    metrics.update({f"fo_{k}": v for k, v in counts.items()})
    return {"metrics": metrics, "rounds": rounds, "counts": counts, "errors": load.errors}


# --------------------------------------------------------------------------
# the table

ROWS: list[tuple[str, str]] = []
for _pl, _who in (("across", "leader node 3, publisher on node 1, consumer on node 2"),
                  ("leader", "publisher and consumer on the leader's node")):
    _q = f"{_pl} ({_who})"
    ROWS += [(f"{_pl}_rate", f"{_q}: msg/s end to end (first publish to last ack)"),
             (f"{_pl}_publish_rate", f"{_q}: msg/s confirmed (the publisher's own)"),
             (f"{_pl}_confirm_p50_ms", f"{_q}: publish to confirm p50 ms"),
             (f"{_pl}_confirm_p99_ms", f"{_q}: publish to confirm p99 ms"),
             (f"{_pl}_delivery_p50_ms", f"{_q}: publish to delivery p50 ms"),
             (f"{_pl}_delivery_p99_ms", f"{_q}: publish to delivery p99 ms"),
             (f"{_pl}_cpu_us", f"{_q}: broker CPU µs per message (all nodes)")]
    ROWS += [(f"{_pl}_cpu_node{_i}_us", f"{_q}: of which node {_i}") for _i in range(1, NODES + 1)]
    ROWS += [(f"{_pl}_etcd_cpu_us", f"{_q}: etcd CPU µs per message")]
ROWS += [("fo_confirm_sent_after_s", "failover: kill -9 of the leader to the first confirm of a publish sent after it, s"),
         ("fo_confirm_any_s", "failover: kill -9 of the leader to the first confirm (any publish), s"),
         ("fo_delivery_s", "failover: kill -9 of the leader to the next delivery, s"),
         ("fo_restart_to_online_s", "failover: killed node started again to all three members online, s"),
         ("fo_confirmed", "failover checker: confirmed"),
         ("fo_lost", "failover checker: lost (confirmed, never read)"),
         ("fo_unexpected", "failover checker: unexpected (read, never published)"),
         ("fo_duplicated", "failover checker: duplicated (read more than once)"),
         ("fo_duplicated_first_attempt", "failover checker: of which confirmed at their first attempt"),
         ("fo_redelivered", "failover checker: deliveries flagged redelivered"),
         ("fo_unflagged", "failover checker: an id read again without the redelivered flag"),
         ("fo_nacked", "failover: publishes nacked"),
         ("fo_returned", "failover: publishes returned (unroutable), the return before the confirm"),
         ("fo_returned_after_ack", "failover: publishes returned after their confirm (not counted confirmed)"),
         ("fo_publishes_lost_with_a_connection", "failover: publishes whose channel or connection closed"),
         ("fo_left_unacked", "failover checker: unacked in the queue after the drain (no consumer left)")]
COUNTS = {k for k, _ in ROWS if k.startswith("fo_") and not k.endswith("_s")}


def render(results: dict[str, list[dict]]) -> str:
    targets = [t for t in ("warren", "rabbitmq") if t in results]
    head = ["Metric"] + [{"warren": "Warren", "rabbitmq": "RabbitMQ 3.10.8"}[t] for t in targets]
    if len(targets) == 2:
        head.append("Warren/RabbitMQ")
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for key, label in ROWS:
        cols = {t: [r["metrics"].get(key) for r in results[t]] for t in targets}
        if key.startswith("fo_") and not key in COUNTS:  # the failover's rounds, each in brackets
            cols = {t: [x[key[3:]] for r in results[t] for x in r.get("rounds", ())
                        if x.get(key[3:]) is not None] for t in targets}
            cols = {t: v if v else [None] for t, v in cols.items()}
        if not any(v is not None for vs in cols.values() for v in vs):
            continue
        row = [label] + [str(int(cols[t][0])) if key in COUNTS and cols[t][0] is not None else cell(cols[t])
                         for t in targets]
        if len(targets) == 2:
            w = [v for v in cols["warren"] if v is not None]
            r = [v for v in cols["rabbitmq"] if v is not None]
            row.append(fmt_num(statistics.median(w) / statistics.median(r))
                       if key not in COUNTS and w and r and statistics.median(r) > 0 else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=["warren", "rabbitmq", "both"], default="both")
    ap.add_argument("--phases", default="across,leader,failover",
                    help="comma-separated: across, leader, failover (default all three)")
    ap.add_argument("--messages", type=int, default=20000, help="across/leader: messages per run (default 20,000)")
    ap.add_argument("--seconds", type=float, default=0, help="across/leader: publish for S seconds instead")
    ap.add_argument("--window", type=int, default=100, help="unconfirmed publishes at most (default 100)")
    ap.add_argument("--prefetch", type=int, default=100, help="the consumer's prefetch (default 100)")
    ap.add_argument("--ack-every", type=int, default=25,
                    help="the consumer acks with multiple=true every N messages (default 25)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of across/leader; the brokers alternate")
    ap.add_argument("--rounds", type=int, default=3, help="failover: kills of the leader (default 3)")
    ap.add_argument("--failover-timeout", type=float, default=60,
                    help="failover: give up on a round after S s without a confirm (default 60)")
    ap.add_argument("--py-spy", metavar="DIR", help="record each Warren node with py-spy during across/leader")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the clusters' directories and logs")
    args = ap.parse_args()
    args.phase_set = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not args.phase_set or args.phase_set - {"across", "leader", "failover"}:
        ap.error(f"--phases: across, leader and/or failover, not {args.phases!r}")
    args.mgmt = True  # (the queue's leader and members)
    subprocess.run(["make", "-s", "-C", os.path.dirname(LOADGEN), "loadgen"], stdin=subprocess.DEVNULL)
    if not os.access(LOADGEN, os.X_OK):
        ap.error(f"{LOADGEN} missing; run make -C bench")
    args.py_spy_bin = None
    if args.py_spy:
        args.py_spy_bin = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if args.py_spy_bin is None:
            ap.error("--py-spy: no py-spy on PATH nor next to this Python")
    targets = ["warren", "rabbitmq"] if args.target == "both" else [args.target]
    kinds = {"warren": WarrenCluster, "rabbitmq": RabbitCluster}
    clusters = {t: kinds[t](args) for t in targets}
    results: dict[str, list[dict]] = {t: [] for t in targets}
    try:
        for t in targets:
            clusters[t].start()
        flow = args.phase_set & {"across", "leader"}
        if flow:  # the node links and the clients' code warm, not measured
            warm = argparse.Namespace(**{**vars(args), "messages": 1000, "seconds": 0, "py_spy": None})
            for t in targets:
                declare(clusters[t], 2, "bench.warmup.qq")
                queue_run(clusters[t], warm, "bench.warmup.qq", 2, 0, 1, "warmup", queue_type="quorum")
            for round_no in range(args.repeat):
                order = targets if round_no % 2 == 0 else list(reversed(targets))
                for t in order:
                    results[t].append(measure_flow(clusters[t], args, round_no))
        if "failover" in args.phase_set:
            for t in targets:
                res = failover(clusters[t], args)
                if results[t]:
                    results[t][0]["metrics"].update(res["metrics"])
                    results[t][0]["rounds"] = res["rounds"]
                else:
                    results[t].append(res)
    finally:
        for t in targets:
            try:
                clusters[t].stop()
            except Exception as err:
                log(f"{t}: stop: {err}")
        kill_all_children()
    print()
    print(f"quorum queues, 3 members; {args.messages:,} × 1 KiB persistent per across/leader run "
          f"(confirm window {args.window}, prefetch {args.prefetch}, acks multiple every {args.ack_every}); "
          f"{args.repeat} round(s) of those, {args.rounds} failover round(s); medians, each in brackets")
    print()
    print(render(results))
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "phase_set"},
                       "results": results}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
