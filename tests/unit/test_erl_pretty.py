"""~p as io_lib lays out a term that does not fit on its line (warren.amqp.erlang.erl_pretty),
for the JSON terms RabbitMQ's validation texts print. Each expected text is what
io_lib:format(lists:duplicate(Col, $x) ++ "~p", [Term]) gave on Erlang/OTP 25 (RabbitMQ
3.10.8's), the column's x's taken off."""

import pytest

from warren.amqp.erlang import Atom, erl_format, erl_pretty, erl_text


@pytest.mark.parametrize("term, col, expected", [
    # One line when it fits; strings, escapes and printable integer lists as ~p writes them.
    ([("max-age", "1x")], 0, '[{<<"max-age">>,<<"1x">>}]'),
    ("1x\n\t\"\\", 0, '<<"1x\\n\\t\\"\\\\">>'),
    (b"1x\x01", 0, "<<49,120,1>>"),
    ([65, 66, 10], 0, '"AB\\n"'),
    ([1, 2], 0, "[1,2]"),
    ([True, None, Atom("none"), 1.5, 1e20, {}, [], ""], 0, "[true,null,none,1.5,1.0e20,#{},[],<<>>]"),
    ({"b": 1, "a": [1]}, 0, '#{<<"a">> => [1],<<"b">> => 1}'),
    # A list of tuples: one element per line.
    ([("max-age", "1x"), ("queue-mode", "eager"), ("expires", 1.5), ("zz", [1, 2, 3])], 0,
     '[{<<"max-age">>,<<"1x">>},\n {<<"queue-mode">>,<<"eager">>},\n {<<"expires">>,1.5},\n {<<"zz">>,[1,2,3]}]'),
    # Text on a line fills it; a map's value that does not fit goes under its key, 4 further in.
    ({"nodes": ["rabbit@node-one", "rabbit@node-two"], "mode": "nodes", "batch": 12}, 40,
     '#{<<"batch">> => 12,\n' + " " * 42 + '<<"mode">> => <<"nodes">>,\n' + " " * 42 + '<<"nodes">> =>\n'
     + " " * 46 + '[<<"rabbit@node-one">>,\n' + " " * 47 + '<<"rabbit@node-two">>]}'),
    (bytes(range(1, 41)), 10,
     "<<1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,\n" + " " * 12
     + "26,27,28,29,30,31,32,33,34,35,36,37,38,39,40>>"),
    ([f"r@{n}" for n in range(1, 13)], 0,
     '[<<"r@1">>,<<"r@2">>,<<"r@3">>,<<"r@4">>,<<"r@5">>,<<"r@6">>,<<"r@7">>,\n'
     ' <<"r@8">>,<<"r@9">>,<<"r@10">>,<<"r@11">>,<<"r@12">>]'),
])
def test_layout_is_io_libs(term, col, expected):
    assert erl_pretty(term, col) == expected


def test_format_starts_each_term_at_its_column():
    nodes = [f"rabbit@node-{n}" for n in range(4)]
    assert erl_format('ha-mode="nodes" takes a list, ~p given', nodes) == (
        'ha-mode="nodes" takes a list, [<<"rabbit@node-0">>,<<"rabbit@node-1">>,\n'
        + " " * 31 + '<<"rabbit@node-2">>,<<"rabbit@node-3">>] given')


def test_a_binary_prints_one_character_per_byte():
    """As Erlang's ~p (its latin1 range is printable); RabbitMQ's HTTP replies then give those
    bytes back as UTF-8."""
    chars = erl_pretty("\u00e9")
    assert chars == '<<"\u00c3\u00a9">>'
    assert erl_text(chars) == '<<"\u00e9">>'
