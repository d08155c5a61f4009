"""warren.spark.launcher (warren-spark-python) and warren.spark.daemon's path change: Spark's
pyspark.zip and py4j zip are left out (the launcher) or go behind (the daemon) an installed
pyspark of the same version, and stay first otherwise; a session's `warren` format starts its
Python processes through the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from warren.spark.launcher import SCRIPT, launcher_for, prefer_installed_pyspark


def _spark_home(tmp_path, version: str) -> tuple[str, str]:
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        z.writestr("pyspark/__init__.py", "")
        z.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as z:
        z.writestr("py4j/__init__.py", "")
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def _site(tmp_path, version: str | None, py4j: bool = True) -> str:
    site = tmp_path / "site"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    if version is not None:
        (site / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    if py4j:
        (site / "py4j").mkdir()
        (site / "py4j" / "__init__.py").write_text("")
    return str(site)


def test_zips_go_last_when_the_installed_pyspark_is_the_same(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    site = _site(tmp_path, "4.2.0")
    assert prefer_installed_pyspark(["", zip_, py4j, "/x", site]) == ["", "/x", site, zip_, py4j]


def test_nothing_changes_for_another_version_or_without_an_installed_pyspark(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    path = [zip_, py4j, _site(tmp_path, "4.1.1")]
    assert prefer_installed_pyspark(path) == path
    assert prefer_installed_pyspark([zip_, py4j, str(tmp_path / "empty")]) == [zip_, py4j, str(tmp_path / "empty")]


def test_nothing_changes_without_py4j_installed_or_without_the_zip(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    site = _site(tmp_path, "4.2.0", py4j=False)
    assert prefer_installed_pyspark([zip_, py4j, site]) == [zip_, py4j, site]
    assert prefer_installed_pyspark(["/a", site]) == ["/a", site]


def _run_launched(tmp_path, zip_version: str) -> tuple[list[str], str, str, str]:
    """(sys.path, the pyspark zip, the py4j zip, the site directory) of a Python started
    through warren-spark-python with Spark's zips (of `zip_version`) first on PYTHONPATH,
    beside an installed pyspark of 4.2.0."""
    zip_, py4j = _spark_home(tmp_path, zip_version)
    site = _site(tmp_path, "4.2.0")
    script = os.path.join(os.path.dirname(sys.executable), SCRIPT)
    if not os.access(script, os.X_OK):
        pytest.fail(f"{script} is not installed (pip install -e '.[spark]' installs it)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([zip_, py4j, "/extra", site]))
    out = subprocess.run([script, "-c", "import json, sys; print(json.dumps(sys.path))"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out), zip_, py4j, site


def test_the_launcher_leaves_the_zips_out_when_the_installed_pyspark_is_the_same(tmp_path):
    path, zip_, py4j, site = _run_launched(tmp_path, "4.2.0")
    assert zip_ not in path and py4j not in path
    assert path.index("/extra") < path.index(site)  # (the rest of PYTHONPATH as it was)


def test_the_launcher_changes_nothing_for_another_version(tmp_path):
    path, zip_, py4j, site = _run_launched(tmp_path, "4.1.1")
    assert path.index(zip_) < path.index(py4j) < path.index("/extra") < path.index(site)


def test_the_launcher_is_for_this_environments_python_only():
    here = os.path.dirname(sys.executable)
    assert launcher_for(sys.executable) == os.path.join(here, SCRIPT)
    assert launcher_for("/usr/bin/no-such-python") is None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        out.extend(kids := children.get(todo.pop(), []))
        todo.extend(kids)
    return out


def _python_paths(pids: list[int], module: str) -> list[str]:
    """PYTHONPATH of the processes among `pids` started as `-m ... module`."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split("=", 1) for v in f.read().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        if module in args:
            found.append(env.get("PYTHONPATH", ""))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the processes' environment from /proc")
def test_the_formats_python_processes_start_without_the_zips(spark, broker, uid):
    """The registered format's planner daemons and tasks' daemon run pyspark from the installed
    package; Spark's own lookup of data sources (not the format's Python) keeps the zip."""
    from .test_source_sink import reader, stream

    s = stream(broker, f"sp-launch-{uid}", 10)
    assert sorted(r.offset for r in reader(spark, broker, s).select("offset").collect()) == list(range(10))
    pids = _descendants(spark.sparkContext._gateway.proc.pid)
    planner = _python_paths(pids, "pyspark.sql.worker.plan_data_source_read")
    tasks = _python_paths(pids, "warren.spark.daemon")
    assert planner and tasks, "no planner or task daemon of the format found"
    assert not [p for p in planner + tasks if "pyspark.zip" in p], planner + tasks
    assert all("pyspark.zip" in p for p in _python_paths(pids, "pyspark.sql.worker.lookup_data_sources"))
