"""SASL PLAIN and AMQPLAIN logins, refused logins and vhost access.

The tests with extra users load a RabbitMQ definitions file (users given by RabbitMQ's
password hashes): a fresh Warren with --definitions, or RabbitMQ itself when
WARREN_TEST_RABBITMQCTL says how to import them there.
"""

import amqp
import kombu
import pika
import pytest
from pamqp import commands

from conftest import DefinitionsBroker, password_hash
from rawamqp import connect, dial

LOGIN_REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism {}. For details see the broker logfile."

VHOST = "warren-auth-vh"
DEFINITIONS = {
    "vhosts": [{"name": VHOST}],
    "users": [
        {"name": "wt-auth-admin", "password_hash": password_hash("admin-secret"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "administrator"},
        # Only a hash, and no hashing_algorithm: RabbitMQ's default, SHA-256.
        {"name": "wt-auth-hashonly", "password_hash": password_hash("hash-secret", salt=b"\x01\x02\x03\x04"),
         "tags": ""},
        {"name": "wt-auth-sha512", "password_hash": password_hash("sha512-secret", "sha512"),
         "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": ""},
        {"name": "wt-auth-noperm", "password_hash": password_hash("noperm-secret"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""},
    ],
    "permissions": [
        {"user": "wt-auth-admin", "vhost": VHOST, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "wt-auth-admin", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "wt-auth-hashonly", "vhost": VHOST, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "wt-auth-sha512", "vhost": VHOST, "configure": "", "write": "", "read": ".*"},
    ],
}


@pytest.fixture(scope="module")
def users_broker():
    b = DefinitionsBroker(DEFINITIONS)
    yield b.broker
    b.stop()


def py_amqp(b, user, password, vhost="/", mechanism="AMQPLAIN"):
    return amqp.Connection(f"{b.host}:{b.port}", userid=user, password=password, virtual_host=vhost,
                           login_method=mechanism, connect_timeout=5)


def assert_works(conn_channel):
    q = conn_channel.queue_declare("", exclusive=True).method.queue
    conn_channel.basic_publish("", q, b"hi")
    assert conn_channel.basic_get(q, auto_ack=True)[2] == b"hi"


# --------------------------------------------------------------------------- guest/guest

def test_plain_login_with_pika(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        assert_works(conn.channel())
    finally:
        conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_raw_login(broker, mechanism):
    with connect(broker, mechanism=mechanism) as client:
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        assert client.expect(commands.Queue.DeclareOk, 1).queue.startswith("amq.gen-")


def test_amqplain_login_with_py_amqp(broker):
    conn = py_amqp(broker, "guest", "guest")
    conn.connect()
    try:
        assert conn.server_properties["capabilities"]["authentication_failure_close"] is True
        ch = conn.channel()
        q, _, _ = ch.queue_declare("", exclusive=True)
        ch.basic_publish(amqp.Message("via AMQPLAIN"), "", q)
        assert ch.basic_get(q, no_ack=True).body == "via AMQPLAIN"
    finally:
        conn.close()


def test_amqplain_login_with_kombu(broker):
    with kombu.Connection(f"amqp://guest:guest@{broker.host}:{broker.port}//", login_method="AMQPLAIN",
                          connect_timeout=5) as conn:
        with conn.SimpleQueue(f"auth-kombu-{id(conn)}", queue_opts={"exclusive": True}) as sq:
            sq.put({"hello": "kombu"})
            msg = sq.get(timeout=5)
            assert msg.payload == {"hello": "kombu"}
            msg.ack()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize("user", ["guest", "no-such-user"])
def test_refused_login_is_403_for_clients_with_authentication_failure_close(broker, mechanism, user):
    with dial(broker) as client:
        client.start_handshake()
        client.login(user, "wrong-password", mechanism=mechanism)
        client.expect_connection_close(403, LOGIN_REFUSED.format(mechanism), 0, 0)


def test_refused_login_with_pika(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as err:
        pika.BlockingConnection(broker.pika_params("guest", "wrong-password"))
    assert f"(403) '{LOGIN_REFUSED.format('PLAIN')}'" in str(err.value)


def test_refused_login_with_py_amqp(broker):
    conn = py_amqp(broker, "guest", "wrong-password")
    with pytest.raises(amqp.exceptions.AccessRefused) as err:
        conn.connect()
    assert err.value.reply_text == LOGIN_REFUSED.format("AMQPLAIN")


def test_unknown_vhost_is_530(broker, uid):
    vhost = f"no-such-vhost-{uid}"
    with dial(broker) as client:
        client.handshake(open_vhost=False)
        client.send_method(0, commands.Connection.Open(virtual_host=vhost))
        client.expect_connection_close(530, f"NOT_ALLOWED - vhost {vhost} not found", 10, 40)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        pika.BlockingConnection(broker.pika_params("guest", "guest", vhost))
    assert f"NOT_ALLOWED - vhost {vhost} not found" in str(err.value)


# -------------------------------------------------------------- users from definitions

def test_user_given_only_by_a_password_hash_logs_in(users_broker):
    conn = pika.BlockingConnection(users_broker.pika_params("wt-auth-hashonly", "hash-secret", VHOST))
    try:
        assert_works(conn.channel())
    finally:
        conn.close()
    conn = py_amqp(users_broker, "wt-auth-hashonly", "hash-secret", VHOST, "AMQPLAIN")
    conn.connect()
    conn.close()
    with connect(users_broker, user="wt-auth-hashonly", password="hash-secret", vhost=VHOST,
                 mechanism="AMQPLAIN") as client:
        client.open_channel(1)


def test_wrong_password_for_a_hashed_user(users_broker):
    with dial(users_broker) as client:
        client.start_handshake()
        client.login("wt-auth-hashonly", "hash-secre")
        client.expect_connection_close(403, LOGIN_REFUSED.format("PLAIN"), 0, 0)


def test_sha512_password_hash(users_broker):
    conn = pika.BlockingConnection(users_broker.pika_params("wt-auth-sha512", "sha512-secret", VHOST))
    try:
        assert conn.channel().is_open
    finally:
        conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(users_broker.pika_params("wt-auth-sha512", "sha256-secret", VHOST))


@pytest.mark.parametrize("user,password,vhost", [
    ("wt-auth-noperm", "noperm-secret", "/"),
    ("wt-auth-noperm", "noperm-secret", VHOST),
    ("wt-auth-hashonly", "hash-secret", "/"),
])
def test_user_without_permissions_on_the_vhost_is_530(users_broker, user, password, vhost):
    text = f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'"
    with dial(users_broker) as client:
        client.handshake(user, password, open_vhost=False)
        client.send_method(0, commands.Connection.Open(virtual_host=vhost))
        client.expect_connection_close(530, text, 10, 40)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        pika.BlockingConnection(users_broker.pika_params(user, password, vhost))
    assert text in str(err.value)


def test_vhosts_from_definitions_are_separate(users_broker, uid):
    q = f"auth-vh-{uid}"
    conn = pika.BlockingConnection(users_broker.pika_params("wt-auth-admin", "admin-secret", VHOST))
    try:
        ch = conn.channel()
        ch.queue_declare(q, auto_delete=True)
        other = pika.BlockingConnection(users_broker.pika_params("wt-auth-admin", "admin-secret", "/"))
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                other.channel().queue_declare(q, passive=True)
            assert err.value.reply_text == f"NOT_FOUND - no queue '{q}' in vhost '/'"
        finally:
            other.close()
        ch.queue_declare(q, passive=True)
    finally:
        conn.close()


def test_the_default_user_still_works_beside_definitions(users_broker):
    conn = pika.BlockingConnection(users_broker.pika_params("guest", "guest"))
    try:
        assert_works(conn.channel())
    finally:
        conn.close()
