"""One segment file of a queue or stream and its ack file: the bytes appended but not written
yet, and what is known of its records. The record layout is segments.py's; the persister
writes a segment's bytes out at its flush and fsyncs them (warren.store.persister)."""

from __future__ import annotations

import os
from itertools import chain
from typing import Callable, Protocol

from ..amqp.body import Body, SplitBody
from .segments import MAGIC, MARK_COUNT, MARK_COUNT_VALUE, Buffer, checksum, encode_mark, segment_name

_IOV_MAX = 1024


class SegmentWriter(Protocol):
    """What a segment asks of the persister (warren.store.persister.Persister): to be written
    out at its next flush, and dropped from it when removed."""

    dirty: set[Segment]    # segments with buffered bytes or marks
    to_sync: set[Segment]  # segments with durable data in the open batch

    def close_fd(self, fd: int) -> None:
        """Close a file descriptor, but not under a running fsync."""
        ...


class Segment:
    """One segment file and its ack file, with what is known of their records."""

    __slots__ = ("id", "path", "fd", "ack_fd", "size", "flushed", "count", "acked", "acked_set",
                 "delivered", "pieces", "tail", "marks", "persister", "check")

    def __init__(self, persister: SegmentWriter, directory: str, seg_id: int, create: bool):
        self.persister = persister
        self.id = seg_id
        self.path = os.path.join(directory, segment_name(seg_id))
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd: int | None = os.open(self.path, flags, 0o644)  # None once removed
        self.ack_fd: int | None = None
        self.size = self.flushed = 0
        self.count = self.acked = 0
        self.acked_set: set[int] = set()        # offsets of settled records
        self.delivered: dict[int, int] = {}     # offset -> deliveries before a restart
        # The bytes not written yet, in order: `pieces` (message bodies by reference, and
        # finished runs of small records), then `tail`, where small records gather.
        self.pieces: list[bytes | bytearray | memoryview] = []
        self.tail = bytearray()
        self.marks = bytearray()
        self.check: Callable[[Buffer], int] = checksum  # its records' checksum (a recovered segment: by its magic)
        if create:
            self.tail += MAGIC
            self.size = len(MAGIC)
            try:  # an .ack file left by a crash while a settled segment of this id was removed
                os.unlink(self.path[:-4] + ".ack")
            except FileNotFoundError:
                pass

    def append(self, record: bytes, body: Body | None = None) -> int:
        """Add a record; with `body`, `record` is its head and the body is written from the
        message's own buffers (no copy, and the message never changes: see Message)."""
        offset = self.size
        self.tail += record
        size = len(record)
        if body is not None:
            self.pieces.append(self.tail)
            if isinstance(body, SplitBody):
                self.pieces.extend(body.parts)
            else:
                self.pieces.append(body)
            self.tail = bytearray()
            size += len(body)
        self.size += size
        self.count += 1
        self.persister.dirty.add(self)
        return offset

    def mark(self, kind: int, offset: int) -> None:
        self.marks += encode_mark(kind, offset)
        self.persister.dirty.add(self)

    def mark_count(self, offset: int, count: int) -> None:
        """The record at `offset` was handed out `count` times before (one pair of marks)."""
        self.marks += encode_mark(MARK_COUNT, offset) + encode_mark(MARK_COUNT_VALUE,
                                                                            min(count, 0xFFFFFFFF))
        self.persister.dirty.add(self)

    def write_out(self) -> None:
        # pwrite at the flushed offset: a retry after a failed (partial) write overwrites it.
        fd = self.fd
        assert fd is not None, "write to a removed segment"
        pieces = self.pieces
        if self.tail:
            pieces.append(self.tail)
            self.tail = bytearray()
        while pieces:
            n = os.pwritev(fd, pieces[:_IOV_MAX], self.flushed)
            self.flushed += n
            done = 0
            while done < len(pieces) and n >= len(pieces[done]):
                n -= len(pieces[done])
                done += 1
            del pieces[:done]
            if n:
                pieces[0] = memoryview(pieces[0])[n:]
        if self.marks:
            if self.ack_fd is None:
                self.ack_fd = os.open(self.path[:-4] + ".ack", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            n = os.write(self.ack_fd, self.marks)
            del self.marks[:n]
            if self.marks:
                raise OSError("short write of ack marks")

    def read(self, offset: int, length: int) -> bytes:
        """Bytes of the segment (up to `length`), whether written yet or still buffered."""
        end = offset + length
        parts: list[bytes | memoryview] = []
        if offset < self.flushed:
            assert self.fd is not None, "read from a removed segment"
            data = os.pread(self.fd, min(end, self.flushed) - offset, offset)
            if end <= self.flushed:
                return data
            parts.append(data)
        pos = self.flushed
        for piece in chain(self.pieces, (self.tail,)):
            size = len(piece)
            if pos + size > offset:
                parts.append(memoryview(piece)[max(offset - pos, 0):end - pos])
            pos += size
            if pos >= end:
                break
        return b"".join(parts)

    def read_body(self, offset: int, length: int) -> bytes:
        """A body of the segment, read into the object the message will keep: straight from
        the file, or the message's own body while it is still waiting to be written."""
        if offset + length <= self.flushed:
            assert self.fd is not None, "read from a removed segment"
            return os.pread(self.fd, length, offset)
        pos = self.flushed
        for piece in self.pieces:
            if pos == offset and len(piece) == length and type(piece) is bytes:  # the body itself
                return piece
            pos += len(piece)
            if pos > offset:
                break
        return self.read(offset, length)

    def remove(self) -> None:
        self.persister.dirty.discard(self)
        self.persister.to_sync.discard(self)
        for fd in (self.fd, self.ack_fd):
            if fd is not None:
                self.persister.close_fd(fd)
        self.fd = self.ack_fd = None
        for path in (self.path, self.path[:-4] + ".ack"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
