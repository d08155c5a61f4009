"""The driver's class archive (warren.spark.class_archive): made once by `warren pipeline
prepare`, mapped by the JVM of a session built with fast_start(), and never a torn file at the
archive's name (a JVM that maps one dies of SIGBUS)."""

import os
import stat
import subprocess
import sys

import pytest

from .conftest import bare_env, require_spark, warren_script

# A fresh driver JVM with fast_start() (plus a class-load log): where did SparkContext come from?
_SESSION = """
import sys
from pyspark.sql import SparkSession
from warren.spark import fast_start
from warren.spark.class_archive import DRIVER_OPTIONS
settings = fast_start()
settings[DRIVER_OPTIONS] = (settings.get(DRIVER_OPTIONS, "") + " -Xlog:class+load=info:file=" + sys.argv[1]).strip()
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for key, value in settings.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
print(spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path"))
print(spark.range(3).count())
spark.stop()
"""


def _env(tmp_path):
    # (a space in the path: Spark splits spark.driver.extraJavaOptions on spaces, outside quotes)
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache dir")}


def _session(env, log) -> tuple[str, str]:
    """(where SparkContext's class came from, the JVM's class path)."""
    done = subprocess.run([sys.executable, "-c", _SESSION, str(log)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("3"), done.stderr[-2000:]
    line = next(line for line in log.read_text().splitlines() if " org.apache.spark.SparkContext " in line)
    return line.split("source: ", 1)[1], done.stdout.strip().splitlines()[-2]


@pytest.mark.timeout(600)  # (three Sparks of their own, one of them dumping its classes)
def test_prepare_makes_the_archive_once_and_a_session_maps_it(tmp_path):
    require_spark()
    env = _env(tmp_path)
    assert _session(env, tmp_path / "before.log")[0].startswith("file:")  # from Spark's jar: no archive yet

    # (this environment's `warren` from a PATH without it, as cron runs it: the sample format's
    # Python processes must not be python3 on PATH, which has no warren)
    made = subprocess.run([warren_script(), "pipeline", "prepare"], env=bare_env(XDG_CACHE_HOME=env["XDG_CACHE_HOME"]),
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr[-2000:]
    path = made.stdout.split(": ")[1]
    assert made.stdout.strip().endswith(": made") and path.startswith(str(tmp_path / "cache dir" / "warren"))
    assert os.path.getsize(path) > 1 << 20
    assert [p.name for p in (tmp_path / "cache dir" / "warren").iterdir()] == [os.path.basename(path)]  # no .part

    source, classpath = _session(env, tmp_path / "after.log")
    assert source == "shared objects file (top)"

    # What prepare checks before the archive takes its name: this one maps whole, a torn copy
    # does not (its JVM dies of SIGBUS), nor does it with another class path.
    from warren.spark.class_archive import maps
    reports = set(f for f in os.listdir() if f.startswith("hs_err_pid"))
    assert maps(path, classpath)
    torn = tmp_path / "torn.jsa"
    with open(path, "rb") as whole:
        torn.write_bytes(whole.read(os.path.getsize(path) - (1 << 20)))
    assert not maps(str(torn), classpath)
    assert not maps(path, str(tmp_path))
    assert set(f for f in os.listdir() if f.startswith("hs_err_pid")) == reports  # (no crash report left here)

    again = subprocess.run([sys.executable, "-m", "warren", "pipeline", "prepare"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.strip().endswith(": already made"), again.stdout


def _fake_java(tmp_path, body: str) -> str:
    """A JAVA_HOME whose java runs `body` (sh) with the launcher's arguments in "$@"."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n" + body + "\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return str(home)


def test_a_dump_that_fails_leaves_no_archive(tmp_path, monkeypatch):
    """The dumping JVM writes part of an archive and fails: nothing takes the archive's name,
    the part is removed, and sessions start without an archive."""
    require_spark()
    from warren.spark import class_archive

    # (Spark's launcher passes the driver's options on: the fake writes where the dump would)
    home = _fake_java(tmp_path, 'for a in "$@"; do case "$a" in *ArchiveClassesAtExit=*)\n'
                                '  printf torn > "${a#*ArchiveClassesAtExit=}";; esac; done\n'
                                'echo "the JVM died" >&2; exit 1')
    monkeypatch.setenv("JAVA_HOME", home)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path, what = class_archive.prepare(timeout=120)
    assert path is None and what.startswith("not made"), what
    assert os.listdir(tmp_path / "cache" / "warren") == []
    assert class_archive.settings() == {}


def test_a_dump_cut_short_leaves_no_jvm_and_no_archive(tmp_path, monkeypatch):
    """A timeout kills the dumping session's whole process group: its JVM (which ignores
    SIGINT) does not live on to dump a part file after prepare has cleaned up."""
    require_spark()
    from warren.spark import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path, what = class_archive.prepare(timeout=4)
    assert path is None and what == "not made: no archive after 4 s", what
    folder = tmp_path / "cache" / "warren"
    alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).find(str(folder)) >= 0]
    assert alive == []
    assert os.listdir(folder) == []


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_each_jvm_and_spark_has_an_archive_of_its_own(tmp_path, monkeypatch):
    require_spark()
    from warren.spark import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mine = class_archive.archive_path()
    assert mine is not None and mine.startswith(str(tmp_path / "cache" / "warren" / "spark-"))
    monkeypatch.setenv("JAVA_HOME", _fake_java(tmp_path, "exit 1"))
    other = class_archive.archive_path()
    assert other is not None and other != mine
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert class_archive.archive_path() not in (mine, other)

    assert class_archive.settings() == {}
    os.makedirs(os.path.dirname(other))
    with open(class_archive.archive_path(), "wb"):
        pass
    archive = class_archive.archive_path()
    assert class_archive.settings() == {class_archive.DRIVER_OPTIONS: f"-XX:SharedArchiveFile={archive}"}

    # The driver's options in spark-defaults.conf, which the session's setting replaces, come first.
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(
        "# site settings\nspark.driver.memory 2g\nspark.driver.extraJavaOptions   -Da=1 -Db=2\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    assert class_archive.settings() == {class_archive.DRIVER_OPTIONS: f"-Da=1 -Db=2 -XX:SharedArchiveFile={archive}"}


def test_an_archive_option_is_quoted_as_spark_splits_them():
    """Spark's launcher splits spark.driver.extraJavaOptions as a shell does; a path with
    spaces runs end to end in test_prepare_makes_the_archive_once_and_a_session_maps_it."""
    require_spark()
    from warren.spark.class_archive import _option

    assert _option("-XX:SharedArchiveFile", "/c/w/a.jsa") == "-XX:SharedArchiveFile=/c/w/a.jsa"
    assert _option("-XX:SharedArchiveFile", "/my cache/it's.jsa") == "'-XX:SharedArchiveFile=/my cache/it'\\''s.jsa'"


def test_no_archive_under_a_path_spark_would_refuse(tmp_path, monkeypatch):
    """Spark's launcher refuses driver options holding "Xmx": an archive there is not offered."""
    require_spark()
    from warren.spark import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "Xmx"))
    os.makedirs(os.path.dirname(class_archive.archive_path()))
    with open(class_archive.archive_path(), "wb"):
        pass
    assert class_archive.settings() == {}
