"""What a node of a cluster is configured with (RabbitMQ's cluster_formation.* keys, read by
warren.cli.config) and where the cluster keeps its keys in etcd."""

from __future__ import annotations

from dataclasses import dataclass, field

# RabbitMQ's rabbitmq_peer_discovery_etcd: a node key's lease lasts node_ttl seconds, never
# fewer than 15 (shorter ones time out etcd's client), 30 by default.
MIN_NODE_TTL = 15
DEFAULT_NODE_TTL = 30
# How long a node that stopped renewing stays "running": Warren's own lease, shorter than the
# discovery key's, since it is what the other nodes act on.
LIVENESS_TTL = 5
# etcd revisions of history kept behind the metadata log's latest snapshot
# (warren.metadata_history; warren.cluster.metadata_snapshot).
DEFAULT_HISTORY = 10_000
MIN_HISTORY = 10


@dataclass(frozen=True)
class ClusterConfig:
    node_name: str                  # as RabbitMQ's: name@host
    endpoints: tuple[str, ...]      # etcd's, "host:port" or URLs
    key_prefix: str = "rabbitmq"    # cluster_formation.etcd.key_prefix
    cluster_name: str = "default"   # cluster_formation.etcd.cluster_name: which cluster in etcd
    node_ttl: int = DEFAULT_NODE_TTL
    liveness_ttl: int = LIVENESS_TTL
    history: int = DEFAULT_HISTORY  # warren.metadata_history
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", Keys(self.key_prefix, self.cluster_name, self.node_name))


class Keys:
    """The cluster's keys. Registration is where RabbitMQ's etcd peer discovery puts it (so
    tools that read that layout find Warren's nodes too); the rest is Warren's."""

    def __init__(self, prefix: str, cluster: str, node: str):
        self.discovery = f"/rabbitmq/discovery/{prefix}/clusters/{cluster}/nodes/".encode()
        self.root = f"/warren/{prefix}/clusters/{cluster}/".encode()
        self.members = self.root + b"members/"   # every node that joined, until forgotten
        self.running = self.root + b"running/"   # a node's liveness, on its lease
        self.node = node.encode()

    def discovery_key(self) -> bytes:
        return self.discovery + self.node

    def member_key(self, node: str | bytes | None = None) -> bytes:
        return self.members + (node.encode() if isinstance(node, str) else node or self.node)

    def running_key(self, node: str | None = None) -> bytes:
        return self.running + (node.encode() if node is not None else self.node)
