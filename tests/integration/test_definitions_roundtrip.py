"""Definitions round trip in RabbitMQ 3.10.8's shapes: a RabbitMQ 3.10.8 export imported into
Warren comes back as the same document (up to the order of list items, which in RabbitMQ is
its tables' order) from the exporter of the same kind, and survives a restart.

The fixtures are real exports of a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py with the
management plugin), made after creating, through its API, vhosts with descriptions and tags
(and, with `rabbitmqctl add_vhost --default-queue-type quorum`, one with a default queue
type), users, permissions, topic permissions with {username}/{vhost} patterns, exchanges,
queues with assorted arguments (numbers, strings, booleans, floats, lists, tables), bindings
(e→q, e→e, with arguments), a policy and an operator policy:

- tests/data/rabbitmq-3.10.8-rabbitmqctl-definitions.json: `rabbitmqctl export_definitions`
  (warrenctl's export_definitions here), which keeps the vhosts' limits and metadata
  (description, tags, default_queue_type) and the queues' type, but leaves out internal
  exchanges and the exchanges' "internal" key, and writes every object's keys sorted;
- tests/data/rabbitmq-3.10.8-api-definitions.json: GET /api/definitions, which gives vhosts by
  name only and no queue type, each object's keys in the order of its fields.

A second round trip, of a vhost with limits, a default queue type and quorum, stream and
classic queues, compares both exports with what a RabbitMQ 3.10.8 node exports for the same
definitions; it and the tests about what an import does to vhosts (the importing user's
permissions, metadata replaced) also run against RabbitMQ with WARREN_TEST_MGMT.
"""

import copy
import json
import os
import shlex
import signal
import subprocess
import urllib.parse
import uuid
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, RABBITMQ, password_hash, start_broker
from warren import __version__
from warrenctl_path import WARRENCTL

MGMT = os.environ.get("WARREN_TEST_MGMT")
RABBITMQCTL = os.environ.get("WARREN_TEST_RABBITMQCTL")
DATA = Path(__file__).resolve().parent.parent / "data"
CTL_EXPORT = DATA / "rabbitmq-3.10.8-rabbitmqctl-definitions.json"
API_EXPORT = DATA / "rabbitmq-3.10.8-api-definitions.json"


def document(doc: dict) -> tuple:
    """A definitions document as what must match: its keys in order, and each list as its
    items (each with its own keys in order) in sorted order."""
    def item(i) -> str:
        return json.dumps([list(i) if isinstance(i, dict) else None, i], sort_keys=True)
    return list(doc), {k: sorted(map(item, v)) if isinstance(v, list) else v for k, v in doc.items()}


def as_rabbitmqctl_writes(text: str) -> dict:
    """A rabbitmqctl-style export, checked to be written as rabbitmqctl writes one: compact,
    every object's keys sorted (Erlang maps), no newline at the end."""
    doc = json.loads(text)
    assert text == json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return doc


def _caller(base, user="guest", password="guest"):
    def call(method, path, body=None):
        data = None if body is None else json.dumps(body)
        return requests.request(method, base + path, data=data, auth=(user, password), timeout=30,
                                headers={"content-type": "application/json"})
    return call


def _warrenctl(port: int, *args: str) -> str:
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    r = subprocess.run([WARRENCTL, "--port", str(port), *args], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, ""), r
    return r.stdout


def _fixture(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


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
def test_api_export_round_trips(make_broker, restart_broker):
    """GET /api/definitions after importing RabbitMQ's gives its document again: the same
    fields in the same order (vhosts by name, no queue type), with Warren's product name and
    version, and guest's permissions on the vhost the import made (as RabbitMQ's import)."""
    fixture = _fixture(API_EXPORT)
    b = make_broker()
    api = _caller(b.api)
    r = api("POST", "/definitions", fixture)
    assert r.status_code == 204, r.text
    expected = {**fixture, "product_name": "Warren", "product_version": __version__,
                "permissions": fixture["permissions"] + _granted_by_import(fixture)}
    assert document(api("GET", "/definitions").json()) == document(expected)
    # vhosts listed by name only have no description or tags after the import (RabbitMQ's
    # import empties them too, also for the default vhost)
    assert api("GET", "/vhosts/%2F").json()["metadata"] == {"description": "", "tags": []}
    b = restart_broker(b)
    assert document(_caller(b.api)("GET", "/definitions").json()) == document(_durable(expected))


@pytestmark_warren
def test_rabbitmqctl_export_round_trips(make_broker, restart_broker):
    """warrenctl export_definitions after importing rabbitmqctl's export gives it again: vhost
    limits and metadata, queue types, no internal exchanges, keys sorted."""
    fixture = _fixture(CTL_EXPORT)
    b = make_broker()
    r = _caller(b.api)("POST", "/definitions", fixture)
    assert r.status_code == 204, r.text
    granted = [dict(sorted(p.items())) for p in _granted_by_import(fixture)]
    expected = {**fixture, "permissions": fixture["permissions"] + granted}
    assert document(as_rabbitmqctl_writes(_warrenctl(b.mgmt_port, "export_definitions", "-"))) == document(expected)
    b = restart_broker(b, sig=signal.SIGKILL)
    assert document(as_rabbitmqctl_writes(_warrenctl(b.mgmt_port, "export_definitions", "-"))) == \
        document(_durable(expected))


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
    exported = json.loads(_warrenctl(b.mgmt_port, "export_definitions", "-"))
    (v,) = [v for v in exported["vhosts"] if v["name"] == "dqt"]
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


def _three_queue_types(v: str) -> tuple[dict, dict, dict]:
    """Definitions of a vhost with limits, quorum as its default queue type, quorum, stream and
    classic queues, a policy, an operator policy, an internal exchange and bindings (one queue
    with a 3.12 export's "type" and no x-queue-type: an import ignores the type, RabbitMQ
    3.10's too), and what RabbitMQ 3.10.8 exports of it after the import: over the API (its
    objects) and with rabbitmqctl (the whole document, less other vhosts' objects)."""
    limits = {"vhost": v, "component": "vhost-limits", "name": "limits", "value": {"max-connections": 5, "max-queues": 10}}
    op = {"vhost": v, "component": "operator_policy", "name": "op",
          "value": {"apply-to": "queues", "definition": {"delivery-limit": 5}, "pattern": "^qq", "priority": 0}}
    policy = {"vhost": v, "name": "pol", "pattern": "^sq", "apply-to": "queues", "definition": {"max-age": "2h"},
              "priority": 1}
    permission = {"user": "guest", "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
    arguments = {"qq": {"x-delivery-limit": 3, "x-queue-type": "quorum"}, "sq": {"x-max-age": "1D", "x-queue-type": "stream"},
                 "cq": {"x-max-length": 5}, "typed": {}}
    types = {"qq": "quorum", "sq": "stream", "cq": "classic", "typed": "classic"}
    exchanges = [{"name": "bx", "vhost": v, "type": "topic", "durable": True, "auto_delete": False, "internal": False,
                  "arguments": {}},
                 {"name": "bx-int", "vhost": v, "type": "fanout", "durable": True, "auto_delete": False,
                  "internal": True, "arguments": {}}]
    bindings = [{"source": "bx", "vhost": v, "destination": "cq", "destination_type": "queue", "routing_key": "k",
                 "arguments": {}},
                {"source": "bx", "vhost": v, "destination": "bx-int", "destination_type": "exchange",
                 "routing_key": "x", "arguments": {}},
                {"source": "bx-int", "vhost": v, "destination": "qq", "destination_type": "queue", "routing_key": "",
                 "arguments": {}}]
    metadata = {"description": "three queue types", "tags": ["t"], "default_queue_type": "quorum"}
    definitions = {
        "vhosts": [{"name": v, "metadata": metadata}], "permissions": [permission], "parameters": [limits, op],
        "policies": [policy],
        "queues": [{"name": n, "vhost": v, **({"type": "quorum"} if n == "typed" else {}), "durable": True,
                    "auto_delete": False, "arguments": a} for n, a in arguments.items()],
        "exchanges": exchanges, "bindings": bindings}
    api = {"users": [], "vhosts": [{"name": v}], "permissions": [permission], "topic_permissions": [],
           "parameters": [{k: p[k] for k in ("value", "vhost", "component", "name")} for p in (limits, op)],
           "global_parameters": [], "policies": [policy],
           "queues": [{"name": n, "vhost": v, "durable": True, "auto_delete": False, "arguments": a}
                      for n, a in arguments.items()],
           "exchanges": exchanges, "bindings": bindings}

    def ctl(item: dict) -> dict:
        return dict(sorted(item.items()))
    rabbitmqctl = {
        "bindings": [ctl(b) for b in bindings],
        "exchanges": [ctl({k: x[k] for k in x if k != "internal"}) for x in exchanges if not x["internal"]],
        "global_parameters": [], "parameters": [ctl(limits), ctl(op)], "permissions": [ctl(permission)],
        "policies": [ctl(policy)],
        "queues": [ctl({"name": n, "vhost": v, "type": types[n], "durable": True, "auto_delete": False,
                        "arguments": a}) for n, a in arguments.items()],
        "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "topic_permissions": [], "users": [],
        "vhosts": [{"limits": [["max-connections", 5], ["max-queues", 10]], "metadata": dict(sorted(metadata.items())),
                    "name": v}]}
    return definitions, api, rabbitmqctl


def _of_vhost(doc: dict, v: str) -> dict:
    """A whole export less other vhosts' objects (users and global parameters too)."""
    return {k: [i for i in items if (i["name"] if k == "vhosts" else i.get("vhost")) == v]
            if isinstance(items, list) else items for k, items in doc.items()}


@needs_api
def test_limits_and_queue_types_round_trip_as_rabbitmq_exports_them(any_api):
    """Imported, then exported over the API (the whole document, one vhost's) and as
    rabbitmqctl does: on a RabbitMQ node (with rabbitmqctl's own export beside warrenctl's), as
    on Warren."""
    v = f"rt3-{uuid.uuid4().hex[:6]}"
    definitions, api_items, ctl_doc = _three_queue_types(v)
    api = _caller(any_api)
    try:
        r = api("POST", "/definitions", definitions)
        assert r.status_code == 204, r.text
        product = ("RabbitMQ", "3.10.8") if RABBITMQ else ("Warren", __version__)
        expected = {"rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "product_name": product[0],
                    "product_version": product[1], **api_items}
        assert document(_of_vhost(api("GET", "/definitions").json(), v)) == document(expected)
        expected_vhost = {"rabbit_version": "3.10.8",
                          **{k: [{f: x for f, x in i.items() if f != "vhost" or k in ("parameters", "policies")}
                                 for i in api_items[k]]
                             for k in ("parameters", "policies", "queues", "exchanges", "bindings")}}
        assert document(api("GET", f"/definitions/{v}").json()) == document(expected_vhost)
        port = urllib.parse.urlsplit(any_api).port
        exported = as_rabbitmqctl_writes(_warrenctl(port, "export_definitions", "-"))
        assert document(_of_vhost(exported, v)) == document(ctl_doc)
        if RABBITMQ and RABBITMQCTL:
            r = subprocess.run([*shlex.split(RABBITMQCTL), "export_definitions", "-"], capture_output=True, text=True,
                               timeout=60)
            assert document(_of_vhost(as_rabbitmqctl_writes(r.stdout), v)) == document(ctl_doc)
    finally:
        api("DELETE", f"/vhosts/{v}")


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
