"""RabbitMQ's new-style config format (`key = value`), for the keys Warren supports so far."""

import re


class ConfigError(ValueError):
    pass


_UNITS = {"": 1, "kb": 1000, "kib": 1024, "ki": 1024, "k": 1024, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
          "m": 1024**2, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3, "g": 1024**3}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"invalid size '{text}'")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _int(v):
    return int(v)


def _bool(v):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise ValueError(f"expected true or false, got '{v}'")


_KEYS = {
    "listeners.tcp.default": ("port", lambda v: int(v.rsplit(":", 1)[-1])),
    "default_user": ("default_user", str),
    "default_pass": ("default_pass", str),
    "default_vhost": ("default_vhost", str),
    "heartbeat": ("heartbeat", _int),
    "frame_max": ("frame_max", _int),
    "channel_max": ("channel_max", _int),
    "max_message_size": ("max_message_size", parse_size),
}


def load_config(path: str) -> dict:
    config: dict = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ConfigError(f"{path}:{lineno}: expected 'key = value'")
        key, value = (p.strip() for p in line.split("=", 1))
        if key.startswith("loopback_users."):
            users = config.setdefault("loopback_users", {"guest"})
            try:
                (users.add if _bool(value) else users.discard)(key.split(".", 1)[1])
            except ValueError as err:
                raise ConfigError(f"{path}:{lineno}: {key}: {err}") from None
            continue
        if key not in _KEYS:
            raise ConfigError(f"{path}:{lineno}: unknown key '{key}'")
        name, convert = _KEYS[key]
        try:
            config[name] = convert(value)
        except ValueError as err:
            raise ConfigError(f"{path}:{lineno}: bad value for '{key}': {err}") from None
    return config
