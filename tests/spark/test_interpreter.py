"""The Python Spark starts for the `warren` format (warren.spark.interpreter), end to end: a
script run by this environment's Python from an environment whose PATH does not hold it (cron,
systemd), where `python3` on PATH has no warren, registers the format on a local master and
reads and writes; a Python named in spark-defaults.conf's `spark.pyspark.python` is the one the
format's processes start with (Spark itself ignores it for a driver that is a Python program)."""

import subprocess
import sys

import pika
import pytest

from .conftest import bare_env, get_all, uri
from .test_source_sink import stream

_SCRIPT = """
import sys
from pyspark.sql import SparkSession
from warren.spark import register
uri, name, queue = sys.argv[1:4]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
register(spark)
rows = spark.read.format("warren").option("uri", uri).option("stream", name).load()
print("read", rows.count())
rows.select("body").write.format("warren").option("uri", uri).option("routingKey", queue).mode("append").save()
spark.stop()
"""


def _run_script(broker, uid, tmp_path, **env):
    """(the script's completed process, the bodies it wrote to its queue)."""
    s, q = stream(broker, f"sp-py-{uid}", 10), f"sp-py-out-{uid}"
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(q)
    conn.close()
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, str(script), uri(broker), s, q], env=bare_env(**env),
                          capture_output=True, text=True, timeout=300)
    return done, sorted(body for _m, _p, body in get_all(broker, q))


@pytest.mark.timeout(300)  # (a Spark of its own)
def test_register_in_a_script_run_without_this_environment_on_path(spark, broker, uid, tmp_path):
    done, written = _run_script(broker, uid, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read 10" in done.stdout
    assert written == sorted(b"m%d" % i for i in range(10))


@pytest.mark.timeout(300)
def test_spark_pyspark_python_in_spark_defaults_is_the_formats(spark, broker, uid, tmp_path):
    """A Python the user named (here one that notes its arguments, then runs this environment's
    Python) starts the format's planner and tasks, not this environment's launcher."""
    log = tmp_path / "started"
    named = tmp_path / "python-noted"
    named.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{sys.executable}" "$@"\n')
    named.chmod(0o755)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.pyspark.python  {named}\n")
    done, written = _run_script(broker, uid, tmp_path, SPARK_CONF_DIR=str(conf))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(written) == 10
    started = log.read_text()
    assert "pyspark.sql.worker.plan_data_source_read" in started and "-m pyspark.daemon" in started, started
