"""The TLS settings of the config file, in both formats: listeners.ssl.*, ssl_options.*,
management.ssl.*, auth_mechanisms.*, ssl_cert_login_from, ssl_handshake_timeout (and the
classic format's ssl_listeners, ssl_options, ssl_config, auth_mechanisms)."""

import pytest

from warren.cli.config import ConfigError, parse_config


@pytest.fixture
def files(tmp_path):
    """Readable files standing in for the CA, certificate and key (only their access is checked)."""
    paths = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-")
        paths[name] = str(path)
    return paths


def conf(*lines, path="warren.conf"):
    return parse_config("\n".join(lines) + "\n", path)


def errors(*lines, path="warren.conf"):
    with pytest.raises(ConfigError) as info:
        parse_config("\n".join(lines) + "\n", path)
    return info.value.errors


def tls_lines(files, prefix="ssl_options"):
    return [f"{prefix}.cacertfile = {files['ca']}", f"{prefix}.certfile = {files['cert']}",
            f"{prefix}.keyfile = {files['key']}"]


def test_new_style(files):
    config = conf("listeners.ssl.default = 5671", "listeners.ssl.local = 127.0.0.1:5674", *tls_lines(files),
                  "ssl_options.password = s3cret # a comment", "ssl_options.verify = verify_peer",
                  "ssl_options.fail_if_no_peer_cert = true", "ssl_options.versions.1 = tlsv1.3",
                  "ssl_options.versions.2 = tlsv1.2", "ssl_handshake_timeout = 2500",
                  "auth_mechanisms.1 = EXTERNAL", "auth_mechanisms.2 = PLAIN", "ssl_cert_login_from = common_name",
                  "management.ssl.port = 15671", "management.ssl.ip = ::1", *tls_lines(files, "management.ssl"),
                  "management.ssl.verify = verify_none", "management.ssl.versions.1 = tlsv1.3")
    assert config == {
        "ssl_listeners": [(None, 5671), ("127.0.0.1", 5674)],
        "ssl_options": {"cacertfile": files["ca"], "certfile": files["cert"], "keyfile": files["key"],
                        "password": "s3cret", "verify": "verify_peer", "fail_if_no_peer_cert": True,
                        "versions": ["tlsv1.2", "tlsv1.3"]},
        "ssl_handshake_timeout": 2.5,
        "auth_mechanisms": ("EXTERNAL", "PLAIN"),
        "ssl_cert_login_from": "common_name",
        "management_ssl": {"port": 15671, "ip": "::1", "cacertfile": files["ca"], "certfile": files["cert"],
                           "keyfile": files["key"], "verify": "verify_none", "versions": ["tlsv1.3"]},
    }


def test_defaults_and_none(files):
    assert conf("listeners.ssl = none") == {}
    # ssl_options without a TLS listener are checked and kept (RabbitMQ accepts them too).
    assert conf(f"ssl_options.certfile = {files['cert']}") == {"ssl_options": {"certfile": files["cert"]}}
    # The HTTPS port defaults to RabbitMQ's 15671.
    assert conf(*tls_lines(files, "management.ssl"))["management_ssl"]["port"] == 15671


@pytest.mark.parametrize("line, reason", [
    ("ssl_options.verify = verify_all", "expected verify_peer or verify_none, got 'verify_all'"),
    ("ssl_options.fail_if_no_peer_cert = yes", "expected true or false, got 'yes'"),
    ("ssl_options.versions.1 = tlsv1.1", "tlsv1.1 is not supported (Warren allows tlsv1.2 and tlsv1.3)"),
    ("ssl_options.versions.1 = tls13", "expected tlsv1.2 or tlsv1.3, got 'tls13'"),
    ("ssl_options.cacertfile = /no/such/file.pem", "'/no/such/file.pem' is not a readable file"),
    ("management.ssl.port = 0", "expected a port number from 1 to 65535, got 0"),
    ("listeners.ssl = all", "expected none or listeners.ssl.NAME = PORT, got 'all'"),
    ("listeners.ssl.default = 70000", "expected a port number from 1 to 65535, got 70000"),
    ("auth_mechanisms.1 = CRAM-MD5",
     "expected one of PLAIN, AMQPLAIN, EXTERNAL (the mechanisms Warren has), got 'CRAM-MD5'"),
    ("ssl_cert_login_from = subject_alternative_name", "subject_alternative_name is not supported (Warren "
                                                       "takes the user name from the distinguished_name or the "
                                                       "common_name)"),
    ("ssl_handshake_timeout = soon", "expected an integer, got 'soon'"),
])
def test_bad_values(line, reason):
    key = line.split("=", 1)[0].strip()
    assert errors(line) == [f"warren.conf:1: {key}: {reason}"]


def test_options_warren_does_not_implement_are_unknown_keys():
    assert errors("ssl_options.ciphers.1 = ECDHE-ECDSA-AES256-GCM-SHA384", "management.ssl.depth = 2") == [
        "warren.conf:1: ssl_options.ciphers.1: unknown key (Warren's TLS options: ssl_options.cacertfile, "
        "ssl_options.certfile, ssl_options.keyfile, ssl_options.password, ssl_options.verify, "
        "ssl_options.fail_if_no_peer_cert, ssl_options.versions.N)",
        "warren.conf:2: management.ssl.depth: unknown key (Warren's TLS options: management.ssl.cacertfile, "
        "management.ssl.certfile, management.ssl.keyfile, management.ssl.password, management.ssl.verify, "
        "management.ssl.fail_if_no_peer_cert, management.ssl.versions.N, management.ssl.port, management.ssl.ip)"]


def test_a_tls_listener_needs_a_certificate_and_its_key_and_verify_peer_the_cas(files):
    assert errors("# TLS", "listeners.ssl.default = 5671") == [
        "warren.conf:2: listeners.ssl.default: a TLS listener needs ssl_options.certfile and ssl_options.keyfile"]
    assert errors("listeners.ssl.default = 5671", f"ssl_options.certfile = {files['cert']}") == [
        "warren.conf:1: listeners.ssl.default: a TLS listener needs ssl_options.keyfile"]
    assert errors(f"management.ssl.keyfile = {files['key']}", "management.ssl.port = 15671") == [
        "warren.conf:1: management.ssl.keyfile: a TLS listener needs management.ssl.certfile"]
    assert errors("listeners.ssl.default = 5671", *tls_lines(files)[1:], "ssl_options.verify = verify_peer") == [
        "warren.conf:4: ssl_options.verify: verify_peer needs ssl_options.cacertfile (the CAs client "
        "certificates are checked against)"]


def test_classic_format(files):
    text = f"""[{{rabbit, [{{ssl_listeners, [5671, {{"127.0.0.1", 5674}}]}},
  {{ssl_options, [{{cacertfile, "{files['ca']}"}}, {{certfile, "{files['cert']}"}},
                 {{keyfile, <<"{files['key']}">>}}, {{password, "pw"}}, {{verify, verify_peer}},
                 {{fail_if_no_peer_cert, false}}, {{versions, ['tlsv1.3', 'tlsv1.2']}}]}},
  {{ssl_handshake_timeout, 8000}},
  {{auth_mechanisms, ['PLAIN', 'AMQPLAIN', 'EXTERNAL']}}, {{ssl_cert_login_from, distinguished_name}}]}},
 {{rabbitmq_management, [{{ssl_config, [{{port, 15671}}, {{ip, "127.0.0.1"}}, {{certfile, "{files['cert']}"}},
                                        {{keyfile, "{files['key']}"}}]}}]}}].
"""
    assert parse_config(text, "rabbitmq.config") == {
        "ssl_listeners": [(None, 5671), ("127.0.0.1", 5674)],
        "ssl_options": {"cacertfile": files["ca"], "certfile": files["cert"], "keyfile": files["key"],
                        "password": "pw", "verify": "verify_peer", "fail_if_no_peer_cert": False,
                        "versions": ["tlsv1.2", "tlsv1.3"]},
        "ssl_handshake_timeout": 8.0,
        "auth_mechanisms": ("PLAIN", "AMQPLAIN", "EXTERNAL"),
        "ssl_cert_login_from": "distinguished_name",
        "management_ssl": {"port": 15671, "ip": "127.0.0.1", "certfile": files["cert"], "keyfile": files["key"]},
    }
    assert parse_config("[{rabbit, [{ssl_listeners, []}, {tcp_listeners, [5673]}]}].", "rabbitmq.config") == {
        "port": 5673}


def test_classic_format_errors(files):
    def erl_errors(text):
        with pytest.raises(ConfigError) as info:
            parse_config(text, "rabbitmq.config")
        return info.value.errors
    assert erl_errors("[{rabbit, [{ssl_options, [{verify, verify_all}, {ciphers, []}]},\n"
                      " {auth_mechanisms, ['PLAIN', 'CRAM-MD5']}, {ssl_cert_login_from, \"common_name\"},\n"
                      " {ssl_listeners, [5671]}]}].") == [
        "rabbitmq.config:1: rabbit.ssl_options.verify: expected verify_peer or verify_none, got verify_all",
        "rabbitmq.config:1: rabbit.ssl_options.ciphers: unknown key",
        "rabbitmq.config:2: rabbit.auth_mechanisms: expected one of PLAIN, AMQPLAIN, EXTERNAL (the mechanisms "
        "Warren has), got 'CRAM-MD5'",
        "rabbitmq.config:2: rabbit.ssl_cert_login_from: expected an atom, got \"common_name\"",
        "rabbitmq.config:3: rabbit.ssl_listeners: a TLS listener needs ssl_options.certfile and ssl_options.keyfile"]
