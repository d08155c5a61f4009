"""Three cluster members a, b, c behind one small interface, so that the queue tests run
against Warren nodes (make_node) or, with WARREN_TEST_RABBITMQ_CLUSTER=1, against a private
RabbitMQ 3.10 cluster (tools/rabbitmq_node.py) to check that they describe RabbitMQ."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

import pika
import pika.exceptions
import requests

from integration.http_api import wait_for

AUTH = ("guest", "guest")
RABBITMQ = os.environ.get("WARREN_TEST_RABBITMQ_CLUSTER") == "1"
# (the shovel and federation plugins for test_links.py)
PLUGINS = ["rabbitmq_management", "rabbitmq_shovel", "rabbitmq_shovel_management", "rabbitmq_federation",
           "rabbitmq_federation_management"]


class Member:
    """One cluster member: its node name, AMQP address and HTTP API; kill() (kill -9),
    restart() (the same name, data and ports), signal(SIGSTOP/SIGCONT)."""

    name: str
    host = "127.0.0.1"
    port: int
    api: str

    def pika_params(self, **kwargs: Any) -> pika.ConnectionParameters:
        kwargs.setdefault("credentials", pika.PlainCredentials(*AUTH))
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("blocked_connection_timeout", 60)
        return pika.ConnectionParameters(self.host, self.port, **kwargs)

    def connect(self, **kwargs: Any) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.pika_params(**kwargs))

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        raise NotImplementedError

    def running_nodes(self) -> dict[str, bool]:
        answer = requests.get(self.api + "/nodes", auth=AUTH, timeout=5)
        answer.raise_for_status()
        return {n["name"]: n["running"] for n in answer.json()}


class WarrenMember(Member):
    def __init__(self, make_node: Callable[..., Any], name: str):
        self.make_node = make_node
        self.name = name
        self.node = make_node(name)

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.node.port

    @property
    def api(self) -> str:  # type: ignore[override]
        return self.node.api

    def kill(self) -> None:
        self.node.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.node = self.make_node(self.name, data_dir=self.node.data_dir, port=self.node.port,
                                   dist_port=self.node.dist_port)

    def signal(self, sig: int) -> None:
        self.node.proc.send_signal(sig)

    def log(self) -> str:
        return self.node.log()


class RabbitMQMember(Member):
    def __init__(self, node: Any):
        self.node = node
        self.name = node.nodename
        self.killed = False

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.node.port

    @property
    def api(self) -> str:  # type: ignore[override]
        return self.node.mgmt_api

    def kill(self) -> None:
        self.node.kill()
        self.killed = True

    def restart(self) -> None:
        self.node.restart()
        self.killed = False

    def signal(self, sig: int) -> None:
        self.node.send_signal(sig)

    def log(self) -> str:
        return self.node.log_tail(200)


def rabbitmq_cluster():
    """A three-node RabbitMQ cluster with the management, shovel and federation plugins
    (started, to be stopped)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
    import rabbitmq_node  # noqa: E402  (tools/ is no package)
    return rabbitmq_node.RabbitMQCluster(3, plugins=PLUGINS).start()


def all_running(members: list[Member], timeout: float = 60) -> None:
    names = {m.name: True for m in members}
    for member in members:
        wait_for(lambda: _quiet(member.running_nodes) == names, timeout=timeout, what=f"{member.name} to list all")


def forget_queues(members: list[Member], names: list[str]) -> None:
    """Delete the named queues (RabbitMQ's cluster lives for the session: each test starts
    without them)."""
    for name in names:
        connection = members[0].connect()
        try:
            connection.channel().queue_delete(name)
        except pika.exceptions.AMQPError:
            pass
        finally:
            if connection.is_open:
                connection.close()


def _quiet(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (requests.RequestException, OSError):
        return None
