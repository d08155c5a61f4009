"""The classic config file's static shovels (warren.cli.static_shovels): both of
rabbit_shovel_config's formats into a shovel Config each, the declarations as AMQP methods,
Erlang field tables as the codec's values, and every bad definition refused with its line and
key."""

import datetime

import pytest

from warren.amqp import spec
from warren.amqp.codec import decode_table, table_type_name
from warren.cli.config import ConfigError, parse_config

PATH = "rabbitmq.config"


def shovels(text: str) -> dict:
    return parse_config("[{rabbitmq_shovel, [{shovels, [\n" + text + "\n]}]}].\n", PATH)["static_shovels"]


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        shovels(text)
    return info.value.errors


def test_the_current_format():
    c = shovels("""{my_shovel, [
      {source, [{protocol, amqp091}, {uris, ["amqp://fred:secret@host1.domain/my_vhost", <<"amqp://">>]},
                {declarations, [{'exchange.declare', [{exchange, <<"my_fanout">>}, {type, <<"fanout">>}, durable]},
                                {'queue.declare', [{arguments, [{<<"x-message-ttl">>, long, 60000}]}]},
                                {'queue.bind', [{exchange, <<"my_fanout">>}, {queue, <<>>}]}]},
                {queue, <<>>}, {prefetch_count, 10}, {consumer_args, [{<<"x-priority">>, signedint, 5}]}]},
      {destination, [{uris, ["amqp://"]},
                     {declarations, [{'exchange.declare', [{exchange, <<"my_direct">>}, durable]}]},
                     {publish_properties, [{delivery_mode, 2}, {content_type, <<"text/plain">>}]},
                     {add_forward_headers, true},
                     {publish_fields, [{exchange, <<"my_direct">>}, {routing_key, <<"from_shovel">>}]}]},
      {ack_mode, on_confirm}, {reconnect_delay, 7}]}""")["my_shovel"]
    assert c.static
    assert c.src_uris == ("amqp://fred:secret@host1.domain/my_vhost", "amqp://") and c.dest_uris == ("amqp://",)
    assert (c.src_queue, c.prefetch, c.ack_mode, c.reconnect_delay, c.delete_after) == ("", 10, "on-confirm", 7,
                                                                                        "never")
    assert c.src_consumer_args == {"x-priority": 5}
    assert table_type_name(c.src_consumer_args["x-priority"]) == "signedint"
    assert (c.dest_queue, c.dest_exchange, c.dest_exchange_key) == (None, "my_direct", "from_shovel")
    assert c.publish_properties == {"delivery_mode": 2, "content_type": "text/plain"}
    assert (c.add_forward_headers, c.add_timestamp_header) == (True, False)
    assert c.src_declarations == (
        spec.ExchangeDeclare(exchange="my_fanout", type="fanout", durable=True),
        spec.QueueDeclare(queue="", arguments={"x-message-ttl": 60000}),
        spec.QueueBind(queue="", exchange="my_fanout"))
    assert table_type_name(c.src_declarations[1].arguments["x-message-ttl"]) == "long"
    # (exchange.declare's type is direct unless given, as in rabbit_framing's record)
    assert c.dest_declarations == (spec.ExchangeDeclare(exchange="my_direct", type="direct", durable=True),)


def test_the_current_formats_defaults():
    c = shovels('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}]}, {destination, [{uris, ["amqp://"]}]}]}')["s"]
    assert (c.ack_mode, c.prefetch, c.reconnect_delay, c.delete_after) == ("no-ack", 1000, 5, "never")
    assert (c.dest_exchange, c.dest_exchange_key, c.publish_properties) == (None, None, {})
    assert (c.src_declarations, c.dest_declarations, c.src_consumer_args) == ((), (), {})


def test_the_legacy_format():
    found = shovels("""{old, [{sources, [{broker, "amqp://"}, {declarations, ['queue.declare']}]},
                              {destinations, [{brokers, ["amqp://a", "amqp://b"]}]},
                              {queue, <<"q">>}, {prefetch_count, 3}, {delete_after, 'queue-length'},
                              {publish_fields, [{routing_key, <<"k">>}]}, {add_timestamp_header, true}]},
                       {older, [{sources, [{broker, "amqp://"}]}, {destinations, [{broker, "amqp://"}]},
                                {queue, <<"q">>}, {ack_mode, no_ack}]}""")
    c = found["old"]
    assert (c.src_uris, c.dest_uris, c.src_queue, c.prefetch) == (("amqp://",), ("amqp://a", "amqp://b"), "q", 3)
    # (the legacy format's ack_mode is on_confirm unless given)
    assert (c.ack_mode, c.delete_after, c.dest_exchange_key, c.add_timestamp_header) == (
        "on-confirm", "queue-length", "k", True)
    assert c.src_declarations == (spec.QueueDeclare(),)
    assert found["older"].ack_mode == "no-ack"
    assert list(found) == ["old", "older"]


def test_declarations_and_their_fields():
    c = shovels("""{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [
        'queue.declare',
        {'queue.declare', [{queue, <<"q">>}, durable, {exclusive, false}, {auto_delete, true}, nowait]},
        {'exchange.bind', [{destination, <<"d">>}, {source, <<"s">>}, {routing_key, <<"k">>}, {ticket, 0}]},
        {'exchange.unbind', [{destination, <<"d">>}, {source, <<"s">>}]},
        {'exchange.delete', [{exchange, <<"x">>}, if_unused]},
        {'queue.unbind', [{exchange, <<"x">>}, {queue, <<"q">>}, {routing_key, <<"k">>}]},
        {'queue.purge', [{queue, <<"q">>}]},
        {'queue.delete', [if_empty]}]}]},
      {destination, [{uris, ["amqp://"]}]}]}""")["s"]
    # (nowait is taken and not kept: the shovel waits for each reply)
    assert c.src_declarations == (
        spec.QueueDeclare(), spec.QueueDeclare(queue="q", durable=True, auto_delete=True),
        spec.ExchangeBind(destination="d", source="s", routing_key="k"),
        spec.ExchangeUnbind(destination="d", source="s"), spec.ExchangeDelete(exchange="x", if_unused=True),
        spec.QueueUnbind(exchange="x", queue="q", routing_key="k"), spec.QueuePurge(queue="q"),
        spec.QueueDelete(if_empty=True))


def test_field_tables_and_headers():
    c = shovels("""{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [
        {'queue.declare', [{arguments, [
            {<<"s">>, longstr, <<"text">>}, {<<"b">>, bool, true}, {<<"i">>, byte, -1}, {<<"u">>, unsignedint, 7},
            {<<"d">>, double, 1.5}, {<<"t">>, timestamp, 1700000000}, {<<"v">>, void, undefined},
            {<<"x">>, binary, <<1, 2>>}, {<<"n">>, table, [{<<"k">>, short, 2}]},
            {<<"a">>, array, [{long, 1}, {longstr, <<"two">>}]}]}]}]}]},
      {destination, [{uris, ["amqp://"]}, {publish_properties, [{headers, [{<<"h">>, longstr, <<"v">>}]},
                                                                {timestamp, 12}]}]}]}""")["s"]
    args = c.src_declarations[0].arguments
    assert args == {"s": "text", "b": True, "i": -1, "u": 7, "d": 1.5,
                    "t": datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc),
                    "v": None, "x": b"\x01\x02", "n": {"k": 2}, "a": [1, "two"]}
    assert [table_type_name(args[k]) for k in ("i", "u")] == ["byte", "unsignedint"]
    assert decode_table(c.publish_properties["headers"][4:]) == {"h": "v"}
    assert c.publish_properties["timestamp"] == 12


def where(line: int, key: str) -> str:
    return f"{PATH}:{line}: rabbitmq_shovel.shovels.{key}: "


SOURCE = '{source, [{uris, ["amqp://"]}, {queue, <<"q">>}]}'
DEST = '{destination, [{uris, ["amqp://"]}]}'


@pytest.mark.parametrize("text, error", [
    # the list of shovels
    ("{s, [" + SOURCE + ", " + DEST + "]}, {s, []}",
     where(2, "s") + "a second shovel of this name (RabbitMQ: duplicate_shovel_definition)"),
    ('{"s", []}', f"{PATH}:2: rabbitmq_shovel.shovels: expected a {{Name, [...]}} shovel with an atom for its name, "
                  'got {"s",[]}'),
    # its keys
    ("{s, [" + SOURCE + ", " + DEST + ", {ack_mod, on_publish}]}",
     where(2, "s.ack_mod") + "unknown key (did you mean rabbitmq_shovel.shovels.s.ack_mode?)"),
    ("{s, [" + SOURCE + ", " + DEST + ", {queue, <<\"q\">>}]}",
     where(2, "s.queue") + "not a key of this format (with {source, [...]}, the shovel's keys are source, "
                           "destination, ack_mode and reconnect_delay)"),
    ("{s, [" + SOURCE + "]}", where(2, "s") + "missing {destination, ...} (RabbitMQ: missing_parameter destination)"),
    ("{s, [" + SOURCE + ", " + DEST + ", " + DEST + "]}",
     where(2, "s.destination") + "given twice (RabbitMQ: duplicate_parameters)"),
    ("{s, [" + SOURCE + ", " + DEST + ", durable]}", where(2, "s") + "expected a {key, value} tuple, got durable"),
    ("{s, [{sources, [{broker, \"amqp://\"}]}, {destinations, [{broker, \"amqp://\"}]}]}",
     where(2, "s") + "missing {queue, ...} (RabbitMQ: missing_parameter queue)"),
    ("{s, [{sources, []}, {destinations, [{broker, \"amqp://\"}]}, {queue, <<\"q\">>}]}",
     where(2, "s.sources") + "missing {broker, ...} (RabbitMQ: missing_parameter broker)"),
    ("{s, [{sources, [{brokers, []}]}, {destinations, [{broker, \"amqp://\"}]}, {queue, <<\"q\">>}]}",
     where(2, "s.sources.brokers") + "expected a non-empty list of URIs (RabbitMQ: expected_non_empty_list)"),
    # values
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, "q"}]}, ' + DEST + "]}",
     where(2, "s.source.queue") + 'expected a binary such as <<"my-queue">>, got "q" (a string: RabbitMQ '
                                  "needs a binary here)"),
    ('{s, [{source, [{uris, ["amqp://"]}]}, ' + DEST + "]}",
     where(2, "s.source") + "missing {queue, ...} (RabbitMQ: missing_parameter queue)"),
    ('{s, [{source, [{uris, []}, {queue, <<"q">>}]}, ' + DEST + "]}",
     where(2, "s.source.uris") + 'expected a non-empty list of URIs such as ["amqp://"], got []'),
    ('{s, [{source, [{uris, ["http://x"]}, {queue, <<"q">>}]}, ' + DEST + "]}",
     where(2, "s.source.uris") + '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
    ('{s, [' + SOURCE + ', {destination, [{protocol, amqp10}, {uris, ["amqp://"]}]}]}',
     where(2, "s.destination.protocol") + "amqp10 is not supported: Warren's shovels speak AMQP 0-9-1 only"),
    ("{s, [" + SOURCE + ", " + DEST + ", {ack_mode, 'on-confirm'}]}",
     where(2, "s.ack_mode") + "expected no_ack, on_publish or on_confirm, got 'on-confirm'"),
    ("{s, [" + SOURCE + ", " + DEST + ", {reconnect_delay, 1.5}]}",
     where(2, "s.reconnect_delay") + "expected a number of seconds, an integer (0: the shovel is not restarted), "
                                     "got 1.5"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {delete_after, 3}]}, ' + DEST + "]}",
     where(2, "s.source.delete_after") + "a number needs ack_mode on_publish or on_confirm (without acks, what "
                                         "the shovel took past the count would be lost)"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {delete_after, forever}]}, ' + DEST + "]}",
     where(2, "s.source.delete_after") + "expected never, 'queue-length' or a number of messages, got forever"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {prefetch_count, 70000}]}, ' + DEST + "]}",
     where(2, "s.source.prefetch_count") + "expected an integer from 0 to 65535, got 70000 "
                                           "(RabbitMQ: require_non_negative_integer)"),
    ("{s, [" + SOURCE + ', {destination, [{uris, ["amqp://"]}, {publish_fields, [{mandatory, true}]}]}]}',
     where(2, "s.destination.publish_fields.mandatory") + "only false is supported (Warren's shovels publish "
                                                          "without mandatory), got true"),
    ("{s, [" + SOURCE + ', {destination, [{uris, ["amqp://"]}, {publish_fields, [{exchnage, <<"x">>}]}]}]}',
     where(2, "s.destination.publish_fields.exchnage") + "unknown key (did you mean "
                                                         "rabbitmq_shovel.shovels.s.destination.publish_fields.exchange?)"),
    ("{s, [" + SOURCE + ', {destination, [{uris, ["amqp://"]}, {publish_properties, [{priority, 300}]}]}]}',
     where(2, "s.destination.publish_properties.priority") + "expected an integer from 0 to 255, got 300"),
    ("{s, [" + SOURCE + ', {destination, [{uris, ["amqp://"]}, {add_forward_headers, yes}]}]}',
     where(2, "s.destination.add_forward_headers") + "expected true or false, got yes"),
    # declarations
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [\'basic.qos\']}]}, ' + DEST + "]}",
     where(2, "s.source.declarations") + "'basic.qos' is not a declaration Warren runs (those are exchange.declare, "
                                         "exchange.delete, exchange.bind, exchange.unbind, queue.declare, queue.bind, "
                                         "queue.unbind, queue.purge, queue.delete)"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [{\'queue.bind\', []}]}]}, ' + DEST + "]}",
     where(2, "s.source.declarations.'queue.bind'") + "queue.bind needs exchange"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [{\'queue.declare\', durable}]}]}, '
     + DEST + "]}",
     where(2, "s.source.declarations.'queue.declare'") + "expected a list of the method's fields such as "
                                                         '[{queue, <<"q">>}, durable], got durable '
                                                         "(RabbitMQ: expected_method_field_list)"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [{\'queue.declare\', [{durable, 1}]}]}]}, '
     + DEST + "]}",
     where(2, "s.source.declarations.'queue.declare'.durable") + "expected true or false, got 1"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [{\'queue.declare\', '
     '[{arguments, [{<<"x-max-length">>, integer, 1}]}]}]}]}, ' + DEST + "]}",
     where(2, "s.source.declarations.'queue.declare'.arguments.x-max-length") + "expected a field type (longstr, "
     "binary, bool, byte, short, signedint, long, unsignedbyte, unsignedshort, unsignedint, double, timestamp, "
     "void, table, array), got integer"),
    ('{s, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}, {declarations, [{\'queue.declare\', '
     '[{arguments, [{<<"x-max-length">>, short, 40000}]}]}]}]}, ' + DEST + "]}",
     where(2, "s.source.declarations.'queue.declare'.arguments.x-max-length") + "expected an integer from -32768 "
                                                                                 "to 32767 for a short, got 40000"),
])
def test_a_bad_definition_is_refused_with_its_line_and_key(text, error):
    assert errors(text) == [error]


def test_the_line_is_the_innermost_terms_and_each_bad_shovel_is_reported():
    assert errors("""{a, [{source, [{uris, ["amqp://"]},
                                    {queue, <<"q">>},
                                    {prefetch_count, x}]},
                          {destination, [{uris, ["amqp://"]}]}]},
    {b, [{source, [{uris, ["amqp://"]}, {queue, <<"q">>}]}, {destination, [{uris, ["amqp://"]},
         {declarations, [
             {'queue.bind', [{exchange, <<"x">>}, {routing_key, "k"}]}]}]}]}""") == [
        where(4, "a.source.prefetch_count") + "expected an integer from 0 to 65535, got x "
                                              "(RabbitMQ: require_non_negative_integer)",
        where(8, "b.destination.declarations.'queue.bind'.routing_key") + 'expected a binary such as <<"x">>, got "k" '
                                                                          "(a string: RabbitMQ needs a binary here)"]


def test_shovels_must_be_a_list():
    with pytest.raises(ConfigError) as info:
        parse_config("[{rabbitmq_shovel, [{shovels, none}]}].\n", PATH)
    assert info.value.errors == [f"{PATH}:1: rabbitmq_shovel.shovels: expected a list of {{Name, [...]}} shovels such "
                                 "as [{my_shovel, [{source, [...]}, {destination, [...]}]}], got none"]
    with pytest.raises(ConfigError) as info:
        parse_config("[{rabbitmq_shovel, [{shovel, []}]}].\n", PATH)
    assert info.value.errors == [f"{PATH}:1: rabbitmq_shovel.shovel: unknown key (did you mean "
                                 "rabbitmq_shovel.shovels?)"]
