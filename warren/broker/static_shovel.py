"""Static shovels: those of the config file (rabbitmq_shovel's `shovels`, read by
warren.cli.static_shovels into a Config each). They run as the dynamic ones do
(warren.broker.shovel.Shovel: the same ends, forwarding, acks and restarts), with RabbitMQ's
differences for a static shovel (rabbit_shovel_worker of type static):

- it belongs to the node, not to a vhost: its name is the config file's, its status in
  /api/shovels has type "static" and no vhost (only administrators see it: RabbitMQ's
  filter_vhost_user), it is no runtime parameter (not in /api/parameters, not exported,
  not deleted or restarted through the API: no vhost's shovel has its name);
- its ends are set up by its declarations alone (Config.static);
- its x-shovelled header says shovel-type "static" and has no vhost or endpoints;
- a transfer that is complete (delete_after) ends it as terminated with reason
  {shutdown,autodelete}; its supervisor then starts it again as after a failure, since a
  static shovel has no parameter to delete.

They live in the broker's static_shovels and start with the dynamic ones, once every queue
is recovered (warren.broker.shovel.start_all).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..amqp import reencode as rt
from ..amqp.uri import remove_credentials
from .shovel import Shovel

if TYPE_CHECKING:
    from .node import Node
    from .shovel_config import Config

log = logging.getLogger("warren.shovel")


class StaticShovel(Shovel):
    """One shovel of the config file."""

    def __init__(self, broker: Node, name: str, config: Config):
        super().__init__(broker, "", name, None, config)  # (no vhost: the node's)

    def describe(self) -> str:
        return f"Shovel '{self.name}'"

    def start_soon(self) -> None:
        """Every node runs its own config file's shovels, cluster or not (RabbitMQ's static
        shovels are its node's shovel supervisor's children, the dynamic ones the cluster's)."""
        self.begin()

    def runs_here(self) -> bool:
        return True

    def _forward_headers(self, fields: list) -> list:
        """rabbit_amqp091_shovel:add_forward_headers_fun of a static shovel."""
        info = [("shovelled-by", self.broker.cluster_name), ("shovel-type", "static"), ("shovel-name", self.name),
                ("src-uri", remove_credentials(self.src_uri)), ("dest-uri", remove_credentials(self.dest_uri))]
        table = rt.table_value([(k.encode(), rt.longstr_value(v.encode("utf-8", "surrogateescape")))
                                for k, v in info])
        return rt.prepend_table_header(fields, b"x-shovelled", table)

    def _autodelete(self) -> None:
        """The transfer is complete: the worker exits with {shutdown, autodelete}, which its
        supervisor restarts as any other exit (permanent, after reconnect_delay)."""
        log.info("shutting down %s, no messages left to transfer", self.describe())
        log.error("%s is stopping, reason: {shutdown,autodelete}", self.describe())
        self._terminate("{shutdown,autodelete}", restart=True, as_term=False)
        self.broker.durability.flush()

    def status(self, node: str) -> dict:
        """As /api/shovels shows a static shovel (rabbit_shovel_mgmt_util:format: no vhost;
        running, the URIs and the source queue as configured, no destination endpoint)."""
        out: dict[str, Any] = {"node": node, "timestamp": self.timestamp, "name": self.name, "type": "static",
                               "state": self.state}
        if self.state == "terminated":
            out["reason"] = self.reason
        elif self.state == "running":
            out.update({"src_uri": remove_credentials(self.src_uri), "src_protocol": "amqp091",
                        "dest_protocol": "amqp091", "dest_uri": remove_credentials(self.dest_uri),
                        "src_queue": self.config.src_queue})
        return out


def create(broker: Node, configs: dict[str, Config]) -> dict[str, Shovel]:
    """The static shovels of the config file (name -> Config, validated), not yet started."""
    return {name: StaticShovel(broker, name, config) for name, config in configs.items()}
