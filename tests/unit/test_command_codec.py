"""Metadata commands as the cluster's log holds them (warren.cluster.command_codec): every
command class round-trips exactly, its field tables' AMQP types included (a decoded table
goes on the wire as the original); the commands of a definitions import build the same node
elsewhere; an exclusive queue's owner is known on another node; a malformed entry is refused
with a ValueError, and a command no peer could decode is not written."""

import dataclasses
import datetime
import decimal
import json
import pathlib
import re
import struct
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.amqp.codec import MAX_NESTING, allow_nesting, decode_table, encode_table, longstr_bytes, \
    table_type_name, typed_float, typed_int
from warren.amqp.spec import Method
from warren.broker import definitions
from warren.broker.auth import MD5, SHA256, SHA512, User
from warren.broker.broker import Broker
from warren.broker.errors import AMQPError
from warren.broker.links import ConnectionLink, ExclusiveOwner
from warren.broker.metadata import commands as c
from warren.broker.policy import APPLY_TO, Policy
from warren.broker.shovel_config import Config as ShovelConfig
from warren.cluster.command_codec import COMMANDS, CommandError, decode, encode

DATA = pathlib.Path(__file__).parent.parent / "data"
_BITS = struct.Struct(">d")


def same(a, b) -> bool:
    """Equal and of the same types all the way down (an int and a long are not the same
    field value), NaNs and -0.0 by their bits, a Decimal by its digits and exponent; a User or
    Policy (which compare by identity) by what defines it."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, User):
        return same(vars(a), vars(b))
    if isinstance(a, Policy):
        return a.regex.pattern == b.regex.pattern and all(same(getattr(a, s), getattr(b, s))
                                                          for s in Policy.__slots__ if s != "regex")
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return _BITS.pack(a) == _BITS.pack(b)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime.datetime):
        return a.isoformat() == b.isoformat() and a.tzinfo == b.tzinfo
    return a == b


def round_trip(command):
    data = encode(command)
    assert isinstance(data, bytes)
    back = decode(data)
    assert same(back, command), (command, back)
    assert encode(back) == data
    return back


# ---------------------------------------------------------------- strategies
# Names: any code point, surrogates included (names read with surrogateescape, JSON's "\udc80").
names = st.text(st.characters(exclude_categories=()), max_size=12)
keys = names | st.sampled_from(["$", "$long", "$dict", "$tuple"]) | names.map(lambda n: "$" + n)

_INT_RANGES = {"byte": (-2**7, 2**7), "unsignedbyte": (0, 2**8), "short": (-2**15, 2**15),
               "unsignedshort": (0, 2**16), "signedint": (-2**31, 2**31), "unsignedint": (0, 2**32),
               "long": (-2**63, 2**63), "unsignedlong": (0, 2**64), "timestamp": (0, 2**64)}
typed_ints = st.sampled_from(sorted(_INT_RANGES)).flatmap(
    lambda t: st.integers(_INT_RANGES[t][0], _INT_RANGES[t][1] - 1).map(lambda v: typed_int(t, v)))
typed_floats = (st.floats(width=32).map(lambda v: typed_float("float", v))
                | st.floats().map(lambda v: typed_float("double", v)))
zones = st.none() | st.just(datetime.timezone.utc) | st.integers(-86399, 86399).map(
    lambda seconds: datetime.timezone(datetime.timedelta(seconds=seconds)))
datetimes = st.datetimes(timezones=zones)
longstrs = st.binary().map(lambda b: longstr_bytes(b"\xff" + b))  # (never UTF-8, as decode_table makes them)
# Every value a command's field table (or a JSON value) holds, as warren.amqp.codec decodes
# them and as JSON bodies give them: typed numbers, plain ones, byte arrays, non-UTF-8
# longstrs, decimals, timestamps, nested tables, arrays, tuples, void.
leaves = (st.none() | st.booleans() | st.integers() | st.floats() | names | st.binary() | longstrs
          | st.decimals() | datetimes | typed_ints | typed_floats)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=12)
tables = st.dictionaries(keys, values, max_size=5)

patterns = st.sampled_from(["", ".*", r"^q\.", "^amq\\.", "[a-z]+$", "(a|b)*"]) | names.map(re.escape)
users = st.builds(User, names, names, st.lists(names, max_size=3), st.sampled_from([SHA256, SHA512, MD5]),
                  st.dictionaries(names, st.integers(), max_size=2))
policies = st.builds(Policy, names, names, patterns, tables, st.integers() | st.floats(allow_nan=False),
                     st.sampled_from(APPLY_TO))
links = st.builds(ConnectionLink, names, names, st.integers(0, 65535) | st.just("undefined"))
owners = st.builds(ExclusiveOwner, names, st.integers(1), links)


_ANNOTATED = {"User": User, "Policy": Policy, "ExclusiveOwner": ExclusiveOwner, "ShovelConfig": ShovelConfig,
              "Method": Method}


def for_hint(hint) -> st.SearchStrategy:
    """Values of an annotated type: a field of a type this does not know fails the test (a
    new kind of value needs the codec's support, and a strategy here)."""
    if hint is Any:
        return values | st.just(c.KEEP)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or isinstance(hint, type(int | None)):
        return st.one_of([st.none() if a is type(None) else for_hint(a) for a in args])
    if origin is dict:
        return st.dictionaries(for_hint(args[0]), for_hint(args[1]), max_size=3)
    if origin is tuple and args == (str, Ellipsis):
        return st.lists(names, max_size=3).map(tuple)
    if origin is tuple and args == (Method, Ellipsis):
        return st.just(())  # (a static shovel's declarations: node-local, never in a command)
    if origin is tuple and args == (c.Command, Ellipsis):  # a Batch's: any commands, a batch among them
        commands = st.deferred(lambda: st.one_of([of_dataclass(cls) for cls in typing.get_args(c.Command)]))
        return st.lists(commands, max_size=3).map(tuple)
    simple = {str: names, bool: st.booleans(), int: st.integers(), dict: tables, User: users, Policy: policies,
              ExclusiveOwner: owners, ShovelConfig: shovel_configs}
    if hint in simple:
        return simple[hint]
    raise LookupError(f"no strategy for {hint!r}: does the codec encode it?")


def of_dataclass(cls, **fixed) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls, localns=_ANNOTATED)
    return st.builds(cls, **{f.name: fixed[f.name] if f.name in fixed else for_hint(hints[f.name])
                             for f in dataclasses.fields(cls)})


shovel_configs = st.deferred(lambda: of_dataclass(ShovelConfig, static=st.just(False)))


def public_command_classes() -> set:
    return {v for name, v in vars(c).items() if dataclasses.is_dataclass(v) and not name.startswith("_")}


# ---------------------------------------------------------------- every command
def test_the_codec_knows_every_command():
    """A command class added to commands.py is in commands.Command, so the codec (and the
    round trip below) has it."""
    assert public_command_classes() == set(typing.get_args(c.Command)) == set(COMMANDS.values())
    assert all(COMMANDS[cls.__name__] is cls for cls in public_command_classes())


@pytest.mark.parametrize("cls", sorted(typing.get_args(c.Command), key=lambda k: k.__name__),
                         ids=lambda k: k.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_command_round_trips(cls, data):
    command = data.draw(of_dataclass(cls))
    round_trip(command)


def test_a_batch_holds_its_commands_as_entries():
    """A batch (an import's definitions, a batch at a time) holds each command as an entry."""
    batch = c.Batch((c.PutVHost("v", "d", ["t"]), c.DeclareQueue("v", "q", True, None, False, {}, "n@h"),
                     c.Bind("v", "amq.direct", "queue", "q", "k")))
    entry = json.loads(encode(batch))
    assert entry["command"] == "Batch"
    assert entry["fields"]["commands"]["$tuple"][1] == {"$command": json.loads(encode(batch.commands[1]))}
    assert round_trip(batch) == batch
    with pytest.raises(TypeError, match="Batch.commands"):
        encode(c.Batch(("not a command",)))  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="unknown command"):
        decode(b'{"command":"Batch","fields":{"commands":{"$tuple":[{"$command":{"command":"Nope","fields":{}}}]}}}')


def test_the_json_names_the_command_and_its_fields():
    entry = json.loads(encode(c.DeclareQueue("v", "q", True, None, False, {"x-max-length": typed_int("long", 10),
                                                                         "x-queue-type": "classic"})))
    assert entry == {"command": "DeclareQueue", "fields": {
        "vhost": "v", "name": "q", "durable": True, "owner": None, "auto_delete": False,
        "arguments": {"x-max-length": {"$long": 10}, "x-queue-type": "classic"}, "node": None, "members": None,
        "incarnation": None}}
    assert json.loads(encode(c.PutVHost("v"))) == {"command": "PutVHost", "fields": {
        "name": "v", "description": {"$keep": None}, "tags": {"$keep": None}, "missing_exchange": {"$keep": None},
        "default_queue_type": None}}
    # Compact UTF-8, a name as its characters.
    assert encode(c.DeleteQueue("ü", "")) == '{"command":"DeleteQueue","fields":{"vhost":"ü","name":""}}'.encode()


@pytest.mark.parametrize("name", ["", "ü", "名前", "😀", "\ud83d\ude00", "\udc80\udcff", "a\x00b", "$", "$long",
                                  "\u2028", '"\\'])
def test_a_name_comes_back_code_point_for_code_point(name):
    """Any string: two surrogates that would make a pair stay two (JSON's escapes would join
    them), a name read with surrogateescape keeps its lone ones."""
    round_trip(c.SetTopicPermissions(name, name, name, name, name))
    back = round_trip(c.DeclareQueue(name, name, arguments={name: name, "k": {name: [name]}}))
    assert list(back.name) == list(name)


def test_floats_keep_their_bits():
    """-0.0, infinities and NaNs (with their sign and payload) as they were: JSON has none
    of them but -0.0."""
    odd = [-0.0, float("inf"), float("-inf"), _BITS.unpack(bytes.fromhex("7ff8000000000001"))[0],
           _BITS.unpack(bytes.fromhex("fff8000000000000"))[0]]
    for value in odd:
        for typed in (value, typed_float("double", value), typed_float("float", value)):
            round_trip(c.SetGlobalParameter("n", [typed]))
    assert b"NaN" not in encode(c.SetGlobalParameter("n", float("nan")))  # (strict JSON)


# ---------------------------------------------------------------- field tables, as on the wire
def _wire_table(table: dict) -> dict:
    """The table as a client's declare gives it (warren.amqp.codec's decoded types)."""
    return decode_table(encode_table(table)[4:], strict=True)


wire_leaves = (st.booleans() | st.none() | typed_ints.filter(lambda v: table_type_name(v) != "timestamp")
               | st.integers(0, 2**64 - 1).map(lambda v: typed_int("timestamp", v))
               | st.floats(width=32, allow_nan=False, allow_infinity=False).map(lambda v: typed_float("float", v))
               | st.floats(allow_nan=False, allow_infinity=False).map(lambda v: typed_float("double", v))
               | names.filter(lambda n: not any("\ud800" <= ch <= "\udfff" for ch in n)) | st.binary() | longstrs
               | st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-2_000_000, max_value=2_000_000)
               | st.integers(0, 253402300799).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.timezone.utc)))
wire_tables = st.dictionaries(names.filter(lambda n: not any("\ud800" <= ch <= "\udfff" for ch in n)),
                              st.recursive(wire_leaves, lambda inner: st.lists(inner, max_size=4)
                                           | st.dictionaries(keys.filter(str.isprintable), inner, max_size=4),
                                           max_leaves=12), max_size=6).map(_wire_table)


def _types(value):
    """The AMQP type of every value in a table, nested."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return table_type_name(value)


@settings(max_examples=300, deadline=None)
@given(table=wire_tables)
def test_a_declared_table_goes_back_on_the_wire_as_it_came(table):
    """A queue, exchange or binding declared with any table: the command decoded on another
    node holds the same AMQP types, so its table encodes to the same bytes (x-max-length a
    long stays a long, a byte array a byte array)."""
    for command in (c.DeclareQueue("/", "q", arguments=table), c.DeclareExchange("/", "x", "headers", arguments=table),
                    c.Bind("/", "x", "queue", "q", "k", table)):
        back = round_trip(command)
        assert encode_table(back.arguments) == encode_table(table)
        assert _types(back.arguments) == _types(table)


def test_typed_numbers_keep_their_types():
    table = _wire_table({"x-max-length": typed_int("long", 10), "x-max-priority": typed_int("unsignedbyte", 5),
                         "h": typed_int("short", -1), "f": typed_float("float", 0.5), "n": [1, 2.5]})
    back = round_trip(c.DeclareQueue("/", "q", arguments=table)).arguments
    assert [table_type_name(back[k]) for k in ("x-max-length", "x-max-priority", "h", "f")] == \
        ["long", "unsignedbyte", "short", "float"]
    assert [table_type_name(v) for v in back["n"]] == ["signedint", "double"]
    # Plain Python numbers (a command built in the broker) stay plain: encoded as the wire would.
    plain = round_trip(c.DeclareQueue("/", "q", arguments={"a": 1, "b": 2**40, "c": 1.5})).arguments
    assert [type(v) for v in plain.values()] == [int, int, float]


def test_a_table_nested_as_deep_as_the_wire_allows_round_trips():
    allow_nesting()
    table: dict = {"leaf": typed_int("long", 1)}
    for depth in range(MAX_NESTING - 1):
        table = {"t": table} if depth % 2 else {"a": [table]}
    round_trip(c.Bind("/", "x", "queue", "q", "", table))


# ---------------------------------------------------------------- a definitions import
def _tables(broker: Broker) -> dict:
    exported = definitions.export(broker)
    exported.pop("warren_version")
    return exported


def test_the_commands_of_a_definitions_import_build_the_same_node():
    """RabbitMQ's exported definitions (with a shovel, federation upstreams and vhost limits
    added): each command the import applies round-trips, and a node that applies the decoded
    commands has the same definitions."""
    data = json.loads((DATA / "rabbitmq-3.10.8-api-definitions.json").read_text())
    data["parameters"] += [
        {"vhost": "rt-a", "component": "shovel", "name": "sh", "value": {
            "src-uri": "amqp://", "src-queue": "q.maxlen", "dest-uri": ["amqp:///rt-b", "amqp://"],
            "dest-queue": "moved", "src-queue-args": {"x-queue-type": "classic"},
            "dest-publish-properties": {"delivery_mode": 2}, "add-forward-headers": True}},
        {"vhost": "rt-a", "component": "federation-upstream", "name": "up", "value": {
            "uri": "amqp://upstream", "max-hops": 2, "expires": 60000}},
        {"vhost": "rt-a", "component": "federation-upstream-set", "name": "ups", "value": [{"upstream": "up"}]},
        {"vhost": "rt-b", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 100}},
    ]
    source = Broker()
    sent: list = []
    apply = source.metadata.apply

    def recording(command):
        sent.append(command)
        return apply(command)

    source.metadata.apply = recording  # type: ignore[method-assign]
    definitions.load(source, data)
    kinds = {type(cmd) for cmd in sent}
    assert {c.PutVHost, c.PutUser, c.SetPermissions, c.SetTopicPermissions, c.SetPolicy, c.DeclareExchange,
            c.DeclareQueue, c.Bind, c.SetShovel, c.SetFederationParameter, c.SetVHostLimits,
            c.SetGlobalParameter} <= kinds
    replica = Broker()
    for command in sent:
        replica.metadata.apply(round_trip(command))
    assert _tables(replica) == _tables(source)
    assert _tables(source)["queues"]  # (not two empty nodes)
    # The import typed the JSON arguments as RabbitMQ does (integers long): still so.
    maxlen = replica.vhosts["rt-a"].queues["q.maxlen"]
    assert table_type_name(maxlen.arguments["x-max-length"]) == "long"


def test_a_user_and_a_policy_are_built_again():
    user = User.with_password("bob", "secret", ["administrator"])
    user.limits = {"max-connections": 2}
    back = round_trip(c.PutUser(user)).user
    assert back is not user and back.check_password("secret") and not back.check_password("other")
    policy = Policy.validated("v", "p", r"^q\.", {"max-length": 5}, 1, "queues")
    back_policy = round_trip(c.SetPolicy(policy)).policy
    assert back_policy.applies_to("queue", "q.1") and not back_policy.applies_to("queue", "xq.1")


# ---------------------------------------------------------------- an exclusive queue's owner
def test_an_owner_from_another_node_is_that_connection_there():
    """The owner is (node, id) with its link: on another node it is the same owner, and a
    connection of that node with the same id is not."""
    link = ConnectionLink("10.0.0.1:5000 -> 10.0.0.2:5672", "10.0.0.1", 5000)
    owner = ExclusiveOwner.new("warren@a", link)
    back = round_trip(c.DeclareQueue("/", "mine", owner=owner)).owner
    assert back == owner and back.node == "warren@a" and back.link == link
    assert ExclusiveOwner("warren@b", owner.id, link) != owner  # same id, another node's connection
    assert ExclusiveOwner("warren@a", owner.id, ConnectionLink("x", "y", 1)) == owner  # (the link is shown only)

    b = Broker.with_defaults()
    queue, created = b.metadata.apply(decode(encode(c.DeclareQueue("/", "mine", owner=owner))))
    assert created and queue.owner == owner
    b.vhosts["/"].check_exclusive(queue, back)
    with pytest.raises(AMQPError) as info:
        b.vhosts["/"].check_exclusive(queue, ExclusiveOwner("warren@b", owner.id, link))
    assert info.value.code == 405


# ---------------------------------------------------------------- refused
@pytest.mark.parametrize("data,error", [
    (b"not json", "not a command"),
    (b"\xff\xfe", "not a command"),
    (b"[]", '"command" and "fields"'),
    (b'{"command":"DeleteQueue"}', '"command" and "fields"'),
    (b'{"command":"Nope","fields":{}}', "unknown command 'Nope'"),
    (b'{"command":["DeleteQueue"],"fields":{}}', "unknown command"),
    (b'{"command":"__class__","fields":{}}', "unknown command"),
    (b'{"command":"DeleteQueue","fields":[]}', "its fields must be an object"),
    (b'{"command":"DeleteQueue","fields":{"vhost":"/"}}', "DeleteQueue lacks the field 'name'"),
    (b'{"command":"DeleteQueue","fields":{"vhost":"/","name":"q","x":1}}', "DeleteQueue has no field 'x'"),
    (b'{"command":"DeleteQueue","fields":{"vhost":1,"name":"q"}}', "DeleteQueue.vhost is int 1, not str"),
    (b'{"command":"DeleteExchange","fields":{"vhost":"/","name":"x","if_unused":1}}', "not bool"),
    (b'{"command":"DeleteQueue","fields":{"vhost":{"$keep":null},"name":"q"}}', "not str"),
    (b'{"command":"SetUserLimits","fields":{"user":"u","limits":{"max-connections":true}}}', "not dict[str, int]"),
    (b'{"command":"Bind","fields":{"vhost":"/","source":"x","dest_kind":"queue","destination":"q",'
     b'"routing_key":"","arguments":[]}}', "not dict | None"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$nope":1}}}', "unknown tag '$nope'"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":NaN}}', "NaN is not a JSON number"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$long":9223372036854775808}}}',
     "$long holds int 9223372036854775808, not an integer in"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$unsignedbyte":-1}}}', "$unsignedbyte holds"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$long":"5"}}}', "$long holds str '5'"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$short":true}}}', "$short holds bool"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$float":1e300}}}', "a 32-bit float cannot"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$double":"nan"}}}', "16 hex digits"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$bytes":"*"}}}', "not base64"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$longstr":5}}}', "not base64"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$decimal":"one"}}}', "not a decimal"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$datetime":"today"}}}', "not an ISO 8601"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$tuple":{}}}}', "not a JSON array"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$dict":[]}}}', "not a JSON object"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":{"$keep":1}}}', "not null"),
    (b'{"command":"PutUser","fields":{"user":{"$user":{"name":"u","password_hash":"","algorithm":"rot13",'
     b'"tags":[],"limits":{}}}}}', "unknown password hashing algorithm 'rot13'"),
    (b'{"command":"PutUser","fields":{"user":{"$user":{"name":"u"}}}}', "user lacks the field"),
    (b'{"command":"PutUser","fields":{"user":"u"}}', "PutUser.user is str 'u', not User"),
    (b'{"command":"SetPolicy","fields":{"policy":{"$policy":{"vhost":"/","name":"p","pattern":"(",'
     b'"definition":{},"priority":0,"apply_to":"all"}},"operator":false}}', "is not a regular expression"),
    (b'{"command":"SetPolicy","fields":{"policy":{"$policy":{"vhost":"/","name":"p","pattern":"",'
     b'"definition":{},"priority":0,"apply_to":"streams"}},"operator":false}}', "apply-to 'streams'"),
    (b'{"command":"SetPolicy","fields":{"policy":{"$policy":{"vhost":"/","name":"p","pattern":"",'
     b'"definition":{},"priority":true,"apply_to":"all"}},"operator":false}}', "policy.priority is bool"),
    (b'{"command":"SetShovel","fields":{"vhost":"/","name":"s","value":{},"config":{"$shovel":{'
     b'"src_uris":{"$tuple":["amqp://"]},"dest_uris":{"$tuple":["amqp://"]},"static":true}}}}', "a static shovel"),
    (b'{"command":"SetShovel","fields":{"vhost":"/","name":"s","value":{},"config":{"$shovel":{'
     b'"src_uris":["amqp://"],"dest_uris":{"$tuple":["amqp://"]}}}}}', "shovel.src_uris is list"),
    (b'{"command":"DeclareQueue","fields":{"vhost":"/","name":"q","owner":{"$owner":{"node":"n","id":true,'
     b'"link":{"$link":{"name":"l","peer_host":"h","peer_port":1}}}}}}', "owner.id is bool"),
    (b'{"command":"DeclareQueue","fields":{"vhost":"/","name":"q","owner":{"$owner":{"node":"n","id":1,'
     b'"link":["l","h",1]}}}}', "owner.link is list"),
    (b'{"command":"SetGlobalParameter","fields":{"name":"n","value":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
     "nested too deep"),
])
def test_a_malformed_entry_is_refused(data, error):
    with pytest.raises(ValueError) as info:
        decode(data)
    assert isinstance(info.value, CommandError)
    assert error in str(info.value)


def test_a_field_left_out_takes_its_default():
    """(An entry written before a field with a default existed.)"""
    assert decode(b'{"command":"DeclareQueue","fields":{"vhost":"/","name":"q"}}') == c.DeclareQueue("/", "q")


@pytest.mark.parametrize("command,error", [
    (c.DeleteQueue("/", 1), "DeleteQueue.name is int 1, not str"),  # type: ignore[arg-type]
    (c.DeclareQueue("/", "q", durable="yes"), "DeclareQueue.durable is str 'yes', not bool"),  # type: ignore[arg-type]
    (c.Bind("/", "x", "queue", "q", "", {"s": {1, 2}}), "cannot hold set"),
    (c.Bind("/", "x", "queue", "q", "", {"s": bytearray(b"x")}), "cannot hold bytearray"),
    (c.Bind("/", "x", "queue", "q", "", {"s": {1: "one"}}), "a dict key int 1 is not a string"),
    (c.SetShovel("/", "s", {}, ShovelConfig(("amqp://",), ("amqp://",), static=True)), "a static shovel"),
    (c.SetUserLimits("u", {"max-connections": "1"}), "not dict[str, int]"),  # type: ignore[dict-item]
    (c.SetGlobalParameter("n", datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(0), "Z"))),
     "cannot hold a datetime in"),
    (c.SetGlobalParameter("n", datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone(
        datetime.timedelta(microseconds=1)))), "cannot hold a datetime in"),
])
def test_a_command_no_peer_could_decode_is_not_written(command, error):
    with pytest.raises(TypeError) as info:
        encode(command)
    assert error in str(info.value)


def test_only_commands_are_encoded():
    with pytest.raises(TypeError):
        encode(c._Binding("/", "x", "queue", "q"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode({"command": "DeleteQueue"})  # type: ignore[arg-type]
