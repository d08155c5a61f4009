"""Consistent-hash exchange (`x-consistent-hash`), as RabbitMQ 3.10's plugin routes.

Each message goes to at most one destination. A binding's key is its weight: that many
consecutive buckets of a ring, in the order destinations were bound. The message's routing key
(or the header named by the `hash-header` argument, or the property named by `hash-property`)
is hashed with erlang:phash2 and a bucket chosen by jump consistent hashing over the ring's
size, drawing from Erlang's `exs1024` generator seeded with the hash, exactly as
rabbit_exchange_type_consistent_hash does: the same bindings made in the same order send a
key to the same queue on Warren and on RabbitMQ.

The plugin's ring quirks are kept, since they decide where messages go: a destination holds
buckets for its first binding only (a second binding to it, with another weight, changes
nothing), and removing any of its bindings takes all its buckets away; buckets after the
removed ones move down.
"""

import bisect
import datetime
import decimal
import re

from ...amqp.codec import table_type_name
from ...amqp.erlang import erl_binary
from ..erlhash import Atom, phash2
from ..errors import AMQPError, precondition_failed
from .base import Binding, Exchange

# The properties hash-property may name (the plugin's ?PROPERTIES).
PROPERTIES = ("correlation_id", "message_id", "timestamp")

# list_to_integer's syntax: an optional sign and ASCII digits, nothing else.
_INTEGER = re.compile(r"[+-]?[0-9]+")

_M64 = (1 << 64) - 1
_M21 = (1 << 21) - 1
_TWO_POW_64 = 18446744073709551616.0


class ConsistentHashExchange(Exchange):
    type_name = "x-consistent-hash"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # RabbitMQ's validate/1, run when the exchange is created (not on redeclare).
        self._hash_on = _hash_on(self.arguments)
        self._index_clear()

    def _index_clear(self) -> None:
        # destination -> weight, in ring order (dicts keep insertion order; a removal leaves
        # the others in place, which is the plugin's "buckets further on move down").
        self._ring: dict = {}
        # Built on the first route after a change, so a binding change stays O(1):
        # the first bucket of each destination, and the destinations, in ring order.
        self._starts: list[int] | None = None
        self._dests: list = []
        self._size = 0

    def validate_binding(self, routing_key, arguments):
        # rabbit_exchange_type_consistent_hash:validate_binding/2 (406 from the channel).
        if not _INTEGER.fullmatch(routing_key):
            raw = routing_key.encode("utf-8", "surrogateescape")
            prefix = "The binding key must be an integer: "
            raise precondition_failed(
                prefix + erl_binary(raw, len(prefix)).decode("utf-8", "surrogateescape"))
        if int(routing_key) < 1:
            raise precondition_failed("The binding key must be greater than 0")

    def _index_add(self, binding: Binding) -> None:
        if binding.destination not in self._ring:
            self._ring[binding.destination] = int(binding.routing_key)
            self._starts = None

    def _index_remove(self, binding: Binding) -> None:
        if self._ring.pop(binding.destination, None) is not None:
            self._starts = None

    def _build(self) -> list[int]:
        starts, total = [], 0
        for weight in self._ring.values():
            starts.append(total)
            total += weight
        self._starts, self._dests, self._size = starts, list(self._ring), total
        return starts

    def match(self, routing_key, message):
        starts = self._starts
        if starts is None:
            starts = self._build()
        if not starts:
            return ()
        if len(starts) == 1:
            return (self._dests[0],)
        bucket = jump_consistent_hash(self._hash_key(routing_key, message), self._size)
        return (self._dests[bisect.bisect_right(starts, bucket) - 1],)

    def _hash_key(self, routing_key: str, message) -> int:
        """phash2 of the term the plugin hashes (value_to_hash/2)."""
        kind, name = self._hash_on
        if kind == "routing_key":
            return _hash_bytes(routing_key.encode("utf-8", "surrogateescape"))
        if kind == "header":
            headers = message.headers
            if not headers or name not in headers:
                return _UNDEFINED
            return phash2(erl_field(headers[name]))
        value = message.properties.get(name)
        if value is None:
            return _UNDEFINED
        if name == "timestamp":
            return _hash_bytes(str(value).encode())  # integer_to_binary(Timestamp)
        return _hash_bytes(value.encode("utf-8", "surrogateescape"))


def _hash_on(arguments: dict) -> tuple[str, str]:
    """("routing_key" | "header" | "property", name) from the exchange's arguments, refused
    with RabbitMQ's texts."""
    header = arguments.get("hash-header")
    prop = arguments.get("hash-property")
    for arg, value in (("hash-header", header), ("hash-property", prop)):
        if value is not None and table_type_name(value) != "longstr":
            raise _ChannelCrash(f"{arg} of type {table_type_name(value)}, not longstr")
    if header is not None and prop is not None:
        raise precondition_failed("hash-header and hash-property are mutually exclusive")
    if prop is not None:
        name = _text(prop)
        if name not in PROPERTIES:
            raise precondition_failed(f"Unsupported property: {name}")
        return ("property", name)
    if header is not None:
        return ("header", _text(header))
    return ("routing_key", "")


class _ChannelCrash(AMQPError):
    """The plugin's validate/1 only matches longstr arguments: another type crashes the
    channel process, and RabbitMQ's reader closes the connection with a bare 541
    INTERNAL_ERROR (connection.close naming no method). `text` says why, for the log."""

    def __init__(self, text: str) -> None:
        super().__init__(541, text, (0, 0))

    @property
    def reply_text(self) -> str:
        return "INTERNAL_ERROR"


def _text(value) -> str:
    # A longstr that is not UTF-8 arrives as bytes; names read off the wire keep such bytes
    # as lone surrogates, so the same form finds a header.
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "surrogateescape")


_UNDEFINED = phash2(None)  # phash2('undefined'): every message without the header/property
# phash2 of recently seen keys and ids (publishers repeat them). Bounded; cleared when full.
_RK_CACHE: dict[bytes, int] = {}
_RK_CACHE_MAX = 4096


def _hash_bytes(raw: bytes) -> int:
    k = _RK_CACHE.get(raw)
    if k is None:
        if len(_RK_CACHE) >= _RK_CACHE_MAX:
            _RK_CACHE.clear()
        k = _RK_CACHE[raw] = phash2(raw)
    return k


def erl_field(value) -> tuple:
    """A decoded header value as rabbit_misc:table_lookup/2 gives it: {Type, Value} with
    RabbitMQ's parser's types and values ('L' is read as a signed long, a decimal's digits
    as unsigned, a table as [{Key, Type, Value}], an array as [{Type, Value}])."""
    kind = table_type_name(value)
    return (Atom("long" if kind == "unsignedlong" else kind), _erl_value(kind, value))


def _erl_value(kind: str, value):
    if kind == "bool":
        return bool(value)
    if kind in ("longstr", "binary"):
        return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    if kind == "unsignedlong":
        return value - (1 << 64) if value >= 1 << 63 else int(value)
    if kind == "timestamp":
        return int(value.timestamp()) if isinstance(value, datetime.datetime) else int(value)
    if kind == "decimal":
        assert isinstance(value, decimal.Decimal)
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0") * 10 ** max(0, exponent)
        return (max(0, -exponent), (-unscaled if sign else unscaled) & 0xFFFFFFFF)
    if kind == "void":
        return None
    if kind == "table":
        return [(k.encode("utf-8", "surrogateescape"),) + erl_field(v) for k, v in value.items()]
    if kind == "array":
        return [erl_field(v) for v in value]
    if kind in ("float", "double"):
        return float(value)
    return int(value)


# ---------------------------------------------------------------- jump consistent hashing
# (hash, buckets) -> bucket: a key's bucket depends on nothing else, so entries stay right
# whatever the bindings do. Bounded; cleared when full.
_BUCKETS: dict[tuple[int, int], int] = {}
_BUCKETS_MAX = 4096


def jump_consistent_hash(key: int, buckets: int) -> int:
    """The plugin's jump_consistent_hash/2: Lamping and Veach's jump hash, drawing its
    uniform floats from rand:seed_s(exs1024, {Key, Key, Key}) as OTP 25 does."""
    if buckets == 1:
        return 0
    found = _BUCKETS.get((key, buckets))
    if found is not None:
        return found
    # exs1024's state is a list read from its head, refilled from the words already used
    # when one is left: the same walk as xorshift1024*'s ring of 16 words with an index.
    s = _exs1024_seed(key)
    p = 0
    b, j = -1, 0
    while j < buckets:
        b = j
        s0 = s[p]
        p = (p + 1) & 15
        s1 = s[p]
        s1 ^= (s1 << 31) & _M64
        s1 ^= s1 >> 11
        s[p] = ns1 = s0 ^ (s0 >> 30) ^ s1
        r = float((ns1 * 1181783497276652981) & _M64) / _TWO_POW_64  # uniform_s: V / (Max + 1)
        if r == 0.0:  # RabbitMQ's route would crash (badarith); keep the current bucket
            break
        j = int((b + 1) / r)
    if len(_BUCKETS) >= _BUCKETS_MAX:
        _BUCKETS.clear()
    _BUCKETS[(key, buckets)] = b
    return b


def _exs1024_seed(a: int) -> list[int]:
    """exs1024_seed({A, A, A}): 16 words of xorshift64* from a 64-bit seed, newest first."""
    b1 = (((a & _M21) + 1) * 2097131) & _M21
    b2 = (((a & _M21) + 1) * 2097133) & _M21
    b3 = (((a & _M21) + 1) * 2097143) & _M21
    r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
    words = []
    for _ in range(16):
        r ^= r >> 12
        r ^= (r << 25) & _M64
        r ^= r >> 27
        words.append((r * 2685821657736338717) & _M64)
    words.reverse()
    return words
