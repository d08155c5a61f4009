"""QuorumPublisher (warren/broker/queues/quorum_publisher.py): a node's publishes to a
replicated quorum queue are kept until a leader answers, sent again in order to the next
leader when theirs is lost, and nacked only once no leader took them for RESEND_FOR seconds."""

from __future__ import annotations

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
    return Message("", "q", b"", b"", f"m{n}".encode())


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
    assert publisher.publish(message(1)).status() is True
    route.answer = lambda: REJECTED
    assert publisher.publish(message(2)).status() is False
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
