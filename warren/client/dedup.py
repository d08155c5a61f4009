"""Idempotency stores: the message ids whose handler completed, bounded by count.

The consumer asks only about redelivered messages (a message without the redelivered flag
was never delivered before, so it is handled even if its id was seen: the RabbitMQ
reliability guide's advice), and records an id after its handler returned, before the ack.
"""

import sqlite3
from collections import OrderedDict
from typing import Protocol


class IdempotencyStore(Protocol):
    def seen(self, message_id: str) -> bool: ...

    def add(self, message_id: str) -> None: ...

    def flush(self) -> None:
        """Make what add() recorded durable; called before the acks are sent."""

    def close(self) -> None: ...


class MemoryStore:
    """An LRU of the last `size` ids; lost with the process, which is enough for the
    redeliveries of a reconnect (the usual source of duplicates)."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, message_id: str) -> bool:
        if message_id in self._ids:
            self._ids.move_to_end(message_id)
            return True
        return False

    def add(self, message_id: str) -> None:
        self._ids[message_id] = None
        self._ids.move_to_end(message_id)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class SqliteStore:
    """The last `size` ids in a SQLite file, so duplicates are dropped across restarts.
    One commit per ack batch, not per message."""

    def __init__(self, path: str, size: int = 100_000) -> None:
        self.size = size
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS handled "
                         "(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL)")
        self._in_transaction = False
        self._added = 0

    def seen(self, message_id: str) -> bool:
        row = self._db.execute("SELECT 1 FROM handled WHERE id = ?", (message_id,)).fetchone()
        return row is not None

    def add(self, message_id: str) -> None:
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True
        # REPLACE moves a re-handled id to the newest end (LRU order).
        self._db.execute("REPLACE INTO handled (id) VALUES (?)", (message_id,))
        self._added += 1

    def flush(self) -> None:
        if not self._in_transaction:
            return
        if self._added:
            self._db.execute("DELETE FROM handled WHERE seq <= "
                             "(SELECT MAX(seq) FROM handled) - ?", (self.size,))
        self._db.execute("COMMIT")
        self._in_transaction = False
        self._added = 0

    def close(self) -> None:
        self.flush()
        self._db.close()


def make_store(store: "str | IdempotencyStore | None", size: int) -> IdempotencyStore:
    if store is None:
        return MemoryStore(size)
    if isinstance(store, str):
        return SqliteStore(store, size)
    return store
