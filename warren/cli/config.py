"""The config file of `warren server --config FILE`, in either of RabbitMQ's formats:

- the new-style format of rabbitmq.conf (sysctl-like `key = value` lines, `#` comments), read
  the way RabbitMQ's cuttlefish reads it: `#` starts a comment anywhere on a line, values are
  taken verbatim (no quoting), a later line for the same key wins;
- the classic Erlang-term format of rabbitmq.config
  (`[{rabbit, [{heartbeat, 30}, {disk_free_limit, {mem_relative, 1.0}}]}].`), chosen when the
  file name ends in `.config` or the first thing in the file is `[`. The term is parsed as
  Erlang would (warren.cli.erlang_terms); sections `rabbit`, `rabbitmq_management`,
  `rabbitmq_prometheus`, `rabbitmq_shovel` (its static shovels: warren.cli.static_shovels)
  and `warren`.

Only the keys Warren supports are accepted; an unknown key, a bad value or a bad unit is an
error naming the file, the line (for the Erlang format, the line where the `{key, value}`
tuple starts) and the key, and the server refuses to start.

load_config() returns a dict with the settings present in the file (nothing for the others):

  host, port                    the AMQP listener, when the file names one (listeners.tcp.*)
  listeners                     [(host or None, port), ...] when it names several, in file order
  default_user, default_pass, default_vhost, default_user_tags (list),
  default_permissions           (configure, write, read): used on the first start only
  loopback_users                set of user names that may only connect from loopback
  heartbeat, frame_max, channel_max, max_message_size (ints), handshake_timeout (seconds,
                                math.inf for `infinity`)
  consumer_timeout              ms a delivery may stay unacked (None: no limit, classic
                                format's `undefined`)
  management_port, management_host
  management_max_body_size      bytes: the API refuses a bigger request body
                                (management.http.max_body_size; classic: rabbitmq_management's
                                max_http_body_size)
  ssl_listeners                 [(host or None, port), ...]: the AMQPS listeners (listeners.ssl.*)
  ssl_options                   {cacertfile, certfile, keyfile, password, verify ("verify_peer" or
                                "verify_none"), fail_if_no_peer_cert (bool), versions (["tlsv1.2",
                                "tlsv1.3"])}: the TLS of the AMQPS listeners (warren.server.tls)
  ssl_handshake_timeout         seconds a client has to finish the TLS handshake
  management_ssl                the API's HTTPS listener (management.ssl.*): {port, ip, and the
                                TLS options as in ssl_options}
  auth_mechanisms               the SASL mechanisms offered: a tuple of PLAIN, AMQPLAIN, EXTERNAL
  ssl_cert_login_from           where EXTERNAL takes the user name from: "distinguished_name" or
                                "common_name"
  prometheus_port, prometheus_host   the Prometheus endpoint (prometheus.tcp.*; port 0: off)
  prometheus_per_object         prometheus.return_per_object_metrics (bool)
  log_level                     the console's level, a Python logging level (log.console.level)
  log_console                   bool: log to the console (log.console; Warren's default true)
  log_console_stdio             "stdout" or "stderr" (log.console.stdio; Warren's default stderr)
  log_file                      a path, or False (log.file = false): the log file (warren.cli.logs)
  log_dir                       a writable directory: relative log files go there (log.dir)
  log_file_level                RabbitMQ's level name (also =debug, !=info, <=notice, <warning)
  log_file_rotation_size        bytes (log.file.rotation.size; units such as 10MiB also taken)
  log_file_rotation_count       archives kept (log.file.rotation.count)
  log_file_rotation_date        a parsed date spec, warren.cli.logs.parse_date_spec
  log_file_rotation_compress    bool: gzip the archives
  log_connection_level, log_channel_level   Python logging levels of those categories
  queue_window                  warren.queue_window
  vm_memory_high_watermark      ("relative", float) or ("absolute", bytes)
  vm_memory_high_watermark_paging_ratio  float
  disk_free_limit               ("absolute", bytes) or ("mem_relative", float)
  static_shovels                name -> warren.broker.shovel_config.Config: rabbitmq_shovel's
                                shovels (classic format only, as in RabbitMQ)

The watermark and disk_free_limit configure the memory and disk alarms (warren.server's
monitors); the paging ratio is validated and stored.
"""

import difflib
import ipaddress
import logging
import math
import os
import re

from . import logs
from . import static_shovels
from .erlang_terms import Atom, ErlangSyntaxError, ErlList, format_term, parse_erlang_term
from ..broker import auth_mechanisms, x509
from ..cluster.config import MIN_HISTORY

log = logging.getLogger("warren.config")


class ConfigError(ValueError):
    """Every problem found in a config file, one `file:line: key: reason` per line."""

    def __init__(self, errors):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


# Values ---------------------------------------------------------------------------------

# Information units of vm_memory_high_watermark.absolute and disk_free_limit.absolute, as
# RabbitMQ's rabbit_resource_monitor_misc:parse_information_unit reads them (see its memory
# and disk alarm guides: "2GB", "1024MiB", "4Gi"). Decimal units (kB, MB, GB, TB, PB) are
# powers of 1000, binary ones (KiB/Ki, MiB/Mi, GiB/Gi, TiB/Ti, PiB/Pi) powers of 1024, in any
# letter case. The single letters k, m, g mean KiB, MiB, GiB, as in RabbitMQ 3.10 (3.13 made
# them decimal); a single t or p (3.13 on only) is refused as ambiguous. No space, no
# fraction: "1.5GB" and "1 GB" are errors, as in RabbitMQ.
_INFORMATION_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
for _i, _p in enumerate("kmgtp", 1):
    _INFORMATION_UNITS[_p + "b"] = 1000 ** _i
    _INFORMATION_UNITS[_p + "i"] = _INFORMATION_UNITS[_p + "ib"] = 1024 ** _i

_SIZE_FORMATS = "an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB"


def parse_information_unit(value) -> int:
    """Bytes from an integer or a string like "2GB", "1024MiB" or "4Gi" (ValueError if bad)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"expected {_SIZE_FORMATS}, got {value}")
        return value
    m = re.fullmatch(r"([0-9]+)([A-Za-z]*)", value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _INFORMATION_UNITS:
        if unit in ("t", "p"):
            raise ValueError(f"ambiguous unit in '{value}': write {unit.upper()}B "
                             f"(powers of 1000) or {unit.upper()}iB (powers of 1024)")
        raise ValueError(f"expected {_SIZE_FORMATS}, got '{value}'")
    return int(m.group(1)) * _INFORMATION_UNITS[unit]


def parse_bytesize(text: str) -> int:
    """cuttlefish's bytesize (RabbitMQ's frame_max): bytes, or KB, MB, GB (or kb, mb, gb) as
    powers of 1024."""
    m = re.fullmatch(r"([0-9]+)(KB|MB|GB|kb|mb|gb)?", text)
    if not m:
        raise ValueError(f"expected an integer number of bytes, or one with KB, MB or GB "
                         f"(powers of 1024), got '{text}'")
    return int(m.group(1)) * {None: 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[
        m.group(2) and m.group(2)[0].lower()]


def _integer(text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(f"expected an integer, got '{text}'")
    return int(text)


def _float(text: str) -> float:
    # cuttlefish's float: digits, a dot and digits (and an exponent); "1" or ".5" are not floats.
    if not re.fullmatch(r"[+-]?[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?", text):
        raise ValueError(f"expected a float such as 0.4 (with a decimal point), got '{text}'")
    return float(text)


def _boolean(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got '{text}'")
    return text == "true"


def _in_range(value, low, high, what="an integer"):
    if not low <= value <= high:
        raise ValueError(f"expected {what} from {low} to {high}, got {value}")
    return value


def _port(value: int) -> int:
    return _in_range(value, 1, 65535, "a port number")


def _ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"expected an IPv4 or IPv6 address, got '{text}'") from None


def _listener(text: str):
    """(host or None, port) from "5672" or "IP:5672" (IPv6 without brackets: "::1:5672")."""
    if ":" not in text:
        return None, _port(_integer(text))
    host, port = text.rsplit(":", 1)
    return _ip(host), _port(_integer(port))


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as err:
        raise ValueError(f"not a valid regular expression: '{text}' ({err})") from None
    return text


def _watermark_relative(value: float) -> float:
    # Above 1.0 is allowed, as in RabbitMQ's schema and its guide ("set some high multiplier
    # such as 100" never to alarm; 3 where total memory is unknown and 1024 MB assumed).
    if value < 0:
        raise ValueError(f"expected a non-negative float such as 0.4, got {value}")
    return value


def _paging_ratio(value: float) -> float:
    # RabbitMQ's schema validator less_than_1: "Float is not between 0 and 1" (both excluded).
    if not 0.0 < value < 1.0:
        raise ValueError(f"expected a float between 0 and 1 (both excluded), got {value}")
    return value


def _classic_paging_ratio(value: float) -> float:
    # The classic format has no schema: any positive ratio, and above 1.0 queues never page
    # (the seeds: "It is possible to set vm_memory_high_watermark_paging_ratio to a greater
    # value than 1.0").
    if value <= 0:
        raise ValueError(f"expected a positive float, got {value}")
    return value


def _mem_relative(value: float) -> float:
    if value < 0:
        raise ValueError(f"expected a non-negative float, got {value}")
    return value


def _frame_max(value: int) -> int:
    if value != 0 and not 4096 <= value <= 0xFFFFFFFF:
        raise ValueError(f"expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got {value}")
    return value


def _max_message_size(value: int) -> int:
    # RabbitMQ's schema validator: "Max message size should be between 0 and 512MB".
    return _in_range(value, 1, 512 * 1024 * 1024, "a size in bytes")


def _handshake_timeout(value) -> float:
    if value == "infinity":
        return math.inf
    ms = _integer(value) if isinstance(value, str) else value
    return _in_range(ms, 1, 2 ** 32 - 1, "a number of milliseconds") / 1000


def _consumer_timeout(value: int) -> int:
    # RabbitMQ's schema: an integer, validator non_zero_positive_integer.
    if value < 1:
        raise ValueError(f"expected a positive number of milliseconds, got {value}")
    return value


def _management_port(value: int) -> int:
    return 0 if value == 0 else _port(value)  # 0: no management API, as --management-port 0


def _max_body_size(value: int) -> int:
    # RabbitMQ's schema (3.11.24, 3.12.7): an integer, validator non_negative_integer; 0
    # refuses every body that is not empty.
    if value < 0:
        raise ValueError(f"expected a non-negative number of bytes such as 10000000, got {value}")
    return value


def _max_body_size_text(text: str) -> int:
    # cuttlefish's integer: no unit ("10MB" is refused by RabbitMQ too).
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(f"expected a number of bytes (an integer such as 10000000, no unit), got '{text}'")
    return _max_body_size(int(text))


def _prometheus_port(value: int) -> int:
    return 0 if value == 0 else _port(value)  # 0: no Prometheus endpoint, as --prometheus-port 0


# TLS ------------------------------------------------------------------------------------
# The TLS options of a listener (ssl_options.* for AMQPS, management.ssl.* for HTTPS) Warren
# implements; RabbitMQ's others (ciphers, depth, crl_check, dhfile, honor_cipher_order,
# client_renegotiation, ...) are refused as unknown keys.
TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")


def _file(text: str) -> str:
    # RabbitMQ's file_accessible validator: the file must exist and be readable at start.
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise ValueError(f"'{text}' is not a readable file")
    return text


def _one_of(first: str, second: str):
    """A validator of a value that is `first` or `second`."""
    def check(text: str) -> str:
        if text not in (first, second):
            raise ValueError(f"expected {first} or {second}, got '{text}'")
        return text
    return check


_verify = _one_of("verify_peer", "verify_none")


def _tls_version(text: str) -> str:
    if text in ("tlsv1", "tlsv1.1", "sslv3"):
        raise ValueError(f"{text} is not supported (Warren allows tlsv1.2 and tlsv1.3)")
    if text not in TLS_VERSIONS:
        raise ValueError(f"expected tlsv1.2 or tlsv1.3, got '{text}'")
    return text


def _mechanism(text: str) -> str:
    if text not in auth_mechanisms.KNOWN:
        raise ValueError(f"expected one of {', '.join(auth_mechanisms.KNOWN)} (the mechanisms Warren has), got '{text}'")
    return text


def _cert_login_from(text: str) -> str:
    if text in ("subject_alternative_name", "subject_alt_name"):
        raise ValueError(f"{text} is not supported (Warren takes the user name from the "
                         "distinguished_name or the common_name)")
    if text not in x509.LOGIN_FROM:
        raise ValueError(f"expected distinguished_name or common_name, got '{text}'")
    return text


_TLS_OPTIONS = {"cacertfile": _file, "certfile": _file, "keyfile": _file, "password": lambda v: v,
                "verify": _verify, "fail_if_no_peer_cert": _boolean}


# RabbitMQ's log levels (log.console.level) as Python logging levels.
LOG_LEVELS = logs.LEVELS
# log.file.level's: those and its filters (only one level, or all below one).
FILE_LOG_LEVELS = [*LOG_LEVELS, *logs.FILE_LEVEL_FILTERS]
MAX_LOG_FILES = 1000  # log.file.rotation.count: the archives are renamed one by one at each rotation


def _log_level(text: str) -> int:
    if text not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got '{text}'")
    return LOG_LEVELS[text]


def _file_log_level(text: str) -> str:
    if text not in FILE_LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(FILE_LOG_LEVELS)}, got '{text}'")
    return text


def _log_file(text: str):
    # RabbitMQ's schema: false or a file name (relative ones under log.dir).
    if text == "false":
        return False
    if text == "true":
        raise ValueError("expected a file path, or false to log to no file, got 'true'")
    return text


def _log_dir(text: str) -> str:
    # RabbitMQ's dir_writable validator: a file can be created there.
    if not os.path.isdir(text) or not os.access(text, os.W_OK | os.X_OK):
        raise ValueError(f"'{text}' is not a writable directory")
    return text


_stdio = _one_of("stdout", "stderr")


def _rotation_size(value) -> int:
    size = parse_information_unit(value)
    if size < 1:
        raise ValueError(f"expected a positive number of bytes, got {value}")
    return size


def _rotation_count(value: int) -> int:
    return _in_range(value, 0, MAX_LOG_FILES, "a number of archived files")


# What both formats build --------------------------------------------------------------

class _Settings:
    """Settings as they are read (with the line each came from), turned into the config
    dict by result(); errors collect every problem with its file, line and key."""

    def __init__(self, path: str):
        self.path = path
        self.errors: list = []
        self.warnings: list = []
        self.config: dict = {}
        self.listeners: dict = {}  # name -> (host, port, line, key)
        self.ssl_listeners: dict = {}  # name -> (host, port, line, key)
        # "ssl_options" / "management.ssl" -> option -> (value, line, key) (versions: a dict
        # name -> version as the value)
        self.tls: dict = {"ssl_options": {}, "management.ssl": {}}
        self.auth_mechanisms: dict = {}  # name (auth_mechanisms.NAME) -> mechanism
        self.user_tags = None  # name -> bool
        self.permissions: dict = {}  # configure/read/write -> (regex, line, key)
        self.loopback = None  # name -> bool
        self.loopback_none = False
        self.watermark: dict = {}  # "relative"/"absolute" -> value
        self.disk_limit: dict = {}  # "relative"/"absolute" -> value
        self.etcd: dict = {}  # cluster_formation.etcd.* -> (value, line, key); endpoints: a dict
        self.discovery = None  # (backend, line, key)
        self.dist_range: dict = {}  # "min"/"max" -> (port, line, key)

    def _tls_result(self, config: dict) -> None:
        """The TLS settings: AMQPS listeners and their options, the API's HTTPS listener,
        mechanisms. A TLS listener needs a certificate and its key; verify_peer needs the CAs."""
        if self.ssl_listeners:
            config["ssl_listeners"] = [(host, port) for host, port, _, _ in
                                       sorted(self.ssl_listeners.values(), key=lambda v: v[2])]
        first_listener = min(self.ssl_listeners.values(), key=lambda v: v[2], default=None)
        for prefix, name in (("ssl_options", "ssl_options"), ("management.ssl", "management_ssl")):
            given = self.tls[prefix]
            if not given and not (prefix == "ssl_options" and first_listener is not None):
                continue
            options = {option: value for option, (value, _, _) in given.items() if option != "versions"}
            if "versions" in given:
                options["versions"] = sorted(set(given["versions"][0].values()))
            if prefix == "management.ssl":
                options.setdefault("port", 15671)  # RabbitMQ's default HTTPS port
                line, key = min((line, key) for _, line, key in given.values())  # (given: not empty)
            elif first_listener is not None:
                _, _, line, key = first_listener
            else:
                line = None  # ssl_options without a TLS listener: checked, unused (as in RabbitMQ)
            config[name] = options
            if line is None:
                continue
            missing = [f"{prefix}.{k}" for k in ("certfile", "keyfile") if k not in options]
            if missing:
                self.error(line, key, f"a TLS listener needs {' and '.join(missing)}")
            if options.get("verify") == "verify_peer" and "cacertfile" not in options:
                _, vline, vkey = given["verify"]
                self.error(vline, vkey, f"verify_peer needs {prefix}.cacertfile (the CAs client "
                                        "certificates are checked against)")
        if self.auth_mechanisms:
            config["auth_mechanisms"] = tuple(dict.fromkeys(self.auth_mechanisms.values()))

    def _cluster_result(self, config: dict) -> None:
        """cluster_formation.*: with the etcd backend, the cluster's settings (`cluster`); etcd
        settings under another backend are unused, as in RabbitMQ, and said so."""
        etcd = self.etcd
        if self.discovery is None or self.discovery[0] != "etcd":
            if etcd:
                self.warnings.append(f"{self.path}: cluster_formation.etcd.* is unused: "
                                     "cluster_formation.peer_discovery_backend is not etcd")
            if self.dist_range:
                self.warnings.append(f"{self.path}: distribution.listener.port_range.* is unused: "
                                     "a node alone has no node links")
            return
        endpoints = [v for _, v in sorted(etcd.get("endpoints", {}).items())]
        if not endpoints and "host" in etcd:  # the legacy pair; its port defaults to etcd's 2379
            endpoints = [f"{etcd['host'][0]}:{etcd.get('port', (2379,))[0]}"]
        if not endpoints:
            _, line, key = self.discovery
            self.error(line, key, "the etcd backend needs cluster_formation.etcd.endpoints.N = HOST:PORT")
            return
        dist = self.dist_range
        if dist:
            low, high = dist.get("min", dist.get("max")), dist.get("max", dist.get("min"))
            if low[0] != high[0]:
                _, line, key = max(dist.values(), key=lambda v: v[1])
                self.error(line, key, "Warren's node links listen on one port: give "
                                      "distribution.listener.port_range.min and .max the same value")
                return
            etcd = {**etcd, "dist_port": (low[0],)}
        config["cluster"] = {"endpoints": endpoints,
                             **{name: etcd[name][0] for name in ("key_prefix", "cluster_name", "node_ttl",
                                                                   "dist_port", "history") if name in etcd}}

    def error(self, line, key, reason) -> None:
        self.errors.append(f"{self.path}:{line}: {key}: {reason}" if key else f"{self.path}:{line}: {reason}")

    def result(self) -> dict:
        config = self.config
        if len(self.listeners) > 1:
            # In file order; a port alone stands for Warren's default (loopback) addresses.
            config["listeners"] = [(host, port) for host, port, _, _ in
                                   sorted(self.listeners.values(), key=lambda v: v[2])]
        elif self.listeners:
            (host, port, _, _), = self.listeners.values()
            config["port"] = port
            if host is not None:
                config["host"] = host
        self._tls_result(config)
        self._cluster_result(config)
        if self.user_tags is not None:
            config["default_user_tags"] = [tag for tag, on in self.user_tags.items() if on]
        if self.permissions:
            missing = [p for p in ("configure", "write", "read") if p not in self.permissions]
            if missing:
                _, line, key = min(self.permissions.values(), key=lambda v: v[1])
                self.error(line, key, "default_permissions needs configure, read and write; "
                                      f"missing: {', '.join(missing)}")
            else:
                config["default_permissions"] = tuple(self.permissions[p][0] for p in ("configure", "write", "read"))
        if self.loopback_none:
            config["loopback_users"] = set()
        elif self.loopback is not None:
            config["loopback_users"] = {name for name, on in self.loopback.items() if on}
        for name, settings, relative in (("vm_memory_high_watermark", self.watermark, "relative"),
                                         ("disk_free_limit", self.disk_limit, "mem_relative")):
            if "relative" in settings and "absolute" in settings:
                # RabbitMQ 3.10 lets the relative setting win (later versions the absolute one).
                self.warnings.append(f"{self.path}: both {name}.absolute and {name}.relative are set: "
                                     f"{name}.relative applies, as in RabbitMQ 3.10")
            if "relative" in settings:
                config[name] = (relative, settings["relative"])
            elif "absolute" in settings:
                config[name] = ("absolute", settings["absolute"])
        if self.errors:
            raise ConfigError(self.errors)
        return config


# The new-style format ------------------------------------------------------------------

def _simple(name, convert):
    def handle(settings, key, rest, value, line):
        settings.config[name] = convert(value)
    return handle


def _text(name):
    return _simple(name, lambda v: v)


def _listeners_none(settings, key, rest, value, line):
    if value != "none":
        raise ValueError(f"expected none or listeners.tcp.NAME = PORT, got '{value}'")
    raise ValueError("'none' (no AMQP listener) is not supported: Warren always listens for AMQP")


def _listener_key(settings, key, rest, value, line):
    host, port = _listener(value)
    settings.listeners[rest] = (host, port, line, key)


def _ssl_listeners_none(settings, key, rest, value, line):
    if value != "none":
        raise ValueError(f"expected none or listeners.ssl.NAME = PORT, got '{value}'")
    settings.ssl_listeners = {}


def _ssl_listener_key(settings, key, rest, value, line):
    host, port = _listener(value)
    settings.ssl_listeners[rest] = (host, port, line, key)


def _tls_option(prefix, name, convert):
    def handle(settings, key, rest, value, line):
        settings.tls[prefix][name] = (convert(value), line, key)
    return handle


def _tls_version_key(prefix):
    def handle(settings, key, rest, value, line):
        versions = settings.tls[prefix].setdefault("versions", ({}, line, key))[0]
        versions[rest] = _tls_version(value)
    return handle


def _auth_mechanism(settings, key, rest, value, line):
    settings.auth_mechanisms[rest] = _mechanism(value)


def _user_tag(settings, key, rest, value, line):
    on = _boolean(value)
    if settings.user_tags is None:
        settings.user_tags = {}
    settings.user_tags[rest] = on


def _permission(settings, key, rest, value, line):
    settings.permissions[rest] = (_regex(value), line, key)


def _loopback_none(settings, key, rest, value, line):
    if value != "none":
        raise ValueError(f"expected none (or loopback_users.NAME = true/false), got '{value}'")
    settings.loopback_none = True


def _loopback_user(settings, key, rest, value, line):
    on = _boolean(value)
    if settings.loopback is None:
        settings.loopback = {}
    settings.loopback[rest] = on


def _watermark(kind):
    def handle(settings, key, rest, value, line):
        settings.watermark[kind] = (_watermark_relative(_float(value)) if kind == "relative"
                                    else parse_information_unit(value))
    return handle


def _disk_limit(kind):
    def handle(settings, key, rest, value, line):
        settings.disk_limit[kind] = (_mem_relative(_float(value)) if kind == "relative"
                                     else parse_information_unit(value))
    return handle


# RabbitMQ's names of its peer discovery backends (a module name or its short form).
_DISCOVERY_BACKENDS = {"classic_config": "classic_config", "rabbit_peer_discovery_classic_config": "classic_config",
                       "etcd": "etcd", "rabbit_peer_discovery_etcd": "etcd"}


def _discovery_backend(settings, key, rest, value, line):
    backend = _DISCOVERY_BACKENDS.get(value)
    if backend is None:
        raise ValueError(f"peer discovery backend '{value}' is not supported: Warren's nodes cluster through "
                         "etcd (etcd or rabbit_peer_discovery_etcd) or run alone (classic_config, with no nodes listed)")
    settings.discovery = (backend, line, key)


def _etcd_setting(name, convert):
    def handle(settings, key, rest, value, line):
        settings.etcd[name] = (convert(value), line, key)
    return handle


def _dist_port(end):
    """distribution.listener.port_range.min/max: the node links' port (RabbitMQ's inter-node
    port; by default the AMQP port + 20000)."""
    def handle(settings, key, rest, value, line):
        settings.dist_range[end] = (_port(_integer(value)), line, key)
    return handle


def _etcd_endpoint(settings, key, rest, value, line):
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got '{value}'")
    settings.etcd.setdefault("endpoints", {})[rest] = value


def _etcd_refused(what):
    def handle(settings, key, rest, value, line):
        raise ValueError(f"not supported: {what}")
    return handle


def _node_ttl(value: int) -> int:
    # As rabbitmq_peer_discovery_etcd: a lease shorter than 15 s is raised to 15 s.
    return max(15, _in_range(value, 0, 2 ** 31 - 1))


def _max_message_size_text(value: str) -> int:
    # RabbitMQ 3.10 takes an integer; Warren also takes information units ("128MiB").
    return _max_message_size(parse_information_unit(value))


# key (a trailing ".*" matches one more word, passed as `rest`) -> handler
_NEW_STYLE = {
    "listeners.tcp": _listeners_none,
    "listeners.tcp.*": _listener_key,
    "default_user": _text("default_user"),
    "default_pass": _text("default_pass"),
    "default_vhost": _text("default_vhost"),
    "default_user_tags.*": _user_tag,
    "default_permissions.configure": lambda s, k, r, v, n: _permission(s, k, "configure", v, n),
    "default_permissions.read": lambda s, k, r, v, n: _permission(s, k, "read", v, n),
    "default_permissions.write": lambda s, k, r, v, n: _permission(s, k, "write", v, n),
    "loopback_users": _loopback_none,
    "loopback_users.*": _loopback_user,
    "heartbeat": _simple("heartbeat", lambda v: _in_range(_integer(v), 0, 65535)),
    "frame_max": _simple("frame_max", lambda v: _frame_max(parse_bytesize(v))),
    "channel_max": _simple("channel_max", lambda v: _in_range(_integer(v), 0, 65535)),
    "max_message_size": _simple("max_message_size", _max_message_size_text),
    "handshake_timeout": _simple("handshake_timeout", _handshake_timeout),
    "consumer_timeout": _simple("consumer_timeout", lambda v: _consumer_timeout(_integer(v))),
    "vm_memory_high_watermark.relative": _watermark("relative"),
    "vm_memory_high_watermark.absolute": _watermark("absolute"),
    "vm_memory_high_watermark_paging_ratio": _simple("vm_memory_high_watermark_paging_ratio",
                                                     lambda v: _paging_ratio(_float(v))),
    "disk_free_limit.relative": _disk_limit("relative"),
    "disk_free_limit.absolute": _disk_limit("absolute"),
    "management.tcp.port": _simple("management_port", lambda v: _management_port(_integer(v))),
    "management.tcp.ip": _simple("management_host", _ip),
    "management.http.max_body_size": _simple("management_max_body_size", _max_body_size_text),
    "prometheus.tcp.port": _simple("prometheus_port", lambda v: _prometheus_port(_integer(v))),
    "prometheus.tcp.ip": _simple("prometheus_host", _ip),
    "prometheus.return_per_object_metrics": _simple("prometheus_per_object", _boolean),
    "log.console": _simple("log_console", _boolean),
    "log.console.level": _simple("log_level", _log_level),
    "log.console.stdio": _simple("log_console_stdio", _stdio),
    "log.dir": _simple("log_dir", _log_dir),
    "log.file": _simple("log_file", _log_file),
    "log.file.level": _simple("log_file_level", _file_log_level),
    "log.file.rotation.size": _simple("log_file_rotation_size", _rotation_size),
    "log.file.rotation.count": _simple("log_file_rotation_count", lambda v: _rotation_count(_integer(v))),
    "log.file.rotation.date": _simple("log_file_rotation_date", logs.parse_date_spec),
    "log.file.rotation.compress": _simple("log_file_rotation_compress", _boolean),
    "log.connection.level": _simple("log_connection_level", _log_level),
    "log.channel.level": _simple("log_channel_level", _log_level),
    "listeners.ssl": _ssl_listeners_none,
    "listeners.ssl.*": _ssl_listener_key,
    **{f"ssl_options.{name}": _tls_option("ssl_options", name, convert) for name, convert in _TLS_OPTIONS.items()},
    "ssl_options.versions.*": _tls_version_key("ssl_options"),
    "ssl_handshake_timeout": _simple("ssl_handshake_timeout", lambda v: _handshake_timeout(_integer(v))),
    "auth_mechanisms.*": _auth_mechanism,
    "ssl_cert_login_from": _simple("ssl_cert_login_from", _cert_login_from),
    "management.ssl.port": _tls_option("management.ssl", "port", lambda v: _port(_integer(v))),
    "management.ssl.ip": _tls_option("management.ssl", "ip", _ip),
    **{f"management.ssl.{name}": _tls_option("management.ssl", name, convert)
       for name, convert in _TLS_OPTIONS.items()},
    "management.ssl.versions.*": _tls_version_key("management.ssl"),
    "cluster_name": _text("cluster_name"),
    "cluster_formation.peer_discovery_backend": _discovery_backend,
    "cluster_formation.etcd.endpoints.*": _etcd_endpoint,
    "cluster_formation.etcd.host": _etcd_setting("host", lambda v: v),
    "cluster_formation.etcd.port": _etcd_setting("port", lambda v: _port(_integer(v))),
    "cluster_formation.etcd.key_prefix": _etcd_setting("key_prefix", lambda v: v),
    "cluster_formation.etcd.cluster_name": _etcd_setting("cluster_name", lambda v: v),
    "cluster_formation.etcd.node_ttl": _etcd_setting("node_ttl", lambda v: _node_ttl(_integer(v))),
    "cluster_formation.etcd.username": _etcd_refused("Warren's etcd client does not log in to etcd"),
    "cluster_formation.etcd.password": _etcd_refused("Warren's etcd client does not log in to etcd"),
    "distribution.listener.port_range.min": _dist_port("min"),
    "distribution.listener.port_range.max": _dist_port("max"),
    "warren.metadata_history": _etcd_setting("history", lambda v: _in_range(_integer(v), MIN_HISTORY, 2 ** 62)),
    "warren.queue_window": _simple("queue_window", lambda v: _in_range(_integer(v), 1, 2 ** 31 - 1)),
}

# cuttlefish's key: words of letters, digits, _ and -, separated by dots ("\." is a dot
# inside a word, as in loopback_users.first\.last).
_WORD = r"(?:[A-Za-z0-9_-]|\\\.)+"
_LINE = re.compile(rf"\s*({_WORD}(?:\.{_WORD})*)\s*=\s*(.*?)\s*")


def _new_style_handler(key: str):
    """(handler, rest) for a key, or (None, None)."""
    handler = _NEW_STYLE.get(key.replace("\\.", "\0"))
    if handler is not None:
        return handler, None
    words = key.replace("\\.", "\0").split(".")
    handler = _NEW_STYLE.get(".".join(words[:-1]) + ".*") if len(words) > 1 else None
    return (handler, words[-1].replace("\0", ".")) if handler is not None else (None, None)


def _unknown_key(key: str) -> str:
    for prefix in ("ssl_options.", "management.ssl."):
        if key.startswith(prefix):
            return (f"unknown key (Warren's TLS options: {', '.join(prefix + k for k in _TLS_OPTIONS)}, "
                    f"{prefix}versions.N" + (f", {prefix}port, {prefix}ip" if prefix == "management.ssl." else "")
                    + ")")
    last = key.rsplit(".", 1)[-1]  # "listeners.ssl.default" is closest to "listeners.tcp.default"
    names = [k[:-1] + last if k.endswith(".*") else k for k in _NEW_STYLE]
    close = difflib.get_close_matches(key, names, n=1)
    return "unknown key" + (f" (did you mean {close[0]}?)" if close else "")


def _parse_new_style(text: str, settings: _Settings) -> None:
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0]
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if not m or not m.group(2):
            settings.error(lineno, None, f"syntax error: expected 'key = value', got '{line.strip()}'")
            continue
        key, value = m.groups()
        handler, rest = _new_style_handler(key)
        if handler is None:
            settings.error(lineno, key, _unknown_key(key))
            continue
        try:
            handler(settings, key, rest, value, lineno)
        except ValueError as err:
            settings.error(lineno, key, err)


# The classic Erlang-term format --------------------------------------------------------

def _erl_text(term) -> str:
    """A binary or a string, as text (RabbitMQ turns either into a binary)."""
    if isinstance(term, bytes):
        try:
            return term.decode("utf-8")
        except UnicodeDecodeError:
            return term.decode("latin-1")
    if isinstance(term, str):
        return term
    raise ValueError(f'expected a binary such as <<"guest">> or a string, got {format_term(term)}')


def _erl_int(term) -> int:
    if isinstance(term, int):
        return term
    raise ValueError(f"expected an integer, got {format_term(term)}")


def _erl_number(term) -> float:
    if isinstance(term, (int, float)):
        return float(term)
    raise ValueError(f"expected a number such as 0.4, got {format_term(term)}")


def _erl_float(term) -> float:
    if isinstance(term, float):
        return term
    raise ValueError(f"expected a float such as 0.5, got {format_term(term)}")


def _erl_boolean(term) -> bool:
    if isinstance(term, Atom) and term.name in ("true", "false"):
        return term.name == "true"
    raise ValueError(f"expected true or false, got {format_term(term)}")


def _erl_list(term, what="a list") -> list:
    if not isinstance(term, list):
        raise ValueError(f"expected {what}, got {format_term(term)}")
    return term


def _erl_size(term) -> int:
    if isinstance(term, (str, bytes)):
        return parse_information_unit(_erl_text(term))
    if isinstance(term, int):
        return parse_information_unit(term)
    raise ValueError(f'expected {_SIZE_FORMATS} (as an integer or a string such as "2GB"), got {format_term(term)}')


def _erl_proplist(term, line, where, settings, handlers) -> None:
    """Apply a [{key, value}] list with `handlers`: key -> handler(settings, value, line, name)."""
    if not isinstance(term, list):
        settings.error(line, where, f"expected a list of {{key, value}} tuples, got {format_term(term)}")
        return
    for item in term:
        at = getattr(item, "line", 0) or line
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom)):
            settings.error(at, where, f"expected a {{key, value}} tuple, got {format_term(item)}")
            continue
        key, value = item[0].name, item[1]
        name = f"{where}.{key}"
        handler = handlers.get(key)
        if handler is None:
            close = difflib.get_close_matches(key, list(handlers), n=1)
            settings.error(at, name, "unknown key" + (f" (did you mean {where}.{close[0]}?)" if close else ""))
            continue
        try:
            handler(settings, value, at, name)
        except ValueError as err:
            settings.error(at, name, err)


def _erl_simple(name, convert):
    def handle(settings, value, line, key):
        settings.config[name] = convert(value)
    return handle


def _erl_tcp_listeners(settings, value, line, key):
    items = _erl_list(value, "a list of ports or {\"IP\", Port} tuples")
    if not items:
        raise ValueError("[] (no AMQP listener) is not supported: Warren always listens for AMQP")
    listeners = {}
    for n, item in enumerate(items):
        if isinstance(item, int):
            host, port = None, _port(item)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], int):
            ip = item[0]
            if isinstance(ip, tuple) and len(ip) in (4, 8) and all(isinstance(p, int) for p in ip):
                ip = ".".join(map(str, ip)) if len(ip) == 4 else ":".join(f"{p:x}" for p in ip)
            host, port = _ip(_erl_text(ip)), _port(item[1])
        else:
            raise ValueError(f'expected a port or an {{"IP", Port}} tuple, got {format_term(item)}')
        listeners[n] = (host, port, line, key)
    settings.listeners = listeners


def _erl_ssl_listeners(settings, value, line, key):
    # As tcp_listeners; [] (no TLS listener) is RabbitMQ's default.
    settings.ssl_listeners = {}
    if _erl_list(value, "a list of ports or {\"IP\", Port} tuples"):
        tcp = settings.listeners
        _erl_tcp_listeners(settings, value, line, key)  # (sets settings.listeners once all are valid)
        settings.ssl_listeners, settings.listeners = settings.listeners, tcp


def _erl_atom_text(term) -> str:
    if isinstance(term, Atom):
        return term.name
    raise ValueError(f"expected an atom, got {format_term(term)}")


def _erl_atom_value(convert):
    """An atom's name through a new-style converter, its errors showing the term as Erlang does."""
    def parse(term):
        name = _erl_atom_text(term)
        try:
            return convert(name)
        except ValueError as err:
            raise ValueError(str(err).replace(f"'{name}'", format_term(term))) from None
    return parse


def _erl_tls_options(prefix, listener=False):
    """The handler of a proplist of TLS options (rabbit's ssl_options, rabbitmq_management's
    ssl_config, which also has port and ip)."""
    def option(name, convert):
        def handle(settings, value, line, key):
            settings.tls[prefix][name] = (convert(value), line, key)
        return handle

    def versions(settings, value, line, key):
        items = _erl_list(value, "a list of atoms such as ['tlsv1.2', 'tlsv1.3']")
        settings.tls[prefix]["versions"] = ({str(i): _erl_atom_value(_tls_version)(v) for i, v in enumerate(items)},
                                            line, key)

    handlers = {"cacertfile": option("cacertfile", lambda v: _file(_erl_text(v))),
                "certfile": option("certfile", lambda v: _file(_erl_text(v))),
                "keyfile": option("keyfile", lambda v: _file(_erl_text(v))),
                "password": option("password", _erl_text),
                "verify": option("verify", _erl_atom_value(_verify)),
                "fail_if_no_peer_cert": option("fail_if_no_peer_cert", _erl_boolean),
                "versions": versions}
    if listener:
        handlers["port"] = option("port", lambda v: _port(_erl_int(v)))
        handlers["ip"] = option("ip", lambda v: _ip(_erl_text(v)))

    def handle(settings, value, line, key):
        _erl_proplist(value, line, key, settings, handlers)
    return handle


def _erl_auth_mechanisms(settings, value, line, key):
    items = _erl_list(value, "a list of atoms such as ['PLAIN', 'AMQPLAIN', 'EXTERNAL']")
    settings.auth_mechanisms = {str(i): _erl_atom_value(_mechanism)(v) for i, v in enumerate(items)}
    if not items:
        raise ValueError("[] (no mechanism: nobody could log in) is not supported")


def _erl_user_tags(settings, value, line, key):
    tags = _erl_list(value, "a list of atoms such as [administrator]")
    for tag in tags:
        if not isinstance(tag, Atom):
            raise ValueError(f"expected a list of atoms such as [administrator], got {format_term(value)}")
    settings.user_tags = {tag.name: True for tag in tags}


def _erl_permissions(settings, value, line, key):
    # The classic list is [Configure, Write, Read], as rabbit:insert_default_data/0 reads it.
    if not (isinstance(value, list) and len(value) == 3):
        raise ValueError(f'expected [Configure, Write, Read] such as [<<".*">>, <<".*">>, <<".*">>], '
                         f"got {format_term(value)}")
    regexes = [_regex(_erl_text(v)) for v in value]
    settings.permissions = {p: (r, line, key) for p, r in zip(("configure", "write", "read"), regexes)}


def _erl_loopback_users(settings, value, line, key):
    users = _erl_list(value, 'a list of binaries such as [<<"guest">>]')
    for user in users:
        if not isinstance(user, bytes):
            # RabbitMQ compares binaries: a string here would match no one.
            raise ValueError(f'expected a list of binaries such as [<<"guest">>], got {format_term(value)}')
    settings.loopback_none = False
    settings.loopback = {_erl_text(user): True for user in users}


def _erl_handshake_timeout(value):
    if value == Atom("infinity"):
        return math.inf
    return _handshake_timeout(_erl_int(value))


def _erl_consumer_timeout(value):
    if value == Atom("undefined"):  # RabbitMQ's way to turn the timeout off (advanced.config)
        return None
    return _consumer_timeout(_erl_int(value))


def _erl_watermark(settings, value, line, key):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == Atom("absolute"):
        settings.watermark = {"absolute": _erl_size(value[1])}
    elif isinstance(value, (int, float)):
        settings.watermark = {"relative": _watermark_relative(_erl_number(value))}
    else:
        raise ValueError(f'expected a fraction such as 0.4 or {{absolute, Bytes}} such as {{absolute, "1024MiB"}}, '
                         f"got {format_term(value)}")


def _erl_disk_free_limit(settings, value, line, key):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == Atom("mem_relative"):
        settings.disk_limit = {"relative": _mem_relative(_erl_number(value[1]))}
    elif isinstance(value, tuple) and len(value) == 2 and value[0] == Atom("absolute"):
        settings.disk_limit = {"absolute": _erl_size(value[1])}
    elif isinstance(value, (int, str, bytes)):
        settings.disk_limit = {"absolute": _erl_size(value)}
    else:
        raise ValueError(f'expected bytes such as 50000000 or "50MB", or {{mem_relative, Float}}, '
                         f"got {format_term(value)}")


def _erl_log(settings, value, line, key):
    _erl_proplist(value, line, key, settings, {"console": _erl_log_console, "file": _erl_log_file,
                                               "categories": _erl_log_categories})


def _erl_level(convert, names):
    def parse(term):
        if not isinstance(term, Atom):
            raise ValueError(f"expected one of {', '.join(names)}, got {format_term(term)}")
        return convert(term.name)
    return parse


_erl_log_level = _erl_level(_log_level, LOG_LEVELS)


def _erl_log_console(settings, value, line, key):
    _erl_proplist(value, line, key, settings, {
        "enabled": _erl_simple("log_console", _erl_boolean),
        "level": _erl_simple("log_level", _erl_log_level),
        "stdio": _erl_simple("log_console_stdio", _erl_atom_value(_stdio)),
    })


def _erl_log_file_name(term):
    if term == Atom("false"):
        return False
    return _log_file(_erl_text(term))


def _erl_log_file(settings, value, line, key):
    _erl_proplist(value, line, key, settings, {
        "file": _erl_simple("log_file", _erl_log_file_name),
        "level": _erl_simple("log_file_level", _erl_level(_file_log_level, FILE_LOG_LEVELS)),
        "size": _erl_simple("log_file_rotation_size", lambda v: _rotation_size(_erl_int(v))),
        "count": _erl_simple("log_file_rotation_count", lambda v: _rotation_count(_erl_int(v))),
        "date": _erl_simple("log_file_rotation_date", lambda v: logs.parse_date_spec(_erl_text(v))),
        "compress": _erl_simple("log_file_rotation_compress", _erl_boolean),
    })


def _erl_log_categories(settings, value, line, key):
    def category(name):
        def handle(settings, value, line, key):
            _erl_proplist(value, line, key, settings, {"level": _erl_simple(f"log_{name}_level", _erl_log_level)})
        return handle
    _erl_proplist(value, line, key, settings, {"connection": category("connection"), "channel": category("channel")})


def _erl_management_listener(settings, value, line, key):
    _erl_proplist(value, line, key, settings, {
        "port": _erl_simple("management_port", lambda v: _management_port(_erl_int(v))),
        "ip": _erl_simple("management_host", lambda v: _ip(_erl_text(v))),
    })


def _erl_prometheus_listener(settings, value, line, key):
    _erl_proplist(value, line, key, settings, {
        "port": _erl_simple("prometheus_port", lambda v: _prometheus_port(_erl_int(v))),
        "ip": _erl_simple("prometheus_host", lambda v: _ip(_erl_text(v))),
    })


def _erl_static_shovels(settings, value, line, key):
    shovels, problems = static_shovels.parse(value, line, key)
    for problem in problems:
        settings.error(problem.line, problem.key, problem.reason)
    settings.config["static_shovels"] = shovels


_ERLANG_RABBIT = {
    "tcp_listeners": _erl_tcp_listeners,
    "default_user": _erl_simple("default_user", _erl_text),
    "default_pass": _erl_simple("default_pass", _erl_text),
    "default_vhost": _erl_simple("default_vhost", _erl_text),
    "default_user_tags": _erl_user_tags,
    "default_permissions": _erl_permissions,
    "loopback_users": _erl_loopback_users,
    "heartbeat": _erl_simple("heartbeat", lambda v: _in_range(_erl_int(v), 0, 65535)),
    "frame_max": _erl_simple("frame_max", lambda v: _frame_max(_erl_int(v))),
    "channel_max": _erl_simple("channel_max", lambda v: _in_range(_erl_int(v), 0, 65535)),
    "max_message_size": _erl_simple("max_message_size", lambda v: _max_message_size(_erl_int(v))),
    "handshake_timeout": _erl_simple("handshake_timeout", _erl_handshake_timeout),
    "consumer_timeout": _erl_simple("consumer_timeout", _erl_consumer_timeout),
    "vm_memory_high_watermark": _erl_watermark,
    "vm_memory_high_watermark_paging_ratio": _erl_simple("vm_memory_high_watermark_paging_ratio",
                                                         lambda v: _classic_paging_ratio(_erl_float(v))),
    "disk_free_limit": _erl_disk_free_limit,
    "log": _erl_log,
    "log_root": _erl_simple("log_dir", lambda v: _log_dir(_erl_text(v))),
    "ssl_listeners": _erl_ssl_listeners,
    "ssl_options": _erl_tls_options("ssl_options"),
    "ssl_handshake_timeout": _erl_simple("ssl_handshake_timeout", lambda v: _handshake_timeout(_erl_int(v))),
    "auth_mechanisms": _erl_auth_mechanisms,
    "ssl_cert_login_from": _erl_simple("ssl_cert_login_from", _erl_atom_value(_cert_login_from)),
}

_ERLANG_APPS = {
    "rabbit": _ERLANG_RABBIT,
    # tcp_config since 3.7; listener is the older name RabbitMQ still reads.
    "rabbitmq_management": {"tcp_config": _erl_management_listener, "listener": _erl_management_listener,
                            "ssl_config": _erl_tls_options("management.ssl", listener=True),
                            "max_http_body_size": _erl_simple("management_max_body_size",
                                                              lambda v: _max_body_size(_erl_int(v)))},
    "rabbitmq_prometheus": {"tcp_config": _erl_prometheus_listener,
                            "return_per_object_metrics": _erl_simple("prometheus_per_object", _erl_boolean)},
    "rabbitmq_shovel": {"shovels": _erl_static_shovels},
    "warren": {"queue_window": _erl_simple("queue_window", lambda v: _in_range(_erl_int(v), 1, 2 ** 31 - 1))},
}


def _parse_erlang(text: str, settings: _Settings) -> None:
    try:
        term = parse_erlang_term(text)
    except ErlangSyntaxError as err:
        settings.error(err.line, None, f"syntax error: {err}")
        return
    if not isinstance(term, ErlList):  # the parser makes every list an ErlList
        settings.error(1, None, f"expected a list of {{application, [{{key, value}}]}} tuples such as "
                                f"[{{rabbit, [{{heartbeat, 30}}]}}], got {format_term(term)}")
        return
    for item in term:
        line = getattr(item, "line", term.line)
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom)):
            settings.error(line, None, f"expected an {{application, [{{key, value}}]}} tuple, got {format_term(item)}")
            continue
        app = item[0].name
        if app not in _ERLANG_APPS:
            settings.error(line, app, f"unknown application (Warren reads {', '.join(_ERLANG_APPS)})")
            continue
        _erl_proplist(item[1], line, app, settings, _ERLANG_APPS[app])


# Both ----------------------------------------------------------------------------------

def is_erlang_format(path: str, text: str) -> bool:
    """A classic rabbitmq.config: named *.config, or its first term starts with '['."""
    if path.endswith(".config"):
        return True
    for line in text.splitlines():
        line = line.split("%", 1)[0].strip()
        if line:
            return line.startswith("[")
    return False


def parse_config(text: str, path: str = "<config>", warnings=None) -> dict:
    settings = _Settings(path)
    if is_erlang_format(path, text):
        _parse_erlang(text, settings)
    else:
        _parse_new_style(text, settings)
    try:
        return settings.result()
    finally:
        if warnings is not None:
            warnings.extend(settings.warnings)


def load_config(path: str, warnings=None) -> dict:
    """The settings of a config file (see the module doc); ConfigError if it cannot be read or
    has any bad line. Warnings (settings that are legal but doubtful) are appended to
    `warnings` if given, else logged."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"cannot read config file {path}: not UTF-8 text "
                          f"({err.reason} at byte {err.start})") from None
    own = [] if warnings is None else warnings
    config = parse_config(text, path, own)
    if warnings is None:
        for message in own:
            log.warning("%s", message)
    return config
