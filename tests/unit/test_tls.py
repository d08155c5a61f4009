"""TLS without sockets: the names RabbitMQ shows for a certificate (warren.broker.x509), the
EXTERNAL mechanism in the session, and the TLS layer (warren.server.tls) driven through
memory BIOs. RabbitMQ 3.10.8's answers were checked with tools/rabbitmq_node.py."""

from __future__ import annotations

import datetime
import ssl

import pytest
from pamqp import commands

from tls_certs import TestCerts
from warren.broker.auth import User
from warren.broker.broker import Broker
from warren.broker.metadata import commands as c
from warren.broker.ports import TLSInfo
from warren.server import tls as tls_layer
from warren.broker import x509

from .fake_transport import FakeTransport, make_connection

LOGIN_REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. For details see the broker logfile."

# A tiny DER writer, to make certificates with exactly the names and string types a test needs.
CN, O, OU, C, DC, EMAIL = ("2.5.4.3", "2.5.4.10", "2.5.4.11", "2.5.4.6", "0.9.2342.19200300.100.1.25",
                           "1.2.840.113549.1.9.1")
UTF8, PRINTABLE, IA5, BMP, TELETEX = 0x0C, 0x13, 0x16, 0x1E, 0x14


def tlv(tag: int, value: bytes) -> bytes:
    n = len(value)
    length = bytes((n,)) if n < 128 else bytes((0x80 | ((n.bit_length() + 7) // 8),)) + n.to_bytes(
        (n.bit_length() + 7) // 8, "big")
    return bytes((tag,)) + length + value


def oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    out = bytearray((40 * parts[0] + parts[1],))
    for p in parts[2:]:
        chunk = [p & 0x7F]
        while p > 0x7F:
            p >>= 7
            chunk.append(0x80 | (p & 0x7F))
        out += bytes(reversed(chunk))
    return tlv(0x06, bytes(out))


def name(*rdns) -> bytes:
    """rdns: lists of (oid, tag, value) (a multi-valued RDN has several)."""
    def value(tag, v):
        return tlv(tag, v.encode("utf-16-be") if tag == BMP else v.encode("latin-1") if tag == TELETEX
                   else v.encode())
    return tlv(0x30, b"".join(tlv(0x31, b"".join(tlv(0x30, oid(o) + value(t, v)) for o, t, v in rdn))
                              for rdn in rdns))


def certificate(subject: bytes, issuer: bytes = b"", not_before=(0x17, "260101000000Z"),
                not_after=(0x18, "20510101000000Z")) -> bytes:
    issuer = issuer or name([(CN, UTF8, "Test CA")])
    algorithm = tlv(0x30, oid("1.2.840.10045.4.3.2"))
    tbs = tlv(0x30, tlv(0xA0, tlv(0x02, b"\x02")) + tlv(0x02, b"\x01") + algorithm + issuer
              + tlv(0x30, tlv(not_before[0], not_before[1].encode()) + tlv(not_after[0], not_after[1].encode()))
              + subject + tlv(0x30, b""))
    return tlv(0x30, tbs + algorithm + tlv(0x03, b"\x00"))


# Names -----------------------------------------------------------------------------------

def test_subject_and_issuer_as_rabbitmq_formats_them():
    der = certificate(name([(C, PRINTABLE, "US")], [(O, UTF8, "Warren Tests")], [(CN, UTF8, "alice")]))
    assert x509.subject(der) == "CN=alice,O=Warren Tests,C=US"  # RFC 4514: the last RDN first
    assert x509.issuer(der) == "CN=Test CA"
    assert x509.login_name(der, "distinguished_name") == "CN=alice,O=Warren Tests,C=US"
    assert x509.login_name(der, "common_name") == "alice"


@pytest.mark.parametrize("rdns, expected", [
    # RFC 4514's escapes, as rabbit_cert_info:escape_rdn_value writes them
    ([[(CN, UTF8, "a,b+c;d<e>f\"g\\h")]], 'CN=a\\,b\\+c\\;d\\<e\\>f\\"g\\\\h'),
    ([[(CN, UTF8, "#lead")]], "CN=\\#lead"),
    ([[(CN, UTF8, " both ")]], "CN=\\ both\\ "),
    # every byte of a non-ASCII character, and ~ (RabbitMQ escapes 126 and up)
    ([[(CN, UTF8, "José~")]], "CN=Jos\\C3\\A9\\7E"),
    ([[(CN, BMP, "λ")]], "CN=\\CE\\BB"),
    ([[(CN, TELETEX, "é")]], "CN=\\C3\\A9"),
    # a multi-valued RDN, and the short names RabbitMQ knows (DC and EMAILADDRESS are IA5)
    ([[(OU, UTF8, "ops"), (CN, UTF8, "bob")], [(DC, IA5, "example")]], "DC=example,OU=ops+CN=bob"),
    ([[(EMAIL, IA5, "a@b.c")]], "EMAILADDRESS=a@b.c"),
    # a type it does not name: the dotted OID (and a directory string decoded)
    ([[("2.5.4.15", UTF8, "shop")]], "2.5.4.15=shop"),
    # ... or, not a directory string, the undecoded value as an Erlang binary (escaped too)
    ([[("2.5.4.15", IA5, "x")]], "2.5.4.15=\\<\\<22\\,1\\,120\\>\\>"),
])
def test_escapes_and_attribute_names(rdns, expected):
    assert x509.subject(certificate(name(*rdns))) == expected


def test_common_names_are_joined_and_a_certificate_without_one_has_no_name():
    der = certificate(name([(CN, UTF8, "one")], [(CN, UTF8, "two,x")]))
    assert x509.login_name(der, "common_name") == "one,two,x"  # unescaped, as RabbitMQ
    assert x509.login_name(certificate(name([(O, UTF8, "org")])), "common_name") is None


def test_validity_and_expiry():
    der = certificate(name([(CN, UTF8, "x")]))
    # A UTCTime as RabbitMQ formats it; a GeneralizedTime (2050 on) as it prints the term.
    assert x509.validity(der) == '2026-01-01T00:00:00Z - {generalTime,"20510101000000Z"}'
    assert x509.not_after(der) == datetime.datetime(2051, 1, 1, tzinfo=datetime.timezone.utc)


def test_pem_and_bad_input():
    der = certificate(name([(CN, UTF8, "x")]))
    import base64
    pem = b"junk\n-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    assert x509.pem_certificates(pem * 2) == [der, der]
    for bad in (b"", b"\x30\x05\x01", b"\x02\x01\x00"):
        with pytest.raises(x509.CertificateError):
            x509.subject(bad)


@pytest.mark.parametrize("openssl, erlang", [
    ("TLS_AES_256_GCM_SHA384", ("any", "aes_256_gcm", "aead")),  # RabbitMQ 3.10.8's view of TLS 1.3
    ("TLS_CHACHA20_POLY1305_SHA256", ("any", "chacha20_poly1305", "aead")),
    ("ECDHE-ECDSA-AES256-GCM-SHA384", ("ecdhe_ecdsa", "aes_256_gcm", "aead")),  # ... and of TLS 1.2
    ("ECDHE-RSA-CHACHA20-POLY1305", ("ecdhe_rsa", "chacha20_poly1305", "aead")),
    ("DHE-RSA-AES128-SHA256", ("dhe_rsa", "aes_128_cbc", "sha256")),
    ("AES128-SHA", ("rsa", "aes_128_cbc", "sha")),
])
def test_cipher_suites_in_erlang_names(openssl, erlang):
    assert x509.cipher_suite(openssl) == erlang


# EXTERNAL in the session -------------------------------------------------------------------

ALICE = certificate(name([(CN, UTF8, "alice")], [(O, UTF8, "Warren Tests")]))  # as openssl -subj /CN=alice/O=...


def broker_with(*users, mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL"), login_from="distinguished_name"):
    broker = Broker.with_defaults()
    broker.config.auth_mechanisms = mechanisms
    broker.config.ssl_cert_login_from = login_from
    for user in users:
        broker.metadata.apply(c.PutUser(User(user, "")))  # no password: EXTERNAL only
    return broker


def start(broker, tls=None, peer=("127.0.0.1", 50000)):
    transport = FakeTransport(peer=peer, tls=tls)
    conn = make_connection(broker, transport)
    conn.data_received(b"AMQP\x00\x00\x09\x01")
    [(_, start_method)] = transport.frames()
    return conn, transport, start_method.mechanisms


def start_ok(conn, mechanism="EXTERNAL", response="", capabilities=True):
    props = {"capabilities": {"authentication_failure_close": capabilities}}
    conn.data_received(_frame(commands.Connection.StartOk(client_properties=props, mechanism=mechanism,
                                                          response=response)))


def _frame(method) -> bytes:
    from pamqp import frame
    return frame.marshal(method, 0)


TLS13 = dict(protocol="TLSv1.3", cipher="TLS_AES_256_GCM_SHA384")


def test_external_is_offered_over_tls_only_and_only_when_configured():
    assert start(broker_with())[2] == "PLAIN AMQPLAIN"
    assert start(broker_with(), TLSInfo(**TLS13))[2] == "PLAIN AMQPLAIN EXTERNAL"  # with or without a cert
    assert start(broker_with(mechanisms=("PLAIN", "AMQPLAIN")), TLSInfo(**TLS13))[2] == "PLAIN AMQPLAIN"
    assert start(broker_with(mechanisms=("EXTERNAL",)), TLSInfo(**TLS13))[2] == "EXTERNAL"


def test_external_logs_in_the_certificate_user_without_a_password():
    broker = broker_with("O=Warren Tests,CN=alice")
    conn, transport, _ = start(broker, TLSInfo(**TLS13, peer_cert=ALICE))
    start_ok(conn, response="ignored")
    [(_, tune)] = transport.frames()
    assert isinstance(tune, commands.Connection.Tune)
    assert conn.user.name == "O=Warren Tests,CN=alice" and conn.auth_mechanism == "EXTERNAL"


def test_external_with_the_common_name():
    conn, transport, _ = start(broker_with("alice", login_from="common_name"), TLSInfo(**TLS13, peer_cert=ALICE))
    start_ok(conn)
    assert isinstance(transport.frames()[0][1], commands.Connection.Tune) and conn.user.name == "alice"


@pytest.mark.parametrize("peer_cert, users, peer, reason", [
    (None, (), "127.0.0.1", "connection peer presented no TLS (x.509) certificate"),
    (ALICE, (), "127.0.0.1", "user 'O=Warren Tests,CN=alice' - invalid credentials"),
    (ALICE, ("alice",), "127.0.0.1", "user 'O=Warren Tests,CN=alice' - invalid credentials"),  # DN, not CN
    (certificate(name([(CN, UTF8, "guest")])), (), "10.0.0.9", "user 'guest' can only connect via localhost"),
])
def test_external_refusals(caplog, peer_cert, users, peer, reason):
    conn, transport, _ = start(broker_with(*users, login_from="distinguished_name"),
                               TLSInfo(**TLS13, peer_cert=peer_cert), peer=(peer, 50000))
    if peer_cert is not None and b"guest" in peer_cert:
        conn.broker.config.ssl_cert_login_from = "common_name"
    start_ok(conn)
    [(_, close)] = transport.frames()
    assert (close.reply_code, close.reply_text) == (403, LOGIN_REFUSED)
    assert (f"Error on AMQP connection {conn.log_id} ({peer}:50000 -> 127.0.0.1:5672, state: starting):\n"
            f"EXTERNAL login refused: {reason}") in caplog.text


@pytest.mark.parametrize("mechanisms, mechanism, word", [
    (("PLAIN", "AMQPLAIN", "EXTERNAL"), "EXTERNAL", "invalid"),  # plain TCP: not offered
    (("PLAIN", "AMQPLAIN"), "CRAM-MD5", "unknown"),
    (("EXTERNAL",), "PLAIN", "invalid"),
])
def test_mechanisms_not_offered_are_invalid_unknown_ones_unknown(caplog, mechanisms, mechanism, word):
    # As RabbitMQ's reader: COMMAND_INVALID, a handshake error (silence, then the socket closes).
    conn, transport, _ = start(broker_with(mechanisms=mechanisms))
    start_ok(conn, mechanism=mechanism, capabilities=False)
    assert transport.frames() == [] and conn.state.name == "CLOSED"
    assert (f"{{handshake_error,starting,0,{{amqp_error,command_invalid,\"{word} authentication mechanism "
            f"'{mechanism}'\",") in caplog.text


# The TLS layer -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return TestCerts.make(str(tmp_path_factory.mktemp("tls-unit")))


class RawTransport:
    """The TCP transport under the TLS layer."""

    def __init__(self):
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 5671)}.get(name, default)

    def write(self, data):
        self.out += data

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data


class App:
    """The protocol above TLS: records what arrives."""

    def __init__(self):
        self.transport = None
        self.received = bytearray()
        self.lost = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.received += data

    def connection_lost(self, exc):
        self.lost = True


class Loop:
    def __init__(self):
        self.soon = []

    def call_later(self, delay, callback, *args):
        return _Timer()

    def call_soon(self, callback, *args):
        self.soon.append((callback, args))

    def run(self):
        while self.soon:
            callback, args = self.soon.pop(0)
            callback(*args)


class _Timer:
    def cancel(self):
        pass


def server_context(certs, **options):
    return tls_layer.server_context({"cacertfile": certs.ca, "certfile": certs.server_cert,
                                     "keyfile": certs.server_key, **options})


def layer(context):
    app, raw, loop = App(), RawTransport(), Loop()
    protocol = tls_layer.TLSServerProtocol(context, lambda: app, loop)
    protocol.connection_made(raw)
    return protocol, raw, app, loop


def client(certs, cert=None):
    ctx = ssl.create_default_context(cafile=certs.ca)
    if cert:
        ctx.load_cert_chain(*cert)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    return ctx.wrap_bio(incoming, outgoing, server_hostname="localhost"), incoming, outgoing


def pump(protocol, raw, sslobj, incoming, outgoing, rounds=6):
    """Run the client's handshake against the layer, in memory; its last error, or None."""
    error = None
    for _ in range(rounds):
        try:
            sslobj.do_handshake()
            error = None
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as err:
            return err
        data = outgoing.read()
        if data:
            protocol.data_received(data)
        incoming.write(raw.take())
    return error


def test_the_layer_carries_bytes_both_ways_and_tells_the_session(certs):
    protocol, raw, app, loop = layer(server_context(certs, verify="verify_peer"))
    sslobj, incoming, outgoing = client(certs, certs.client("alice"))
    assert pump(protocol, raw, sslobj, incoming, outgoing) is None
    assert app.transport is not None
    info = tls_layer.session_info(app.transport)
    assert info.protocol == "TLSv1.3" and info.cipher.startswith("TLS_")
    assert x509.subject(info.peer_cert) == "O=Warren Tests,CN=alice"
    sslobj.write(b"AMQP\x00\x00\x09\x01" + b"x" * 100_000)
    protocol.data_received(outgoing.read())
    assert bytes(app.received) == b"AMQP\x00\x00\x09\x01" + b"x" * 100_000
    app.transport.writelines([b"hello ", memoryview(b"world")])
    incoming.write(raw.take())
    assert sslobj.read(100) == b"hello world"
    # Paused, it hands nothing on; resumed, what arrived meanwhile.
    app.received.clear()
    app.transport.pause_reading()
    assert raw.paused
    sslobj.write(b"later")
    protocol.data_received(outgoing.read())
    assert app.received == b""
    app.transport.resume_reading()
    loop.run()
    assert app.received == b"later" and not raw.paused
    app.transport.close()
    assert raw.closed


def test_a_failed_handshake_sends_its_alert(certs, caplog):
    protocol, raw, app, _ = layer(server_context(certs, verify="verify_peer", fail_if_no_peer_cert=True))
    sslobj, incoming, outgoing = client(certs, certs.client("mallory", ca="other"))
    error = pump(protocol, raw, sslobj, incoming, outgoing)
    if error is None:  # TLS 1.3: the client is done first and hears the alert at its first read
        with pytest.raises(ssl.SSLError, match="unknown ca"):
            sslobj.read(1)
    else:
        assert "unknown ca" in str(error)
    assert raw.closed and app.transport is None
    assert "TLS handshake from 127.0.0.1:40000 failed:" in caplog.text


def test_a_plaintext_client_gets_rabbitmqs_alert(certs, caplog):
    protocol, raw, app, _ = layer(server_context(certs))
    protocol.data_received(b"AMQP\x00\x00\x09\x01")
    assert raw.take() == b"\x15\x03\x01\x00\x02\x02\x0a" and raw.closed
    assert "(a plaintext AMQP client on the TLS port)" in caplog.text


def test_contexts(certs):
    assert server_context(certs).verify_mode == ssl.CERT_NONE  # verify_none: RabbitMQ's default
    assert server_context(certs, verify="verify_peer").verify_mode == ssl.CERT_OPTIONAL
    assert server_context(certs, verify="verify_peer", fail_if_no_peer_cert=True).verify_mode == ssl.CERT_REQUIRED
    ctx = server_context(certs, versions=["tlsv1.2"])
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(tls_layer.TLSError, match="cannot use ssl_options.certfile .* with ssl_options.keyfile"):
        tls_layer.server_context({"certfile": certs.server_cert, "keyfile": certs.client("bob")[1]})
    with pytest.raises(tls_layer.TLSError, match="management.ssl.keyfile is required"):
        tls_layer.server_context({"certfile": certs.server_cert}, "management.ssl")
