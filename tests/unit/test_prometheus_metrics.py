"""The Prometheus metrics (warren.mgmt.metrics) in process, no socket: the names, types, help
texts and labels are RabbitMQ 3.10.8's (tests/data/rabbitmq-3.10.8-prometheus-*.txt, saved
by tools/rabbitmq_prometheus_reference.py from a real node), and the node-wide counters keep
what deleted queues and exchanges and closed channels and connections had counted."""

import pathlib
import re
from types import SimpleNamespace

import pytest
from pamqp import commands, frame
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from warren.broker import parameters
from warren.mgmt.metrics import endpoints
from warren.mgmt.node_resources import max_fds, sockets_limit

from .fake_transport import PROTOCOL_HEADER, Client, FakeTransport, durable_broker, make_connection

DATA = pathlib.Path(__file__).parent.parent / "data"

# RabbitMQ's families Warren leaves out (docs/prometheus.md, "What Warren leaves out"): it has no such number.
MISSING = {
    "rabbitmq_alarms_file_descriptor_limit",  # no file descriptor alarm
    # Erlang VM and Mnesia internals
    "rabbitmq_erlang_processes_used", "rabbitmq_erlang_processes_limit", "rabbitmq_erlang_gc_runs",
    "rabbitmq_erlang_gc_reclaimed_bytes", "rabbitmq_erlang_scheduler_context_switches",
    "rabbitmq_erlang_scheduler_run_queue", "rabbitmq_erlang_net_ticktime_seconds",
    "rabbitmq_schema_db_ram_tx", "rabbitmq_schema_db_disk_tx",
    # the message store's I/O statistics
    "rabbitmq_io_read_ops", "rabbitmq_io_read_bytes", "rabbitmq_io_write_ops", "rabbitmq_io_write_bytes",
    "rabbitmq_io_sync_ops", "rabbitmq_io_seek_ops", "rabbitmq_io_reopen_ops", "rabbitmq_io_read_time_seconds",
    "rabbitmq_io_write_time_seconds", "rabbitmq_io_sync_time_seconds", "rabbitmq_io_seek_time_seconds",
    "rabbitmq_msg_store_read", "rabbitmq_msg_store_write", "rabbitmq_queue_index_read_ops",
    "rabbitmq_queue_index_write_ops", "rabbitmq_queue_disk_reads", "rabbitmq_queue_disk_writes",
    # Raft (Warren's quorum queues are not replicated)
    "rabbitmq_raft_term", "rabbitmq_raft_log_snapshot_index", "rabbitmq_raft_log_last_applied_index",
    "rabbitmq_raft_log_commit_index", "rabbitmq_raft_log_last_written_index",
    "rabbitmq_raft_entry_commit_latency_seconds",
    # Erlang process figures of queues, channels and connections
    "rabbitmq_queue_process_reductions", "rabbitmq_queue_process_memory_bytes",
    "rabbitmq_channel_process_reductions", "rabbitmq_connection_process_reductions",
    # queue figures Warren does not keep
    "rabbitmq_queue_consumer_capacity", "rabbitmq_queue_consumer_utilisation", "rabbitmq_queue_messages_ram",
    "rabbitmq_queue_messages_ram_bytes", "rabbitmq_queue_messages_ready_ram", "rabbitmq_queue_messages_unacked_ram",
    "rabbitmq_queue_messages_persistent", "rabbitmq_queue_messages_persistent_bytes",
    "rabbitmq_queue_messages_paged_out", "rabbitmq_queue_messages_paged_out_bytes",
    "rabbitmq_queue_head_message_timestamp",
    "rabbitmq_connection_pending_packets",  # Warren holds bytes, not packets
    # dead-lettering counted by outcome, not by RabbitMQ's dead_letter_strategy
    "rabbitmq_global_messages_dead_lettered_confirmed", "rabbitmq_global_messages_dead_lettered_delivery_limit",
    "rabbitmq_global_messages_dead_lettered_expired", "rabbitmq_global_messages_dead_lettered_maxlen",
    "rabbitmq_global_messages_dead_lettered_rejected",
    # per source address and user
    "rabbitmq_auth_attempts_detailed", "rabbitmq_auth_attempts_detailed_succeeded",
    "rabbitmq_auth_attempts_detailed_failed",
}
# Per object, RabbitMQ splits a channel's message counters by exchange or queue; Warren counts
# per channel only.
MISSING_PER_OBJECT = {
    "rabbitmq_channel_messages_published", "rabbitmq_channel_messages_confirmed",
    "rabbitmq_channel_messages_unroutable_returned", "rabbitmq_channel_messages_unroutable_dropped",
    "rabbitmq_channel_get_ack", "rabbitmq_channel_get", "rabbitmq_channel_messages_delivered_ack",
    "rabbitmq_channel_messages_delivered", "rabbitmq_channel_messages_redelivered",
    "rabbitmq_channel_messages_acked", "rabbitmq_channel_get_empty", "rabbitmq_queue_messages_published",
}
# Labels beside RabbitMQ's, on purpose: Python's version, and the product's name and version
# (RabbitMQ's own labels when its product.name and product.version are set).
EXTRA_LABELS = {"rabbitmq_build_info": {"python_version", "product_name", "product_version"}}


def families(text: str) -> dict:
    """name -> (type, help, set of label-name sets of its samples)."""
    return {f.name: (f.type, f.documentation, {frozenset(s.labels) for s in f.samples})
            for f in text_string_to_metric_families(text)}


def reference(endpoint: str) -> dict:
    return families((DATA / f"rabbitmq-3.10.8-prometheus-{endpoint}.txt").read_text())


def scrape(client: Client, per_object_metrics: bool = False) -> tuple[dict, dict]:
    server = SimpleNamespace(broker=client.broker, protocols={object()}, services=[])
    default, per_object = endpoints(server, per_object_metrics)
    return (families(generate_latest(default.read()).decode()), families(generate_latest(per_object.read()).decode()))


def values(client: Client, per_object: bool = False) -> dict:
    """{(sample name, sorted label items): value} of one scrape."""
    server = SimpleNamespace(broker=client.broker, protocols=set(), services=[])
    registry = endpoints(server)[1 if per_object else 0].read()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


@pytest.fixture
def busy():
    """RabbitMQ's reference scene: two queues, confirmed publishes, one returned, a basic.get
    with ack, a consumer with prefetch 2 holding two deliveries."""
    c = Client()
    c.broker.config.mem_limit, c.broker.config.disk_free_limit = 4 << 30, 50_000_000  # (the monitors' limits)
    c.open_channel(1)
    c.declare(1, "q1")
    c.declare(1, "q2", durable=True)
    assert c.call(1, commands.Confirm.Select()) == [(1, "Confirm.SelectOk")]
    for _ in range(5):
        c.publish(1, "", "q1", b"x" * 10)
    c.publish(1, "", "q2", b"y")
    c.publish(1, "", "nowhere", b"z", mandatory=True)
    c.receive()
    c.open_channel(2)
    c.qos(2, 2)
    c.receive()
    [tag] = c.get_tags(2, 1, "q1")
    c.ack(2, tag)
    c.consume(2, "ctag", "q1")
    c.receive()
    return c


@pytest.mark.parametrize("per_object_endpoint", [False, True], ids=["metrics", "per-object"])
def test_names_types_help_and_labels_are_rabbitmqs(busy, per_object_endpoint):
    warren = scrape(busy)[1 if per_object_endpoint else 0]
    rabbit = reference("metrics-per-object" if per_object_endpoint else "metrics")
    for name, (kind, documentation, label_sets) in warren.items():
        if name.startswith("process_") and name not in rabbit:
            continue  # prometheus_client's process collector (CPU, memory, fds): beyond RabbitMQ's
        assert name in rabbit, f"{name} is not one of RabbitMQ's"
        assert (kind, documentation) == rabbit[name][:2], name
        expected = {labels | EXTRA_LABELS.get(name, set()) for labels in rabbit[name][2]}
        assert label_sets == expected, name
    missing = {n for n in rabbit if n not in warren}
    assert missing == (MISSING | (MISSING_PER_OBJECT if per_object_endpoint else set())) & set(rabbit)


def test_return_per_object_metrics_makes_metrics_per_object(busy):
    default, per_object = scrape(busy, per_object_metrics=True)
    assert default["rabbitmq_queue_messages_ready"] == per_object["rabbitmq_queue_messages_ready"]
    assert "rabbitmq_alarms_memory_used_watermark" in default  # (the registry's, not the objects')
    assert "rabbitmq_alarms_memory_used_watermark" not in per_object


def test_the_scene_in_numbers(busy):
    v = values(busy)
    amqp = (("protocol", "amqp091"),)
    classic = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))
    assert v[("rabbitmq_queue_messages_ready", ())] == 3
    assert v[("rabbitmq_queue_messages_unacked", ())] == 2
    assert v[("rabbitmq_queue_messages", ())] == 5
    assert v[("rabbitmq_queue_messages_bytes", ())] == 41
    assert v[("rabbitmq_channel_messages_published_total", ())] == 7
    assert v[("rabbitmq_channel_messages_confirmed_total", ())] == 7
    assert v[("rabbitmq_channel_messages_unroutable_returned_total", ())] == 1
    assert v[("rabbitmq_queue_messages_published_total", ())] == 6
    assert v[("rabbitmq_global_messages_routed_total", amqp)] == 6
    assert v[("rabbitmq_global_messages_received_confirm_total", amqp)] == 7
    assert v[("rabbitmq_global_messages_delivered_total", classic)] == 3
    assert v[("rabbitmq_global_messages_delivered_get_manual_ack_total", classic)] == 1
    assert v[("rabbitmq_global_messages_delivered_consume_manual_ack_total", classic)] == 2
    assert v[("rabbitmq_global_messages_acknowledged_total", classic)] == 1
    assert v[("rabbitmq_global_publishers", amqp)] == 1
    assert v[("rabbitmq_channel_consumers", ())] == v[("rabbitmq_global_consumers", amqp)] == 1
    assert v[("rabbitmq_consumer_prefetch", ())] == 2
    assert (v[("rabbitmq_connections", ())], v[("rabbitmq_channels", ())], v[("rabbitmq_queues", ())]) == (1, 2, 2)
    assert v[("rabbitmq_auth_attempts_succeeded_total", amqp)] == 1
    permanent_id = busy.broker.global_parameters["internal_cluster_id"]
    assert v[("rabbitmq_identity_info", (("rabbitmq_cluster", "warren@localhost"),
                                         ("rabbitmq_cluster_permanent_id", permanent_id),
                                         ("rabbitmq_node", "warren@localhost")))] == 1
    per_object = values(busy, per_object=True)
    assert per_object[("rabbitmq_queue_messages_ready", (("queue", "q1"), ("vhost", "/")))] == 2
    assert per_object[("rabbitmq_queue_messages_unacked", (("queue", "q1"), ("vhost", "/")))] == 2
    assert per_object[("rabbitmq_queue_messages_ready", (("queue", "q2"), ("vhost", "/")))] == 1
    channel = "127.0.0.1:50000 -> 127.0.0.1:5672 (2)"
    assert per_object[("rabbitmq_channel_messages_unacked", (("channel", channel),))] == 2


def test_totals_outlive_what_counted_them(busy):
    """Deleting the queues and closing the channels and the connection: the counters stay,
    as a Prometheus counter must (RabbitMQ's channel counters fall when a channel closes)."""
    before = values(busy)
    busy.close_channel(2)
    busy.call(1, commands.Queue.Delete(queue="q1"))
    busy.call(1, commands.Queue.Delete(queue="q2"))
    busy.call(1, commands.Exchange.Declare(exchange="x", exchange_type="fanout"))
    busy.call(1, commands.Exchange.Delete(exchange="x"))
    busy.close_channel(1)
    busy.conn.connection_lost()
    after = values(busy)
    for key, value in before.items():
        if key[0].endswith("_total"):
            assert after[key] >= value, key
    assert after[("rabbitmq_channel_messages_published_total", ())] == 7
    assert after[("rabbitmq_global_messages_routed_total", (("protocol", "amqp091"),))] == 6
    assert after[("rabbitmq_global_messages_delivered_total",
                  (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue")))] == 3
    assert after[("rabbitmq_global_messages_received_confirm_total", (("protocol", "amqp091"),))] == 7
    assert after[("rabbitmq_connection_incoming_bytes_total", ())] >= before[
        ("rabbitmq_connection_incoming_bytes_total", ())] > 0
    assert (after[("rabbitmq_queues_declared_total", ())], after[("rabbitmq_queues_created_total", ())],
            after[("rabbitmq_queues_deleted_total", ())]) == (2, 2, 2)
    assert (after[("rabbitmq_channels_opened_total", ())], after[("rabbitmq_channels_closed_total", ())]) == (2, 2)
    assert (after[("rabbitmq_connections_opened_total", ())],
            after[("rabbitmq_connections_closed_total", ())]) == (1, 1)
    assert (after[("rabbitmq_connections", ())], after[("rabbitmq_queues", ())],
            after[("rabbitmq_queue_messages", ())]) == (0, 0, 0)


def test_queue_types_are_counted_apart():
    c = Client()
    c.open_channel(1)
    assert c.call(1, commands.Queue.Declare(queue="qq", durable=True, arguments={"x-queue-type": "quorum"}))[0][1] \
        == "Queue.DeclareOk"
    c.fill(1, "qq", [b"a", b"b"])
    c.drain(1, "qq")
    v = values(c)
    assert v[("rabbitmq_global_messages_delivered_get_auto_ack_total",
              (("protocol", "amqp091"), ("queue_type", "rabbit_quorum_queue")))] == 2
    assert v[("rabbitmq_global_messages_get_empty_total",
              (("protocol", "amqp091"), ("queue_type", "rabbit_quorum_queue")))] == 1
    assert v[("rabbitmq_global_messages_delivered_total",
              (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue")))] == 0


def test_a_stream_counts_what_it_holds(tmp_path):
    c = Client(durable_broker(tmp_path))
    c.open_channel(1)
    assert c.call(1, commands.Queue.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"}))[0][1] \
        == "Queue.DeclareOk"
    c.fill(1, "s", [b"a", b"bb"], persistent=True)
    c.tick()
    per_object = values(c, per_object=True)
    assert per_object[("rabbitmq_queue_messages", (("queue", "s"), ("vhost", "/")))] == 2
    # (its log's bytes, each entry's header included, as the management API counts them)
    assert per_object[("rabbitmq_queue_messages_bytes", (("queue", "s"), ("vhost", "/")))] \
        == c.broker.vhosts["/"].queues["s"].store.ready_bytes > 3


def test_failed_logins_are_counted():
    c = Client()
    transport = FakeTransport()
    conn = make_connection(c.broker, transport)
    conn.data_received(PROTOCOL_HEADER)
    conn.data_received(frame.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0wrong"), 0))
    v = values(c)
    amqp = (("protocol", "amqp091"),)
    assert (v[("rabbitmq_auth_attempts_total", amqp)], v[("rabbitmq_auth_attempts_succeeded_total", amqp)],
            v[("rabbitmq_auth_attempts_failed_total", amqp)]) == (2, 1, 1)


def test_the_socket_limit_is_rabbitmqs_for_the_fd_limit(busy):
    """RabbitMQ's figure for a file descriptor limit: its reference output's pair (20000 fds),
    and a node of RabbitMQ 3.10.8 started under `ulimit -n 4096`."""
    rabbit = {s.name: s.value for f in text_string_to_metric_families(
        (DATA / "rabbitmq-3.10.8-prometheus-metrics.txt").read_text()) for s in f.samples}
    assert sockets_limit(int(rabbit["rabbitmq_process_max_fds"])) == rabbit["rabbitmq_process_max_tcp_sockets"] == 17910
    assert sockets_limit(4096) == 3597
    assert (sockets_limit(100), sockets_limit(0)) == (0, 0)  # (RabbitMQ's floor of 2 handles, no socket)
    for per_object in (False, True):
        assert values(busy, per_object)[("rabbitmq_process_max_tcp_sockets", ())] == sockets_limit(max_fds())


def test_the_permanent_cluster_id():
    """RabbitMQ's internal_cluster_id global parameter: made once, then the same at every
    scrape, on both endpoints; replaced by an import or a PUT, made anew once cleared."""
    c = Client()
    identity = [(s, v) for s, v in values(c).items() if s[0] == "rabbitmq_identity_info"]
    [((_, labels), value)] = identity
    permanent_id = dict(labels)["rabbitmq_cluster_permanent_id"]
    assert re.fullmatch(r"rabbitmq-cluster-id-[A-Za-z0-9_-]{22}", permanent_id) and value == 1
    assert parameters.global_parameters(c.broker)["internal_cluster_id"] == permanent_id
    assert [s for s in values(c, per_object=True) if s[0] == "rabbitmq_identity_info"] == [identity[0][0]]
    parameters.set_global(c.broker, "internal_cluster_id", "rabbitmq-cluster-id-imported")
    assert parameters.permanent_cluster_id(c.broker) == "rabbitmq-cluster-id-imported"
    parameters.clear_global(c.broker, "internal_cluster_id")
    again = parameters.permanent_cluster_id(c.broker)
    assert again.startswith("rabbitmq-cluster-id-") and again != permanent_id


def test_build_info_has_rabbitmqs_labels(busy):
    [labels] = [dict(s[1]) for s in values(busy) if s[0] == "rabbitmq_build_info"]
    rabbit = [dict(s.labels) for f in text_string_to_metric_families(
        (DATA / "rabbitmq-3.10.8-prometheus-metrics.txt").read_text()) for s in f.samples
        if s.name == "rabbitmq_build_info"][0]
    assert set(rabbit) <= set(labels) and all(labels.values())
    assert (labels["rabbitmq_version"], labels["prometheus_plugin_version"], labels["erlang_version"],
            labels["product_name"]) == ("3.10.8", "3.10.8", "none", "Warren")
