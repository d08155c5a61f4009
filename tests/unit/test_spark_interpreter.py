"""warren.spark.interpreter: which Python Spark starts for the `warren` format's processes and,
under `warren pipeline`, for the session (no Spark needed)."""

import os
import sys

import pytest

from warren.spark.interpreter import for_format, for_session, is_local, this_environment
from warren.spark.launcher import SCRIPT

CLUSTERS = ["spark://h:7077", "yarn", "k8s://https://h:6443"]


def test_this_environment_is_its_launcher_or_its_interpreter():
    here = os.path.dirname(sys.executable)
    launcher = os.path.join(here, SCRIPT)
    assert this_environment() == (launcher if os.access(launcher, os.X_OK) else sys.executable)
    assert os.path.dirname(this_environment()) == here  # (not resolved: a venv's python is a link)


def test_local_masters():
    assert all(is_local(m) for m in ["local", "local[2]", "local[*]", "local-cluster[2,1,1024]"])
    assert not any(is_local(m) for m in CLUSTERS)


def test_the_pipeline_sets_pysparks_python_on_a_local_master_unless_the_user_did():
    assert for_session("local[*]", {}) == this_environment()
    assert for_session("local[*]", {"PYSPARK_PYTHON": ""}) == this_environment()  # (empty: not named)
    assert for_session("local[*]", {"PYSPARK_PYTHON": "/opt/py/bin/python3"}) is None
    # the driver's Python names no worker's (the driver is the command, already running)
    assert for_session("local[2]", {"PYSPARK_DRIVER_PYTHON": "ipython"}) == this_environment()
    assert all(for_session(m, {}) is None for m in CLUSTERS)


def test_the_formats_python_on_a_local_master():
    # none named: this environment's, not python3 on PATH
    assert for_format("local[2]", None, {}, "python3") == this_environment()
    # named in the environment (the context took it) or the conf (which Spark ignores for a
    # driver that is a Python program): that one; the conf wins, as under spark-submit
    assert for_format("local[2]", None, {"PYSPARK_PYTHON": "/opt/py/bin/python3"}, "/opt/py/bin/python3") == \
        "/opt/py/bin/python3"
    assert for_format("local[2]", "/usr/bin/python3", {}, "python3") == "/usr/bin/python3"
    assert for_format("local[2]", "/usr/bin/python3", {"PYSPARK_PYTHON": "/opt/py/bin/python3"},
                      "/opt/py/bin/python3") == "/usr/bin/python3"
    # this environment's Python, named: its launcher
    assert for_format("local[2]", sys.executable, {}, "python3") == this_environment()


@pytest.mark.parametrize("master", CLUSTERS)
def test_the_formats_python_on_a_cluster_is_the_users_or_sparks(master):
    assert for_format(master, None, {}, "python3") == "python3"
    assert for_format(master, "/opt/py/bin/python3", {}, "python3") == "/opt/py/bin/python3"
    assert for_format(master, None, {"PYSPARK_PYTHON": "/opt/py/bin/python3"}, "/opt/py/bin/python3") == \
        "/opt/py/bin/python3"
    assert for_format(master, sys.executable, {}, "python3") == sys.executable  # (executors may lack the launcher)
