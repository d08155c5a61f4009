"""A quorum queue's leader whose disk stalls (its fsyncs hang, tests/cluster/stalling_fs.py):
it stops renewing its lease, so another member leads and confirms flow again through the other
nodes; it never confirms what it could not write; once its disk is back it follows. Checked
with the total-queue checker: lost 0, unexpected 0, duplicates only of unconfirmed publishes."""

from __future__ import annotations

import os
import time

import pika
import pytest

from .stalling_fs import UNAVAILABLE, StallingDir
from .test_definitions import three  # noqa: F401  (the fixture)
from .test_membership import wait_for
from .total_queue import Publisher, check, leader, read_all

QQ = {"x-queue-type": "quorum"}


@pytest.fixture
def stalling_dir(tmp_path):
    if UNAVAILABLE is not None:
        if os.environ.get("WARREN_REQUIRE_ETCD"):  # (CI installs fuse: this must run there)
            pytest.fail(f"a stalling disk is needed: {UNAVAILABLE}")
        pytest.skip(UNAVAILABLE)
    mount = StallingDir(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    yield mount
    mount.close()


def test_a_leader_whose_disk_stalls_hands_over_and_never_confirms_what_it_lacks(make_node, stalling_dir):
    os.mkdir(os.path.join(stalling_dir.path, "a"))
    a = make_node("warren-a@localhost", data_dir=os.path.join(stalling_dir.path, "a"))
    b = make_node("warren-b@localhost")
    c = make_node("warren-c@localhost")
    connection = pika.BlockingConnection(a.pika_params())
    connection.channel().queue_declare("qq-disk", durable=True, arguments=QQ)
    connection.close()
    wait_for(lambda: leader(c, "qq-disk") == a.name, timeout=20, what="the queue seen everywhere")
    publisher = Publisher([b, c], "qq-disk")
    publisher.start()
    try:
        wait_for(lambda: len(publisher.confirmed) > 50, timeout=30, what="confirms flowing")
        stalling_dir.stall()
        stalled = time.monotonic()
        wait_for(lambda: leader(b, "qq-disk") not in (None, a.name), timeout=30, what="another leader")
        wait_for(lambda: publisher.last_confirm > stalled + 1, timeout=30, what="confirms after the stall")
        handed_over = time.monotonic() - stalled
        assert stalling_dir.ops.stalled_syncs > 0, "the stall was never felt"
        confirmed_during = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) > confirmed_during + 50, timeout=30, what="confirms going on")
        stalling_dir.resume()
        wait_for(lambda: leader(a, "qq-disk") not in (None, a.name), timeout=30, what="a following")
    finally:
        stalling_dir.resume()
        publisher.stop.set()
        publisher.join(30)
    assert "its lease is not renewed" in a.log()
    outcome = check([publisher], read_all(c, "qq-disk"))
    print(f"{outcome}; handed over {handed_over:.1f} s after the stall")
