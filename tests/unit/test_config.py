"""The config file parsers: RabbitMQ's new-style `key = value` format and the classic
Erlang-term format, every supported key with good and bad values, and the errors (file, line
and key) that stop the server.

Where RabbitMQ 3.10.8 was asked (cuttlefish with its own rabbit.schema, and
rabbit_resource_monitor_misc:parse_information_unit/1 through rabbitmqctl eval), the
expected values below are its answers."""

import logging
import math

import pytest

from warren.cli.config import (Atom, ConfigError, ErlangSyntaxError, format_term, is_erlang_format,
                               load_config, parse_bytesize, parse_config, parse_erlang_term,
                               parse_information_unit)


def conf(*lines, path="warren.conf"):
    return parse_config("\n".join(lines) + "\n", path)


def errors(*lines, path="warren.conf"):
    with pytest.raises(ConfigError) as info:
        parse_config("\n".join(lines) + "\n", path)
    return info.value.errors


def erl(text, path="rabbitmq.config"):
    return parse_config(text, path)


def erl_errors(text, path="rabbitmq.config"):
    with pytest.raises(ConfigError) as info:
        parse_config(text, path)
    return info.value.errors


def rabbit(*entries):
    return "[{rabbit, [" + ", ".join(entries) + "]}].\n"


# ------------------------------------------------------------------ sizes

@pytest.mark.parametrize("text, expected", [
    # RabbitMQ 3.10.8's parse_information_unit answers these the same way.
    ("100", 100), ("1024MiB", 1073741824), ("2GB", 2000000000), ("4G", 4294967296), ("50MB", 50000000),
    ("1k", 1024), ("1K", 1024), ("1kB", 1000), ("1KB", 1000), ("1kiB", 1024), ("1kb", 1000),
    ("3M", 3 * 1024 ** 2), ("3m", 3 * 1024 ** 2), ("2Gb", 2000000000), ("7MIB", 7 * 1024 ** 2),
    # Units RabbitMQ accepts from 3.13 on (its memory guide: "4Gi", "1Ti"), as powers of 1024 or 1000.
    ("4Gi", 4 * 1024 ** 3), ("1Ki", 1024), ("1Mi", 1024 ** 2), ("1Ti", 1024 ** 4), ("1TiB", 1024 ** 4),
    ("1KiB", 1024), ("1TB", 10 ** 12), ("1PB", 10 ** 15), ("1PiB", 1024 ** 5), ("0", 0),
])
def test_information_units(text, expected):
    assert parse_information_unit(text) == expected


@pytest.mark.parametrize("text, reason", [
    ("1.5GB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '1.5GB'"),
    ("1 MB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '1 MB'"),
    ("1b", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '1b'"),
    ("MB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got 'MB'"),
    ("-1GB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '-1GB'"),
    ("10XB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '10XB'"),
    ("1T", "ambiguous unit in '1T': write TB (powers of 1000) or TiB (powers of 1024)"),
    ("1p", "ambiguous unit in '1p': write PB (powers of 1000) or PiB (powers of 1024)"),
])
def test_bad_information_units(text, reason):
    with pytest.raises(ValueError) as info:
        parse_information_unit(text)
    assert str(info.value) == reason


@pytest.mark.parametrize("text, expected", [
    # cuttlefish's bytesize (frame_max), as RabbitMQ 3.10.8 reads it: powers of 1024.
    ("100", 100), ("0", 0), ("10KB", 10240), ("10kb", 10240), ("1MB", 1048576), ("1GB", 1073741824),
    ("1gb", 1073741824),
])
def test_bytesize(text, expected):
    assert parse_bytesize(text) == expected


@pytest.mark.parametrize("text", ["10K", "10kB", "10Kb", "1KiB", "1TB", "10 KB", "10B", "x"])
def test_bad_bytesize(text):
    with pytest.raises(ValueError) as info:
        parse_bytesize(text)
    assert str(info.value) == ("expected an integer number of bytes, or one with KB, MB or GB (powers of 1024), "
                               f"got '{text}'")


# ------------------------------------------------------------------ new-style: every key

@pytest.mark.parametrize("line, expected", [
    ("listeners.tcp.default = 5673", {"port": 5673}),
    ("listeners.tcp.default = 127.0.0.1:5673", {"port": 5673, "host": "127.0.0.1"}),
    ("listeners.tcp.default = ::1:5673", {"port": 5673, "host": "::1"}),
    ("listeners.tcp.1 = 0.0.0.0:5674", {"port": 5674, "host": "0.0.0.0"}),
    ("listeners.tcp.default = 65535", {"port": 65535}),
    ("default_user = alice", {"default_user": "alice"}),
    ("default_pass = s3cret with spaces", {"default_pass": "s3cret with spaces"}),
    ("default_pass = a=b", {"default_pass": "a=b"}),
    ("default_vhost = /prod", {"default_vhost": "/prod"}),
    ("default_user_tags.monitoring = true", {"default_user_tags": ["monitoring"]}),
    ("default_user_tags.administrator = false", {"default_user_tags": []}),
    ("heartbeat = 30", {"heartbeat": 30}),
    ("heartbeat = 0", {"heartbeat": 0}),
    ("frame_max = 131072", {"frame_max": 131072}),
    ("frame_max = 64KB", {"frame_max": 65536}),
    ("frame_max = 0", {"frame_max": 0}),
    ("frame_max = 4096", {"frame_max": 4096}),
    ("channel_max = 100", {"channel_max": 100}),
    ("channel_max = 0", {"channel_max": 0}),
    ("max_message_size = 1048576", {"max_message_size": 1048576}),
    ("max_message_size = 512MiB", {"max_message_size": 536870912}),
    ("max_message_size = 1", {"max_message_size": 1}),
    ("handshake_timeout = 5000", {"handshake_timeout": 5.0}),
    ("handshake_timeout = infinity", {"handshake_timeout": math.inf}),
    ("vm_memory_high_watermark.relative = 0.6", {"vm_memory_high_watermark": ("relative", 0.6)}),
    ("vm_memory_high_watermark.relative = 1.0", {"vm_memory_high_watermark": ("relative", 1.0)}),
    ("vm_memory_high_watermark.relative = 0.0", {"vm_memory_high_watermark": ("relative", 0.0)}),
    # Above 1.0, as the seeds use it: 3 where total memory is unknown (1024 MB assumed), 100 never to alarm.
    ("vm_memory_high_watermark.relative = 3.0", {"vm_memory_high_watermark": ("relative", 3.0)}),
    ("vm_memory_high_watermark.relative = 100.0", {"vm_memory_high_watermark": ("relative", 100.0)}),
    ("vm_memory_high_watermark.absolute = 1073741824", {"vm_memory_high_watermark": ("absolute", 1073741824)}),
    ("vm_memory_high_watermark.absolute = 1024MiB", {"vm_memory_high_watermark": ("absolute", 1073741824)}),
    ("vm_memory_high_watermark.absolute = 4Gi", {"vm_memory_high_watermark": ("absolute", 4294967296)}),
    ("vm_memory_high_watermark_paging_ratio = 0.75", {"vm_memory_high_watermark_paging_ratio": 0.75}),
    ("disk_free_limit.absolute = 2GB", {"disk_free_limit": ("absolute", 2000000000)}),
    ("disk_free_limit.absolute = 50000", {"disk_free_limit": ("absolute", 50000)}),
    ("disk_free_limit.relative = 1.5", {"disk_free_limit": ("mem_relative", 1.5)}),
    ("management.tcp.port = 15673", {"management_port": 15673}),
    ("management.tcp.port = 0", {"management_port": 0}),
    ("management.tcp.ip = 0.0.0.0", {"management_host": "0.0.0.0"}),
    ("management.tcp.ip = ::1", {"management_host": "::1"}),
    ("management.http.max_body_size = 50000000", {"management_max_body_size": 50000000}),
    ("management.http.max_body_size = 0", {"management_max_body_size": 0}),
    ("prometheus.tcp.port = 15693", {"prometheus_port": 15693}),
    ("prometheus.tcp.port = 0", {"prometheus_port": 0}),
    ("prometheus.tcp.ip = 0.0.0.0", {"prometheus_host": "0.0.0.0"}),
    ("prometheus.tcp.ip = ::", {"prometheus_host": "::"}),
    ("prometheus.return_per_object_metrics = true", {"prometheus_per_object": True}),
    ("prometheus.return_per_object_metrics = false", {"prometheus_per_object": False}),
    ("log.console.level = debug", {"log_level": logging.DEBUG}),
    ("log.console.level = notice", {"log_level": logging.INFO + 5}),
    ("log.console.level = warning", {"log_level": logging.WARNING}),
    ("log.console.level = none", {"log_level": logging.CRITICAL + 10}),
    ("warren.queue_window = 1000", {"queue_window": 1000}),
])
def test_new_style_keys(line, expected):
    assert conf(line) == expected


@pytest.mark.parametrize("line, reason", [
    ("listeners.tcp.default = abc", "expected an integer, got 'abc'"),
    ("listeners.tcp.default = 70000", "expected a port number from 1 to 65535, got 70000"),
    ("listeners.tcp.default = 0", "expected a port number from 1 to 65535, got 0"),
    ("listeners.tcp.default = localhost:5672", "expected an IPv4 or IPv6 address, got 'localhost'"),
    ("listeners.tcp.default = [::1]:5672", "expected an IPv4 or IPv6 address, got '[::1]'"),
    ("listeners.tcp.default = 127.0.0.1:x", "expected an integer, got 'x'"),
    ("listeners.tcp = none", "'none' (no AMQP listener) is not supported: Warren always listens for AMQP"),
    ("listeners.tcp = 5672", "expected none or listeners.tcp.NAME = PORT, got '5672'"),
    ("default_user_tags.administrator = 1", "expected true or false, got '1'"),
    ("default_permissions.configure = (", "not a valid regular expression: '(' (missing ), unterminated "
                                          "subpattern at position 0)"),
    ("loopback_users.guest = yes", "expected true or false, got 'yes'"),
    ("loopback_users = all", "expected none (or loopback_users.NAME = true/false), got 'all'"),
    ("heartbeat = abc", "expected an integer, got 'abc'"),
    ("heartbeat = 60 extra", "expected an integer, got '60 extra'"),
    ("heartbeat = 1_000", "expected an integer, got '1_000'"),
    ("heartbeat = -1", "expected an integer from 0 to 65535, got -1"),
    ("heartbeat = 65536", "expected an integer from 0 to 65535, got 65536"),
    ("frame_max = 64kB", "expected an integer number of bytes, or one with KB, MB or GB (powers of 1024), "
                         "got '64kB'"),
    ("frame_max = 100", "expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got 100"),
    ("frame_max = 4GB", "expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got 4294967296"),
    ("channel_max = 70000", "expected an integer from 0 to 65535, got 70000"),
    ("max_message_size = 0", "expected a size in bytes from 1 to 536870912, got 0"),
    ("max_message_size = 536870913", "expected a size in bytes from 1 to 536870912, got 536870913"),
    ("max_message_size = 1GiB", "expected a size in bytes from 1 to 536870912, got 1073741824"),
    ("max_message_size = 12.5MB", "expected an integer number of bytes or one with a unit: 500MB, 500MiB, "
                                  "4Gi, 10GB, 2TB, got '12.5MB'"),
    ("handshake_timeout = 0", "expected a number of milliseconds from 1 to 4294967295, got 0"),
    ("handshake_timeout = forever", "expected an integer, got 'forever'"),
    ("vm_memory_high_watermark.relative = 1", "expected a float such as 0.4 (with a decimal point), got '1'"),
    ("vm_memory_high_watermark.relative = .4", "expected a float such as 0.4 (with a decimal point), got '.4'"),
    ("vm_memory_high_watermark.relative = -0.1", "expected a non-negative float such as 0.4, got -0.1"),
    ("vm_memory_high_watermark.absolute = 1.5GB", "expected an integer number of bytes or one with a unit: "
                                                  "500MB, 500MiB, 4Gi, 10GB, 2TB, got '1.5GB'"),
    ("vm_memory_high_watermark.absolute = 2T", "ambiguous unit in '2T': write TB (powers of 1000) or TiB "
                                               "(powers of 1024)"),
    ("vm_memory_high_watermark_paging_ratio = 1.0", "expected a float between 0 and 1 (both excluded), got 1.0"),
    ("vm_memory_high_watermark_paging_ratio = 0.0", "expected a float between 0 and 1 (both excluded), got 0.0"),
    ("vm_memory_high_watermark_paging_ratio = 0", "expected a float such as 0.4 (with a decimal point), got '0'"),
    ("disk_free_limit.absolute = 50 MB", "expected an integer number of bytes or one with a unit: 500MB, "
                                         "500MiB, 4Gi, 10GB, 2TB, got '50 MB'"),
    ("disk_free_limit.absolute = lots", "expected an integer number of bytes or one with a unit: 500MB, "
                                        "500MiB, 4Gi, 10GB, 2TB, got 'lots'"),
    ("disk_free_limit.relative = -1.0", "expected a non-negative float, got -1.0"),
    ("disk_free_limit.relative = 2", "expected a float such as 0.4 (with a decimal point), got '2'"),
    ("management.tcp.port = 99999", "expected a port number from 1 to 65535, got 99999"),
    ("management.tcp.port = http", "expected an integer, got 'http'"),
    ("management.tcp.ip = localhost", "expected an IPv4 or IPv6 address, got 'localhost'"),
    ("management.http.max_body_size = -1", "expected a non-negative number of bytes such as 10000000, got -1"),
    ("management.http.max_body_size = 10MiB", "expected a number of bytes (an integer such as 10000000, no unit), "
                                              "got '10MiB'"),
    ("management.http.max_body_size = 1e7", "expected a number of bytes (an integer such as 10000000, no unit), "
                                            "got '1e7'"),
    ("prometheus.tcp.port = 65536", "expected a port number from 1 to 65535, got 65536"),
    ("prometheus.tcp.port = none", "expected an integer, got 'none'"),
    ("prometheus.tcp.ip = localhost", "expected an IPv4 or IPv6 address, got 'localhost'"),
    ("prometheus.return_per_object_metrics = yes", "expected true or false, got 'yes'"),
    ("log.console.level = verbose", "expected one of debug, info, notice, warning, error, critical, alert, "
                                    "emergency, none, got 'verbose'"),
    ("log.console.level = DEBUG", "expected one of debug, info, notice, warning, error, critical, alert, "
                                  "emergency, none, got 'DEBUG'"),
    ("warren.queue_window = 0", "expected an integer from 1 to 2147483647, got 0"),
    ("warren.queue_window = many", "expected an integer, got 'many'"),
])
def test_new_style_bad_values(line, reason):
    key = line.split("=", 1)[0].strip()
    assert errors("# a comment", "", line) == [f"warren.conf:3: {key}: {reason}"]


@pytest.mark.parametrize("line, message", [
    ("nonsense.key = 1", "warren.conf:1: nonsense.key: unknown key"),
    ("hearbeat = 30", "warren.conf:1: hearbeat: unknown key (did you mean heartbeat?)"),
    ("listeners.tpc.default = 5672", "warren.conf:1: listeners.tpc.default: unknown key (did you mean "
                                     "listeners.tcp.default?)"),
    ("default_permissions.delete = .*", "warren.conf:1: default_permissions.delete: unknown key (did you mean "
                                        "default_permissions.write?)"),
    ("management.tcp.port.x = 1", "warren.conf:1: management.tcp.port.x: unknown key (did you mean "
                                  "management.tcp.port?)"),
    ("heartbeat 30", "warren.conf:1: syntax error: expected 'key = value', got 'heartbeat 30'"),
    ("heartbeat =", "warren.conf:1: syntax error: expected 'key = value', got 'heartbeat ='"),
    ("heartbeat = # nothing", "warren.conf:1: syntax error: expected 'key = value', got 'heartbeat ='"),
    ("= 30", "warren.conf:1: syntax error: expected 'key = value', got '= 30'"),
    ("loopback_users.a@b = true", "warren.conf:1: syntax error: expected 'key = value', got "
                                  "'loopback_users.a@b = true'"),
])
def test_new_style_unknown_keys_and_syntax(line, message):
    assert errors(line) == [message]


def test_new_style_comments_spaces_and_repeats():
    # '#' starts a comment anywhere (cuttlefish has no quoting); spaces around '=' and at the
    # ends are ignored; a later line for the same key wins.
    assert conf("  # comment", "heartbeat=7", "   heartbeat   =   8   # eight", "",
                "default_pass = 'a#b'", "default_user = \"x\"") == {
        "heartbeat": 8, "default_pass": "'a", "default_user": '"x"'}


def test_new_style_escaped_dot_in_a_name():
    assert conf(r"loopback_users.first\.last = true") == {"loopback_users": {"first.last"}}


def test_every_error_is_reported_with_its_line():
    assert errors("heartbeat = x", "default_user = ok", "nonsense = 1", "frame_max = 1") == [
        "warren.conf:1: heartbeat: expected an integer, got 'x'",
        "warren.conf:3: nonsense: unknown key",
        "warren.conf:4: frame_max: expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got 1",
    ]


def test_several_amqp_listeners():
    assert conf("listeners.tcp.default = 5673", "listeners.tcp.default = 5674") == {"port": 5674}
    assert conf("listeners.tcp.default = 5673", "listeners.tcp.other = 127.0.0.1:5674",
                "listeners.tcp.v6 = ::1:5673") == {
        "listeners": [(None, 5673), ("127.0.0.1", 5674), ("::1", 5673)]}
    assert erl(rabbit('{tcp_listeners, [5672, {"::1", 5673}]}')) == {"listeners": [(None, 5672), ("::1", 5673)]}


def test_default_user_tags_are_those_set_true():
    assert conf("default_user_tags.monitoring = true", "default_user_tags.policymaker = true",
                "default_user_tags.administrator = false") == {"default_user_tags": ["monitoring", "policymaker"]}


def test_default_permissions_need_all_three():
    assert conf("default_permissions.configure = ^c", "default_permissions.read = ^r",
                "default_permissions.write = ^w") == {"default_permissions": ("^c", "^w", "^r")}
    # RabbitMQ 3.10 cannot start with only some of them either (its translation fails).
    assert errors("heartbeat = 1", "default_permissions.configure = .*", "default_permissions.read = .*") == [
        "warren.conf:2: default_permissions.configure: default_permissions needs configure, read and write; "
        "missing: write"]


@pytest.mark.parametrize("lines, expected", [
    # RabbitMQ's translation: the users set to true, and nobody else (guest neither).
    (["loopback_users.guest = false"], set()),
    (["loopback_users.guest = true"], {"guest"}),
    (["loopback_users.alice = true", "loopback_users.bob = false"], {"alice"}),
    (["loopback_users = none"], set()),
    (["loopback_users.guest = true", "loopback_users = none"], set()),
])
def test_loopback_users(lines, expected):
    assert conf(*lines) == {"loopback_users": expected}


def test_absolute_and_relative_together_as_rabbitmq_3_10(caplog):
    warnings = []
    config = parse_config("vm_memory_high_watermark.absolute = 2GB\nvm_memory_high_watermark.relative = 0.5\n"
                          "disk_free_limit.relative = 2.0\ndisk_free_limit.absolute = 1GB\n", "w.conf", warnings)
    assert config == {"vm_memory_high_watermark": ("relative", 0.5), "disk_free_limit": ("mem_relative", 2.0)}
    assert warnings == [
        "w.conf: both vm_memory_high_watermark.absolute and vm_memory_high_watermark.relative are set: "
        "vm_memory_high_watermark.relative applies, as in RabbitMQ 3.10",
        "w.conf: both disk_free_limit.absolute and disk_free_limit.relative are set: "
        "disk_free_limit.relative applies, as in RabbitMQ 3.10"]


def test_empty_file():
    assert parse_config("", "empty.conf") == {}
    assert parse_config("# only a comment\n\n", "empty.conf") == {}


# ------------------------------------------------------------------ Erlang terms

def test_erlang_terms():
    term = parse_erlang_term(
        '%% a comment\n'
        '[{rabbit, [{a, "x" "y"}, {b, $\\^a}, {c, 16#ff}, {d, <<"\xe9">>}, {e, \'Quoted Atom\'},\n'
        '  {f, -1.5e-3}, {g, "tab\\there\\x41\\x{42}\\101"}, {h, <<"a", 66, "c"/utf8>>}, {i, $ }, % c\n'
        '  {j, 1_000}, {k, <<>>}, {l, {}}, {m, []}, {n, 2#101}, {o, +7}, {p, \'it\\\'s\'}, {q, $"}]}].\n')
    # As Erlang's file:consult/1 reads the same text.
    assert term == [(Atom("rabbit"), [
        (Atom("a"), "xy"), (Atom("b"), 1), (Atom("c"), 255), (Atom("d"), b"\xe9"), (Atom("e"), Atom("Quoted Atom")),
        (Atom("f"), -0.0015), (Atom("g"), "tab\thereABA"), (Atom("h"), b"aBc"), (Atom("i"), 32),
        (Atom("j"), 1000), (Atom("k"), b""), (Atom("l"), ()), (Atom("m"), []), (Atom("n"), 5), (Atom("o"), 7),
        (Atom("p"), Atom("it's")), (Atom("q"), 34)])]
    assert term.line == 2 and term[0].line == 2 and term[0][1][5].line == 3 and term[0][1][9].line == 4


def test_erlang_utf8_binary_and_format():
    assert parse_erlang_term('<<"\u00e9"/utf8>>.') == "\u00e9".encode()
    assert format_term(parse_erlang_term("[{a, <<\"x\">>, \"s\", 'Q a', 1.5, [1, 2], <<1, 2>>}].")) == \
        "[{a,<<\"x\">>,\"s\",'Q a',1.5,[1,2],<<1,2>>}]"


@pytest.mark.parametrize("text, line, message", [
    ("[{rabbit, [{heartbeat, 1}]}]", 1, "expected 'dot' but found the end of the file"),
    ("[{rabbit, [{heartbeat, 1}]}", 1, "expected ',' or ']' but found the end of the file"),
    ("[{rabbit,\n [{heartbeat 1}]}].", 2, "expected ',' or '}' but found '1'"),
    ("[{rabbit, [{heartbeat, Heartbeat}]}].", 1, "unexpected variable 'Heartbeat' (a config file holds data "
                                                 "only; atoms start with a lowercase letter or are quoted)"),
    ("[{rabbit, [{heartbeat, #{a => 1}}]}].", 1, "maps (#{...}) are not supported in a config file"),
    ("[{rabbit, [a | b]}].", 1, "improper lists ([H | T]) are not supported in a config file"),
    ('[{rabbit, [{default_user, "guest}]}].\n', 1, "unterminated string"),
    ("[{rabbit, [{'heartbeat, 1}]}].", 1, "unterminated quoted atom"),
    ("[{rabbit, [{heartbeat, 1}]}].\n[].", 2, "expected the end of the file after the term's '.' but found '['"),
    ("[{rabbit, [{heartbeat, 1}]}].x", 1, "unexpected character '.'"),
    ("\n\n[{rabbit, [{heartbeat, 1}]}] ; ", 3, "unexpected character ';'"),
    ("[{rabbit, [{x, <<a>>}]}].", 1, "expected a string or an integer in a binary but found 'a'"),
    ("[{rabbit, [{x, <<\"a\"/binary>>}]}].", 1, "unsupported binary segment type '/binary' (only /utf8 is)"),
    ("[{rabbit, [{x, 99#1}]}].", 1, "bad integer '99#1'"),
    ("[{rabbit, [{x, ,}]}].", 1, "expected a term but found ','"),
])
def test_erlang_syntax_errors(text, line, message):
    with pytest.raises(ErlangSyntaxError) as info:
        parse_erlang_term(text)
    assert (info.value.line, str(info.value)) == (line, message)
    assert erl_errors(text) == [f"rabbitmq.config:{line}: syntax error: {message}"]


# ------------------------------------------------------------------ Erlang format: every key

@pytest.mark.parametrize("entry, expected", [
    ("{tcp_listeners, [5673]}", {"port": 5673}),
    ('{tcp_listeners, [{"127.0.0.1", 5673}]}', {"port": 5673, "host": "127.0.0.1"}),
    ('{tcp_listeners, [{"::1", 5673}]}', {"port": 5673, "host": "::1"}),
    ("{tcp_listeners, [{{127,0,0,1}, 5673}]}", {"port": 5673, "host": "127.0.0.1"}),
    ('{default_user, <<"alice">>}', {"default_user": "alice"}),
    ('{default_user, "alice"}', {"default_user": "alice"}),
    ('{default_pass, <<"pw">>}', {"default_pass": "pw"}),
    ('{default_vhost, <<"/prod">>}', {"default_vhost": "/prod"}),
    ("{default_user_tags, [administrator, monitoring]}", {"default_user_tags": ["administrator", "monitoring"]}),
    ("{default_user_tags, []}", {"default_user_tags": []}),
    # The classic list is [Configure, Write, Read].
    ('{default_permissions, [<<"^c">>, <<"^w">>, <<"^r">>]}', {"default_permissions": ("^c", "^w", "^r")}),
    ('{loopback_users, [<<"guest">>, <<"alice">>]}', {"loopback_users": {"guest", "alice"}}),
    ("{loopback_users, []}", {"loopback_users": set()}),
    ("{heartbeat, 30}", {"heartbeat": 30}),
    ("{frame_max, 131072}", {"frame_max": 131072}),
    ("{channel_max, 16#ff}", {"channel_max": 255}),
    ("{max_message_size, 134217728}", {"max_message_size": 134217728}),
    ("{handshake_timeout, 2500}", {"handshake_timeout": 2.5}),
    ("{handshake_timeout, infinity}", {"handshake_timeout": math.inf}),
    ("{vm_memory_high_watermark, 0.4}", {"vm_memory_high_watermark": ("relative", 0.4)}),
    ("{vm_memory_high_watermark, 1}", {"vm_memory_high_watermark": ("relative", 1.0)}),
    ("{vm_memory_high_watermark, 100}", {"vm_memory_high_watermark": ("relative", 100.0)}),
    ("{vm_memory_high_watermark, {absolute, 1073741824}}", {"vm_memory_high_watermark": ("absolute", 1073741824)}),
    ('{vm_memory_high_watermark, {absolute, "1024MiB"}}', {"vm_memory_high_watermark": ("absolute", 1073741824)}),
    ('{vm_memory_high_watermark, {absolute, "4Gi"}}', {"vm_memory_high_watermark": ("absolute", 4294967296)}),
    ("{vm_memory_high_watermark_paging_ratio, 0.5}", {"vm_memory_high_watermark_paging_ratio": 0.5}),
    # Above 1.0: no paging (the seeds; the classic format has no schema to refuse it).
    ("{vm_memory_high_watermark_paging_ratio, 1.5}", {"vm_memory_high_watermark_paging_ratio": 1.5}),
    ("{disk_free_limit, 50000000}", {"disk_free_limit": ("absolute", 50000000)}),
    ('{disk_free_limit, "50MB"}', {"disk_free_limit": ("absolute", 50000000)}),
    ('{disk_free_limit, <<"2GB">>}', {"disk_free_limit": ("absolute", 2000000000)}),
    ('{disk_free_limit, {absolute, "1GiB"}}', {"disk_free_limit": ("absolute", 1073741824)}),
    ("{disk_free_limit, {mem_relative, 1.0}}", {"disk_free_limit": ("mem_relative", 1.0)}),
    ("{disk_free_limit, {mem_relative, 2}}", {"disk_free_limit": ("mem_relative", 2.0)}),
    ("{log, [{console, [{level, debug}]}]}", {"log_level": logging.DEBUG}),
    ("{log, [{console, [{level, error}]}]}", {"log_level": logging.ERROR}),
])
def test_erlang_rabbit_keys(entry, expected):
    assert erl(rabbit(entry)) == expected


@pytest.mark.parametrize("entry, key, reason", [
    ("{tcp_listeners, []}", "tcp_listeners", "[] (no AMQP listener) is not supported: Warren always listens for AMQP"),
    ("{tcp_listeners, 5672}", "tcp_listeners", 'expected a list of ports or {"IP", Port} tuples, got 5672'),
    ("{tcp_listeners, [70000]}", "tcp_listeners", "expected a port number from 1 to 65535, got 70000"),
    ('{tcp_listeners, [{"localhost", 5672}]}', "tcp_listeners", "expected an IPv4 or IPv6 address, got 'localhost'"),
    ("{tcp_listeners, [{a, b}]}", "tcp_listeners", 'expected a port or an {"IP", Port} tuple, got {a,b}'),
    ("{default_user, guest}", "default_user", 'expected a binary such as <<"guest">> or a string, got guest'),
    ("{default_pass, 123}", "default_pass", 'expected a binary such as <<"guest">> or a string, got 123'),
    ("{default_user_tags, administrator}", "default_user_tags",
     "expected a list of atoms such as [administrator], got administrator"),
    ('{default_user_tags, [<<"administrator">>]}', "default_user_tags",
     'expected a list of atoms such as [administrator], got [<<"administrator">>]'),
    ('{default_permissions, [<<".*">>, <<".*">>]}', "default_permissions",
     'expected [Configure, Write, Read] such as [<<".*">>, <<".*">>, <<".*">>], got [<<".*">>,<<".*">>]'),
    ('{default_permissions, [<<"(">>, <<".*">>, <<".*">>]}', "default_permissions",
     "not a valid regular expression: '(' (missing ), unterminated subpattern at position 0)"),
    ('{loopback_users, ["guest"]}', "loopback_users",
     'expected a list of binaries such as [<<"guest">>], got ["guest"]'),
    ("{loopback_users, none}", "loopback_users", 'expected a list of binaries such as [<<"guest">>], got none'),
    ("{heartbeat, 1.5}", "heartbeat", "expected an integer, got 1.5"),
    ('{heartbeat, "60"}', "heartbeat", 'expected an integer, got "60"'),
    ("{heartbeat, -1}", "heartbeat", "expected an integer from 0 to 65535, got -1"),
    ("{frame_max, 10}", "frame_max", "expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got 10"),
    ('{frame_max, "128KB"}', "frame_max", 'expected an integer, got "128KB"'),
    ("{channel_max, 65536}", "channel_max", "expected an integer from 0 to 65535, got 65536"),
    ("{max_message_size, 0}", "max_message_size", "expected a size in bytes from 1 to 536870912, got 0"),
    ("{handshake_timeout, never}", "handshake_timeout", "expected an integer, got never"),
    ("{vm_memory_high_watermark, -0.5}", "vm_memory_high_watermark",
     "expected a non-negative float such as 0.4, got -0.5"),
    ('{vm_memory_high_watermark, {absolute, "4Gx"}}', "vm_memory_high_watermark",
     "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '4Gx'"),
    ("{vm_memory_high_watermark, {relative, 0.4}}", "vm_memory_high_watermark",
     'expected a fraction such as 0.4 or {absolute, Bytes} such as {absolute, "1024MiB"}, got {relative,0.4}'),
    ("{vm_memory_high_watermark, {absolute, 1.5}}", "vm_memory_high_watermark",
     'expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB (as an integer or '
     'a string such as "2GB"), got 1.5'),
    ("{vm_memory_high_watermark_paging_ratio, 0.0}", "vm_memory_high_watermark_paging_ratio",
     "expected a positive float, got 0.0"),
    ("{vm_memory_high_watermark_paging_ratio, 1}", "vm_memory_high_watermark_paging_ratio",
     "expected a float such as 0.5, got 1"),
    ("{disk_free_limit, {mem_relative, -1.0}}", "disk_free_limit", "expected a non-negative float, got -1.0"),
    ("{disk_free_limit, {mem_relative, x}}", "disk_free_limit", "expected a number such as 0.4, got x"),
    ('{disk_free_limit, "50 MB"}', "disk_free_limit",
     "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got '50 MB'"),
    ("{disk_free_limit, -5}", "disk_free_limit",
     "expected an integer number of bytes or one with a unit: 500MB, 500MiB, 4Gi, 10GB, 2TB, got -5"),
    ("{disk_free_limit, 0.5}", "disk_free_limit",
     'expected bytes such as 50000000 or "50MB", or {mem_relative, Float}, got 0.5'),
    ("{log, [{console, [{level, verbose}]}]}", "log.console.level",
     "expected one of debug, info, notice, warning, error, critical, alert, emergency, none, got 'verbose'"),
    ('{log, [{console, [{level, "debug"}]}]}', "log.console.level",
     'expected one of debug, info, notice, warning, error, critical, alert, emergency, none, got "debug"'),
    ("{log, [{syslog, [{level, debug}]}]}", "log.syslog", "unknown key"),
    ("{log, console}", "log", "expected a list of {key, value} tuples, got console"),
    ("{hearbeat, 30}", "hearbeat", "unknown key (did you mean rabbit.heartbeat?)"),
    ("{cluster_name, <<\"x\">>}", "cluster_name", "unknown key"),
])
def test_erlang_rabbit_bad_values(entry, key, reason):
    text = "%% rabbitmq.config\n[\n {rabbit, [\n   {heartbeat, 10},\n   " + entry + "\n ]}\n].\n"
    assert erl_errors(text) == [f"rabbitmq.config:5: rabbit.{key}: {reason}"]


def test_erlang_management_and_warren_sections():
    assert erl('[{rabbitmq_management, [{tcp_config, [{port, 15673}, {ip, "0.0.0.0"}]}]}].') == {
        "management_port": 15673, "management_host": "0.0.0.0"}
    assert erl('[{rabbitmq_management, [{listener, [{port, 0}]}]}, {warren, [{queue_window, 500}]}].') == {
        "management_port": 0, "queue_window": 500}
    assert erl_errors('[{rabbitmq_management,\n  [{listener, [{port, 15673}, {ssl, true}]}]}].') == [
        "rabbitmq.config:2: rabbitmq_management.listener.ssl: unknown key"]
    assert erl_errors('[{rabbitmq_management, [{tcp_config, [{port, "15672"}]}]}].') == [
        'rabbitmq.config:1: rabbitmq_management.tcp_config.port: expected an integer, got "15672"']
    assert erl('[{rabbitmq_management, [{max_http_body_size, 20000000}]}].') == {
        "management_max_body_size": 20000000}
    assert erl_errors('[{rabbitmq_management, [{max_http_body_size, -1}]}].') == [
        "rabbitmq.config:1: rabbitmq_management.max_http_body_size: expected a non-negative number of bytes "
        "such as 10000000, got -1"]
    assert erl_errors('[{rabbitmq_management, [{max_http_body_size, infinity}]}].') == [
        "rabbitmq.config:1: rabbitmq_management.max_http_body_size: expected an integer, got infinity"]
    assert erl_errors('[{rabbitmq_management, [{max_body_size, 1}]}].') == [
        "rabbitmq.config:1: rabbitmq_management.max_body_size: unknown key (did you mean "
        "rabbitmq_management.max_http_body_size?)"]
    assert erl_errors('[{warren, [{queue_window, 0}]}].') == [
        "rabbitmq.config:1: warren.queue_window: expected an integer from 1 to 2147483647, got 0"]


def test_erlang_prometheus_section():
    assert erl('[{rabbitmq_prometheus, [{tcp_config, [{port, 15693}, {ip, "0.0.0.0"}]},\n'
               '                        {return_per_object_metrics, true}]}].') == {
        "prometheus_port": 15693, "prometheus_host": "0.0.0.0", "prometheus_per_object": True}
    assert erl('[{rabbitmq_prometheus, [{tcp_config, [{port, 0}]}]}].') == {"prometheus_port": 0}
    assert erl_errors('[{rabbitmq_prometheus, [{return_per_object_metrics, yes}]}].') == [
        "rabbitmq.config:1: rabbitmq_prometheus.return_per_object_metrics: expected true or false, got yes"]
    assert erl_errors('[{rabbitmq_prometheus, [{tcp_config, [{port, 70000}]}]}].') == [
        "rabbitmq.config:1: rabbitmq_prometheus.tcp_config.port: expected a port number from 1 to 65535, "
        "got 70000"]
    assert erl_errors('[{rabbitmq_prometheus, [{ssl_config, [{port, 15691}]}]}].') == [
        "rabbitmq.config:1: rabbitmq_prometheus.ssl_config: unknown key (did you mean "
        "rabbitmq_prometheus.tcp_config?)"]


def test_erlang_structure_errors():
    assert erl_errors("[{kernel, [{inet_dist_listen_min, 25672}]}].") == [
        "rabbitmq.config:1: kernel: unknown application (Warren reads rabbit, rabbitmq_management, "
        "rabbitmq_prometheus, rabbitmq_shovel, warren)"]
    assert erl_errors("{rabbit, []}.") == [
        "rabbitmq.config:1: expected a list of {application, [{key, value}]} tuples such as "
        "[{rabbit, [{heartbeat, 30}]}], got {rabbit,[]}"]
    assert erl_errors("[\n rabbit].") == [
        "rabbitmq.config:1: expected an {application, [{key, value}]} tuple, got rabbit"]
    assert erl_errors("[{rabbit,\n  heartbeat}].") == [
        "rabbitmq.config:1: rabbit: expected a list of {key, value} tuples, got heartbeat"]
    assert erl_errors("[{rabbit, [\n  {heartbeat, 1, 2}]}].") == [
        "rabbitmq.config:2: rabbit: expected a {key, value} tuple, got {heartbeat,1,2}"]


def test_erlang_every_error_is_reported():
    text = "[{rabbit, [\n {heartbeat, x},\n {channel_max, 5},\n {frame_max, 1}\n]},\n {nope, []}].\n"
    assert erl_errors(text) == [
        "rabbitmq.config:2: rabbit.heartbeat: expected an integer, got x",
        "rabbitmq.config:4: rabbit.frame_max: expected 0 (no limit) or a size from 4096 to 4294967295 bytes, got 1",
        "rabbitmq.config:6: nope: unknown application (Warren reads rabbit, rabbitmq_management, "
        "rabbitmq_prometheus, rabbitmq_shovel, warren)"]


def test_the_seed_example_from_the_issue():
    assert erl("[{rabbit, [{vm_memory_high_watermark, 0.4}, {disk_free_limit, {mem_relative, 1.0}}]}].") == {
        "vm_memory_high_watermark": ("relative", 0.4), "disk_free_limit": ("mem_relative", 1.0)}


def test_empty_erlang_config():
    assert erl("[].") == {}
    assert erl("%% nothing\n[{rabbit, []}].") == {}


# ------------------------------------------------------------------ format detection, files

@pytest.mark.parametrize("path, text, erlang", [
    ("rabbitmq.config", "", True),
    ("rabbitmq.conf", "[{rabbit, []}].", True),
    ("x", "%% classic\n\n  [{rabbit, []}].", True),
    ("rabbitmq.conf", "heartbeat = 1", False),
    ("rabbitmq.conf", "# [not erlang]\nheartbeat = 1", False),
    ("rabbitmq.conf", "", False),
])
def test_format_detection(path, text, erlang):
    assert is_erlang_format(path, text) is erlang


def test_load_config_files(tmp_path):
    new = tmp_path / "rabbitmq.conf"
    new.write_text("heartbeat = 5\n")
    classic = tmp_path / "rabbitmq.config"
    classic.write_text("[{rabbit, [{heartbeat, 6}]}].\n")
    assert load_config(str(new)) == {"heartbeat": 5}
    assert load_config(str(classic)) == {"heartbeat": 6}
    bad = tmp_path / "bad.conf"
    bad.write_text("heartbeat = 5\nheartbeat = five\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(bad))
    assert str(info.value) == f"{bad}:2: heartbeat: expected an integer, got 'five'"


def test_load_config_unreadable(tmp_path):
    missing = tmp_path / "missing.conf"
    with pytest.raises(ConfigError) as info:
        load_config(str(missing))
    assert str(info.value) == f"cannot read config file {missing}: No such file or directory"
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b"heartbeat = 5\n\xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(binary))
    assert str(info.value) == f"cannot read config file {binary}: not UTF-8 text (invalid start byte at byte 14)"


def test_load_config_logs_warnings(tmp_path, caplog):
    path = tmp_path / "w.conf"
    path.write_text("disk_free_limit.relative = 2.0\ndisk_free_limit.absolute = 1GB\n")
    with caplog.at_level(logging.WARNING, logger="warren.config"):
        assert load_config(str(path)) == {"disk_free_limit": ("mem_relative", 2.0)}
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: both disk_free_limit.absolute and disk_free_limit.relative are set: "
        "disk_free_limit.relative applies, as in RabbitMQ 3.10"]
