"""A quorum queue's leader (warren/cluster/replication.py, `Leader(..., majority=True)`):
Raft's rules rather than the ISR's. A commit needs a majority alone; a new leader commits
nothing and welcomes no follower until it is proven (a majority reported, `best`, `prove`);
entries of earlier epochs commit only with one of the leader's own epoch (Raft's figure 8).
Plain values, no I/O."""

from __future__ import annotations

import pytest

from warren.cluster.replication import EpochHistory, Follower, Leader, ReplicationError

NODES = ("a", "b", "c")


def proven_leader(majority: bool = True, members: tuple[str, ...] = NODES, isr: tuple[str, ...] = NODES) -> Leader:
    """An empty queue's leader "a" of epoch 1 (proven: nothing to hold, as for a new queue)."""
    leader = Leader("a", members, isr, 1, EpochHistory(), 0, 0, majority=majority)
    if majority:
        assert not leader.proven
        assert not leader.prove()
    assert leader.proven
    return leader


def link(leader: Leader, node: str, cut: int = 0, durable: int = 0, now: float = 0.0) -> bool:
    """`node` links (welcome) and is ready at `cut`: ready's answer."""
    leader.welcome(node)
    return leader.ready(node, cut, durable, now)


def ship_and_ack(leader: Leader, node: str, durable: int, now: float = 0.0) -> bool:
    """What `node` is due is shipped and it acknowledges `durable` on disk: acknowledged's answer."""
    leader.to_send(node)
    return leader.acknowledged(node, durable, now)


# ------------------------------------------------------------------ the majority rule
def test_majority_mode_commits_on_a_majority_while_an_in_sync_member_lags():
    leader = proven_leader()
    for n in ("b", "c"):
        assert not link(leader, n)
    leader.append(3)
    assert not leader.synced(3)  # the leader alone: no majority
    assert ship_and_ack(leader, "b", 3)  # a and b: a majority; c (in the ISR) holds nothing
    assert leader.committed == 3
    assert leader.isr == set(NODES)  # (nothing dropped c: it just is not waited for)


def test_default_mode_waits_for_the_lagging_in_sync_member_in_the_same_sequence():
    leader = proven_leader(majority=False)
    for n in ("b", "c"):
        assert not link(leader, n)
    leader.append(3)
    assert not leader.synced(3)
    assert not ship_and_ack(leader, "b", 3)  # a majority, but c is in sync and lacks them
    assert leader.committed == 0
    assert ship_and_ack(leader, "c", 3)
    assert leader.committed == 3


# ------------------------------------------------------------------ unproven
def test_an_unproven_leader_commits_nothing_and_welcomes_no_follower_until_proven():
    leader = Leader("a", NODES, NODES, 1, EpochHistory(), 0, 0, majority=True)
    assert not leader.proven
    with pytest.raises(ReplicationError):
        leader.welcome("b")
    leader.append(3)
    assert not leader.synced(3)
    # (ready without a welcome: the only way a follower's progress reaches an unproven leader)
    assert not leader.ready("b", 0, 0, 0.0)
    assert leader.to_send("b") == (0, 3)
    assert not leader.acknowledged("b", 3, 0.0)  # a and b hold all three: a majority, unproven
    assert not leader.ready("c", 3, 3, 0.0)  # all three members hold them
    assert leader.committed == 0
    # (its entries were written after it was constructed, so `best`, which compares positions
    # taken at construction, does not apply here: the proof alone is under test)
    assert leader.reported("b", 1, 3)
    assert leader.prove()  # what a majority holds is committed at once
    assert leader.proven and leader.committed == 3
    assert leader.welcome("b") == (1, [(1, 0)], 3)


def test_the_default_mode_is_proven_from_the_start_and_asks_for_no_report():
    leader = Leader("a", NODES, NODES, 1, EpochHistory(), 0, 0)
    assert leader.proven
    assert leader.welcome("b") == (1, [], 0)
    with pytest.raises(ReplicationError):
        leader.reported("b", 0, 0)


# ------------------------------------------------------------------ reports
def test_reported_is_true_once_a_majority_of_three_reported():
    leader = Leader("a", NODES, NODES, 2, EpochHistory([(1, 0)]), 4, 4, majority=True)
    assert leader.reported("b", 1, 4)  # a and b: two of three
    assert leader.reported("c", 1, 2)


def test_reported_is_true_once_a_majority_of_five_reported():
    leader = Leader("a", "abcde", "abcde", 2, EpochHistory([(1, 0)]), 4, 4, majority=True)
    assert not leader.reported("b", 1, 4)  # a and b: two of five
    assert not leader.reported("b", 1, 4)  # (b again: still two)
    assert leader.reported("d", 1, 3)  # a, b and d: three of five
    assert leader.reported("e", 1, 4)


def test_reported_is_true_once_a_majority_of_four_reported():
    leader = Leader("a", "abcd", "abcd", 2, EpochHistory([(1, 0)]), 4, 4, majority=True)
    assert not leader.reported("c", 1, 4)  # two of four: half is no majority
    assert leader.reported("b", 1, 4)


def test_a_report_from_the_leader_itself_or_a_non_member_is_refused():
    leader = Leader("a", NODES, NODES, 2, EpochHistory([(1, 0)]), 4, 4, majority=True)
    with pytest.raises(ReplicationError):
        leader.reported("a", 1, 4)
    with pytest.raises(ReplicationError):
        leader.reported("z", 1, 4)
    assert leader.reports == {}  # (neither counted)
    assert leader.reported("b", 1, 4)
    assert not leader.prove()
    with pytest.raises(ReplicationError):
        leader.reported("c", 1, 4)  # (proven: no longer asked for)


# ------------------------------------------------------------------ best
@pytest.mark.parametrize("history, end, durable, reports, best", [
    # a newer last epoch wins over a longer log of an older one
    ([(1, 0), (2, 3)], 9, 9, [("b", 3, 5), ("c", 1, 20)], "b"),
    ([(1, 0), (2, 3)], 5, 5, [("b", 1, 20)], "a"),
    # the same last epoch: the longer log
    ([(2, 0)], 5, 5, [("b", 2, 6), ("c", 2, 7), ("d", 2, 4)], "c"),
    # equal positions: the leader, then the first reporter by name
    ([(2, 0)], 5, 5, [("c", 2, 5), ("b", 2, 5)], "a"),
    ([(2, 0)], 5, 5, [("d", 3, 2), ("c", 3, 2)], "c"),
    # the leader's whole log counts, not only what is on its disk
    ([(2, 0)], 5, 3, [("b", 2, 4)], "a"),
])
def test_best_is_the_most_up_to_date_log(history, end, durable, reports, best):
    leader = Leader("a", "abcde", "abcde", 4, EpochHistory(list(history)), end, durable, majority=True)
    for node, last_epoch, log_end in reports:
        leader.reported(node, last_epoch, log_end)
    assert leader.best() == best


# ------------------------------------------------------------------ Raft's figure 8
def test_entries_of_an_older_epoch_commit_only_with_one_of_the_leaders_own():
    history = EpochHistory([(2, 0)])  # five entries of epoch 2, none committed yet
    leader = Leader("a", NODES, NODES, 4, history, 5, 5, majority=True)
    assert leader.epoch_start == 5
    assert leader.reported("b", 2, 5)
    assert leader.best() == "a"
    assert not leader.prove()  # every member holds the five: none of them is of epoch 4
    followers = {n: Follower(EpochHistory([(2, 0)]), log_end=5, durable=5, epoch=4) for n in ("b", "c")}
    for n, follower in followers.items():
        epoch, starts, end = leader.welcome(n)
        assert follower.synchronise(epoch, starts, end) == 5
        assert not leader.ready(n, 5, 3, 0.0)
        assert not leader.acknowledged(n, follower.synced(5), 0.0)
    assert leader.committed == 0  # on every member, of epoch 2 only
    assert leader.append() == 5
    assert not leader.synced(6)  # the leader alone holds its own entry
    assert leader.committed == 0
    assert leader.to_send("b") == (5, 6)
    assert followers["b"].accept(4, 5, [4])
    assert leader.acknowledged("b", followers["b"].synced(6), 0.0)
    assert leader.committed == 6  # epoch 4's entry on a and b, and the epoch 2 ones with it


# ------------------------------------------------------------------ no ISR bookkeeping
def test_a_removed_members_report_no_longer_counts():
    leader = Leader("a", "abcde", "abcde", 2, EpochHistory([(1, 0)]), 4, 4, majority=True)
    assert not leader.reported("b", 1, 9)
    leader.members_changed("acdex", "a")
    assert not leader.reported("c", 1, 4), "b's report counted after b left"
    assert leader.best() == "a"
