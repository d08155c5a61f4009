"""A faster start for Spark's Python worker daemons: `spark.python.daemon.module=warren.spark.daemon`
(set when the session is built, see warren.spark.fast_start).

It imports the worker module (and warren.spark.source, the range reader's modules: ~0.2 s a
worker) once before the daemon forks its workers, which would each import them again, and
runs pyspark.daemon unchanged. Spark takes this setting for the tasks' daemon only (the
planner's daemons and the streaming source's runner start as their own modules whatever it
says). It also moves Spark's pyspark.zip behind the installed pyspark of the same version, as
warren-spark-python (warren.spark.launcher) does for every process of the format, for a session
whose Python is not this environment's."""

from __future__ import annotations

import importlib
import runpy
import sys

from .launcher import prefer_installed_pyspark


def main() -> None:
    sys.path[:] = prefer_installed_pyspark(sys.path)
    worker = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark") else "pyspark.worker"
    for module in (worker, "warren.spark.source"):  # (the range reader's modules too: ~0.2 s a worker)
        try:
            importlib.import_module(module)  # (before the fork: every worker has it then)
        except Exception:  # (the forked worker imports it again and reports the error to Spark)
            pass
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
