"""Durable definitions: export/import round trip, what the model marks as changed, and the
crash-safe definitions file."""

import datetime
import json
import logging
import os
import zlib

import pytest

from warren.amqp.codec import decode_table, encode_table
from warren.broker import definitions
from warren.broker.auth import SHA512, User, hash_password
from warren.broker.broker import Broker
from warren.broker.metadata import commands as c
from warren.store import definitions as store_definitions
from warren.store.definitions import JOURNAL, SEQ_KEY, DefinitionsFile, decode_record


def wire(table: dict) -> dict:
    """A table as the broker gets it from a client: decoded from the wire, typed."""
    return decode_table(encode_table(table)[4:])


def populated_broker() -> Broker:
    broker = Broker.with_defaults()
    broker.metadata.apply(c.PutVHost("other", description="second"))
    broker.metadata.apply(c.PutUser(User("alice", hash_password("secret", SHA512), ["monitoring", "management"], SHA512)))
    broker.metadata.apply(c.SetPermissions("alice", "other", "^alice-", "", ".*"))
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
    assert counts == {"vhosts": 2, "users": 2, "permissions": 2, "topic_permissions": 0, "policies": 0, "parameters": 0,
                      "global_parameters": 0, "exchanges": 5, "queues": 3, "bindings": 6}
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
    assert counts == {"vhosts": 2, "users": 2, "permissions": 2, "topic_permissions": 0, "policies": 0, "parameters": 0,
                      "global_parameters": 0, "exchanges": 5, "queues": 3, "bindings": 6}
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
    broker.metadata.disk = RecordingStore()
    broker.metadata.flush()
    broker.metadata.disk.saved.clear()
    return broker


def changed(broker) -> bool:
    dirty = broker.metadata.dirty
    saved = len(broker.metadata.disk.saved)
    broker.metadata.flush()
    assert not broker.metadata.dirty
    assert len(broker.metadata.disk.saved) == saved + (1 if dirty else 0)
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
    assert tracked.metadata.disk.saved == []


def test_durable_changes_mark(tracked):
    v = tracked.vhosts["/"]
    x, created = v.declare_exchange("x", "direct", True)
    assert changed(tracked)
    v.declare_exchange("x", "direct", True)  # redeclare: nothing new
    assert not changed(tracked)
    q, _ = v.declare_queue("q", True)
    assert changed(tracked)
    assert [q["name"] for q in tracked.metadata.disk.saved[-1]["queues"]] == ["q"]
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
    assert tracked.metadata.disk.saved[-1]["bindings"] == []
    assert tracked.metadata.disk.saved[-1]["queues"] == []
    v.delete_exchange("x")
    assert changed(tracked)
    assert tracked.metadata.disk.saved[-1]["exchanges"] == []


def test_auto_delete_exchange_cascade_marks(tracked):
    v = tracked.vhosts["/"]
    src, _ = v.declare_exchange("src", "fanout", True, True)
    q, _ = v.declare_queue("q", True)
    v.bind(src, q, "", {})
    changed(tracked)
    v.delete_queue(q)  # the last binding of the auto-delete exchange goes: so does it
    assert "src" not in v.exchanges
    assert changed(tracked)
    assert tracked.metadata.disk.saved[-1]["exchanges"] == []


def test_users_vhosts_permissions_mark(tracked):
    tracked.metadata.apply(c.PutVHost("v2"))
    assert changed(tracked)
    tracked.metadata.apply(c.PutVHost("v2"))
    assert not changed(tracked)
    tracked.metadata.apply(c.PutUser(User.with_password("bob", "pw")))
    assert changed(tracked)
    tracked.metadata.apply(c.SetPermissions("bob", "v2", ".*", ".*", ".*"))
    assert changed(tracked)
    assert tracked.metadata.apply(c.ClearPermissions("bob", "v2")) and changed(tracked)
    assert not tracked.metadata.apply(c.ClearPermissions("bob", "v2")) and not changed(tracked)
    tracked.metadata.apply(c.SetPermissions("bob", "v2", ".*", ".*", ".*"))
    changed(tracked)
    assert tracked.metadata.apply(c.DeleteUser("bob")) is not None and changed(tracked)
    assert ("bob", "v2") not in tracked.permissions
    tracked.metadata.apply(c.SetPermissions("guest", "v2", ".*", ".*", ".*"))
    changed(tracked)
    assert tracked.metadata.apply(c.DeleteVHost("v2")) is not None and changed(tracked)
    assert ("guest", "v2") not in tracked.permissions
    assert tracked.metadata.apply(c.DeleteVHost("v2")) is None and not changed(tracked)
    saved = tracked.metadata.disk.saved[-1]
    assert [v["name"] for v in saved["vhosts"]] == ["/"]
    assert [u["name"] for u in saved["users"]] == ["guest"]


def test_failed_save_stays_dirty_and_retries(tracked, caplog):
    class Failing(RecordingStore):
        fail = True

        def save(self, data):
            if self.fail:
                raise OSError(28, "No space left on device")
            super().save(data)

    store = tracked.metadata.disk = Failing()
    tracked.vhosts["/"].declare_queue("q", True)
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        tracked.metadata.flush()
        tracked.metadata.flush()
    assert tracked.metadata.dirty
    assert [r.getMessage() for r in caplog.records] == [
        "cannot save definitions to memory: [Errno 28] No space left on device"]
    store.fail = False
    tracked.metadata.flush()
    assert not tracked.metadata.dirty
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


# -- the journal ----------------------------------------------------------------------


class RecordingJournal(RecordingStore):
    def __init__(self):
        super().__init__()
        self.appended = []

    def append(self, records):
        self.appended.append(records)

    def needs_compaction(self):
        return False


def test_flush_appends_one_record_per_changed_object():
    broker = populated_broker()
    store = broker.metadata.disk = RecordingJournal()
    broker.metadata.flush()  # marks made without a store: everything is saved
    assert len(store.saved) == 1 and store.appended == []
    v = broker.vhosts["/"]
    q, _ = v.declare_queue("nq", True, None, False, wire({"x-max-length": 3}))
    v.bind(v.exchange("x"), q, "nk", {})
    broker.metadata.flush()
    assert store.appended[-1] == [
        ("put", "queues", {"name": "nq", "vhost": "/", "durable": True, "auto_delete": False, "type": "classic",
                           "arguments": {"x-max-length": 3}}),
        ("put", "bindings", {"source": "x", "vhost": "/", "destination": "nq", "destination_type": "queue",
                             "routing_key": "nk", "arguments": {}})]
    v.declare_queue("nq", True, None, False, wire({"x-max-length": 3}))  # redeclare: nothing
    broker.metadata.flush()
    assert len(store.appended) == 1
    v.delete_exchange("x")  # its bindings go too, including the one to an exchange
    broker.metadata.flush()
    assert sorted(store.appended[-1], key=lambda r: json.dumps(r)) == sorted([
        ("delete", "exchanges", {"vhost": "/", "name": "x"}),
        ("delete", "bindings", {"source": "x", "vhost": "/", "destination": "q1", "destination_type": "queue",
                                "routing_key": "k1", "arguments": {}}),
        ("delete", "bindings", {"source": "x", "vhost": "/", "destination": "xi", "destination_type": "exchange",
                                "routing_key": "k2", "arguments": {}}),
        ("delete", "bindings", {"source": "x", "vhost": "/", "destination": "nq", "destination_type": "queue",
                                "routing_key": "nk", "arguments": {}})], key=lambda r: json.dumps(r))
    broker.metadata.apply(c.DeleteUser("alice"))
    broker.metadata.flush()
    assert store.appended[-1] == [("delete", "permissions", {"user": "alice", "vhost": "other"}),
                                  ("delete", "users", {"name": "alice"})]
    assert len(store.saved) == 1
    broker.metadata.apply(c.DeleteVHost("other"))  # sweeping: everything is saved again
    broker.metadata.flush()
    assert len(store.saved) == 2 and len(store.appended) == 3


def durable_broker(tmp_path):
    store = DefinitionsFile.in_dir(str(tmp_path))
    assert store.load() is None
    broker = Broker.with_defaults()
    broker.metadata.disk = store
    broker.metadata.flush()  # the first start writes the snapshot
    assert not (tmp_path / JOURNAL).exists()
    return broker, store


def recovered(tmp_path) -> dict:
    """What a restart recovers from the data dir (loaded into a fresh broker and exported)."""
    data = DefinitionsFile.in_dir(str(tmp_path)).load()
    fresh = Broker()
    errors = []
    definitions.load(fresh, data, on_error=lambda *a: errors.append(a))
    assert errors == []
    return definitions.export(fresh)


def journal_lines(tmp_path) -> list:
    return (tmp_path / JOURNAL).read_bytes().splitlines(keepends=True)


def test_journal_append_and_replay(tmp_path):
    broker, store = durable_broker(tmp_path)
    snapshot = (tmp_path / "definitions.json").read_bytes()
    v = broker.vhosts["/"]
    for i in range(20):
        v.declare_queue(f"q{i}", True)
        broker.metadata.flush()
    assert len(journal_lines(tmp_path)) == 20
    x, _ = v.declare_exchange("x", "topic", True, False, False, wire({"alternate-exchange": "ae"}))
    v.bind(x, v.queues["q1"], "a.#", wire({"n": 1}))
    v.bind(x, v.queues["q2"], "b", {})
    broker.metadata.apply(c.PutVHost("v2", description="two"))
    broker.metadata.record("vhost", "v2")
    broker.metadata.apply(c.PutUser(User.with_password("bob", "pw", ["management"])))
    broker.metadata.apply(c.SetPermissions("bob", "v2", "^b", ".*", ""))
    from warren.broker.policy import Policy
    broker.metadata.apply(c.SetPolicy(Policy.validated("/", "p", "^q", {"max-length": 5}, 1, "queues", False)))
    broker.metadata.apply(c.SetPolicy(Policy.validated("/", "op", "^q", {"max-length": 9}, 0, "queues", True), True))
    v.delete_queue(v.queues["q2"])  # with its binding
    broker.metadata.flush()
    # a second change to objects already in the journal: the last record wins
    broker.metadata.apply(c.SetPermissions("bob", "v2", "^bob", ".*", ""))
    v.unbind(x, v.queues["q1"], "a.#", wire({"n": 1}))
    v.bind(x, v.queues["q1"], "a.#", wire({"n": 1}))
    broker.metadata.flush()
    assert (tmp_path / "definitions.json").read_bytes() == snapshot  # nothing rewritten
    assert sorted(os.listdir(tmp_path)) == [JOURNAL, "definitions.json"]
    for line in journal_lines(tmp_path):
        crc, body = line.split(b" ", 1)
        assert int(crc, 16) == zlib.crc32(body.rstrip(b"\n"))
        assert set(json.loads(body)) == {"n", "op", "kind", "obj"}
    assert [decode_record(line)["n"] for line in journal_lines(tmp_path)] == list(range(1, 32))
    assert recovered(tmp_path) == definitions.export(broker)
    # and a broker restarted on that directory goes on appending after the last record
    store2 = DefinitionsFile.in_dir(str(tmp_path))
    assert store2.load() is not None and store2.seq == 31 and store2.journal_lines == 31
    store2.append([("delete", "queues", {"vhost": "/", "name": "q0"})])
    assert decode_record(journal_lines(tmp_path)[-1])["n"] == 32
    assert "q0" not in [q["name"] for q in store2.load()["queues"]]


def test_journal_cost_does_not_grow_with_definitions(tmp_path):
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    for i in range(500):
        v.declare_queue(f"q{i}", True)
    broker.metadata.flush()
    broker.metadata.flush()
    store.save(definitions.export(broker))
    assert not (tmp_path / JOURNAL).read_bytes()
    v.declare_queue("one-more", True)
    broker.metadata.flush()
    lines = journal_lines(tmp_path)
    assert len(lines) == 1 and len(lines[0]) < 200
    assert decode_record(lines[0])["obj"]["name"] == "one-more"


def test_journal_torn_last_line_is_cut_off(tmp_path, caplog):
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    v.declare_queue("a", True)
    broker.metadata.flush()
    v.declare_queue("b", True)
    broker.metadata.flush()
    good = (tmp_path / JOURNAL).read_bytes()
    whole = store_definitions.encode_record(3, "put", "queues", {"name": "c", "vhost": "/"})
    for torn in (whole[:-1], whole[:20], whole[:3]):
        (tmp_path / JOURNAL).write_bytes(good + torn)
        caplog.clear()
        with caplog.at_level(logging.ERROR, "warren.definitions"):
            data = DefinitionsFile.in_dir(str(tmp_path)).load()
        assert [q["name"] for q in data["queues"]] == ["a", "b"]
        assert [r.getMessage() for r in caplog.records] == [
            f"definitions journal {tmp_path / JOURNAL}: bad record at byte {len(good)} "
            f"(torn line (no newline)); dropped the {len(torn)} bytes from there"]
        assert (tmp_path / JOURNAL).read_bytes() == good


def test_journal_corrupt_line_stops_the_replay(tmp_path, caplog):
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    for name in ("a", "b", "c"):
        v.declare_queue(name, True)
        broker.metadata.flush()
    lines = journal_lines(tmp_path)
    bad = lines[1].replace(b'"b"', b'"B"')
    (tmp_path / JOURNAL).write_bytes(lines[0] + bad + lines[2])
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        store2 = DefinitionsFile.in_dir(str(tmp_path))
        data = store2.load()
    assert [q["name"] for q in data["queues"]] == ["a"]
    assert [r.getMessage() for r in caplog.records] == [
        f"definitions journal {tmp_path / JOURNAL}: bad record at byte {len(lines[0])} (checksum mismatch); "
        f"dropped the {len(bad) + len(lines[2])} bytes from there"]
    assert (tmp_path / JOURNAL).read_bytes() == lines[0]
    # a line that is not a record at all, with a good checksum
    body = b'{"n": 9, "op": "rename"}'
    (tmp_path / JOURNAL).write_bytes(lines[0] + b"%08x %s\n" % (zlib.crc32(body), body))
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        assert [q["name"] for q in DefinitionsFile.in_dir(str(tmp_path)).load()["queues"]] == ["a"]
    assert "(not a journal record)" in caplog.records[-1].getMessage()


def test_journal_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(store_definitions, "COMPACT_MIN", 10)
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    for i in range(9):
        v.declare_queue(f"q{i}", True)
        broker.metadata.flush()
    assert len(journal_lines(tmp_path)) == 9
    v.declare_queue("q9", True)
    broker.metadata.flush()  # the 10th line: the snapshot is rewritten, the journal emptied
    assert (tmp_path / JOURNAL).read_bytes() == b""
    with open(tmp_path / "definitions.json") as f:
        snapshot = json.load(f)
    assert snapshot[SEQ_KEY] == 10
    assert [q["name"] for q in snapshot["queues"]] == [f"q{i}" for i in range(10)]
    # now the snapshot has 13 objects: compaction waits for 13 lines
    for i in range(12):
        v.declare_queue(f"r{i}", True)
        broker.metadata.flush()
    assert len(journal_lines(tmp_path)) == 12
    assert decode_record(journal_lines(tmp_path)[0])["n"] == 11
    v.declare_queue("r12", True)
    broker.metadata.flush()
    assert (tmp_path / JOURNAL).read_bytes() == b""
    assert recovered(tmp_path) == definitions.export(broker)


def test_crash_between_snapshot_and_journal_truncation_is_idempotent(tmp_path):
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    broker.metadata.apply(c.PutVHost("gone"))
    broker.metadata.apply(c.SetPermissions("guest", "gone", ".*", ".*", ".*"))
    broker.vhosts["gone"].declare_queue("q", True)
    v.declare_queue("kept", True)
    v.declare_queue("deleted", True)
    broker.metadata.flush()
    v.delete_queue(v.queues["deleted"])
    broker.metadata.flush()
    stale = (tmp_path / JOURNAL).read_bytes()
    assert len(stale.splitlines()) == 6
    # A sweeping change (a vhost deletion) rewrites the snapshot; then the journal is emptied.
    # A crash in between leaves the old lines: replaying them must change nothing.
    broker.metadata.apply(c.DeleteVHost("gone"))
    v.declare_queue("late", True)
    broker.metadata.flush()
    assert (tmp_path / JOURNAL).read_bytes() == b""
    (tmp_path / JOURNAL).write_bytes(stale)
    expected = definitions.export(broker)
    assert recovered(tmp_path) == expected
    assert [q["name"] for q in expected["queues"]] == ["kept", "late"]
    # twice over, and with new records after the stale ones
    store2 = DefinitionsFile.in_dir(str(tmp_path))
    store2.load()
    assert store2.seq == 6
    store2.append([("put", "queues", {"name": "new", "vhost": "/", "durable": True, "auto_delete": False,
                                      "arguments": {}})])
    assert decode_record(journal_lines(tmp_path)[-1])["n"] == 7
    assert [q["name"] for q in recovered(tmp_path)["queues"]] == ["kept", "late", "new"]


def test_failed_append_rewrites_everything_next(tmp_path, monkeypatch, caplog):
    broker, store = durable_broker(tmp_path)
    v = broker.vhosts["/"]
    v.declare_queue("a", True)
    broker.metadata.flush()
    good = (tmp_path / JOURNAL).read_bytes()
    real_fsync = os.fsync

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    v.declare_queue("b", True)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        broker.metadata.flush()
    assert broker.metadata.dirty and broker.metadata.all_changed
    assert (tmp_path / JOURNAL).read_bytes() == good  # the unsynced line was cut off again
    assert caplog.records[-1].getMessage() == (
        f"cannot save definitions to {store.path}: [Errno 5] Input/output error")
    monkeypatch.setattr(os, "fsync", real_fsync)
    broker.metadata.flush()
    assert not broker.metadata.dirty
    assert (tmp_path / JOURNAL).read_bytes() == b""
    assert [q["name"] for q in recovered(tmp_path)["queues"]] == ["a", "b"]


def test_corrupt_snapshot_moves_its_journal_aside(tmp_path, caplog):
    broker, store = durable_broker(tmp_path)
    broker.vhosts["/"].declare_queue("a", True)
    broker.metadata.flush()
    (tmp_path / "definitions.json").write_bytes(b"{\"users\": [")
    with caplog.at_level(logging.ERROR, "warren.definitions"):
        assert DefinitionsFile.in_dir(str(tmp_path)).load() is None
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2
    assert names[0].startswith("definitions.journal.corrupt-") and names[1].startswith("definitions.json.corrupt-")
    assert caplog.records[-1].getMessage() == f"moved the unusable definitions journal to {tmp_path / names[0]}"
