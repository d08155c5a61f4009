"""The consistent-hash exchange (`x-consistent-hash`), as RabbitMQ 3.10.8's
rabbitmq_consistent_hash_exchange plugin routes and validates.

The expected placements (which queue each message lands in) were recorded on RabbitMQ 3.10.8
with the plugin enabled, publishing with pika: Warren must send every key to the same queue.
One letter per message, in publishing order; "-" would mean "not routed".

Against a RabbitMQ without the plugin (CI's stage 2 runs none) the tests skip themselves:
there the type is unknown (503).
"""

import datetime
import decimal
import json
import os
from collections import Counter
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, Returns, channel_error, connection_error

CHX = "x-consistent-hash"
MGMT = os.environ.get("WARREN_TEST_MGMT")

# Routing keys published in the placement tests.
KEYS = [f"k{i}" for i in range(200)] + ["", "é", "a.b.c", "x" * 255]

# Bindings a:1, b:2, c:3, d:1, in that order.
RING_ABCD = ("bdcbbcbcdbccbbbaacabcccbcadccbbcbdcbdcbacbbadbcccbbbdcabcbcbdcbbcabbcdccccbcccbdbdcbddcdca"
             "adccbcdaccddcabaccacacdcacbcbbbcccdccabcabbcacadccccdcbdbcccdbacbccccacbcbbcbabdbcbbbdbbbcc"
             "acbbdacbbccbaccaccbdbbc")
# The same after b is unbound: c and d move down the ring.
RING_ACD = ("cccccdccccddcccaaaacdcdccaccdccccdccadcacccaccccdcccdcacccdccdcccaccdcdccdcccacdcccccccadaa"
            "ccccddacaddaacaddacacadaccdccccccaddaccaccdacaccccdccccccddacadccdddacccccdcacccdcccccccccac"
            "cccacccdccaccadccaccd")
# b bound again (weight 2): its buckets are now at the end of the ring.
RING_ACDB = ("cbbccdccbcddcccaabacdcdccabcdccccbbcbbcabccabcbbdcccbbacbcdcbbccbaccdbdccbcbbbcbcbbcbbcbbaa"
             "bbbcdbacbbbbacaddabacbdaccdcccbcbbbbaccaccdababccbbbbcbcbddbcadccdddabccccdcacbcdcccbcccbca"
             "cccbacccdccabcadccbccd")
# From RING_ACDB, a's second binding (weight 5) was unbound: a lost all its buckets.
RING_CDB = ("cdbccbcdbcbbcccccbccbdbcdcbdbccdcbbccbccbcccccbbbcccbbccbcbcbbccbcccbcbddbcbbbcbccbcdcdcbc"
            "ccbbcbbcdbbbbcccbbcbcdcbcdcbcccbdbcbbccdcccbcbcdddbbdbcccbbbcccbcdbbbcbcdccbcccdcbcccdcccbd"
            "cdccccdccbdccbdcbdccccb")
# Then a was unbound and bound again (weight 1): at the end of the ring.
RING_CDBA = ("cabccbcdacbbcccccbccbdbcdcadbccdcabcabccbcccacbbbcccabccbcbcabccbcccbabddbcbbbcacabcaadabcc"
             "abbcbacdbaabcccbbcbcdabcdcbcccbdbabbccdcccbcbcaddbbabcacbbbaccbcdbbbcbcdccbcccacbcccacccbd"
             "cdccacdccbdccbdcbdcaccb")
# Exchanges f and g (fanouts to queues f and g) then queue a, weight 1 each.
RING_FGA = ("gfggaggfaaggaagffffggagggfafgaaaafaaffgfaggfgggggggagafagaaagggaafaggggafggagfgfgafafgffgff"
            "agagfafgffaffgfaffgfgffffaaggagfgfagfaafggffafgafaafaaagfaafgfagaaaaffaggagafggafagaaagaaa"
            "ffagafagafaafggfaaafgga")

# hash-header "h", bindings a:1 b:1 c:2 d:1 e:3; the headers of each message.
HEADER_VALUES = ([f"v{i}" for i in range(40)] + list(range(-5, 30))
                 + [2**40, True, False, None, b"bytes", {"n": 1, "s": "t"}, [1, "x"], decimal.Decimal("1.23"),
                    datetime.datetime(2023, 1, 1, tzinfo=datetime.timezone.utc), decimal.Decimal("-1.23"),
                    2**63 - 1, -2**63, "é€"])
HEADERS = [{"h": v} for v in HEADER_VALUES] + [None, {}, {"other": "v1"}]
RING_HEADER = "ccbeceeeeeaeaacecaececbeecdbcdeebceedeaceaaededebaecacedebcbcbaceeaaeeebbdecdcabaeebacbebbb"

# hash-property, bindings a:2 b:1 c:1 d:1 e:1: ids "id-0".."id-59" (timestamps 1700000000 + 7i),
# then a message without the property, then one with both ids "zz".
RING_ID = "adbaadadaebacabdbbdebbaaaeaececdabdbbedddaaaddebddbababdaeabac"
RING_TIMESTAMP = "eaeaebbaaabaaaaabbacadacaeeacbbabcaaaccaabceaacccceaceaeaabaaa"


@pytest.fixture(scope="module")
def consistent_hash_available(broker):
    """Skips the module on a RabbitMQ without the plugin; Warren must always have the type."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.exchange_declare("chx-probe", CHX, auto_delete=True)
        ch.exchange_delete("chx-probe")
    except pika.exceptions.ConnectionClosedByBroker as err:
        if EXTERNAL and err.reply_code == 503 and "unknown exchange type" in err.reply_text:
            pytest.skip("the broker under test lacks the rabbitmq_consistent_hash_exchange plugin")
        raise
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture(autouse=True)
def _needs_type(consistent_hash_available):
    pass


def queues(ch, names, labels) -> dict:
    """label -> a new durable-less queue named after the label."""
    made = {}
    for label in labels:
        made[label] = ch.queue_declare(names(f"chx-{label}")).method.queue
    return made


def placement(ch, qs: dict, count: int) -> str:
    """Which queue each of the `count` messages (bodies "0".."count-1") is in, one letter each;
    every message must be in exactly one queue."""
    where: dict = {}
    for label, q in qs.items():
        while True:
            method, _, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            assert body.decode() not in where, f"message {body!r} routed twice"
            where[body.decode()] = label
    return "".join(where.get(str(i), "-") for i in range(count))


def publish_keys(ch, x, keys=KEYS) -> None:
    for i, key in enumerate(keys):
        ch.basic_publish(x, key, str(i).encode())


def routed(ch, x, qs, keys=KEYS) -> str:
    publish_keys(ch, x, keys)
    return placement(ch, qs, len(keys))


def test_routing_key_placement_is_rabbitmqs(channel, names):
    x = names("chx-rk")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "abcd")
    for label, weight in zip("abcd", ["1", "2", "3", "1"]):
        channel.queue_bind(qs[label], x, weight)
    assert routed(channel, x, qs) == RING_ABCD
    # The same key goes to the same queue every time.
    assert routed(channel, x, qs) == RING_ABCD
    # Unbinding shifts the buckets after b down the ring.
    channel.queue_unbind(qs["b"], x, "2")
    assert routed(channel, x, qs) == RING_ACD
    channel.queue_bind(qs["b"], x, "2")
    assert routed(channel, x, qs) == RING_ACDB


def test_a_destination_counts_its_first_binding_only(channel, names):
    """The plugin's ring holds each destination once: a second binding to it changes nothing,
    and removing any of its bindings removes it from the ring, though others remain."""
    x = names("chx-first")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "abcd")
    for label, weight in zip("acdb", ["1", "3", "1", "2"]):  # the ring of RING_ACDB
        channel.queue_bind(qs[label], x, weight)
    assert routed(channel, x, qs) == RING_ACDB
    channel.queue_bind(qs["a"], x, "5")
    assert routed(channel, x, qs) == RING_ACDB
    channel.queue_unbind(qs["a"], x, "5")
    assert routed(channel, x, qs) == RING_CDB
    channel.queue_bind(qs["a"], x, "1")  # that binding exists: the ring is unchanged
    assert routed(channel, x, qs) == RING_CDB
    channel.queue_unbind(qs["a"], x, "1")
    channel.queue_bind(qs["a"], x, "1")
    assert routed(channel, x, qs) == RING_CDBA


def test_deleting_a_queue_takes_it_off_the_ring(channel, names):
    x = names("chx-qdel")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "abcd")
    for label, weight in zip("abcd", ["1", "2", "3", "1"]):
        channel.queue_bind(qs[label], x, weight)
    channel.queue_delete(qs.pop("b"))
    assert routed(channel, x, qs) == RING_ACD


def test_exchange_destinations(channel, names):
    x = names("chx-e2e")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "fga")
    for label in "fg":
        fan = names(f"chx-fan-{label}")
        channel.exchange_declare(fan, "fanout")
        channel.queue_bind(qs[label], fan)
        channel.exchange_bind(fan, x, "1")
    channel.queue_bind(qs["a"], x, "1")
    assert routed(channel, x, qs) == RING_FGA


def test_hash_header_placement_and_messages_without_it(channel, names):
    x = names("chx-header")
    channel.exchange_declare(x, CHX, arguments={"hash-header": "h"})
    qs = queues(channel, names, "abcde")
    for label, weight in zip("abcde", ["1", "1", "2", "1", "3"]):
        channel.queue_bind(qs[label], x, weight)
    for i, headers in enumerate(HEADERS):
        channel.basic_publish(x, "rk", str(i).encode(), pika.BasicProperties(headers=headers))
    got = placement(channel, qs, len(HEADERS))
    assert got == RING_HEADER
    # No headers, empty headers, another header: all hashed alike (as the atom 'undefined').
    assert len(set(got[-3:])) == 1


@pytest.mark.parametrize("prop", ["message_id", "correlation_id", "timestamp"])
def test_hash_property_placement(channel, names, prop):
    x = names(f"chx-{prop}")
    channel.exchange_declare(x, CHX, arguments={"hash-property": prop})
    qs = queues(channel, names, "abcde")
    for label, weight in zip("abcde", ["2", "1", "1", "1", "1"]):
        channel.queue_bind(qs[label], x, weight)
    for i in range(60):
        props = (pika.BasicProperties(timestamp=1700000000 + i * 7) if prop == "timestamp"
                 else pika.BasicProperties(**{prop: f"id-{i}"}))
        channel.basic_publish(x, "same", str(i).encode(), props)
    channel.basic_publish(x, "same", b"60", pika.BasicProperties())
    channel.basic_publish(x, "other", b"61", pika.BasicProperties(message_id="zz", correlation_id="zz"))
    assert placement(channel, qs, 62) == (RING_TIMESTAMP if prop == "timestamp" else RING_ID)


def test_weights_and_minimal_movement(channel, names):
    """Shares follow the weights, and a new binding only takes keys for itself (jump
    consistent hashing): about weight/total of them, none moved between the others."""
    x = names("chx-spread")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "abcde")
    weights = {"a": 1, "b": 2, "c": 3, "d": 2}
    for label, weight in weights.items():
        channel.queue_bind(qs[label], x, str(weight))
    keys = [f"user-{i}" for i in range(2000)]
    before = routed(channel, x, qs, keys)
    counts = Counter(before)
    for label, weight in weights.items():
        expected = len(keys) * weight / sum(weights.values())
        assert 0.8 * expected < counts[label] < 1.2 * expected, counts
    channel.queue_bind(qs["e"], x, "2")
    after = routed(channel, x, qs, keys)
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert {a for _, a in moved} == {"e"}
    assert 0.7 * len(keys) * 2 / 10 < len(moved) < 1.3 * len(keys) * 2 / 10


def test_nothing_bound_is_unroutable(connection, channel, names):
    x, ae = names("chx-empty"), names("chx-empty-ae")
    channel.exchange_declare(x, CHX, arguments={"alternate-exchange": ae})
    channel.exchange_declare(ae, "fanout")
    returns = Returns(connection, channel)
    channel.basic_publish(x, "k", b"lost", mandatory=True)  # the AE does not route either
    q = channel.queue_declare(names("chx-empty-q")).method.queue
    channel.queue_bind(q, ae)
    channel.basic_publish(x, "k", b"to-ae", mandatory=True)
    assert returns.brief(channel) == [(312, x, "k", b"lost")]
    assert channel.basic_get(q, auto_ack=True)[2] == b"to-ae"
    # Bound, yet off the ring (its second binding was removed): unroutable too.
    y = names("chx-off")
    channel.exchange_declare(y, CHX)
    channel.queue_bind(q, y, "1")
    channel.queue_bind(q, y, "2")
    channel.queue_unbind(q, y, "2")
    channel.basic_publish(y, "k", b"off", mandatory=True)
    assert returns.brief(channel) == [(312, y, "k", b"off")]


@pytest.mark.parametrize("key,text", [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", "The binding key must be an integer: <<>>"),
    (" 5", 'The binding key must be an integer: <<" 5">>'),
    ("1.5", 'The binding key must be an integer: <<"1.5">>'),
    ("1_0", 'The binding key must be an integer: <<"1_0">>'),
    ("٥", 'The binding key must be an integer: <<"٥">>'),
    ("é", 'The binding key must be an integer: <<"é">>'),
    ("€", "The binding key must be an integer: <<226,130,172>>"),
    ("\x01" * 40, "The binding key must be an integer: <<1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,\n"
                  + " " * 38 + "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1>>"),
    ("€" * 30, "The binding key must be an integer: <<226,130,172,226,130,172,226,130,172,226,\n"
               + " " * 38 + "130,172,226,130,172,226,130,172,226,130,\n"
               + " " * 38 + "172,226,130,172,226,130,172,226,13..."),
    ("0", "The binding key must be greater than 0"),
    ("-1", "The binding key must be greater than 0"),
    ("-0", "The binding key must be greater than 0"),
])
def test_binding_key_must_be_a_positive_integer(connection, names, key, text):
    ch = connection.channel()
    x = names("chx-bad-key")
    ch.exchange_declare(x, CHX)
    q = ch.queue_declare(names("chx-bad-key-q")).method.queue
    channel_error(lambda: ch.queue_bind(q, x, key), 406, f"PRECONDITION_FAILED - {text}")


def test_binding_key_forms_list_to_integer_takes(channel, names):
    x = names("chx-forms")
    channel.exchange_declare(x, CHX)
    qs = queues(channel, names, "abc")
    for label, key in zip("abc", ["+1", "002", "1"]):  # weights 1, 2, 1
        channel.queue_bind(qs[label], x, key)
    got = Counter(routed(channel, x, qs, [f"k{i}" for i in range(400)]))
    assert 70 < got["a"] < 130 and 160 < got["b"] < 240 and 70 < got["c"] < 130, got


@pytest.mark.parametrize("arguments,text", [
    ({"hash-property": "foo"}, "Unsupported property: foo"),
    ({"hash-property": "app_id"}, "Unsupported property: app_id"),
    ({"hash-header": "h", "hash-property": "message_id"}, "hash-header and hash-property are mutually exclusive"),
    ({"hash-header": "h", "hash-property": "bogus"}, "hash-header and hash-property are mutually exclusive"),
])
def test_hash_argument_errors(connection, names, arguments, text):
    ch = connection.channel()
    x = names("chx-bad-args")
    channel_error(lambda: ch.exchange_declare(x, CHX, arguments=arguments), 406, f"PRECONDITION_FAILED - {text}")
    ch = connection.channel()
    assert channel_error(lambda: ch.exchange_declare(x, passive=True))[0] == 404


@pytest.mark.parametrize("arguments", [{"hash-header": 5}, {"hash-header": b"h"}, {"hash-property": 5},
                                       {"hash-header": 5, "hash-property": "bogus"},
                                       {"hash-header": "h", "hash-property": 5}])
def test_hash_arguments_other_than_longstr_crash_the_channel(broker, names, arguments):
    """The plugin matches longstr values only: any other crashes its validate/1, and the
    reader closes the connection with a bare 541."""
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    x = names("chx-crash")
    connection_error(lambda: ch.exchange_declare(x, CHX, arguments=arguments), 541, "INTERNAL_ERROR")
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    assert channel_error(lambda: ch.exchange_declare(x, passive=True))[0] == 404
    conn.close()


def test_redeclare_compares_only_the_alternate_exchange(channel, names):
    x = names("chx-redeclare")
    channel.exchange_declare(x, CHX, arguments={"hash-header": "a"})
    channel.exchange_declare(x, CHX, arguments={"hash-property": "bogus"})
    channel.exchange_declare(x, CHX)
    q = channel.queue_declare(names("chx-redeclare-q")).method.queue
    channel.queue_bind(q, x, "1")
    channel.basic_publish(x, "k", b"m", pika.BasicProperties(headers={"a": "v"}))
    assert channel.basic_get(q, auto_ack=True)[2] == b"m"


def test_management_lists_type_and_exports_exchange(broker, channel, names):
    api = MGMT or (None if EXTERNAL else broker.api)
    if api is None:
        pytest.skip("needs the management API (WARREN_TEST_MGMT against RabbitMQ)")
    auth = ("guest", "guest")
    types = requests.get(f"{api}/overview", auth=auth, timeout=10).json()["exchange_types"]
    assert {"name": CHX, "description": "Consistent Hashing Exchange", "enabled": True} in types
    x, q = names("chx-mgmt"), names("chx-mgmt-q")
    channel.exchange_declare(x, CHX, durable=True, arguments={"hash-header": "h"})
    channel.queue_declare(q, durable=True)
    channel.queue_bind(q, x, "3")
    defs = requests.get(f"{api}/definitions", auth=auth, timeout=10).json()
    assert [e for e in defs["exchanges"] if e["name"] == x] == [
        {"name": x, "vhost": "/", "type": CHX, "durable": True, "auto_delete": False, "internal": False,
         "arguments": {"hash-header": "h"}}]
    assert [b for b in defs["bindings"] if b["source"] == x] == [
        {"source": x, "vhost": "/", "destination": q, "destination_type": "queue", "routing_key": "3",
         "arguments": {}}]
    r = requests.put(f"{api}/exchanges/%2F/{quote(names('chx-mgmt-bad'))}", auth=auth, timeout=10,
                     json={"type": CHX, "arguments": {"hash-property": "nope"}})
    assert (r.status_code, r.json()) == (400, {"error": "bad_request", "reason": "Unsupported property: nope"})
    r = requests.post(f"{api}/bindings/%2F/e/{quote(x)}/q/{quote(q)}", auth=auth, timeout=10,
                      json={"routing_key": "abc"})
    assert (r.status_code, r.json()) == (
        400, {"error": "bad_request", "reason": 'The binding key must be an integer: <<"abc">>'})


def test_definitions_import_routes_as_before(make_broker):
    """Warren only: an export loaded into a new broker (--definitions) routes every key to the
    same queue (bindings are imported in the export's order, the order they were made)."""
    first = make_broker()
    conn = pika.BlockingConnection(first.pika_params())
    ch = conn.channel()
    ch.exchange_declare("chx-def", CHX, durable=True)
    qs = {label: ch.queue_declare(f"chx-def-{label}", durable=True).method.queue for label in "abcd"}
    for label, weight in zip("abcd", ["1", "2", "3", "1"]):
        ch.queue_bind(qs[label], "chx-def", weight)
    assert routed(ch, "chx-def", qs) == RING_ABCD
    conn.close()
    defs = requests.get(f"{first.api}/definitions", auth=("guest", "guest"), timeout=10).json()
    path = os.path.join(first.data_dir, "export.json")
    with open(path, "w") as f:
        json.dump(defs, f)
    second = make_broker("--definitions", path)
    conn = pika.BlockingConnection(second.pika_params())
    ch = conn.channel()
    assert routed(ch, "chx-def", qs) == RING_ABCD
    conn.close()


def test_restart_keeps_placement(make_broker, restart_broker):
    """Warren only: durable bindings come back in the order they were made, so every key goes
    where it went before (RabbitMQ rebuilds its ring in sorted binding order at boot, and
    its README warns that a key may move)."""
    first = make_broker()
    conn = pika.BlockingConnection(first.pika_params())
    ch = conn.channel()
    ch.exchange_declare("chx-restart", CHX, durable=True)
    qs = {label: ch.queue_declare(f"chx-restart-{label}", durable=True).method.queue for label in "abcd"}
    for label, weight in zip("dcba", ["1", "3", "2", "1"]):
        ch.queue_bind(qs[label], "chx-restart", weight)
    before = routed(ch, "chx-restart", qs)
    conn.close()
    second = restart_broker(first)
    conn = pika.BlockingConnection(second.pika_params())
    assert routed(conn.channel(), "chx-restart", qs) == before
    conn.close()
