"""Offset arithmetic of the stream source, without Spark or a broker: the checkpointed offset
(`{"streams": {name: next_offset}}`, keys sorted so the JSON is stable), where a query starts,
how much a micro-batch takes under its read limit, and how a range is split into partitions.

Every offset here is a *next* offset: a stream's entry means "everything below it is read".
A micro-batch reads [start[name], end[name]) of each stream, so consecutive batches meet
exactly, and a range read twice gives the same entries (a stream's committed offsets never
change: warren.store.stream)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class StreamRange:
    """Offsets [start, end) of one stream: one Spark input partition."""

    stream: str
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def encode(offsets: Mapping[str, int]) -> dict:
    """The source's offset as Spark stores it (a dict; Spark writes it as JSON)."""
    return {"streams": {name: int(offsets[name]) for name in sorted(offsets)}}


def decode(value: Mapping | str) -> dict[str, int]:
    """A checkpointed offset (or a user's startingOffsets JSON) back to {stream: next_offset}."""
    if isinstance(value, str):
        value = json.loads(value)
    streams = value.get("streams") if isinstance(value, Mapping) else None
    if not isinstance(streams, Mapping):
        raise ValueError(f'an offset must look like {{"streams": {{"name": 123}}}}, not {value!r}')
    out = {}
    for name, offset in streams.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset of stream {name!r} must be a whole number >= 0, not {offset!r}")
        out[str(name)] = offset
    return out


def starting(spec: str, streams: list[str], first: Mapping[str, int], next_: Mapping[str, int]) -> dict[str, int]:
    """Where a new query starts: `earliest` (each stream's first offset), `latest` (its next
    offset) or JSON naming some streams (the others start at earliest)."""
    spec = checked("startingOffsets", spec, ("earliest", "latest"), streams)
    if spec == "earliest":
        return {s: first[s] for s in streams}
    if spec == "latest":
        return {s: next_[s] for s in streams}
    given = decode(spec)
    return {s: given.get(s, first[s]) for s in streams}


def checked(option: str, spec: str, words: tuple[str, ...], streams: list[str]) -> str:
    """A startingOffsets or endingOffsets value, checked when the source is made (not when
    the first batch is planned): one of `words`, or JSON naming only streams it reads."""
    spec = spec.strip()
    if spec in words:
        return spec
    try:
        given = decode(spec)
    except json.JSONDecodeError:
        raise ValueError(f"{option} must be {' or '.join(words)} or JSON like "
                         f'{{"streams": {{"name": 123}}}}, not {spec!r}') from None
    unknown = sorted(set(given) - set(streams))
    if unknown:
        raise ValueError(f"{option} names streams the source does not read: {unknown}")
    return spec


def ending(spec: str, streams: list[str], start: Mapping[str, int], next_: Mapping[str, int]) -> dict[str, int]:
    """Where a batch read ends: `latest` (each stream's next offset) or JSON naming some
    streams (the others end at latest, as those startingOffsets leaves out start at
    earliest); never before the start."""
    spec = checked("endingOffsets", spec, ("latest",), streams)
    given = {} if spec == "latest" else decode(spec)
    return {s: max(given.get(s, next_[s]), start[s]) for s in streams}


def admit(start: Mapping[str, int], available: Mapping[str, int], max_records: int | None) -> dict[str, int]:
    """The end offsets of the next micro-batch: everything available, or at most
    `max_records` entries in all, shared out in stream name order (each stream gets what it
    has, up to what is left). A stream never goes back: its end is at least its start."""
    end = {}
    left = max_records
    for name in sorted(start):
        begin = start[name]
        top = max(available.get(name, begin), begin)
        if left is not None:
            top = min(top, begin + left)
            left -= top - begin
        end[name] = top
    return end


def split(start: Mapping[str, int], end: Mapping[str, int], min_partitions: int = 1,
          max_per_partition: int | None = None) -> list[StreamRange]:
    """The input partitions of [start, end): one range per stream at least, cut into pieces of
    at most `max_per_partition` entries, and into at least `min_partitions` pieces in all,
    never an empty piece. The number of pieces is rounded up to a multiple of
    `min_partitions` (when there are entries enough) and a stream's pieces are of equal size
    (within one entry), the biggest pieces cut first: with minPartitions set to the executors'
    cores, every core gets the same work (250,000 entries at most 100,000 a piece on 2 cores:
    4 × 62,500, not 100,000 + 100,000 + 50,000, whose last task leaves a core idle)."""
    ranges = [StreamRange(name, start[name], end[name]) for name in sorted(start) if end[name] > start[name]]
    total = sum(r.count for r in ranges)
    step = max(1, min_partitions)
    cuts = [-(-r.count // max_per_partition) if max_per_partition else 1 for r in ranges]  # pieces per range

    def short() -> bool:
        n = sum(cuts)
        return n < total and (n < step or n % step != 0)

    while short():
        # the range whose pieces are the biggest gets one more (a range never more pieces than entries)
        i = max((i for i, r in enumerate(ranges) if cuts[i] < r.count), key=lambda i: -(-ranges[i].count // cuts[i]))
        cuts[i] += 1
    pieces = []
    for r, n in zip(ranges, cuts):
        size, extra = divmod(r.count, n)
        lo = r.start
        for k in range(n):
            hi = lo + size + (1 if k < extra else 0)
            pieces.append(StreamRange(r.stream, lo, hi))
            lo = hi
    return pieces
