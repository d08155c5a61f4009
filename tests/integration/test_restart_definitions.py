"""Durable definitions survive a restart (clean or SIGKILL right after the -ok); transient
and exclusive ones do not; users, vhosts and permissions stay; a corrupt file is survivable."""

import glob
import json
import os
import re
import signal

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAuthenticationError, UnroutableError

from warren.broker.auth import hash_password
from warren.store.definitions import JOURNAL, SEQ_KEY, decode_record, replay

SIGNALS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]
# (characters a base64 password hash cannot hold: the hash never contains it by chance, as "pw" once did)
BOB_PASSWORD = "clear-text password!"


def saved_definitions(data_dir: str) -> dict:
    """What is durable in the data dir: the snapshot (definitions.json, RabbitMQ's format) with
    the journal's newer records applied, read without touching the files."""
    with open(os.path.join(data_dir, "definitions.json")) as f:
        data = json.load(f)
    seq = data.pop(SEQ_KEY)
    records = []
    if os.path.exists(os.path.join(data_dir, JOURNAL)):
        with open(os.path.join(data_dir, JOURNAL), "rb") as f:
            records = [r for r in map(decode_record, f) if r["n"] > seq]
    return replay(data, records)


def connect(b, **kwargs):
    return pika.BlockingConnection(b.pika_params(**kwargs))


def expect_channel_error(conn, action, code, text):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        action(ch)
    assert (info.value.reply_code, info.value.reply_text) == (code, text)


def declare_topology(ch, u):
    ch.exchange_declare(f"ae-{u}", "fanout", durable=True)
    ch.exchange_declare(f"x-{u}", "direct", durable=True, arguments={"alternate-exchange": f"ae-{u}"})
    ch.exchange_declare(f"xi-{u}", "topic", durable=True, internal=True)
    ch.exchange_declare(f"h-{u}", "headers", durable=True)
    ch.exchange_declare(f"xad-{u}", "direct", durable=True, auto_delete=True)
    ch.queue_declare(f"q1-{u}", durable=True, arguments={"x-max-length": 10, "x-message-ttl": 60000})
    ch.queue_declare(f"q2-{u}", durable=True, auto_delete=True)
    ch.queue_declare(f"qae-{u}", durable=True)
    ch.queue_declare(f"qh-{u}", durable=True)
    ch.queue_bind(f"q1-{u}", f"x-{u}", "k1")
    ch.exchange_bind(f"xi-{u}", f"x-{u}", "a.b")  # destination, source
    ch.queue_bind(f"q2-{u}", f"xi-{u}", "a.#")
    ch.queue_bind(f"qae-{u}", f"ae-{u}", "")
    ch.queue_bind(f"qh-{u}", f"h-{u}", "", arguments={"x-match": "all", "kind": "a", "n": 1})
    ch.queue_bind(f"q1-{u}", f"xad-{u}", "ad")
    # transient and exclusive: gone after a restart
    ch.exchange_declare(f"tx-{u}", "fanout", durable=False)
    ch.queue_declare(f"tq-{u}", durable=False)
    ch.queue_declare(f"eq-{u}", durable=True, exclusive=True)
    ch.queue_bind(f"tq-{u}", f"x-{u}", "t")
    ch.queue_bind(f"q1-{u}", f"tx-{u}", "")
    # created and removed again: stay removed
    ch.queue_declare(f"dq-{u}", durable=True)
    ch.queue_bind(f"dq-{u}", f"x-{u}", "dq")
    ch.queue_delete(f"dq-{u}")
    ch.exchange_declare(f"dx-{u}", "direct", durable=True)
    ch.queue_bind(f"q1-{u}", f"dx-{u}", "dx")
    ch.exchange_delete(f"dx-{u}")
    ch.queue_bind(f"q1-{u}", f"x-{u}", "gone")
    ch.queue_unbind(f"q1-{u}", f"x-{u}", "gone")
    # the last thing before the kill
    ch.queue_declare(f"last-{u}", durable=True)
    ch.queue_bind(f"last-{u}", f"x-{u}", "last")


def get_body(ch, queue):
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    return body if method is not None else None


@pytest.mark.parametrize("sig", SIGNALS)
def test_durable_definitions_survive_restart(make_broker, restart_broker, uid, sig):
    u = uid
    b = make_broker()
    conn = connect(b)
    declare_topology(conn.channel(), u)
    b = restart_broker(b, sig=sig)  # the connection (and its exclusive queue) is still open at a kill
    conn = connect(b)
    ch = conn.channel()

    # durable objects are back, with their flags and arguments
    ch.exchange_declare(f"x-{u}", "direct", durable=True, arguments={"alternate-exchange": f"ae-{u}"})
    ch.exchange_declare(f"xi-{u}", "topic", durable=True, internal=True)
    ch.exchange_declare(f"xad-{u}", "direct", durable=True, auto_delete=True)
    ch.exchange_declare(f"h-{u}", "headers", durable=True)
    ch.queue_declare(f"q1-{u}", durable=True, arguments={"x-max-length": 10, "x-message-ttl": 60000})
    ch.queue_declare(f"q2-{u}", durable=True, auto_delete=True)
    for q in (f"qae-{u}", f"qh-{u}", f"last-{u}"):
        ch.queue_declare(q, passive=True)
    pre = "PRECONDITION_FAILED - inequivalent arg"
    expect_channel_error(conn, lambda c: c.exchange_declare(f"x-{u}", "fanout", durable=True), 406,
                         f"{pre} 'type' for exchange 'x-{u}' in vhost '/': received 'fanout' but current is 'direct'")
    expect_channel_error(conn, lambda c: c.exchange_declare(f"x-{u}", "direct", durable=True), 406,
                         f"{pre} 'alternate-exchange' for exchange 'x-{u}' in vhost '/': received none but "
                         f"current is the value 'ae-{u}' of type 'longstr'")
    expect_channel_error(conn, lambda c: c.exchange_declare(f"xi-{u}", "topic", durable=True), 406,
                         f"{pre} 'internal' for exchange 'xi-{u}' in vhost '/': received 'false' but current is 'true'")
    expect_channel_error(conn, lambda c: c.exchange_declare(f"xad-{u}", "direct", durable=True), 406,
                         f"{pre} 'auto_delete' for exchange 'xad-{u}' in vhost '/': received 'false' but current "
                         "is 'true'")
    expect_channel_error(conn, lambda c: c.exchange_declare(f"h-{u}", "headers", durable=False), 406,
                         f"{pre} 'durable' for exchange 'h-{u}' in vhost '/': received 'false' but current is 'true'")
    expect_channel_error(conn, lambda c: c.queue_declare(f"q1-{u}", durable=True, arguments={"x-max-length": 11,
                                                                                          "x-message-ttl": 60000}),
                         406, f"{pre} 'x-max-length' for queue 'q1-{u}' in vhost '/': received '11' but current is '10'")
    expect_channel_error(conn, lambda c: c.queue_declare(f"q2-{u}", durable=True), 406,
                         f"{pre} 'auto_delete' for queue 'q2-{u}' in vhost '/': received 'false' but current is 'true'")

    # transient, exclusive and deleted objects are not
    for kind, name in (("exchange", f"tx-{u}"), ("exchange", f"dx-{u}")):
        expect_channel_error(conn, lambda c: c.exchange_declare(name, passive=True), 404,
                             f"NOT_FOUND - no {kind} '{name}' in vhost '/'")
    for name in (f"tq-{u}", f"eq-{u}", f"dq-{u}"):
        expect_channel_error(conn, lambda c: c.queue_declare(name, passive=True), 404,
                             f"NOT_FOUND - no queue '{name}' in vhost '/'")
    expect_channel_error(conn, lambda c: (c.basic_publish(f"xi-{u}", "a.b", b"no"), c.queue_declare("", exclusive=True)),
                         403, f"ACCESS_REFUSED - cannot publish to internal exchange 'xi-{u}' in vhost '/'")

    # and the bindings route as before
    ch = conn.channel()
    ch.confirm_delivery()
    for exchange, key, body, headers in ((f"x-{u}", "k1", b"direct", None), (f"x-{u}", "a.b", b"e2e", None),
                                         (f"x-{u}", "nomatch", b"to-ae", None), (f"h-{u}", "", b"headers",
                                                                                  {"kind": "a", "n": 1}),
                                         (f"h-{u}", "", b"headers-no", {"kind": "a"}),
                                         (f"xad-{u}", "ad", b"ad", None), (f"x-{u}", "last", b"last", None),
                                         (f"x-{u}", "gone", b"unbound", None), (f"x-{u}", "dq", b"deleted", None),
                                         (f"x-{u}", "t", b"transient", None)):
        ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers))
    assert [get_body(ch, f"q1-{u}") for _ in range(3)] == [b"direct", b"ad", None]
    assert [get_body(ch, f"q2-{u}") for _ in range(2)] == [b"e2e", None]
    assert [get_body(ch, f"qh-{u}") for _ in range(2)] == [b"headers", None]
    assert [get_body(ch, f"last-{u}") for _ in range(2)] == [b"last", None]
    # no binding for these any more: the alternate exchange gets them
    assert [get_body(ch, f"qae-{u}") for _ in range(5)] == [b"to-ae", b"unbound", b"deleted", b"transient", None]
    # the deleted exchange's binding did not come back with a new exchange of that name
    ch.exchange_declare(f"dx-{u}", "direct", durable=True)
    with pytest.raises(UnroutableError):
        ch.basic_publish(f"dx-{u}", "dx", b"x", mandatory=True)
    conn.close()

    # what was saved is exactly the durable topology
    saved = saved_definitions(b.data_dir)
    assert sorted(x["name"] for x in saved["exchanges"]) == sorted(
        f"{n}-{u}" for n in ("ae", "x", "xi", "h", "xad", "dx"))
    assert sorted(q["name"] for q in saved["queues"]) == sorted(
        f"{n}-{u}" for n in ("q1", "q2", "qae", "qh", "last"))
    assert {(x["name"], x["type"], x["durable"], x["auto_delete"], x["internal"], json.dumps(x["arguments"]))
            for x in saved["exchanges"] if x["name"] in (f"x-{u}", f"xi-{u}")} == {
        (f"x-{u}", "direct", True, False, False, json.dumps({"alternate-exchange": f"ae-{u}"})),
        (f"xi-{u}", "topic", True, False, True, "{}")}
    assert {(b["source"], b["destination"], b["destination_type"], b["routing_key"], json.dumps(b["arguments"]))
            for b in saved["bindings"]} == {
        (f"x-{u}", f"q1-{u}", "queue", "k1", "{}"), (f"x-{u}", f"xi-{u}", "exchange", "a.b", "{}"),
        (f"xi-{u}", f"q2-{u}", "queue", "a.#", "{}"), (f"ae-{u}", f"qae-{u}", "queue", "", "{}"),
        (f"h-{u}", f"qh-{u}", "queue", "", json.dumps({"x-match": "all", "kind": "a", "n": 1})),
        (f"xad-{u}", f"q1-{u}", "queue", "ad", "{}"), (f"x-{u}", f"last-{u}", "queue", "last", "{}")}
    # how long recovery took, as bench/definitions.py reads it
    took = re.search(r"recovered definitions from \S+ in (\d+\.\d\d) s: ", b.log())
    assert took is not None and 0 <= float(took.group(1)) < 30, b.log()[-2000:]


def test_deletions_survive_sigkill(make_broker, restart_broker, uid):
    """A delete-ok (or the cancel-ok that auto-deletes a queue) means the deletion is on disk."""
    b = make_broker()
    conn = connect(b)
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "direct", durable=True)
    ch.queue_declare(f"q-{uid}", durable=True)
    ch.queue_declare(f"ad-{uid}", durable=True, auto_delete=True)
    ch.queue_bind(f"q-{uid}", f"x-{uid}", "k")
    b = restart_broker(b, sig=signal.SIGKILL)
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", passive=True)
    tag = ch.basic_consume(f"ad-{uid}", lambda *a: None)
    ch.basic_cancel(tag)  # the last consumer goes: the auto-delete queue with it
    ch.queue_delete(f"q-{uid}")
    b = restart_broker(b, sig=signal.SIGKILL)
    conn = connect(b)
    for name in (f"q-{uid}", f"ad-{uid}"):
        expect_channel_error(conn, lambda c: c.queue_declare(name, passive=True), 404,
                             f"NOT_FOUND - no queue '{name}' in vhost '/'")
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", passive=True)
    ch.exchange_delete(f"x-{uid}")
    b = restart_broker(b, sig=signal.SIGKILL)
    conn = connect(b)
    expect_channel_error(conn, lambda c: c.exchange_declare(f"x-{uid}", passive=True), 404,
                         f"NOT_FOUND - no exchange 'x-{uid}' in vhost '/'")
    conn.close()


def test_users_vhosts_permissions_survive_restart(make_broker, restart_broker, uid, tmp_path):
    vhost = f"v-{uid}"
    defs = {
        "vhosts": [{"name": vhost}],
        "users": [{"name": f"alice-{uid}", "password_hash": hash_password("s3cret"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"]},
                  {"name": f"bob-{uid}", "password": BOB_PASSWORD, "tags": "monitoring,policymaker"}],
        "permissions": [{"user": f"alice-{uid}", "vhost": vhost, "configure": "^alice-", "write": ".*",
                         "read": ".*"}],
        "queues": [{"name": f"defq-{uid}", "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": {"x-max-priority": 5}}],
    }
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    b = make_broker("--definitions", str(path))
    assert "imported definitions from" in b.log()
    b = restart_broker(b, sig=signal.SIGKILL)  # without --definitions now
    assert "recovered definitions from" in b.log()
    assert "created the default user" not in b.log()

    alice = pika.PlainCredentials(f"alice-{uid}", "s3cret")
    conn = connect(b, credentials=alice, virtual_host=vhost)
    ch = conn.channel()
    ch.queue_declare(f"alice-{uid}", durable=True)
    ch.queue_declare(f"defq-{uid}", passive=True)
    expect_channel_error(conn, lambda c: c.queue_declare(f"other-{uid}"), 403,
                         f"ACCESS_REFUSED - configure access to queue 'other-{uid}' in vhost '{vhost}' "
                         f"refused for user 'alice-{uid}'")
    conn.close()
    with pytest.raises(ProbableAuthenticationError):
        connect(b, credentials=pika.PlainCredentials(f"alice-{uid}", "wrong"), virtual_host=vhost)
    # guest was created on the first start and is still there
    connect(b).close()

    b = restart_broker(b)
    conn = connect(b, credentials=alice, virtual_host=vhost)
    conn.channel().queue_declare(f"alice-{uid}", passive=True)
    conn.close()
    saved = saved_definitions(b.data_dir)
    users = {u["name"]: u for u in saved["users"]}
    assert set(users) == {"guest", f"alice-{uid}", f"bob-{uid}"}
    assert users[f"alice-{uid}"]["password_hash"] == defs["users"][0]["password_hash"]
    assert users[f"alice-{uid}"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert users[f"alice-{uid}"]["tags"] == ["management"]
    assert users[f"bob-{uid}"]["tags"] == ["monitoring", "policymaker"]
    assert users[f"bob-{uid}"]["password_hash"]  # stored hashed, never in clear
    assert BOB_PASSWORD not in json.dumps(users[f"bob-{uid}"])
    assert [v["name"] for v in saved["vhosts"]] == ["/", vhost]
    assert [(q["name"], q["vhost"], q["arguments"]) for q in saved["queues"]] == [
        (f"defq-{uid}", vhost, {"x-max-priority": 5}), (f"alice-{uid}", vhost, {})]
    assert {(p["user"], p["vhost"], p["configure"], p["write"], p["read"]) for p in saved["permissions"]} == {
        ("guest", "/", ".*", ".*", ".*"), (f"alice-{uid}", vhost, "^alice-", ".*", ".*")}


def test_corrupt_definitions_file_does_not_stop_the_broker(make_broker, restart_broker, uid):
    b = make_broker()
    conn = connect(b)
    conn.channel().queue_declare(f"q-{uid}", durable=True)
    conn.close()
    b.stop()
    path = os.path.join(b.data_dir, "definitions.json")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)  # a torn file
    b = make_broker(data_dir=b.data_dir)
    log = b.log()
    assert f"[error] <warren.definitions> definitions file {path} is corrupt (" in log
    aside = glob.glob(path + ".corrupt-*")
    assert len(aside) == 1
    assert f"moved the unusable definitions file to {aside[0]}" in log
    # it started as on a first boot: guest works, and new definitions are saved again
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(f"new-{uid}", durable=True)
    conn.close()
    assert [q["name"] for q in saved_definitions(b.data_dir)["queues"]] == [f"new-{uid}"]


def test_definitions_flag_on_every_start_keeps_existing_objects(make_broker, restart_broker, uid, tmp_path):
    """--definitions applied on top of the recovered state: what exists is kept as it is (as
    RabbitMQ's import does), what is new is added, and the broker starts either way."""
    path = tmp_path / "defs.json"
    queue = {"name": f"q-{uid}", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-max-priority": 5}}
    path.write_text(json.dumps({"queues": [queue]}))
    b = make_broker("--definitions", str(path))
    queue["arguments"]["x-max-priority"] = 7
    path.write_text(json.dumps({"queues": [queue, dict(queue, name=f"new-{uid}")]}))
    b = restart_broker(b, "--definitions", str(path), sig=signal.SIGKILL)
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", durable=True, arguments={"x-max-priority": 5})
    ch.queue_declare(f"new-{uid}", durable=True, arguments={"x-max-priority": 7})
    conn.close()
    b = restart_broker(b)
    conn = connect(b)
    conn.channel().queue_declare(f"new-{uid}", durable=True, arguments={"x-max-priority": 7})
    conn.close()
