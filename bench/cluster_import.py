#!/usr/bin/env python3
"""A definitions import on a three-node cluster: Warren (three etcd members and three nodes)
against RabbitMQ 3.10 (three clustered nodes), the clusters of bench/cluster.py with their
management APIs on.

    /work/venv/bin/python bench/cluster_import.py [--count 700] [--repeat 3] [--target both]

Per round and broker: POST /api/definitions through node 2 of a file with a new vhost, --count
durable direct exchanges, --count durable classic queues and a binding from each exchange to
its queue (3 x count items), timed from the request to its 204; then node 1's and node 3's
APIs are polled (GET /api/bindings/VHOST) until they list every binding: the time from the 204
until both do. The vhost is deleted after the round (not timed). Broker CPU is the nodes'
(Warren's etcd apart). Medians of the rounds, the rounds in brackets."""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
import urllib.error
import urllib.request

from cluster import RabbitCluster, WarrenCluster, log  # (bench/cluster.py: sys.path has tools/)

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def call(api: str, method: str, path: str, body=None, timeout: float = 600):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(api + path, data, method=method,
                                     headers={"Authorization": AUTH, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read()
        return response.status, (json.loads(text) if text else None)


def definitions(vhost: str, count: int) -> dict:
    return {"vhosts": [{"name": vhost}],
            "permissions": [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
            "exchanges": [{"name": f"x{n}", "vhost": vhost, "type": "direct", "durable": True, "auto_delete": False,
                           "internal": False, "arguments": {}} for n in range(count)],
            "queues": [{"name": f"q{n}", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}
                       for n in range(count)],
            "bindings": [{"source": f"x{n}", "vhost": vhost, "destination": f"q{n}", "destination_type": "queue",
                          "routing_key": f"k{n}", "arguments": {}} for n in range(count)]}


def apis(cluster) -> list[str]:
    if isinstance(cluster, WarrenCluster):
        return [f"http://127.0.0.1:{port}/api" for port in cluster.mgmt]
    return [node.mgmt_api for node in cluster.cluster.nodes]


def one_round(cluster, count: int, round_no: int) -> dict:
    api1, api2, api3 = apis(cluster)
    vhost = f"import-{round_no}"
    body = definitions(vhost, count)
    cpu0 = cluster.cpu()
    started = time.monotonic()
    status, _ = call(api2, "POST", "/definitions", body)
    answered = time.monotonic()
    assert status == 204, status
    for api in (api1, api3):
        while len([b for b in call(api, "GET", f"/bindings/{vhost}")[1] if b["source"]]) < count:
            time.sleep(0.01)
    seen = time.monotonic()
    cpu1 = cluster.cpu()
    queues = call(api1, "GET", f"/queues/{vhost}")[1]
    assert len(queues) == count, len(queues)
    call(api2, "DELETE", f"/vhosts/{vhost}")
    out = {"import s": answered - started, "on nodes 1 and 3 after s": seen - answered,
           "items per s": 3 * count / (answered - started),
           "broker CPU s": cpu1["broker"] - cpu0["broker"]}
    if "etcd" in cpu0:
        out["etcd CPU s"] = cpu1["etcd"] - cpu0["etcd"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", choices=["both", "warren", "rabbitmq"], default="both")
    parser.add_argument("--keep-tmp", action="store_true")
    args = parser.parse_args()
    args.mgmt = True
    kinds = [k for k in (WarrenCluster, RabbitCluster) if args.target in ("both", k.name)]
    clusters = [kind(args) for kind in kinds]
    results: dict[str, list[dict]] = {c.name: [] for c in clusters}
    try:
        for cluster in clusters:
            cluster.start()
        for round_no in range(args.repeat):
            for cluster in (clusters if round_no % 2 == 0 else clusters[::-1]):
                result = one_round(cluster, args.count, round_no)
                log(f"{cluster.name} round {round_no + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
                results[cluster.name].append(result)
    finally:
        for cluster in clusters:
            cluster.stop()
    print(f"\n{3 * args.count} items ({args.count} exchanges, queues, bindings), medians of {args.repeat} rounds\n")
    print("| Metric | " + " | ".join(results) + " |")
    print("|---|" + "---:|" * len(results))
    for metric in results[clusters[0].name][0]:
        cells = []
        for name in results:
            values = [r[metric] for r in results[name] if metric in r]
            cells.append(f"{statistics.median(values):.3f} ({' / '.join(f'{v:.3f}' for v in values)})"
                         if values else "")
        print(f"| {metric} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
