"""A replicated log's bookkeeping (sans-IO): which offsets a replicated queue's leader may
call committed, what a follower keeps, refuses and truncates. Quorum queues and streams on a
cluster both replicate this way; the entries' content, their storage, the node links that
carry them and the etcd transactions that change a queue's leader or in-sync set are the
callers' (this module does no I/O and keeps no entries, only offsets and epochs).

The rules (Kafka's replication with leader epochs, plus a majority; streams keep them as
they are, quorum queues change the commit and the election as Raft's, below):

- A queue's record in etcd names its members, its leader, the leader's *epoch* and its
  in-sync set (ISR). Only a transaction guarded by the record's revision changes it, so etcd
  orders every change (the revision is the fencing token).
- The leader writes each entry with its epoch at the next offset and ships it to the
  followers over one ordered link each. An entry is *committed* when a majority of the members
  (the leader counted) and every member of the ISR hold it on disk. A publish is confirmed once
  its entry is committed.
- The ISR only shrinks through a transaction by the leader (a follower that lagged too long),
  and the leader stops waiting for that follower only once the transaction succeeded; it
  grows (a follower caught up) with the leader waiting for the follower *before* the
  transaction is sent. So the leader's ISR always holds etcd's, and every member etcd lists as
  in sync holds every committed entry.
- A new leader is chosen from the ISR (the record's transaction again), so it holds every
  committed entry; it starts a new epoch at its log's end. A follower that knows a newer epoch
  refuses an older leader's entries, and the new leader is in the old one's ISR: an old leader
  (stopped, cut off) can commit nothing once its successor is elected.
- A follower that (re)joins gets the leader's *epoch history* (where each epoch begins in its
  log) and cuts its own log where the two first differ: one leader per epoch writes each
  offset once, so two entries of one epoch at one offset are the same entry, and what the
  leader does not have was never committed. (Comparing whole histories, not one epoch's end,
  also finds a divergence under an older epoch: Kafka's KIP-279.)
- A follower's progress counts for a leader only from its handshake with that leader: what it
  acknowledged to an earlier leader is not trusted.

Quorum queues (`majority=True`) commit as Raft does, on a majority alone, so that a commit
waits for the faster half of the followers and not the slowest (measured: bench/RESULTS.md).
Their ISR says which members caught up, and nothing more: an ISR member may lack committed
entries, so their leaders follow Raft's election rules instead of the ISR's:

- A new leader is *unproven*: it commits nothing and synchronises no follower until a majority
  of the members (itself counted) reported their log's position, each having learnt the new
  epoch first (so it refuses the old leader's entries from then on). Every committed entry is
  on one of them (two majorities meet). If one of their logs is more up to date than the
  leader's (Raft's comparison: its last entry's epoch, then its length), the leader hands the
  queue over to it in a newer epoch instead (`best`); otherwise it holds every committed entry
  and is *proven*.
- A leader counts only an entry of its own epoch as committed by a majority; entries of earlier
  epochs commit with the first of its own (Raft's figure 8). A proven leader writes one entry
  at once, so that they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


from ..store.epochs import EpochHistory, ReplicationError, common_prefix

__all__ = ["EpochHistory", "Follower", "Leader", "Progress", "ReplicationError", "common_prefix"]


@dataclass
class Follower:
    """A follower's side. `log_end` is where its next entry goes, `durable` how many entries
    from the start are on its disk; `epoch` is the newest epoch it knows of (from a leader or
    from the queue's record in etcd): a leader of an older one is refused."""

    history: EpochHistory
    log_end: int = 0
    durable: int = 0
    epoch: int = 0
    leader_epoch: int | None = None  # the epoch of the leader it synchronised with, if any

    def knows(self, epoch: int) -> None:
        """etcd's record says `epoch` exists (a new leader): an older leader is refused from now."""
        if epoch > self.epoch:
            self.epoch = epoch
            if self.leader_epoch is not None and self.leader_epoch < epoch:
                self.leader_epoch = None

    def synchronise(self, epoch: int, leader_starts: list[tuple[int, int]], leader_end: int) -> int | None:
        """The leader of `epoch` sent its history and log end on linking: the offset where this
        log is cut (the caller truncates its storage there, then tells the leader the cut and
        `durable`). None: an older leader, refused."""
        if epoch < self.epoch:
            return None
        cut = common_prefix(self.history, self.log_end, EpochHistory(list(leader_starts)), leader_end)
        self.epoch = epoch
        self.leader_epoch = epoch
        self.log_end = cut
        self.durable = min(self.durable, cut)
        self.history.truncate(cut)
        return cut

    def accept(self, epoch: int, first: int, epochs: list[int]) -> bool:
        """Entries from the leader of `epoch` starting at offset `first`, of these epochs (an
        entry keeps the epoch it was first written in). False: refused (a newer epoch is known
        or this follower has not synchronised with that leader): the caller answers so and the
        leader stops. Raises on a gap (the link lost something: resynchronise)."""
        if not self.check(epoch, first, epochs):
            return False
        for offset, entry_epoch in enumerate(epochs, first):
            self.history.appended(entry_epoch, offset)
        self.log_end = first + len(epochs)
        return True

    def check(self, epoch: int, first: int, epochs: list[int]) -> bool:
        """accept's checks alone, changing nothing (a caller whose log keeps the history appends
        the entries itself, then sets log_end)."""
        if epoch < self.epoch or self.leader_epoch != epoch:
            return False
        if first != self.log_end:
            raise ReplicationError(f"entries from {first}, the log ends at {self.log_end}")
        last = self.history.last_epoch
        for entry_epoch in epochs:
            if entry_epoch > epoch or entry_epoch < last:
                raise ReplicationError(f"an entry of epoch {entry_epoch} from the leader of {epoch} after {last}")
            last = entry_epoch
        return True

    def synced(self, durable: int) -> int:
        """Its disk holds `durable` entries (a group commit finished): the acknowledgement."""
        self.durable = max(self.durable, min(durable, self.log_end))
        return self.durable

    def lost_unsynced(self) -> None:
        """It crashed: what was not on disk is gone, and so is its link to a leader."""
        self.log_end = self.durable
        self.history.truncate(self.durable)
        self.leader_epoch = None


@dataclass
class Progress:
    """A leader's view of one follower, since their handshake."""

    durable: int = 0      # entries it acknowledged on disk
    sent: int = 0         # entries shipped to it (the next one to send)
    caught_up_at: float = 0.0  # the last time an acknowledgement covered `target`
    target: int = 0       # the leader's log end at its previous acknowledgement


class Leader:
    """A leader's side for one queue: its members and ISR as etcd has them (see the module's
    rules for when they change), its epoch, and each synchronised follower's progress."""

    def __init__(self, node: str, members: Iterable[str], isr: Iterable[str], epoch: int,
                 history: EpochHistory, log_end: int, durable: int, now: float = 0.0, majority: bool = False):
        self.node = node
        self.members = set(members)
        self.isr = set(isr)  # always holds etcd's ISR (the module's rules)
        if node not in self.members or node not in self.isr:
            raise ValueError(f"{node} leads a queue whose members or ISR do not include it")
        self.epoch = epoch
        self.history = history
        self.log_end = log_end
        self.durable = durable
        self.committed = 0
        self.followers: dict[str, Progress] = {}
        self.started = now  # (a follower never linked counts as caught up at the start)
        # Nothing is known committed until this epoch's majority and ISR hold it: entries of
        # earlier epochs are committed again under this one's rules.
        self.majority = majority  # Raft's rules (the module's), not the ISR's
        self.proven = not majority
        self.epoch_start = log_end  # this epoch's first offset
        self.position = (history.last_epoch, log_end)  # this log's, for the proof
        self.reports: dict[str, tuple[int, int]] = {}  # unproven: the members' positions

    # ------------------------------------------------------------------ the proof
    def reported(self, node: str, last_epoch: int, end: int) -> bool:
        """Unproven: `node`, which knows this leader's epoch (so refuses every older leader),
        has a log of `end` entries, the last of `last_epoch`. True once a majority of the
        members, this one counted, reported: `best` may decide."""
        if node not in self.members or node == self.node or self.proven:
            raise ReplicationError(f"{node} reports its log to a leader that does not ask for it")
        self.reports[node] = (last_epoch, end)
        return self.decided()

    def decided(self) -> bool:
        """Unproven: a majority of the members, this one counted, reported (one alone is its
        own majority)."""
        return len(self.reports) + 1 > len(self.members) // 2

    def best(self) -> str:
        """The member whose log is the most up to date of those that reported and this
        leader's own (this one's on a tie): this node, which may `prove` itself, or the one it
        hands the queue over to."""
        best, position = self.node, self.position
        for node in sorted(self.reports):
            if self.reports[node] > position:
                best, position = node, self.reports[node]
        return best

    def prove(self) -> bool:
        """`best` is this node: it holds every committed entry, and commits from now on. True:
        the committed offset moved."""
        self.proven = True
        self.reports.clear()
        return self._advance()

    # ------------------------------------------------------------------ followers
    def welcome(self, node: str) -> tuple[int, list[tuple[int, int]], int]:
        """A follower links: what it synchronises with (Follower.synchronise)."""
        if node not in self.members or node == self.node or not self.proven:
            raise ReplicationError(f"{node} is not a follower of this queue")
        self.followers.pop(node, None)
        return self.epoch, list(self.history.starts), self.log_end

    def ready(self, node: str, cut: int, durable: int, now: float) -> bool:
        """The follower cut its log at `cut` and holds `durable` entries on disk: entries are
        shipped to it from the cut. True: the committed offset moved."""
        if node not in self.members or node == self.node or cut > self.log_end or durable > cut:
            raise ReplicationError(f"{node} is ready at {cut} ({durable} on disk), the log ends at {self.log_end}")
        self.followers[node] = Progress(durable=durable, sent=cut, caught_up_at=now, target=self.log_end)
        return self._advance()

    def unlinked(self, node: str) -> None:
        """Its link ended: its progress is forgotten until the next handshake."""
        self.followers.pop(node, None)

    def to_send(self, node: str) -> tuple[int, int] | None:
        """The entries to ship to `node` now, [first, end), marked as shipped."""
        progress = self.followers.get(node)
        if progress is None or progress.sent >= self.log_end:
            return None
        first, progress.sent = progress.sent, self.log_end
        return first, self.log_end

    def acknowledged(self, node: str, durable: int, now: float) -> bool:
        """`node` holds `durable` entries on disk. True: the committed offset moved."""
        progress = self.followers.get(node)
        if progress is None:
            return False
        if durable > progress.sent:
            raise ReplicationError(f"{node} acknowledged {durable} entries, {progress.sent} were sent")
        progress.durable = max(progress.durable, durable)
        # (Kafka's rule: caught up when it holds what the leader had one acknowledgement ago;
        # under steady publishing it never holds the very end.)
        if progress.durable >= progress.target:
            progress.caught_up_at = now
        progress.target = self.log_end
        return self._advance()

    # ------------------------------------------------------------------ own log
    def append(self, count: int = 1) -> int:
        """`count` entries of this epoch are written at the log's end: their first offset."""
        first = self.log_end
        self.history.appended(self.epoch, first)
        self.log_end += count
        return first

    def synced(self, durable: int) -> bool:
        """The leader's own disk holds `durable` entries. True: the committed offset moved."""
        self.durable = max(self.durable, min(durable, self.log_end))
        return self._advance()

    def _held(self, node: str) -> int:
        if node == self.node:
            return self.durable
        progress = self.followers.get(node)
        return 0 if progress is None else progress.durable

    def _advance(self) -> bool:
        held = sorted((self._held(node) for node in self.members), reverse=True)
        committed = held[len(self.members) // 2]  # held by at least a majority of the members
        if not self.majority:
            committed = min(committed, min(self._held(node) for node in self.isr))
        elif not self.proven or committed <= self.epoch_start:
            return False  # (unproven, or no entry of its own epoch on a majority yet: the module's rules)
        if committed <= self.committed:
            return False
        if committed > self.log_end:
            raise AssertionError("committed past the log's end")
        self.committed = committed
        return True

    # ------------------------------------------------------------------ members
    def members_changed(self, members: Iterable[str], isr: Iterable[str]) -> bool:
        """etcd's record has new members (add_member, delete_member: a transaction anyone may
        send). A removed member leaves the ISR and its progress goes; an added one is waited
        for by the majority from now, and joins the ISR once caught up (catching_up). The
        ISR keeps its rule: it holds etcd's. True: the committed offset moved."""
        members = set(members)
        if self.node not in members:
            raise ValueError(f"{self.node} leads a queue whose members do not include it")
        for node in self.members - members:
            self.followers.pop(node, None)
            self.reports.pop(node, None)
        self.members = members
        self.isr = (self.isr & members) | (set(isr) & members) | {self.node}
        return self._advance()

    # ------------------------------------------------------------------ the ISR
    def lagging(self, now: float, max_lag: float) -> set[str]:
        """ISR members (not the leader) that have not caught up for `max_lag` seconds: the
        leader may send the transaction that drops them (then call shrunk). None if that would
        leave the ISR without a majority of the members: commits need a majority anyway, and
        the members out of this leader's reach must stay electable (a leader cut off from its
        followers but not from etcd would otherwise leave them no one to elect). A follower
        not linked counts from this leader's start: once the leader has led `max_lag`, one
        whose link ended (killed, restarted) leaves at once, rather than hold every confirm up
        for `max_lag` (commits need every in-sync member)."""
        out = set()
        for node in self.isr - {self.node}:
            progress = self.followers.get(node)
            if progress is not None and progress.durable >= self.log_end:
                continue  # (holds everything: not behind, however long ago it last acknowledged)
            last = progress.caught_up_at if progress is not None else self.started
            if now - last > max_lag:
                out.add(node)
        if len(self.isr - out) <= len(self.members) // 2:
            return set()
        return out

    def shrunk(self, nodes: Iterable[str]) -> bool:
        """etcd's ISR no longer has `nodes` (the leader's transaction succeeded)."""
        self.isr -= set(nodes) - {self.node}
        return self._advance()

    def catching_up(self) -> set[str]:
        """Members outside the ISR that hold every committed entry and are linked: the leader
        may add them (grow, then the transaction)."""
        return {node for node, progress in self.followers.items()
                if node not in self.isr and progress.durable >= self.committed}

    def grow(self, node: str) -> None:
        """Before the transaction that adds `node` to etcd's ISR: wait for it from now on."""
        if node not in self.members:
            raise ValueError(f"{node} is not a member")
        self.isr.add(node)

    def grow_failed(self, node: str) -> bool:
        """The transaction adding `node` failed: etcd's ISR is as it was."""
        self.isr.discard(node)
        return self._advance()
