"""configure / write / read permissions, as RabbitMQ enforces them.

A user whose permission regexes key off a name's prefix: the letters before the first dot
say what it may do, e.g. "cr.x" may be configured and read, "w.q" only written, "n.x"
nothing. Every refusal is a channel-level 403 ACCESS_REFUSED naming the resource.

Warren says "configure access to exchange 'x' in vhost 'v' refused for user 'u'" (the
wording of RabbitMQ 3.11+); RabbitMQ 3.10 leaves out the permission ("access to exchange
..."), which these tests accept when they run against it (WARREN_TEST_BROKER together with
WARREN_TEST_RABBITMQCTL to import the users).
"""

import re

import pika
import pytest
from pamqp import commands

from conftest import RABBITMQ, DefinitionsBroker, password_hash
from rawamqp import connect

VHOST = "warren-perm-vh"
USER, PASSWORD = "wt-perm-user", "perm-secret"
ADMIN, ADMIN_PASSWORD = "wt-perm-admin", "admin-secret"
DEFINITIONS = {
    "vhosts": [{"name": VHOST}],
    "users": [
        {"name": ADMIN, "password_hash": password_hash(ADMIN_PASSWORD),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""},
        {"name": USER, "password_hash": password_hash(PASSWORD),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""},
    ],
    "permissions": [
        {"user": ADMIN, "vhost": VHOST, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": USER, "vhost": VHOST, "configure": r"^[crw]*c[crw]*\.", "write": r"^[crw]*w[crw]*\.",
         "read": r"^[crw]*r[crw]*\."},
    ],
}
EXCHANGES = ["r.src", "w.dst", "n.x", "w.ae", "r.ae", "c.del"]
QUEUES = ["r.q", "w.q", "n.q", "r.purge", "c.delq"]
DEFAULT_EXCHANGE = "ACCESS_REFUSED - operation not permitted on the default exchange"


def refused(what: str, kind: str, name: str) -> str:
    if RABBITMQ:  # RabbitMQ 3.10's wording
        return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{VHOST}' refused for user '{USER}'"
    return f"ACCESS_REFUSED - {what} access to {kind} '{name}' in vhost '{VHOST}' refused for user '{USER}'"


@pytest.fixture(scope="module")
def perm_broker():
    b = DefinitionsBroker(DEFINITIONS)
    admin = pika.BlockingConnection(b.broker.pika_params(ADMIN, ADMIN_PASSWORD, VHOST))
    ch = admin.channel()
    for x in EXCHANGES:
        ch.exchange_declare(x, "fanout")
    ch.exchange_declare("c.existing", "direct", arguments={"alternate-exchange": "r.ae"})
    for q in QUEUES:
        ch.queue_declare(q)
    ch.basic_publish("", "r.q", b"readable")
    ch.basic_publish("", "r.purge", b"purge me")
    admin.close()
    yield b.broker
    b.stop()


@pytest.fixture(scope="module")
def user_conn(perm_broker):
    conn = pika.BlockingConnection(perm_broker.pika_params(USER, PASSWORD, VHOST))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def attempt(user_conn):
    """attempt(fn) runs fn(channel) on a fresh channel of the restricted user's connection;
    it returns None on success, or (code, text) of the channel.close it caused."""

    def run(fn):
        ch = user_conn.channel()
        try:
            fn(ch)
        except pika.exceptions.ChannelClosedByBroker as err:
            assert user_conn.is_open  # a soft error: only the channel closes
            return err.reply_code, err.reply_text
        ch.close()
        return None

    return run


def test_exchange_declare_needs_configure(attempt):
    assert attempt(lambda ch: ch.exchange_declare("c.new", "direct")) is None
    assert attempt(lambda ch: ch.exchange_declare("rw.new", "direct")) == (
        403, refused("configure", "exchange", "rw.new"))
    assert attempt(lambda ch: ch.exchange_declare("", "direct")) == (403, DEFAULT_EXCHANGE)


def test_passive_declares_need_no_permission(attempt):
    assert attempt(lambda ch: ch.exchange_declare("n.x", "fanout", passive=True)) is None
    assert attempt(lambda ch: ch.queue_declare("n.q", passive=True)) is None
    assert attempt(lambda ch: ch.queue_declare("n.missing", passive=True)) == (
        404, f"NOT_FOUND - no queue 'n.missing' in vhost '{VHOST}'")
    assert attempt(lambda ch: ch.exchange_declare("n.missing", "fanout", passive=True)) == (
        404, f"NOT_FOUND - no exchange 'n.missing' in vhost '{VHOST}'")


def test_exchange_delete_needs_configure(attempt):
    assert attempt(lambda ch: ch.exchange_delete("n.x")) == (403, refused("configure", "exchange", "n.x"))
    assert attempt(lambda ch: ch.exchange_delete("n.missing")) == (
        403, refused("configure", "exchange", "n.missing"))
    assert attempt(lambda ch: ch.exchange_delete("c.del")) is None


def test_queue_declare_needs_configure(attempt):
    assert attempt(lambda ch: ch.queue_declare("c.q", exclusive=True)) is None
    assert attempt(lambda ch: ch.queue_declare("rw.q", exclusive=True)) == (403, refused("configure", "queue", "rw.q"))
    # A server-named queue is checked under the name it would get.
    code, text = attempt(lambda ch: ch.queue_declare("", exclusive=True))
    pattern = re.escape(refused("configure", "queue", "NAME")).replace("NAME", r"amq\.gen-[A-Za-z0-9_-]{22}")
    assert code == 403 and re.fullmatch(pattern, text), text


def test_queue_delete_needs_configure(attempt):
    assert attempt(lambda ch: ch.queue_delete("n.q")) == (403, refused("configure", "queue", "n.q"))
    assert attempt(lambda ch: ch.queue_delete("n.missing")) == (403, refused("configure", "queue", "n.missing"))
    assert attempt(lambda ch: ch.queue_delete("c.delq")) is None


def test_queue_purge_needs_read(attempt):
    assert attempt(lambda ch: ch.queue_purge("n.q")) == (403, refused("read", "queue", "n.q"))
    # The permission is checked before the queue is looked up.
    assert attempt(lambda ch: ch.queue_purge("n.missing")) == (403, refused("read", "queue", "n.missing"))
    purged = []
    assert attempt(lambda ch: purged.append(ch.queue_purge("r.purge").method.message_count)) is None
    assert purged == [1]


def test_queue_bind_needs_write_on_the_queue_and_read_on_the_exchange(attempt):
    assert attempt(lambda ch: ch.queue_bind("n.q", "r.src")) == (403, refused("write", "queue", "n.q"))
    assert attempt(lambda ch: ch.queue_bind("w.q", "n.x")) == (403, refused("read", "exchange", "n.x"))
    assert attempt(lambda ch: ch.queue_bind("w.q", "r.src", "k")) is None
    assert attempt(lambda ch: ch.queue_unbind("n.q", "r.src", "k")) == (403, refused("write", "queue", "n.q"))
    assert attempt(lambda ch: ch.queue_unbind("w.q", "n.x", "k")) == (403, refused("read", "exchange", "n.x"))
    assert attempt(lambda ch: ch.queue_unbind("w.q", "r.src", "k")) is None
    # The write check comes before the default-exchange rule.
    assert attempt(lambda ch: ch.queue_bind("n.q", "")) == (403, refused("write", "queue", "n.q"))
    assert attempt(lambda ch: ch.queue_bind("w.q", "")) == (403, DEFAULT_EXCHANGE)


def test_exchange_bind_needs_write_on_the_destination_and_read_on_the_source(attempt):
    assert attempt(lambda ch: ch.exchange_bind("n.x", "r.src")) == (403, refused("write", "exchange", "n.x"))
    assert attempt(lambda ch: ch.exchange_bind("w.dst", "n.x")) == (403, refused("read", "exchange", "n.x"))
    assert attempt(lambda ch: ch.exchange_bind("w.dst", "r.src", "k")) is None
    assert attempt(lambda ch: ch.exchange_unbind("n.x", "r.src", "k")) == (403, refused("write", "exchange", "n.x"))
    assert attempt(lambda ch: ch.exchange_unbind("w.dst", "n.x", "k")) == (403, refused("read", "exchange", "n.x"))
    assert attempt(lambda ch: ch.exchange_unbind("w.dst", "r.src", "k")) is None
    # The default exchange is checked as amq.default, before the default-exchange rule.
    assert attempt(lambda ch: ch.exchange_bind("", "r.src")) == (403, refused("write", "exchange", "amq.default"))
    assert attempt(lambda ch: ch.exchange_bind("w.dst", "")) == (403, DEFAULT_EXCHANGE)


def _publish(exchange, routing_key="k"):
    def run(ch):
        ch.confirm_delivery()
        ch.basic_publish(exchange, routing_key, b"m")
    return run


def test_publish_needs_write_on_the_exchange(attempt):
    assert attempt(_publish("n.x")) == (403, refused("write", "exchange", "n.x"))
    assert attempt(_publish("w.dst")) is None
    # The default exchange is checked as amq.default.
    assert attempt(_publish("", "w.q")) == (403, refused("write", "exchange", "amq.default"))
    # The permission comes before the exchange's existence.
    assert attempt(_publish("n.missing")) == (403, refused("write", "exchange", "n.missing"))
    assert attempt(_publish("w.missing")) == (404, f"NOT_FOUND - no exchange 'w.missing' in vhost '{VHOST}'")


def test_get_and_consume_need_read(attempt):
    assert attempt(lambda ch: ch.basic_get("n.q")) == (403, refused("read", "queue", "n.q"))
    assert attempt(lambda ch: ch.basic_get("n.missing")) == (403, refused("read", "queue", "n.missing"))
    got = []
    assert attempt(lambda ch: got.append(ch.basic_get("r.q", auto_ack=True)[2])) is None
    assert got == [b"readable"]
    assert attempt(lambda ch: ch.basic_consume("n.q", lambda *a: None)) == (403, refused("read", "queue", "n.q"))
    assert attempt(lambda ch: ch.basic_consume("n.missing", lambda *a: None)) == (
        403, refused("read", "queue", "n.missing"))
    assert attempt(lambda ch: ch.basic_consume("r.q", lambda *a: None)) is None


def _declare_with_ae(name, ae):
    return lambda ch: ch.exchange_declare(name, "direct", arguments={"alternate-exchange": ae})


def test_alternate_exchange_needs_read_on_the_exchange_and_write_on_the_ae(attempt):
    """RabbitMQ's rule: "in addition to the usual configure permission on the declared
    exchange, the user needs to have read permissions on that exchange and write
    permissions on the AE"."""
    assert attempt(_declare_with_ae("cr.ae1", "w.ae")) is None
    assert attempt(_declare_with_ae("rw.ae2", "w.ae")) == (403, refused("configure", "exchange", "rw.ae2"))
    assert attempt(_declare_with_ae("c.ae3", "w.ae")) == (403, refused("read", "exchange", "c.ae3"))
    assert attempt(_declare_with_ae("cr.ae4", "r.ae")) == (403, refused("write", "exchange", "r.ae"))
    # The AE need not exist yet.
    assert attempt(_declare_with_ae("cr.ae5", "w.later")) is None
    # Only a new exchange is checked: redeclaring an existing one needs configure alone.
    assert attempt(_declare_with_ae("c.existing", "r.ae")) is None


def test_dead_letter_exchange_needs_read_on_the_queue_and_write_on_the_dlx(attempt):
    def declare(name, dlx):
        return lambda ch: ch.queue_declare(name, exclusive=True, arguments={"x-dead-letter-exchange": dlx})
    assert attempt(declare("cr.dq1", "w.dst")) is None
    assert attempt(declare("c.dq2", "w.dst")) == (403, refused("read", "queue", "c.dq2"))
    assert attempt(declare("cr.dq3", "r.src")) == (403, refused("write", "exchange", "r.src"))


def test_refusal_is_a_channel_close_naming_the_method(perm_broker):
    with connect(perm_broker, user=USER, password=PASSWORD, vhost=VHOST) as client:
        client.open_channel(1)
        client.send_method(1, commands.Exchange.Declare(exchange="n.new", exchange_type="direct"))
        close = client.expect_channel_close(1, 403, refused("configure", "exchange", "n.new"))
        assert (close.class_id, close.method_id) == (40, 10)
        client.open_channel(2)
        client.send_method(2, commands.Basic.Publish(exchange="n.x", routing_key="k"))
        client.send_content(2, b"m")
        close = client.expect_channel_close(2, 403, refused("write", "exchange", "n.x"))
        assert (close.class_id, close.method_id) == (60, 40)
        # The connection is fine: a permitted declare still works.
        client.open_channel(3)
        client.send_method(3, commands.Queue.Declare(queue="c.raw", exclusive=True))
        assert client.expect(commands.Queue.DeclareOk, 3).queue == "c.raw"
