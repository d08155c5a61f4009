"""The queue source's checkpointed offset and message fingerprints, without Spark or a broker
(warren.spark.queue_offsets): stable JSON, a round trip, bad offsets refused, and
fingerprints that see every part a requeue keeps but nothing else."""

import json

import pytest
from hypothesis import given, strategies as st
from pamqp import commands as spec

from warren.spark.queue_offsets import FINGERPRINT, Fingerprints, QueueOffset, decode


def test_the_checkpoint_format_is_stable_json():
    offset = QueueOffset("dlq", 3, (b"\x01" * 8, b"\x02" * 8, b"\x01" * 8))
    text = json.dumps(offset.encode())
    assert text == '{"queue": {"batch": "AQEBAQEBAQECAgICAgICAgEBAQEBAQEB", "name": "dlq", "position": 3}}'
    assert decode(text) == offset
    assert decode(offset.encode()).fingerprints() == {b"\x01" * 8: 2, b"\x02" * 8: 1}
    assert decode(QueueOffset("q", 0).encode()) == QueueOffset("q", 0, ())


@given(st.text(min_size=1), st.integers(0, 1 << 40), st.lists(st.binary(min_size=FINGERPRINT, max_size=FINGERPRINT)))
def test_offsets_round_trip(name, position, batch):
    offset = QueueOffset(name, position, tuple(batch))
    assert decode(json.dumps(offset.encode())) == offset


@pytest.mark.parametrize("bad", ['{"streams": {"a": 1}}', '{"queue": {"name": "q", "position": -1}}',
                                 '{"queue": {"name": "q", "position": "1"}}', '{"queue": {"name": "q"}}',
                                 '{"queue": {"name": "q", "position": 1, "batch": "AQID"}}'])
def test_bad_offsets_are_refused(bad):
    with pytest.raises(ValueError):
        decode(bad)


def test_fingerprints_cover_what_a_requeue_keeps():
    fp = Fingerprints()
    props = spec.Basic.Properties(message_id="1", headers={"x-death": [{"count": 1}]})
    same = spec.Basic.Properties(message_id="1", headers={"x-death": [{"count": 1}]})
    base = fp("ex", "rk", props, b"body")
    assert len(base) == FINGERPRINT
    assert fp("ex", "rk", same, b"body") == base  # another object, the same properties
    assert fp("ex", "rk", props, b"body") == base  # cached by object
    different = {fp("ex2", "rk", props, b"body"), fp("ex", "rk2", props, b"body"), fp("ex", "rk", props, b"bodx"),
                 fp("ex", "rk", spec.Basic.Properties(message_id="2", headers={"x-death": [{"count": 1}]}), b"body"),
                 fp("ex", "rk", spec.Basic.Properties(message_id="1", headers={"x-death": [{"count": 2}]}), b"body"),
                 fp("e", "xrk", props, b"body")}
    assert base not in different and len(different) == 6
