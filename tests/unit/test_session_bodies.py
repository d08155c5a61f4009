"""Content bodies through the session Connection, however the reads cut the frames: bodies of
frame_max boundary sizes, split over frames of any size, arrive intact; a body frame split
over reads is collected as it arrives; a body is never changed by later input; errors in a body
frame received in place are the ones of a body frame read whole; a content header alone does
not make the broker allocate the body it announces."""

import random

import pytest
from pamqp import body, commands, frame, header

from warren.amqp.body import SPLIT_MIN

from .fake_transport import FRAME_MAX, Client, ConnectionClose, GetOk

LIMIT = FRAME_MAX - 8  # the largest body frame payload


def content(ch: int, data: bytes, frame_size: int = LIMIT, body_size=None, routing_key="q") -> bytes:
    """basic.publish + header + body frames of at most frame_size octets, as bytes."""
    return b"".join([
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), ch),
        frame.marshal(header.ContentHeader(0, len(data) if body_size is None else body_size,
                                           commands.Basic.Properties()), ch),
        *(frame.marshal(body.ContentBody(data[i:i + frame_size]), ch) for i in range(0, len(data), frame_size)),
    ])


def feed(client: Client, data: bytes, cuts) -> None:
    """Hand `data` to the connection in reads of the sizes `cuts` yields (the rest in one)."""
    pos = 0
    for n in cuts:
        if pos >= len(data):
            break
        client.conn.data_received(data[pos:pos + n])
        pos += n
    if pos < len(data):
        client.conn.data_received(data[pos:])


def pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


SIZES = [0, 1, LIMIT - 1, LIMIT, LIMIT + 1, 2 * LIMIT, 2 * LIMIT + 1, 5 * LIMIT + 1, (1 << 20) + 3]
READS = {
    "whole": lambda: iter(()),
    "bytes": lambda: iter([1] * 64 + [1 << 30]),  # the first frames octet by octet
    "odd": lambda: iter([7, 8, 4095, 1, 65537, 131071, 131073] * 1000),
    "random": lambda: (random.Random(17).randint(1, 200_000) for _ in range(10_000)),
}


@pytest.fixture
def client():
    c = Client()
    c.open_channel(1)
    c.declare(1)
    return c


@pytest.mark.parametrize("reads", READS)
def test_bodies_of_boundary_sizes_arrive_intact_however_the_reads_cut_them(client, reads):
    bodies = [pattern(size, i) for i, size in enumerate(SIZES)]
    feed(client, b"".join(content(1, b) for b in bodies), READS[reads]())
    assert client.receive() == []
    assert [b for b, _ in client.drain(1)] == bodies


@pytest.mark.parametrize("frame_size", [1, 4088, 4096, 65536, LIMIT])
def test_any_split_into_frames_gives_the_same_body(client, frame_size):
    data = pattern(3 * LIMIT + 5, frame_size)
    feed(client, content(1, data, frame_size), READS["odd"]())
    assert client.drain(1) == [(data, False)]


def test_a_big_body_is_not_changed_by_later_input(client):
    """The body of a message delivered from the read buffers stays what was published while
    more messages arrive through the same connection and channel."""
    first, second = pattern(3 * LIMIT + 1, 1), pattern(3 * LIMIT + 1, 2)
    small = b"s" * 100
    feed(client, content(1, first) + content(1, small), [LIMIT + 100, 5])
    got = []
    client.get(1, no_ack=True)
    got += client.receive()
    feed(client, content(1, second) + content(1, small), [LIMIT + 100, 5])
    client.get(1, no_ack=True)
    client.get(1, no_ack=True)
    client.get(1, no_ack=True)
    got += client.receive()
    assert [g[-1] for g in got] == [first, small, second, small]


def test_a_body_frame_longer_than_the_rest_of_the_body_split_over_reads(client):
    data = content(1, b"x" * 6000, body_size=5000)
    feed(client, data, [len(data) - 3000])
    assert client.receive() == [ConnectionClose(
        505, "UNEXPECTED_FRAME - content body of 6000 bytes exceeds the 5000 bytes left of the size "
             "in the content header", 60, 40)]


def test_a_bad_frame_end_after_a_body_received_in_place(client):
    good = content(1, b"y" * 10_000)
    bad = good[:-1] + b"\x00"
    feed(client, bad, [len(bad) - 5000])
    [close] = client.receive()
    assert close[:3] == (0, "Connection.Close", 501) and "invalid_frame_end_marker,0" in close[3], close


def test_the_body_frame_octets_split_around_the_frame_end(client):
    data = pattern(10_000, 3)
    stream = content(1, data) + content(1, b"after")
    end = len(content(1, data))
    feed(client, stream, [end - 1, 1, 1])  # the frame end alone, then the next publish
    assert client.drain(1) == [(data, False), (b"after", False)]


def test_a_content_header_alone_does_not_allocate_its_body(client):
    """A 100 MiB content header and some body frames: the channel keeps views of what it was
    sent, never a buffer of the announced size (the body is joined once it is all there)."""
    announced = 100 << 20
    feed(client, content(1, b"z" * LIMIT, body_size=announced), [LIMIT // 2])
    channel = client.conn.channels[1]
    assert sum(map(len, channel.assembly.parts)) == LIMIT
    frames = (announced // 64) // LIMIT
    rest = frame.marshal(body.ContentBody(b"z" * LIMIT), 1) * frames
    feed(client, rest, [100_000] * 1000)
    assert sum(map(len, channel.assembly.parts)) == LIMIT * (frames + 1)
    # What the parts keep alive (their reads, for views): about what was sent.
    assert _kept(channel.assembly.parts) < 2 * LIMIT * (frames + 1)


@pytest.mark.parametrize("size", [SPLIT_MIN, 3 * LIMIT, 40 * LIMIT + 3])
def test_a_delivery_goes_out_as_the_reads_the_body_came_in(client, size):
    """basic.get of a big body writes the stored body by reference, not a copy: the body is
    the reads it arrived in (but for the first ones, copied while they would hold more than
    twice what the body had)."""
    data = pattern(size, 9)
    stream = content(1, data)
    reads = [stream[i:i + 70_000] for i in range(0, len(stream), 70_000)]
    for read in reads:
        client.conn.data_received(read)
    written = []
    write = client.transport.writelines
    client.transport.writelines = lambda chunks: (written.extend(chunks), write(chunks))
    client.get(1, no_ack=True)
    assert client.receive() == [GetOk(1, 1, data, 0)]
    views = [c for c in written if isinstance(c, memoryview)]
    by_reference = sum(len(v) for v in views if any(v.obj is r for r in reads))
    assert by_reference >= size - 3 * 70_000


def test_gets_answered_while_a_big_body_arrives(client):
    client.publish(1, "", "q", b"first")
    data = pattern(4 * LIMIT, 4)
    stream = content(1, data)
    get = frame.marshal(commands.Basic.Get(queue="q", no_ack=True), 1)
    feed(client, get + stream, [len(get) + 1000, 50_000])
    assert client.receive() == [GetOk(1, 1, b"first", 0)]
    assert client.drain(1) == [(data, False)]


def test_a_body_trickling_in_among_other_frames_does_not_hold_their_reads(client):
    """One octet of a big body per read, each read otherwise full of publishes on another
    channel: what the unfinished body keeps is about its own size, not every read it touched."""
    client.open_channel(2)
    channel = client.conn.channels[1]
    head = b"".join([frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1),
                     frame.marshal(header.ContentHeader(0, 10 << 20, commands.Basic.Properties()), 1)])
    client.conn.data_received(head)
    others = content(2, b"o" * 50_000) * 4  # ~200 KB of publishes on channel 2
    for i in range(300):
        client.conn.data_received(frame.marshal(body.ContentBody(bytes((i % 256,))), 1) + others)
    assert sum(map(len, channel.assembly.parts)) == 300
    assert _kept(channel.assembly.parts) < 10_000


def _kept(parts) -> int:
    """Bytes that body parts keep alive: a view's whole read (once), a copy's own size."""
    reads = {id(p.obj): len(p.obj) for p in parts if isinstance(p, memoryview)}
    return sum(reads.values()) + sum(len(p) for p in parts if not isinstance(p, memoryview))
