"""Certificates for the TLS tests, made with the openssl command line (EC P-256 keys: a few
milliseconds each): a CA, a server certificate for localhost/127.0.0.1 signed by it, client
certificates with a chosen subject, and a second CA that nobody trusts.

    certs = TestCerts.make(directory)
    certs.ca, certs.server_cert, certs.server_key
    cert, key = certs.client("alice")            # CN=alice,O=Warren Tests
    cert, key = certs.client("mallory", ca="other")  # signed by the untrusted CA
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

OPENSSL = "/usr/bin/openssl" if os.path.exists("/usr/bin/openssl") else "openssl"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: str) -> None:
    result = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


@dataclass
class TestCerts:
    __test__ = False  # not a pytest test class

    dir: str
    ca: str = ""
    server_cert: str = ""
    server_key: str = ""
    _cas: dict = field(default_factory=dict)  # name -> (cert, key)

    @classmethod
    def make(cls, directory: str) -> "TestCerts":
        certs = cls(directory)
        certs.ca = certs._make_ca("ca", "Warren Test CA")
        certs._make_ca("other", "Untrusted Test CA")
        certs.server_cert, certs.server_key = certs._sign(
            "server", "/CN=localhost/O=Warren Tests", "ca",
            ["subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1", "extendedKeyUsage=serverAuth"])
        return certs

    def _make_ca(self, name: str, cn: str) -> str:
        cert, key = f"{name}.pem", f"{name}.key"
        _openssl("req", "-x509", *_KEY, "-keyout", key, "-out", cert, "-days", "3", "-subj", f"/CN={cn}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=self.dir)
        self._cas[name] = (cert, key)
        return os.path.join(self.dir, cert)

    def _sign(self, name: str, subject: str, ca: str, extensions: list[str]) -> tuple[str, str]:
        ca_cert, ca_key = self._cas[ca]
        cert, key, csr, ext = f"{name}.pem", f"{name}.key", f"{name}.csr", f"{name}.ext"
        _openssl("req", "-new", *_KEY, "-keyout", key, "-out", csr, "-subj", subject, cwd=self.dir)
        with open(os.path.join(self.dir, ext), "w") as f:
            f.write("\n".join(["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
                               "subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid",
                               *extensions]) + "\n")
        _openssl("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial",
                 str(int.from_bytes(os.urandom(8), "big")), "-days", "3", "-out", cert, "-extfile", ext,
                 cwd=self.dir)
        return os.path.join(self.dir, cert), os.path.join(self.dir, key)

    def client(self, cn: str, ca: str = "ca", subject: str | None = None) -> tuple[str, str]:
        """(certificate, key) of a client certificate with CN=cn (or the whole `subject`, in
        openssl's /K=V/... form), signed by the test CA or by "other", the untrusted one."""
        name = f"client-{cn}-{ca}".replace("/", "_").replace(" ", "_")
        return self._sign(name, subject or f"/CN={cn}/O=Warren Tests", ca, ["extendedKeyUsage=clientAuth"])


def start_amqps_broker(directory) -> tuple:
    """A Warren with an AMQPS listener beside its TCP one, certificates made in `directory`:
    (broker, TLS port, certs). The caller stops the broker."""
    from tests.conftest import free_port, start_broker

    certs = TestCerts.make(str(directory))
    port = free_port()
    conf = os.path.join(str(directory), "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write(f"listeners.ssl.default = {port}\nssl_options.certfile = {certs.server_cert}\n"
                f"ssl_options.keyfile = {certs.server_key}\n")
    return start_broker("--config", conf), port, certs
