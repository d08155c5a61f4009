"""amqp_uri:parse as RabbitMQ 3.10.8's Erlang client does it (warren.amqp.uri), and its
errors as shovels print them (invalid_uri). Each expected text is what amqp_uri:parse of
RabbitMQ 3.10.8's amqp_client gave on Erlang/OTP 25, printed with "\"~s\" not a valid URI: ~p"
(rabbit_shovel_parameters:validate_uri), the stack trace's last frame being the caller's."""

import pytest

from warren.amqp.uri import FEDERATION_CALLER, Direct, Network, Unsupported, UriError, parse, remove_credentials
from warren.broker.parameter_validation import invalid_uri


def refused(uri: str, **kwargs) -> str:
    with pytest.raises(UriError) as err:
        parse(uri)
    return invalid_uri(uri, err.value.reason, **kwargs)


@pytest.mark.parametrize("uri,text", [
    ('amqp://h:notaport',
     '"amqp://h:notaport" not a valid URI: {{unable_to_parse_uri,\n'
     + " " * 39 + '{malformed_uri,"amqp://h:notaport",\n'
     + " " * 40 + "{'EXIT',\n"
     + " " * 41 + '{badarg,\n'
     + " " * 42 + '[{erlang,list_to_integer,\n'
     + " " * 44 + '["notaport"],\n'
     + " " * 44 + '[{error_info,\n'
     + " " * 46 + '#{module => erl_erts_errors}}]},\n'
     + " " * 43 + '{uri_parser,parse_host_port,1,\n'
     + " " * 44 + '[{file,"uri_parser.erl"},\n'
     + " " * 45 + '{line,100}]},\n'
     + " " * 43 + '{uri_parser,parse_authority,1,\n'
     + " " * 44 + '[{file,"uri_parser.erl"},\n'
     + " " * 45 + '{line,84}]},\n'
     + " " * 43 + '{uri_parser,parse_uri_rest,2,\n'
     + " " * 44 + '[{file,"uri_parser.erl"},\n'
     + " " * 45 + '{line,69}]},\n'
     + " " * 43 + '{uri_parser,parse,2,\n'
     + " " * 44 + '[{file,"uri_parser.erl"},\n'
     + " " * 45 + '{line,51}]},\n'
     + " " * 43 + '{amqp_uri,parse1,2,\n'
     + " " * 44 + '[{file,"amqp_uri.erl"},{line,74}]},\n'
     + " " * 43 + '{amqp_uri,parse,2,\n'
     + " " * 44 + '[{file,"amqp_uri.erl"},{line,67}]},\n'
     + " " * 43 + '{rabbit_shovel_parameters,\n'
     + " " * 44 + 'validate_uri,3,\n'
     + " " * 44 + '[{file,\n'
     + " " * 46 + '"rabbit_shovel_parameters.erl"},\n'
     + " " * 45 + '{line,181}]}]}}}},\n'
     + " " * 38 + '"amqp://h:notaport"}'
     ),
    ('amqps://u:p@/v',
     '"amqps://u:p@/v" not a valid URI: {{badrecord,\n'
     + " " * 36 + '{amqp_params_direct,<<"u">>,<<"p">>,\n'
     + " " * 37 + '<<"v">>,nonode@nohost,none,[]}},\n'
     + " " * 35 + '"amqps://u:p@/v"}'
     ),
    ('amqp:x',
     '"amqp:x" not a valid URI: {{case_clause,"x"},"amqp:x"}'
     ),
    ('amqp://h\tx?heartbeat=x',
     '"amqp://h\tx?heartbeat=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 50 + 'heartbeat,"x",\n'
     + " " * 50 + '[{"heartbeat","x"}],\n'
     + " " * 50 + '{not_an_integer,"x"}},\n'
     + " " * 49 + '"amqp://h\\tx?heartbeat=x"}'
     ),
    ('amqp://é?heartbeat=x',
     '"amqp://é?heartbeat=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 43 + 'heartbeat,"x",\n'
     + " " * 43 + '[{"heartbeat","x"}],\n'
     + " " * 43 + '{not_an_integer,"x"}},\n'
     + " " * 42 + '"amqp://é?heartbeat=x"}'
     ),
    ('amqp://h?auth_mechanism=A:b:end',
     '"amqp://h?auth_mechanism=A:b:end" not a valid URI: {{not_mechanism,\n'
     + " " * 53 + "['A',b,'end']},\n"
     + " " * 52 + '"amqp://h?auth_mechanism=A:b:end"}'
     ),
    ('amqp://u%-1@h',
     '"amqp://u%-1@h" not a valid URI: {badarg,"amqp://u%-1@h"}'
     ),
    ('ÀMQP://h',
     '"ÀMQP://h" not a valid URI: {{unexpected_uri_scheme,[227,128,109,113,112]},\n'
     + " " * 30 + '[195,128,77,81,80,58,47,47,104]}'
     ),
    ('amqp://h?%68eartbeat=x&frame_max=&heartbeat=1',
     '"amqp://h?%68eartbeat=x&frame_max=&heartbeat=1" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 67 + 'frame_max,\n'
     + " " * 67 + '[],\n'
     + " " * 67 + '[{"%68eartbeat",\n'
     + " " * 69 + '"x"},\n'
     + " " * 68 + '{"frame_max",\n'
     + " " * 69 + '[]},\n'
     + " " * 68 + '{"heartbeat",\n'
     + " " * 69 + '"1"}],\n'
     + " " * 67 + '{not_an_integer,\n'
     + " " * 68 + '[]}},\n'
     + " " * 66 + '"amqp://h?%68eartbeat=x&frame_max=&heartbeat=1"}'
     ),
    ('amqps://h?cacertfile=%zz',
     '"amqps://h?cacertfile=%zz" not a valid URI: {{invalid_ssl_parameter,\n'
     + " " * 46 + 'cacertfile,"%zz",\n'
     + " " * 46 + '[{"cacertfile","%zz"}],\n'
     + " " * 46 + "{invalid_entitiy,['%',122,122]}},\n"
     + " " * 45 + '"amqps://h?cacertfile=%zz"}'
     ),
    ('amqp://?username=x',
     '"amqp://?username=x" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 40 + 'username,"x",\n'
     + " " * 40 + '[{"username","x"}],\n'
     + " " * 40 + '{parameter_unconfigurable_in_query,\n'
     + " " * 41 + 'username,"x"}},\n'
     + " " * 39 + '"amqp://?username=x"}'
     ),
    ('amqp://h?heartbeat=x&heartbeat=5',
     '"amqp://h?heartbeat=x&heartbeat=5" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 54 + 'heartbeat,"x",\n'
     + " " * 54 + '[{"heartbeat","x"},\n'
     + " " * 55 + '{"heartbeat","5"}],\n'
     + " " * 54 + '{not_an_integer,"x"}},\n'
     + " " * 53 + '"amqp://h?heartbeat=x&heartbeat=5"}'
     ),
    ('amqp://h/%a',
     '"amqp://h/%a" not a valid URI: {{unterminated_entity,[\'%\',97]},"amqp://h/%a"}'
     ),
    ('amqp://[]:5',
     '"amqp://[]:5" not a valid URI: {port_requires_host,"amqp://[]:5"}'
     ),
    ('://h',
     '"://h" not a valid URI: {{unexpected_uri_scheme,[]},"://h"}'
     ),
    ('amqps://h?fail_if_no_peer_cert=Maybe',
     '"amqps://h?fail_if_no_peer_cert=Maybe" not a valid URI: {{invalid_ssl_parameter,\n'
     + " " * 58 + 'fail_if_no_peer_cert,\n'
     + " " * 58 + '"Maybe",\n'
     + " " * 58 + '[{"fail_if_no_peer_cert",\n'
     + " " * 60 + '"Maybe"}],\n'
     + " " * 58 + '{require_boolean,\n'
     + " " * 59 + "'Maybe'}},\n"
     + " " * 57 + '"amqps://h?fail_if_no_peer_cert=Maybe"}'
     ),
    ('amqp://h?&heartbeat=x&',
     '"amqp://h?&heartbeat=x&" not a valid URI: {{invalid_amqp_params_parameter,\n'
     + " " * 44 + 'heartbeat,"x",\n'
     + " " * 44 + '[[],{"heartbeat","x"},[]],\n'
     + " " * 44 + '{not_an_integer,"x"}},\n'
     + " " * 43 + '"amqp://h?&heartbeat=x&"}'
     ),
], ids=range(17))
def test_amqp_uris_refusal_as_rabbitmq_prints_it(uri, text):
    assert refused(uri) == text


def test_the_stack_trace_ends_at_its_caller():
    """A non-numeric port's list_to_integer crash: federation's validate_uri/2, not the shovel's."""
    assert refused("amqps://h:", caller=FEDERATION_CALLER).endswith(
        "{rabbit_federation_parameters,\n"
        + " " * 37 + "validate_uri,2,\n"
        + " " * 37 + "[{file,\n"
        + " " * 39 + '"rabbit_federation_parameters.erl"},\n'
        + " " * 38 + "{line,99}]}]}}}},\n"
        + " " * 31 + '"amqps://h:"}')


def test_a_direct_uri_names_the_node_in_amqps_badrecord():
    with pytest.raises(UriError) as err:
        parse("amqps://", node="rabbit@my-host")
    assert invalid_uri("amqps://", err.value.reason) == (
        '"amqps://" not a valid URI: {{badrecord,\n' + " " * 33 + "{amqp_params_direct,none,none,<<\"/\">>,\n"
        + " " * 37 + "'rabbit@my-host',none,[]}},\n" + " " * 29 + '"amqps://"}')


@pytest.mark.parametrize("uri,endpoint", [
    # userinfo split on every ":", the first two parts used; guest/guest the record's defaults
    ("amqp://a:b:c@h", Network("h", 5672, "/", "a", "b")),
    ("amqp://u@h", Network("h", 5672, "/", "u", "guest")),
    ("amqp://:@h", Network("h", 5672, "/", "", "")),
    ("amqp://u%+f@h", Network("h", 5672, "/", "u\x0f")),  # (list_to_integer("+f", 16))
    # ?password= overrides the userinfo's, taken raw (not percent-decoded)
    ("amqp://guest:wrong@h?password=guest", Network("h", 5672, "/", "guest", "guest")),
    ("amqp://h?password=a%40b", Network("h", 5672, "/", password="a%40b")),
    # the first of a repeated key; a key without "=" ignored, and so are escaped keys
    ("amqp://h?heartbeat=5&heartbeat=x", Network("h", 5672, "/", heartbeat=5)),
    ("amqp://h?heartbeat&%68eartbeat=x&channel_max=-3", Network("h", 5672, "/", channel_max=-3)),
    ("amqp://h:+80/%2f#/a/b?heartbeat=x", Network("h", 80, "/")),
    ("amqp://[::1]x:5673", Network("::1", 5673, "/")),  # (uri_parser takes what follows the first ":")
    ("amqp://h?auth_mechanism=amqp_auth_mechanisms:external&auth_mechanism=plain",
     Network("h", 5672, "/", mechanisms=("external", "plain"))),
    ("amqps://h?cacertfile=/a%20b&verify=verify_peer&fail_if_no_peer_cert=true&password=k%40"
     "&server_name_indication=disable&depth=3&verify=x",
     Network("h", 5671, "/", password="k%40", tls={"cacertfile": "/a b", "verify": "verify_peer",
                                                    "fail_if_no_peer_cert": True, "password": "k@",
                                                    "server_name_indication": "disable", "depth": 3})),
    ("amqp://@", Direct("/")),
    ("amqp://?heartbeat=x&password=p", Direct("/")),  # (heartbeat: no field of amqp_params_direct)
])
def test_what_a_uri_names(uri, endpoint):
    assert parse(uri) == endpoint


@pytest.mark.parametrize("uri,text", [
    ("amqp://h?auth_mechanism=x", 'auth_mechanism "x"'),
    ("amqp://h?auth_mechanism=PLAIN", 'auth_mechanism "PLAIN"'),
    ("amqp://h?auth_mechanism=plain&auth_mechanism=mymod:plain", 'auth_mechanism "mymod:plain"'),
    ("amqp://h?auth_mechanism=amqp_auth_mechanisms:crdemo", 'auth_mechanism "amqp_auth_mechanisms:crdemo"'),
    ("amqp://h%-1", "the host has an escape that is not a byte"),
])
def test_what_warren_refuses_on_purpose(uri, text):
    """amqp_uri takes these; RabbitMQ's shovel then fails at connect. Warren says why at once."""
    with pytest.raises(UriError) as err:
        parse(uri)
    assert isinstance(err.value.reason, Unsupported) and err.value.reason.startswith(text)
    assert invalid_uri(uri, err.value.reason) == f'"{uri}" not a valid URI: {err.value.reason}'


@pytest.mark.parametrize("uri,shown", [
    ("amqp://u:p@[::1]:5672/v?x=1", "amqp://::1:5672/v"),
    ("amqp://u:p@h:+80/%2f?x=1#f", "amqp://h:80/%2f"),
    ("amqp://guest:guest@/%2f", "amqp:///%2f"),
    ("AMQP://h", "AMQP://h"),
])
def test_remove_credentials(uri, shown):
    assert remove_credentials(uri) == shown
