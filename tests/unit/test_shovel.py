"""warren.broker.shovel without sockets: URIs of this broker, RabbitMQ's validation texts and
their order, and shovels moving messages in the model (in memory, and with the store's
group commit deciding when on-confirm acks the source)."""

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.amqp.uri import Direct, Network, UriError
from warren.broker import ops, shovel
from warren.broker.broker import Broker
from warren.broker.metadata import commands as c
from warren.store.persister import Persister

from .fake_transport import ManualScheduler


@pytest.mark.parametrize("uri,vhost", [
    ("amqp://", "/"), ("amqp:///%2F", "/"), ("amqp:///%2f", "/"), ("amqp:///vh", "vh"), ("AMQP:///a%20b", "a b"),
    ("amqp:///", ""),
])
def test_uris_of_this_broker(uri, vhost):
    assert shovel.parse_uri(uri) == Direct(vhost)


@pytest.mark.parametrize("uri,endpoint", [
    ("amqp://localhost", Network("localhost", 5672, "/")),
    ("amqp://u:p%40ss@h:5673/%2Fv?heartbeat=5&connection_timeout=2000&unknown=1",
     Network("h", 5673, "/v", "u", "p@ss", heartbeat=5, connection_timeout=2000)),
    ("amqp://h/", Network("h", 5672, "")),  # (amqp_uri: "/" is the vhost "")
    ("amqps://h?cacertfile=/ca.pem&verify=verify_peer&server_name_indication=disable",
     Network("h", 5671, "/", tls={"cacertfile": "/ca.pem", "verify": "verify_peer", "server_name_indication": "disable"})),
    ("amqp://[::1]:5672/v", Network("::1", 5672, "v")),
])
def test_uris_of_other_brokers(uri, endpoint):
    assert shovel.parse_uri(uri) == endpoint


@pytest.mark.parametrize("uri,error", [
    ("http://x", '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
    ("amqp", '"amqp" not a valid URI: {{unable_to_parse_uri,no_scheme},"amqp"}'),
    ("amqp:////", '"amqp:////" not a valid URI: {{invalid_vhost,"/"},"amqp:////"}'),
    ("amqp://:5672", '"amqp://:5672" not a valid URI: {port_requires_host,"amqp://:5672"}'),
    ("amqp://h:70000", '"amqp://h:70000" not a valid URI: {{port_out_of_range,70000},"amqp://h:70000"}'),
    # (~p breaks a term longer than a line: io_lib_pretty's layout, a tagged tuple's elements
    # under its tag here)
    ("amqp://h?heartbeat=x", '"amqp://h?heartbeat=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
                             + " " * 42 + 'heartbeat,"x",\n'
                             + " " * 42 + '[{"heartbeat","x"}],\n'
                             + " " * 42 + '{not_an_integer,"x"}},\n'
                             + " " * 41 + '"amqp://h?heartbeat=x"}'),
    ("amqp://h?host=x", '"amqp://h?host=x" not a valid URI: {{invalid_amqp_params_parameter,host,"x",\n'
                        + " " * 37 + '[{"host","x"}],\n'
                        + " " * 37 + '{parameter_unconfigurable_in_query,host,\n'
                        + " " * 38 + '"x"}},\n'
                        + " " * 36 + '"amqp://h?host=x"}'),
])
def test_uris_refused(uri, error):
    with pytest.raises(UriError) as err:
        shovel.parse_uri(uri)
    assert err.value.reason == error


def _broker(persister=None) -> tuple[Broker, ManualScheduler]:
    broker = Broker.with_defaults(persister=persister)
    scheduler = ManualScheduler()
    broker.set_scheduler(scheduler)
    return broker, scheduler


def test_validation_errors_in_rabbitmqs_order():
    broker, _ = _broker()
    with pytest.raises(shovel.ShovelError) as err:
        shovel.validate(broker, "s", {"zz": 1, "ack-mode": 1, "src-exchange": "x", "src-queue": "q"}, None)
    assert err.value.errors == [
        "Cannot specify 'src-exchange' and 'src-queue'",
        "Unrecognised terms [{<<\"zz\">>,1}] in s",
        'Key "dest-uri" not found in s',
        'Key "src-uri" not found in s',
        "ack-mode should be binary, actually was 1",
    ]


def test_a_user_needs_permissions_in_the_uris_vhosts():
    broker, _ = _broker()
    broker.metadata.apply(c.PutVHost("other"))
    user = broker.users["guest"]
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp:///other", "dest-queue": "b"}
    with pytest.raises(shovel.ShovelError) as err:
        shovel.validate(broker, "s", value, user)
    assert err.value.errors == ['user "guest" may not connect to vhost "other"']
    assert shovel.validate(broker, "s", value, None).dest_uri == "amqp:///other"  # (unchecked: an import)


def _publish(broker, queue: str, bodies, persistent=True):
    vhost = broker.vhosts["/"]
    actor = ops.Actor(broker, broker.users["guest"], vhost, trusted=True)
    for body in bodies:
        header = encode_header(len(body), {"delivery_mode": 2 if persistent else 1})
        message, queues = ops.route(actor, "", queue, shortstr("") + shortstr(queue), header, body)
        ops.enqueue(message, queues)
    broker.durability.flush()


def _bodies(broker, queue: str) -> list:
    q = broker.vhosts["/"].queues[queue]
    return [bytes(qm.message.body) for qm in q.store.peek_all()]


def _declare(broker, *names):
    vhost = broker.vhosts["/"]
    actor = ops.Actor(broker, broker.users["guest"], vhost, trusted=True)
    for name in names:
        ops.declare_queue(actor, name, durable=True)


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_queue_length_moves_what_was_there(ack_mode):
    broker, scheduler = _broker()
    _declare(broker, "q1", "q2")
    _publish(broker, "q1", [b"%d" % i for i in range(50)])
    vhost = broker.vhosts["/"]
    value = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2",
             "src-delete-after": "queue-length", "src-prefetch-count": 7, "ack-mode": ack_mode}
    assert shovel.set_shovel(broker, vhost, "m", value, None) is True
    running = vhost.shovels["m"]
    scheduler.advance(0)
    _publish(broker, "q1", [b"late"])  # after the start: stays
    for _ in range(100):
        scheduler.advance(0)
        if "m" not in vhost.shovels:
            break
    assert "m" not in vhost.shovels and running.stopped
    assert _bodies(broker, "q2") == [b"%d" % i for i in range(50)]
    assert _bodies(broker, "q1") == [b"late"]
    assert vhost.queues["q1"].unacked_count == 0 and not vhost.queues["q1"].consumers


def test_on_confirm_acks_the_source_only_once_the_copy_is_synced(tmp_path):
    """The source's copy is acked after the fsync of the destination's (the store's group
    commit), never before: what a kill -9 between the two finds is at worst a duplicate."""
    synced: list = []
    persister = Persister(str(tmp_path), run_in_thread=lambda fn, done: synced.append((fn, done)))
    broker, scheduler = _broker(persister)
    _declare(broker, "q1", "q2")
    _publish(broker, "q1", [b"a", b"b", b"c"])
    while synced:  # the publishes' own fsync
        fn, done = synced.pop(0)
        fn()
        done(None)
    vhost = broker.vhosts["/"]
    value = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2"}
    shovel.set_shovel(broker, vhost, "keep", value, None)
    scheduler.advance(0)
    q1, q2 = vhost.queues["q1"], vhost.queues["q2"]
    assert _bodies(broker, "q2") == [b"a", b"b", b"c"]
    assert q1.unacked_count == 3  # copied, not yet on disk: not acked
    assert len(synced) == 1
    fn, done = synced.pop(0)
    fn()
    done(None)
    scheduler.advance(0)
    assert q1.unacked_count == 0 and len(q1.store) == 0 and len(q2.store) == 3
    shovel.clear_shovel(broker, vhost, "keep")
    assert not q1.consumers


def test_prefetch_bounds_what_is_in_flight(tmp_path):
    """With the destination's fsync outstanding, the shovel holds src-prefetch-count messages
    of the source, no more; each fsync lets the next ones through."""
    synced: list = []
    persister = Persister(str(tmp_path), run_in_thread=lambda fn, done: synced.append((fn, done)))
    broker, scheduler = _broker(persister)
    _declare(broker, "q1", "q2")
    _publish(broker, "q1", [b"%d" % i for i in range(20)])

    def fsync():
        while synced:
            fn, done = synced.pop(0)
            fn()
            done(None)
        scheduler.advance(0)
    fsync()
    vhost = broker.vhosts["/"]
    value = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2",
             "src-prefetch-count": 7}
    shovel.set_shovel(broker, vhost, "p", value, None)
    scheduler.advance(0)
    q1, q2 = vhost.queues["q1"], vhost.queues["q2"]
    assert (q1.unacked_count, len(q1.store), len(q2.store)) == (7, 13, 7)
    fsync()
    assert (q1.unacked_count, len(q1.store), len(q2.store)) == (7, 6, 14)
    fsync()
    fsync()
    assert (q1.unacked_count, len(q1.store), len(q2.store)) == (0, 0, 20)
    assert _bodies(broker, "q2") == [b"%d" % i for i in range(20)]


def test_status_timestamps_are_formatted_as_rabbitmqs():
    """RabbitMQ's shovel management (format_ts) leaves the hour unpadded, pads the rest."""
    import time

    t = time.struct_time((2026, 1, 5, 3, 4, 5, 0, 5, 0))
    assert shovel._local_time(t) == "2026-01-05 3:04:05"
    assert shovel._local_time(time.struct_time((2026, 11, 28, 13, 0, 0, 0, 332, 0))) == "2026-11-28 13:00:00"
