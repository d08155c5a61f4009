"""RabbitMQ's Grafana dashboard "RabbitMQ-Overview" (grafana.com 10991, RabbitMQ 3.10.8's copy in
tests/data, see its LICENSE note) against a real Prometheus (Debian's, test_prometheus's
helpers) scraping the broker's metrics endpoint while a publisher and a consumer run: every
query of every panel, rows' panels included, and of the templating variables, with the
variables substituted as Grafana substitutes them, must return data.

Against Warren, a broker started here. Against RabbitMQ (WARREN_TEST_BROKER), the node's
rabbitmq_prometheus endpoint, WARREN_TEST_PROMETHEUS=host:port (tools/rabbitmq_node.py sets it
with --plugins rabbitmq_prometheus), else skipped: the same test shows the dashboard's
expectations are RabbitMQ's.
"""

import json
import os
import pathlib
import re
import threading
import time

import pika
import pytest
import requests

from conftest import EXTERNAL, free_port

from .test_prometheus import SCRAPE_INTERVAL, Prometheus, prometheus  # noqa: F401  (prometheus: the fixture)

DASHBOARD = pathlib.Path(__file__).parent.parent / "data" / "rabbitmq-3.10.8-grafana-RabbitMQ-Overview.json"

# Panels that show nothing on a single node, with the reason (docs/prometheus.md's list too): none,
# every panel of the 3.10.8 dashboard has data on one node.
NO_DATA_ON_ONE_NODE: dict[str, str] = {}

# The dashboard's time range (its "time": now-15m to now) and, as a Grafana Prometheus data
# source whose "Scrape interval" is set to Prometheus's, the smallest step: Grafana's $__interval
# is the range over the panel's maxDataPoints (its width in pixels if unset: about 1000 for a
# wide panel), at least that.
RANGE = 15 * 60
DEFAULT_MAX_DATA_POINTS = 1000
MIN_INTERVAL = max(1.0, SCRAPE_INTERVAL)  # (Grafana's scrape interval setting takes whole seconds)

# Prometheus 2.42's Accept header: OpenMetrics first. RabbitMQ 3.10.8 answers in the text format.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def panels(items: list) -> list[dict]:
    """Every panel, the panels of rows (collapsed rows hold theirs) included."""
    out = []
    for panel in items:
        out.append(panel)
        out.extend(panels(panel.get("panels", [])))
    return out


def queries(dashboard: dict) -> list[tuple[str, dict, dict]]:
    """(name, panel, target) of every query Grafana runs for the dashboard's panels."""
    return [(f"{panel.get('title') or panel['type']} ({panel['id']}{target.get('refId', '')})", panel, target)
            for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])
            if target.get("expr") and not target.get("hide")]


def escape(value: str) -> str:
    """Grafana's prometheusRegularEscape, for a variable that is neither multi nor includeAll."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name = next(g for g in match.groups() if g)
        assert name in values, f"the dashboard uses ${name}, which this test does not know"
        return values[name]
    return VARIABLE.sub(one, expr)


def interval_of(panel: dict) -> float:
    """Grafana's $__interval for the panel (also the step of its range queries)."""
    return max(MIN_INTERVAL, RANGE / (panel.get("maxDataPoints") or DEFAULT_MAX_DATA_POINTS))


def grafana_values(panel: dict) -> dict[str, str]:
    """Grafana's global variables for a panel's queries."""
    interval = interval_of(panel)
    return {"__interval": f"{interval:g}s", "__interval_ms": f"{interval * 1000:.0f}",
            "__rate_interval": f"{max(interval + MIN_INTERVAL, 4 * MIN_INTERVAL):g}s", "__range": f"{RANGE}s",
            "__range_s": str(RANGE), "__range_ms": str(RANGE * 1000)}


def variable_options(prom: Prometheus, query: str) -> list[str]:
    """A query variable's values as Grafana's Prometheus data source finds them: label_values(label)
    from /api/v1/label/LABEL/values, label_values(metric, label) from the series of the
    dashboard's time range."""
    match = re.fullmatch(r"\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*", query)
    assert match, f"a variable query this test does not know: {query}"
    selector, label = match.groups()
    if selector is None:
        return prom.get(f"/label/{label}/values") or []
    now = time.time()
    series = prom.get("/series", **{"match[]": selector, "start": now - RANGE, "end": now}) or []
    return list(dict.fromkeys(s[label] for s in series if s.get(label)))


def sort_options(options: list[str], sort: int) -> list[str]:
    """Grafana's variable sort: 0 none, 1/2 alphabetical (ascending/descending), 3/4 by the
    first number in the value, 5/6 alphabetical ignoring case."""
    if sort == 0:
        return options

    def key(value: str):
        if sort in (3, 4):
            number = re.search(r"\d+", value)
            return int(number[0]) if number else 0
        return value.lower() if sort in (5, 6) else value

    return sorted(options, key=key, reverse=sort % 2 == 0)


def resolve_variables(prom: Prometheus, dashboard: dict) -> tuple[dict[str, str], dict[str, list[str]]]:
    """({name: value}, {name: options}) of the templating variables, in their order (one may use
    the ones before it): as the dashboard's "current" is empty, Grafana picks the first
    option, or None (an empty value) when there is none."""
    values: dict[str, str] = {}
    found: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "datasource":
            values[variable["name"]] = "prometheus"  # (used for the panels' data source only)
            continue
        assert variable["type"] == "query" and not variable.get("regex") and not variable.get("multi") \
            and not variable.get("includeAll"), f"a variable this test does not know: {variable}"
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        options = sort_options(variable_options(prom, substitute(query, values)), variable.get("sort", 0))
        found[variable["name"]] = options
        values[variable["name"]] = escape(options[0]) if options else ""
    return values, found


def evaluate(prom: Prometheus, panel: dict, target: dict, values: dict[str, str]) -> list[dict]:
    """The series Grafana gets for a target: an instant query, or a range query over the
    dashboard's time range with the panel's step."""
    expr = substitute(target["expr"], {**values, **grafana_values(panel)})
    if target.get("instant"):
        return prom.query(expr)
    now = time.time()
    data = prom.get("/query_range", query=expr, start=now - RANGE, end=now, step=interval_of(panel))
    return [series for series in (data or {}).get("result", []) if series["values"]]


def last(series: list[dict]) -> float:
    """The sum of the series' latest values (a range query's, or an instant query's value)."""
    return sum(float((s["values"][-1] if "values" in s else s["value"])[1]) for s in series)


class Traffic:
    """A publisher (with confirms) and a consumer (manual acks) on a queue of their own, each on
    its own connection and thread, until stop()."""

    def __init__(self, broker, queue: str):
        self.broker, self.queue = broker, queue
        self.running = threading.Event()
        self.running.set()
        self.errors: list[BaseException] = []
        self.published = self.consumed = 0
        setup = pika.BlockingConnection(broker.pika_params())
        setup.channel().queue_declare(queue)
        setup.close()
        self.threads = [threading.Thread(target=self._guarded, args=(f,), daemon=True)
                        for f in (self._publish, self._consume)]
        for thread in self.threads:
            thread.start()

    def _guarded(self, run) -> None:
        try:
            run()
        except BaseException as err:  # (reported by stop())
            self.errors.append(err)

    def _publish(self) -> None:
        conn = pika.BlockingConnection(self.broker.pika_params())
        ch = conn.channel()
        ch.confirm_delivery()
        while self.running.is_set():
            ch.basic_publish("", self.queue, b"dashboard")
            self.published += 1
            conn.process_data_events(0.02)
        conn.close()

    def _consume(self) -> None:
        conn = pika.BlockingConnection(self.broker.pika_params())
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)

        def on_message(channel, method, properties, body):
            channel.basic_ack(method.delivery_tag)
            self.consumed += 1

        ch.basic_consume(self.queue, on_message)
        while self.running.is_set():
            conn.process_data_events(0.05)
        conn.close()

    def stop(self) -> None:
        self.running.clear()
        for thread in self.threads:
            thread.join(10)
        cleanup = pika.BlockingConnection(self.broker.pika_params())
        cleanup.channel().queue_delete(self.queue)
        cleanup.close()
        assert not self.errors, self.errors
        assert self.published and self.consumed


@pytest.mark.not_on_warren_cluster(
    "a node's Prometheus metrics are its own, and the test's traffic goes through every node")
def test_every_panel_of_the_rabbitmq_overview_dashboard_has_data(request, prometheus, uid):
    if EXTERNAL:
        endpoint = os.environ.get("WARREN_TEST_PROMETHEUS")
        if not endpoint:
            pytest.skip("against another broker: set WARREN_TEST_PROMETHEUS=host:port to its metrics endpoint")
        prom = prometheus(endpoint)
        broker = request.getfixturevalue("broker")
    else:
        endpoint = f"127.0.0.1:{free_port()}"
        prom = prometheus(endpoint)  # (first: it scrapes some 5 s after it starts)
        broker = request.getfixturevalue("make_broker")("--prometheus-port", endpoint.rsplit(":", 1)[1])
    # What the scraper is served, asking as Prometheus 2.42 asks: RabbitMQ 3.10.8's text format,
    # the info metrics untyped, the identity's three labels.
    for path in ("/metrics", "/metrics/per-object"):
        r = requests.get(f"http://{endpoint}{path}", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=30)
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4", path
        for name in ("rabbitmq_build_info", "rabbitmq_identity_info"):
            assert f"# TYPE {name} untyped\n" in r.text, (path, name)
        [identity] = [line for line in r.text.splitlines() if line.startswith("rabbitmq_identity_info{")]
        assert set(re.findall(r"(\w+)=\"", identity)) == {
            "rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"}, identity

    dashboard = json.loads(DASHBOARD.read_text())
    targets = queries(dashboard)
    assert len(targets) >= 40 and any("rabbitmq_process_max_tcp_sockets" in t["expr"] for _, _, t in targets)
    traffic = Traffic(broker, f"dashboard-{uid}")
    try:
        deadline = time.monotonic() + 40
        results: dict[str, list] = {}
        while True:
            values, options = resolve_variables(prom, dashboard)
            if options.get("rabbitmq_cluster"):
                results = {name: evaluate(prom, panel, target, values) for name, panel, target in targets}
                pending = [name for name, series in results.items() if not series and name not in NO_DATA_ON_ONE_NODE]
                rates = [results[name] for name in results if name.startswith(("Incoming messages / s",
                                                                                "Messages delivered / s"))]
                if not pending and all(series and last(series) > 0 for series in rates):
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"variables {values} ({options}); panels without data: "
                            f"{[n for n, s in results.items() if not s] if results else 'all'}")
            time.sleep(SCRAPE_INTERVAL)
    finally:
        traffic.stop()
    for name, reason in NO_DATA_ON_ONE_NODE.items():
        assert not results[name], f"{name} has data now: {reason}?"
    # No namespace label on a Prometheus outside Kubernetes: the variable is Grafana's None
    # (empty), which matches the series without one; the cluster is the node's.
    assert options["namespace"] == [] and values["namespace"] == ""
    assert len(options["rabbitmq_cluster"]) == 1
    # One node: the per-object job's series are not counted again.
    [nodes] = [series for name, series in results.items() if name.startswith("Nodes (")]
    assert last(nodes) == 1
    [sockets] = [series for name, series in results.items() if name.startswith("TCP sockets available (")]
    assert last(sockets) > 0
    # The untyped info metrics as Prometheus records them, whatever it asked for.
    for name in ("rabbitmq_build_info", "rabbitmq_identity_info"):
        metadata = prom.get("/targets/metadata", metric=name) or []
        assert {m["type"] for m in metadata if m["target"]["job"] == "warren"} == {"unknown"}, metadata
