"""Durable definitions: export/import round trip, what the model marks as changed, and the
crash-safe definitions file."""

import datetime
import json
import logging
import os

import pytest

from warren.amqp.codec import decode_table, encode_table
from warren.broker import definitions
from warren.broker.auth import SHA512, User, hash_password
from warren.broker.broker import Broker
from warren.store.definitions import DefinitionsFile


def wire(table: dict) -> dict:
    """A table as the broker gets it from a client: decoded from the wire, typed."""
    return decode_table(encode_table(table)[4:])


def populated_broker() -> Broker:
    broker = Broker.with_defaults()
    broker.add_vhost("other").description = "second"
    broker.add_user(User("alice", hash_password("secret", SHA512), ["monitoring", "management"], SHA512))
    broker.set_permissions("alice", "other", "^alice-", "", ".*")
    v = broker.vhosts["/"]
    v.declare_exchange("ae", "fanout", True)
    v.declare_exchange("x", "direct", True, False, False, wire({"alternate-exchange": "ae"}))
    v.declare_exchange("xi", "topic", True, False, True)
    v.declare_exchange("xad", "direct", True, True)
    v.declare_exchange("h", "headers", True)
    v.declare_exchange("transient-x", "fanout", False)
    q1, _ = v.declare_queue("q1", True, None, False,
                            wire({"x-max-length": 5, "x-message-ttl": 2**33, "x-queue-mode": "lazy",
                                  "x-custom": [1, "two", {"three": True}]}))
    q2, _ = v.declare_queue("q2", True, None, True)
    tq, _ = v.declare_queue("tq", False)
    eq, _ = v.declare_queue("eq", False, object())
    v.bind(v.exchange("x"), q1, "k1", {})
    v.bind(v.exchange("x"), v.exchange("xi"), "k2", {})
    v.bind(v.exchange("xi"), q2, "#", {})
    v.bind(v.exchange("h"), q1, "", wire({"x-match": "any", "a": 1, "b": b"bin", "c": "s",
                                          "t": datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc)}))
    v.bind(v.exchange("amq.direct"), q2, "from-amq", {})
    v.bind(v.exchange("xad"), q1, "ad", {})
    # not durable on one side: not exported
    v.bind(v.exchange("x"), tq, "t", {})
    v.bind(v.exchange("x"), eq, "e", {})
    v.bind(v.exchange("transient-x"), q1, "", {})
    v.bind(v.exchange("x"), v.exchange("transient-x"), "tx", {})
    broker.vhosts["other"].declare_queue("oq", True)
    return broker


def test_export_contents():
    data = definitions.export(populated_broker())
    assert data["warren_version"]
    assert [(x["vhost"], x["name"]) for x in data["exchanges"]] == [
        ("/", "ae"), ("/", "x"), ("/", "xi"), ("/", "xad"), ("/", "h")]
    x = data["exchanges"][1]
    assert x == {"name": "x", "vhost": "/", "type": "direct", "durable": True, "auto_delete": False,
                 "internal": False, "arguments": {"alternate-exchange": "ae"}}
    assert data["exchanges"][2]["internal"] is True and data["exchanges"][3]["auto_delete"] is True
    assert [(q["vhost"], q["name"]) for q in data["queues"]] == [("/", "q1"), ("/", "q2"), ("other", "oq")]
    assert data["queues"][0]["arguments"] == {"x-max-length": 5, "x-message-ttl": 2**33, "x-queue-mode": "lazy",
                                              "x-custom": [1, "two", {"three": True}]}
    assert data["queues"][1]["auto_delete"] is True
    bindings = {(b["source"], b["destination"], b["destination_type"], b["routing_key"]): b["arguments"]
                for b in data["bindings"]}
    assert bindings == {
        ("x", "q1", "queue", "k1"): {},
        ("x", "xi", "exchange", "k2"): {},
        ("xi", "q2", "queue", "#"): {},
        ("h", "q1", "queue", ""): {"x-match": "any", "a": 1, "b": "bin", "c": "s", "t": 1577923200},
        ("amq.direct", "q2", "queue", "from-amq"): {},
        ("xad", "q1", "queue", "ad"): {},
    }
    users = {u["name"]: u for u in data["users"]}
    assert users["alice"]["hashing_algorithm"] == "rabbit_password_hashing_sha512"
    assert users["alice"]["tags"] == ["monitoring", "management"]
    assert users["guest"]["tags"] == ["administrator"]
    assert users["guest"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert data["vhosts"] == [
        {"name": "/", "limits": [], "metadata": {"description": "Default virtual host", "tags": []}},
        {"name": "other", "limits": [], "metadata": {"description": "second", "tags": []}}]
    assert {(p["user"], p["vhost"], p["configure"], p["write"], p["read"]) for p in data["permissions"]} == {
        ("guest", "/", ".*", ".*", ".*"), ("alice", "other", "^alice-", "", ".*")}
    json.dumps(data)  # plain JSON


def test_export_everything_but_exclusive():
    data = definitions.export(populated_broker(), durable_only=False)
    assert "transient-x" in [x["name"] for x in data["exchanges"]]
    assert [q["name"] for q in data["queues"]] == ["q1", "q2", "tq", "oq"]
    assert ("x", "tq") in [(b["source"], b["destination"]) for b in data["bindings"]]
    assert "eq" not in [b["destination"] for b in data["bindings"]]


def test_export_load_export_is_identical():
    first = definitions.export(populated_broker())
    text = json.dumps(first)
    fresh = Broker()
    counts = definitions.load(fresh, json.loads(text))
    assert counts == {"vhosts": 2, "users": 2, "permissions": 2, "policies": 0, "parameters": 0, "exchanges": 5,
                      "queues": 3, "bindings": 6}
    second = definitions.export(fresh)
    assert second == first
    assert json.dumps(second) == text
    # and the passwords still work
    assert fresh.authenticate("alice", "secret") is not None
    assert fresh.authenticate("guest", "guest") is not None
    assert fresh.authenticate("alice", "wrong") is None


def test_load_keeps_existing_objects():
    """As RabbitMQ's import: what exists already is left alone (no equivalence error)."""
    before = definitions.export(populated_broker())
    broker = Broker()
    definitions.load(broker, before)
    definitions.load(broker, before)
    assert definitions.export(broker) == before
    changed = json.loads(json.dumps(before))
    changed["queues"][0]["arguments"]["x-max-length"] = 99
    changed["exchanges"][1]["type"] = "fanout"
    changed["exchanges"].append({"name": "amq.direct", "vhost": "/", "type": "topic"})
    definitions.load(broker, changed)
    assert definitions.export(broker) == before


def test_load_tolerates_bad_entries_when_asked():
    data = definitions.export(populated_broker())
    data["bindings"].insert(0, {"source": "x", "vhost": "/", "destination": "missing",
                                "destination_type": "queue", "routing_key": "", "arguments": {}})
    data["queues"].insert(0, {"vhost": "/"})
    data["exchanges"].insert(0, {"name": "bad", "vhost": "/", "type": "nosuchtype"})
    data["queues"].append({"name": "badarg", "vhost": "/", "arguments": {"x-max-length": "ten"}})
    errors = []
    fresh = Broker()
    counts = definitions.load(fresh, data, on_error=lambda kind, item, message: errors.append((kind, message)))
    assert counts == {"vhosts": 2, "users": 2, "permissions": 2, "policies": 0, "parameters": 0, "exchanges": 5,
                      "queues": 3, "bindings": 6}
    assert errors == [
        ("exchanges", "unknown exchange type 'nosuchtype' for exchange 'bad'"),
        ("queues", "definition is missing the field 'name'"),
        ("queues", "invalid arg 'x-max-length' for queue 'badarg' in vhost '/': "
                   '"expected integer, got longstr"'),
        ("bindings", "no queue 'missing' in vhost '/'"),
    ]
    with pytest.raises(definitions.DefinitionsError, match="unknown exchange type 'nosuchtype'"):
        definitions.load(Broker(), data)


def test_load_refuses_unknown_hashing_algorithm():
    with pytest.raises(definitions.DefinitionsError) as info:
        definitions.load(Broker(), {"users": [{"name": "u", "password_hash": "x", "hashing_algorithm": "rot13"}]})
    assert str(info.value) == "unsupported hashing algorithm 'rot13' for user 'u'"


# -- what marks the definitions as changed ------------------------------------------------

class RecordingStore:
    path = "memory"

    def __init__(self):
        self.saved = []

    def save(self, data):
        self.saved.append(data)


@pytest.fixture
def tracked():
    broker = Broker.with_defaults()
    broker.definitions_store = RecordingStore()
    broker.flush_definitions()
    broker.definitions_store.saved.clear()
    return broker


def changed(broker) -> bool:
    dirty = broker.definitions_dirty
    saved = len(broker.definitions_store.saved)
    broker.flush_definitions()
    assert not broker.definitions_dirty
    assert len(broker.definitions_store.saved) == saved + (1 if dirty else 0)
    return dirty


def test_transient_changes_do_not_mark(tracked):
    v = tracked.vhosts["/"]
    tx, _ = v.declare_exchange("tx", "direct", False)
    tq, _ = v.declare_queue("tq", False)
    eq, _ = v.declare_queue("eq", False, object())
    v.bind(tx, tq, "k", {})
    v.bind(v.exchange("amq.direct"), eq, "k", {})
    v.unbind(tx, tq, "k", {})
    v.delete_queue(tq)
    v.delete_queue(eq)
    v.delete_exchange("tx")
    assert not changed(tracked)
    assert tracked.definitions_store.saved == []


def test_durable_changes_mark(tracked):
    v = tracked.vhosts["/"]
    x, created = v.declare_exchange("x", "direct", True)
    assert changed(tracked)
    v.declare_exchange("x", "direct", True)  # redeclare: nothing new
    assert not changed(tracked)
    q, _ = v.declare_queue("q", True)
    assert changed(tracked)
    assert [q["name"] for q in tracked.definitions_store.saved[-1]["queues"]] == ["q"]
    v.bind(x, q, "k", {})
    assert changed(tracked)
    v.bind(x, q, "k", {})  # already bound
    assert not changed(tracked)
    v.unbind(x, q, "k", {})
    assert changed(tracked)
    v.unbind(x, q, "k", {})
    assert not changed(tracked)
    v.bind(x, q, "k", {})
    changed(tracked)
    v.delete_queue(q)  # cascades to its bindings
    assert changed(tracked)
    assert tracked.definitions_store.saved[-1]["bindings"] == []
    assert tracked.definitions_store.saved[-1]["queues"] == []
    v.delete_exchange("x")
    assert changed(tracked)
    assert tracked.definitions_store.saved[-1]["exchanges"] == []


def test_auto_delete_exchange_cascade_marks(tracked):
    v = tracked.vhosts["/"]
    src, _ = v.declare_exchange("src", "fanout", True, True)
    q, _ = v.declare_queue("q", True)
    v.bind(src, q, "", {})
    changed(tracked)
    v.delete_queue(q)  # the last binding of the auto-delete exchange goes: so does it
    assert "src" not in v.exchanges
    assert changed(tracked)
    assert tracked.definitions_store.saved[-1]["exchanges"] == []


def test_users_vhosts_permissions_mark(tracked):
    tracked.add_vhost("v2")
    assert changed(tracked)
    tracked.add_vhost("v2")
    assert not changed(tracked)
    tracked.add_user(User.with_password("bob", "pw"))
    assert changed(tracked)
    tracked.set_permissions("bob", "v2", ".*", ".*", ".*")
    assert changed(tracked)
    assert tracked.clear_permissions("bob", "v2") and changed(tracked)
    assert not tracked.clear_permissions("bob", "v2") and not changed(tracked)
    tracked.set_permissions("bob", "v2", ".*", ".*", ".*")
    changed(tracked)
    assert tracked.delete_user("bob") is not None and changed(tracked)
    assert ("bob", "v2") not in tracked.permissions
    tracked.set_permissions("guest", "v2", ".*", ".*", ".*")
    changed(tracked)
    assert tracked.delete_vhost("v2") is not None and changed(tracked)
    assert ("guest", "v2") not in tracked.permissions
    assert tracked.delete_vhost("v2") is None and not changed(tracked)
    saved = tracked.definitions_store.saved[-1]
    assert [v["name"] for v in saved["vhosts"]] == ["/"]
    assert [u["name"] for u in saved["users"]] == ["guest"]


def test_failed_save_stays_dirty_and_retries(tracked, caplog):
    class Failing(RecordingStore):
        fail = True

        def save(self, data):
            if self.fail:
                raise OSError(28, "No space left on device")
            super().save(data)

    store = tracked.definitions_store = Failing()
    tracked.vhosts["/"].declare_queue("q", True)
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        tracked.flush_definitions()
        tracked.flush_definitions()
    assert tracked.definitions_dirty
    assert [r.getMessage() for r in caplog.records] == [
        "cannot save definitions to memory: [Errno 28] No space left on device"]
    store.fail = False
    tracked.flush_definitions()
    assert not tracked.definitions_dirty
    assert [q["name"] for q in store.saved[-1]["queues"]] == ["q"]


# -- the file -------------------------------------------------------------------------

def test_file_missing_is_none(tmp_path):
    assert DefinitionsFile.in_dir(str(tmp_path)).load() is None


def test_file_round_trip_and_no_leftovers(tmp_path):
    store = DefinitionsFile.in_dir(str(tmp_path))
    data = definitions.export(populated_broker())
    store.save(data)
    store.save(data)
    assert os.listdir(tmp_path) == ["definitions.json"]
    assert store.load() == data


@pytest.mark.parametrize("content", [b"", b"{\"users\": [", b"\xff\xfe garbage", b"[1, 2]", b"null"])
def test_file_corrupt_is_moved_aside(tmp_path, caplog, content):
    path = tmp_path / "definitions.json"
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        assert DefinitionsFile(str(path)).load() is None
    names = os.listdir(tmp_path)
    assert len(names) == 1 and names[0].startswith("definitions.json.corrupt-")
    assert (tmp_path / names[0]).read_bytes() == content
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith(f"definitions file {path} is corrupt (")
    assert messages[1] == f"moved the unusable definitions file to {tmp_path / names[0]}"


def test_file_stale_temporaries_removed(tmp_path):
    store = DefinitionsFile.in_dir(str(tmp_path))
    store.save({"users": []})
    (tmp_path / "definitions.json.abc123.tmp").write_bytes(b"{\"half")
    (tmp_path / "unrelated.tmp").write_bytes(b"x")
    assert store.load() == {"users": []}
    assert sorted(os.listdir(tmp_path)) == ["definitions.json", "unrelated.tmp"]


def test_file_failed_save_keeps_old_content(tmp_path, monkeypatch):
    store = DefinitionsFile.in_dir(str(tmp_path))
    store.save({"users": [], "n": 1})
    with pytest.raises(TypeError):
        store.save({"users": [], "bad": object()})

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        store.save({"users": [], "n": 2})
    monkeypatch.undo()
    assert store.load() == {"users": [], "n": 1}
    assert os.listdir(tmp_path) == ["definitions.json"]
