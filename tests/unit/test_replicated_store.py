"""A replicated queue's store (warren/store/replicated.py) on one replica: publishes confirmed
once committed, every change an entry, and a replay of the log (a restart, or another replica
taking over) that rebuilds the queue: order, delivery counts, what was handed out and not
settled back ahead and redelivered (or kept for its holder, when it may still be there),
purges, returns."""

from __future__ import annotations

import time

from warren.amqp.message import Message
from warren.store.persister import Persister
from warren.store.queued_message import QueuedMessage
from warren.store.replica_log import ReplicaLog
from warren.store.replicated import PAGED, ReplicatedQueueStore


class Waiter:
    def __init__(self) -> None:
        self.told = 0

    def store_synced(self) -> None:
        self.told += 1


def message(n: int) -> Message:
    route = b"\x00\x01q"
    return Message("", "q", route, b"header", f"body-{n}".encode())


def open_store(tmp_path) -> tuple[Persister, ReplicatedQueueStore]:
    persister = Persister(str(tmp_path))
    replica = ReplicaLog(persister, str(tmp_path / "q"))
    store = ReplicatedQueueStore.recover(replica, epoch=1)
    replica.on_durable = store.commit  # (one replica: committed once on its disk)
    return persister, store


def publish(store: ReplicatedQueueStore, seq: int) -> tuple[QueuedMessage, object]:
    qm = QueuedMessage(seq, message(seq))
    point = store.accept(qm)
    store.push(qm)
    return qm, point


def bodies(store: ReplicatedQueueStore) -> list[bytes]:
    return [bytes(qm.message.body) for qm in store.peek_all()]


def test_a_publish_is_safe_once_its_entry_is_committed(tmp_path):
    persister, store = open_store(tmp_path)
    _, point = publish(store, 1)
    waiter = Waiter()
    point.notify(waiter)
    assert point.status() is None and waiter.told == 0
    persister.flush()
    assert point.status() is True and waiter.told == 1


def test_a_replica_that_stops_leading_fails_what_is_not_committed(tmp_path):
    _, store = open_store(tmp_path)
    _, point = publish(store, 1)
    waiter = Waiter()
    point.notify(waiter)
    store.fail()
    assert point.status() is False and waiter.told == 1


def test_the_log_replays_to_the_same_queue(tmp_path):
    persister, store = open_store(tmp_path)
    qms = [publish(store, seq)[0] for seq in range(1, 7)]
    taken = [store.pop() for _ in range(4)]  # 1..4 handed out
    for qm in taken:
        store.delivered(qm)
    store.settle(taken[0])                    # 1 acked
    taken[1].seq = 100                        # 2 returned ahead (a channel closed)
    taken[1].deliveries = 1
    store.requeue(taken[1])
    again = QueuedMessage(101, taken[2].message, True)  # 3 requeued to the tail as a new entry
    again.deliveries = 1
    store.accept(again)
    store.settle(taken[2])
    store.push(again)
    # 4 stays handed out: its consumer goes with this replica
    assert bodies(store) == [b"body-2", b"body-5", b"body-6", b"body-3"]
    persister.sync_now()
    _, replayed = open_store(tmp_path)
    assert bodies(replayed) == [b"body-2", b"body-4", b"body-5", b"body-6", b"body-3"]
    counts = {bytes(qm.message.body): (qm.deliveries, qm.redelivered) for qm in replayed.peek_all()}
    assert counts == {b"body-2": (1, True), b"body-4": (1, True), b"body-5": (0, False), b"body-6": (0, False),
                      b"body-3": (1, True)}
    assert replayed.max_seq > 101 and len(replayed) == 5
    assert replayed.ready_bytes == sum(len(b) for b in bodies(replayed))
    assert qms[0].off == 0 and set(replayed.by_id) == {qm.off for qm in replayed.peek_all()}


def test_what_a_surviving_holder_held_stays_parked_for_it(tmp_path):
    persister, store = open_store(tmp_path)
    for seq in range(1, 6):
        publish(store, seq)
    for holder in ("b/run/1", "b/run/1", "a/run/7", "", "c/run/2"):
        store.delivered(store.pop(), holder)
    persister.sync_now()
    replica = ReplicaLog(persister, str(tmp_path / "q"))
    replayed = ReplicatedQueueStore.recover(replica, epoch=2, keep=lambda holder: holder.startswith(("b/", "c/")))
    # the dead node's and the old leader's own consumers' messages are back, ahead, counted
    assert bodies(replayed) == [b"body-3", b"body-4"]
    assert all(qm.deliveries == 1 and qm.redelivered for qm in replayed.peek_all())
    assert {h: sorted(bytes(qm.message.body) for qm in held.values()) for h, held in replayed.parked.items()} == {
        "b/run/1": [b"body-1", b"body-2"], "c/run/2": [b"body-5"]}
    assert replayed.ready_bytes == sum(len(b) for b in bodies(replayed))
    replayed.log_returns()  # (as the new leader does)
    claimed = replayed.claim("b/run/1")
    assert sorted(claimed) == [0, 1] and all(qm.deliveries == 1 for qm in claimed.values())
    assert replayed.unpark(4) is not None and replayed.unpark(4) is None and not replayed.parked
    # settled where it was claimed: gone from the next replay too
    replayed.settle(claimed[0])
    persister.sync_now()
    again = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=3,
                                         keep=lambda holder: True)
    assert {h: sorted(held) for h, held in again.parked.items()} == {"b/run/1": [1], "c/run/2": [4]}


def test_what_a_holder_was_handed_after_the_last_entry_here_is_taken_back_not_delivered_anew(tmp_path):
    """The old leader handed ids 1 and 2 to a consumer and died before their DELIVERED entry
    reached this replica: when the consumer re-attaches saying it holds them, they leave the
    ready ones (fresh or returned) as its own, counted, and a further replay parks them."""
    persister, store = open_store(tmp_path)
    for seq in range(1, 7):
        publish(store, seq)
    returned = store.pop()
    store.delivered(returned, "")
    store.requeue(returned)  # (id 0 back ahead of the fresh ones)
    persister.sync_now()
    replayed = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=2)
    ready_bytes = replayed.ready_bytes
    taken = replayed.take_back("b/run/1", [0, 2, 3, 99])
    assert sorted(taken) == [0, 2, 3] and all(qm.deliveries >= 1 for qm in taken.values())
    assert bodies(replayed) == [b"body-2", b"body-5", b"body-6"]
    assert replayed.ready_bytes == ready_bytes - sum(len(qm.message.body) for qm in taken.values())
    assert replayed.take_back("b/run/1", [2, 3]) == {}  # (no longer ready)
    persister.sync_now()
    again = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=3,
                                         keep=lambda holder: True)
    assert {h: sorted(held) for h, held in again.parked.items()} == {"b/run/1": [0, 2, 3]}
    assert bodies(again) == [b"body-2", b"body-5", b"body-6"]


def test_a_purge_replays_as_a_purge_and_keeps_what_was_handed_out(tmp_path):
    persister, store = open_store(tmp_path)
    for seq in range(1, 5):
        publish(store, seq)
    out = store.pop()
    store.delivered(out)
    assert store.purge() == 3
    publish(store, 5)
    persister.sync_now()
    _, replayed = open_store(tmp_path)
    assert bodies(replayed) == [b"body-1", b"body-5"]
    assert replayed.peek().redelivered


def test_a_ttl_deadline_survives_the_replay(tmp_path):
    persister, store = open_store(tmp_path)
    qm = QueuedMessage(1, message(1))
    qm.expiry = time.monotonic() + 60
    store.accept(qm)
    store.push(qm)
    persister.sync_now()
    _, replayed = open_store(tmp_path)
    assert abs(replayed.peek().expiry - qm.expiry) < 0.01


def test_ready_messages_beyond_the_window_are_read_back_from_the_log(tmp_path):
    persister = Persister(str(tmp_path))
    replica = ReplicaLog(persister, str(tmp_path / "q"))
    store = ReplicatedQueueStore(replica, epoch=1, window=2)
    for seq in range(1, 6):
        publish(store, seq)
    assert sum(qm.message is PAGED for qm in store._fresh) == 3  # (only the window's bodies in memory)
    assert store.ready_bytes == sum(len(f"body-{n}") for n in range(1, 6))
    assert [bytes(store.pop().message.body) for _ in range(2)] == [b"body-1", b"body-2"]
    assert bytes(store.peek().message.body) == b"body-3"
    assert store.ready_bytes == sum(len(f"body-{n}") for n in range(3, 6))
    persister.sync_now()
    replayed = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=1)
    assert bodies(replayed) == [b"body-1", b"body-2", b"body-3", b"body-4", b"body-5"]
    assert replayed.ready_bytes == sum(len(f"body-{n}") for n in range(1, 6))


def test_a_publish_from_another_node_is_known_again_after_a_replay(tmp_path):
    """ENQUEUE_FROM: the last publish of each numbered publisher is known (to this replica,
    and to the next leader replaying the log: QuorumQueue.publish_from takes a publisher's in
    order by it), and its message reads back as a plain one."""
    persister, store = open_store(tmp_path)
    for n in (1, 2, 3):
        qm = QueuedMessage(n, message(n))
        store.origin = ("node-b/run", n)
        store.accept(qm)
        assert store.origin is None  # (taken by that entry only)
        store.push(qm)
    publish(store, 4)  # (one not numbered: a requeue's copy)
    persister.flush()
    assert store.enqueuers == {"node-b/run": 3}
    replayed = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=2)
    assert replayed.enqueuers == {"node-b/run": 3}
    assert bodies(replayed) == [b"body-1", b"body-2", b"body-3", b"body-4"]


def test_a_restarted_leader_holds_its_entries_until_it_has_an_epoch_of_its_own(tmp_path):
    """Before its new epoch (warren.cluster.replicas: its old one may hold entries its followers
    have and it lost) a restarted leader writes nothing: what it accepts, hands out or settles
    waits in memory, readable, and is written in the new epoch by `lead`."""
    persister, store = open_store(tmp_path)
    publish(store, 1)
    persister.flush()
    store.held = []
    store.window = 1  # (the next publishes are paged: read back from what is held)
    qm2, point = publish(store, 2)
    publish(store, 3)
    store.delivered(store.pop())
    assert store.log.end == 1 and [qm2.off] == [1]
    assert bodies(store) == [b"body-2", b"body-3"] and store.pop() is qm2  # (paged, read from the held entries)
    persister.flush()
    assert point.status() is None  # (held: not on disk, not committed)
    store.lead(5)
    assert store.log.end == 4 and store.log.history.starts == [(1, 0), (5, 1)]  # (two publishes, a delivery)
    persister.flush()
    assert point.status() is True
    persister.sync_now()
    _, replayed = open_store(tmp_path)
    assert len(replayed.by_id) == 3
