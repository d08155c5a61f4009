"""What the federation fault tests (test_federation_kill9.py) add to links.py: a handle on
each broker, Warren's or RabbitMQ's, driven the same way (AMQP with pika, the management
HTTP API for the cluster name, the upstream parameter, the policy, the links' status and the
bindings upstream; kill -9 and restart on its port and data, SIGSTOP and SIGCONT: Warren's
from links.WarrenProcess); and a consumer that runs through the faults (a queue link only
moves messages while the downstream queue has a consumer).
"""

from __future__ import annotations

import threading
import time
from urllib.parse import quote

import pika
import pika.exceptions
import requests

from integration.http_api import wait_for

from .links import CONNECTION_ERRORS, Collected, WarrenProcess, amqp_uri, depth, params

AUTH = ("guest", "guest")
VHOST = "%2F"


def q(name: str) -> str:
    return quote(name, safe="")


# ------------------------------------------------------------------ the brokers
class Broker:
    """What Warren and RabbitMQ both offer a scenario; host and port are where the test and
    the other broker reach it."""

    name = ""
    host = "127.0.0.1"
    port = 0

    @property
    def api(self) -> str:
        raise NotImplementedError

    def uri(self, **query) -> str:
        return amqp_uri(self.host, self.port, **query)

    def http(self, method: str, path: str, body: dict | None = None, ok=(200, 201, 204)) -> requests.Response:
        for _ in range(50):
            r = requests.request(method, self.api + path, json=body, auth=AUTH, timeout=30)
            # RabbitMQ 3.10.8's /api/federation-links answers 500 (a case_clause) while a link
            # without local_connection meets channels without connection details: asked
            # again, it answers.
            if not (r.status_code == 500 and path.startswith("/federation-links")):
                break
            time.sleep(0.1)
        assert r.status_code in ok, (method, path, r.status_code, r.text)
        return r

    def set_cluster_name(self, name: str) -> None:
        """Each broker its own: a link's queue upstream is named after the downstream's, and
        x-received-from names the upstream's."""
        self.http("PUT", "/global-parameters/cluster_name", {"name": "cluster_name", "value": name})
        assert self.http("GET", "/cluster-name").json()["name"] == name

    def declare(self, exchange: str | None = None, queue: str | None = None, key: str = "") -> None:
        """A durable direct exchange and/or a durable queue (bound to it with key)."""
        with pika.BlockingConnection(params(self.host, self.port)) as conn:
            ch = conn.channel()
            if exchange:
                ch.exchange_declare(exchange, "direct", durable=True)
            if queue:
                ch.queue_declare(queue, durable=True)
            if exchange and queue:
                ch.queue_bind(queue, exchange, key)

    def federate(self, upstream: str, uri: str, pattern: str, apply_to: str) -> None:
        """The upstream parameter (reconnect-delay 1; ack-mode on-confirm, the default) and a
        policy federating what `pattern` matches with it."""
        self.http("PUT", f"/parameters/federation-upstream/{VHOST}/{q(upstream)}",
                  {"value": {"uri": uri, "reconnect-delay": 1}})
        self.http("PUT", f"/policies/{VHOST}/fed-{q(upstream)}",
                  {"pattern": pattern, "apply-to": apply_to, "definition": {"federation-upstream": upstream}})

    def unfederate(self, upstream: str) -> None:
        self.http("DELETE", f"/policies/{VHOST}/fed-{q(upstream)}", ok=(204, 404))
        self.http("DELETE", f"/parameters/federation-upstream/{VHOST}/{q(upstream)}", ok=(204, 404))

    def links(self) -> list[dict]:
        return self.http("GET", "/federation-links").json()

    def running_link(self, upstream: str) -> dict | None:
        running = [link for link in self.links() if link["upstream"] == upstream and link["status"] == "running"]
        return running[0] if running else None

    def federation_binding(self, exchange: str, key: str) -> dict | None:
        """The binding (key) from `exchange` to an exchange link's internal exchange here
        (the upstream), once the link made it."""
        for b in self.http("GET", f"/exchanges/{VHOST}/{q(exchange)}/bindings/source").json():
            if (b["destination_type"] == "exchange" and b["destination"].startswith("federation: ")
                    and b["routing_key"] == key):
                return b
        return None

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        raise NotImplementedError

    def check_log(self) -> None:
        pass

    def log_tail(self) -> str:
        return ""


class Warren(WarrenProcess, Broker):
    """A Warren broker (links.WarrenProcess) driven as a Broker."""

    name = "Warren"

    @property
    def api(self) -> str:
        return f"http://{self.host}:{self.b.mgmt_port}/api"

    def restart(self) -> None:
        super().restart()
        # (the management API listens a moment after AMQP)
        wait_for(lambda: _answers(self.api + "/overview"), 15, "management API after the restart")

    def link_starts(self) -> int:
        """How many times a federation link started running here (its log says so)."""
        return sum(1 for line in self.b.log().splitlines()
                   if "Federation link for " in line and " is running: " in line)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, auth=AUTH, timeout=2).status_code == 200
    except requests.RequestException:
        return False


class Rabbit(Broker):
    """The module's RabbitMQ node (tools/rabbitmq_node.py, with the management and
    federation plugins), as Warren above."""

    name = "RabbitMQ"

    def __init__(self, node):
        self.node = node

    @property
    def host(self) -> str:  # type: ignore[override]
        return self.node.host

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.node.port

    @property
    def api(self) -> str:
        return self.node.mgmt_api

    def kill(self) -> None:
        self.node.kill()

    def restart(self) -> None:
        self.node.restart()

    def send_signal(self, sig: int) -> None:
        self.node.send_signal(sig)

    def log_tail(self) -> str:
        return self.node.log_tail(40)


# ------------------------------------------------------------------ clients
class Consumer(threading.Thread):
    """Consumes a queue (acking each message) from before the publishing starts until
    finish() says what to wait for, reconnecting if its broker goes: a federated queue's
    link pulls from upstream only while the queue here has a consumer."""

    def __init__(self, host: str, port: int, queue: str):
        super().__init__(name=f"consumer of {queue}", daemon=True)
        self.host, self.port, self.queue = host, port, queue
        self.got = Collected()
        self.seen: set[str | None] = set()
        self.ready = threading.Event()   # consuming
        self.done = threading.Event()    # (set by finish: stop once `until` says so)
        self.until = lambda: False

    def run(self) -> None:
        while not self.done.is_set() or not self.until():
            try:
                with pika.BlockingConnection(params(self.host, self.port)) as conn:
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=100)
                    for method, props, body in ch.consume(self.queue, inactivity_timeout=0.25):
                        self.ready.set()
                        if method is not None:
                            self.got.messages.append((props.message_id, body))
                            self.seen.add(props.message_id)
                            ch.basic_ack(method.delivery_tag)
                        elif self.done.is_set() and self.until():
                            break
                    ch.cancel()
            except CONNECTION_ERRORS:
                time.sleep(0.2)

    def finish(self, confirmed: list[str], source: tuple[str, int, str], timeout: float = 45.0,
               settle: float = 1.0) -> Collected:
        """Go on until every confirmed id arrived and the source queue is empty, then for
        `settle` seconds more (late duplicates), or until `timeout` seconds have passed."""
        start = time.monotonic()
        wanted = set(confirmed)
        settled_at: list[float] = []

        def until() -> bool:
            now = time.monotonic()
            if now > start + timeout:
                return True
            if not settled_at:
                if wanted <= self.seen and _depth_or_none(*source) == 0:
                    settled_at.append(now)
                return False
            return now >= settled_at[0] + settle

        self.until = until
        self.done.set()
        self.join(timeout + settle + 30)
        self.got.source_left = _depth_or_none(*source)
        self.got.missing = len(wanted - self.seen)
        self.got.seconds = time.monotonic() - start
        return self.got


def _depth_or_none(host: str, port: int, queue: str) -> int | None:
    try:
        return depth(host, port, queue)
    except CONNECTION_ERRORS:
        return None
