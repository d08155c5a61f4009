"""Segment files: append-only logs of message records, with per-record checksums.

A queue's messages live in numbered segment files (`0000000001.seg`, ...). Each record is

    u32 length of the rest | u32 crc32 of the rest | u8 flags | u64 queue sequence number
    | u16 route length | route (exchange and routing-key shortstrs) | u32 header length
    | content header payload | body

so the content header and body are stored exactly as the publisher sent them. Beside each
segment an `.ack` file collects 8-byte marks -- a message was acked (or dropped) or was
delivered -- each with its own check bits. A torn or corrupt tail is detected by the
checksums when a segment is scanned at start-up.
"""

import os
import struct
import zlib

MAGIC = b"WRNSEG1\n"
SEGMENT_SIZE = 8 << 20

FLAG_DURABLE = 1   # a persistent message in a durable queue: survives restarts
FLAG_PAGED = 2     # a transient message paged out of memory: discarded at start-up

_REC_HEAD = struct.Struct(">II")      # length, crc
_REC_FIXED = struct.Struct(">BQH")    # flags, seq, route length
_U32 = struct.Struct(">I")
REC_OVERHEAD = _REC_HEAD.size + _REC_FIXED.size + _U32.size

MARK_ACK = 0x41        # 'A': settled for good
MARK_DELIVERED = 0x44  # 'D': handed to a consumer (drives the redelivered flag)
_MARK = struct.Struct(">BIxH")  # kind, record offset, pad, check
MARK_SIZE = _MARK.size


def segment_name(seg_id: int) -> str:
    return f"{seg_id:010d}.seg"


def ack_name(seg_id: int) -> str:
    return f"{seg_id:010d}.ack"


def encode_record(flags: int, seq: int, route: bytes, header: bytes, body: bytes) -> bytes:
    rest = b"".join((_REC_FIXED.pack(flags, seq, len(route)), route, _U32.pack(len(header)), header, body))
    return _REC_HEAD.pack(len(rest), zlib.crc32(rest)) + rest


def decode_record(data, pos: int):
    """(flags, seq, route, header, body, next position) of the record at `pos` (already checked)."""
    length, _crc = _REC_HEAD.unpack_from(data, pos)
    start = pos + 8
    end = start + length
    flags, seq, route_len = _REC_FIXED.unpack_from(data, start)
    p = start + _REC_FIXED.size
    route = bytes(data[p:p + route_len])
    p += route_len
    (header_len,) = _U32.unpack_from(data, p)
    p += 4
    header = bytes(data[p:p + header_len])
    body = bytes(data[p + header_len:end])
    return flags, seq, route, header, body, end


def scan(data, start: int = len(MAGIC)):
    """Walk the records of a segment's bytes, checking each checksum.

    Returns (records, good_end, problem): records is a list of (offset, flags, seq) for every
    intact record, good_end the offset just after the last intact one, and problem None, or a
    description of why the scan stopped early (torn or corrupt record).
    """
    records = []
    pos = start
    n = len(data)
    unpack_head = _REC_HEAD.unpack_from
    unpack_fixed = _REC_FIXED.unpack_from
    crc32 = zlib.crc32
    view = memoryview(data)
    while pos < n:
        if n - pos < 8:
            return records, pos, f"truncated record header at offset {pos}"
        length, crc = unpack_head(data, pos)
        end = pos + 8 + length
        if length < _REC_FIXED.size + 4 or end > n:
            return records, pos, f"truncated record at offset {pos} ({length} bytes announced)"
        if crc32(view[pos + 8:end]) != crc:
            return records, pos, f"checksum mismatch at offset {pos}"
        flags, seq, _ = unpack_fixed(data, pos + 8)
        records.append((pos, flags, seq))
        pos = end
    return records, pos, None


def encode_mark(kind: int, offset: int) -> bytes:
    return _MARK.pack(kind, offset, (zlib.crc32(bytes((kind,)) + _U32.pack(offset)) & 0xFFFF))


def read_marks(data):
    """(acked offsets, delivery counts by offset, problem) from an .ack file's bytes."""
    acked = set()
    delivered: dict = {}
    usable = len(data) - len(data) % MARK_SIZE
    bad = []
    for pos in range(0, usable, MARK_SIZE):
        kind, offset, check = _MARK.unpack_from(data, pos)
        if check != zlib.crc32(bytes((kind,)) + _U32.pack(offset)) & 0xFFFF or kind not in (MARK_ACK, MARK_DELIVERED):
            # A bad mark is skipped (each mark has its own check bits, so the next ones still
            # count). An unread ack only means a redelivery (at least once).
            bad.append(pos)
            continue
        if kind == MARK_ACK:
            acked.add(offset)
        else:
            delivered[offset] = delivered.get(offset, 0) + 1
    problems = []
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
