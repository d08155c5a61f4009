"""The sink's frames made a column at a time (warren.spark.wire.joined_frames) are the frames
Publisher.publish() makes one message at a time, byte for byte, for any bodies, message id
prefix, first row number and properties; the sink takes that path only for batches of bodies
alone that each fit one body frame."""

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from warren.spark import wire  # noqa: E402
from warren.spark.sink import _bodies_only, _pieces  # noqa: E402


class Buffered(wire.Publisher):
    """publish() into its send buffer only (no socket: what it would send is what is compared)."""

    def __init__(self):
        self.out, self._methods, self._body_max = bytearray(), {}, wire.FRAME_MAX - 8
        self.published = self.settled = 0
        self.acked_above: set[int] = set()
        self.window = 1 << 30

    def flush(self):
        raise AssertionError("kept in the buffer")


PROPERTIES = st.fixed_dictionaries({}, optional={
    "content_type": st.text(max_size=20), "delivery_mode": st.sampled_from([1, 2]),
    "headers": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    "app_id": st.text(max_size=10)})


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=40), prefix=st.binary(max_size=60),
       first=st.integers(0, 10**12), properties=PROPERTIES, exchange=st.text(max_size=10),
       key=st.text(max_size=10), mandatory=st.booleans())
def test_joined_frames_are_publishs_frames(bodies, prefix, first, properties, exchange, key, mandatory):
    before, after = wire.property_template(properties)
    one_by_one = Buffered()
    for i, body in enumerate(bodies):
        mid = prefix + b"%d" % (first + i)
        one_by_one.publish(exchange, key, body, before + bytes((len(mid),)) + mid + after, mandatory)
    method = one_by_one.method(exchange, key, mandatory)
    frames = wire.joined_frames(method, before, after, prefix, first, pa.array(bodies, pa.binary()))
    assert len(frames) == len(bodies)
    assert b"".join(frames.to_pylist()) == bytes(one_by_one.out)


def test_ids_longer_than_a_short_string_are_refused():
    method = Buffered().method("", "q", False)
    with pytest.raises(ValueError, match="longer than 255 octets"):
        wire.joined_frames(method, *wire.property_template({}), b"p" * 250, 999_999, pa.array([b"x"], pa.binary()))


def test_only_batches_of_bodies_alone_take_the_column_path():
    def batch(**columns):
        return pa.RecordBatch.from_pydict(columns)

    assert _bodies_only(batch(body=pa.array([b"a", b"bc"])), 10).to_pylist() == [b"a", b"bc"]
    assert _bodies_only(batch(body=pa.array(["a", "é"], pa.large_string())), 10).to_pylist() == ["a", "é"]
    assert _bodies_only(batch(body=pa.array([b"a"]), extra=pa.array([1])), 10) is not None  # (not the sink's)
    assert _bodies_only(batch(body=pa.array([b"a"]), routing_key=pa.array(["k"])), 10) is None
    assert _bodies_only(batch(body=pa.array([b"a"]), message_id=pa.array(["m"])), 10) is None
    assert _bodies_only(batch(body=pa.array([b"a", None])), 10) is None  # (null: an empty body, no body frame)
    assert _bodies_only(batch(body=pa.array([b"a", b""])), 10) is None
    assert _bodies_only(batch(body=pa.array([b"a" * 11])), 10) is None  # (more than one body frame)
    assert _bodies_only(batch(body=pa.array([1, 2])), 10) is None
    assert _bodies_only(batch(body=pa.array([], pa.binary())), 10) is None


def test_bodies_are_joined_a_bounded_piece_at_a_time():
    bodies = pa.array(["x" * n for n in (5, 5, 5, 20, 1, 1, 1)], pa.large_string())
    pieces = list(_pieces(bodies, 10))
    assert [p.type for p in pieces] == [pa.binary()] * 4
    assert [[len(b) for b in p.to_pylist()] for p in pieces] == [[5, 5], [5], [20], [1, 1, 1]]
    assert [len(p) for p in _pieces(bodies, 1 << 20)] == [7]
