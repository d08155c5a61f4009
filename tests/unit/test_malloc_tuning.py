"""warren.server.memory.tune_memory: big blocks (message bodies, reads) come from malloc's heap
and are reused, instead of being mapped afresh (zeroed pages faulted in) for every message."""

import resource

import pytest

from warren.server.memory import _libc, tune_memory


def page_faults(messages: int) -> int:
    """Minor page faults while 16 MiB bodies pass as through the broker: each comes in reads of
    256 KiB joined into one body, and two bodies are alive at a time."""
    read = bytes(range(256)) * 1024
    in_flight: list[bytes] = []
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(messages):
        reads = [bytes(memoryview(read)) for _ in range(64)]
        in_flight.append(b"".join(reads))
        del reads
        if len(in_flight) > 1:
            in_flight.pop(0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(_libc() is None, reason="glibc 2.33 or later only")
def test_big_bodies_reuse_freed_memory_without_page_faults():
    tune_memory()
    page_faults(8)  # the heap grows to what is in flight
    # With glibc's defaults the bodies' memory is mapped afresh: 12,288 faults for these 20.
    assert page_faults(20) < 1000
