"""cluster_formation.* and cluster_name in rabbitmq.conf: the etcd backend's settings as
RabbitMQ's rabbitmq_peer_discovery_etcd names them, and what Warren refuses."""

import pytest

from warren.cli.config import ConfigError, parse_config
from warren.cluster.config import ClusterConfig


def conf(*lines):
    return parse_config("\n".join(lines) + "\n", "warren.conf")


def errors(*lines):
    with pytest.raises(ConfigError) as info:
        parse_config("\n".join(lines) + "\n", "warren.conf")
    return info.value.errors


def test_etcd_endpoints_in_index_order_and_settings():
    config = conf("cluster_formation.peer_discovery_backend = rabbit_peer_discovery_etcd",
                  "cluster_formation.etcd.endpoints.2 = 127.0.0.2:2379",
                  "cluster_formation.etcd.endpoints.1 = 127.0.0.1:2379",
                  "cluster_formation.etcd.key_prefix = warren-test",
                  "cluster_formation.etcd.cluster_name = east",
                  "cluster_formation.etcd.node_ttl = 40",
                  "warren.metadata_history = 500",
                  "cluster_name = Production")
    assert config["cluster"] == {"endpoints": ["127.0.0.1:2379", "127.0.0.2:2379"], "key_prefix": "warren-test",
                                 "cluster_name": "east", "node_ttl": 40, "history": 500}
    assert config["cluster_name"] == "Production"


def test_legacy_host_and_port_and_a_short_ttl_raised_to_15():
    config = conf("cluster_formation.peer_discovery_backend = etcd", "cluster_formation.etcd.host = etcd.local",
                  "cluster_formation.etcd.node_ttl = 3")
    assert config["cluster"] == {"endpoints": ["etcd.local:2379"], "node_ttl": 15}


def test_no_cluster_without_the_etcd_backend():
    assert "cluster" not in conf("cluster_formation.peer_discovery_backend = classic_config")
    assert "cluster" not in conf("cluster_formation.etcd.endpoints.1 = 127.0.0.1:2379")


@pytest.mark.parametrize("lines,reason", [
    (["cluster_formation.peer_discovery_backend = etcd"],
     "warren.conf:1: cluster_formation.peer_discovery_backend: the etcd backend needs "
     "cluster_formation.etcd.endpoints.N = HOST:PORT"),
    (["cluster_formation.peer_discovery_backend = k8s"],
     "warren.conf:1: cluster_formation.peer_discovery_backend: peer discovery backend 'k8s' is not supported: "
     "Warren's nodes cluster through etcd (etcd or rabbit_peer_discovery_etcd) or run alone (classic_config, "
     "with no nodes listed)"),
    (["cluster_formation.etcd.endpoints.1 = nohost"],
     "warren.conf:1: cluster_formation.etcd.endpoints.1: expected HOST:PORT, got 'nohost'"),
    (["cluster_formation.etcd.username = u"],
     "warren.conf:1: cluster_formation.etcd.username: not supported: Warren's etcd client does not log in to etcd"),
    (["cluster_formation.etcd.node_ttl = -1"],
     "warren.conf:1: cluster_formation.etcd.node_ttl: expected an integer from 0 to 2147483647, got -1"),
    (["warren.metadata_history = 5"],
     "warren.conf:1: warren.metadata_history: expected an integer from 10 to 4611686018427387904, got 5"),
])
def test_refused(lines, reason):
    assert errors(*lines) == [reason]


def test_keys_where_rabbitmqs_discovery_puts_them():
    keys = ClusterConfig("rabbit@a", ("127.0.0.1:2379",), key_prefix="p", cluster_name="c").keys
    assert keys.discovery_key() == b"/rabbitmq/discovery/p/clusters/c/nodes/rabbit@a"
    assert keys.member_key("rabbit@b") == b"/warren/p/clusters/c/members/rabbit@b"
