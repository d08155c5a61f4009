"""A durable local queue of messages not yet confirmed by the broker (SQLite).

A publisher whose upstream fires and forgets must not keep unconfirmed messages only in
memory: a crash would lose them. Rows are committed with synchronous=FULL before publish()
returns and deleted once the broker confirms. All methods block; the publisher calls them
through asyncio.to_thread, so one lock serialises them over a single connection.
"""

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable

from .message import OutgoingMessage, dump_properties

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    body BLOB NOT NULL,
    properties TEXT NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    parked INTEGER NOT NULL DEFAULT 0
)
"""


class OutboxLocked(RuntimeError):
    """Another process has this outbox open: two senders would publish every row twice."""


class Outbox:
    def __init__(self, path: str) -> None:
        self.path = path
        # flock is released by the kernel when a process dies, so a crashed owner never
        # blocks recovery.
        self._lock_file = open(path + ".lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise OutboxLocked(f"outbox {path} is in use by another process") from None
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._lock_file.close()

    def write(self, new: list[OutgoingMessage], confirmed: Iterable[int]) -> None:
        """Insert `new` (setting their seq) and delete the rows `confirmed`, in one
        transaction (one fsync): group commit."""
        rows = [(m.message_id, m.exchange, m.routing_key, m.body, dump_properties(m.properties),
                 m.created) for m in new]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.cursor()
                for message, row in zip(new, rows):
                    cur.execute("INSERT INTO outbox (message_id, exchange, routing_key, body, "
                                "properties, created) VALUES (?, ?, ?, ?, ?, ?)", row)
                    message.seq = cur.lastrowid
                cur.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in confirmed])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def failed(self, seq: int, attempts: int, error: str, park: bool) -> None:
        """Note a failed round of sends; a parked row is not resent until unpark()."""
        with self._lock:
            self._db.execute("UPDATE outbox SET attempts = ?, error = ?, parked = ? "
                             "WHERE seq = ?", (attempts, error, int(park), seq))

    def unpark(self) -> list[OutgoingMessage]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._select("WHERE parked = 1", ())
            self._db.execute("UPDATE outbox SET parked = 0 WHERE parked = 1")
            self._db.execute("COMMIT")
        for m in rows:
            m.parked = False
        return rows

    def count(self) -> tuple[int, int]:
        """(all rows, parked rows)."""
        with self._lock:
            total, parked = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(parked), 0) FROM outbox").fetchone()
        return total, parked

    def pending(self) -> list[OutgoingMessage]:
        """The rows to (re)send, oldest first: what a crashed process left behind."""
        with self._lock:
            return self._select("WHERE parked = 0", ())

    def unconfirmed(self, older_than: float | None = None) -> list[OutgoingMessage]:
        """Every row (pending and parked) created more than older_than seconds ago."""
        cutoff = time.time() - (older_than or 0.0)
        with self._lock:
            return self._select("WHERE created <= ?", (cutoff,))

    def _select(self, where: str, args: tuple[object, ...]) -> list[OutgoingMessage]:
        rows = self._db.execute(
            "SELECT seq, message_id, exchange, routing_key, body, properties, created, attempts, "
            f"error, parked FROM outbox {where} ORDER BY seq", args).fetchall()
        return [OutgoingMessage(bytes(body), exchange, routing_key, message_id, json.loads(props),
                                created, attempts, error, seq, bool(parked))
                for seq, message_id, exchange, routing_key, body, props, created, attempts, error,
                parked in rows]


def remove(path: str) -> None:
    """Delete an outbox and its WAL files (for tests and tools)."""
    for suffix in ("", "-wal", "-shm", ".lock"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass
