"""Which Python Spark starts for the `warren` format's processes (its planners, its streaming
source's runner, its tasks), and, under `warren pipeline`, for every Python process of the
session.

Spark starts them with the Python named by `PYSPARK_PYTHON` when the SparkContext started, else
with `python3` on PATH: from cron, systemd or a shell without the virtual environment activated,
that is another Python, without warren (`[PYTHON_DATA_SOURCE_ERROR] ... No module named
'warren'`). `spark.pyspark.python` (spark-defaults.conf, `--conf`, the session builder) is
applied only by spark-submit starting a Python program; a driver that is itself a Python
program (the `warren` command, a script) takes PYSPARK_PYTHON or `python3` whatever it says. So the format's Python
is the one the user named (`spark.pyspark.python`, which wins as under spark-submit, else
`PYSPARK_PYTHON`); if none, on a local master this environment's, and on a cluster Spark's
`python3` (the executors are other machines: the user names a Python that has warren there).
`spark.pyspark.driver.python` and `PYSPARK_DRIVER_PYTHON` name the driver's Python only, already
running here: they name no worker's."""

from __future__ import annotations

import sys
from typing import Mapping

from .launcher import launcher_for

CONF = "spark.pyspark.python"
ENV = "PYSPARK_PYTHON"


def is_local(master: str) -> bool:
    """Whether a master's executors are this machine (local, local[N], local-cluster[...])."""
    return master.startswith("local")


def this_environment() -> str:
    """This environment's Python for Spark: warren-spark-python beside this interpreter if it is
    installed there (pyspark not compiled again from its zip: warren.spark.launcher), else this
    interpreter (by the path it was started with: a virtual environment's python is a link that
    must not be resolved)."""
    return launcher_for(sys.executable) or sys.executable


def for_session(master: str, environ: Mapping[str, str]) -> str | None:
    """The PYSPARK_PYTHON `warren pipeline` sets before its session starts, so that the JVM's own
    Python processes (its lookup of data sources) and every Python function run this
    environment's Python: this environment's on a local master without PYSPARK_PYTHON, else
    None (the user's, or a cluster's)."""
    return this_environment() if is_local(master) and not environ.get(ENV) else None


def for_format(master: str, conf_python: str | None, environ: Mapping[str, str], context_python: str) -> str:
    """The Python the `warren` format's processes start with, given the session's master, its
    `spark.pyspark.python` (None if unset), the environment and the Python the SparkContext took
    (PYSPARK_PYTHON when it started, else python3). A named Python that is this environment's
    gets warren-spark-python on a local master (a cluster's executors may not have it)."""
    named = conf_python or (context_python if environ.get(ENV) else None)
    if named is None:
        return this_environment() if is_local(master) else context_python
    return (launcher_for(named) if is_local(master) else None) or named
