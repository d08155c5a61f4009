"""QuorumPublisher (warren/broker/queues/quorum_publisher.py): a node's publishes to a
replicated quorum queue are kept until a leader answers, sent again in order to the next
leader when theirs is lost, and nacked only once no leader took them for RESEND_FOR seconds."""

from __future__ import annotations

import struct

from warren.amqp.message import Message
from warren.broker.queues import quorum_publisher
from warren.broker.queues.quorum_publisher import QuorumPublisher
from warren.cluster.node_links import RemoteSettlement
from warren.store.settlement import MOVED, REJECTED, SETTLED, Decision, Wake


class Route:
    """A leader as the publisher sees it: every send is recorded, answered by `answer`."""

    def __init__(self) -> None:
        self.deleted = False
        self.leader: str | None = "b"
        self.sent: list[tuple[str | None, int, int]] = []  # (leader, n, low)
        self.answer = lambda: RemoteSettlement()
        self.attempts: list[Decision] = []

    def leader_in_reach(self) -> str | None:
        return self.leader

    def send(self, message, origin, low):
        self.sent.append((self.leader, origin[1], low))
        attempt = self.answer()
        self.attempts.append(attempt)
        return attempt


def message(n: int) -> Message:
    body = f"m{n}".encode()
    return Message("", "q", b"\x00\x01q", struct.pack(">HHQH", 60, 0, len(body), 0), body)


def lost(attempt: RemoteSettlement) -> None:
    """Its leader's link ended (node_links.Peer._lost)."""
    attempt.moved = True
    attempt.decide(False)


def test_a_publish_is_answered_as_its_leader_answers_it():
    route = Route()
    publisher = QuorumPublisher(route)
    first, second = publisher.publish(message(1)), publisher.publish(message(2))
    assert route.sent == [("b", 1, 1), ("b", 2, 1)]
    told: list[bool | None] = []
    first.notify(Wake(lambda: told.append(first.status())))
    route.attempts[0].decide(True)
    assert (told, second.status()) == ([True], None)
    route.attempts[1].decide(False)  # (refused there: reject-publish)
    assert second.status() is False
    assert publisher.waiting == {}


def test_publishes_whose_leader_was_lost_go_again_in_order_to_the_next():
    route = Route()
    publisher = QuorumPublisher(route)
    resents = [publisher.publish(message(n)) for n in (1, 2, 3)]
    route.attempts[0].decide(True)
    lost(route.attempts[1])
    lost(route.attempts[2])
    assert [r.status() for r in resents] == [True, None, None] and publisher.resend_due
    route.leader = None  # (none elected yet: a new publish waits behind them)
    fourth = publisher.publish(message(4))
    assert len(route.sent) == 3 and fourth.status() is None
    route.leader = "c"
    publisher.resend()
    assert route.sent[3:] == [("c", 2, 2), ("c", 3, 2), ("c", 4, 2)]
    publisher.resend()  # (what is with the leader now is not sent twice)
    assert len(route.sent) == 6


def test_an_answer_given_at_once_decides_the_publish():
    route = Route()
    publisher = QuorumPublisher(route)
    route.answer = lambda: SETTLED  # (its log had it, committed)
    assert publisher.publish(message(1)) is SETTLED  # (as it was answered: its callers tell them so)
    route.answer = lambda: REJECTED
    assert publisher.publish(message(2)) is REJECTED
    route.answer = lambda: MOVED  # (that node no longer leads: sent again, not nacked)
    third = publisher.publish(message(3))
    assert third.status() is None and publisher.resend_due
    route.answer = lambda: SETTLED
    publisher.resend()
    assert third.status() is True and publisher.waiting == {}


def test_a_publish_no_leader_takes_in_time_is_nacked(monkeypatch):
    route = Route()
    route.leader = None
    publisher = QuorumPublisher(route)
    resent = publisher.publish(message(1))
    assert route.sent == [] and resent.status() is None
    publisher.resend()
    assert resent.status() is None
    monkeypatch.setattr(quorum_publisher, "RESEND_FOR", -1.0)  # (as if RESEND_FOR seconds went by)
    publisher.resend()
    assert resent.status() is False and publisher.waiting == {}


def test_a_deleted_queues_waiting_publishes_are_nacked():
    route = Route()
    publisher = QuorumPublisher(route)
    resent = publisher.publish(message(1))
    route.deleted = True
    lost(route.attempts[0])  # (deleted: not sent again)
    assert resent.status() is False


def test_a_leaders_own_publish_over_its_limit_is_refused_and_the_next_taken(tmp_path):
    """A replicated queue's leader (reject-publish, max-length 1): its node's publish over the
    limit is REJECTED, as a publish to any queue is (dead-lettering and the HTTP API tell it by
    that), and the publisher's next one, numbered after it, is taken (not MOVED: the refused
    one left no gap in the log)."""
    from warren.broker.queues.quorum import QuorumQueue
    from warren.broker.vhost import VHost
    from warren.store.persister import Persister
    from warren.store.replica_log import ReplicaLog
    from warren.store.replicated import ReplicatedQueueStore

    persister = Persister(str(tmp_path))
    store = ReplicatedQueueStore.recover(ReplicaLog(persister, str(tmp_path / "q")), epoch=1)
    queue = QuorumQueue(VHost("/"), "q", True, None, False,
                        {"x-queue-type": "quorum", "x-max-length": 2, "x-overflow": "reject-publish"}, store)
    queue.apply_settings()
    assert queue.publisher is not None
    answers = [queue.publish(message(n)) for n in range(1, 6)]
    assert answers[3] is REJECTED  # (reject-publish lets the queue reach max-length + 1)
    assert queue.publisher.resend_due is False and len(store) == 3
    # Another node's publisher sent its 2 before its 1 was answered (low 1): 1 refused leaves
    # no gap, so 2 is refused too, not MOVED and sent again and again.
    assert queue.publish_from(message(8), ("b-publisher", 1), 1) is REJECTED
    assert queue.publish_from(message(9), ("b-publisher", 2), 1) is REJECTED
    store.commit(store.log.end)
    assert [a.status() for a in answers] == [True, True, True, False, False]
    queue.get()
    queue.get()
    store.commit(store.log.end)
    taken = queue.publish(message(6))  # (below 80 % of the limit again)
    store.commit(store.log.end)
    assert taken.status() is True and store.enqueuers[queue.publisher.name] == 6


def test_a_deleted_leaders_publishes_waiting_to_be_sent_again_are_nacked(tmp_path):
    """A publish its leader answered MOVED waits to be sent again, on no commit point: the
    queue's deletion nacks it (stop_timers), as it fails those waiting on one."""
    from warren.broker.queues.quorum import QuorumQueue
    from warren.broker.vhost import VHost
    from warren.store.persister import Persister
    from warren.store.replica_log import ReplicaLog
    from warren.store.replicated import ReplicatedQueueStore

    store = ReplicatedQueueStore.recover(ReplicaLog(Persister(str(tmp_path)), str(tmp_path / "q")), epoch=1)
    queue = QuorumQueue(VHost("/"), "q", True, None, False, {"x-queue-type": "quorum"}, store)
    first = queue.publish(message(1))
    assert queue.publisher is not None
    queue.publisher.published += 1  # (a number the log never saw: the next one leaves a gap)
    third = queue.publish(message(3))
    assert (first.status(), third.status(), queue.publisher.resend_due) == (None, None, True)
    queue.deleted = True
    queue.stop_timers()
    store.destroy()
    assert (first.status(), third.status()) == (False, False)
