"""Segment files: append-only logs of message records, with per-record checksums.

A queue's messages live in numbered segment files (`0000000001.seg`, ...). Each record is

    u32 length of the rest | u32 checksum of the rest | u8 flags | u64 queue sequence number
    | u16 route length | [i64 TTL deadline] | route (exchange and routing-key shortstrs)
    | u32 header length | content header payload | body

(the deadline only with FLAG_EXPIRY: milliseconds since the epoch, so it means the same
after a restart; in a stream's segments the same slot holds, with FLAG_CHUNK, the time the
record's chunk was appended, and the sequence number is the record's offset)

so the content header and body are stored exactly as the publisher sent them. Beside each
segment an `.ack` file collects 8-byte marks -- a message was acked (or dropped) or was
delivered -- each with its own check bits. A torn or corrupt tail is detected by the
checksums when a segment is scanned at start-up.

The checksum is the low 32 bits of xxh3-64 in segments that start with MAGIC (WRNSEG2):
zlib's crc32 runs at about 3 GB/s here and cost a fifth of the broker's time on 1 MiB
bodies, xxh3 at about 60 GB/s. Segments of the first format (MAGIC_V1, crc32) are still
read: a segment is never appended to after a restart, so each keeps its own format.

This module is the only place that knows the layout: scan() checks records, read_record()
reads one back without a store (stream queues, offline readers), and DiskQueueStore's drain
loop takes its structs and offsets from here (it inlines them, a call per record being
measurably slower there).
"""

import os
import struct
import zlib
from typing import Callable, NamedTuple

import xxhash

from ..amqp.body import Body, SplitBody

Buffer = bytes | bytearray | memoryview

MAGIC = b"WRNSEG2\n"      # records checked with xxh3 (written by this version)
MAGIC_V1 = b"WRNSEG1\n"   # records checked with crc32 (read only)
SEGMENT_SIZE = 8 << 20

FLAG_DURABLE = 1   # a persistent message in a durable queue: survives restarts
FLAG_PAGED = 2     # a transient message paged out of memory: discarded at start-up
FLAG_EXPIRY = 4    # the record carries its message's TTL deadline (with either of the above)
FLAG_CHUNK = 8     # a stream's record that starts a chunk: the i64 slot holds the chunk's time
_SLOT_FLAGS = FLAG_EXPIRY | FLAG_CHUNK

# The record layout, declared here only. A record starts with RECORD_HEAD (its `length`
# counts every byte after the length and crc), then the route, HEADER_LEN, header, body.
RECORD_PREFIX = struct.Struct(">II")      # length, crc
RECORD_HEAD = struct.Struct(">IIBQH")     # length, crc, flags, seq, route length
PREFIX_SIZE = RECORD_PREFIX.size          # 8: bytes of a record not counted in its length
HEAD_SIZE = RECORD_HEAD.size              # 19: the route starts this far in (see route_start)
FIXED_SIZE = HEAD_SIZE - PREFIX_SIZE      # 11: flags, seq, route length
HEADER_LEN = struct.Struct(">I")          # content header length, right after the route
HEADER_LEN_SIZE = HEADER_LEN.size         # 4
REC_OVERHEAD = HEAD_SIZE + HEADER_LEN_SIZE  # 23: a record's bytes besides route, header, body
# The smallest `length` a record can announce (empty route, header and body).
MIN_LENGTH = FIXED_SIZE + HEADER_LEN_SIZE

_FIXED = struct.Struct(">BQH")            # the head after the prefix (what encode_record packs)
EXPIRY = struct.Struct(">q")              # after the head, with FLAG_EXPIRY
EXPIRY_SIZE = EXPIRY.size


def route_start(flags: int) -> int:
    """Where a record's route starts, from the record's start (after the deadline or the
    chunk time, if any)."""
    return HEAD_SIZE + EXPIRY_SIZE if flags & _SLOT_FLAGS else HEAD_SIZE


class Record(NamedTuple):
    """One record as read back; route, header and body are the only copies made."""

    flags: int
    seq: int
    route: bytes
    header: bytes
    body: bytes
    end: int  # the position just after the record: where the next one starts
    expiry: int | None = None  # the TTL deadline, ms since the epoch (FLAG_EXPIRY)
    stamp: int | None = None   # a stream chunk's time, ms since the epoch (FLAG_CHUNK)


MARK_ACK = 0x41        # 'A': settled for good
MARK_DELIVERED = 0x44  # 'D': handed to a consumer (drives the redelivered flag)
# 'C' then 'N': the record was handed out N times before (a message a quorum queue appended
# again keeps its count in one pair of marks, not N 'D' marks); N is the offset field of 'N'.
MARK_COUNT = 0x43
MARK_COUNT_VALUE = 0x4E
_KINDS = (MARK_ACK, MARK_DELIVERED, MARK_COUNT, MARK_COUNT_VALUE)
_MARK = struct.Struct(">BIxH")  # kind, record offset, pad, check
MARK_SIZE = _MARK.size
_U32 = struct.Struct(">I")      # a mark's check bits cover its kind and its offset as a u32


def segment_name(seg_id: int) -> str:
    return f"{seg_id:010d}.seg"


def ack_name(seg_id: int) -> str:
    return f"{seg_id:010d}.ack"


_xxh3 = xxhash.xxh3_64_intdigest


def checksum(data: Buffer) -> int:
    """A record's checksum in a MAGIC segment."""
    return _xxh3(data) & 0xFFFFFFFF


def checksum_v1(data: Buffer) -> int:
    """A record's checksum in a MAGIC_V1 segment."""
    return zlib.crc32(data)


CHECKSUMS: dict[bytes, Callable[[Buffer], int]] = {MAGIC: checksum, MAGIC_V1: checksum_v1}


def _fixed(flags: int, seq: int, route: bytes, expiry: int | None) -> bytes:
    """`expiry` fills the i64 slot: a TTL deadline (FLAG_EXPIRY is set for it), or, when
    `flags` has FLAG_CHUNK, a stream chunk's time."""
    if expiry is None:
        return _FIXED.pack(flags, seq, len(route))
    if not flags & FLAG_CHUNK:
        flags |= FLAG_EXPIRY
    return _FIXED.pack(flags, seq, len(route)) + EXPIRY.pack(expiry)


def encode_record(flags: int, seq: int, route: bytes, header: bytes, body: Buffer, expiry: int | None = None) -> bytes:
    """A whole record; `expiry`: the message's TTL deadline in ms since the epoch, if any."""
    rest = b"".join((_fixed(flags, seq, route, expiry), route, HEADER_LEN.pack(len(header)), header, body))
    return RECORD_PREFIX.pack(len(rest), checksum(rest)) + rest


def encode_record_head(flags: int, seq: int, route: bytes, header: bytes, body: Body,
                       expiry: int | None = None) -> bytes:
    """A record without its body, which the caller writes right after it: a big body is
    written from the message itself, never joined with its head (the checksum covers it)."""
    head = b"".join((_fixed(flags, seq, route, expiry), route, HEADER_LEN.pack(len(header)), header))
    digest = xxhash.xxh3_64(head)
    if isinstance(body, SplitBody):
        for part in body.parts:
            digest.update(part)
    else:
        digest.update(body)
    return RECORD_PREFIX.pack(len(head) + len(body), digest.intdigest() & 0xFFFFFFFF) + head


def record_size(length: int) -> int:
    """Bytes a record takes in its segment, from the `length` its head announces."""
    return PREFIX_SIZE + length


def record_body_length(data: Buffer, pos: int) -> int:
    """Size of the body of the (complete) record at `pos`, reading only its lengths."""
    length, _crc, flags, _seq, route_len = RECORD_HEAD.unpack_from(data, pos)
    start = route_start(flags)
    (header_len,) = HEADER_LEN.unpack_from(data, pos + start + route_len)
    return length - (start - PREFIX_SIZE) - route_len - HEADER_LEN_SIZE - header_len


def read_record(data: bytes, pos: int) -> Record:
    """The record at `pos`, which must lie whole in `data` (checksum not checked: see scan).
    Route, header and body are each copied once, by slicing `data`."""
    length, _crc, flags, seq, route_len = RECORD_HEAD.unpack_from(data, pos)
    end = pos + PREFIX_SIZE + length
    start = pos + route_start(flags)
    p = start + route_len
    header_end = p + HEADER_LEN_SIZE + HEADER_LEN.unpack_from(data, p)[0]
    slot = EXPIRY.unpack_from(data, pos + HEAD_SIZE)[0] if flags & _SLOT_FLAGS else None
    chunk = flags & FLAG_CHUNK
    return Record(flags, seq, data[start:p], data[p + HEADER_LEN_SIZE:header_end], data[header_end:end], end,
                  None if chunk else slot, slot if chunk else None)


def scan(data: Buffer, start: int = len(MAGIC),
         check: Callable[[Buffer], int] = checksum) -> tuple[list[tuple[int, int, int]], int, str | None]:
    """Walk the records of a segment's bytes, checking each checksum with `check` (the
    segment format's: CHECKSUMS[magic]).

    Returns (records, good_end, problem): records is a list of (offset, flags, seq) for every
    intact record, good_end the offset just after the last intact one, and problem None, or a
    description of why the scan stopped early (torn or corrupt record).
    """
    records: list[tuple[int, int, int]] = []
    pos = start
    n = len(data)
    unpack_prefix = RECORD_PREFIX.unpack_from
    unpack_fixed = _FIXED.unpack_from
    view = memoryview(data)
    while pos < n:
        if n - pos < PREFIX_SIZE:
            return records, pos, f"truncated record header at offset {pos}"
        length, crc = unpack_prefix(data, pos)
        end = pos + PREFIX_SIZE + length
        if length < MIN_LENGTH or end > n:
            return records, pos, f"truncated record at offset {pos} ({length} bytes announced)"
        if check(view[pos + PREFIX_SIZE:end]) != crc:
            return records, pos, f"checksum mismatch at offset {pos}"
        flags, seq, _ = unpack_fixed(data, pos + PREFIX_SIZE)
        records.append((pos, flags, seq))
        pos = end
    return records, pos, None


def encode_mark(kind: int, offset: int) -> bytes:
    return _MARK.pack(kind, offset, (zlib.crc32(bytes((kind,)) + _U32.pack(offset)) & 0xFFFF))


def read_marks(data: bytes) -> tuple[set[int], dict[int, int], str | None]:
    """(acked offsets, delivery counts by offset, problem) from an .ack file's bytes."""
    acked: set[int] = set()
    delivered: dict[int, int] = {}
    usable = len(data) - len(data) % MARK_SIZE
    bad: list[int] = []
    counted: int | None = None  # the record of a 'C' mark, until its 'N'
    for pos in range(0, usable, MARK_SIZE):
        kind, offset, check = _MARK.unpack_from(data, pos)
        if check != zlib.crc32(bytes((kind,)) + _U32.pack(offset)) & 0xFFFF or kind not in _KINDS:
            # A bad mark is skipped (each mark has its own check bits, so the next ones still
            # count). An unread ack only means a redelivery (at least once).
            bad.append(pos)
            counted = None
            continue
        if kind == MARK_ACK:
            acked.add(offset)
        elif kind == MARK_DELIVERED:
            delivered[offset] = delivered.get(offset, 0) + 1
        elif kind == MARK_COUNT:
            counted = offset
            continue
        elif counted is not None:  # MARK_COUNT_VALUE right after its MARK_COUNT
            delivered[counted] = delivered.get(counted, 0) + offset
        counted = None
    problems: list[str] = []
    if bad:
        problems.append(f"bad mark at offset {bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""))
    if usable != len(data):
        problems.append(f"truncated mark at offset {usable}")
    return acked, delivered, "; ".join(problems) or None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
