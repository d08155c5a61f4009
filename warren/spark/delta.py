"""Delta tables without the Delta jar: micro-batches written with delta-rs (`deltalake`).

Spark's own `delta` format is a JVM jar fetched from Maven at session start, which a machine
without Maven access (this project's CI) cannot load. `DeltaBatchWriter` is a foreachBatch
function instead: each micro-batch goes to the table in one Delta commit that also records
the batch id as the query's transaction version (Delta's `txn` action, the same mark Spark's
Delta sink leaves), and a batch the table already holds is skipped. A query restarted from its
checkpoint replays the batch it had not committed with the same rows (the warren stream source
is deterministic), so the table gets every batch exactly once.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


class DeltaBatchWriter:
    """writeStream.foreachBatch(DeltaBatchWriter(path, app_id)): appends each micro-batch to
    the Delta table at `path` once; `app_id` names the query (stable across its restarts)."""

    def __init__(self, path: str, app_id: str):
        self.path = path
        self.app_id = app_id

    def committed(self) -> int | None:
        """The last batch id the table holds for this query, if any."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path).transaction_version(self.app_id)
        except TableNotFoundError:
            return None

    def __call__(self, df: Any, batch_id: int) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        done = self.committed()
        if done is not None and batch_id <= done:
            return
        write_deltalake(self.path, df.toArrow(), mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)]))


def read_table(path: str) -> pa.Table | None:
    """The table's rows; None before its first commit (no micro-batch had rows to write)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path).to_pyarrow_table()
    except TableNotFoundError:
        return None
