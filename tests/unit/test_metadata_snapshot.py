"""How a member behind the compacted history plans its way to a snapshot
(warren/cluster/metadata_snapshot.py): what the snapshot lacks is deleted, bindings first and
users last; a changed exchange or queue is deleted and declared again, with its bindings; a
replicated queue of the same incarnation is kept whatever its members; the rest is put over."""

from __future__ import annotations

from warren.broker.metadata import commands as c
from warren.cluster.metadata_snapshot import _plan


def queue(name: str, **more) -> dict:
    return {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "type": "classic", "arguments": {},
            **more}


def exchange(name: str, kind: str = "direct") -> dict:
    return {"name": name, "vhost": "/", "type": kind, "durable": True, "auto_delete": False, "internal": False,
            "arguments": {}}


def binding(source: str, destination: str, key: str = "") -> dict:
    return {"source": source, "vhost": "/", "destination": destination, "destination_type": "queue",
            "routing_key": key, "arguments": {}}


def test_the_plan_deletes_what_went_remakes_what_changed_and_puts_the_rest():
    local = {
        "users": [{"name": "gone", "tags": []}, {"name": "kept", "password_hash": "old", "tags": []}],
        "vhosts": [{"name": "/"}],
        "exchanges": [exchange("x-same"), exchange("x-changed")],
        "queues": [queue("q-same"), queue("q-gone"),
                   queue("qq", type="quorum", members=["a", "b", "c"], incarnation="i1")],
        "bindings": [binding("x-same", "q-same", "k"), binding("x-same", "q-gone"), binding("x-changed", "q-same")],
    }
    snapshot = {
        "users": [{"name": "kept", "password_hash": "new", "tags": []}],
        "vhosts": [{"name": "/"}],
        "exchanges": [exchange("x-same"), exchange("x-changed", "fanout")],
        "queues": [queue("q-same"), queue("q-new"),
                   queue("qq", type="quorum", members=["a", "b"], incarnation="i1")],
        "bindings": [binding("x-same", "q-same", "k"), binding("x-changed", "q-same"), binding("x-same", "q-new")],
    }
    deletes, puts = _plan(local, snapshot)
    assert deletes == [c.Unbind("/", "x-same", "queue", "q-gone", "", {}), c.DeleteQueue("/", "q-gone"),
                       c.DeleteExchange("/", "x-changed"), c.DeleteUser("gone")]
    assert [q["name"] for q in puts["queues"]] == ["q-new"]  # (qq: the same incarnation)
    assert [x["name"] for x in puts["exchanges"]] == ["x-changed"]
    assert [(b["source"], b["destination"]) for b in puts["bindings"]] == [("x-changed", "q-same"), ("x-same", "q-new")]
    assert [u["password_hash"] for u in puts["users"]] == ["new"] and puts["vhosts"] == []
