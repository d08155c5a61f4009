"""etcd's history compacted behind a snapshot of the metadata (warren/cluster/metadata_snapshot.py):
the first running member snapshots its tables and compacts etcd once the history passes
warren.metadata_history revisions; a member stopped, killed (-9) or paused meanwhile, and a new
one, catch up from the snapshot (what was deleted is gone, what was made or changed is there)
and follow the log after it."""

from __future__ import annotations

import base64
import json
import signal

import pika
import pytest
import requests

from .test_definitions import AUTH, get, put
from .test_membership import nodes, wait_for

NAMES = [f"warren-{n}@localhost" for n in "abcd"]
HISTORY = "warren.metadata_history = 10"
KINDS = ("users", "vhosts", "permissions", "topic_permissions", "policies", "parameters", "exchanges", "queues",
         "bindings")


def definitions(node) -> dict:
    """What the node's API exports, each kind in a stable order."""
    data = get(node, "/definitions")
    return {kind: sorted(json.dumps(item, sort_keys=True) for item in data.get(kind, ())) for kind in KINDS}


def compacted(endpoint: str, revision: int) -> bool:
    """Whether etcd has compacted its history past `revision`."""
    answer = requests.post(f"http://{endpoint}/v3/kv/range",
                           json={"key": base64.b64encode(b"/").decode(), "revision": str(revision)}, timeout=5)
    return "compacted" in answer.text


def etcd_revision(endpoint: str) -> int:
    answer = requests.post(f"http://{endpoint}/v3/kv/range", json={"key": base64.b64encode(b"/").decode()}, timeout=5)
    return int(answer.json()["header"]["revision"])


def delete(node, path: str) -> int:
    return requests.delete(node.api + path, auth=AUTH, timeout=30).status_code


@pytest.mark.parametrize("fault", ["SIGTERM", "SIGKILL", "SIGSTOP"])
def test_a_member_away_past_the_compacted_history_and_a_new_one_catch_up_from_the_snapshot(
        make_etcd, make_node, fault):
    """c stopped, killed (-9) or paused (SIGSTOP: its watch may have kept the changes, or find
    them compacted when it goes on) while the others change and compact; then a new member."""
    store = make_etcd(1)
    a, b, c = (make_node(name, HISTORY, on=store) for name in NAMES[:3])
    for node in (a, b, c):
        wait_for(lambda: nodes(node) == dict.fromkeys(NAMES[:3], True), timeout=20, what="three running")
    assert put(a, "/users/keeps", {"password": "one", "tags": ""}) == 201
    assert put(a, "/users/goes", {"password": "two", "tags": ""}) == 201
    assert put(a, "/vhosts/kept") == 201
    assert put(a, "/permissions/kept/keeps", {"configure": ".*", "write": ".*", "read": ".*"}) == 201
    assert put(a, "/policies/%2F/ttl", {"pattern": "^ttl", "definition": {"message-ttl": 1000}}) == 201
    ch = pika.BlockingConnection(a.pika_params()).channel()
    for name in ("x-kept", "x-gone", "x-changed"):
        ch.exchange_declare(name, "direct", durable=True)
    for name in ("q-kept", "q-gone"):
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, "x-changed", name)
    ch.queue_declare("qq-kept", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind("q-kept", "x-kept", "k")
    wait_for(lambda: definitions(c) == definitions(a), timeout=20, what="c as a")
    stopped_at = etcd_revision(store.endpoints[0])  # (c's metadata includes no later change)

    c.proc.send_signal(getattr(signal, fault))
    if fault != "SIGSTOP":
        assert c.proc.wait(20) == (0 if fault == "SIGTERM" else -signal.SIGKILL)
    # While c is stopped: deletions, changes and new objects, past the history etcd keeps.
    ch.queue_delete("q-gone")
    ch.exchange_delete("x-gone")
    ch.exchange_delete("x-changed")
    ch.exchange_declare("x-changed", "fanout", durable=True)  # (made again, another type: its bindings went)
    ch.queue_bind("q-kept", "x-changed")
    for n in range(25):
        ch.queue_declare(f"q-new-{n}", durable=True)
    assert delete(a, "/users/goes") == 204
    assert put(a, "/users/keeps", {"password": "changed", "tags": "monitoring"}) == 204
    assert delete(a, "/policies/%2F/ttl") == 204
    assert put(a, "/policies/kept/lazy", {"pattern": ".*", "definition": {"max-length": 5}}) == 201
    wait_for(lambda: compacted(store.endpoints[0], stopped_at), timeout=30,
             what="etcd's history compacted past where c stopped")
    assert "snapshot of the metadata at revision" in a.log()

    if fault == "SIGSTOP":
        c.proc.send_signal(signal.SIGCONT)
    else:
        c = make_node(c.name, HISTORY, on=store, data_dir=c.data_dir, port=c.port, dist_port=c.dist_port)
    d = make_node(NAMES[3], HISTORY, on=store)  # (new: its revision is 0, long compacted)
    for node in (c, d):
        wait_for(lambda: definitions(node) == definitions(a), timeout=30, what=f"{node.name} caught up")
        if node is d or fault != "SIGSTOP":
            assert "caught up from the snapshot of revision" in node.log(), node.log()[-3000:]
    exported = definitions(c)
    assert not any('"q-gone"' in q for q in exported["queues"]) and any('"q-new-24"' in q for q in exported["queues"])
    assert any('"x-changed"' in x and '"fanout"' in x for x in exported["exchanges"])
    assert not [u for u in exported["users"] if '"goes"' in u]
    assert [json.loads(p)["name"] for p in exported["policies"]] == ["lazy"]
    # They follow the log on from the snapshot, and a client's view through them is the cluster's.
    ch.queue_declare("q-after", durable=True)
    for node in (c, d):
        wait_for(lambda: definitions(node) == definitions(a), timeout=20, what=f"{node.name} following the log")
        got = pika.BlockingConnection(node.pika_params())
        assert got.channel().queue_declare("q-kept", passive=True).method.message_count == 0
        got.close()
    with pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=d.port, credentials=pika.PlainCredentials("keeps", "changed"),
            virtual_host="kept")) as connection:
        assert connection.is_open
    for node in (a, b, c, d):
        assert "Traceback" not in node.log(), node.log()[-3000:]
