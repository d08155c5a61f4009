"""Metadata commands (warren.broker.metadata.commands) as JSON, the values of the cluster's
log in etcd: the node that validated a command encodes it, and every node decodes the same
bytes into an equal command and applies it (MetadataStore.apply).

An entry is {"command": the class name, "fields": {field: value}}, compact JSON in UTF-8. A
value JSON carries exactly stays as it is: null, booleans, strings, integers, finite floats,
lists, and objects with string keys. Any other value is an object of one key, a tag starting
with "$", holding what defines it:

  {"$long": 5}, {"$short": -1}, ...   a field-table number that keeps its AMQP type (the
                          names of warren.amqp.codec: byte, unsignedbyte, short, unsignedshort,
                          signedint, unsignedint, long, unsignedlong, float, double, and
                          timestamp: a 'T' past year 9999), so that it goes back on the wire
                          as it came in (x-max-length a long, x-max-hops a long, ...)
  {"$number": bits}       a plain float that is not finite (JSON has no NaN): its IEEE 754
                          bits in hex, as a non-finite float or double also holds them
  {"$bytes": base64}      a byte array ('x')
  {"$longstr": base64}    a longstr that is not UTF-8
  {"$decimal": "1.50"}    a Decimal, its digits and exponent as they were
  {"$datetime": iso}      a datetime: naive, or at a fixed offset (a 'T' is decoded in UTC)
  {"$tuple": [...]}       a tuple (a list stays a list)
  {"$dict": {...}}        a dict that would read as a tag (one key, starting with "$")
  {"$keep": null}         commands.KEEP
  {"$command": {...}}     a command inside another (a Batch's), as an entry is
  {"$user": ...}, {"$policy": ...}, {"$shovel": ...}, {"$owner": ...}, {"$link": ...}
                          a User, Policy, shovel Config, ExclusiveOwner or ConnectionLink by
                          the fields that define it, built again by its constructor (a policy
                          compiles its pattern); a field left out takes its default, if it
                          has one (an entry written before the field existed)

Strings are any Python strings: a lone surrogate (a name read with surrogateescape, or
JSON's "\\udc80" in an API body) is written as its three bytes ('surrogatepass'), so a string
comes back code point for code point.

Every field is checked against its annotation both ways: a node refuses to write a command
its peers would refuse (TypeError), and every node refuses a malformed entry (ValueError)
rather than hand the store something it cannot apply."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import decimal
import json
import math
import re
import struct
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from ..amqp.codec import longstr_bytes, typed_float, typed_int
from ..amqp.spec import Method
from ..broker.auth import MD5, SHA256, SHA512, User
from ..broker.links import ConnectionLink, ExclusiveOwner
from ..broker.metadata.commands import KEEP, Command
from ..broker.policy import APPLY_TO, Policy
from ..broker.shovel_config import Config as ShovelConfig

# Every command by its class name: a new one in commands.Command is encoded without more.
COMMANDS: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Command)}

# The integer types of field-table values, with the values each can hold on the wire.
_INT_RANGES = {"byte": (-2**7, 2**7), "unsignedbyte": (0, 2**8), "short": (-2**15, 2**15),
               "unsignedshort": (0, 2**16), "signedint": (-2**31, 2**31), "unsignedint": (0, 2**32),
               "long": (-2**63, 2**63), "unsignedlong": (0, 2**64), "timestamp": (0, 2**64)}
_INT_TYPES = {type(typed_int(name, 0)): name for name in _INT_RANGES}
_FLOAT_TYPES = {type(typed_float(name, 0.0)): name for name in ("float", "double")}
_LONGSTR = type(longstr_bytes(b""))
_F32 = struct.Struct(">f")
_BITS = struct.Struct(">d")
_HASHINGS = (SHA256, SHA512, MD5)

# The names the commands' and the shovel Config's annotations use only for type checking.
_ANNOTATED = {"User": User, "Policy": Policy, "ExclusiveOwner": ExclusiveOwner, "ShovelConfig": ShovelConfig,
              "Method": Method}


class CommandError(ValueError):
    """A log entry that is not a command this node can apply."""


# ---------------------------------------------------------------- commands
def encode(command: Command) -> bytes:
    """The command as compact UTF-8 JSON; TypeError if it holds what no peer could decode
    (a value of another type than its field's, or one of a type this codec does not know)."""
    cls = type(command)
    name = cls.__name__
    if COMMANDS.get(name) is not cls:
        raise TypeError(f"not a metadata command: {command!r}")
    text = json.dumps(_entry(command), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


def _entry(command: Any) -> dict:
    name = type(command).__name__
    return {"command": name, "fields": _fields_of(command, _COMMAND_FIELDS[type(command)][0], name)}


def decode(data: bytes) -> Command:
    """The command `data` encodes; CommandError (a ValueError) if it is not one."""
    try:
        entry = json.loads(bytes(data).decode("utf-8", "surrogatepass"), parse_constant=_no_constant)
        return _command(entry)
    except RecursionError:
        raise CommandError("values nested too deep") from None
    except CommandError:
        raise
    except ValueError as err:  # malformed JSON or UTF-8
        raise CommandError(f"not a command: {err}") from None


def _command(entry: Any) -> Any:
    if type(entry) is not dict or entry.keys() != {"command", "fields"}:
        raise CommandError('a command is an object of "command" and "fields"')
    name = entry["command"]
    cls = COMMANDS.get(name) if type(name) is str else None
    if cls is None:
        raise CommandError(f"unknown command {name!r}")
    return cls(**_fields_from(entry["fields"], *_COMMAND_FIELDS[cls], name))


def _no_constant(name: str):
    raise CommandError(f"{name} is not a JSON number")


def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their types, in order."""
    hints = typing.get_type_hints(cls, localns=_ANNOTATED)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _optional(cls: type) -> frozenset[str]:
    """A dataclass's fields that have a default."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)


_COMMAND_FIELDS = {cls: (_hints(cls), _optional(cls)) for cls in COMMANDS.values()}


# ---------------------------------------------------------------- fields, checked against their types
def _fields_of(obj: Any, hints: dict[str, Any], what: str) -> dict[str, Any]:
    out = {}
    for name, hint in hints.items():
        value = getattr(obj, name)
        if not _conforms(value, hint):
            raise TypeError(f"{what}.{name} is {_shown(value)}, not {_type_name(hint)}")
        out[name] = _encode(value)
    return out


def _fields_from(payload: Any, hints: dict[str, Any], optional: frozenset[str], what: str) -> dict[str, Any]:
    if type(payload) is not dict:
        raise CommandError(f"{what}: its fields must be an object, not {_shown(payload)}")
    unknown = payload.keys() - hints.keys()
    if unknown:
        raise CommandError(f"{what} has no field {sorted(unknown)[0]!r}")
    missing = hints.keys() - payload.keys() - optional
    if missing:
        raise CommandError(f"{what} lacks the field {sorted(missing)[0]!r}")
    out = {}
    for name, raw in payload.items():
        value = _decode(raw)
        if not _conforms(value, hints[name]):
            raise CommandError(f"{what}.{name} is {_shown(value)}, not {_type_name(hints[name])}")
        out[name] = value
    return out


def _conforms(value: Any, hint: Any) -> bool:
    """Whether the value is of the annotated type (the forms the commands use: classes,
    unions, Any, dict[K, V], list[T], tuple[T, ...])."""
    if hint is Any:
        return True
    if hint is None or hint is types.NoneType:
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, h) for h in args)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(_conforms(v, h) for v, h in zip(value, args))
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else str(hint)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


# ---------------------------------------------------------------- objects the commands hold
@dataclass(frozen=True)
class _Kind:
    """How an object goes in a command's JSON: its tag, its defining fields with their types
    (read as attributes), those it may lack, and how to build it from them."""

    tag: str
    hints: dict[str, Any]
    optional: frozenset[str]
    build: Callable[..., Any]


def _user(name: str, password_hash: str, algorithm: str, tags: list, limits: dict) -> User:
    if algorithm not in _HASHINGS:
        raise CommandError(f"unknown password hashing algorithm {algorithm!r}")
    return User(name, password_hash, tags, algorithm, limits)


def _policy(vhost: str, name: str, pattern: str, definition: dict, priority, apply_to: str) -> Policy:
    if apply_to not in APPLY_TO:
        raise CommandError(f"policy apply-to {apply_to!r} is not one of {', '.join(APPLY_TO)}")
    try:
        return Policy(vhost, name, pattern, definition, priority, apply_to)
    except re.error as err:
        raise CommandError(f"policy pattern {pattern!r} is not a regular expression: {err}") from None


def _shovel(**fields) -> ShovelConfig:
    config = ShovelConfig(**fields)
    if config.static:
        raise CommandError("a static shovel is defined by its node's config file, not by a command")
    return config


_KINDS: dict[type, _Kind] = {
    User: _Kind("$user", {"name": str, "password_hash": str, "algorithm": str, "tags": list[str],
                          "limits": dict[str, int]}, frozenset(), _user),
    Policy: _Kind("$policy", {"vhost": str, "name": str, "pattern": str, "definition": dict,
                              "priority": int | float, "apply_to": str}, frozenset(), _policy),
    ShovelConfig: _Kind("$shovel", _hints(ShovelConfig), _optional(ShovelConfig), _shovel),
    # A queue's owner on any node: what identifies it (node, id), and the link the API shows.
    ExclusiveOwner: _Kind("$owner", typing.get_type_hints(ExclusiveOwner), frozenset(), ExclusiveOwner),
    ConnectionLink: _Kind("$link", typing.get_type_hints(ConnectionLink), frozenset(), ConnectionLink),
}


def _encode_object(value: Any) -> dict:
    kind = _KINDS[type(value)]
    if isinstance(value, ShovelConfig) and value.static:
        raise TypeError("a static shovel is defined by its node's config file, not by a command")
    return {kind.tag: _fields_of(value, kind.hints, kind.tag[1:])}


def _object_decoder(kind: _Kind) -> Callable[[Any], Any]:
    def decode_object(payload):
        return kind.build(**_fields_from(payload, kind.hints, kind.optional, kind.tag[1:]))
    return decode_object


# ---------------------------------------------------------------- values
def _encode(value: Any) -> Any:
    cls = type(value)
    if value is None or cls is str or cls is bool or cls is int:
        return value
    if cls is float:
        return value if math.isfinite(value) else {"$number": _bits(value)}
    if cls is list:
        return [_encode(v) for v in value]
    if cls is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"a dict key {_shown(key)} is not a string")
            out[key] = _encode(item)
        return {"$dict": out} if len(out) == 1 and next(iter(out)).startswith("$") else out
    if cls is tuple:
        return {"$tuple": [_encode(v) for v in value]}
    if value is KEEP:
        return {"$keep": None}
    name = _INT_TYPES.get(cls)
    if name is not None:
        return {"$" + name: int(value)}
    name = _FLOAT_TYPES.get(cls)
    if name is not None:
        return {"$" + name: float(value) if math.isfinite(value) else _bits(value)}
    if cls is bytes or cls is _LONGSTR:
        return {"$bytes" if cls is bytes else "$longstr": base64.b64encode(value).decode("ascii")}
    if cls is decimal.Decimal:
        return {"$decimal": str(value)}
    if cls is datetime.datetime:
        return {"$datetime": _iso(value)}
    if cls in _KINDS:
        return _encode_object(value)
    if COMMANDS.get(cls.__name__) is cls:
        return {"$command": _entry(value)}
    raise TypeError(f"a metadata command cannot hold {_shown(value)}")


def _iso(value: datetime.datetime) -> str:
    """A naive datetime, or one at a fixed offset of whole seconds (a 'T' decodes in UTC),
    as fromisoformat reads it back exactly."""
    zone = value.tzinfo
    if zone is not None:
        offset = zone.utcoffset(None)
        if type(zone) is not datetime.timezone or offset is None or offset.microseconds \
                or zone.tzname(None) != datetime.timezone(offset).tzname(None):
            raise TypeError(f"a metadata command cannot hold a datetime in {zone!r} (only a fixed offset "
                            "of whole seconds)")
    return value.isoformat()


def _bits(value: float) -> str:
    return _BITS.pack(value).hex()


def _decode(value: Any) -> Any:
    cls = type(value)
    if cls is list:
        return [_decode(v) for v in value]
    if cls is not dict:
        return value  # null, a boolean, a string or a number
    if len(value) == 1:
        ((key, payload),) = value.items()
        if key.startswith("$"):
            decoder = _TAGS.get(key)
            if decoder is None:
                raise CommandError(f"unknown tag {key!r}")
            return decoder(payload)
    return {k: _decode(v) for k, v in value.items()}


def _int_decoder(name: str) -> Callable[[Any], int]:
    low, high = _INT_RANGES[name]

    def decode_int(payload):
        if type(payload) is not int or not low <= payload < high:
            raise CommandError(f"${name} holds {_shown(payload)}, not an integer in [{low}, {high})")
        return typed_int(name, payload)
    return decode_int


def _float_of(tag: str, payload: Any) -> float:
    """A number, or the hex bits of one that is not finite."""
    if type(payload) is float or type(payload) is int:
        return float(payload)
    if type(payload) is str and len(payload) == 16:
        try:
            return _BITS.unpack(bytes.fromhex(payload))[0]
        except ValueError:
            pass
    raise CommandError(f"{tag} holds {_shown(payload)}, not a number or the 16 hex digits of one")


def _float32(payload: Any) -> float:
    value = _float_of("$float", payload)
    try:
        exact = not math.isfinite(value) or _F32.unpack(_F32.pack(value))[0] == value
    except OverflowError:
        exact = False
    if not exact:
        raise CommandError(f"$float holds {value!r}, which a 32-bit float cannot")
    return typed_float("float", value)


def _base64(tag: str, payload: Any) -> bytes:
    if type(payload) is str:
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            pass
    raise CommandError(f"{tag} holds {_shown(payload)}, not base64")


def _decimal(payload: Any) -> decimal.Decimal:
    if type(payload) is str:
        try:
            return decimal.Decimal(payload)
        except decimal.InvalidOperation:
            pass
    raise CommandError(f"$decimal holds {_shown(payload)}, not a decimal number")


def _datetime(payload: Any) -> datetime.datetime:
    if type(payload) is str:
        try:
            return datetime.datetime.fromisoformat(payload)
        except ValueError:
            pass
    raise CommandError(f"$datetime holds {_shown(payload)}, not an ISO 8601 date and time")


def _container(tag: str, kind: type, payload: Any) -> Any:
    if type(payload) is not kind:
        raise CommandError(f"{tag} holds {_shown(payload)}, not a JSON {'array' if kind is list else 'object'}")
    return payload


def _keep(payload: Any) -> Any:
    if payload is not None:
        raise CommandError(f"$keep holds {_shown(payload)}, not null")
    return KEEP


_TAGS: dict[str, Callable[[Any], Any]] = {
    **{"$" + name: _int_decoder(name) for name in _INT_RANGES},
    "$float": _float32,
    "$double": lambda p: typed_float("double", _float_of("$double", p)),
    "$number": lambda p: _float_of("$number", p),
    "$bytes": lambda p: _base64("$bytes", p),
    "$longstr": lambda p: longstr_bytes(_base64("$longstr", p)),
    "$decimal": _decimal,
    "$datetime": _datetime,
    "$tuple": lambda p: tuple(_decode(v) for v in _container("$tuple", list, p)),
    "$dict": lambda p: {k: _decode(v) for k, v in _container("$dict", dict, p).items()},
    "$keep": _keep,
    "$command": _command,
    **{kind.tag: _object_decoder(kind) for kind in _KINDS.values()},
}
