"""warren.amqp.body: a body that spans frames is joined below SPLIT_MIN and kept in parts
from it on; its parts stay views of their reads unless those would hold more than twice the
body; a split body goes out as frames of any size and into a segment record intact."""

import random

import pytest

from warren.amqp.body import SPLIT_MIN, BodyAssembly, SplitBody
from warren.amqp.frames import content_frames
from warren.store import segments as sg


def assemble(data: bytes, read_size: int, part_size: int) -> tuple[BodyAssembly, list[bytes]]:
    """`data` cut into reads of read_size, each read's part(s) of part_size given to an assembly."""
    assembly = BodyAssembly()
    reads = [data[i:i + read_size] for i in range(0, len(data), read_size)]
    for read in reads:
        view = memoryview(read)
        for i in range(0, len(read), part_size):
            assembly.add(view[i:i + part_size])
    return assembly, reads


@pytest.mark.parametrize("size", [1, SPLIT_MIN - 1])
def test_below_split_min_a_body_is_one_buffer(size):
    data = random.randbytes(size)
    assembly, _ = assemble(data, 70_000, 50_000)
    body = assembly.body()
    assert type(body) is bytes and body == data


@pytest.mark.parametrize("size", [SPLIT_MIN, 16 << 20])
def test_from_split_min_on_a_body_is_the_views_of_its_reads(size):
    data = random.randbytes(size)
    assembly, reads = assemble(data, 256 << 10, 131_064)
    body = assembly.body()
    assert isinstance(body, SplitBody) and len(body) == size and bytes(body) == data
    views = [p for p in body.parts if isinstance(p, memoryview)]
    # Reads wholly of the body: only a part of the first one is copied (a view of it would
    # hold its read, twice the body so far).
    assert size - sum(map(len, views)) <= 131_064
    assert all(any(v.obj is r for r in reads) for v in views)


def test_parts_among_other_traffic_are_copied_not_held():
    """One 100-octet part per 200 KB read: views would hold 2,000x the body."""
    assembly = BodyAssembly()
    for i in range(50):
        read = bytes((i,)) * 100 + b"x" * 200_000
        assembly.add(memoryview(read)[:100])
    assert assembly.held <= 2 * assembly.size
    assert all(type(p) is bytes for p in assembly.parts)
    assert bytes(SplitBody(assembly.parts, assembly.size)) == b"".join(bytes((i,)) * 100 for i in range(50))


@pytest.mark.parametrize("frame_max", [4096, 131072, 1 << 20])
def test_a_split_body_goes_out_in_frames_of_the_consumers_size(frame_max):
    data = random.randbytes(SPLIT_MIN * 3 + 17)
    body = assemble(data, 100_003, 33_333)[0].body()
    out: list = []
    content_frames(out, 1, b"h" * 14, body, frame_max)
    stream = b"".join(bytes(p) for p in out)
    pos = 7 + 14 + 1  # the header frame
    got = []
    while pos < len(stream):
        ftype, size = stream[pos], int.from_bytes(stream[pos + 3:pos + 7], "big")
        assert ftype == 3 and 0 < size <= frame_max - 8 and stream[pos + 7 + size] == 0xCE
        got.append(stream[pos + 7:pos + 7 + size])
        pos += 8 + size
    assert b"".join(got) == data
    assert all(len(g) == frame_max - 8 for g in got[:-1])


def test_a_split_body_record_has_the_checksum_of_its_bytes():
    data = random.randbytes(SPLIT_MIN + 5)
    body = assemble(data, 65_536, 65_536)[0].body()
    assert isinstance(body, SplitBody)
    assert sg.encode_record_head(0, 7, b"\x00\x01q", b"h" * 14, body) == \
        sg.encode_record_head(0, 7, b"\x00\x01q", b"h" * 14, data)
