"""Kill tests of the `warren` Spark format (issue 13): the Spark driver SIGKILLed after a
micro-batch's offsets/N is written and before its commits/N, then restarted from the
checkpoint; an AMQP connection closed by the broker in the middle of a task.

The Spark jobs run in processes of their own (tests/spark/killable_query.py, each its own
local[2,4] session), started in a new session: os.killpg kills the driver and its JVM at
once, and the rest of the session (pyspark.daemon gives the Python workers process groups
of their own) goes right after. The job is stopped (SIGSTOP) before the checkpoint is looked
at a last time, so the kill lands between offsets/N and commits/N for certain. No process of
a job outlives its test, failed or not.

- stream -> parquet, JSON files -> writeStream.format("warren") into a queue, and a queue
  (queue mode) -> parquet, the three queries in one job, killed twice (at different
  batches; messages and files added between the runs), then a Trigger.AvailableNow run to
  the end: the stream's table (read through the file sink's _spark_metadata: a killed run
  leaves files it never committed) holds each published message exactly once; the queue
  holds every row, those of a batch published before the kill twice (at least once:
  reported, not asserted); the queue's table holds every message of the drained queue, any
  duplicate `redelivered` and at most a batch of them a kill.
- the broker closes a range reader's connection during a batch read, then a publisher's
  during a batch write (management API, DELETE /api/connections/NAME): the task fails, Spark
  runs it again, and the read gives exactly the stream, the queue every row.

About three minutes on two busy cores, most of it Spark starting: five sessions, each
10-25 s to start and 10-15 s more for its first batch."""

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

import pika
import pytest

from .conftest import require_spark, uri

HELPER = Path(__file__).with_name("killable_query.py")
ROOT = Path(__file__).resolve().parents[2]
READER = "warren.spark stream reader"  # the connection_name of a range read (warren.spark.wire)
BATCH = 200  # maxRecordsPerTrigger of the stream -> parquet query
ROWS_A_FILE = 200  # the JSON -> queue query's micro-batch (maxFilesPerTrigger 1)


@pytest.fixture
def need_spark():
    require_spark()


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of a session."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


class Job:
    """killable_query.py in a new session: its pid is the session's and its process group's
    id. The JVM is in its group; pyspark.daemon puts the Python workers in groups of their
    own, in the same session."""

    def __init__(self, args: list[str], log_path: Path):
        self.log_path = log_path
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(HELPER), *args], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                         start_new_session=True)
        self.pgid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Signal the group (the driver and its JVM at once), then the rest of the session."""
        for pid in (-self.pgid, *_session(self.pgid)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the session, until nothing of it is left."""
        self.signal(signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 20
        while _session(self.pgid) and time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job did not end within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def kill_all(jobs: list[Job]) -> dict[int, list[int]]:
    """SIGKILL every job's session; what is left of each (nothing, normally)."""
    left = {}
    for job in jobs:
        job.kill()
        if _session(job.pgid):
            left[job.pgid] = _session(job.pgid)
    return left


@pytest.fixture
def jobs(tmp_path, need_spark):
    """jobs(*args) starts killable_query.py; every job's session is SIGKILLed after the test
    (pass or fail), which fails if a process of one is still there."""
    started: list[Job] = []

    def start(*args) -> Job:
        job = Job([str(a) for a in args], tmp_path / f"job{len(started)}.log")
        started.append(job)
        return job

    yield start
    left = kill_all(started)
    assert not left, f"processes outlived their test: {left}"


def _batches(directory: Path) -> set[int]:
    try:
        return {int(n) for n in os.listdir(directory) if n.isdigit()}
    except FileNotFoundError:
        return set()


@dataclass
class Window:
    """Where a query is to be killed: in batch `at_least` or a later one, once its offsets/N
    has been there `late` seconds (0: as soon as the batch is planned, before it has read or
    written anything) and `when(N)` holds, and before its commits/N."""

    at_least: int
    late: float = 0.0
    when: Callable[[int], bool] | None = None


def kill_in_window(job: Job, windows: dict[Path, Window], timeout: float = 150) -> dict:
    """SIGKILL the job once every checkpoint of `windows` is in its window. The job is
    stopped (SIGSTOP) and the checkpoints looked at again before the kill, so it lands inside
    every window for certain (else the job goes on, to later batches). Returns where each
    query was at the kill."""
    since: dict[Path, tuple[int, float]] = {}  # checkpoint -> (its open batch, seen open since)

    def open_batches() -> dict[Path, int]:
        found = {}
        for checkpoint in windows:
            pending = max(_batches(checkpoint / "offsets"), default=-1)
            if pending >= 0 and pending not in _batches(checkpoint / "commits"):
                found[checkpoint] = pending
        return found

    def inside(found: dict[Path, int], now: float) -> bool:
        return all(cp in found and found[cp] >= w.at_least and since.get(cp, (None,))[0] == found[cp]
                   and now - since[cp][1] >= w.late and (w.when is None or w.when(found[cp]))
                   for cp, w in windows.items())

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not job.alive():
            pytest.fail(f"the job ended (exit {job.proc.returncode}) before its windows {windows}:\n{job.tail()}")
        now = time.monotonic()
        found = open_batches()
        for cp, batch in found.items():
            if since.get(cp, (None,))[0] != batch:
                since[cp] = (batch, now)
        if inside(found, now):
            job.signal(signal.SIGSTOP)
            time.sleep(0.1)
            if inside(open_batches(), now):
                job.kill()
                held: dict = {"seconds": round(time.monotonic() - started, 1)}
                for cp in windows:
                    held[cp.name] = {"killed_in": found[cp], "open_for": round(now - since[cp][1], 2),
                                     "commits": sorted(_batches(cp / "commits"))[-1:]}
                return held
            job.signal(signal.SIGCONT)
        time.sleep(0.02)
    job.kill()
    pytest.fail(f"not in the windows {windows} within {timeout:.0f} s:\n{job.tail()}")


def _channel(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    return conn, conn.channel()


def publish_to_stream(broker, name: str, numbers: range, declare: bool = False, pad: int = 0) -> None:
    """Publish message i (message_id str(i), body m<i> and `pad` octets more) for each i;
    unconfirmed but the last (the broker takes a channel's publishes in order: its confirm
    covers them all)."""
    conn, ch = _channel(broker)
    if declare:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    last, padding = numbers[-1], b"." * pad
    for i in numbers[:-1]:
        ch.basic_publish("", name, b"m%d" % i + padding, pika.BasicProperties(message_id=str(i)))
    ch.confirm_delivery()
    ch.basic_publish("", name, b"m%d" % last + padding, pika.BasicProperties(message_id=str(last)))
    conn.close()


def drain(broker, queue: str) -> list[tuple[str, bytes]]:
    """(message_id, body) of every message of the queue (consumed, acked)."""
    conn, ch = _channel(broker)
    count = ch.queue_declare(queue, passive=True).method.message_count
    got = []
    if count:
        ch.basic_qos(prefetch_count=1000)
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=30):
            if method is None:
                break
            got.append((props.message_id, body))
            if len(got) == count:
                break
        ch.cancel()
    assert len(got) == count, f"{count} messages in {queue}, {len(got)} consumed"
    assert ch.queue_declare(queue, passive=True).method.message_count == 0
    conn.close()
    return got


def committed_files(table: Path) -> dict[Path, int]:
    """The files of a file sink's table, each with the batch that added it: those its log
    (_spark_metadata: "v1", then a JSON line a file; N.compact holds the batches up to N, as
    batch N) adds, less those it deletes. What a killed batch wrote before the batch was
    committed is in the directory, not in the log."""
    log = table / "_spark_metadata"
    batches = sorted((int(e.name.split(".")[0]), e) for e in log.iterdir() if e.name.split(".")[0].isdigit())
    last_compact = max((n for n, e in batches if e.name.endswith(".compact")), default=-1)
    files: dict[Path, int] = {}
    for n, entry in batches:
        if n < last_compact:
            continue
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            path = Path(unquote(urlsplit(record["path"]).path))
            if record.get("action", "add") == "add":
                files[path] = n
            else:
                files.pop(path, None)
    return files


def publish_to_queue(broker, name: str, numbers: range) -> None:
    """Persistent message i (message_id str(i)) for each i, to a durable queue, confirmed."""
    conn, ch = _channel(broker)
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in numbers:
        ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(message_id=str(i), delivery_mode=2))
    conn.close()


class Killed:
    """What the module's kill scenario left: the parquet tables of the stream and of the
    drained queue, and the queue written to."""

    def __init__(self, tmp: Path, uid: str):
        self.stream, self.queue, self.work = f"kill-src-{uid}", f"kill-sink-{uid}", f"kill-work-{uid}"
        self.table, self.input, self.work_table = tmp / "table", tmp / "in", tmp / "work-table"
        self.published = 0  # messages 0..published-1 in the stream
        self.rows: set[str] = set()  # the ids of the rows of the input files
        self.files = 0
        self.kills: list[dict] = []
        self.seconds: list[float] = []

    def publish(self, broker, count: int) -> None:
        numbers = range(self.published, self.published + count)
        publish_to_stream(broker, self.stream, numbers, declare=not self.published)
        publish_to_queue(broker, self.work, numbers)
        self.published += count

    def add_files(self, count: int, rows: int = ROWS_A_FILE) -> None:
        """Input files of `rows` rows, message_id fF-rR, body bF-R; each written aside and
        renamed in (a file source must never see half a file)."""
        staging = self.input.parent / "staging"
        staging.mkdir(exist_ok=True)
        self.input.mkdir(exist_ok=True)
        for f in range(self.files, self.files + count):
            name = f"in-{f:03d}.json"
            (staging / name).write_text("".join(json.dumps({"message_id": f"f{f}-r{r}", "body": f"b{f}-{r}"}) + "\n"
                                                for r in range(rows)))
            os.rename(staging / name, self.input / name)
            self.rows.update(f"f{f}-r{r}" for r in range(rows))
            time.sleep(0.01)  # (the file source takes the oldest first: distinct modification times)
        self.files += count


@pytest.fixture(scope="module")
def killed(broker, tmp_path_factory):
    """One job runs both queries (stream -> parquet, JSON files -> the queue) at once, and is
    SIGKILLed inside both queries' offsets/N..commits/N windows: at batch 1 or later as soon
    as they open; restarted, two batches further on at least, once the source's batch is
    writing its parquet file and the sink's has published all its rows; restarted again as
    Trigger.AvailableNow, which ends them. Messages and files are added before each start.
    (One job for both queries: a Spark session takes 10-25 s to start on two busy cores.)"""
    require_spark()
    tmp = tmp_path_factory.mktemp("kill")
    k = Killed(tmp, uuid.uuid4().hex[:10])
    conn, ch = _channel(broker)
    ch.queue_declare(k.queue, durable=True)
    conn.close()
    source_cp, sink_cp, queue_cp = tmp / "source-checkpoint", tmp / "sink-checkpoint", tmp / "queue-checkpoint"
    args = ("queries", uri(broker), "--source", k.stream, k.table, source_cp, "--sink", k.queue, k.input, sink_cp,
            "--queue-source", k.work, k.work_table, queue_cp)
    # A micro-batch takes a second at least; each query has batches enough to go on while
    # the other is slower to start.
    slowly = ("--max-records", BATCH, "--row-pause", 1 / BATCH)
    started = []
    try:
        k.publish(broker, 10 * BATCH)
        k.add_files(10)
        first = time.monotonic()
        started.append(Job([str(a) for a in (*args, *slowly)], tmp / "run1.log"))
        k.kills.append(kill_in_window(started[-1], {source_cp: Window(1), sink_cp: Window(1), queue_cp: Window(1)}))
        k.seconds.append(time.monotonic() - first)

        k.publish(broker, 5 * BATCH)
        k.add_files(10)
        then = time.monotonic()
        started.append(Job([str(a) for a in (*args, *slowly)], tmp / "run2.log"))
        # The second kill: the parquet file of the source's batch written in part (it is
        # open for writing 0.3 s into the batch), the sink's batch all published.
        restart = {cp: k.kills[0][cp.name]["killed_in"] for cp in (source_cp, sink_cp, queue_cp)}
        depth_conn, depth = _channel(broker)
        queued = depth.queue_declare(k.queue, passive=True).method.message_count

        def published(batch: int) -> bool:  # all of batches restart..batch: a file each
            now = depth.queue_declare(k.queue, passive=True).method.message_count
            return now >= queued + ROWS_A_FILE * (batch - restart[sink_cp] + 1)
        k.kills.append(kill_in_window(started[-1], {source_cp: Window(restart[source_cp] + 2, late=0.3),
                                                    sink_cp: Window(restart[sink_cp] + 2, when=published),
                                                    queue_cp: Window(restart[queue_cp] + 1, late=0.3)}))
        depth_conn.close()
        k.seconds.append(time.monotonic() - then)

        k.publish(broker, BATCH // 2)
        k.add_files(2)
        then = time.monotonic()
        started.append(Job([str(a) for a in (*args, "--available-now", "--max-records", 1000, "--files-per-trigger", 5)],
                           tmp / "run3.log"))
        assert started[-1].wait(150) == 0, started[-1].tail()
        k.seconds.append(time.monotonic() - then)
    finally:
        left = kill_all(started)
    assert not left, f"processes outlived their job: {left}"
    print(f"\nkills: {k.kills}; seconds a run: {[round(s, 1) for s in k.seconds]}")
    yield k
    conn, ch = _channel(broker)
    ch.queue_delete(k.stream)
    ch.queue_delete(k.queue)
    ch.queue_delete(k.work)
    conn.close()


@pytest.mark.timeout(480)
def test_stream_to_parquet_exactly_once_through_driver_kills(killed):
    import pyarrow.parquet as pq

    files = committed_files(killed.table)
    rows = [row for f in sorted(files) for row in pq.read_table(f).to_pylist()]
    ids = collections.Counter(int(r["message_id"]) for r in rows)
    everything = set(range(killed.published))
    assert sorted(everything - set(ids)) == [] and sorted(set(ids) - everything) == []
    assert [i for i, n in ids.items() if n > 1] == []
    assert all(r["offset"] == int(r["message_id"]) and r["body"] == b"m%d" % r["offset"] for r in rows)
    orphans = set(killed.table.glob("part-*.parquet")) - set(files)
    print(f"\n{len(rows)} rows; files the killed runs left uncommitted: {len(orphans)}")


@pytest.mark.timeout(480)
def test_stream_into_a_queue_loses_nothing_through_driver_kills(killed, broker):
    got = drain(broker, killed.queue)
    counts = collections.Counter(m for m, _ in got)
    assert sorted(killed.rows - set(counts)) == []
    assert sorted(set(counts) - killed.rows) == []
    assert all(body.decode() == "b" + m[1:].replace("-r", "-") for m, body in got)
    print(f"\n{len(killed.rows)} rows, {len(got)} messages: {len(got) - len(killed.rows)} duplicates "
          f"({sum(1 for n in counts.values() if n > 1)} ids twice or more)")


def _listed(broker, what: str, columns: str) -> list[dict]:
    import requests
    r = requests.get(f"{broker.api}/{what}", params={"columns": columns}, auth=("guest", "guest"), timeout=10)
    r.raise_for_status()
    return r.json()


def a_reader(broker) -> list[str]:
    """The connections reading a range of a stream."""
    return [c["name"] for c in _listed(broker, "connections", "name,user_provided_name")
            if c.get("user_provided_name") == READER]


def a_publisher_midway(broker, rows: int) -> list[str]:
    """The connections with a channel in confirm mode that has published some rows, not
    `rows`: a sink's task, midway."""
    return [c["connection_details"]["name"]
            for c in _listed(broker, "channels", "confirm,connection_details.name,message_stats.publish")
            if c.get("confirm") and 0 < c.get("message_stats", {}).get("publish", 0) < rows]


def close_connection(broker, job: Job, find: Callable[[], list[str]], timeout: float = 60) -> str:
    """Close (from the broker: 320 CONNECTION_FORCED) the first connection find() names."""
    import requests
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job.alive():
            pytest.fail(f"the job ended (exit {job.proc.returncode}) before a connection to close:\n{job.tail()}")
        for name in find():
            r = requests.delete(f"{broker.api}/connections/{quote(name, safe='')}", auth=("guest", "guest"),
                                headers={"X-Reason": "kill test"}, timeout=10)
            if r.status_code == 204:
                return name
        time.sleep(0.01)
    pytest.fail(f"no connection to close within {timeout:.0f} s:\n{job.tail()}")


def _event(path: Path, phase: str, job: Job, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event["phase"] == phase:
                    return event
        if not job.alive():
            pytest.fail(f"the job ended (exit {job.proc.returncode}) before its {phase}:\n{job.tail()}")
        time.sleep(0.05)
    pytest.fail(f"no {phase} within {timeout:.0f} s:\n{job.tail()}")


@pytest.mark.timeout(240)
def test_a_connection_closed_mid_task_is_retried(broker, uid, tmp_path, jobs):
    """A batch read of a stream of 60,000 entries of 2 KiB, the broker closing the reader's connection
    while it reads; then a batch write of 5,000 rows, the broker closing a publisher's
    connection while it publishes: each time the task fails, Spark runs it again (local[2,4]),
    and the read gives exactly the stream, the queue gets every row (a closed publisher's
    rows twice: a retry publishes them again)."""
    if broker.mgmt_port is None:
        pytest.skip("needs Warren's management API")
    s, q, n, rows = f"kill-conn-{uid}", f"kill-conn-q-{uid}", 60_000, 5_000
    conn, ch = _channel(broker)
    ch.queue_declare(q, durable=True)
    conn.close()
    events = tmp_path / "events.jsonl"
    began = time.time()
    job = jobs("retries", uri(broker), s, q, events, "--rows", rows)
    # while the job starts; 2 KiB bodies, so the read lasts long enough to be broken (a reader
    # has up to 4 MiB of record batches in flight: 60,000 small entries would all be there)
    publish_to_stream(broker, s, range(n), declare=True, pad=2048)
    published = time.time()
    ready = _event(events, "ready", job)
    (tmp_path / "events.jsonl.go").touch()

    closed = [close_connection(broker, job, lambda: a_reader(broker))]
    read = _event(events, "read", job)
    closed.append(close_connection(broker, job, lambda: a_publisher_midway(broker, rows // 2)))
    assert job.wait(100) == 0, job.tail()
    written = _event(events, "write", job)

    assert (read["rows"], read["offsets"], read["first"], read["last"], read["wrong_ids"]) == (n, n, 0, n - 1, 0)
    assert read["failed_tasks"] >= 1, f"the read was not broken mid-task:\n{job.tail()}"
    got = drain(broker, q)
    counts = collections.Counter(m for m, _ in got)
    assert set(counts) == {f"w{i}" for i in range(rows)}
    assert all(body.decode() == m[1:] for m, body in got)
    assert written["failed_tasks"] >= 1, f"the write was not broken mid-task:\n{job.tail()}"
    log = job.log()
    assert "ProtocolError" in log and "PublishFailed" in log, job.tail()  # (the closed connections' errors)
    conn, ch = _channel(broker)
    ch.queue_delete(s)
    ch.queue_delete(q)
    conn.close()
    print(f"\nconnections closed: {closed}; read {read}; write {written}: {len(got) - rows} duplicates; "
          f"published in {published - began:.1f} s, session in {ready['at'] - began:.1f} s, read in "
          f"{read['at'] - max(ready['at'], published):.1f} s, write in {written['at'] - read['at']:.1f} s")


@pytest.mark.timeout(480)
def test_queue_to_parquet_at_least_once_through_driver_kills(killed, broker):
    import pyarrow.parquet as pq

    rows = [{**row, "batch": batch} for f, batch in sorted(committed_files(killed.work_table).items())
            for row in pq.read_table(f).to_pylist()]
    ids = collections.Counter(int(r["message_id"]) for r in rows)
    everything = set(range(killed.published))
    assert sorted(everything - set(ids)) == [] and sorted(set(ids) - everything) == []
    again = {i: n - 1 for i, n in ids.items() if n > 1}
    assert sum(again.values()) <= BATCH * len(killed.kills)
    for i, extra in again.items():  # a duplicate is a redelivery
        assert sum(1 for r in rows if int(r["message_id"]) == i and r["redelivered"]) >= extra
    # and each kill's duplicates are one batch's (of at most BATCH rows): the batches holding
    # redelivered copies of duplicated messages are no more than the kills
    assert len({r["batch"] for r in rows if int(r["message_id"]) in again and r["redelivered"]}) <= len(killed.kills)
    assert all(r["body"] == b"m%s" % r["message_id"].encode() for r in rows)
    conn, ch = _channel(broker)
    assert ch.queue_declare(killed.work, passive=True).method.message_count == 0  # drained, all acked
    conn.close()
    print(f"\n{len(rows)} rows of {killed.published} messages: {sum(again.values())} duplicates; "
          f"{sum(1 for r in rows if r['redelivered'])} redelivered")
