"""A class data sharing archive for the Spark driver's JVM (HotSpot's dynamic AppCDS).

The driver's JVM loads and verifies thousands of classes from Spark's jars while it starts and
plans its first queries (~14 % of a JFR profile of a streaming query's driver). An archive of
them, dumped once per Spark and JVM by a JVM that ran such queries, is mapped by the JVMs
started after it instead (bench/spark.py: `start()` to the first micro-batch 1.8-1.9 → 1.4 s,
the first micro-batch 4.4-4.6 → 3.7-3.8 s).

`prepare()` makes it in a child process whose Spark session reads a Python data source of the
`warren` schema into parquet (streaming, AvailableNow) and writes through a Python data source,
its JVM dumping with -XX:ArchiveClassesAtExit to a temporary name; the file takes the archive's
name only once that JVM has exited with status 0. A torn archive crashes the JVM that maps it
(SIGBUS, tried): a partial file is never at the archive's name. `settings()` gives the driver
the archive when it is there, nothing otherwise (a JVM that cannot use it, another build or
class path, starts without it).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from typing import Iterator

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamReader, InputPartition,
                                    WriterCommitMessage)

DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
_FORMAT = "warren-class-archive"


def _java_home() -> str | None:
    """The JVM Spark's launcher runs (spark-class: $JAVA_HOME/bin/java, else `java` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


def archive_path() -> str | None:
    """Where this Spark's and this JVM's archive is kept (None: no JVM found). Another Spark,
    another JVM or another build of it (a package upgrade) has an archive of its own."""
    import pyspark

    home = _java_home()
    if home is None:
        return None
    jvm = os.path.join(home, "lib", "server", "libjvm.so")
    built = os.stat(jvm if os.path.exists(jvm) else home)
    spark = os.environ.get("SPARK_HOME") or os.path.dirname(os.path.abspath(pyspark.__file__))
    key = "\0".join((pyspark.__version__, spark, home, str(built.st_mtime_ns), str(built.st_size)))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "warren", f"spark-{pyspark.__version__}-"
                                         f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa")


def _option(flag: str, path: str) -> str:
    return f'"{flag}={path}"' if " " in path else f"{flag}={path}"  # (Spark splits the options on spaces)


def settings() -> dict[str, str]:
    """The session setting that maps the archive, if it has been made."""
    path = archive_path()
    if path is None or not os.path.isfile(path):
        return {}
    return {DRIVER_OPTIONS: _option("-XX:SharedArchiveFile", path)}


def prepare(timeout: float = 600) -> tuple[str | None, str]:
    """Make the archive unless it is there: (its path or None, what happened)."""
    path = archive_path()
    if path is None:
        return None, "no java found ($JAVA_HOME, or java on PATH)"
    if os.path.isfile(path):
        return path, "already made"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = f"{path}.{uuid.uuid4().hex}.part"
    try:
        done = subprocess.run([sys.executable, "-m", __name__, part], capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode == 0 and os.path.isfile(part) and os.path.getsize(part) > 0:
            os.replace(part, path)
            return path, "made"
        said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        return None, f"not made: the dumping JVM's session exited with {done.returncode}: {said}"
    except subprocess.TimeoutExpired:
        return None, f"not made: no archive after {timeout:.0f} s"
    finally:
        if os.path.exists(part):
            os.unlink(part)


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

    def latestOffset(self) -> dict:
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

    from . import fast_start, register

    builder = (SparkSession.builder.master("local[2]").appName("warren class archive")
               .config("spark.ui.enabled", "false"))
    for key, value in {**fast_start(), DRIVER_OPTIONS: _option("-XX:ArchiveClassesAtExit", part)}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(_Sample)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        (spark.readStream.format(_FORMAT).load().writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", out + ".cp").trigger(availableNow=True).start().awaitTermination())
        rows = spark.read.parquet(out)
        rows.write.format(_FORMAT).mode("append").save()
        rows.count()
    jvm = spark.sparkContext._gateway.proc
    spark.stop()
    jvm.stdin.close()  # (Spark's gateway exits when its stdin closes; the dump runs at its exit)
    return jvm.wait(300)


if __name__ == "__main__":
    sys.exit(_dump(sys.argv[1]))
