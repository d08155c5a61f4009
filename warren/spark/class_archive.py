"""A class data sharing archive for the Spark driver's JVM (HotSpot's dynamic AppCDS).

The driver's JVM loads and verifies thousands of classes from Spark's jars while it starts and
plans its first queries (~14 % of a JFR profile of a streaming query's driver). An archive of
them, dumped once per Spark and JVM by a JVM that ran such queries, is mapped by the JVMs
started after it instead (bench/spark.py: `start()` to the first micro-batch 2.0-2.1 → 1.5-1.7
s, the first micro-batch 4.3-4.6 → 4.0-4.1 s).

`prepare()` makes it in a child process whose Spark session reads a Python data source of the
`warren` schema into parquet (streaming, AvailableNow) and writes through a Python data source,
its JVM dumping with -XX:ArchiveClassesAtExit to a temporary name; the file takes the archive's
name only once that JVM has exited with status 0, another has mapped all of it and it is on
disk (fsync). A torn archive crashes the JVM that maps it (SIGBUS, tried): a partial file is
never at the archive's name. `settings()` gives the driver the archive when it is there,
nothing otherwise (a JVM that cannot use it, another build or class path, starts without it).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Iterator

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamReader, InputPartition,
                                    ReadLimit, WriterCommitMessage)

DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
_FORMAT = "warren-class-archive"


def _java_home() -> str | None:
    """The JVM Spark's launcher runs (spark-class: $JAVA_HOME/bin/java, else `java` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


def _spark_home() -> str:
    import pyspark

    return os.environ.get("SPARK_HOME") or os.path.dirname(os.path.abspath(pyspark.__file__))


def archive_path() -> str | None:
    """Where this Spark's and this JVM's archive is kept (None: no JVM found). Another Spark,
    another JVM or another build of it (a package upgrade) has an archive of its own."""
    import pyspark

    home = _java_home()
    if home is None:
        return None
    jvm = os.path.join(home, "lib", "server", "libjvm.so")
    built = os.stat(jvm if os.path.exists(jvm) else home)
    key = "\0".join((pyspark.__version__, _spark_home(), home, str(built.st_mtime_ns), str(built.st_size)))
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # (the XDG spec: a relative path is to be ignored)
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "warren", f"spark-{pyspark.__version__}-"
                                         f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa")


def _option(flag: str, path: str) -> str:
    """One JVM option in spark.driver.extraJavaOptions, which Spark's launcher splits as a shell
    would (whitespace, quotes, backslashes)."""
    option = f"{flag}={path}"
    if any(c.isspace() or c in "'\"\\" for c in option):
        return "'" + option.replace("'", "'\\''") + "'"
    return option


def _configured_options() -> str:
    """spark.driver.extraJavaOptions from spark-defaults.conf, which the session's own setting
    would replace."""
    conf = os.environ.get("SPARK_CONF_DIR") or os.path.join(_spark_home(), "conf")
    try:
        with open(os.path.join(conf, "spark-defaults.conf"), encoding="utf-8") as f:
            for line in f:
                parts = re.split(r"\s*[=:\s]\s*", line.strip(), maxsplit=1)
                if len(parts) == 2 and parts[0] == DRIVER_OPTIONS:
                    return parts[1]
    except OSError:
        pass
    return ""


def settings() -> dict[str, str]:
    """The session setting that maps the archive, if it has been made (after the driver's
    options in spark-defaults.conf, which it would otherwise replace)."""
    path = archive_path()
    if path is None or not os.path.isfile(path) or "Xmx" in path:  # (the launcher refuses an -Xmx there)
        return {}
    return {DRIVER_OPTIONS: f"{_configured_options()} {_option('-XX:SharedArchiveFile', path)}".strip()}


def prepare(timeout: float = 600) -> tuple[str | None, str]:
    """Make the archive unless it is there: (its path or None, what happened)."""
    path = archive_path()
    if path is None:
        return None, "no java found ($JAVA_HOME, or java on PATH)"
    if os.path.isfile(path):
        return path, "already made"
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):  # parts of runs that died (a running one's is younger)
        left = os.path.join(folder, name)
        try:
            if ".part" in name and os.path.getmtime(left) < time.time() - timeout - 60:
                os.unlink(left)
        except FileNotFoundError:  # (another prepare cleaned it up first)
            pass
    part = f"{path}.{uuid.uuid4().hex}.part"
    # In a process group of its own: on a timeout or an interrupt its JVM (which ignores
    # SIGINT, and would dump at its exit after this returned) is killed with it.
    child = subprocess.Popen([sys.executable, "-m", __name__, part], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        try:
            _out, err = child.communicate(timeout=timeout)
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()  # (its pipe closes once the whole group is gone)
            raise
        if child.returncode != 0 or not os.path.isfile(part) or not os.path.isfile(part + ".classpath"):
            said = (err.strip().splitlines() or ["(nothing on stderr)"])[-1]
            return None, f"not made: the dumping JVM's session exited with {child.returncode}: {said}"
        with open(part + ".classpath", encoding="utf-8") as f:
            classpath = f.read()
        if not maps(part, classpath):
            return None, "not made: the archive the JVM dumped does not map whole"
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, path)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return path, "made"
    except subprocess.TimeoutExpired:
        return None, f"not made: no archive after {timeout:.0f} s"
    finally:
        for left in (part, part + ".classpath"):
            if os.path.exists(left):
                os.unlink(left)


def maps(archive: str, classpath: str) -> bool:
    """Whether a JVM of this Java maps the whole archive with this class path: -Xshare:on
    fails rather than start without it, and VerifySharedSpaces reads every byte (a torn
    archive: SIGBUS in this JVM rather than in a session's)."""
    home = _java_home()
    if home is None:
        return False
    # (a torn one's crash report and core go nowhere: the answer is the exit status)
    done = subprocess.run([os.path.join(home, "bin", "java"), f"-XX:SharedArchiveFile={archive}",
                           "-XX:+VerifySharedSpaces", "-Xshare:on", "-XX:ErrorFile=/dev/null",
                           "-XX:-CreateCoredumpOnCrash", "-cp", classpath, "-version"],
                          capture_output=True, timeout=120)
    return done.returncode == 0


class _Sample(DataSource):
    """Two rows of the `warren` format's schema, as Arrow: the classes a `warren` query loads."""

    @classmethod
    def name(cls) -> str:
        return _FORMAT

    def schema(self) -> str:
        from .rows import SCHEMA_DDL
        return SCHEMA_DDL

    def streamReader(self, schema) -> DataSourceStreamReader:
        return _SampleStream()

    def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
        return _Discard()


class _SampleStream(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # (admission control, as the source's)
        return {"rows": 2}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0)] if start != end else []

    def read(self, partition) -> Iterator:
        import pyarrow as pa

        from .rows import ARROW_SCHEMA
        now = datetime.datetime.now(datetime.timezone.utc)
        death = {"queue": "q", "reason": "rejected", "exchange": "", "routing_keys": ["q"], "count": 1, "time": now}
        yield pa.RecordBatch.from_pylist([
            {"body": b"x", "exchange": "", "routing_key": "q", "source": "s", "offset": n, "redelivered": False,
             "delivery_count": 1, "timestamp": now, "headers": [("h", "v")], "properties": {"message_id": str(n)},
             "death": [death]} for n in range(2)], schema=ARROW_SCHEMA)

    def commit(self, end: dict) -> None:
        pass


class _Discard(DataSourceArrowWriter):
    def write(self, iterator: Iterator) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()


def _dump(part: str) -> int:
    """Run the sample queries in a session whose JVM dumps its classes to `part` at its exit;
    the JVM's exit status."""
    from pyspark.sql import SparkSession

    from .interpreter import ENV, for_session

    python = for_session("local[2]", os.environ)
    if python:  # (the sample format's Python processes need warren: not python3 on PATH)
        os.environ[ENV] = python
    dump = f"{_configured_options()} {_option('-XX:ArchiveClassesAtExit', part)}".strip()
    spark = (SparkSession.builder.master("local[2]").appName("warren class archive")
             .config("spark.ui.enabled", "false").config(DRIVER_OPTIONS, dump).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(_Sample)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        (spark.readStream.format(_FORMAT).load().writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", out + ".cp").trigger(availableNow=True).start().awaitTermination())
        rows = spark.read.parquet(out)
        rows.write.format(_FORMAT).mode("append").save()
        rows.count()
    view, gateway = spark.sparkContext._jvm, spark.sparkContext._gateway
    assert view is not None and gateway is not None  # (a running session has both)
    with open(part + ".classpath", "w") as f:  # (a JVM maps the archive only with the class path it was made with)
        f.write(view.java.lang.System.getProperty("java.class.path"))
    jvm = gateway.proc
    spark.stop()
    jvm.stdin.close()  # (Spark's gateway exits when its stdin closes; the dump runs at its exit)
    return jvm.wait(300)


if __name__ == "__main__":
    sys.exit(_dump(sys.argv[1]))
