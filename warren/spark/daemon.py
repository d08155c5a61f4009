"""A faster start for Spark's Python worker daemons: `spark.python.daemon.module=warren.spark.daemon`
(set when the session is built, see warren.spark.FAST_START).

Spark starts its Python processes with `$SPARK_HOME/python/lib/pyspark.zip` first on
PYTHONPATH, and Python compiles every module it imports from a zip again in every process
(a zip gets no `__pycache__`): importing `pyspark.worker` that way costs ~1.4 s of CPU more
than from the installed package (measured 2026-11-27: 1.9 s against 0.5 s), in every Python
process a streaming query of the `warren` source starts, on the first micro-batch's path.
Spark takes this setting for the daemon of the tasks' workers (`pyspark.worker`) only: the
planner's daemons (create_data_source, plan_data_source_read) and the streaming source's
runner are started as `pyspark.daemon` / their own module whatever it says. This module moves
the zips behind the installed pyspark when that is the same version (else it changes
nothing), imports the worker module (and warren.spark.source) once before the daemon forks its workers
(each forked worker would import them again), and runs pyspark.daemon unchanged."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import runpy
import sys
import zipfile


def _version_in_zip(path: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            return _version_of(z.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _version_of(source: str) -> str | None:
    for line in source.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` (a sys.path) with Spark's pyspark and py4j zips moved to its end, if a pyspark
    of the same version is installed on the rest of it (and py4j too); else `path` as it is."""
    zips = [p for p in path if os.path.basename(p) == "pyspark.zip"
            or (os.path.basename(p).startswith("py4j-") and p.endswith("-src.zip"))]
    pyspark_zip = [p for p in zips if os.path.basename(p) == "pyspark.zip"]
    if not pyspark_zip:
        return path
    rest = [p for p in path if p not in zips]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    py4j = importlib.machinery.PathFinder.find_spec("py4j", rest)
    if spec is None or py4j is None or not spec.submodule_search_locations:
        return path
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            installed = _version_of(f.read())
    except OSError:
        return path
    if installed is None or installed != _version_in_zip(pyspark_zip[0]):
        return path
    return rest + zips


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
