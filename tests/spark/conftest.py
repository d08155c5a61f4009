"""Spark tests: a local[2] SparkSession with the `warren` format registered, against a real
`warren server` (tests/conftest.py). They need Java 17+ and the spark extra
(`pip install -e '.[spark]'`); without them they are skipped, unless WARREN_REQUIRE_SPARK=1
(CI sets it), which makes a missing Java or PySpark a failure."""

import os
import re
import shutil
import subprocess
import sys

import pytest

REQUIRED = os.environ.get("WARREN_REQUIRE_SPARK") == "1"


def _missing() -> str | None:
    if shutil.which("java") is None:
        return "no java on PATH (Spark needs Java 17+)"
    shown = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    version = re.search(r'version "(\d+)', shown)
    if version is None or int(version.group(1)) < 17:
        return f"Spark needs Java 17+, java on PATH says: {shown.splitlines()[0] if shown else 'nothing'}"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    return None


def require_spark() -> None:
    """Skip the test without Java or PySpark, or fail it if WARREN_REQUIRE_SPARK=1."""
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(f"WARREN_REQUIRE_SPARK=1 but {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    require_spark()
    # (no driver class archive a developer's `warren pipeline prepare` left in ~/.cache: every
    # machine runs the tests alike; tests/spark/test_class_archive.py makes its own)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    from pyspark.sql import SparkSession

    from warren.spark import fast_start, register

    builder = (SparkSession.builder.master("local[2]").appName("warren-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    for key, value in fast_start().items():  # (the tests' Python workers start through warren.spark.daemon)
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def warren_script() -> str:
    """This environment's `warren` command (a console script beside this interpreter)."""
    script = os.path.join(os.path.dirname(sys.executable), "warren")
    if not os.access(script, os.X_OK):
        pytest.fail(f"{script} is not installed (pip install -e '.[spark]' installs it)")
    return script


def bare_env(**extra: str) -> dict[str, str]:
    """An environment as cron or systemd give one: PATH without this virtual environment (only
    /usr/bin:/bin, and java's directory if it is elsewhere), so `python3` there is not this
    environment's, and no PYSPARK_* variable; HOME, JAVA_HOME, TMPDIR, XDG_CACHE_HOME and
    PYTHONPATH (the tree under test) kept."""
    path = ["/usr/bin", "/bin"]
    java = shutil.which("java")
    if java and os.path.dirname(java) not in path:
        path.append(os.path.dirname(java))
    assert os.path.dirname(sys.executable) not in path, "java shares this environment's bin directory"
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "JAVA_HOME", "TMPDIR", "XDG_CACHE_HOME", "PYTHONPATH")}
    return {**env, "PATH": os.pathsep.join(path), **extra}


def uri(broker) -> str:
    return f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"


def get_all(broker, queue) -> list[tuple]:
    """(method, properties, body) of every message of the queue, taken with basic.get."""
    import pika

    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((method, props, body))
    conn.close()
    return got


def require_dead_letters_in_streams(broker) -> None:
    """Skip on a RabbitMQ before 3.13: it drops dead letters routed to a stream (fixed by
    rabbitmq-server#7846 in 3.11/3.12) and gives stream consumers no x-death (#11173, 3.13), so
    a dead-letter stream needs Warren there (docs/spark.md, "Against RabbitMQ 3.10", says so)."""
    import pika

    conn = pika.BlockingConnection(broker.pika_params())
    server = conn._impl.server_properties
    conn.close()
    product, version = server.get("product", b""), server.get("version", b"")
    product = product.decode() if isinstance(product, bytes) else product
    version = version.decode() if isinstance(version, bytes) else version
    if product == "RabbitMQ" and tuple(int(v) for v in version.split(".")[:2]) < (3, 13):
        pytest.skip(f"RabbitMQ {version} drops dead letters routed to a stream (rabbitmq-server#7846, #11173)")
