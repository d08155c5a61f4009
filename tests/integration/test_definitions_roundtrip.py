"""Definitions round trip: a RabbitMQ 3.10.8 export imported into Warren (POST
/api/definitions) comes back from GET /api/definitions as it was, and survives a restart.

The fixtures are real exports of a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py with the
management plugin), made after creating, through its API, vhosts with descriptions and tags
(and, with `rabbitmqctl add_vhost --default-queue-type quorum`, one with a default queue
type), users, permissions, topic permissions with {username}/{vhost} patterns, exchanges,
queues with assorted arguments (numbers, strings, booleans, floats, lists, tables), bindings
(e→q, e→e, with arguments), a policy and an operator policy:

- tests/data/rabbitmq-3.10.8-rabbitmqctl-definitions.json: `rabbitmqctl export_definitions`,
  which keeps the vhosts' metadata (description, tags, default_queue_type) and the queues'
  type, but leaves out internal exchanges and the exchanges' "internal" key;
- tests/data/rabbitmq-3.10.8-api-definitions.json: GET /api/definitions, which gives vhosts by
  name only and no queue type.

Fields one RabbitMQ export has and the other does not (which RabbitMQ itself would not round
trip through the other) are the only extras allowed in Warren's export; rabbit_version and
the global parameter internal_cluster_id are not compared.

The tests about what an import does to vhosts (the importing user's permissions, metadata
replaced) also run against RabbitMQ with WARREN_TEST_MGMT; the round trips are Warren's.
"""

import copy
import json
import os
import signal
import uuid
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, password_hash, start_broker

MGMT = os.environ.get("WARREN_TEST_MGMT")
DATA = Path(__file__).resolve().parent.parent / "data"
CTL_EXPORT = DATA / "rabbitmq-3.10.8-rabbitmqctl-definitions.json"
API_EXPORT = DATA / "rabbitmq-3.10.8-api-definitions.json"

SECTIONS = {  # section -> the fields that identify an object in it
    "users": ("name",), "vhosts": ("name",), "permissions": ("user", "vhost"),
    "topic_permissions": ("user", "vhost", "exchange"), "queues": ("vhost", "name"),
    "exchanges": ("vhost", "name"), "policies": ("vhost", "name"),
    "parameters": ("vhost", "component", "name"),
    "bindings": ("vhost", "source", "destination_type", "destination", "routing_key", "arguments"),
}
# What Warren's export may add to an object of the fixture: the fields RabbitMQ's other
# exporter writes (rabbitmqctl: vhost limits/metadata, queue type; the API: "internal").
EXTRAS = {"vhosts": {"limits", "metadata"}, "queues": {"type"}, "exchanges": {"internal"}}


def _key(section: str, obj: dict) -> str:
    return json.dumps([obj.get(field) for field in SECTIONS[section]], sort_keys=True)


def compare(section: str, expected: list, got: list) -> list:
    """The differences between a section of the fixture and of Warren's export, as readable
    strings (none: equal, up to the allowed extra fields)."""
    want = {_key(section, o): o for o in expected}
    have = {_key(section, o): o for o in got}
    problems = [f"{section}: missing {want[k]}" for k in want.keys() - have.keys()]
    problems += [f"{section}: unexpected {have[k]}" for k in have.keys() - want.keys()]
    for k in want.keys() & have.keys():
        w, h = want[k], have[k]
        extra = set(h) - set(w) - EXTRAS.get(section, set())
        if {f: h.get(f) for f in w} != w or extra:
            problems.append(f"{section}: expected {json.dumps(w, sort_keys=True)}\n"
                            f"                got {json.dumps(h, sort_keys=True)}")
    return problems


def _caller(base, user="guest", password="guest"):
    def call(method, path, body=None):
        data = None if body is None else json.dumps(body)
        return requests.request(method, base + path, data=data, auth=(user, password), timeout=30,
                                headers={"content-type": "application/json"})
    return call


def _fixture(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _check_round_trip(api, fixture: dict, extra_permissions=()) -> None:
    exported = api("GET", "/definitions").json()
    problems = []
    for section in SECTIONS:
        expected = fixture.get(section, [])
        if section == "permissions":
            expected = expected + list(extra_permissions)
        problems += compare(section, expected, exported.get(section, []))
    assert not problems, "\n".join(problems)


def _granted_by_import(fixture: dict) -> list:
    """The permissions importing the fixture over the API as guest adds: full ones for guest on
    each vhost the import creates, as RabbitMQ does. The fixtures' node had them already on
    the vhosts made over its API, not on rt-c, which rabbitmqctl made (it grants nothing)."""
    with_guest = {p["vhost"] for p in fixture["permissions"] if p["user"] == "guest"}
    granted = [{"user": "guest", "vhost": v["name"], "configure": ".*", "write": ".*", "read": ".*"}
               for v in fixture["vhosts"] if v["name"] not in with_guest]
    assert [g["vhost"] for g in granted] == ["rt-c"]
    return granted


def _durable(fixture: dict) -> dict:
    """What of the fixture survives a restart: not its transient queues and exchanges (nor
    the bindings to or from them)."""
    out = copy.deepcopy(fixture)
    gone = {("queue", q["vhost"], q["name"]) for q in out["queues"] if not q["durable"]}
    gone |= {("exchange", x["vhost"], x["name"]) for x in out["exchanges"] if not x["durable"]}
    assert gone == {("queue", "rt-b", "q.transient")}
    out["queues"] = [q for q in out["queues"] if q["durable"]]
    out["exchanges"] = [x for x in out["exchanges"] if x["durable"]]
    out["bindings"] = [b for b in out["bindings"] if ("exchange", b["vhost"], b["source"]) not in gone
                       and (b["destination_type"], b["vhost"], b["destination"]) not in gone]
    return out


pytestmark_warren = pytest.mark.skipif(bool(EXTERNAL), reason="imports RabbitMQ's export into Warren")


@pytestmark_warren
def test_rabbitmqctl_export_round_trips(make_broker, restart_broker):
    fixture = _fixture(CTL_EXPORT)
    b = make_broker()
    api = _caller(b.api)
    r = api("POST", "/definitions", fixture)
    assert r.status_code == 204, r.text
    granted = _granted_by_import(fixture)
    _check_round_trip(api, fixture, granted)
    b = restart_broker(b, sig=signal.SIGKILL)
    _check_round_trip(_caller(b.api), _durable(fixture), granted)


@pytestmark_warren
def test_api_export_round_trips(make_broker, restart_broker):
    fixture = _fixture(API_EXPORT)
    b = make_broker()
    api = _caller(b.api)
    r = api("POST", "/definitions", fixture)
    assert r.status_code == 204, r.text
    granted = _granted_by_import(fixture)
    _check_round_trip(api, fixture, granted)
    exported = api("GET", "/definitions").json()
    # vhosts listed by name only have no description or tags after the import (RabbitMQ's
    # import empties them too, also for the default vhost)
    assert {v["name"]: v["metadata"] for v in exported["vhosts"]}["/"] == {"description": "", "tags": []}
    b = restart_broker(b)
    _check_round_trip(_caller(b.api), _durable(fixture), granted)


@pytestmark_warren
def test_queue_arguments_keep_their_json_types(make_broker):
    """Numbers stay numbers and strings strings; floats, lists and tables come back as given."""
    b = make_broker()
    api = _caller(b.api)
    args = {"x-custom": "10", "x-int": 10, "x-float": 1.5, "x-bool": False, "x-list": [1, "a", [2.5]],
            "x-obj": {"k": 1, "s": "v", "n": {"deep": True}}, "x-queue-mode": "lazy", "x-expires": 3600000}
    defs = {"queues": [{"name": "typed", "vhost": "/", "durable": True, "auto_delete": False, "arguments": args}]}
    assert api("POST", "/definitions", defs).status_code == 204
    (q,) = [q for q in api("GET", "/definitions").json()["queues"] if q["name"] == "typed"]
    assert q["arguments"] == args
    assert [(k, type(v)) for k, v in q["arguments"].items()] == [(k, type(v)) for k, v in args.items()]


@pytestmark_warren
def test_default_queue_type_applies_to_declares(make_broker, restart_broker):
    """rt-c's default_queue_type is quorum: RabbitMQ makes a durable, non-exclusive,
    non-auto-delete queue declared there without x-queue-type a quorum queue; the queues the
    default does not apply to are classic, as in RabbitMQ."""
    fixture = _fixture(CTL_EXPORT)
    b = make_broker()
    assert _caller(b.api)("POST", "/definitions", fixture).status_code == 204
    b = restart_broker(b)
    v = _caller(b.api)("GET", "/vhosts/rt-c").json()  # shown as RabbitMQ shows it
    assert (v["default_queue_type"], v["metadata"]) == (
        "quorum", {"description": "quorum by default", "tags": ["x"], "default_queue_type": "quorum"})
    ch = pika.BlockingConnection(b.pika_params(vhost="rt-c")).channel()
    ch.queue_declare("qq", durable=True)
    ch = ch.connection.channel()
    ch.queue_declare("transient", durable=False)
    ch.queue_declare("auto", durable=True, auto_delete=True)
    ch.queue_declare("classic", durable=True, arguments={"x-queue-type": "classic"})
    queues = {q["name"]: q for q in _caller(b.api)("GET", "/queues/rt-c").json()}
    assert {n: (q["type"], q["arguments"]) for n, q in queues.items()} == {
        "qq": ("quorum", {"x-queue-type": "quorum"}), "transient": ("classic", {}), "auto": ("classic", {}),
        "classic": ("classic", {"x-queue-type": "classic"})}


@pytestmark_warren
def test_default_queue_type_classic_is_added_to_arguments(make_broker):
    """As RabbitMQ's augment_declare_args: a classic default is written into every declare's
    arguments that names no type (and so shows in the queue and in the definitions)."""
    b = make_broker()
    api = _caller(b.api)
    defs = {"vhosts": [{"name": "dqt", "metadata": {"description": "", "tags": [], "default_queue_type": "classic"}}]}
    assert api("POST", "/definitions", defs).status_code == 204
    ch = pika.BlockingConnection(b.pika_params(vhost="dqt")).channel()
    ch.queue_declare("d", durable=True)
    ch.queue_declare("t", exclusive=True)
    assert api("GET", "/queues/dqt/d").json()["arguments"] == {"x-queue-type": "classic"}
    assert api("GET", "/queues/dqt/t").json()["arguments"] == {"x-queue-type": "classic"}
    (v,) = [v for v in api("GET", "/definitions").json()["vhosts"] if v["name"] == "dqt"]
    assert v["metadata"] == {"description": "", "tags": [], "default_queue_type": "classic"}


@pytestmark_warren
def test_unknown_default_queue_type_is_refused(make_broker):
    # RabbitMQ 3.10.8 answers 204 but creates no vhost; Warren says why.
    b = make_broker()
    api = _caller(b.api)
    r = api("POST", "/definitions", {"vhosts": [{"name": "bad", "metadata": {"default_queue_type": "foo"}}]})
    assert (r.status_code, r.json()["error"]) == (400, "bad_request")
    assert "invalid_queue_type" in r.json()["reason"]
    assert api("GET", "/vhosts/bad").status_code == 404


# ---------------------------------------------------------- against either broker
needs_api = pytest.mark.skipif(bool(EXTERNAL) and not MGMT, reason="needs the management API")


@pytest.fixture
def any_api():
    """The API base of a fresh Warren broker, or of RabbitMQ's node (WARREN_TEST_MGMT)."""
    if EXTERNAL:
        yield MGMT
        return
    b = start_broker()
    yield b.api
    b.stop(signal.SIGKILL)


@needs_api
def test_import_grants_the_importing_user_full_permissions_on_new_vhosts(any_api):
    suffix = uuid.uuid4().hex[:6]
    admin, password = f"imp-admin-{suffix}", "imp-pw"
    new, old = f"imp-new-{suffix}", f"imp-old-{suffix}"
    guest = _caller(any_api)
    try:
        assert guest("PUT", f"/users/{admin}", {"password_hash": password_hash(password),
                                                 "tags": "administrator"}).status_code == 201
        assert guest("PUT", f"/vhosts/{old}", {}).status_code == 201  # guest made it: admin has nothing there
        api = _caller(any_api, admin, password)
        defs = {"vhosts": [{"name": new}, {"name": old}],
                "queues": [{"name": "q", "vhost": new, "durable": True, "auto_delete": False, "arguments": {}}]}
        assert api("POST", "/definitions", defs).status_code == 204
        r = api("GET", f"/permissions/{quote(new, safe='')}/{admin}")
        assert (r.status_code, r.json()) == (200, {"user": admin, "vhost": new, "configure": ".*", "write": ".*",
                                                   "read": ".*"})
        assert api("GET", f"/permissions/{old}/{admin}").status_code == 404  # it existed before
        # so the administrator can use the new vhost at once, as on RabbitMQ
        assert api("PUT", f"/queues/{new}/q2", {"durable": True}).status_code == 201
        assert api("DELETE", f"/queues/{new}/q").status_code == 204
        assert [q["name"] for q in api("GET", f"/queues/{new}").json()] == ["q2"]
        assert api("PUT", f"/queues/{old}/q3", {"durable": True}).status_code == 401
    finally:
        for v in (new, old):
            guest("DELETE", f"/vhosts/{v}")
        guest("DELETE", f"/users/{admin}")


@needs_api
def test_import_replaces_vhost_metadata(any_api):
    """As RabbitMQ's put_vhost: description and tags from the top-level keys, else from
    "metadata", else empty; for existing vhosts too."""
    name = f"imp-meta-{uuid.uuid4().hex[:6]}"
    api = _caller(any_api)
    try:
        assert api("PUT", f"/vhosts/{name}", {"description": "mine", "tags": "t1"}).status_code == 201

        def metadata():
            v = api("GET", f"/vhosts/{name}").json()
            return v["description"], v["tags"], v["metadata"]

        assert api("POST", "/definitions", {"vhosts": [{"name": name}]}).status_code == 204
        assert metadata() == ("", [], {"description": "", "tags": []})
        defs = {"vhosts": [{"name": name, "description": "top", "tags": "a,b",
                            "metadata": {"description": "meta", "tags": ["m"]}}]}
        assert api("POST", "/definitions", defs).status_code == 204
        assert metadata() == ("top", ["a", "b"], {"description": "top", "tags": ["a", "b"]})
        defs = {"vhosts": [{"name": name, "metadata": {"description": "meta", "tags": ["m"]}}]}
        assert api("POST", "/definitions", copy.deepcopy(defs)).status_code == 204
        assert metadata() == ("meta", ["m"], {"description": "meta", "tags": ["m"]})
    finally:
        api("DELETE", f"/vhosts/{name}")
