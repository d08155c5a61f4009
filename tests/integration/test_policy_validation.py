"""Policy and operator policy definitions as RabbitMQ 3.10 validates them, key by key
(rabbit_policies, rabbit_mirror_queue_misc with ha-params per ha-mode,
rabbit_queue_location_validator): the same refusals and texts through the management API
(PUT /api/policies, /api/operator-policies, POST /api/definitions) and warrenctl
(set_policy, set_operator_policy: rabbitmqctl's output and exit code).

The texts are RabbitMQ 3.10.8's, taken from a node with the management plugin: run there with
`python tools/rabbitmq_node.py run --plugins rabbitmq_management -- python -m pytest -q
tests/integration/test_policy_validation.py` (warrenctl then talks to that node's API, and
rabbitmqctl's own output is compared with warrenctl's); without its management API (CI's
first node) the module is skipped.
"""

import html
import json
import os
import shlex
import subprocess
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import EXTERNAL

from .http_api import HttpApi, q
from warrenctl_path import WARRENCTL

MGMT = os.environ.get("WARREN_TEST_MGMT")
RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT,
                                reason="the comparison RabbitMQ node has no management plugin")
warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="RabbitMQ fails on these (500, a crash or a hang)")

LONG = "a" * 27
# (definition, RabbitMQ's text): one or more malformed values of each key a policy may set.
POLICY_CASES = [
    ({"alternate-exchange": 1}, "1 is not a valid alternate exchange name"),
    ({"dead-letter-exchange": ["x"]}, '[<<"x">>] is not a valid dead letter exchange name'),
    ({"dead-letter-routing-key": True}, "true is not a valid dead letter routing key"),
    ({"dead-letter-strategy": "at-least-twice"}, '<<"at-least-twice">> is not a valid dead letter strategy'),
    ({"message-ttl": -1}, "-1 is not a valid message TTL"),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"max-length": 1.5}, "1.5 is not a valid maximum length"),
    ({"max-length-bytes": "10"}, '<<"10">> is not a valid maximum length in bytes'),
    ({"max-in-memory-length": -5}, "-5 is not a valid maximum memory in bytes"),
    ({"max-in-memory-bytes": None}, "null is not a valid maximum memory in bytes"),
    ({"queue-mode": "eager"}, '<<"eager">> is not a valid queue-mode value'),
    ({"queue-version": 3}, "3 is not a valid queue-version value"),
    ({"queue-version": "1"}, '<<"1">> is not a valid queue-version value'),
    ({"overflow": "drop-tail"}, '<<"drop-tail">> is not a valid overflow value'),
    ({"delivery-limit": -1}, "-1 is not a valid delivery limit"),
    ({"max-age": "1x"}, '<<"1x">> is not a valid max age'),
    ({"max-age": "0D"}, '<<"0D">> is not a valid max age'),
    ({"max-age": "1d"}, '<<"1d">> is not a valid max age'),
    ({"max-age": "7D "}, '<<"7D ">> is not a valid max age'),
    ({"max-age": "1x\n\t"}, '<<"1x\\n\\t">> is not a valid max age'),
    ({"max-age": "1x\u0001"}, "<<49,120,1>> is not a valid max age"),
    ({"queue-leader-locator": "least-busy"}, '<<"least-busy">> is not a valid queue leader locator value'),
    ({"initial-cluster-size": -1}, "-1 is not a valid cluster size"),
    ({"initial-cluster-size": "3"}, '<<"3">> is not a valid cluster size'),
    ({"stream-max-segment-size-bytes": 3_000_000_001}, "3000000001 is not a valid segment size"),
    ({"stream-max-segment-size-bytes": -1}, "-1 is not a valid segment size"),
    ({"queue-master-locator": "closest"}, '<<"closest">> invalid queue-master-locator value'),
    ({"queue-master-locator": 5}, "5 invalid queue-master-locator value"),
    ({"queue-master-locator": False}, "false invalid queue-master-locator value"),
    # ha-mode, then ha-params as the mode takes them (none for all, a positive integer for
    # exactly, a non-empty list of node names for nodes), then the other ha- keys.
    ({"ha-mode": "some"}, '<<"some">> is not a valid ha-mode value'),
    ({"ha-mode": "all", "ha-params": 2}, 'ha-mode="all" does not take parameters'),
    ({"ha-mode": "all", "ha-params": None}, 'ha-mode="all" does not take parameters'),
    ({"ha-mode": "exactly"}, 'ha-mode="exactly" takes an integer, none given'),
    ({"ha-mode": "exactly", "ha-params": 0}, 'ha-mode="exactly" takes an integer, 0 given'),
    ({"ha-mode": "exactly", "ha-params": "2"}, 'ha-mode="exactly" takes an integer, <<"2">> given'),
    ({"ha-mode": "nodes"}, 'ha-mode="nodes" takes a list, none given'),
    ({"ha-mode": "nodes", "ha-params": []}, 'ha-mode="nodes" list must be non-empty'),
    ({"ha-mode": "nodes", "ha-params": "rabbit@a"}, 'ha-mode="nodes" takes a list, <<"rabbit@a">> given'),
    ({"ha-mode": "nodes", "ha-params": ["rabbit@a", 1, 2]},
     'ha-mode="nodes" takes a list of strings, [1,2] was not a string'),
    ({"ha-mode": "nodes", "ha-params": ["rabbit@a", 65, 66]},
     'ha-mode="nodes" takes a list of strings, "AB" was not a string'),
    ({"ha-mode": "all", "ha-sync-mode": "auto"}, 'ha-sync-mode must be "manual" or "automatic", got <<"auto">>'),
    ({"ha-mode": "all", "ha-sync-batch-size": 0}, "ha-sync-batch-size takes an integer greater than 0, 0 given"),
    ({"ha-mode": "all", "ha-promote-on-shutdown": "never"},
     'ha-promote-on-shutdown must be "always" or "when-synced", got <<"never">>'),
    ({"ha-mode": "all", "ha-promote-on-failure": 1}, 'ha-promote-on-failure must be "always" or "when-synced", got 1'),
    ({"ha-sync-mode": "manual"}, "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"),
    ({"ha-params": 1, "ha-promote-on-failure": "always"},
     "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"),
    # Which error of several: queue-master-locator's validator runs first, then the core keys'
    # (in key order), then the ha- keys'; keys none knows come last, all together.
    ({"ha-mode": "x", "max-length": -1, "queue-master-locator": "x", "zz": 1},
     '<<"x">> invalid queue-master-locator value'),
    ({"message-ttl": -1, "max-length": -2}, "-2 is not a valid maximum length"),
    ({"ha-mode": "x", "zz": 1}, '<<"x">> is not a valid ha-mode value'),
    ({"zz": 1, "max-length": 1, "another": "a"},
     '[{<<"another">>,<<"a">>},{<<"zz">>,1}] are not recognised policy settings'),
    ({"shards-per-node": 2},  # (a plugin's key - rabbitmq_sharding's: not without the plugin)
     '[{<<"shards-per-node">>,2}] are not recognised policy settings'),
    # ~p breaks a term that does not fit on its line; it prints a list of printable
    # integers as a string; a value's bytes come back as UTF-8 over HTTP.
    ({"ha-mode": "all", "zz": 1, "yy": [65, 66], "xx": {"a": [1]}, LONG: "b" * 44},
     f'[{{<<"{LONG}">>,\n  <<"{"b" * 44}">>}},\n {{<<"xx">>,#{{<<"a">> => [1]}}}},\n {{<<"yy">>,"AB"}},\n'
     ' {<<"zz">>,1}] are not recognised policy settings'),
    ({"max-age": "1x\u00e9"}, '<<"1x\u00e9">> is not a valid max age'),
]

# An operator policy takes fewer keys: the others are not recognised at all.
OPERATOR_CASES = [
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"message-ttl": "1"}, '<<"1">> is not a valid message TTL'),
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"max-length-bytes": 1.0}, "1.0 is not a valid maximum length in bytes"),
    ({"max-in-memory-length": -1, "zz": 1}, "-1 is not a valid maximum memory in bytes"),
    ({"max-in-memory-bytes": -1}, "-1 is not a valid maximum memory in bytes"),
    ({"delivery-limit": "a", "max-age": "1D"}, '<<"a">> is not a valid delivery limit'),
    ({"max-age": "1D"}, '[{<<"max-age">>,<<"1D">>}] are not recognised policy settings'),
    ({"ha-mode": "all"}, '[{<<"ha-mode">>,<<"all">>}] are not recognised policy settings'),
    ({"alternate-exchange": "ae", "overflow": "drop-head"},
     '[{<<"alternate-exchange">>,<<"ae">>},{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings'),
]

# Values at the edges of what RabbitMQ takes.
ACCEPTED = [
    {"max-age": "01s"},
    {"max-age": "1s\nthe rest of the text"},  # (its unit ends at the end of the first line)
    {"max-age": "1Y", "stream-max-segment-size-bytes": 3_000_000_000, "initial-cluster-size": 0},
    {"queue-leader-locator": "random"}, {"queue-leader-locator": "least-leaders"},
    {"queue-master-locator": "min-masters"},
    {"queue-master-locator": ["min-", "masters"]},  # (RabbitMQ joins a list of strings)
    {"queue-version": 2, "queue-mode": "lazy", "overflow": "reject-publish-dlx", "expires": 1, "message-ttl": 0},
    {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic", "ha-sync-batch-size": 1},
    {"ha-mode": "nodes", "ha-params": ["rabbit@a", "rabbit@b"], "ha-promote-on-shutdown": "always",
     "ha-promote-on-failure": "when-synced"},
]


# Errors of two validator modules at once (rabbit_policies', rabbit_mirror_queue_misc's): which
# one RabbitMQ reports follows its registry's hash set of modules, which differs between nodes
# with different plugins (CI's management node with the shovel plugins reports the ha-mode
# error, a node with management alone the max-length one). Warren's order is fixed (the core
# keys first): checked on Warren only.
NODE_DEPENDENT = [({"ha-mode": "x", "max-length": -1}, "-1 is not a valid maximum length")]


def _id(case) -> str:
    return json.dumps(case[0] if isinstance(case, tuple) else case)[:60]


def _cases(cases: list, node_dependent: list) -> list:
    """pytest params of `cases`, and of `node_dependent` on Warren only."""
    return ([pytest.param(*c, id=_id(c)) for c in cases]
            + [pytest.param(*c, id=_id(c), marks=pytest.mark.skipif(
                bool(EXTERNAL), reason="which error RabbitMQ reports depends on the node's plugins"))
               for c in node_dependent])


class Api(HttpApi):
    def __init__(self, base: str):
        super().__init__(base)
        self.paths: list[str] = []

    def put_policy(self, kind: str, name: str, definition) -> requests.Response:
        path = f"/{kind}/%2F/{q(name)}"
        self.paths.append(path)
        return self.call("PUT", path, {"pattern": "^pv-", "definition": definition, "apply-to": "queues"})

    def clean(self) -> None:
        for path in self.paths:
            self.call("DELETE", path)


@pytest.fixture
def api(broker):
    a = Api(MGMT if EXTERNAL else broker.api)
    yield a
    a.clean()


def _refused(reason: str) -> dict:
    return {"error": "bad_request", "reason": reason}


# ----------------------------------------------------------------------- HTTP API
@pytest.mark.parametrize("definition, text", _cases(POLICY_CASES, NODE_DEPENDENT))
def test_policy_refused_over_the_api(api, uid, definition, text):
    r = api.put_policy("policies", f"pv-{uid}", definition)
    # /api/policies HTML-escapes its validation texts.
    assert (r.status_code, r.json()) == (400, _refused(html.escape(f"Validation failed\n\n{text}\n", quote=False)))
    assert api.call("GET", f"/policies/%2F/pv-{uid}").status_code == 404


@pytest.mark.parametrize("definition, text", OPERATOR_CASES, ids=[_id(c) for c in OPERATOR_CASES])
def test_operator_policy_refused_over_the_api(api, uid, definition, text):
    r = api.put_policy("operator-policies", f"pv-{uid}", definition)
    assert (r.status_code, r.json()) == (400, _refused(f"Validation failed\n\n{text}\n"))  # (not escaped)
    assert api.call("GET", f"/operator-policies/%2F/pv-{uid}").status_code == 404


@pytest.mark.parametrize("definition", ACCEPTED, ids=[_id(c) for c in ACCEPTED])
def test_values_at_the_edges_are_taken(api, uid, definition):
    assert api.put_policy("policies", f"pv-{uid}", definition).status_code == 201
    assert api.ok("GET", f"/policies/%2F/pv-{uid}").json()["definition"] == definition


def test_import_refuses_a_bad_policy_with_where_it_is(broker, api, uid, tmp_path):
    """As the API's PUT, with " (vhost/name)" added and the whole text HTML-escaped; an operator
    policy, a runtime parameter, with " (vhost/component/name)". warrenctl's import_definitions
    shows the text as rabbitmqctl's does, escaped, and exits with 69."""
    name = f"pv-{uid}"
    policy = {"vhost": "/", "name": name, "pattern": "^pv-", "apply-to": "bogus", "priority": 0,
              "definition": {"max-age": "1x", "max-length": -1}}
    text = html.escape('Validation failed\n\n<<"1x">> is not a valid max age\n'
                       f"apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'\n (//{name})",
                       quote=False)
    r = api.call("POST", "/definitions", {"policies": [policy]})
    assert (r.status_code, r.json()) == (400, _refused(text))
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"policies": [policy]}))
    commands = [[WARRENCTL, "--port", str(_mgmt_port(broker))]]
    if EXTERNAL and RABBITMQCTL:
        commands.append(shlex.split(RABBITMQCTL))
    for command in commands:
        r = subprocess.run([*command, "import_definitions", str(path)], capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (
            69, f'Importing definitions in JSON from a file at "{path}" ...\n', f"Error:\n{text}\n"), r
    parameter = {"vhost": "/", "component": "operator_policy", "name": name,
                 "value": {"pattern": "^pv-", "definition": {"max-age": "1x"}, "priority": 0, "apply-to": "queues"}}
    r = api.call("POST", "/definitions", {"parameters": [parameter]})
    assert (r.status_code, r.json()) == (400, _refused(html.escape(
        f'Validation failed\n\n[{{<<"max-age">>,<<"1x">>}}] are not recognised policy settings\n'
        f" (//operator_policy/{name})", quote=False)))
    assert api.call("GET", f"/policies/%2F/{name}").status_code == 404
    assert api.call("GET", f"/operator-policies/%2F/{name}").status_code == 404


@warren_only
@pytest.mark.parametrize("definition, text", [
    # RabbitMQ's check_max_age fails (500) on a value that does not start with a digit or is
    # not a string; it takes a list of strings, which its streams then fail on (osiris'
    # retention crashes).
    ({"max-age": ""}, "<<>> is not a valid max age"),
    ({"max-age": "x"}, '<<"x">> is not a valid max age'),
    ({"max-age": 5}, "5 is not a valid max age"),
    ({"max-age": ["1", "s"]}, '[<<"1">>,<<"s">>] is not a valid max age'),
    ({"ha-mode": 5}, "5 is not a valid ha-mode value"),  # (RabbitMQ: 500)
    # RabbitMQ's validator never returns for these (it loops): refused here.
    ({"queue-master-locator": 1.5}, "1.5 invalid queue-master-locator value"),
    ({"queue-master-locator": {"a": 1}}, '#{<<"a">> => 1} invalid queue-master-locator value'),
], ids=["empty", "no-digits", "number", "iolist", "ha-mode-number", "float", "object"])
def test_values_rabbitmq_fails_on_are_refused(api, uid, definition, text):
    r = api.put_policy("policies", f"pv-{uid}", definition)
    assert (r.status_code, r.json()) == (400, _refused(html.escape(f"Validation failed\n\n{text}\n", quote=False)))


# ----------------------------------------------------------------------- warrenctl
def _mgmt_port(broker) -> int:
    return urllib.parse.urlsplit(MGMT).port if EXTERNAL else broker.mgmt_port


def _set(command: list[str], kind: str, name: str, definition: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*command, f"set_{kind}", name, "^pv-", json.dumps(definition), "--apply-to", "queues"],
                          capture_output=True, text=True, timeout=60)


def _ctl_text(text: str) -> str:
    """A text as rabbitmqctl shows it: Erlang's characters, one per byte of the UTF-8."""
    return text.encode().decode("latin-1")


def _expect_ctl(r: subprocess.CompletedProcess, what: str, name: str, definition: dict, text: str) -> None:
    info = (f'Setting {what} "{name}" for pattern "^pv-" to "{json.dumps(definition)}" with priority "0" '
            'for vhost "/" ...\n')
    assert (r.returncode, r.stdout, r.stderr) == (
        69, info, f"Error:\nValidation failed\n\n{_ctl_text(text)}\n\n"), r


@pytest.mark.parametrize("definition, text", _cases(POLICY_CASES, NODE_DEPENDENT))
def test_warrenctl_set_policy_refuses(broker, api, uid, definition, text):
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    name = f"pv-{uid}"
    r = _set([WARRENCTL, "--port", str(_mgmt_port(broker))], "policy", name, definition)
    _expect_ctl(r, "policy", name, definition, text)


@pytest.mark.parametrize("definition, text", OPERATOR_CASES, ids=[_id(c) for c in OPERATOR_CASES])
def test_warrenctl_set_operator_policy_refuses(broker, api, uid, definition, text):
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    name = f"pv-{uid}"
    r = _set([WARRENCTL, "--port", str(_mgmt_port(broker))], "operator_policy", name, definition)
    _expect_ctl(r, "operator policy override", name, definition, text)


@pytest.mark.skipif(not (EXTERNAL and RABBITMQCTL), reason="rabbitmqctl itself, on a RabbitMQ node")
def test_rabbitmqctl_says_what_warrenctl_says(uid):
    """The reference for the two tests above: rabbitmqctl's own output for a sample of the
    cases (each run starts an Erlang VM: a few, in parallel)."""
    ctl = shlex.split(RABBITMQCTL or "")
    def case(cases, definition):
        return next(c for c in cases if c[0] == definition)

    policies = [case(POLICY_CASES, {"max-age": "1x"}), case(POLICY_CASES, {"ha-mode": "exactly"}),
                case(POLICY_CASES, {"ha-mode": "nodes", "ha-params": ["rabbit@a", 65, 66]}),
                POLICY_CASES[-2], POLICY_CASES[-1]]  # (a text across lines; one with an "é")
    sample = [("policy", "policy", d, t) for d, t in policies]
    sample += [("operator_policy", "operator policy override", d, t)
               for d, t in (case(OPERATOR_CASES, {"max-age": "1D"}), case(OPERATOR_CASES, {"expires": 0}))]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: _set(ctl, c[0], f"pv-{uid}", c[2]), sample))
    for (_kind, what, definition, text), r in zip(sample, results):
        _expect_ctl(r, what, f"pv-{uid}", definition, text)
