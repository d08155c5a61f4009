"""Warren's data pipeline on Apache Spark: the `warren` data source (streams as a Spark source,
exactly once into file and Delta sinks; queues drained at least once) and sink (rows published
with confirms).

    from warren.spark import register
    register(spark)
    spark.readStream.format("warren").option("stream", "events").load()

Pure Python (PySpark's Python Data Source API, Spark 4.2+), installed with
`pip install -e '.[spark]'`; it talks to the broker as a client (aiormq) and works against
RabbitMQ 3.10 streams too, with the differences warren.spark.broker names."""

from __future__ import annotations

import os
import tempfile
from typing import Any

__all__ = ["fast_start", "register"]


def fast_start() -> dict[str, str]:
    """Session settings for a faster cold start, to give SparkSession.builder (they cannot be
    changed once the session runs): the daemon of Spark's Python task workers imports pyspark
    from the installed package rather than compiling it again from pyspark.zip
    (warren.spark.daemon), and the driver's JVM maps the class archive `warren pipeline
    prepare` made, if it has (warren.spark.class_archive: spark.driver.extraJavaOptions, after
    those spark-defaults.conf gives; a session that sets its own in code should add
    -XX:SharedArchiveFile to them).
    `for k, v in fast_start().items(): builder = builder.config(k, v)`"""
    from .class_archive import settings

    return {"spark.python.daemon.module": "warren.spark.daemon", **settings()}


def register(spark: Any) -> None:
    """Register the `warren` format with a SparkSession. Refused with speculative execution on:
    a speculative copy of a write task would publish its rows twice at once. The format's
    Python processes start with the Python the user named (`spark.pyspark.python`, else
    PYSPARK_PYTHON) or, if none, on a local master with this environment's, not whatever
    `python3` is on PATH (warren.spark.interpreter); this environment's Python on a local master
    is warren-spark-python (warren.spark.launcher: pyspark not compiled from its zip again)."""
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise ValueError("the warren sink needs spark.speculation=false (a speculative task publishes its rows twice)")
    from . import interpreter
    from .source import PARALLELISM_ENV, WarrenDataSource
    try:
        context = spark.sparkContext
    except Exception:  # (Spark Connect: no context here, and no such runner either)
        context = None
    environment: dict[str, str] = context.environment if context is not None else {}
    seeded = [k for k in _RUNNER_ENV if context is not None and k not in environment]
    for k in seeded:
        environment[k] = _RUNNER_ENV[k]
    if context is not None:
        # minPartitions' default (the source's Python workers cannot ask Spark for it).
        environment[PARALLELISM_ENV] = str(context.defaultParallelism)
        seeded.append(PARALLELISM_ENV)
    python = context.pythonExec if context is not None else None
    chosen = python if context is None else interpreter.for_format(
        str(context.master), context.getConf().get(interpreter.CONF), os.environ, str(python))
    if chosen != python:  # (the format's Python function takes the context's Python as it is registered)
        context.pythonExec = chosen
    try:
        spark.dataSource.register(WarrenDataSource)
    finally:
        if chosen != python:
            context.pythonExec = python
        for k in seeded:
            del environment[k]


# The variables Spark 4.2's streaming source runner adds to the registered data source's own
# environment map (PythonStreamingSourceRunner puts them into PythonFunction.envVars, a
# java.util.HashMap shared by every query of the format). Added at one query's start while
# another query's tasks are serialized with that map, they corrupt the task
# (java.io.OptionalDataException, seen with three warren queries in one session); present from
# the registration on, every later put only replaces a value. Every runner sets all four
# before it starts a Python worker, so these values are never the ones used.
_RUNNER_ENV = {"SPARK_LOCAL_DIRS": tempfile.gettempdir(), "SPARK_AUTH_SOCKET_TIMEOUT": "15",
               "SPARK_BUFFER_SIZE": "65536", "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER"}
