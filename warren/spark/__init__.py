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

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the `warren` format with a SparkSession. Refused with speculative execution on:
    a speculative copy of a write task would publish its rows twice at once."""
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise ValueError("the warren sink needs spark.speculation=false (a speculative task publishes its rows twice)")
    from .source import WarrenDataSource
    env = _runner_env(spark)
    seeded = [k for k in env if k not in spark.sparkContext.environment] if env else []
    for k in seeded:
        spark.sparkContext.environment[k] = env[k]
    try:
        spark.dataSource.register(WarrenDataSource)
    finally:
        for k in seeded:
            del spark.sparkContext.environment[k]


def _runner_env(spark: Any) -> dict[str, str]:
    """The variables Spark 4.2's streaming source runner adds to the registered data source's
    own environment map (PythonStreamingSourceRunner puts them into PythonFunction.envVars, a
    java.util.HashMap shared by every query of the format). Added by one query's start while
    another query's tasks are serialized with that map, they corrupt the task
    (java.io.OptionalDataException, seen with three warren queries in one session); present
    from the registration on, every later put only replaces a value. Every runner sets all
    four before it starts a Python worker, so these values are never the ones used."""
    try:
        dirs = spark.sparkContext._jvm.org.apache.spark.SparkEnv.get().blockManager().diskBlockManager().localDirs()
        local = ",".join(d.getPath() for d in dirs)
    except Exception:  # (Spark Connect: no JVM here, and no such runner either)
        return {}
    return {"SPARK_LOCAL_DIRS": local, "SPARK_AUTH_SOCKET_TIMEOUT": "15", "SPARK_BUFFER_SIZE": "65536",
            "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER"}
