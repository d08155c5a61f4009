"""Spark's ReadLimit and the source's per-trigger options, turned into the next micro-batch's
caps (shared by the stream and queue modes)."""

from __future__ import annotations

from pyspark.sql.datasource import ReadAllAvailable, ReadLimit
from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows


def caps(limit: ReadLimit, max_records: int | None, max_bytes: int | None,
         available_now: bool) -> tuple[int | None, int | None]:
    """(entries, bytes) the next micro-batch may take under Spark's `limit`. Both options
    apply, a batch ending at whichever it reaches first (Kafka's composite limit): PySpark's
    ReadLimit holds one, the default limit names maxRecordsPerTrigger's, so the other comes
    from the options. ReadAllAvailable is Trigger.Once's: everything, as Spark documents (it
    warns that the limit is ignored). Trigger.AvailableNow gets the default limit (Spark 4.3,
    tried); were it ReadAllAvailable, the options' limits would still apply."""
    if isinstance(limit, ReadAllAvailable):
        return (max_records, max_bytes) if available_now else (None, None)
    if isinstance(limit, ReadMaxRows):
        return min(limit.max_rows, max_records or limit.max_rows), max_bytes
    if isinstance(limit, ReadMaxBytes):
        return max_records, min(limit.max_bytes, max_bytes or limit.max_bytes)
    raise ValueError(f"the warren source takes no read limit {limit!r}")
