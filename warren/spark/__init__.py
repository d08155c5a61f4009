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
    spark.dataSource.register(WarrenDataSource)
