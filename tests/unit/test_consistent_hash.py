"""The consistent-hash exchange's model: the hash and bucket choice against values computed by
Erlang/OTP 25 with the plugin's own jump_consistent_hash/2 (rand:seed_s(exs1024, {K,K,K})
and erlang:phash2), the ring's bookkeeping and RabbitMQ's validation texts."""

import datetime
import decimal

import pytest

from warren.amqp import codec
from warren.broker.erlhash import Atom, phash2
from warren.broker.errors import AMQPError
from warren.broker.exchanges.consistent_hash import erl_field, jump_consistent_hash
from warren.broker.vhost import VHost

BUCKETS = [2, 3, 5, 7, 10, 100, 1000000, 1000000000, 1 << 40]

# term -> its bucket for each of BUCKETS, from
#   jump(K, N) -> S = rand:seed_s(exs1024, {K,K,K}), ... (the plugin's code), K = phash2(Term)
# run by escript on OTP 25.2.3. 2^40 buckets take ~28 draws: the generator's state list is
# refilled on the way (exs1024_next's second clause).
ERLANG = [
    (b"k0", [1, 1, 1, 1, 7, 7, 490323, 443466460, 689870249357]),
    (b"k1", [0, 0, 3, 6, 7, 83, 151141, 24199139, 580922780813]),
    (b"k2", [1, 1, 1, 5, 5, 5, 204667, 243251396, 279742943333]),
    (b"k3", [1, 1, 1, 1, 9, 91, 314509, 704083766, 735369322958]),
    (b"k4", [0, 2, 2, 2, 2, 2, 435511, 180970928, 211601042073]),
    (None, [1, 1, 1, 1, 1, 39, 242831, 1483566, 939811137364]),
    ((Atom("longstr"), b"abc"), [0, 0, 4, 6, 8, 54, 111511, 5550253, 650959045376]),
    ((Atom("signedint"), 5), [1, 1, 4, 4, 7, 7, 134418, 593214315, 211590966739]),
    ((Atom("long"), -3), [1, 1, 3, 5, 5, 38, 562400, 464229894, 916295349570]),
    ((Atom("double"), 1.5), [1, 1, 1, 5, 9, 79, 644876, 329947224, 925975590248]),
    ((Atom("bool"), True), [0, 0, 4, 4, 4, 4, 174094, 221595957, 164404690135]),
    ((Atom("void"), None), [0, 0, 0, 0, 0, 41, 110631, 432937907, 1092158078412]),
    ((Atom("timestamp"), 1700000000), [1, 1, 3, 3, 3, 57, 244246, 915920008, 437322386841]),
    ((Atom("decimal"), (2, 12345)), [1, 1, 1, 6, 6, 67, 895068, 706059829, 410463020168]),
    ((Atom("table"), [(b"a", Atom("longstr"), b"b"), (b"n", Atom("signedint"), 1)]),
     [0, 0, 4, 6, 9, 32, 545314, 904213047, 814399329868]),
    ((Atom("array"), [(Atom("longstr"), b"x"), (Atom("long"), 7)]),
     [0, 0, 4, 4, 4, 57, 478834, 718923372, 112215341944]),
    ((Atom("float"), 0.5), [1, 1, 4, 4, 4, 65, 787241, 368384753, 717088686798]),
    ((Atom("binary"), b"\x01\x02\x03"), [1, 1, 1, 5, 8, 90, 799210, 675194414, 599518604192]),
    (b"1700000000", [1, 1, 1, 5, 5, 45, 310542, 245628354, 356900455646]),
    (b"", [0, 0, 0, 6, 9, 45, 792163, 429670698, 584470236581]),
]


@pytest.mark.parametrize("term,expected", ERLANG)
def test_bucket_is_erlangs(term, expected):
    assert [jump_consistent_hash(phash2(term), n) for n in BUCKETS] == expected
    assert jump_consistent_hash(phash2(term), 1) == 0


@pytest.mark.parametrize("value,term", [
    ("abc", (Atom("longstr"), b"abc")),
    (codec._LongstrBytes(b"\xff"), (Atom("longstr"), b"\xff")),
    (b"\x01\x02\x03", (Atom("binary"), b"\x01\x02\x03")),
    (codec._signedint(5), (Atom("signedint"), 5)),
    (codec._long(-3), (Atom("long"), -3)),
    (codec._unsignedlong(2**64 - 1), (Atom("long"), -1)),  # RabbitMQ reads 'L' as signed
    (codec._double(1.5), (Atom("double"), 1.5)),
    (codec._float(0.5), (Atom("float"), 0.5)),
    (True, (Atom("bool"), True)),
    (None, (Atom("void"), None)),
    (datetime.datetime.fromtimestamp(1700000000, datetime.timezone.utc), (Atom("timestamp"), 1700000000)),
    (codec._timestamp(2**63), (Atom("timestamp"), 2**63)),
    (decimal.Decimal("123.45"), (Atom("decimal"), (2, 12345))),
    (decimal.Decimal("-0.01"), (Atom("decimal"), (2, 2**32 - 1))),  # its digits are read unsigned
    ({"a": "b", "n": codec._signedint(1)},
     (Atom("table"), [(b"a", Atom("longstr"), b"b"), (b"n", Atom("signedint"), 1)])),
    (["x", codec._long(7)], (Atom("array"), [(Atom("longstr"), b"x"), (Atom("long"), 7)])),
])
def test_header_values_as_rabbitmq_holds_them(value, term):
    assert erl_field(value) == term


class Probe:
    """What the exchange reads of a message."""

    def __init__(self, headers=None, **properties):
        self.headers = headers
        self.properties = dict(properties)
        if headers is not None:
            self.properties["headers"] = headers


def setup(arguments=None, weights=()):
    vhost = VHost("/")
    x, _ = vhost.declare_exchange("chx", "x-consistent-hash", arguments=arguments or {})
    qs = {}
    for name, weight in weights:
        qs[name] = vhost.declare_queue(name)[0]
        vhost.bind(x, qs[name], weight, {})
    return vhost, x, qs


def where(x, key, message=None):
    dests = x.match(key, message or Probe())
    assert len(dests) <= 1
    return dests[0].name if dests else None


def bucket_owner(ring, bucket):
    """The destination holding `bucket` on a ring given as [(name, weight)] in order."""
    for name, weight in ring:
        if bucket < weight:
            return name
        bucket -= weight
    raise AssertionError


def test_ring_order_weights_and_removal():
    vhost, x, qs = setup(weights=[("a", "1"), ("b", "2"), ("c", "3"), ("d", "1")])
    keys = [f"k{i}" for i in range(300)]

    def expected(ring):
        total = sum(w for _, w in ring)
        return [bucket_owner(ring, jump_consistent_hash(phash2(k.encode()), total)) for k in keys]

    assert [where(x, k) for k in keys] == expected([("a", 1), ("b", 2), ("c", 3), ("d", 1)])
    vhost.unbind(x, qs["b"], "2", {})
    assert [where(x, k) for k in keys] == expected([("a", 1), ("c", 3), ("d", 1)])
    vhost.bind(x, qs["b"], "2", {})
    assert [where(x, k) for k in keys] == expected([("a", 1), ("c", 3), ("d", 1), ("b", 2)])
    # A second binding to a bound queue does not change the ring; removing it removes a.
    vhost.bind(x, qs["a"], "7", {"other": "args"})
    assert [where(x, k) for k in keys] == expected([("a", 1), ("c", 3), ("d", 1), ("b", 2)])
    vhost.unbind(x, qs["a"], "7", {"other": "args"})
    assert [where(x, k) for k in keys] == expected([("c", 3), ("d", 1), ("b", 2)])
    assert len(x.bindings) == 4  # a's first binding is still listed, as in RabbitMQ


def test_huge_weights_need_no_memory_per_bucket():
    _, x, _ = setup(weights=[("a", "1"), ("b", "99999999999999999999")])
    assert {where(x, f"k{i}") for i in range(50)} == {"b"}
    assert x._size == 10**20


def test_no_bindings_routes_nowhere():
    vhost, x, qs = setup(weights=[("a", "1")])
    assert where(x, "k") == "a"
    vhost.unbind(x, qs["a"], "1", {})
    assert where(x, "k") is None


def test_hash_header_and_property():
    _, x, _ = setup({"hash-header": "h"}, [("a", "1"), ("b", "1"), ("c", "1")])
    for value in ["v1", "v2", codec._long(5), {"t": 1}]:
        bucket = jump_consistent_hash(phash2(erl_field(value)), 3)
        assert where(x, "ignored", Probe({"h": value})) == "abc"[bucket]
    undefined = "abc"[jump_consistent_hash(phash2(None), 3)]
    assert where(x, "k", Probe()) == where(x, "k", Probe({})) == where(x, "k", Probe({"g": 1})) == undefined
    _, x, _ = setup({"hash-property": "timestamp"}, [("a", "1"), ("b", "1"), ("c", "1")])
    assert where(x, "k", Probe(timestamp=1700000000)) == "abc"[jump_consistent_hash(phash2(b"1700000000"), 3)]
    assert where(x, "k", Probe()) == undefined
    _, x, _ = setup({"hash-property": "message_id"}, [("a", "1"), ("b", "1"), ("c", "1")])
    assert where(x, "k", Probe(message_id="m\udcff")) == "abc"[jump_consistent_hash(phash2(b"m\xff"), 3)]


@pytest.mark.parametrize("key,text", [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", "The binding key must be an integer: <<>>"),
    ("1e3", 'The binding key must be an integer: <<"1e3">>'),
    ("5\n", 'The binding key must be an integer: <<"5\\n">>'),
    ("0", "The binding key must be greater than 0"),
    ("-7", "The binding key must be greater than 0"),
])
def test_binding_key_errors(key, text):
    vhost, x, _ = setup()
    q, _ = vhost.declare_queue("q")
    with pytest.raises(AMQPError) as err:
        vhost.bind(x, q, key, {})
    assert (err.value.code, err.value.text) == (406, text)
    assert not x.bindings


@pytest.mark.parametrize("arguments,code,reply_text", [
    ({"hash-property": "user_id"}, 406, "PRECONDITION_FAILED - Unsupported property: user_id"),
    ({"hash-header": "h", "hash-property": "timestamp"}, 406,
     "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
    ({"hash-header": codec._signedint(1)}, 541, "INTERNAL_ERROR"),
    ({"hash-property": b"message_id"}, 541, "INTERNAL_ERROR"),
])
def test_argument_errors(arguments, code, reply_text):
    vhost = VHost("/")
    with pytest.raises(AMQPError) as err:
        vhost.declare_exchange("chx", "x-consistent-hash", arguments=arguments)
    assert (err.value.code, err.value.reply_text) == (code, reply_text)
    assert "chx" not in vhost.exchanges
