"""Damaged message files: persistent messages are published to a durable queue, the broker is
stopped (SIGTERM or SIGKILL), the files under <data>/queues/<dir>/ are damaged, and the broker
starts again. It must always start, recover every intact record, say what it did in its log,
and keep working (new publishes, acks) across further restarts.

The segment layout is the documented one (warren/store/segments.py), parsed here on its own:
an 8-byte magic, then records `u32 length | u32 checksum | rest`; beside each segment an .ack
file of 8-byte marks `u8 kind | u32 record offset | pad | u16 check`.
(A corrupt definitions.json is covered by tests/integration/test_restart_definitions.py.)
"""

import glob
import os
import random
import signal
import struct
import zlib

import pika
import pytest

MAGIC = b"WRNSEG2\n"
MARK_SIZE = 8
SEGMENT_SIZE = 8 << 20

STOPS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]
Q = "crashq"


# ------------------------------------------------------------------------------ helpers

def body(i: int, size: int = 1000) -> bytes:
    head = f"m{i:05d}:".encode()
    return head + bytes((i * 7 + j) % 251 for j in range(size - len(head)))


def number(b: bytes) -> int:
    """The message number of a body made by body(), which must be intact."""
    i = int(b[1:6])
    assert b == body(i, len(b)), f"corrupt body for message {i}"
    return i


def connect(b):
    return pika.BlockingConnection(b.pika_params())


def publish(b, numbers, size=1000) -> None:
    """Persistent messages to the durable queue Q, each confirmed."""
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(Q, durable=True)
    ch.confirm_delivery()
    for i in numbers:
        ch.basic_publish("", Q, body(i, size), pika.BasicProperties(delivery_mode=2))
    conn.close()


def take_all(b, ack=True) -> list:
    """(number, redelivered) of every message of Q, taken with basic.get (acked if `ack`)."""
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(Q, durable=True)
    got = []
    while True:
        method, _props, data = ch.basic_get(Q, auto_ack=ack)
        if method is None:
            break
        got.append((number(data), method.redelivered))
    conn.close()
    return got


def take_ack_some(b, keep) -> list:
    """Like take_all, but leaves the messages numbered in `keep` unacked (they go back to the
    queue when the connection closes)."""
    conn = connect(b)
    ch = conn.channel()
    got = []
    while True:
        method, _props, data = ch.basic_get(Q)
        if method is None:
            break
        got.append((number(data), method.redelivered))
        if got[-1][0] not in keep:
            ch.basic_ack(method.delivery_tag)
    conn.close()
    return got


def numbers_of(got) -> list:
    return [i for i, _ in got]


def queue_dir(b) -> str:
    dirs = glob.glob(os.path.join(b.data_dir, "queues", "*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def segment_files(b) -> list:
    return sorted(glob.glob(os.path.join(queue_dir(b), "*.seg")))


def records(path) -> list:
    """(offset, total size) of each record of a segment file."""
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(MAGIC)
    out, pos = [], len(MAGIC)
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        assert pos + 8 + length <= len(data), "unexpected torn record"
        out.append((pos, 8 + length))
        pos += 8 + length
    assert pos == len(data)
    return out


def marks(path) -> list:
    """(kind, record offset) of each mark of an .ack file."""
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) % MARK_SIZE == 0
    return [(chr(data[p]), struct.unpack_from(">I", data, p + 1)[0]) for p in range(0, len(data), MARK_SIZE)]


def make_mark(kind: str, offset: int) -> bytes:
    raw = kind.encode() + struct.pack(">I", offset)
    return raw + b"\0" + struct.pack(">H", zlib.crc32(raw) & 0xFFFF)


def flip(path, position: int, n: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        data = f.read(n)
        f.seek(position)
        f.write(bytes(x ^ 0xFF for x in data))


def truncate(path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def check_more_survive(make_broker, restart_broker, b, expected, new, sig=signal.SIGKILL):
    """Publish `new` messages, restart (SIGKILL by default), and check the queue then holds
    `expected` + `new`, in order; returns the restarted broker."""
    publish(b, new)
    b = restart_broker(b, sig=sig)
    assert numbers_of(take_all(b)) == list(expected) + list(new)
    return b


# -------------------------------------------------------------------- segment damage

@pytest.mark.parametrize("sig", STOPS)
@pytest.mark.parametrize("cut", [3, "half"], ids=["in-header", "in-body"])
def test_torn_tail_is_truncated(make_broker, restart_broker, sig, cut):
    b = make_broker()
    publish(b, range(20))
    b.stop(sig)
    (seg,) = segment_files(b)
    recs = records(seg)
    assert len(recs) == 20
    last_offset, last_size = recs[-1]
    truncate(seg, last_offset + (cut if cut == 3 else last_size // 2))

    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    assert f"torn tail in {os.path.basename(seg)}" in log, log
    assert f"truncated to {last_offset} bytes" in log, log
    assert os.path.getsize(seg) == last_offset  # the torn bytes are gone from the file
    assert not os.path.exists(os.path.join(b.data_dir, "quarantine"))
    conn = connect(b)
    assert conn.channel().queue_declare(Q, durable=True, passive=True).method.message_count == 19
    conn.close()
    # New publishes land after the recovered ones and survive another (hard) restart.
    publish(b, range(100, 105))
    b = restart_broker(b, sig=signal.SIGKILL)
    assert "torn tail" not in b.log()
    assert take_all(b) == [(i, False) for i in list(range(19)) + list(range(100, 105))]
    b = restart_broker(b)
    assert take_all(b) == []


@pytest.mark.parametrize("sig", STOPS)
def test_corrupt_record_in_last_segment(make_broker, restart_broker, sig):
    """Damage inside the last segment (not a torn append): the records before it are
    recovered, the file is truncated there, and a copy of it is kept in quarantine."""
    b = make_broker()
    publish(b, range(20))
    b.stop(sig)
    (seg,) = segment_files(b)
    bad_offset, bad_size = records(seg)[5]
    flip(seg, bad_offset + bad_size - 10)
    with open(seg, "rb") as f:
        damaged = f.read()

    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    target = os.path.join(b.data_dir, "quarantine", f"{os.path.basename(queue_dir(b))}-{os.path.basename(seg)}")
    assert f"corrupt segment {seg} (checksum mismatch at offset {bad_offset})" in log, log
    assert f"torn tail in {os.path.basename(seg)}" in log and f"truncated to {bad_offset} bytes" in log, log
    with open(target, "rb") as f:
        assert f.read() == damaged
    assert os.path.getsize(seg) == bad_offset
    check_more_survive(make_broker, restart_broker, b, range(5), range(30, 33))


@pytest.mark.parametrize("sig", STOPS)
def test_corrupt_record_in_earlier_segment_is_quarantined(make_broker, restart_broker, sig):
    size = 100 << 10
    count = 100  # ~10 MiB: two 8 MiB segments
    b = make_broker()
    publish(b, range(count), size=size)
    b.stop(sig)
    segs = segment_files(b)
    assert len(segs) == 2, segs
    first = records(segs[0])
    in_first = len(first)
    assert in_first < count and len(records(segs[1])) == count - in_first
    bad = 30
    bad_offset, bad_size = first[bad]
    flip(segs[0], bad_offset + bad_size - 500)  # in the body
    with open(segs[0], "rb") as f:
        damaged = f.read()

    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    target = os.path.join(b.data_dir, "quarantine",
                          f"{os.path.basename(queue_dir(b))}-{os.path.basename(segs[0])}")
    assert "[error]" in log and f"corrupt segment {segs[0]}" in log, log
    assert f"checksum mismatch at offset {bad_offset}" in log, log
    assert f"copied to {target}" in log, log
    with open(target, "rb") as f:
        assert f.read() == damaged
    expected = list(range(bad)) + list(range(in_first, count))
    conn = connect(b)
    assert conn.channel().queue_declare(Q, durable=True, passive=True).method.message_count == len(expected)
    conn.close()
    # The queue keeps working: the recovered messages come first, then new ones; acked ones
    # stay acked.
    b = check_more_survive(make_broker, restart_broker, b, expected, range(200, 203))
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == []


@pytest.mark.parametrize("sig", STOPS)
def test_bad_header_in_earlier_segment(make_broker, restart_broker, sig):
    """Segment 1 loses its header: quarantined, the other segment is recovered, and new
    segments do not collide with the bad file's name."""
    size = 100 << 10
    b = make_broker()
    publish(b, range(100), size=size)
    b.stop(sig)
    segs = segment_files(b)
    assert len(segs) == 2
    in_first = len(records(segs[0]))
    flip(segs[0], 0, 8)

    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    assert f"corrupt segment {segs[0]} (bad segment header)" in log, log
    assert len(glob.glob(os.path.join(b.data_dir, "quarantine", "*.seg"))) == 1
    b = check_more_survive(make_broker, restart_broker, b, range(in_first, 100), range(300, 305))
    b = restart_broker(b)
    assert take_all(b) == []


@pytest.mark.parametrize("garbage", ["random", "empty", "magic-only", "zeros-after-magic"])
@pytest.mark.parametrize("sig", STOPS)
def test_garbage_segment_file(make_broker, restart_broker, sig, garbage):
    """An extra segment after the good one: garbage (as if a crash left it half made). The
    good messages are recovered, the broker starts and keeps taking messages."""
    b = make_broker()
    publish(b, range(10))
    b.stop(sig)
    (seg,) = segment_files(b)
    extra = os.path.join(os.path.dirname(seg), "0000000002.seg")
    content = {"random": random.Random(7).randbytes(5000), "empty": b"", "magic-only": MAGIC,
               "zeros-after-magic": MAGIC + bytes(300)}[garbage]
    with open(extra, "wb") as f:
        f.write(content)

    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    if garbage == "random":
        assert "bad segment header" in log, log
        assert len(glob.glob(os.path.join(b.data_dir, "quarantine", "*.seg"))) == 1
    elif garbage == "zeros-after-magic":
        assert "torn tail in 0000000002.seg" in log, log
    b = check_more_survive(make_broker, restart_broker, b, range(10), range(20, 25))
    b = restart_broker(b)
    assert take_all(b) == []


@pytest.mark.parametrize("sig", STOPS)
def test_only_segment_is_garbage(make_broker, restart_broker, sig):
    b = make_broker()
    publish(b, range(5))
    b.stop(sig)
    (seg,) = segment_files(b)
    with open(seg, "wb") as f:
        f.write(random.Random(3).randbytes(3000))
    b = make_broker(data_dir=b.data_dir)
    assert "bad segment header" in b.log()
    b = check_more_survive(make_broker, restart_broker, b, [], range(10, 13))


# ------------------------------------------------------------------------ .ack damage

def deliver_and_ack(b):
    """Messages 0..9 published; 0..5 taken with basic.get (delivered-marks D0..D5), then 0..3
    acked (A0..A3), each answered by a round trip. Returns the .ack file path and its marks."""
    publish(b, range(10))
    conn = connect(b)
    ch = conn.channel()
    tags = []
    for i in range(6):
        method, _props, data = ch.basic_get(Q)
        assert number(data) == i
        tags.append(method.delivery_tag)
    for tag in tags[:4]:
        ch.basic_ack(tag)
        ch.queue_declare(Q, durable=True, passive=True)  # the ack is processed (and its mark written)
    return conn


def forget(conn) -> None:
    """Close a pika connection whose broker may be gone."""
    try:
        conn.close()
    except pika.exceptions.AMQPError:
        pass


def ack_file(b) -> str:
    (seg,) = segment_files(b)
    return seg[:-4] + ".ack"


@pytest.mark.parametrize("sig", STOPS)
def test_intact_marks(make_broker, restart_broker, sig):
    """The reference for the damage tests below: acked messages stay acked, delivered ones
    come back redelivered."""
    b = make_broker()
    conn = deliver_and_ack(b)
    b.stop(sig)
    forget(conn)
    (seg,) = segment_files(b)
    offsets = [off for off, _ in records(seg)]
    assert marks(ack_file(b)) == [("D", offsets[i]) for i in range(6)] + [("A", offsets[i]) for i in range(4)]
    b = make_broker(data_dir=b.data_dir)
    assert take_ack_some(b, keep={6}) == [(4, True), (5, True)] + [(i, False) for i in range(6, 10)]
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == [(6, True)]


@pytest.mark.parametrize("sig", STOPS)
def test_truncated_mark(make_broker, restart_broker, sig):
    """The last mark (A3) is cut short: only message 3 comes back, and marks written after
    the restart still count at the next one."""
    b = make_broker()
    conn = deliver_and_ack(b)
    b.stop(sig)
    ack = ack_file(b)
    truncate(ack, 10 * MARK_SIZE - 3)
    b = make_broker(data_dir=b.data_dir)
    assert "truncated mark" in b.log()
    assert take_ack_some(b, keep={5, 8}) == [(3, True), (4, True), (5, True)] + [(i, False) for i in range(6, 10)]
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == [(5, True), (8, True)]
    forget(conn)


@pytest.mark.parametrize("sig", STOPS)
def test_flipped_mark(make_broker, restart_broker, sig):
    """A1 is damaged: message 1 comes back (redelivered, its D mark is intact); the acks
    around it hold, and so do marks written after the restart."""
    b = make_broker()
    conn = deliver_and_ack(b)
    b.stop(sig)
    ack = ack_file(b)
    flip(ack, 7 * MARK_SIZE + 2, 2)
    b = make_broker(data_dir=b.data_dir)
    assert "bad mark at offset 56" in b.log()
    assert take_ack_some(b, keep={1, 7}) == [(1, True), (4, True), (5, True)] + [(i, False) for i in range(6, 10)]
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == [(1, True), (7, True)]
    forget(conn)


@pytest.mark.parametrize("content", ["random", "empty"])
def test_garbage_ack_file(make_broker, restart_broker, content):
    """Nothing usable in the .ack file: every message comes back (at least once); acks made
    after the restart hold."""
    b = make_broker()
    conn = deliver_and_ack(b)
    b.stop(signal.SIGKILL)
    with open(ack_file(b), "wb") as f:
        f.write(random.Random(5).randbytes(101) if content == "random" else b"")
    b = make_broker(data_dir=b.data_dir)
    assert take_ack_some(b, keep={0, 9}) == [(i, False) for i in range(10)]
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == [(0, True), (9, True)]
    forget(conn)


def test_stale_ack_file_of_a_removed_segment(make_broker, restart_broker):
    """A crash between removing a settled segment and removing its .ack file leaves the .ack
    behind; a new segment that takes the same name must not inherit its marks."""
    b = make_broker()
    publish(b, range(3))
    b.stop(signal.SIGKILL)
    (seg,) = segment_files(b)
    first = records(seg)[0][0]
    stale = os.path.join(os.path.dirname(seg), "0000000002.ack")
    with open(stale, "wb") as f:
        f.write(make_mark("A", first) + make_mark("D", first))
    b = make_broker(data_dir=b.data_dir)
    publish(b, [50])  # the first record of the new segment 2, at the stale mark's offset
    b = restart_broker(b, sig=signal.SIGKILL)
    assert take_all(b) == [(0, False), (1, False), (2, False), (50, False)]
