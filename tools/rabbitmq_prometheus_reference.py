#!/usr/bin/env python3
"""Capture what RabbitMQ's rabbitmq_prometheus plugin exposes, as test data for Warren's
Prometheus endpoint (tests/unit/test_prometheus_names.py compares Warren's names, types,
help texts and labels with it):

    python tools/rabbitmq_node.py run --plugins rabbitmq_prometheus -- \\
        python tools/rabbitmq_prometheus_reference.py tests/data

The node's endpoint is WARREN_TEST_PROMETHEUS (host:port, which tools/rabbitmq_node.py sets for
the plugin), else the plugin's default, 127.0.0.1:15692. Some traffic first (two queues,
publishes with confirms, one unroutable, a basic.get, a consumer), so that every per-object
family has samples; then /metrics and /metrics/per-object are saved, trimmed to the
rabbitmq_* and process_* families (the erlang_*/telemetry_* ones have no Warren counterpart).
"""

import os
import sys
import time
import urllib.request

import pika


def trimmed(text: str) -> str:
    out = []
    keep = False
    for line in text.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            keep = line.split()[2].startswith(("rabbitmq_", "process_"))
        elif not line.startswith("#"):
            keep = line.startswith(("rabbitmq_", "process_"))
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def main(directory: str) -> int:
    host, port = os.environ["WARREN_TEST_BROKER"].rsplit(":", 1)
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q1")
    ch.queue_declare("q2", durable=True)
    for _ in range(5):
        ch.basic_publish("", "q1", b"x" * 10)
    ch.basic_publish("", "q2", b"y")
    try:
        ch.basic_publish("", "nowhere", b"z", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=2)
    method, _, _ = consumer.basic_get("q1")
    consumer.basic_ack(method.delivery_tag)
    consumer.basic_consume("q1", lambda *_: None)
    conn.process_data_events(1)
    time.sleep(6)  # the plugin's figures come from stats that are collected every 5 s
    version = os.environ.get("RABBITMQ_VERSION", "3.10.8")
    for path, name in (("/metrics", "metrics"), ("/metrics/per-object", "metrics-per-object")):
        endpoint = os.environ.get("WARREN_TEST_PROMETHEUS", "127.0.0.1:15692")
        with urllib.request.urlopen(f"http://{endpoint}{path}", timeout=30) as response:
            text = response.read().decode()
        target = os.path.join(directory, f"rabbitmq-{version}-prometheus-{name}.txt")
        with open(target, "w") as f:
            f.write(f"# RabbitMQ {version}'s {path} (tools/rabbitmq_prometheus_reference.py), "
                    "trimmed to the rabbitmq_* and process_* families\n")
            f.write(trimmed(text))
        print(target)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
