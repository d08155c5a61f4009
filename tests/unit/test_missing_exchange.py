"""Warren's capture of publishes to missing exchanges (warren.broker.missing_exchange), in
the model: the setting's validation, the header it adds, and ops.route's use of it (the
wire, the API, the CLI and restarts: tests/integration/test_missing_exchange.py)."""

import pytest

from warren.amqp import reencode as rt
from warren.amqp.codec import shortstr
from warren.amqp.properties import FLAG_HEADERS, decode_properties, encode_header
from warren.broker import definitions, missing_exchange, ops, vhost as vhosts
from warren.broker.auth import User
from warren.broker.broker import Broker
from warren.broker.errors import AMQPError
from warren.broker.metadata import commands as c

HEADER = "x-warren-missing-exchange"


@pytest.fixture
def broker():
    b = Broker.with_defaults()
    b.metadata.apply(c.PutUser(User.with_password("bob", "pw")))
    b.metadata.apply(c.SetPermissions("bob", "/", ".*", "^out\\.", ".*"))  # bob writes to "out." names only
    return b


def actor(broker, user="guest"):
    return ops.Actor(broker, broker.users[user], broker.vhosts["/"])


def publish(a, exchange, routing_key, body=b"x", properties=None, header=None):
    route = shortstr(exchange) + shortstr(routing_key)
    header = header if header is not None else encode_header(len(body), properties or {})
    return ops.route(a, exchange, routing_key, route, header, body)


def error(call, *args, **kw):
    with pytest.raises(AMQPError) as info:
        call(*args, **kw)
    return info.value.code, info.value.text


def capture_into_queue(broker, target="capture", type_name="fanout", internal=False):
    a = actor(broker)
    ops.declare_exchange(a, target, type_name, internal=internal)
    ops.declare_queue(a, "captured")
    ops.bind(a, target, "queue", "captured", "#" if type_name == "topic" else "", {})
    broker.vhosts["/"].missing_exchange = target
    return broker.vhosts["/"].queues["captured"]


# ------------------------------------------------------------------ the setting
@pytest.mark.parametrize("value", ["capture", "x" * 255, "é" * 127, "amq.fanout", "amq.direct", "amq.topic",
                                   "amq.headers", "amq.match", "with space/and:colon"])
def test_valid_names(value):
    assert missing_exchange.validate(value) == value


@pytest.mark.parametrize("value", [None, ""])
def test_null_and_empty_turn_it_off(value):
    assert missing_exchange.validate(value) is None


@pytest.mark.parametrize("value, why", [
    (5, "must be an exchange name (a string)"), (True, "must be an exchange name"), (["x"], "must be an exchange"),
    ({"name": "x"}, "must be an exchange name"), ("x" * 256, "longer than 255 bytes"),
    ("é" * 128, "longer than 255 bytes"), ("amq.capture", "the prefix 'amq.' is reserved"),
    ("amq.rabbitmq.trace", "reserved"), ("amq.warren.stream-offsets", "reserved"), ("amq.", "reserved")])
def test_invalid_values_are_refused(value, why):
    with pytest.raises(missing_exchange.SettingError, match=None) as info:
        missing_exchange.validate(value)
    assert why in str(info.value) and "missing_exchange" in str(info.value)


def test_predeclared_names_are_the_vhosts():
    assert missing_exchange.PREDECLARED == tuple(name for name, _ in vhosts.PREDECLARED)


# ------------------------------------------------------------------ the header
def test_header_added_to_a_message_without_headers():
    header = encode_header(3, {"content_type": "text/plain", "delivery_mode": 2, "message_id": "m"})
    got = missing_exchange.with_missing_header(header, "orders")
    assert decode_properties(got) == {"content_type": "text/plain", "delivery_mode": 2, "message_id": "m",
                                      "headers": {HEADER: "orders"}}
    assert got[:12] == header[:12]  # class, weight, body size


def test_other_headers_kept_byte_for_byte_in_their_order():
    # Types RabbitMQ's own re-encoding would change ('L', a boolean 2) and a duplicate key stay.
    fields = [(b"z", b"L" + (7).to_bytes(8, "big")), (b"b", b"t\x02"), (b"a", rt.longstr_value(b"1")),
              (b"a", rt.longstr_value(b"2"))]
    table = rt.encode_fields(fields)
    header = rt.join_header(encode_header(0, {}), {FLAG_HEADERS: table, 1 << 12: b"\x02"})
    got = missing_exchange.with_missing_header(header, "x")
    assert rt.table_fields(rt.split_header(got)[FLAG_HEADERS]) == [*fields, (HEADER.encode(), rt.longstr_value(b"x"))]
    assert rt.split_header(got)[1 << 12] == b"\x02"


def test_a_replayed_capture_gets_the_new_name_in_place():
    header = encode_header(0, {"headers": {"a": 1, HEADER: "old", "b": 2}})
    got = decode_properties(missing_exchange.with_missing_header(header, "new"))["headers"]
    assert list(got.items()) == [("a", 1), (HEADER, "new"), ("b", 2)]


def test_names_that_are_not_utf8_are_kept_as_sent():
    name = b"\xff\xfe".decode("utf-8", "surrogateescape")  # as read_shortstr reads them
    got = missing_exchange.with_missing_header(encode_header(0, {}), name)
    assert decode_properties(got)["headers"][HEADER] == b"\xff\xfe"


# ------------------------------------------------------------------ ops.route
def test_unset_the_404_is_rabbitmqs(broker):
    assert broker.vhosts["/"].missing_exchange is None
    assert error(publish, actor(broker), "nope", "k") == (404, "no exchange 'nope' in vhost '/'")


def test_a_missing_exchange_is_captured(broker):
    q = capture_into_queue(broker)
    message, queues = publish(actor(broker), "nope", "rk", b"body", {"headers": {"h": "v"}, "priority": 3})
    assert queues == [q]
    assert (message.exchange, message.routing_key) == ("capture", "rk")
    assert message.route == shortstr("capture") + shortstr("rk")
    assert message.properties == {"headers": {"h": "v", HEADER: "nope"}, "priority": 3}
    assert message.body == b"body"
    x = broker.vhosts["/"].exchanges["capture"]
    assert (x.stats["publish_in"], x.stats["publish_out"]) == (1, 1)


def test_existing_exchanges_and_the_default_exchange_are_not_captured(broker):
    capture_into_queue(broker)
    a = actor(broker)
    ops.declare_queue(a, "direct-q")
    message, queues = publish(a, "", "direct-q")
    assert message.exchange == "" and message.headers is None
    message, queues = publish(a, "", "no-such-queue")  # a missing queue is no missing exchange
    assert queues == [] and message.exchange == ""
    message, queues = publish(a, "amq.direct", "k")
    assert queues == [] and message.exchange == "amq.direct"


@pytest.mark.parametrize("name", ["amq.nope", "amq.rabbitmq.nope"])
def test_amq_names_are_never_captured(broker, name):
    capture_into_queue(broker)
    assert error(publish, actor(broker), name, "k") == (404, f"no exchange '{name}' in vhost '/'")


def test_capture_exchange_missing_is_the_usual_404(broker, caplog):
    broker.vhosts["/"].missing_exchange = "not-declared"
    assert error(publish, actor(broker), "nope", "k") == (404, "no exchange 'nope' in vhost '/'")
    assert "capture exchange 'not-declared' of vhost '/' does not exist" in caplog.text


def test_write_permission_on_the_original_name_is_checked_first(broker):
    capture_into_queue(broker)
    bob = actor(broker, "bob")
    assert error(publish, bob, "nope", "k") == (
        403, "write access to exchange 'nope' in vhost '/' refused for user 'bob'")
    # none is needed on the capture exchange (bob may not write to "capture")
    assert error(publish, bob, "capture", "k")[0] == 403
    message, queues = publish(bob, "out.nope", "k")
    assert message.exchange == "capture" and len(queues) == 1


def test_an_internal_capture_exchange_captures(broker):
    q = capture_into_queue(broker, internal=True)
    assert error(publish, actor(broker), "capture", "k") == (
        403, "cannot publish to internal exchange 'capture' in vhost '/'")
    assert publish(actor(broker), "nope", "k")[1] == [q]


def test_property_checks_apply_to_captured_publishes(broker):
    capture_into_queue(broker)
    assert error(publish, actor(broker), "nope", "k", properties={"user_id": "mallory"})[0] == 406
    assert error(publish, actor(broker), "nope", "k", properties={"expiration": "x"})[0] == 406
    message, _ = publish(actor(broker), "nope", "k", properties={"expiration": "500"})
    assert message.ttl == 500


def test_cc_and_bcc_route_through_the_capture_exchange(broker):
    a = actor(broker)
    capture_into_queue(broker, type_name="direct")
    ops.bind(a, "capture", "queue", "captured", "cc-key", {})
    ops.declare_queue(a, "bcc-q")
    ops.bind(a, "capture", "queue", "bcc-q", "bcc-key", {})
    message, queues = publish(a, "nope", "unbound", properties={"headers": {"CC": ["cc-key"], "BCC": ["bcc-key"]}})
    assert sorted(q.name for q in queues) == ["bcc-q", "captured"]
    assert message.properties["headers"] == {"CC": ["cc-key"], HEADER: "nope"}  # BCC left, as always


def test_alternate_exchange_of_the_capture_exchange_applies(broker):
    a = actor(broker)
    ops.declare_exchange(a, "capture-ae", "fanout")
    ops.declare_queue(a, "ae-q")
    ops.bind(a, "capture-ae", "queue", "ae-q", "", {})
    ops.declare_exchange(a, "capture", "direct", arguments={"alternate-exchange": "capture-ae"})
    broker.vhosts["/"].missing_exchange = "capture"
    assert [q.name for q in publish(a, "nope", "k")[1]] == ["ae-q"]


# ------------------------------------------------------------------ definitions
def test_definitions_carry_the_setting_only_when_set(broker):
    assert "missing_exchange" not in definitions.export(broker)["vhosts"][0]["metadata"]
    broker.vhosts["/"].missing_exchange = "capture"
    exported = definitions.export(broker)
    assert exported["vhosts"][0]["metadata"]["missing_exchange"] == "capture"
    fresh = Broker()
    definitions.load(fresh, exported)
    assert fresh.vhosts["/"].missing_exchange == "capture"


def test_import_keeps_clears_or_refuses(broker):
    broker.vhosts["/"].missing_exchange = "capture"
    definitions.load(broker, {"vhosts": [{"name": "/"}]})  # RabbitMQ's exports never have it
    assert broker.vhosts["/"].missing_exchange == "capture"
    definitions.load(broker, {"vhosts": [{"name": "/", "metadata": {"missing_exchange": "other"}}]})
    assert broker.vhosts["/"].missing_exchange == "other"
    definitions.load(broker, {"vhosts": [{"name": "/", "missing_exchange": None}]})
    assert broker.vhosts["/"].missing_exchange is None
    with pytest.raises(definitions.DefinitionsError, match="reserved.*vhost 'v2'"):
        definitions.load(broker, {"vhosts": [{"name": "v2", "metadata": {"missing_exchange": "amq.x"}}]})
    assert "v2" not in broker.vhosts  # refused before the vhost was created
