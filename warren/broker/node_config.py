"""What a node is configured with (warren.cli.config reads it from the config file): the
limits connections negotiate, who may log in how, and the resource alarms' thresholds."""

from dataclasses import dataclass, field


@dataclass
class Limits:
    """Connection parameters offered in connection.tune and enforced afterwards."""

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024  # RabbitMQ 3.x default
    handshake_timeout: float = 10.0
    # ms a delivery may stay unacked before its channel is closed (406); None: never.
    consumer_timeout: int | None = 1_800_000  # RabbitMQ 3.10's default, 30 min


@dataclass
class NodeConfig:
    # What every object's "node" field shows, and the cluster's name until cluster_name is set.
    node_name: str = "warren@localhost"
    # The config file's cluster_name: the cluster's name until set_cluster_name sets another.
    cluster_name: str | None = None
    # A cluster member's: the name of the member that joined first (warren.cluster.membership).
    default_cluster_name: str | None = None
    limits: Limits = field(default_factory=Limits)
    loopback_users: set = field(default_factory=lambda: {"guest"})
    # The SASL mechanisms offered (auth_mechanisms.N, in warren.broker.auth_mechanisms'
    # order; EXTERNAL only on TLS connections) and where EXTERNAL finds the user name in a
    # client certificate (ssl_cert_login_from: distinguished_name or common_name,
    # warren.broker.x509).
    auth_mechanisms: tuple = ("PLAIN", "AMQPLAIN")
    ssl_cert_login_from: str = "distinguished_name"
    # The resource monitors' thresholds in bytes (None: not monitored); warrenctl may change
    # them while the node runs, as rabbitmqctl set_vm_memory_high_watermark does.
    mem_limit: int | None = None
    disk_free_limit: int | None = None
