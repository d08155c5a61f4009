"""The Prometheus endpoint (warren.mgmt.prometheus) of a real `warren server`, scraped over a
socket: values that follow the traffic, the per-object split, the port's settings, and a real
Prometheus server (Debian's `prometheus`) scraping it and answering queries about it.

Warren's own: each test starts its broker (make_broker), so they skip against RabbitMQ,
whose plugin tests/unit/test_prometheus_metrics.py compares the names with (a saved copy).
The Prometheus test needs the binary: skipped without it, except in CI (CI=true or
WARREN_REQUIRE_PROMETHEUS=1, which .ci/run sets after installing it), where it must run.
"""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pika
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port
from warren.mgmt.node_resources import sockets_limit

AMQP = (("protocol", "amqp091"),)
CLASSIC = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))


def scrape(port: int, path: str = "/metrics") -> dict:
    """{(sample name, sorted label items): value}, read with prometheus_client's parser; the
    types too, under (family name, "TYPE")."""
    r = requests.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4"  # RabbitMQ 3.10.8's
    out: dict = {}
    for family in text_string_to_metric_families(r.text):
        out[(family.name, "TYPE")] = family.type
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def wait_for(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def metrics_broker(make_broker):
    port = free_port()
    b = make_broker("--prometheus-port", str(port))
    b.metrics_port = port
    return b


def test_scraped_values_follow_the_traffic(metrics_broker, uid):
    b, port = metrics_broker, metrics_broker.metrics_port
    before = scrape(port)
    assert before[("rabbitmq_queue_messages_ready", "TYPE")] == "gauge"
    assert before[("rabbitmq_global_messages_received", "TYPE")] == "counter"
    assert before[("rabbitmq_build_info", "TYPE")] == "unknown"  # "untyped" in the text, as RabbitMQ's
    assert before[("rabbitmq_connections", ())] == 0
    queue = f"metrics-{uid}"
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue)
    for i in range(25):
        ch.basic_publish("", queue, b"x" * 100)
    during = scrape(port)
    assert during[("rabbitmq_connections", ())] == 1
    assert during[("rabbitmq_channels", ())] == 1
    assert during[("rabbitmq_process_open_tcp_sockets", ())] == 1
    assert during[("rabbitmq_queue_messages_ready", ())] == 25
    assert during[("rabbitmq_queue_messages_ready_bytes", ())] == 2500
    assert during[("rabbitmq_queues", ())] == 1
    assert during[("rabbitmq_global_messages_received_total", AMQP)] == 25
    assert during[("rabbitmq_global_messages_confirmed_total", AMQP)] == 25
    assert during[("rabbitmq_channel_messages_published_total", ())] == 25
    per_object = scrape(port, "/metrics/per-object")
    assert per_object[("rabbitmq_queue_messages_ready", (("queue", queue), ("vhost", "/")))] == 25
    assert ("rabbitmq_queue_messages_ready", ()) not in per_object
    assert ("rabbitmq_alarms_memory_used_watermark", ()) not in per_object  # as RabbitMQ's
    assert during[("rabbitmq_alarms_memory_used_watermark", ())] == 0

    got = []
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(queue, lambda c, m, p, body: got.append(m.delivery_tag))
    while len(got) < 10:
        conn.process_data_events(0.1)
    held = scrape(port)
    assert held[("rabbitmq_queue_messages_unacked", ())] == 10
    assert held[("rabbitmq_queue_messages_ready", ())] == 15
    assert held[("rabbitmq_channel_consumers", ())] == 1
    assert held[("rabbitmq_global_consumers", AMQP)] == 1
    assert held[("rabbitmq_global_messages_delivered_consume_manual_ack_total", CLASSIC)] == 10
    acked = 0
    while acked < 25:
        if len(got) > acked:
            ch.basic_ack(got[-1], multiple=True)
            acked = len(got)
        conn.process_data_events(0.05)
    conn.close()
    after = wait_for(lambda: (s := scrape(port))[("rabbitmq_connections", ())] == 0 and s)
    assert after[("rabbitmq_queue_messages", ())] == 0
    assert after[("rabbitmq_global_messages_delivered_total", CLASSIC)] == 25
    assert after[("rabbitmq_global_messages_acknowledged_total", CLASSIC)] == 25
    assert after[("rabbitmq_channel_messages_acked_total", ())] == 25  # the closed channel's too
    assert after[("rabbitmq_connections_opened_total", ())] == after[("rabbitmq_connections_closed_total", ())] == 1
    assert after[("rabbitmq_connection_incoming_bytes_total", ())] > 2500
    assert after[("process_cpu_seconds_total", ())] > 0
    assert after[("rabbitmq_process_resident_memory_bytes", ())] > 10_000_000
    assert after[("rabbitmq_resident_memory_limit_bytes", ())] > after[("rabbitmq_process_resident_memory_bytes", ())]
    assert after[("rabbitmq_disk_space_available_bytes", ())] > after[("rabbitmq_disk_space_available_limit_bytes", ())]
    assert 0 < after[("rabbitmq_process_open_fds", ())] < after[("rabbitmq_process_max_fds", ())]
    # RabbitMQ's socket limit for that fd limit, as /api/nodes gives it too.
    sockets = after[("rabbitmq_process_max_tcp_sockets", ())]
    assert sockets == sockets_limit(int(after[("rabbitmq_process_max_fds", ())])) > 0
    assert requests.get(b.api + "/nodes", auth=("guest", "guest"), timeout=10).json()[0]["sockets_total"] == sockets
    assert requests.get(f"http://127.0.0.1:{port}/metrics/detailed", timeout=10).status_code == 404
    gzipped = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert gzipped.headers["Content-Encoding"] == "gzip" and "rabbitmq_queues " in gzipped.text
    # The overview lists the endpoint as RabbitMQ lists its plugin's.
    listeners = requests.get(b.api + "/overview", auth=("guest", "guest"), timeout=10).json()["listeners"]
    assert [(x["ip_address"], x["port"]) for x in listeners if x["protocol"] == "http/prometheus"] == [
        ("127.0.0.1", port)]


def test_the_permanent_cluster_id_survives_a_restart(make_broker, restart_broker):
    """rabbitmq_identity_info's rabbitmq_cluster_permanent_id: RabbitMQ's internal_cluster_id
    global parameter, made at the first start and kept with the definitions in the data dir."""
    port = free_port()
    b = make_broker("--prometheus-port", str(port))

    def identity() -> dict:
        [labels] = [key[1] for key in scrape(port) if key[0] == "rabbitmq_identity_info" and key[1] != "TYPE"]
        return dict(labels)

    first = identity()["rabbitmq_cluster_permanent_id"]
    assert re.fullmatch(r"rabbitmq-cluster-id-[A-Za-z0-9_-]{22}", first)
    assert requests.get(b.api + "/global-parameters/internal_cluster_id", auth=("guest", "guest"),
                        timeout=10).json() == {"name": "internal_cluster_id", "value": first}
    b = restart_broker(b, "--prometheus-port", str(port))
    assert identity() == {"rabbitmq_node": "warren@localhost", "rabbitmq_cluster": "warren@localhost",
                          "rabbitmq_cluster_permanent_id": first}


def test_the_config_file_keys(make_broker, tmp_path):
    port = free_port()
    config = tmp_path / "rabbitmq.conf"
    config.write_text(f"prometheus.tcp.port = {port}\nprometheus.tcp.ip = 127.0.0.1\n"
                      "prometheus.return_per_object_metrics = true\n")
    make_broker("--config", str(config))
    assert ("rabbitmq_queues", ()) in scrape(port)
    assert ("rabbitmq_queue_messages_ready", ()) not in scrape(port)  # per object, with no queue


def test_port_zero_turns_it_off_and_a_taken_port_stops_the_start(make_broker, tmp_path):
    b = make_broker("--prometheus-port", "0")
    assert "Prometheus" not in b.log()
    listeners = requests.get(b.api + "/overview", auth=("guest", "guest"), timeout=10).json()["listeners"]
    assert not [x for x in listeners if x["protocol"] == "http/prometheus"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "warren", "server", "--port", str(free_port()),
                                 "--management-port", "0", "--prometheus-port", str(port),
                                 "--data-dir", str(tmp_path / "data")],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"warren: cannot listen for Prometheus on 127.0.0.1:{port}: Address already in use" in result.stderr


def test_the_default_port_taken_is_only_logged(make_broker):
    """15692 when nobody chose it: another broker on the machine may hold it (this test holds
    it, or another broker of the suite does)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker's (a TIME_WAIT is no listener)
    try:
        holder.bind(("127.0.0.1", 15692))
        holder.listen()
    except OSError:
        pass  # another listener has it
    try:
        b = make_broker(default_prometheus=True)
        assert wait_for(lambda: "Prometheus metrics not served: cannot listen on 127.0.0.1:15692" in b.log(), 5)
    finally:
        holder.close()


# ------------------------------------------------------------------------ a real Prometheus
def prometheus_binary() -> str:
    binary = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if binary is None:
        if os.environ.get("CI") == "true" or os.environ.get("WARREN_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("the prometheus binary is missing (.ci/run installs Debian's prometheus package)")
        pytest.skip("no prometheus binary (apt-get install prometheus); CI installs it and runs this test")
    return binary


SCRAPE_INTERVAL = 0.5  # seconds: rate() over the last two samples has data a second after the first


def scrape_config(target: str) -> str:
    """docs/prometheus.md's prometheus.yml ("A scrape configuration") for the endpoint at target (host:port), scraped every
    SCRAPE_INTERVAL: /metrics (what the RabbitMQ-Overview dashboard reads) and
    /metrics/per-object as an instance of its own without rabbitmq_identity_info, so the
    dashboard, which joins every metric with it on instance, counts the node once."""
    return f"""global:
  scrape_interval: {SCRAPE_INTERVAL * 1000:.0f}ms
  scrape_timeout: {SCRAPE_INTERVAL * 1000:.0f}ms
scrape_configs:
  - job_name: warren
    static_configs:
      - targets: ['{target}']
  - job_name: warren-per-object
    metrics_path: /metrics/per-object
    static_configs:
      - targets: ['{target}']
    relabel_configs:
      - target_label: instance
        replacement: warren-per-object
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: rabbitmq_identity_info
        action: drop
"""


class Prometheus:
    """Debian's `prometheus` on a free loopback port with a scrape configuration, in a temp dir,
    asked through its HTTP API. Prometheus 2.42 starts scraping some 5 s after it starts (its
    scrape manager takes new targets every 5 s): start it first, the broker and its traffic
    meanwhile."""

    def __init__(self, binary: str, config: str):
        self.workdir = tempfile.mkdtemp(prefix="warren-prometheus-")
        pathlib.Path(self.workdir, "prometheus.yml").write_text(config)
        web = free_port()
        self.api = f"http://127.0.0.1:{web}/api/v1"
        self.log = open(os.path.join(self.workdir, "prometheus.log"), "wb")
        self.proc = subprocess.Popen([binary, f"--config.file={self.workdir}/prometheus.yml",
                                      f"--storage.tsdb.path={self.workdir}/data", f"--web.listen-address=127.0.0.1:{web}",
                                      "--log.level=warn"], stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params):
        """The `data` of GET /api/v1/PATH, None while it is not listening yet or on an error."""
        try:
            r = requests.get(self.api + path, params=params, timeout=5)
        except requests.ConnectionError:
            assert self.proc.poll() is None, pathlib.Path(self.workdir, "prometheus.log").read_text()
            return None
        return r.json()["data"] if r.status_code == 200 else None

    def query(self, expr: str) -> list:
        data = self.get("/query", query=expr)
        return data["result"] if data else []

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def prometheus():
    """Start a Prometheus scraping the endpoint at host:port (scrape_config); stopped after the
    test. Needs the binary: skipped without it, except in CI."""
    binary = prometheus_binary()
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        started.append(Prometheus(binary, scrape_config(target)))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_a_real_prometheus_scrapes_it(make_broker, prometheus, uid):
    port = free_port()
    prom = prometheus(f"127.0.0.1:{port}")
    b = make_broker("--prometheus-port", str(port))
    queue = f"scraped-{uid}"
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        for _ in range(7):
            ch.basic_publish("", queue, b"m")
        # Both jobs up, and the gauge as the RabbitMQ-Overview dashboard asks for it (joined
        # with the node's identity, by cluster name: /metrics only, the per-object job has no
        # identity).
        assert wait_for(lambda: prom.value('sum(up{job=~"warren.*"})') == 2, 20), prom.query("up")
        ready = ('sum(rabbitmq_queue_messages_ready * on(instance) group_left(rabbitmq_cluster) '
                 'rabbitmq_identity_info{rabbitmq_cluster="warren@localhost", namespace=""})')
        assert wait_for(lambda: prom.value(ready) == 7, 10), prom.query(ready)
        per_queue = f'rabbitmq_queue_messages_ready{{job="warren-per-object",queue="{queue}",vhost="/"}}'
        assert wait_for(lambda: prom.value(per_queue) == 7, 10), prom.query(per_queue)
        for _ in range(3):
            ch.basic_publish("", queue, b"m")
        received = 'rabbitmq_global_messages_received_total{job="warren",protocol="amqp091"}'
        assert wait_for(lambda: prom.value(received) == 10, 10), prom.query(received)
        assert prom.value('rabbitmq_connections{job="warren"}') == 1
        assert prom.value('rabbitmq_resident_memory_limit_bytes{job="warren"} - '
                          'rabbitmq_process_resident_memory_bytes{job="warren"}') > 0
        nodes = prom.query('rabbitmq_build_info * on(instance) group_left(rabbitmq_cluster, rabbitmq_node) '
                           'rabbitmq_identity_info')
        assert [(n["metric"]["rabbitmq_node"], n["metric"]["rabbitmq_version"]) for n in nodes] == [
            ("warren@localhost", "3.10.8")]
    finally:
        conn.close()
