"""erlang:phash2 as Warren computes it for binding properties keys, against values from
Erlang/OTP 25 (erl -eval 'erlang:phash2(T, 1 bsl 32)') and keys from RabbitMQ 3.10.8."""

import pytest

from warren.amqp import codec
from warren.broker.erlhash import Atom, phash2
from warren.mgmt.resources import properties_key, unpack_properties_key

# (term, phash2(term, 2^32) as Erlang computes it)
KNOWN = [
    ([], 3468870702), ((), 221703996), (Atom("long"), 472647), (True, 506293),
    (0, 3175731469), (1, 539485162), (-1, 1117813597), (255, 715823293), (256, 3929335767),
    (2**27 - 1, 4273352567), (2**27, 2562491755), (-2**27, 874979335), (-2**27 - 1, 1418916782),
    (2**32, 2108323275), (2**59, 2442888721), (2**60, 1373980788), (2**64 + 5, 3215545257),
    (-2**70, 4181281985), (10**23, 2358680902),
    (1.5, 2023646235), (-0.0, 423528920), (0.0, 423528920), (1e300, 387524106), (-2.25, 2254282282),
    (b"", 147926629), (b"a", 1589197455), (b"abcdefghijk", 96993671), (b"abcdefghijkl", 686521495),
    (b"abcdefghijklm", 3501102500), (b"x" * 100, 4292302462),
    ([1, 2, 3], 4186538188), ([1, 2, 3, 4, 5], 3824152778), ([300, 1], 3636192855),
    ([(b"k", Atom("long"), 1)], 211790777), ([1, (2,)], 3050523412), ([[], []], 67164138),
    ([b"a", [b"b"]], 1811932030),
]


@pytest.mark.parametrize("term,expected", KNOWN)
def test_phash2_matches_erlang(term, expected):
    assert phash2(term) == expected


@pytest.mark.parametrize("routing_key,args,key", [
    ("k1", {}, "k1"),
    ("", {}, "~"),
    ("k2", {"a": codec._long(1)}, "k2~Ajat_Q"),
    ("", {"x": 1}, "~9nmLZQ"),  # plain ints (from definitions JSON) count as long, as RabbitMQ reads them
    ("k", {"b": True, "big": 123456789012, "f": 1.5, "l": [1, "x"], "neg": -5, "s": "str", "t": {"n": 1}},
     "k~z3HqDA"),
    ("k", {"big": 12345678901234567890123}, "k~zzhO9A"),
    ("k", {"b": False, "e": "", "z": -0.0}, "k~bTRWng"),
    ("a.#", {"k": "v"}, "a.%23~8IXMRA"),
    ("a b/c~d_e.f*+é%", {}, "a+b%2Fc%7Ed_e.f%2A%2B%C3%A9%25"),
])
def test_properties_keys_are_rabbitmqs(routing_key, args, key):
    assert properties_key(routing_key, args) == key
    unpacked = unpack_properties_key(key)
    assert unpacked[0] == routing_key
    assert (unpacked[1] is None) == (not args)


def test_unpack_properties_key_tokenises_as_rabbitmq():
    assert unpack_properties_key("k~") == ("k", None)
    assert unpack_properties_key("~~") == ("", "")
    assert unpack_properties_key("") is None
    assert unpack_properties_key("a~b~c") is None
