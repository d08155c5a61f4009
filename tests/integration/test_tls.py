"""AMQPS, HTTPS and the EXTERNAL mechanism (issue 15, TLS), with certificates made here
(tls_certs.py) and Warren started with RabbitMQ's TLS config keys.

Two brokers: `tls` (rabbitmq.conf format: verify_peer, a client certificate optional,
EXTERNAL with the distinguished name, the API also over HTTPS) and `strict` (the classic
Erlang format: fail_if_no_peer_cert, TLS 1.2 only, EXTERNAL with the common name). RabbitMQ's
answers these tests copy (mechanisms, refusals, the API's ssl fields) were checked against
RabbitMQ 3.10.8 with `tools/rabbitmq_node.py run --conf ...`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import time

import pika
import pytest
import requests
from pamqp import commands

from conftest import EXTERNAL, free_port, start_broker
from rawamqp import PROTOCOL_HEADER, RawClient
from tls_certs import TestCerts

pytestmark = pytest.mark.skipif(
    bool(EXTERNAL), reason="starts its own Warren with TLS listeners (a RabbitMQ node needs them in its config file)")

DN_USER = "O=Warren Tests,CN=alice"  # rabbitmq_auth_mechanism_ssl's default: the subject's DN
LOGIN_REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism {}. For details see the broker logfile."


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return TestCerts.make(str(tmp_path_factory.mktemp("tls")))


def _definitions(path: str, users: list[str]) -> str:
    """Users without a password (they can only log in with EXTERNAL) and their permissions."""
    with open(path, "w") as f:
        json.dump({"users": [{"name": u, "password_hash": "", "tags": ""} for u in users],
                   "permissions": [{"user": u, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
                                   for u in users]}, f)
    return path


def _wait_for_port(port: int, broker) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}:\n{broker.log()}")


@pytest.fixture(scope="module")
def tls(certs):
    tls_port, https_port = free_port(), free_port()
    conf = os.path.join(certs.dir, "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write(f"""# AMQPS beside AMQP, a client certificate asked for and checked when sent
listeners.ssl.default = {tls_port}
ssl_options.cacertfile = {certs.ca}
ssl_options.certfile = {certs.server_cert}
ssl_options.keyfile = {certs.server_key}
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
management.ssl.port = {https_port}
management.ssl.cacertfile = {certs.ca}
management.ssl.certfile = {certs.server_cert}
management.ssl.keyfile = {certs.server_key}
""")
    b = start_broker("--config", conf, "--definitions",
                     _definitions(os.path.join(certs.dir, "tls-users.json"), [DN_USER]))
    b.tls_port, b.https_port = tls_port, https_port
    _wait_for_port(tls_port, b)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def strict(certs):
    tls_port = free_port()
    conf = os.path.join(certs.dir, "strict.config")
    with open(conf, "w") as f:
        f.write(f"""[{{rabbit, [
  {{ssl_listeners, [{{"127.0.0.1", {tls_port}}}]}},
  {{ssl_options, [{{cacertfile, "{certs.ca}"}}, {{certfile, "{certs.server_cert}"}},
                 {{keyfile, "{certs.server_key}"}}, {{verify, verify_peer}},
                 {{fail_if_no_peer_cert, true}}, {{versions, ['tlsv1.2']}}]}},
  {{auth_mechanisms, ['PLAIN', 'EXTERNAL']}},
  {{ssl_cert_login_from, common_name}}]}}].
""")
    b = start_broker("--config", conf, "--definitions",
                     _definitions(os.path.join(certs.dir, "strict-users.json"), ["carol"]))
    b.tls_port = tls_port
    _wait_for_port(tls_port, b)
    yield b
    b.stop()


def context(certs, cert=None, version=None) -> ssl.SSLContext:
    """A client context that trusts the test CA, with a client certificate if given."""
    ctx = ssl.create_default_context(cafile=certs.ca)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def pika_params(broker, ctx, credentials=None) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", broker.tls_port, ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     credentials=credentials or pika.PlainCredentials("guest", "guest"),
                                     connection_attempts=1, socket_timeout=5)


def raw_tls(broker, ctx) -> RawClient:
    client = RawClient("127.0.0.1", broker.tls_port)
    client.sock = ctx.wrap_socket(client.sock, server_hostname="localhost")
    return client


def api(broker, path):
    r = requests.get(f"{broker.api}{path}", auth=("guest", "guest"), timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def roundtrip(channel, body: bytes) -> bytes:
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, body)
    for _method, _props, got in channel.consume(queue, inactivity_timeout=5):
        channel.cancel()
        return got
    raise AssertionError("nothing delivered")


def connection_info(broker, user: str) -> dict:
    """The API's view of the (one) open connection of `user`."""
    for _ in range(50):
        found = [c for c in api(broker, "/connections") if c["user"] == user]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no connection of {user}")


# AMQPS with the clients --------------------------------------------------------------------

def test_pika_publishes_and_consumes_over_tls(tls, certs):
    with pika.BlockingConnection(pika_params(tls, context(certs))) as conn:
        assert roundtrip(conn.channel(), b"over TLS") == b"over TLS"
        info = connection_info(tls, "guest")
        assert info["ssl"] is True and info["auth_mechanism"] == "PLAIN"
        assert info["port"] == tls.tls_port
        # As RabbitMQ 3.10.8 shows a TLS 1.3 connection (no client certificate: no peer_cert_*).
        assert (info["ssl_protocol"], info["ssl_cipher"], info["ssl_key_exchange"], info["ssl_hash"]) == (
            "tlsv1.3", "aes_256_gcm", "any", "aead")
        assert info["peer_cert_subject"] is None and info["peer_cert_issuer"] is None


def test_aio_pika_over_tls_with_a_client_certificate(tls, certs):
    import aio_pika
    big = os.urandom(3 << 20)  # many TLS records each way

    async def main():
        conn = await aio_pika.connect(f"amqps://guest:guest@localhost:{tls.tls_port}/",
                                      ssl_context=context(certs, certs.client("alice")), timeout=5)
        async with conn:
            channel = await conn.channel()  # publisher confirms
            queue = await channel.declare_queue("", exclusive=True)
            bodies = [b"aio over TLS %d" % i for i in range(300)] + [big]
            await asyncio.gather(*(channel.default_exchange.publish(aio_pika.Message(b), routing_key=queue.name)
                                   for b in bodies))
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    got.append(message.body)
                    if len(got) == len(bodies):
                        break
            return got == bodies, connection_info(tls, "guest")

    same, info = asyncio.run(main())
    assert same
    # The certificate is shown even when the login used a password, as in RabbitMQ.
    assert info["peer_cert_subject"] == DN_USER
    assert info["peer_cert_issuer"] == "CN=Warren Test CA"
    assert " - " in info["peer_cert_validity"] and info["peer_cert_validity"].endswith("Z")


def test_kombu_over_tls(tls, certs):
    import kombu
    with kombu.Connection(f"amqps://guest:guest@127.0.0.1:{tls.tls_port}//", connect_timeout=5,
                          ssl={"ca_certs": certs.ca, "cert_reqs": ssl.CERT_REQUIRED,
                               "server_hostname": "localhost"}) as conn:
        queue = kombu.Queue("tls-kombu", exclusive=True)
        with conn.Producer() as producer:
            producer.publish({"over": "TLS"}, routing_key="tls-kombu", declare=[queue], serializer="json")
        with conn.SimpleQueue(queue) as simple:
            message = simple.get(timeout=5)
            message.ack()
            assert message.payload == {"over": "TLS"}


# EXTERNAL ------------------------------------------------------------------------------------

def test_external_logs_in_as_the_certificate_subject(tls, certs):
    alice = certs.client("alice")
    ctx = context(certs, alice)
    with pika.BlockingConnection(pika_params(tls, ctx, pika.credentials.ExternalCredentials())) as conn:
        assert roundtrip(conn.channel(), b"as alice") == b"as alice"
        info = connection_info(tls, DN_USER)
        assert info["auth_mechanism"] == "EXTERNAL" and info["peer_cert_subject"] == DN_USER

    async def with_aio_pika():
        import aio_pika
        conn = await aio_pika.connect(f"amqps://localhost:{tls.tls_port}/?auth=external", ssl_context=ctx, timeout=5)
        async with conn:
            await conn.channel()
            return [c["auth_mechanism"] for c in api(tls, "/connections") if c["user"] == DN_USER]

    assert asyncio.run(with_aio_pika()) == ["EXTERNAL"]
    import kombu  # py-amqp's EXTERNAL
    with kombu.Connection(f"amqps://127.0.0.1:{tls.tls_port}//", login_method="EXTERNAL", connect_timeout=5,
                          ssl={"ca_certs": certs.ca, "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost",
                               "certfile": alice[0], "keyfile": alice[1]}) as conn:
        conn.connect()
        assert [c["auth_mechanism"] for c in api(tls, "/connections") if c["user"] == DN_USER] == ["EXTERNAL"]


def test_mechanisms_offered(tls, certs):
    # EXTERNAL over TLS only, with or without a client certificate (rabbit_auth_mechanism_ssl
    # offers it on every TLS connection, and refuses the login without a certificate).
    for ctx in (context(certs), context(certs, certs.client("alice"))):
        with raw_tls(tls, ctx) as client:
            assert client.start_handshake().mechanisms == "PLAIN AMQPLAIN EXTERNAL"
    with RawClient(tls.host, tls.port) as client:
        assert client.start_handshake().mechanisms == "PLAIN AMQPLAIN"
        # Named anyway on plain TCP: "invalid authentication mechanism" (tests/unit/test_tls.py),
        # no tune; the socket closes after RabbitMQ's silent 3 s.
        client.login(mechanism="EXTERNAL", response=b"")
        assert client.frames_until_quiet(0.3) == []
    node = api(tls, "/nodes")[0]
    assert [(m["name"], m["enabled"]) for m in node["auth_mechanisms"]] == [
        ("PLAIN", True), ("AMQPLAIN", True), ("EXTERNAL", True)]


@pytest.mark.parametrize("cert", [None, "mallory"], ids=["no certificate", "no such user"])
def test_external_refused(tls, certs, cert):
    ctx = context(certs, certs.client(cert) if cert else None)
    with raw_tls(tls, ctx) as client:
        client.start_handshake()
        client.login(mechanism="EXTERNAL", response=b"")
        client.expect_connection_close(403, LOGIN_REFUSED.format("EXTERNAL"), 0, 0)
    reason = ("user 'O=Warren Tests,CN=mallory' - invalid credentials" if cert else
              "connection peer presented no TLS (x.509) certificate")
    deadline = time.monotonic() + 5
    while f"EXTERNAL login refused: {reason}" not in tls.log():
        assert time.monotonic() < deadline, tls.log()[-2000:]
        time.sleep(0.05)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika_params(tls, ctx, pika.credentials.ExternalCredentials()))


def test_external_with_the_common_name_and_a_required_certificate(strict, certs):
    ctx = context(certs, certs.client("carol"))
    with pika.BlockingConnection(pika_params(strict, ctx, pika.credentials.ExternalCredentials())) as conn:
        assert roundtrip(conn.channel(), b"as carol") == b"as carol"
        info = connection_info(strict, "carol")
        # TLS 1.2 only (versions), named as RabbitMQ 3.10.8 names this suite.
        assert (info["ssl_protocol"], info["ssl_cipher"], info["ssl_key_exchange"], info["ssl_hash"]) == (
            "tlsv1.2", "aes_256_gcm", "ecdhe_ecdsa", "aead")
        assert info["peer_cert_subject"] == "O=Warren Tests,CN=carol"
    with raw_tls(strict, context(certs, certs.client("carol"))) as client:
        assert client.start_handshake().mechanisms == "PLAIN EXTERNAL"


# Refused at the TLS layer ----------------------------------------------------------------------

def _tls_refused(broker, ctx, alert: str) -> None:
    """The handshake fails with the TLS alert named (the client sees it in the handshake, or,
    with TLS 1.3, where it is done before the server has checked its certificate, at its
    first read), as with RabbitMQ; then a pika client fails the same way."""
    with pytest.raises(ssl.SSLError, match=alert):
        with socket.create_connection(("127.0.0.1", broker.tls_port), timeout=5) as sock:
            with ctx.wrap_socket(sock, server_hostname="localhost") as tls_sock:
                tls_sock.sendall(PROTOCOL_HEADER)
                tls_sock.recv(1)
    # pika lets the handshake's error through, or (TLS 1.3) reports the lost stream with it.
    with pytest.raises((ssl.SSLError, pika.exceptions.AMQPConnectionError), match=alert):
        pika.BlockingConnection(pika_params(broker, ctx))


def test_a_certificate_from_another_ca_is_refused(tls, strict, certs):
    for broker in (tls, strict):
        _tls_refused(broker, context(certs, certs.client("mallory", ca="other")), "unknown ca")
    assert "TLS handshake from 127.0.0.1:" in strict.log()


def test_fail_if_no_peer_cert_refuses_a_client_without_one(strict, certs):
    _tls_refused(strict, context(certs), "handshake failure")
    # A TLS 1.3 client meets a TLS 1.2-only listener: no common version.
    _tls_refused(strict, context(certs, certs.client("carol"), ssl.TLSVersion.TLSv1_3), "protocol version")


def test_a_plaintext_client_on_the_tls_port_is_refused_cleanly(tls, certs):
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", tls.tls_port), timeout=5) as sock:
            sock.sendall(PROTOCOL_HEADER)
            # RabbitMQ's answer: a fatal unexpected_message TLS alert, then the socket closes.
            assert sock.recv(100) == b"\x15\x03\x01\x00\x02\x02\x0a"
            assert sock.recv(100) == b""
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls.tls_port, connection_attempts=1,
                                                          socket_timeout=3))
    # The broker keeps serving, over TLS and over TCP.
    assert tls.proc.poll() is None
    with pika.BlockingConnection(pika_params(tls, context(certs))) as conn:
        assert roundtrip(conn.channel(), b"still here") == b"still here"
    with pika.BlockingConnection(tls.pika_params()) as conn:
        assert roundtrip(conn.channel(), b"tcp too") == b"tcp too"
    assert "Traceback" not in tls.log()
    assert "failed: WRONG_VERSION_NUMBER (a plaintext AMQP client on the TLS port)" in tls.log()


# HTTPS -------------------------------------------------------------------------------------------

def test_management_api_over_https(tls, certs):
    url = f"https://localhost:{tls.https_port}/api/overview"
    r = requests.get(url, auth=("guest", "guest"), verify=certs.ca, timeout=5)
    assert r.status_code == 200
    listeners = {(entry["protocol"], entry["port"]) for entry in r.json()["listeners"]}
    assert {("amqp", tls.port), ("amqp/ssl", tls.tls_port), ("http", tls.mgmt_port),
            ("https", tls.https_port)} <= listeners
    amqps = next(e for e in r.json()["listeners"] if e["protocol"] == "amqp/ssl")
    assert amqps["socket_opts"]["verify"] == "verify_peer" and "password" not in amqps["socket_opts"]
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, auth=("guest", "guest"), timeout=5)  # a CA the system does not know

    async def with_aiohttp():
        import aiohttp
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        async with aiohttp.ClientSession() as session:
            async with session.get(url, ssl=context(certs), headers=auth) as response:
                return response.status, (await response.json())["node"]

    assert asyncio.run(with_aiohttp()) == (200, "warren@localhost")


def test_health_checks_see_the_tls_listeners(tls):
    r = requests.get(f"{tls.api}/health/checks/protocol-listener/amqps", auth=("guest", "guest"), timeout=5)
    assert r.status_code == 200 and r.json() == {"status": "ok", "protocol": "amqp/ssl"}
    r = requests.get(f"{tls.api}/health/checks/port-listener/{tls.tls_port}", auth=("guest", "guest"), timeout=5)
    assert r.status_code == 200
    assert api(tls, "/health/checks/certificate-expiration/1/days") == {"status": "ok"}
    # The test certificates expire in 3 days.
    r = requests.get(f"{tls.api}/health/checks/certificate-expiration/1/weeks", auth=("guest", "guest"), timeout=5)
    assert r.status_code == 503
    body = r.json()
    assert body["reason"] == "Certificates expiring"
    entry = body["expired"][0]
    assert (entry["protocol"], entry["port"]) == ("amqp/ssl", tls.tls_port)
    assert len(entry["certfile_expires_on"]) == 1 and len(entry["cacertfile_expires_on"]) == 1


# Shovels over AMQPS (docs/links.md): the broker's own TLS port as "another broker" ------------

def _shovel(broker, name: str, dest_uri: str) -> None:
    with pika.BlockingConnection(broker.pika_params()) as conn:
        ch = conn.channel()
        ch.queue_declare(f"{name}-src", durable=True)
        ch.queue_declare(f"{name}-dst", durable=True)
        ch.basic_publish("", f"{name}-src", b"over amqps", pika.BasicProperties(delivery_mode=2))
    r = requests.put(f"{broker.api}/parameters/shovel/%2F/{name}", auth=("guest", "guest"), timeout=5,
                     json={"value": {"src-uri": "amqp://", "src-queue": f"{name}-src", "dest-uri": dest_uri,
                                     "dest-queue": f"{name}-dst", "reconnect-delay": 1}})
    assert r.status_code == 201, r.text


def _state(broker, name: str) -> str | None:
    return next((s["state"] for s in api(broker, "/shovels") if s["name"] == name), None)


def test_a_shovel_over_amqps_checks_the_server_and_sends_a_certificate(tls, certs):
    """verify_peer against the test CA (and the host name), a client certificate given by
    certfile/keyfile: the connection is TLS, named "Shovel NAME", and moves the message."""
    cert, key = certs.client("shovel-client")
    uri = (f"amqps://guest:guest@localhost:{tls.tls_port}/%2F?cacertfile={certs.ca}&verify=verify_peer"
           f"&certfile={cert}&keyfile={key}")
    _shovel(tls, "tls-ok", uri)
    deadline = time.monotonic() + 10
    while _state(tls, "tls-ok") != "running":
        assert time.monotonic() < deadline, api(tls, "/shovels")
        time.sleep(0.05)
    [link] = [c for c in api(tls, "/connections") if c.get("client_properties", {}).get("connection_name")
              == "Shovel tls-ok"]
    assert link["ssl"] is True and link["peer_cert_subject"] == "O=Warren Tests,CN=shovel-client"
    with pika.BlockingConnection(tls.pika_params()) as conn:
        deadline = time.monotonic() + 10
        while (got := conn.channel().basic_get("tls-ok-dst", auto_ack=True))[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert got[2] == b"over amqps"
    [status] = [s for s in api(tls, "/shovels") if s["name"] == "tls-ok"]
    assert status["dest_uri"] == f"amqps://localhost:{tls.tls_port}/%2F"  # (no credentials, no query)


def test_a_shovel_over_amqps_refuses_a_server_it_cannot_verify(tls, certs):
    """verify_peer with a CA that did not sign the server's certificate: the TLS handshake
    fails, the shovel stays "starting" (RabbitMQ's status for a failed connect), nothing moves."""
    other_ca = os.path.join(certs.dir, "other.pem")
    _shovel(tls, "tls-bad", f"amqps://guest:guest@localhost:{tls.tls_port}/%2F?cacertfile={other_ca}"
                            "&verify=verify_peer")
    time.sleep(1.5)
    assert _state(tls, "tls-bad") == "starting"
    with pika.BlockingConnection(tls.pika_params()) as conn:
        ch = conn.channel()
        assert ch.queue_declare("tls-bad-src", passive=True).method.message_count == 1
        assert ch.queue_declare("tls-bad-dst", passive=True).method.message_count == 0
    assert "Shovel 'tls-bad' in virtual host '/' failed to connect" in tls.log()
    assert "CERTIFICATE_VERIFY_FAILED" in tls.log()
