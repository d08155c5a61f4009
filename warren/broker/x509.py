"""What a TLS connection shows of its peer certificate and cipher suite, in RabbitMQ's words.

- subject() / issuer(): the certificate's names as RFC 4514 strings, as rabbit_cert_info
  formats them: RDNs in reverse order joined by ",", multi-valued ones by "+", RabbitMQ's
  short names (CN, O, OU, C, ..., dotted OIDs for the others), and its escapes (`\\,`, a
  leading `#` or space, every byte of a non-ASCII character as `\\C3\\A9`);
- validity(): "2026-01-01T00:00:00Z - 2027-01-01T00:00:00Z";
- login_name(): the user name rabbitmq_auth_mechanism_ssl takes from a client certificate
  (ssl_cert_login_from: the distinguished name, RabbitMQ's default, or the common name);
- cipher_suite(): the (key exchange, cipher, mac) triple Erlang names a suite by, from
  OpenSSL's name of it ("ECDHE-RSA-AES256-GCM-SHA384": ecdhe_rsa, aes_256_gcm, aead).

The certificate is read from its DER bytes (a small DER reader below), not through OpenSSL's
names for the attributes, so every attribute type and string type is shown as RabbitMQ does.
Pure functions of bytes, below the session (which logs in with login_name) and the management
API (which shows the names and checks the listeners' certificates' expiry).
"""

from __future__ import annotations

import base64
import datetime
import re
from typing import NamedTuple

from ..amqp.erlang import erl_binary

# ssl_cert_login_from values Warren implements (RabbitMQ also has subject_alternative_name).
LOGIN_FROM = ("distinguished_name", "common_name")


class CertificateError(ValueError):
    """The bytes are not a certificate this reader understands."""


# DER -------------------------------------------------------------------------------------

class _Node(NamedTuple):
    tag: int
    value: bytes


def _read(data: bytes, pos: int = 0) -> tuple[_Node, int]:
    """One TLV at pos: the node and the position after it."""
    try:
        tag = data[pos]
        length = data[pos + 1]
        pos += 2
        if length & 0x80:
            count = length & 0x7F
            if count == 0 or count > 4:
                raise CertificateError("unsupported DER length")
            length = int.from_bytes(data[pos:pos + count], "big")
            pos += count
    except IndexError:
        raise CertificateError("truncated DER") from None
    if pos + length > len(data):
        raise CertificateError("truncated DER")
    return _Node(tag, data[pos:pos + length]), pos + length


def _children(value: bytes) -> list[_Node]:
    out, pos = [], 0
    while pos < len(value):
        node, pos = _read(value, pos)
        out.append(node)
    return out


def _oid(value: bytes) -> tuple[int, ...]:
    if not value:
        raise CertificateError("empty OID")
    first = value[0]
    parts = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    n = 0
    for byte in value[1:]:
        n = (n << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(n)
            n = 0
    return tuple(parts)


_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
_UTF8, _PRINTABLE, _TELETEX, _IA5, _UTC_TIME, _GENERALIZED_TIME, _UNIVERSAL, _BMP = (
    0x0C, 0x13, 0x14, 0x16, 0x17, 0x18, 0x1C, 0x1E)


class Certificate(NamedTuple):
    issuer: list   # RDNs in certificate order, each a list of (oid, tag, value bytes)
    subject: list
    not_before: _Node
    not_after: _Node


def parse(der: bytes) -> Certificate:
    """The parts of an X.509 certificate RabbitMQ shows."""
    cert, _ = _read(der)
    if cert.tag != _SEQUENCE:
        raise CertificateError("not a certificate")
    tbs = _children(cert.value)[0]
    fields = _children(tbs.value)
    if fields and fields[0].tag == 0xA0:  # [0] version
        fields = fields[1:]
    if len(fields) < 5:
        raise CertificateError("truncated certificate")
    _serial, _algorithm, issuer, validity, subject = fields[:5]
    not_before, not_after = _children(validity.value)[:2]
    return Certificate(_name(issuer), _name(subject), not_before, not_after)


def _name(node: _Node) -> list:
    rdns = []
    for rdn in _children(node.value):
        attributes = []
        for attribute in _children(rdn.value):
            kind, value = _children(attribute.value)[:2]
            attributes.append((_oid(kind.value), value.tag, value.value))
        rdns.append(attributes)
    return rdns


# Names -----------------------------------------------------------------------------------

COMMON_NAME = (2, 5, 4, 3)

# rabbit_cert_info:format_rdn's short names.
_SHORT_NAMES = {
    (2, 5, 4, 4): "SN", (2, 5, 4, 42): "GIVENNAME", (2, 5, 4, 43): "INITIALS",
    (2, 5, 4, 44): "GENERATIONQUALIFIER", COMMON_NAME: "CN", (2, 5, 4, 7): "L",
    (2, 5, 4, 8): "ST", (2, 5, 4, 10): "O", (2, 5, 4, 11): "OU", (2, 5, 4, 12): "TITLE",
    (2, 5, 4, 6): "C", (2, 5, 4, 5): "SERIALNUMBER", (2, 5, 4, 65): "PSEUDONYM",
    (0, 9, 2342, 19200300, 100, 1, 25): "DC", (1, 2, 840, 113549, 1, 9, 1): "EMAILADDRESS",
    (2, 5, 4, 9): "STREET", (0, 9, 2342, 19200300, 100, 1, 1): "UID",
}


def _text(oid: tuple, tag: int, value: bytes) -> bytes:
    """An attribute's value as rabbit_cert_info:format_asn1_value gives it: UTF-8 bytes of
    the directory strings, IA5 strings as they are; a value of an attribute type OTP does not
    know and that is no directory string shows as an Erlang binary term."""
    if tag in (_UTF8, _PRINTABLE) or (tag == _IA5 and oid in _SHORT_NAMES):
        return value
    if tag == _TELETEX:
        return value.decode("latin-1").encode()
    if tag == _BMP:
        return value.decode("utf-16-be", "replace").encode()
    if tag == _UNIVERSAL:
        return value.decode("utf-32-be", "replace").encode()
    size = len(value).to_bytes(max(1, (len(value).bit_length() + 7) // 8), "big")
    length = size if len(value) < 128 else bytes((0x80 | len(size),)) + size
    return erl_binary(bytes((tag,)) + length + value)  # the undecoded DER, as OTP leaves it


def _escape(value: bytes) -> str:
    """rabbit_cert_info:escape_rdn_value (RFC 4514, and every non-printable byte as \\XX)."""
    out = []
    last = len(value) - 1
    for i, c in enumerate(value):
        if i == 0 and c in b" #":
            out.append("\\" + chr(c))
        elif i == last and c == 0x20:
            out.append("\\ ")
        elif c in b'"+,;<>\\':
            out.append("\\" + chr(c))
        elif c < 32 or c >= 126:
            out.append(f"\\{c:02X}")
        else:
            out.append(chr(c))
    return "".join(out)


def _attribute(oid: tuple, tag: int, value: bytes) -> str:
    name = _SHORT_NAMES.get(oid) or ".".join(map(str, oid))
    return f"{name}={_escape(_text(oid, tag, value))}"


def format_name(rdns: list) -> str:
    return ",".join("+".join(_attribute(*a) for a in rdn) for rdn in reversed(rdns))


def subject(der: bytes) -> str:
    return format_name(parse(der).subject)


def issuer(der: bytes) -> str:
    return format_name(parse(der).issuer)


def _time(node: _Node) -> str:
    text = node.value.decode("ascii", "replace")
    if node.tag == _UTC_TIME and len(text) == 13 and text.endswith("Z"):
        return f"20{text[0:2]}-{text[2:4]}-{text[4:6]}T{text[6:8]}:{text[8:10]}:{text[10:12]}Z"
    kind = "utcTime" if node.tag == _UTC_TIME else "generalTime"
    return f'{{{kind},"{text}"}}'  # as RabbitMQ prints other times (~p)


def not_after(der: bytes) -> datetime.datetime:
    """When the certificate expires (UTC)."""
    node = parse(der).not_after
    text = node.value.decode("ascii", "replace").rstrip("Z")
    try:
        if node.tag == _UTC_TIME:  # YYMMDDHHMM[SS]Z, years 1950-2049
            year = int(text[:2])
            text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
        return datetime.datetime.strptime(text[:14].ljust(14, "0"), "%Y%m%d%H%M%S").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise CertificateError(f"bad time {node.value!r}") from None


_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def pem_certificates(pem: bytes) -> list[bytes]:
    """The certificates (DER) of a PEM file, in order."""
    return [base64.b64decode(b"".join(block.split())) for block in _PEM.findall(pem)]


def validity(der: bytes) -> str:
    cert = parse(der)
    return f"{_time(cert.not_before)} - {_time(cert.not_after)}"


def login_name(der: bytes, login_from: str) -> str | None:
    """The user name EXTERNAL logs in as (None: the certificate has none of that kind)."""
    cert = parse(der)
    if login_from == "common_name":
        names = [_text(oid, tag, value) for rdn in cert.subject for oid, tag, value in rdn if oid == COMMON_NAME]
        return b",".join(names).decode("utf-8", "replace") if names else None
    return format_name(cert.subject)


# Cipher suites ---------------------------------------------------------------------------

_TLS13 = {"TLS_AES_256_GCM_SHA384": "aes_256_gcm", "TLS_AES_128_GCM_SHA256": "aes_128_gcm",
          "TLS_CHACHA20_POLY1305_SHA256": "chacha20_poly1305", "TLS_AES_128_CCM_SHA256": "aes_128_ccm",
          "TLS_AES_128_CCM_8_SHA256": "aes_128_ccm_8"}
_KEY_EXCHANGES = {"ECDHE", "DHE", "ECDH", "DH", "PSK", "RSA", "SRP"}
_AUTHENTICATION = {"ECDSA", "RSA", "DSS", "PSK"}


def cipher_suite(name: str) -> tuple[str, str, str]:
    """(key_exchange, cipher, mac) of a suite named as OpenSSL names it, in Erlang's names
    (what RabbitMQ shows as ssl_key_exchange, ssl_cipher, ssl_hash). A name this does not
    follow gives its own lowercase form as the cipher."""
    if name in _TLS13:
        return "any", _TLS13[name], "aead"
    parts = name.split("-")
    kx: list[str] = []
    while parts and parts[0] in _KEY_EXCHANGES | _AUTHENTICATION and len(kx) < 2:
        kx.append(parts.pop(0).lower())
    key_exchange = "_".join(kx) if kx else "rsa"
    mac = "aead" if any(p in ("GCM", "CCM", "CCM8", "POLY1305") for p in parts) else None
    if mac is None and parts and parts[-1].startswith("SHA"):
        mac = parts.pop().lower()
    if not parts:
        return key_exchange, name.lower(), mac or ""
    algorithm = parts[0]
    if algorithm.startswith("AES") and algorithm[3:].isdigit():
        mode = parts[1].lower() if len(parts) > 1 and parts[1] in ("GCM", "CCM", "CCM8") else "cbc"
        cipher = f"aes_{algorithm[3:]}_{mode}".replace("ccm8", "ccm_8")
    elif algorithm == "CHACHA20":
        cipher = "chacha20_poly1305"
    else:
        cipher = "_".join(parts).lower()
    return key_exchange, cipher, mac or ""
