"""Where each epoch begins in a replicated log (warren.cluster.replication's rules; the log
itself is warren.store.replica_log): one leader per epoch writes each offset once, so two
logs whose entries at an offset have the same epoch have the same entry there."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


class ReplicationError(Exception):
    """A message that breaks the protocol: the link it came on must be reset."""


@dataclass
class EpochHistory:
    """Where each epoch begins in one replica's log, oldest first: [(epoch, first offset)]
    (Kafka's leader-epoch cache). An epoch with no entry has no place here."""

    starts: list[tuple[int, int]] = field(default_factory=list)

    @property
    def last_epoch(self) -> int:
        return self.starts[-1][0] if self.starts else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry at `offset` (which must be in the log)."""
        i = bisect.bisect_right([start for _, start in self.starts], offset) - 1
        if i < 0:
            raise ValueError(f"offset {offset} is before the history")
        return self.starts[i][0]

    def appended(self, epoch: int, offset: int) -> None:
        """Entries of `epoch` are written from `offset` on."""
        if self.starts and self.starts[-1][0] == epoch:
            return
        if self.starts and (epoch < self.starts[-1][0] or offset < self.starts[-1][1]):
            raise ReplicationError(f"epoch {epoch} at {offset} after {self.starts[-1]}")
        self.starts.append((epoch, offset))

    def truncate(self, offset: int) -> None:
        """The log now ends at `offset`: epochs that began there or later are gone."""
        while self.starts and self.starts[-1][1] >= offset:
            self.starts.pop()


def common_prefix(a: EpochHistory, a_end: int, b: EpochHistory, b_end: int) -> int:
    """How many entries two logs have in common from their start: up to the first offset where
    their epochs differ (or the shorter log's end)."""
    limit = min(a_end, b_end)
    points = sorted({start for _, start in a.starts} | {start for _, start in b.starts} | {0})
    # (Below either history's first start the entries were dropped as committed, the same in both.)
    floor = max(a.starts[0][1] if a.starts else 0, b.starts[0][1] if b.starts else 0)
    for point in points:
        if point >= limit:
            break
        if point >= floor and a.epoch_at(point) != b.epoch_at(point):
            return point
    return limit
