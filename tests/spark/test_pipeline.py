"""`warren pipeline dlq-audit` and `replay` end to end: messages rejected and expired into a
dead-letter stream are audited into a parquet table (the death columns flattened, a summary by
reason and queue), a filtered subset is replayed to the queue it died in, exactly once, and a
second replay publishes nothing again; a dead-letter queue drained into the same table, a
second drain adding nothing; a Delta table written exactly once."""

import argparse
import datetime
import subprocess
import sys

import pika
import pytest

from warren.cli.main import build_parser
from warren.spark import pipeline

from .conftest import bare_env, get_all, require_dead_letters_in_streams, uri, warren_script


def _dead_letters(broker, uid, dlq_type="stream"):
    """work-UID rejects 10 messages and work-ttl-UID expires 5, into dlq-UID (a stream)."""
    if dlq_type == "stream":
        require_dead_letters_in_streams(broker)
    work, expiring, dlq = f"work-{uid}", f"work-ttl-{uid}", f"dlq-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True, arguments={"x-queue-type": dlq_type})
    to_dlq = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    ch.queue_declare(work, arguments=to_dlq)
    ch.queue_declare(expiring, arguments={**to_dlq, "x-message-ttl": 1})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", work, b"job %d" % i, pika.BasicProperties(message_id=str(i), headers={"kind": "job"}))
    for i in range(5):
        ch.basic_publish("", expiring, b"late %d" % i, pika.BasicProperties(message_id=f"t{i}"))
    for _ in range(10):
        method, _props, _body = ch.basic_get(work)
        ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    return work, dlq


def _args(**kw):
    return argparse.Namespace(**{"uri": None, "master": "local[2]", "checkpoint": None, "queue": None,
                                 "stream": None, "input": None, "where": None, "to_exchange": None,
                                 "routing_key": None, "format": "parquet", "batch": 4, **kw})


def _replay_target(broker, name: str) -> str:
    """A fanout exchange and a queue bound to it, both named `name`: where a replay goes."""
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.exchange_declare(name, "fanout")
    ch.queue_declare(name)
    ch.queue_bind(name, name)
    conn.close()
    return name


def _drain(broker, queue):
    return [(body, props.message_id, props.headers) for _m, props, body in get_all(broker, queue)]


def test_audit_then_replay_a_subset_exactly_once(spark, broker, uid, tmp_path, capsys):
    work, dlq = _dead_letters(broker, uid)
    table = str(tmp_path / "audit")
    assert pipeline.dlq_audit(spark, _args(uri=uri(broker), stream=dlq, output=table)) == 0
    out = capsys.readouterr().out
    assert "batch 0: 4 rows" in out  # progress lines, micro-batches of --batch rows
    assert f"rejected\t{work}\t10" in out and f"expired\twork-ttl-{uid}\t5" in out
    rows = {r.message_id: r for r in spark.read.parquet(table).collect()}
    assert len(rows) == 15
    job = rows["3"]
    assert (job.reason, job.queue, job.death_exchange, job.death_routing_keys, job.death_count, job.last_reason) == (
        "rejected", work, "", [work], 1, "rejected")
    assert job.first_death_time is not None and job.body == b"job 3"
    assert rows["t1"].reason == "expired"

    replay = _args(uri=uri(broker), input=table, where="reason = 'rejected' AND CAST(message_id AS INT) < 4")
    assert pipeline.replay(spark, replay) == 0
    assert "replayed 4 dead letters (new checkpoint" in capsys.readouterr().out
    back = _drain(broker, work)
    assert sorted((b, m) for b, m, _ in back) == [(b"job %d" % i, str(i)) for i in range(4)]
    assert all(h == {"kind": "job"} for _, _, h in back)  # the broker's x- headers are not sent again
    assert pipeline.replay(spark, replay) == 0  # a second run: its checkpoint has them all
    assert "replayed 0 dead letters (resumed from checkpoint" in capsys.readouterr().out
    assert _drain(broker, work) == []
    # another selection from the same table has a checkpoint of its own: the rest of the rejected
    pipeline.replay(spark, _args(uri=uri(broker), input=table, where="reason = 'rejected' AND CAST(message_id AS INT) >= 4"))
    assert "replayed 6 dead letters (new checkpoint" in capsys.readouterr().out
    assert sorted(m for _, m, _ in _drain(broker, work)) == [str(i) for i in range(4, 10)]


def test_a_dead_letter_queue_drained_into_the_audit(spark, broker, uid, tmp_path, capsys):
    work, dlq = _dead_letters(broker, uid, "classic")
    table = str(tmp_path / "audit")
    assert pipeline.dlq_audit(spark, _args(uri=uri(broker), queue=dlq, output=table)) == 0
    out = capsys.readouterr().out
    assert "batch 0: 4 rows" in out and f"rejected\t{work}\t10" in out and "15 dead letters in" in out
    assert _drain(broker, dlq) == []
    assert pipeline.dlq_audit(spark, _args(uri=uri(broker), queue=dlq, output=table)) == 0
    assert "15 dead letters in" in capsys.readouterr().out
    rows = spark.read.parquet(table).collect()
    assert sorted(r.message_id for r in rows) == sorted([str(i) for i in range(10)] + [f"t{i}" for i in range(5)])
    assert {r.source for r in rows} == {dlq}


T1 = datetime.datetime(2026, 11, 30, 8, 0, 1, tzinfo=datetime.timezone.utc)
T2 = datetime.datetime(2026, 11, 30, 8, 0, 5, tzinfo=datetime.timezone.utc)
# Messages published to a dead-letter queue directly (a manual republish, a shovel, another
# tool), by message id: their headers, and their (reason, queue, death_exchange,
# death_routing_keys, death_count, last_reason, first_death_time, last_death_time).
NONE = (None,) * 8
NOT_DEAD_LETTERED = {
    "p-plain": (None, NONE),
    "p-headers": ({"kind": "manual"}, NONE),
    "p-string": ({"x-death": "rejected"}, NONE),  # (as a client that turns headers into strings sends it)
    "p-long": ({"x-death": 5}, NONE),
    "p-table": ({"x-death": {"reason": "rejected", "queue": "work"}}, NONE),
    "p-not-tables": ({"x-death": ["rejected", 7]}, NONE),
    "p-empty-table": ({"x-death": [{}]}, (None, None, None, None, 1, None, None, None)),  # (one death, unknown)
    "p-wrong-types": ({"x-death": [{"queue": 5, "reason": ["x"], "exchange": {"a": 1}, "routing-keys": "work",
                                    "count": "3", "time": "yesterday"}]}, (None, None, None, None, 1, None, None, None)),
    # readable, but for counts whose sum is past a long; the oldest death's routing keys empty
    "p-overflow": ({"x-death": [{"count": 1 << 62, "exchange": "x", "queue": "q2", "reason": "rejected",
                                 "routing-keys": ["k"], "time": T2},
                                {"count": 1 << 62, "exchange": "", "queue": "q1", "reason": "expired",
                                 "routing-keys": [], "time": T1}]},
                   ("expired", "q1", "", [], None, "rejected", T1, T2)),
    "p-first-death": ({"x-first-death-reason": "expired", "x-first-death-queue": "old",
                       "x-first-death-exchange": "ex"}, ("expired", "old", "ex", None, None, None, None, None)),
}


@pytest.mark.parametrize("dlq_type", ["classic", "stream"])
def test_messages_that_were_not_dead_lettered_land_with_null_death_columns(spark, broker, uid, tmp_path, capsys,
                                                                          dlq_type):
    """A dead-letter queue (or stream) holding dead letters and messages published to it
    directly, with no x-death or one a client made up: every one lands in the table (those with
    null death columns, or what of their x-death can be read), the queue is drained, and a
    replay of them runs."""
    work, dlq = _dead_letters(broker, uid, dlq_type)
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    for message_id, (headers, _) in NOT_DEAD_LETTERED.items():
        ch.basic_publish("", dlq, message_id.encode(), pika.BasicProperties(message_id=message_id, headers=headers))
    conn.close()
    table = str(tmp_path / "audit")
    args = _args(uri=uri(broker), output=table, **({"queue": dlq} if dlq_type == "classic" else {"stream": dlq}))
    assert pipeline.dlq_audit(spark, args) == 0
    out = capsys.readouterr().out
    assert "25 dead letters in" in out and f"rejected\t{work}\t10" in out and "-\t-\t8" in out
    if dlq_type == "classic":
        assert _drain(broker, dlq) == []  # (each acked once its batch was in the table)
    rows = {r.message_id: r for r in spark.read.parquet(table).collect()}
    assert sorted(rows) == sorted([str(i) for i in range(10)] + [f"t{i}" for i in range(5)] + list(NOT_DEAD_LETTERED))
    death_columns = ("reason", "queue", "death_exchange", "death_routing_keys", "death_count", "last_reason",
                     "first_death_time", "last_death_time")
    for message_id, (_, expected) in NOT_DEAD_LETTERED.items():
        row = rows[message_id]
        got = tuple(row[c] for c in death_columns)
        times = tuple(t if t is None else t.astimezone(datetime.timezone.utc) for t in got[6:])
        assert got[:6] + times == expected, message_id
        assert row.body == message_id.encode()
    job = rows["3"]
    assert tuple(job[c] for c in death_columns[:6]) == ("rejected", work, "", [work], 1, "rejected")

    again = _replay_target(broker, f"again-{uid}")
    assert pipeline.replay(spark, _args(uri=uri(broker), input=table, where="message_id LIKE 'p-%'",
                                        to_exchange=again)) == 0
    assert "replayed 10 dead letters" in capsys.readouterr().out
    assert sorted(m for _, m, _ in _drain(broker, again)) == sorted(NOT_DEAD_LETTERED)


def test_audit_into_a_delta_table_exactly_once(spark, broker, uid, tmp_path, capsys):
    """--format delta (delta-rs, no Delta jar): the table holds each dead letter once, also when
    Spark replays a batch whose Delta commit was made but whose Spark commit was not (a crash
    between the two: here commits/N removed from the checkpoint)."""
    from deltalake import DeltaTable

    work, dlq = _dead_letters(broker, uid)
    table = str(tmp_path / "audit")
    args = _args(uri=uri(broker), stream=dlq, output=table, format="delta")
    assert pipeline.dlq_audit(spark, args) == 0
    out = capsys.readouterr().out
    assert "batch 3: 3 rows" in out and "15 dead letters in" in out and f"rejected\t{work}\t10" in out
    rows = {r["message_id"]: r for r in DeltaTable(table).to_pyarrow_table().to_pylist()}
    assert sorted(rows) == sorted([str(i) for i in range(10)] + [f"t{i}" for i in range(5)])
    job = rows["3"]
    assert (job["reason"], job["queue"], job["death_routing_keys"], job["death_count"], job["body"]) == (
        "rejected", work, [work], 1, b"job 3")
    assert rows["t1"]["reason"] == "expired" and job["first_death_time"] is not None

    commits = tmp_path / "audit.checkpoint" / "commits"
    for name in ("3", ".3.crc"):
        (commits / name).unlink()  # Spark runs batch 3 again at the next start: the table has it
    assert pipeline.dlq_audit(spark, args) == 0
    assert "15 dead letters in" in capsys.readouterr().out
    assert (commits / "3").exists() and DeltaTable(table).to_pyarrow_table().num_rows == 15

    assert pipeline.replay(spark, _args(uri=uri(broker), input=table)) == 2  # refused, said why
    assert "a Delta table has no streaming source" in capsys.readouterr().err

    empty = f"dlq-empty-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(empty, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    assert pipeline.dlq_audit(spark, _args(uri=uri(broker), stream=empty, output=str(tmp_path / "none"),
                                           format="delta")) == 0
    assert "0 dead letters in" in capsys.readouterr().out


def test_the_commands_parse(broker):
    args = build_parser().parse_args(["pipeline", "replay", "--stream", "dlq", "--where", "reason = 'x'"])
    assert (args.command, args.job, args.stream, args.where) == ("pipeline", "replay", "dlq", "reason = 'x'")
    args = build_parser().parse_args(["pipeline", "dlq-audit", "--queue", "dlq", "--output", "x"])
    assert (args.queue, args.stream, args.batch) == ("dlq", None, None)
    for both in (["--queue", "dlq", "--stream", "dlq"], ["--stream"], []):
        done = subprocess.run([sys.executable, "-m", "warren", "pipeline", "dlq-audit", *both, "--output", "x"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "one of --stream NAME, --queue NAME or --queue NAME --stream" in done.stderr


@pytest.mark.timeout(300)  # (a Spark of its own)
def test_dlq_audit_as_one_command(spark, broker, uid, tmp_path):
    """The command itself, in its own Spark (local[2]), draining a dead-letter queue: this
    environment's `warren` run by its path from an environment whose PATH does not hold it (as
    cron or systemd run it), so `python3` on PATH has no warren: Spark's Python processes must
    not be that one."""
    _work, dlq = _dead_letters(broker, uid, "classic")
    table = str(tmp_path / "audit")
    done = subprocess.run([warren_script(), "pipeline", "dlq-audit", "--uri", uri(broker),
                           "--master", "local[2]", "--queue", dlq, "--output", table],
                          env=bare_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "15 dead letters in" in done.stdout and "rejected" in done.stdout


def test_audit_and_replay_over_amqps(spark, uid, tmp_path, capsys):
    """--uri amqps:// with --cacertfile: the dead-letter queue drained and replayed over TLS; the
    broker's certificate is refused without the CA that signed it."""
    from tests.conftest import EXTERNAL
    from tests.tls_certs import start_amqps_broker
    if EXTERNAL:
        pytest.skip("starts its own Warren with a TLS listener")
    broker, port, certs = start_amqps_broker(tmp_path)
    try:
        work, dlq = _dead_letters(broker, uid, "classic")
        tls = f"amqps://guest:guest@localhost:{port}/%2F"
        table = str(tmp_path / "audit")
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            pipeline.dlq_audit(spark, _args(uri=tls, queue=dlq, output=str(tmp_path / "refused")))
        assert pipeline.dlq_audit(spark, _args(uri=tls, queue=dlq, output=table, cacertfile=certs.ca)) == 0
        assert "15 dead letters in" in capsys.readouterr().out
        assert _drain(broker, dlq) == []
        replay = _args(uri=tls, input=table, where="reason = 'rejected'", cacertfile=certs.ca)
        assert pipeline.replay(spark, replay) == 0
        assert sorted(m for _, m, _ in _drain(broker, work)) == sorted(str(i) for i in range(10))
    finally:
        broker.stop()


@pytest.mark.timeout(600)  # (two Sparks of their own)
def test_replay_as_one_command(spark, broker, uid, tmp_path):
    """The commands themselves, each in its own Spark, run as test_dlq_audit_as_one_command runs
    its command (PATH without this environment): a dead-letter stream audited (named as
    `--queue NAME --stream`), the table replayed to another exchange."""
    work, dlq = _dead_letters(broker, uid)
    table = str(tmp_path / "audit")
    done = subprocess.run([warren_script(), "pipeline", "dlq-audit", "--uri", uri(broker),
                           "--master", "local[2]", "--queue", dlq, "--stream", "--output", table],
                          env=bare_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "15 dead letters in" in done.stdout
    again = _replay_target(broker, f"again-{uid}")
    done = subprocess.run([warren_script(), "pipeline", "replay", "--uri", uri(broker),
                           "--master", "local[2]", "--input", table, "--where", "reason = 'expired'",
                           "--to-exchange", again], env=bare_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replayed 5 dead letters (new checkpoint" in done.stdout
    assert sorted(m for _, m, _ in _drain(broker, again)) == [f"t{i}" for i in range(5)]
    assert _drain(broker, work) == []


def test_a_replays_checkpoint_is_named_by_its_selection(tmp_path, capsys):
    """The name is fixed (a change would orphan every replay's checkpoint); a checkpoint of the
    days before selections were named is not taken for any one of them (no Spark needed)."""
    assert pipeline._selection(_args(where="reason = 'expired'")) == "replay-beefa77f17d8cd69"
    assert pipeline._selection(_args()) != pipeline._selection(_args(to_exchange="x"))
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit.replay-checkpoint").mkdir()
    assert pipeline.replay(None, _args(input=str(tmp_path / "audit"))) == 2
    assert "is an earlier replay's checkpoint, for every selection" in capsys.readouterr().err


def test_the_tls_flags_parse():
    args = build_parser().parse_args(["pipeline", "replay", "--stream", "dlq", "--uri", "amqps://h/%2F",
                                      "--cacertfile", "ca.pem", "--certfile", "c.pem", "--keyfile", "k.pem",
                                      "--verify", "verify_none"])
    assert (args.cacertfile, args.certfile, args.keyfile, args.verify) == ("ca.pem", "c.pem", "k.pem", "verify_none")
    done = subprocess.run([sys.executable, "-m", "warren", "pipeline", "replay", "--stream", "dlq",
                           "--verify", "maybe"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'maybe'" in done.stderr
