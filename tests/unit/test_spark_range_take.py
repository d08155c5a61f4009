"""A range read takes record batches' entries a column at a time (_Range.take_entries): what it
takes, skips, notes as gaps and where it stops must be what taking them one by one gives."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy")
pa = pytest.importorskip("pyarrow")
pytest.importorskip("aiormq")
from warren.spark import broker as wb  # noqa: E402
from warren.spark.offsets import StreamRange  # noqa: E402
from warren.spark.records import Entries  # noqa: E402
from warren.spark.wire import ProtocolError  # noqa: E402


def entries(offsets: list[int]) -> Entries:
    n = len(offsets)
    return Entries(np.array(offsets, np.int64), pa.array([b"%d" % o for o in offsets], pa.binary()),
                   np.zeros(n, np.int32), [("x", "k")], np.zeros(n, np.int32), [object()])


def one_by_one(r: StreamRange, offsets: list[int]) -> tuple:
    got: list[int] = []
    range_ = wb._Range(r, lambda body, x, k, stream, offset, redelivered, props: got.append(offset), 0)
    for offset in offsets:
        range_.take(offset, "x", "k", None, b"%d" % offset)
        if range_.done:
            break
    return got, range_.taken, range_.skipped, range_.gaps, range_.done, range_.last


def in_columns(r: StreamRange, chunks: list[list[int]]) -> tuple:
    got: list[int] = []

    def on_entries(e: Entries, stream: str) -> None:
        assert stream == r.stream and e.body.to_pylist() == [b"%d" % o for o in e.offset.tolist()]
        got.extend(e.offset.tolist())
    range_ = wb._Range(r, None, 0, on_entries)
    for chunk in chunks:
        range_.take_entries(entries(chunk))
        if range_.done:
            break
    return got, range_.taken, range_.skipped, range_.gaps, range_.done, range_.last


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=60), st.integers(0, 30), st.integers(0, 40),
       st.integers(0, 5), st.data())
def test_taking_columns_is_taking_entries_one_by_one(steps, first, start, length, data):
    """Offsets that rise with gaps (retention, RabbitMQ's segment rolls), a range that starts
    before, inside or after them and ends anywhere, the entries in chunks of any size."""
    offsets = [first + sum(steps[:i + 1]) for i in range(len(steps))]
    r = StreamRange("s", start, start + length + 1)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(offsets)), max_size=6)))
    chunks = [offsets[a:b] for a, b in zip([0, *cuts], [*cuts, len(offsets)]) if offsets[a:b]]
    assert in_columns(r, chunks) == one_by_one(r, offsets)


def test_offsets_out_of_order_are_refused():
    range_ = wb._Range(StreamRange("s", 0, 10), None, 0, lambda e, s: None)
    with pytest.raises(ProtocolError, match="out of order"):
        range_.take_entries(entries([1, 2, 2, 3]))
    range_ = wb._Range(StreamRange("s", 0, 10), None, 0, lambda e, s: None)
    range_.take_entries(entries([1, 2, 3]))
    with pytest.raises(ProtocolError, match="out of order"):  # (across calls too)
        range_.take_entries(entries([3, 4]))
