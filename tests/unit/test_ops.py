"""The operations layer without any protocol: the rules every way in shares."""

import pytest

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.auth import User
from warren.broker.broker import Broker
from warren.broker.errors import AMQPError
from warren.broker.metadata import commands as c
from warren.broker.links import ConnectionLink, ExclusiveOwner
from warren.store.settlement import SETTLED


@pytest.fixture
def broker():
    b = Broker.with_defaults()
    b.metadata.apply(c.PutUser(User.with_password("bob", "pw")))
    # bob may configure and read anything, but write only to "out." exchanges and queues.
    b.metadata.apply(c.SetPermissions("bob", "/", ".*", "^out\\.", ".*"))
    return b


def actor(broker, user="guest", connection=None):
    return ops.Actor(broker, broker.users[user], broker.vhosts["/"], connection)


def code_of(call, *args, **kwargs):
    with pytest.raises(AMQPError) as info:
        call(*args, **kwargs)
    return info.value.code, info.value.text


def publish(a, exchange, routing_key, body=b"x", properties=None):
    route = shortstr(exchange) + shortstr(routing_key)
    message, queues = ops.route(a, exchange, routing_key, route, encode_header(len(body), properties or {}), body)
    return message, queues, ops.enqueue(message, queues)


def test_declare_queue_rules(broker):
    a = actor(broker)
    q, created = ops.declare_queue(a, "jobs", durable=True)
    assert created and q.durable and not q.exclusive
    assert ops.declare_queue(a, "jobs", durable=True) == (q, False)
    assert code_of(ops.declare_queue, a, "amq.x") == (403, "queue name 'amq.x' contains reserved prefix 'amq.*'")
    server_named, _ = ops.declare_queue(a, "")
    assert server_named.name.startswith("amq.gen-")
    assert code_of(ops.declare_queue, a, "missing", passive=True)[0] == 404


def test_exclusive_queue_belongs_to_its_connection(broker):
    link = ConnectionLink("127.0.0.1:1 -> 127.0.0.1:5672", "127.0.0.1", 1)
    owner, other = ExclusiveOwner.new("n", link), ExclusiveOwner.new("n", link)  # (same address, another connection)
    q, _ = ops.declare_queue(actor(broker, connection=owner), "mine", durable=True, exclusive=True)
    assert q.owner == owner and not q.durable  # exclusive queues are never durable
    for call in (lambda a: ops.purge_queue(a, "mine"), lambda a: ops.readable_queue(a, "mine"),
                 lambda a: ops.delete_queue(a, "mine"), lambda a: ops.bind(a, "amq.direct", "queue", "mine", "k", {})):
        assert code_of(call, actor(broker, connection=other))[0] == 405
        assert code_of(call, actor(broker))[0] == 405  # the HTTP API owns no queue
        # A connection of another node with the same id is another owner.
        assert code_of(call, actor(broker, connection=ExclusiveOwner("m", owner.id, link)))[0] == 405
    assert ops.readable_queue(actor(broker, connection=owner), "mine") is q


def test_dlx_needs_read_on_queue_and_write_on_dlx(broker):
    bob = actor(broker, "bob")
    code, text = code_of(ops.declare_queue, bob, "q1", arguments={"x-dead-letter-exchange": "dlx"})
    assert code == 403 and text == "write access to exchange 'dlx' in vhost '/' refused for user 'bob'"
    ops.declare_queue(bob, "q1", arguments={"x-dead-letter-exchange": "out.dlx"})
    code, text = code_of(ops.declare_queue, bob, "q2", arguments={"x-dead-letter-exchange": 5})
    assert code == 406 and "invalid type 'signedint' for arg 'x-dead-letter-exchange'" in text


def test_exchange_rules(broker):
    a = actor(broker)
    assert code_of(ops.declare_exchange, a, "x", "nope")[0] == 503
    assert code_of(ops.declare_exchange, a, "", "direct")[0] == 403
    assert code_of(ops.declare_exchange, a, "amq.mine", "direct")[0] == 403
    assert code_of(ops.delete_exchange, a, "amq.direct") == (
        403, "deletion of system exchange 'amq.direct' in vhost '/' not allowed")
    x, created = ops.declare_exchange(a, "x", "topic")
    assert created and x.type_name == "topic"
    assert ops.declare_exchange(a, "x", "topic", passive=True) == (x, False)
    assert ops.delete_exchange(a, "x") and not ops.delete_exchange(a, "x")


def test_alternate_exchange_needs_write_on_the_ae(broker):
    bob = actor(broker, "bob")
    code, text = code_of(ops.declare_exchange, bob, "x", "direct", arguments={"alternate-exchange": "ae"})
    assert code == 403 and "exchange 'ae'" in text
    ops.declare_exchange(bob, "x", "direct", arguments={"alternate-exchange": "out.ae"})


def test_binding_order_and_idempotent_unbind(broker):
    a, bob = actor(broker), actor(broker, "bob")
    ops.declare_queue(a, "q")
    # write on the destination is checked before the default-exchange rule
    assert code_of(ops.bind, bob, "", "queue", "q", "k", {})[0] == 403
    assert code_of(ops.bind, a, "", "queue", "q", "k", {}) == (403, "operation not permitted on the default exchange")
    assert code_of(ops.bind, a, "nope", "queue", "q", "k", {}) == (404, "no exchange 'nope' in vhost '/'")
    ops.bind(a, "amq.direct", "queue", "q", "k", {})
    assert [b.destination.name for b in broker.vhosts["/"].exchanges["amq.direct"].bindings.values()] == ["q"]
    ops.unbind(a, "amq.direct", "queue", "q", "k", {})
    ops.unbind(a, "amq.direct", "queue", "q", "k", {})  # again: no error
    ops.unbind(a, "amq.direct", "queue", "gone", "k", {})
    assert not broker.vhosts["/"].exchanges["amq.direct"].bindings


def test_delete_queue_conditions(broker):
    a = actor(broker)
    q, _ = ops.declare_queue(a, "q")
    publish(a, "", "q")
    assert code_of(ops.delete_queue, a, "q", if_empty=True) == (406, "queue 'q' in vhost '/' not empty")
    assert ops.delete_queue(a, "q") == 1 and q.deleted
    assert ops.delete_queue(a, "q") == 0  # a missing queue is no error


def test_publish_routes_checks_and_counts(broker):
    a, bob = actor(broker), actor(broker, "bob")
    q, _ = ops.declare_queue(a, "out.q")
    message, queues, batch = publish(a, "", "out.q", b"hello")
    assert queues == [q] and batch is SETTLED and q.message_count == 1 and message.body == b"hello"
    assert publish(a, "amq.direct", "nowhere")[1] == []
    x = broker.vhosts["/"].exchanges["amq.direct"]
    assert x.stats["publish_in"] == 1 and x.stats["publish_out"] == 0
    assert code_of(publish, bob, "amq.direct", "k")[0] == 403
    assert code_of(publish, a, "missing", "k") == (404, "no exchange 'missing' in vhost '/'")
    assert code_of(publish, a, "amq.rabbitmq.trace", "k")[0] == 403  # internal
    assert code_of(publish, a, "", "out.q", properties={"user_id": "someone"})[0] == 406
    assert code_of(publish, a, "", "out.q", properties={"expiration": "-1"})[0] == 406


def test_write_permission_is_cached_per_actor_but_internal_is_not(broker):
    a = actor(broker)
    ops.declare_exchange(a, "x", "fanout")
    publish(a, "x", "")
    assert "x" in a.writable
    ops.delete_exchange(a, "x")
    ops.declare_exchange(a, "x", "fanout", internal=True)
    assert code_of(publish, a, "x", "")[0] == 403


def test_message_size_limit(broker):
    broker.config.limits.max_message_size = 10
    ops.check_message_size(broker, 10)
    assert code_of(ops.check_message_size, broker, 11) == (
        406, "message size 11 is larger than configured max size 10")
