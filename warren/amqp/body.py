"""A message body that spans frames: how its parts are collected, and how a big one is kept.

A body that fits one frame of one read is sliced out of that read (its only copy). A bigger
body arrives as parts of several reads. Joining them into one buffer was a pass over memory
that had left the cache: on 16 MiB bodies the broker's CPU was mostly copies, and keeping
the parts instead cut its CPU a GB by a quarter (user time by more than a third;
bench/RESULTS.md, "Big bodies kept in parts"). So a body of SPLIT_MIN octets or more stays
the list of its parts, views of the reads it came in, and goes to sockets (writev) and
segment files (pwritev) as those, as RabbitMQ keeps a body as the list of its frames'
binaries. Code that needs one buffer calls bytes(body): free for a plain bytes body, a join
for a split one.
"""

from __future__ import annotations

from typing import cast

SPLIT_MIN = 256 << 10  # a body this big is kept in parts


class SplitBody:
    """A body kept as the parts it arrived in (bytes or views of reads), `size` octets in all."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | memoryview], size: int):
        self.parts = parts
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Body = bytes | SplitBody


class BodyAssembly:
    """The parts of one body while its frames arrive. A part stays a view of its read unless
    the reads the body keeps alive would then pass twice its size: a body that trickles in
    among other traffic must not hold every read it touched (it copies its parts instead)."""

    __slots__ = ("parts", "size", "held", "last_read")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0
        self.held = 0  # octets of the reads its views keep alive
        self.last_read: object = None

    def add(self, view: memoryview) -> None:
        """Take a part, a view of the read it arrived in."""
        self.size += len(view)
        read = cast(bytes, view.obj)
        if read is not self.last_read:
            if self.held + len(read) > 2 * self.size:
                self.parts.append(bytes(view))
                return
            self.held += len(read)
            self.last_read = read
        self.parts.append(view)

    def body(self) -> Body:
        if self.size >= SPLIT_MIN:
            return SplitBody(self.parts, self.size)
        return b"".join(self.parts)
