#!/usr/bin/env python3
"""Run the client libraries' own upstream integration suites against Warren.

kombu's `t/integration/test_py_amqp.py` (py-amqp transport), aiormq's `tests/` and
aio-pika's `tests/` come from their PyPI sdists (by default the versions installed
here; --kombu-version, --aiormq-version, --aio-pika-version pick others), are
extracted into a temp dir and run with pytest against a Warren broker this script
starts (`python -m warren server` on free ports, temp data dir, management API on),
or against --broker HOST:PORT. With --rabbitmq the same suites also run against a
private RabbitMQ node (tools/rabbitmq_node.py) and the tests that fail on Warren but
pass on RabbitMQ are listed. --select runs only the given pytest node ids (or files);
each suite runs those in its own sources and is skipped when there are none.

Missing test dependencies (pytest, aiomisc-pytest, shortuuid, ...) are pip-installed
into the current environment, and the script says which. Standard library + pip only;
not run in CI.

How each suite finds the broker:
- kombu: RABBITMQ_HOST and RABBITMQ_5672_TCP (see t/integration/test_py_amqp.py).
- aiormq: AMQP_URL, read by the repository's root conftest.py, which the sdist does
  not ship; we write an equivalent one (fixtures rabbitmq_container, amqp_direct_url).
  Its amqps/TLS tests need a TLS listener with its tests/certs: deselected here
  (listed as "not run"), run by --tls.
- aio-pika: AMQP_URL too. Its tests/conftest.py refuses to start without docker
  (pytest_configure) and starts the mosquito/aiormq-rabbitmq image in the fixture
  rabbitmq_container; we append overrides of both to the extracted copy, taking the
  broker from AMQP_URL. tests/test_robust_recovery.py starts a private container per
  test (fixture recovery_broker); the override hands it the same broker, so its
  proxy-only cases (tcp_fin, tcp_reset, heartbeat, missing external queue) run, while
  those that stop or kill the broker through docker are deselected, as is
  tests/test_amqps.py (TLS on 5671; --tls runs it).

Every test has a time limit (--test-timeout, 60 s by default), so a test waiting for
a message that never comes fails instead of stalling the run: pytest-timeout for kombu;
for aiormq and aio-pika aiomisc-pytest's --aiomisc-test-timeout, which cancels the
test coroutine (pytest-timeout's SIGALRM handler never runs while uvloop waits; it
stays on, at twice the limit, for their sync tests).

kombu's `flaky(reruns=5)` markers are disabled (-p no:rerunfailures) so that a
difference shows instead of being retried away.

TLS (--tls): the libraries' own TLS tests instead, each against a broker with a TLS
listener set up as the library's CI sets up its RabbitMQ, with the library's certificates:
- py-amqp (the `amqp` sdist): t/integration/test_rmq.py's TLS tests (`-E rabbitmq -k tls`:
  test_connect[tls], test_tls_connect_fails, test_rabbitmq_operations' [tls-*] cases).
  Its CI builds a `rabbitmq:tls` image from the repository's Dockerfile (server certificate
  and key inline: verify_peer, fail_if_no_peer_cert = true, loopback_users = none) and the
  tests read t/certs/; neither is in the sdist, so they are in tools/upstream_certs/py-amqp/
  (copied from github.com/celery/py-amqp). The repository's root conftest.py (the -E
  option) is not in the sdist either; we write it. test_tls_default_certs and
  test_tls_no_default_certs_fails connect to tls-v1-2.badssl.com:1012 on the internet, not
  to a broker: not run.
- aiormq: the tests its plain run leaves out (the amqps and amqps-client cases of the
  amqp_url fixture, test_ssl_*, test_auth_external), against a broker set up as its test
  image (tests/certs/Dockerfile, tests/certs/rabbitmq.conf: tests/certs' ca.pem, server.pem,
  server.key; verify_peer, fail_if_no_peer_cert = false).
- aio-pika: tests/test_amqps.py, against the same broker (its CI runs aiormq's image,
  mosquito/aiormq-rabbitmq, so the certificates come from the aiormq sdist).
  test_default_context connects to port 5671 of the test host, where upstream's container
  (mapped to random ports) has nothing, so it passes on "connection refused"; we point it
  at the TLS listener, where it has to fail on the certificate instead.
The TLS port reaches the tests as RABBITMQ_5671_TCP (py-amqp) or WARREN_AMQPS_PORT (the
rabbitmq_container fixtures of aiormq and aio-pika), the listener is on 127.0.0.1.

    python3 tools/upstream_suites.py                 # all three suites against Warren
    python3 tools/upstream_suites.py --rabbitmq      # ... and RabbitMQ, compared
    python3 tools/upstream_suites.py --suite aiormq --broker 127.0.0.1:5672
    python3 tools/upstream_suites.py --suite aio-pika \
        --select tests/test_amqp.py::TestCaseAmqp::test_dlx
    python3 tools/upstream_suites.py --tls --rabbitmq  # the TLS tests, on both brokers
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Suite -> the PyPI distribution whose sdist holds its tests.
DIST = {"kombu": "kombu", "py-amqp": "amqp", "aiormq": "aiormq", "aio-pika": "aio-pika"}

# Distribution name -> requirement to install when it is missing.
TEST_DEPS = {
    "kombu": {"pytest": "pytest", "amqp": "amqp"},
    "py-amqp": {"pytest": "pytest", "amqp": "amqp"},
    "aiormq": {"pytest": "pytest", "aiomisc-pytest": "aiomisc-pytest>=2,<3",
               "yarl": "yarl", "pamqp": "pamqp"},
    "aio-pika": {"pytest": "pytest", "aiomisc": "aiomisc",
                 "aiomisc-pytest": "aiomisc-pytest>=2,<3", "shortuuid": "shortuuid",
                 "yarl": "yarl", "aiormq": "aiormq", "pamqp": "pamqp"},
}
SUITES = ["kombu", "aiormq", "aio-pika"]
TLS_SUITES = ["py-amqp", "aiormq", "aio-pika"]

# aiormq tests that need TLS on 5671 with tests/certs (the upstream docker image).
AIORMQ_DESELECT_K = "not amqps and not test_ssl_ and not test_auth_external"

# The root conftest.py of the aiormq repository is not in the sdist; this stands in
# for it, with the broker taken from AMQP_URL only (no docker).
AIORMQ_CONFTEST = '''\
"""Written by warren tools/upstream_suites.py: the broker comes from AMQP_URL."""
import os
from dataclasses import dataclass, field

import pytest
from yarl import URL


@dataclass
class ContainerInfo:
    id: str
    host: str
    ports: dict = field(default_factory=dict)


@pytest.fixture(scope="session")
def rabbitmq_container():
    url = URL(os.environ["AMQP_URL"])
    return ContainerInfo(id="external", host=url.host or "localhost", ports={
        "5672/tcp": url.port or 5672,
        "5671/tcp": int(os.environ.get("WARREN_AMQPS_PORT", "5671")),
        "15672/tcp": 15672, "15671/tcp": 15671})


@pytest.fixture(scope="session")
def amqp_direct_url(rabbitmq_container):
    return URL.build(scheme="amqp", user="guest", password="guest", path="//",
                     host=rabbitmq_container.host,
                     port=rabbitmq_container.ports["5672/tcp"])


@pytest.fixture(autouse=True)
def _warren_test_timeout(aiomisc_test_timeout):
    """aiomisc-pytest bounds a test by --aiomisc-test-timeout only when the test
    requests this fixture; requested here, every async test gets it."""
    return aiomisc_test_timeout
'''

# Appended to aio-pika's tests/conftest.py: a later definition of a module-level name
# replaces the earlier one, so these take the place of the docker check and container.
AIO_PIKA_CONFTEST = '''

# --- appended by warren tools/upstream_suites.py: the broker comes from AMQP_URL ---
import os as _os


def pytest_configure(config):
    """No docker needed."""


@pytest.fixture(scope="session")
def docker():
    pytest.skip("needs docker (warren tools/upstream_suites.py: AMQP_URL only)")


@pytest.fixture(scope="session")
def rabbitmq_container():
    url = URL(_os.environ["AMQP_URL"])
    return ContainerInfo(id="external", host=url.host or "localhost",
                         ports={"5672/tcp": url.port or 5672,
                                "5671/tcp": int(_os.environ.get("WARREN_AMQPS_PORT", "5671"))})


@pytest.fixture(autouse=True)
def _warren_test_timeout(aiomisc_test_timeout):
    """aiomisc-pytest bounds a test by --aiomisc-test-timeout only when the test
    requests this fixture; requested here, every async test gets it."""
    return aiomisc_test_timeout
'''

# Appended to aio-pika's tests/test_robust_recovery.py: its per-test container becomes
# the broker under test (reached through the test's own TCPProxy, as upstream).
AIO_PIKA_RECOVERY = '''

# --- appended by warren tools/upstream_suites.py: the broker comes from AMQP_URL ---
@pytest.fixture
async def recovery_broker():
    import os
    url = URL(os.environ["AMQP_URL"]).with_query({})
    yield None, None, url
'''

# aio-pika tests that need docker to stop, kill or restart the broker, or TLS on 5671.
AIO_PIKA_DESELECT = [
    "tests/test_robust_recovery.py::test_restore_topology_and_consumers[stop_app]",
    "tests/test_robust_recovery.py::test_restore_topology_and_consumers[kill]",
    "tests/test_robust_recovery.py::test_pool_consumer_survives_broker_restart",
]
AIO_PIKA_IGNORE = ["tests/test_amqps.py"]

# --- TLS (--tls) ---

# aiormq's TLS tests: those its plain run deselects.
AIORMQ_TLS_K = f"not ({AIORMQ_DESELECT_K})"

# py-amqp's TLS tests; the two badssl ones connect to tls-v1-2.badssl.com:1012 (internet).
PY_AMQP_TLS_K = "tls and not default_certs"
PY_AMQP_NOT_RUN = ["t/integration/test_rmq.py::test_tls_default_certs",
                   "t/integration/test_rmq.py::test_tls_no_default_certs_fails"]

# The root conftest.py of the py-amqp repository (not in the sdist): -E NAME runs the
# tests marked env(NAME), its CI passes -E rabbitmq.
PY_AMQP_CONFTEST = '''\
"""Written by warren tools/upstream_suites.py, as py-amqp's own root conftest.py."""
import pytest


def pytest_addoption(parser):
    parser.addoption("-E", action="store", metavar="NAME",
                     help="only run tests matching the environment NAME.")


def pytest_configure(config):
    config.addinivalue_line("markers", "env(name): mark test to run only on named environment")


def pytest_runtest_setup(item):
    envnames = [mark.args[0] for mark in item.iter_markers(name="env")]
    if envnames:
        if item.config.getoption("-E") not in envnames:
            pytest.skip("test requires env in %r" % envnames)
'''

# aio-pika's test_default_context connects to port 5671 of the test host: upstream's
# container has its ports elsewhere, so nothing answers there and the test passes on the
# refused connection. It is pointed at the TLS listener instead.
AIO_PIKA_AMQPS = '''

# --- appended by warren tools/upstream_suites.py: 5671 is the broker's TLS listener ---
import os as _os
_WARREN_AMQPS_PORT = int(_os.environ.get("WARREN_AMQPS_PORT", "5671"))
'''

PY_AMQP_CERTS = os.path.join(HERE, "upstream_certs", "py-amqp")


@dataclass
class TLSSetup:
    """A broker's TLS listener as a library's CI sets it up, and the suites it serves."""
    name: str
    cacertfile: str
    certfile: str
    keyfile: str
    options: list[str]  # the rest of that CI broker's rabbitmq.conf that matters here
    suites: list[str]

    def conf(self, tls_port: int) -> list[str]:
        return [f"listeners.ssl.default = 127.0.0.1:{tls_port}",
                f"ssl_options.cacertfile = {self.cacertfile}",
                f"ssl_options.certfile = {self.certfile}",
                f"ssl_options.keyfile = {self.keyfile}", *self.options]


def tls_setups(suites: list[str], srcs: dict[str, str]) -> list[TLSSetup]:
    out = []
    if "py-amqp" in suites:
        # py-amqp's Dockerfile (the rabbitmq:tls image of its CI)
        out.append(TLSSetup(
            "py-amqp", os.path.join(PY_AMQP_CERTS, "ca_certificate.pem"),
            os.path.join(PY_AMQP_CERTS, "server_certificate.pem"),
            os.path.join(PY_AMQP_CERTS, "server_key.pem"),
            ["loopback_users = none", "ssl_options.verify = verify_peer",
             "ssl_options.fail_if_no_peer_cert = true"], ["py-amqp"]))
    rest = [s for s in suites if s in ("aiormq", "aio-pika")]
    if rest:
        # aiormq's tests/certs/Dockerfile and rabbitmq.conf (mosquito/aiormq-rabbitmq)
        certs = os.path.join(srcs["aiormq-certs"], "tests", "certs")
        out.append(TLSSetup(
            "aiormq", os.path.join(certs, "ca.pem"), os.path.join(certs, "server.pem"),
            os.path.join(certs, "server.key"),
            ["ssl_options.verify = verify_peer", "ssl_options.fail_if_no_peer_cert = false"],
            rest))
    return out


def log(msg: str) -> None:
    print(f"[upstream] {msg}", file=sys.stderr, flush=True)


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, proc: subprocess.Popen | None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with status {proc.returncode}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout}s")


# --- sources and dependencies ---------------------------------------------------

def fetch_sdist(dist: str, version: str, dest: str) -> str:
    """Download and extract the sdist; return the extracted source directory."""
    # --no-binary for this project only: with :all: pip would also build the build
    # backend's own dependencies from source (aiormq's needs maturin, i.e. cargo).
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--no-binary", dist, f"{dist}=={version}", "-d", dest], check=True)
    prefix = f"{dist.replace('-', '_')}-{version}".lower()
    names = [n for n in os.listdir(dest) if n.lower().startswith(prefix.replace("_", "-"))
             or n.lower().startswith(prefix)]
    archive = next(os.path.join(dest, n) for n in names if n.endswith((".tar.gz", ".zip")))
    with tarfile.open(archive) as tf:
        top = tf.getnames()[0].split("/")[0]
        if sys.version_info >= (3, 12):
            tf.extractall(dest, filter="data")
        else:
            tf.extractall(dest)
    return os.path.join(dest, top)


def ensure_deps(suites: list[str]) -> None:
    missing: dict[str, str] = {}
    for suite in suites:
        for dist, req in TEST_DEPS[suite].items():
            if installed_version(dist) is None:
                missing[dist] = req
    if not missing:
        log("test dependencies: all present")
        return
    log("installing missing test dependencies: " + ", ".join(missing.values()))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing.values()], check=True)


# --- brokers --------------------------------------------------------------------

@dataclass
class Endpoint:
    host: str
    port: int
    tls_port: int | None = None


@contextlib.contextmanager
def warren_broker(keep: bool, tls: TLSSetup | None = None) -> Iterator[Endpoint]:
    data_dir = tempfile.mkdtemp(prefix="warren-upstream-")
    port, mgmt = free_port(), free_port()
    tls_port = free_port() if tls else None
    log_path = os.path.join(data_dir, "broker.log")
    config = []
    if tls and tls_port:
        conf_path = os.path.join(data_dir, "rabbitmq.conf")
        with open(conf_path, "w") as f:
            f.write("".join(line + "\n" for line in tls.conf(tls_port)))
        config = ["--config", conf_path]
    with open(log_path, "ab") as logf:
        # Run the tree this script belongs to, whatever the current directory is.
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(
            [sys.executable, "-m", "warren", "server", "--host", "127.0.0.1", "--port",
             str(port), "--data-dir", data_dir, "--management-port", str(mgmt), *config],
            stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_port("127.0.0.1", port, proc)
        if tls_port:
            wait_port("127.0.0.1", tls_port, proc)
        log(f"Warren on 127.0.0.1:{port}" + (f", TLS {tls_port} ({tls.name}'s certificates)"
                                             if tls else "")
            + f" (management {mgmt}, log {log_path})")
        yield Endpoint("127.0.0.1", port, tls_port)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def rabbitmq_broker(tls: TLSSetup | None = None) -> Iterator[Endpoint]:
    sys.path.insert(0, HERE)
    from rabbitmq_node import RabbitMQNode
    tls_port = free_port() if tls else None
    with RabbitMQNode(conf=tls.conf(tls_port) if tls and tls_port else ()) as node:
        if tls_port:
            wait_port(node.host, tls_port, None)
        log(f"RabbitMQ {node.version} on {node.host}:{node.port}"
            + (f", TLS {tls_port} ({tls.name}'s certificates)" if tls else ""))
        yield Endpoint(node.host, node.port, tls_port)


@contextlib.contextmanager
def external_broker(spec: str, tls: TLSSetup | None = None) -> Iterator[Endpoint]:
    host, _, port = spec.rpartition(":")
    yield Endpoint(host or "127.0.0.1", int(port))


# --- running and reporting -------------------------------------------------------

@dataclass
class Result:
    suite: str
    broker: str
    status: int = 0
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def node_id(src: str, cls: str, name: str) -> str:
    """pytest's node id (path::Class::test) from junit's dotted classname, to re-run it."""
    parts = cls.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if os.path.exists(os.path.join(src, path)):
            return "::".join([path, *parts[i:], name])
    return f"{cls}::{name}"


def parse_junit(path: str, src: str, res: Result) -> None:
    if not os.path.exists(path):
        return
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        tid = node_id(src, cls, name)
        if case.find("failure") is not None or case.find("error") is not None:
            res.failed.append(tid)
        elif case.find("skipped") is not None:
            res.skipped.append(tid)
        else:
            res.passed.append(tid)
    # a teardown error is reported as a second <testcase> of a test that passed
    res.passed = [t for t in dict.fromkeys(res.passed) if t not in res.failed]
    res.failed = list(dict.fromkeys(res.failed))


def patch_once(path: str, text: str) -> None:
    """Append text to an extracted source file, once (suites run once per broker)."""
    with open(path) as f:
        if text in f.read():
            return
    with open(path, "a") as f:
        f.write(text)


def selected(src: str, select: list[str]) -> list[str]:
    """The --select node ids whose file is in this suite's sources."""
    return [t for t in select if os.path.isfile(os.path.join(src, t.split("::")[0]))
            or os.path.isdir(os.path.join(src, t))]


def run_suite(suite: str, src: str, ep: Endpoint, broker: str, args) -> Result:
    res = Result(suite, broker)
    host, port = ep.host, ep.port
    junit = os.path.join(src, f"junit-{broker}.xml")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-p", "no:rerunfailures", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if installed_version("pytest-timeout"):
        # pytest-timeout's SIGALRM does not stop a test blocked in uvloop (its handler
        # never runs), so for the aiomisc-pytest suites aiormq and aio-pika it is only
        # a backstop for sync tests: --aiomisc-test-timeout below cancels the test
        # coroutine first.
        limit = args.test_timeout * (1 if suite in ("kombu", "py-amqp") else 2)
        cmd += ["-p", "timeout", f"--timeout={limit}"]
    if ep.tls_port:
        env["WARREN_AMQPS_PORT"] = str(ep.tls_port)
    if suite == "py-amqp":
        # as py-amqp's CI (tox-docker): RABBITMQ_HOST, RABBITMQ_5672_TCP, RABBITMQ_5671_TCP
        env.update(RABBITMQ_HOST=host, RABBITMQ_5672_TCP=str(port),
                   RABBITMQ_5671_TCP=str(ep.tls_port))
        with open(os.path.join(src, "conftest.py"), "w") as f:
            f.write(PY_AMQP_CONFTEST)
        shutil.copytree(PY_AMQP_CERTS, os.path.join(src, "t", "certs"), dirs_exist_ok=True)
        paths = selected(src, args.select) or ["t/integration/test_rmq.py"]
        cmd += [*paths, "-o", "testpaths=", "-E", "rabbitmq", "-k", PY_AMQP_TLS_K]
    elif suite == "kombu":
        env.update(RABBITMQ_HOST=host, RABBITMQ_5672_TCP=str(port))
        # the sdist's setup.cfg points testpaths at t/unit; name the file instead
        paths = selected(src, args.select) or ["t/integration/test_py_amqp.py"]
        cmd += [*paths, "-o", "testpaths="]
    elif suite == "aiormq":
        env["AMQP_URL"] = f"amqp://guest:guest@{host}:{port}//"
        with open(os.path.join(src, "conftest.py"), "w") as f:
            f.write(AIORMQ_CONFTEST)
        paths = selected(src, args.select) or ["tests"]
        cmd += [f"--aiomisc-test-timeout={args.test_timeout}"]
        cmd += [*paths, "-k", AIORMQ_TLS_K if args.tls else AIORMQ_DESELECT_K]
    else:
        env["AMQP_URL"] = f"amqp://guest:guest@{host}:{port}//"
        patch_once(os.path.join(src, "tests", "conftest.py"), AIO_PIKA_CONFTEST)
        patch_once(os.path.join(src, "tests", "test_robust_recovery.py"), AIO_PIKA_RECOVERY)
        cmd += [f"--aiomisc-test-timeout={args.test_timeout}"]
        if args.tls:
            amqps = os.path.join(src, "tests", "test_amqps.py")
            with open(amqps) as f:
                text = f.read()
            if "_WARREN_AMQPS_PORT" not in text:
                with open(amqps, "w") as f:
                    f.write(text.replace(".with_port(5671)", ".with_port(_WARREN_AMQPS_PORT)")
                            + AIO_PIKA_AMQPS)
            cmd += selected(src, args.select) or AIO_PIKA_IGNORE
        else:
            paths = selected(src, args.select) or ["tests"]
            cmd += [*paths, *(f"--ignore={p}" for p in AIO_PIKA_IGNORE),
                    *(f"--deselect={t}" for t in AIO_PIKA_DESELECT)]
    if args.select and not selected(src, args.select):
        log(f"{suite}: none of --select is in its sources, not run")
        res.status = 5  # pytest's "no tests collected"
        return res
    cmd += args.pytest_args
    log(f"{suite} against {broker}: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    out = os.path.join(src, f"pytest-{broker}.log")
    with open(out, "w") as f:
        try:
            res.status = subprocess.run(cmd, cwd=src, env=env, stdout=f, stderr=subprocess.STDOUT,
                                        timeout=args.suite_timeout).returncode
        except subprocess.TimeoutExpired:
            res.status = -1
            log(f"{suite} against {broker}: timed out after {args.suite_timeout}s")
    res.seconds = time.monotonic() - t0
    parse_junit(junit, src, res)
    log(f"pytest output: {out}")
    return res


def print_result(res: Result) -> None:
    print(f"\n== {res.suite} on {res.broker}: {len(res.passed)} passed, {len(res.failed)} failed, "
          f"{len(res.skipped)} skipped ({res.seconds:.0f}s, pytest status {res.status})")
    for tid in res.failed:
        print(f"   FAIL {tid}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=[*DIST, "all"], default="all",
                    help="one suite (py-amqp: --tls only, kombu: not with --tls)")
    ap.add_argument("--tls", action="store_true",
                    help="run the libraries' TLS tests (py-amqp, aiormq, aio-pika) against "
                         "brokers with TLS listeners and the libraries' certificates")
    ap.add_argument("--kombu-version", default=installed_version("kombu"))
    ap.add_argument("--py-amqp-version", default=installed_version("amqp"),
                    help="version of the amqp sdist (py-amqp)")
    ap.add_argument("--aiormq-version", default=installed_version("aiormq"))
    ap.add_argument("--aio-pika-version", default=installed_version("aio-pika"))
    ap.add_argument("--broker", metavar="HOST:PORT",
                    help="run against this broker instead of starting Warren")
    ap.add_argument("--rabbitmq", action="store_true",
                    help="also run against a private RabbitMQ node and compare")
    ap.add_argument("--workdir", help="extract the sdists here and keep them (default: temp dir)")
    ap.add_argument("--test-timeout", type=int, default=60, help="per test, seconds")
    ap.add_argument("--suite-timeout", type=int, default=1800, help="per suite run, seconds")
    ap.add_argument("--select", nargs="+", default=[], metavar="NODEID",
                    help="run only these tests or files (pytest node ids; each suite "
                         "runs those in its sources, a suite with none is not run)")
    ap.add_argument("--count", type=int, default=1, help="run each suite this many times")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    modes = TLS_SUITES if args.tls else SUITES
    suites = modes if args.suite == "all" else [args.suite]
    if args.suite not in ("all", *modes):
        ap.error(f"--suite {args.suite} " + ("has no TLS tests" if args.tls else "needs --tls"))
    if args.tls and args.broker:
        ap.error("--tls starts its brokers itself, with the libraries' certificates")
    versions = {s: getattr(args, f"{s.replace('-', '_')}_version") for s in suites}
    for s in suites:
        if not versions[s]:
            ap.error(f"{s} is not installed here: give --{s}-version")
    if args.tls and "aio-pika" in suites and not args.aiormq_version:
        ap.error("aio-pika's TLS tests need aiormq's certificates: give --aiormq-version")

    ensure_deps(suites)
    work = args.workdir or tempfile.mkdtemp(prefix="warren-upstream-src-")
    os.makedirs(work, exist_ok=True)
    try:
        srcs = {s: fetch_sdist(DIST[s], versions[s], work) for s in suites}
        for s, src in srcs.items():
            log(f"{s} {versions[s]} sources in {src}")
        setups: list[TLSSetup | None] = [None]
        if args.tls:
            if "aiormq" in srcs:
                srcs["aiormq-certs"] = srcs["aiormq"]
            elif "aio-pika" in suites:
                srcs["aiormq-certs"] = fetch_sdist("aiormq", args.aiormq_version, work)
            setups = list(tls_setups(suites, srcs))

        targets = [("warren" if not args.broker else "external",
                    (lambda tls: external_broker(args.broker, tls)) if args.broker
                    else (lambda tls: warren_broker(bool(args.workdir), tls)))]
        if args.rabbitmq:
            targets.append(("rabbitmq", rabbitmq_broker))
        results: dict[tuple[str, str], Result] = {}
        for name, make in targets:
            for setup in setups:
                with make(setup) as ep:
                    for s in (setup.suites if setup else suites):
                        for i in range(args.count):
                            res = run_suite(s, srcs[s], ep, name, args)
                            if i == 0:
                                results[(s, name)] = res
                            else:  # a test counts as failed if it failed in any round
                                merged = results[(s, name)]
                                merged.failed += [t for t in res.failed if t not in merged.failed]
                                merged.passed = [t for t in merged.passed if t not in merged.failed]
                                merged.seconds += res.seconds
                                merged.status = merged.status or res.status

        if args.tls:
            if "py-amqp" in suites:
                print("\n(py-amqp: not run on any broker, they connect to tls-v1-2.badssl.com "
                      "on the internet: " + ", ".join(PY_AMQP_NOT_RUN) + ")")
            if "aiormq" in suites:
                print(f"(aiormq: its TLS tests, -k '{AIORMQ_TLS_K}')")
        else:
            if "aiormq" in suites:
                print(f"\n(aiormq: not run on any broker, TLS only (--tls runs them): "
                      f"-k '{AIORMQ_DESELECT_K}')")
            if "aio-pika" in suites:
                print("(aio-pika: not run on any broker, TLS (--tls runs it) or broker "
                      "restarts through docker: " + ", ".join(AIO_PIKA_IGNORE + AIO_PIKA_DESELECT)
                      + ")")
        for res in results.values():
            print_result(res)
        failed = False
        for s in suites:
            first = results[(s, targets[0][0])]
            failed |= bool(first.failed) or first.status not in (0, 5)
            if args.rabbitmq:
                rmq = results[(s, "rabbitmq")]
                ok_rmq = set(rmq.passed) | set(rmq.skipped)
                diff = [t for t in first.failed if t in ok_rmq]
                print(f"\n== {s}: fail on {targets[0][0]} but pass on RabbitMQ: {len(diff)}")
                for tid in diff:
                    print(f"   {tid}")
                also = [t for t in first.failed if t in rmq.failed]
                if also:
                    print(f"   (fail on both: {', '.join(also)})")
        return 1 if failed else 0
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
