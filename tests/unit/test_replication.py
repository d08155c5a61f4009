"""The replicated log's rules (warren/cluster/replication.py) against a model of three nodes:
each keeps a log of entries on a disk that loses what was not synced when it crashes; links
deliver in order but any link may be cut; etcd is one record changed by compare-and-set;
nodes learn of its changes late, a leader may be paused past its lease and come back still
thinking it leads. Hypothesis drives every interleaving it can find, and after every step no
entry a leader called committed (a confirm a client got) may be missing from the leader etcd
names, and no two committed entries may share an offset."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from warren.cluster.replication import (EpochHistory, Follower, Leader, ReplicationError, common_prefix)

NODES = ("a", "b", "c")
MAX_LAG = 3.0


@dataclass(frozen=True)
class Record:
    """The queue's record in etcd."""
    leader: str
    epoch: int
    isr: frozenset[str]
    revision: int


@dataclass
class Replica:
    name: str
    log: list[tuple[int, int]] = field(default_factory=list)  # (epoch, entry id) per offset
    durable: int = 0
    alive: bool = True
    view: Record | None = None          # its (possibly stale) copy of the record
    leader: Leader | None = None
    follower: Follower | None = None

    def history(self) -> EpochHistory:
        history = EpochHistory()
        for offset, (epoch, _) in enumerate(self.log):
            history.appended(epoch, offset)
        return history


class Model(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.ids = itertools.count(1)
        self.record = Record("a", 1, frozenset(NODES), 1)
        self.replicas = {n: Replica(n, view=self.record) for n in NODES}
        self.replicas["a"].leader = Leader("a", NODES, NODES, 1, EpochHistory(), 0, 0)
        for n in ("b", "c"):
            self.replicas[n].follower = Follower(EpochHistory(), epoch=1)
        # links[(leader, follower)] = (to the follower, to the leader): in order, cut at will
        self.links: dict[tuple[str, str], tuple[deque, deque]] = {}
        self.committed: dict[int, tuple[int, int]] = {}  # offset -> entry, as leaders confirmed them

    # ---------------------------------------------------------------- helpers
    def _cut(self, name: str) -> None:
        for key in [k for k in self.links if name in k]:
            leader, follower = key
            del self.links[key]
            replica = self.replicas[leader]
            if replica.leader is not None:
                replica.leader.unlinked(follower)
            other = self.replicas[follower]
            if other.follower is not None:
                other.follower.leader_epoch = None

    def _confirm(self, replica: Replica) -> None:
        leader = replica.leader
        assert leader is not None
        for offset in range(leader.committed):
            entry = replica.log[offset]
            assert self.committed.setdefault(offset, entry) == entry, (
                f"offset {offset} confirmed as {self.committed[offset]} and as {entry}")

    def _step_down(self, replica: Replica, epoch: int) -> None:
        if replica.leader is not None and replica.leader.epoch < epoch:
            replica.leader = None
            self._cut(replica.name)
            replica.follower = Follower(replica.history(), len(replica.log), replica.durable, epoch)
        if replica.follower is not None:
            replica.follower.knows(epoch)

    # ---------------------------------------------------------------- rules
    def publish(self, name: str) -> None:
        replica = self.replicas[name]
        if replica.alive and replica.leader is not None:
            offset = replica.leader.append()
            assert offset == len(replica.log)
            replica.log.append((replica.leader.epoch, next(self.ids)))

    def sync(self, name: str) -> None:
        replica = self.replicas[name]
        if not replica.alive:
            return
        replica.durable = len(replica.log)
        if replica.leader is not None:
            if replica.leader.synced(replica.durable):
                self._confirm(replica)
        elif replica.follower is not None and replica.follower.leader_epoch is not None:
            durable = replica.follower.synced(replica.durable)
            for (leader, follower), (_, up) in self.links.items():
                if follower == name:
                    up.append(("ack", durable))

    def link(self, follower: str) -> None:
        """A follower dials the leader its copy of the record names."""
        replica = self.replicas[follower]
        if not replica.alive or replica.follower is None or replica.view is None:
            return
        leader = replica.view.leader
        target = self.replicas[leader]
        if leader == follower or not target.alive or target.leader is None or (leader, follower) in self.links:
            return
        self._cut(follower)
        down: deque = deque([("welcome", *target.leader.welcome(follower))])
        self.links[(leader, follower)] = (down, deque())

    def ship(self, leader: str, follower: str) -> None:
        link = self.links.get((leader, follower))
        replica = self.replicas[leader]
        if link is None or replica.leader is None or replica.leader.followers.get(follower) is None:
            return
        span = replica.leader.to_send(follower)
        if span is not None:
            first, end = span
            link[0].append(("entries", replica.leader.epoch, first, replica.log[first:end]))

    def deliver(self, leader: str, follower: str, upward: bool) -> None:
        link = self.links.get((leader, follower))
        if link is None or not link[1 if upward else 0]:
            return
        message = link[1 if upward else 0].popleft()
        if upward:
            self._at_leader(leader, follower, message)
        else:
            self._at_follower(leader, follower, message)

    def _at_follower(self, leader: str, follower: str, message: tuple) -> None:
        replica = self.replicas[follower]
        state = replica.follower
        if state is None:
            return
        up = self.links[(leader, follower)][1]
        if message[0] == "welcome":
            _, epoch, starts, end = message
            cut = state.synchronise(epoch, starts, end)
            if cut is None:
                up.append(("refused", state.epoch))
                return
            del replica.log[cut:]
            replica.durable = min(replica.durable, cut)
            up.append(("ready", cut, state.durable))
        else:
            _, epoch, first, entries = message
            try:
                accepted = state.accept(epoch, first, [e for e, _ in entries])
            except ReplicationError:
                self._cut(follower)
                return
            if not accepted:
                up.append(("refused", state.epoch))
                return
            replica.log.extend(entries)

    def _at_leader(self, leader: str, follower: str, message: tuple) -> None:
        replica = self.replicas[leader]
        state = replica.leader
        if state is None:
            return
        if message[0] == "refused":
            self._step_down(replica, message[1])
        elif message[0] == "ready":
            if state.ready(follower, message[1], message[2], self.now):
                self._confirm(replica)
        elif message[0] == "ack" and follower in state.followers:
            if state.acknowledged(follower, message[1], self.now):
                self._confirm(replica)

    def crash(self, name: str) -> None:
        replica = self.replicas[name]
        if not replica.alive:
            return
        self._cut(name)
        replica.alive = False
        del replica.log[replica.durable:]
        replica.leader = replica.follower = None

    def restart(self, name: str) -> None:
        replica = self.replicas[name]
        if replica.alive:
            return
        replica.alive = True
        epoch = replica.view.epoch if replica.view else 0
        replica.follower = Follower(replica.history(), len(replica.log), replica.durable, epoch)

    def watch(self, name: str) -> None:
        """The node's watch brings it the record as it is."""
        replica = self.replicas[name]
        if replica.alive:
            replica.view = self.record
            self._step_down(replica, self.record.epoch)

    def elect(self, candidate: str) -> None:
        """The leader's lease ran out (it died, or is paused: it may come back thinking it
        leads): an in-sync member whose copy of the record is current takes over."""
        record = self.record
        replica = self.replicas[candidate]
        if (candidate == record.leader or candidate not in record.isr or not replica.alive
                or replica.view != record or replica.follower is None):
            return
        self._cut(candidate)
        epoch = record.epoch + 1
        self.record = Record(candidate, epoch, record.isr - {record.leader}, record.revision + 1)
        replica.view = self.record
        replica.follower = None
        replica.leader = Leader(candidate, NODES, self.record.isr, epoch, replica.history(), len(replica.log),
                                replica.durable, self.now)

    def shrink(self, name: str) -> None:
        replica = self.replicas[name]
        state = replica.leader
        if not replica.alive or state is None:
            return
        lagging = state.lagging(self.now, MAX_LAG)
        if lagging and replica.view == self.record and self.record.leader == name:  # (the guarded transaction)
            self.record = Record(name, self.record.epoch, self.record.isr - lagging, self.record.revision + 1)
            replica.view = self.record
            if state.shrunk(lagging):
                self._confirm(replica)

    def grow(self, name: str) -> None:
        replica = self.replicas[name]
        state = replica.leader
        if not replica.alive or state is None:
            return
        for other in sorted(state.catching_up()):
            state.grow(other)
            if replica.view == self.record and self.record.leader == name:
                self.record = Record(name, self.record.epoch, self.record.isr | {other}, self.record.revision + 1)
                replica.view = self.record
            elif state.grow_failed(other):
                self._confirm(replica)

    def quiet(self) -> None:
        """A quiet moment: every link ships and delivers what it has, every node syncs."""
        for _ in range(3):
            for name in NODES:
                self.sync(name)
            for leader, follower in list(self.links):
                self.ship(leader, follower)
            for key in list(self.links):
                for upward in (False, True):
                    while key in self.links and self.links[key][1 if upward else 0]:
                        self.deliver(*key, upward)

    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(data=st.data())
    def act(self, data) -> None:
        """One of the actions that would do something now (so every step counts)."""
        actions = [(self.time_passes, (2.0,)), (self.quiet, ())] + [(self.watch, (n,)) for n in NODES]
        for name, replica in self.replicas.items():
            if not replica.alive:
                actions.append((self.restart, (name,)))
                continue
            actions += [(self.crash, (name,))] + [(self.sync, (name,))] * 3
            if replica.leader is not None:
                actions += [(self.publish, (name,))] * 4 + [(self.shrink, (name,)), (self.grow, (name,))]
            if replica.follower is not None:
                actions += [(self.link, (name,))] * 3 + [(self.elect, (name,))]
        for (leader, follower), (down, up) in self.links.items():
            actions += [(self.ship, (leader, follower))] * 3
            if down:
                actions += [(self.deliver, (leader, follower, False))] * 4
            if up:
                actions += [(self.deliver, (leader, follower, True))] * 4
        action, args = data.draw(st.sampled_from(actions), label="action")
        action(*args)

    # ---------------------------------------------------------------- what must hold
    @invariant()
    def the_recorded_leader_has_every_committed_entry(self) -> None:
        replica = self.replicas[self.record.leader]
        if replica.alive and replica.leader is not None and replica.leader.epoch == self.record.epoch:
            for offset, entry in self.committed.items():
                assert offset < len(replica.log) and replica.log[offset] == entry, (
                    f"leader {replica.name} of epoch {self.record.epoch} lost committed {entry} at {offset}")

    @invariant()
    def leaders_never_commit_past_their_log(self) -> None:
        for replica in self.replicas.values():
            if replica.leader is not None:
                assert replica.leader.committed <= len(replica.log)


TestModel = Model.TestCase
TestModel.settings = settings(max_examples=500, stateful_step_count=60, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ plain cases
def test_common_prefix_finds_a_divergence_under_an_older_epoch():
    # (KIP-279's case: the follower's last epoch is one the leader never had.)
    follower = EpochHistory([(1, 0), (3, 5)])
    leader = EpochHistory([(1, 0), (2, 4), (4, 8)])
    assert common_prefix(follower, 7, leader, 10) == 4
    assert common_prefix(leader, 10, leader, 10) == 10
    assert common_prefix(EpochHistory(), 0, leader, 10) == 0


def test_a_commit_needs_a_majority_and_every_in_sync_member():
    leader = Leader("a", NODES, NODES, 1, EpochHistory(), 0, 0)
    for n in ("b", "c"):
        leader.welcome(n)
        leader.ready(n, 0, 0, 0.0)
    leader.append(3)
    assert not leader.synced(3)  # the leader alone: no majority
    leader.to_send("b")
    assert not leader.acknowledged("b", 3, 0.0)  # a majority, but c is in sync and lacks them
    assert leader.lagging(10.0, MAX_LAG) == {"b", "c"} - {"b"}
    assert leader.shrunk({"c"}) and leader.committed == 3


def test_members_changed_counts_the_majority_over_the_new_members():
    leader = Leader("a", ["a"], ["a"], 1, EpochHistory(), 0, 0)
    leader.append(2)
    assert leader.synced(2) and leader.committed == 2  # one member: itself
    assert not leader.members_changed(["a", "b", "c"], ["a"])  # added: out of the ISR, counted in the majority
    with pytest.raises(ReplicationError):
        Leader("a", ["a"], ["a"], 1, EpochHistory(), 0, 0).welcome("b")  # (not a member before the change)
    leader.welcome("b")
    leader.ready("b", 0, 0, 0.0)
    leader.append(1)
    assert not leader.synced(3)  # a alone of three: no majority
    leader.to_send("b")
    assert leader.acknowledged("b", 3, 0.0) and leader.committed == 3  # a and b: a majority
    assert leader.catching_up() == {"b"}
    leader.grow("b")
    leader.welcome("c")
    leader.ready("c", 0, 0, 0.0)
    leader.append(1)
    leader.synced(4)
    leader.to_send("b")
    assert not leader.acknowledged("c", 0, 0.0)  # b is in sync and lacks it
    assert not leader.members_changed(["a", "c"], ["a"])  # b removed: its progress and ISR place go,
    assert "b" not in leader.followers and leader.isr == {"a"}
    assert leader.committed == 3  # and a majority of [a, c] still needs c
    leader.to_send("c")
    assert leader.acknowledged("c", 4, 0.0) and leader.committed == 4
    with pytest.raises(ValueError):
        leader.members_changed(["b", "c"], ["b"])  # (a leader is removed only once it has handed over)


def test_a_leader_cut_off_from_its_followers_keeps_them_in_sync_for_an_election():
    """Past MAX_LAG without its followers, a leader may not drop both: it could commit nothing
    with the ISR it would be left (no majority), and they, a majority, must stay electable."""
    leader = Leader("a", NODES, NODES, 1, EpochHistory(), 0, 0)
    for n in ("b", "c"):
        leader.welcome(n)
        leader.ready(n, 0, 0, 0.0)
    leader.append(3)
    for n in ("b", "c"):
        leader.unlinked(n)
    assert leader.lagging(MAX_LAG + 1, MAX_LAG) == set()
    leader.welcome("b")
    leader.ready("b", 3, 3, MAX_LAG + 1)
    assert leader.lagging(MAX_LAG + 2, MAX_LAG) == {"c"}  # (b and a are a majority)


def test_a_follower_refuses_an_older_leader_once_it_knows_a_newer_epoch():
    follower = Follower(EpochHistory(), epoch=1)
    assert follower.synchronise(1, [], 0) == 0
    assert follower.accept(1, 0, [1, 1])
    follower.knows(2)
    assert not follower.accept(1, 2, [1])
    assert follower.synchronise(1, [(1, 0)], 5) is None


def test_a_follower_past_the_leaders_log_is_cut_to_it():
    follower = Follower(EpochHistory([(1, 0)]), log_end=6, durable=6, epoch=1)
    assert follower.synchronise(2, [(1, 0), (2, 4)], 9) == 4
    assert (follower.log_end, follower.durable, follower.history.starts) == (4, 4, [(1, 0)])
    with pytest.raises(ReplicationError):
        follower.accept(2, 5, [2])


# ------------------------------------------------------------------ scenarios in the model
def replicate(model: Model, leader: str, *followers: str) -> None:
    """`followers` link to `leader` and get everything it has; all sync."""
    for follower in followers:
        model.watch(follower)
        model.link(follower)
    model.quiet()


def test_an_entry_on_a_majority_but_not_on_every_in_sync_member_is_not_committed():
    model = Model()
    model.publish("a")
    replicate(model, "a", "b")
    assert model.replicas["a"].leader.committed == 0  # c is in sync and lacks it
    model.crash("a")
    model.elect("c")  # c may lead: nothing it lacks was confirmed
    model.the_recorded_leader_has_every_committed_entry()


def test_a_divergent_tail_is_cut_when_its_follower_links_to_the_new_leader():
    model = Model()
    replicate(model, "a", "b", "c")
    model.publish("a")
    replicate(model, "a", "b", "c")
    assert model.replicas["a"].leader.committed == 1
    model.publish("a")
    model.publish("a")
    model.ship("a", "b")
    model.deliver("a", "b", False)
    model.sync("b")  # b holds two entries of epoch 1 that c lacks
    model.crash("a")
    model.watch("c")
    model.elect("c")
    model.publish("c")
    model.publish("c")
    replicate(model, "c", "b")
    assert model.replicas["b"].log == model.replicas["c"].log  # b's epoch-1 tail was cut
    assert model.replicas["c"].leader.committed == 3
    model.crash("c")
    model.restart("a")
    model.watch("b")
    model.elect("b")
    model.the_recorded_leader_has_every_committed_entry()


def test_a_leader_paused_past_its_lease_commits_nothing_when_it_comes_back():
    model = Model()
    replicate(model, "a", "b", "c")
    model.watch("b")
    model.elect("b")  # a is paused: its lease ran out, b leads epoch 2 (a out of the ISR)
    replicate(model, "b", "c")
    committed = model.replicas["a"].leader.committed
    model.publish("a")  # a comes back still thinking it leads
    model.quiet()
    assert model.replicas["a"].leader is None or model.replicas["a"].leader.committed == committed
    model.watch("a")
    assert model.replicas["a"].leader is None and model.replicas["a"].follower.epoch == 2
