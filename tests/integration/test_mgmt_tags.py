"""Management HTTP API: what each user tag may do, endpoint by endpoint, as RabbitMQ 3.10.

Every route Warren serves (every method) is called by six users: one without tags, one each
tagged management, policymaker, monitoring and administrator, and a management user without
permissions on the vhost the objects are in ("noperm", who has permissions in the other
vhost). The expected statuses and 401 reasons, and which objects a list shows, are RabbitMQ
3.10.8's: run against a RabbitMQ node with the management plugin with

    python tools/rabbitmq_node.py run --plugins rabbitmq_management -- \\
        python -m pytest -q tests/integration/test_mgmt_tags.py

(WARREN_TEST_MGMT is the node's API). Against a RabbitMQ node without it (CI's comparison
node: WARREN_TEST_BROKER without WARREN_TEST_MGMT) the module is skipped.

Where Warren differs on purpose, the expectation says so (RabbitMQ answers 500 for a missing
connection or channel asked by a non-monitoring user; Warren 404).
"""

import os
import re
import time
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import EXTERNAL, RUN_ID, DefinitionsBroker, password_hash

MGMT = os.environ.get("WARREN_TEST_MGMT")
# A cluster's nodes' AMQP addresses (the first one's API is MGMT).
CLUSTER = [a for a in os.environ.get("WARREN_TEST_CLUSTER", "").split(",") if a]
pytestmark = pytest.mark.skipif(bool(EXTERNAL) and not MGMT, reason="the comparison RabbitMQ node has no management plugin")

SUFFIX = RUN_ID[:6]
VT = f"tags-{SUFFIX}"        # the vhost every user but noperm has permissions in
VO = f"tags-other-{SUFFIX}"  # where only noperm has permissions
PASSWORD = "tags-pw"
ROLES = ("none", "mgmt", "pol", "mon", "admin", "noperm")
TAGS = {"none": "", "mgmt": "management", "pol": "policymaker", "mon": "monitoring",
        "admin": "administrator", "noperm": "management", "lim": "management"}
USER = {role: f"tg-{role}-{SUFFIX}" for role in TAGS}
FULL = {"configure": ".*", "write": ".*", "read": ".*"}
POLICY = {"pattern": "^zz", "definition": {"max-length": 5}}

# The 401 answers, by RabbitMQ's reason texts.
REASONS = {
    "NM": "Not management user",
    "NA": "Not administrator user",
    "NMo": "Not monitor user",
    "NV": "User not authorised to access virtual host",
    "NO": "User not authorised to access object",
    "AR": "Access refused.",
}


def q(name: str) -> str:
    return quote(name, safe="")


def _definitions() -> dict:
    def perm(role, vhost, p=FULL):
        return {"user": USER[role], "vhost": vhost, **p}
    args = {"durable": True, "auto_delete": False, "arguments": {}}
    return {
        "users": [{"name": USER[r], "password_hash": password_hash(PASSWORD),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": TAGS[r]} for r in TAGS],
        "vhosts": [{"name": VT}, {"name": VO}],
        "permissions": [perm(r, VT) for r in ("none", "mgmt", "pol", "mon", "admin")]
        + [perm("noperm", VO), perm("lim", VT, {"configure": "^lim-", "write": "^lim-", "read": "^lim-"})],
        "queues": [{"name": "q1", "vhost": VT, **args}, {"name": "q2", "vhost": VO, **args}],
        "exchanges": [{"name": x, "vhost": v, "type": "direct", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}} for x, v in (("x1", VT), ("x2", VO))],
        "bindings": [{"source": x, "vhost": v, "destination": d, "destination_type": "queue", "routing_key": "k",
                      "arguments": {}} for x, v, d in (("x1", VT, "q1"), ("x2", VO, "q2"))],
        "policies": [{"name": p, "vhost": v, "apply-to": "all", "priority": 0, **POLICY}
                     for p, v in (("p1", VT), ("p2", VO))],
        "parameters": [{"component": "operator_policy", "name": p, "vhost": v,
                        "value": {"apply-to": "queues", "priority": 0, **POLICY}}
                       for p, v in (("op1", VT), ("op2", VO))],
    }


class Env:
    """The broker, its API, and open connections of mgmt, admin (in VT) and noperm (in VO),
    each with a consumer."""

    def __init__(self):
        self.defs = DefinitionsBroker(_definitions())
        self.broker = self.defs.broker
        self.api = MGMT or self.broker.api
        self.conns: dict[str, pika.BlockingConnection] = {}
        self.made = 0
        self.conn_names: dict[str, str] = {}
        self.channel_names: dict[str, str] = {}
        self.wait(lambda: self.call("admin", "GET", f"/queues/{q(VO)}/q2").status_code == 200)
        for role, vhost, queue in (("mgmt", VT, "q1"), ("admin", VT, "q1"), ("noperm", VO, "q2")):
            self.conns[role] = self.connect(role, vhost, queue)
        for role in self.conns:
            self.conn_names[role] = self.connection_name(role)
        self.wait(lambda: len(self.mine(self.call("admin", "GET", "/consumers").json(),
                                        ("channel_details", "user"))) == 3)
        channels = self.mine(self.call("admin", "GET", "/channels").json())
        self.channel_names = {self.role_of(c["user"]): c["name"] for c in channels}
        self.node = self.call("admin", "GET", "/overview").json()["node"]

    def connect(self, role, vhost, queue) -> pika.BlockingConnection:
        """A connection with a consumer, named (user_provided_name) `tags-ROLE-N`: found by that
        name in the API, whichever node of a cluster it reached through a proxy."""
        self.made += 1
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            self.broker.host, self.broker.port, vhost, pika.PlainCredentials(USER[role], PASSWORD), heartbeat=0,
            client_properties={"connection_name": f"tags-{role}-{self.made}-{SUFFIX}"}))
        conn.channel().basic_consume(queue, lambda *a: None)
        return conn

    def connection_name(self, role, conn=None) -> str:
        """The API's name of the role's connection (or `conn`), once the API lists it
        (RabbitMQ: after its next statistics emission)."""
        found: list = []
        provided = (conn or self.conns[role])._impl.params.client_properties["connection_name"]

        def listed():
            found[:] = [c["name"] for c in self.call("admin", "GET", "/connections").json()
                        if c.get("user_provided_name") == provided]
            return bool(found)
        self.wait(listed)
        return found[0]

    @staticmethod
    def wait(condition, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.2)

    def call(self, role, method, path, json=None, **kw):
        auth = (USER[role], PASSWORD)
        return requests.request(method, self.api + path, json=json, auth=auth, timeout=30, **kw)

    @staticmethod
    def role_of(user: str) -> str:
        return next(role for role, name in USER.items() if name == user)

    @staticmethod
    def mine(items: list, key=("user",)) -> list:
        """The items of this test's users or vhosts (the node may hold others)."""
        def get(item):
            for part in key:
                item = item.get(part) if isinstance(item, dict) else None
            return item
        ours = set(USER.values()) | {VT, VO}
        return [i for i in items if get(i) in ours]

    def close(self):
        for conn in self.conns.values():
            try:
                conn.close()
            except pika.exceptions.AMQPError:
                pass  # closed by a test
        self.defs.stop()


@pytest.fixture(scope="module")
def env():
    e = Env()
    yield e
    e.close()


def check(response, token: str, role: str, what: str):
    """The answer is `token`: a status code, or a 401 by its REASONS key."""
    where = f"{what} as {role}: {response.status_code} {response.text[:200]}"
    if token in REASONS:
        assert response.status_code == 401, where
        if response.request.method != "HEAD":
            assert response.json() == {"error": "not_authorised", "reason": REASONS[token]}, where
    else:
        assert response.status_code == int(token), where


# ------------------------------------------------------------ reads
# path -> answers of none, mgmt, pol, mon, admin, noperm. {conn:role}, {ch:role} and {node}
# are filled in per run.
ANY = "NM 200 200 200 200 200"
IN_VT = "NM 200 200 200 200 NV"
IN_VO = "NM NV NV NV 200 200"
ADMIN = "NM NA NA NA 200 NA"
READS = [
    ("/overview", ANY), ("/whoami", ANY), ("/cluster-name", ANY),
    ("/nodes", "NM NMo NMo 200 200 NMo"), ("/nodes/{node}", "NM NMo NMo 200 200 NMo"),
    ("/connections", ANY), (f"/vhosts/{VT}/connections", IN_VT), (f"/vhosts/{VO}/connections", IN_VO),
    ("/connections/{conn:mgmt}", "NM 200 NO 200 200 NO"), ("/connections/{conn:admin}", "NM NO NO 200 200 NO"),
    ("/connections/{conn:mgmt}/channels", "NM 200 NO 200 200 NO"),
    ("/connections/{conn:admin}/channels", "NM NO NO 200 200 NO"),
    ("/channels", ANY), (f"/vhosts/{VT}/channels", IN_VT), (f"/vhosts/{VO}/channels", IN_VO),
    ("/channels/{ch:mgmt}", "NM 200 NO 200 200 NO"), ("/channels/{ch:admin}", "NM NO NO 200 200 NO"),
    ("/consumers", ANY), (f"/consumers/{VT}", ANY), (f"/consumers/{VO}", ANY),
    ("/definitions", ADMIN), (f"/definitions/{VT}", ADMIN),
    ("/exchanges", ANY), (f"/exchanges/{VT}", IN_VT), (f"/exchanges/{VO}", IN_VO),
    (f"/exchanges/{VT}/x1", IN_VT), (f"/exchanges/{VO}/x2", IN_VO),
    (f"/exchanges/{VT}/x1/bindings/source", IN_VT), (f"/exchanges/{VT}/x1/bindings/destination", IN_VT),
    (f"/exchanges/{VT}/nope", "NM 404 404 404 404 NV"),
    ("/queues", ANY), (f"/queues/{VT}", IN_VT), (f"/queues/{VO}", IN_VO), (f"/queues/{VT}/q1", IN_VT),
    (f"/queues/{VO}/q2", IN_VO), (f"/queues/{VT}/q1/bindings", IN_VT), (f"/queues/{VT}/nope", "NM 404 404 404 404 NV"),
    ("/queues/no-such-vhost", "NM 404 404 404 404 404"),
    ("/bindings", ANY), (f"/bindings/{VT}", IN_VT), (f"/bindings/{VO}", IN_VO),
    (f"/bindings/{VT}/e/x1/q/q1", IN_VT), (f"/bindings/{VT}/e/x1/q/q1/k", IN_VT),
    (f"/bindings/{VO}/e/x2/q/q2/k", IN_VO),
    ("/health/checks/alarms", ANY), ("/health/checks/local-alarms", ANY), ("/healthchecks/node", ANY),
    ("/healthchecks/node/{node}", ANY), ("/health/checks/virtual-hosts", ANY),
    ("/health/checks/node-is-quorum-critical", ANY), ("/health/checks/node-is-mirror-sync-critical", ANY),
    ("/health/checks/certificate-expiration/1/days", ANY), ("/health/checks/protocol-listener/amqp", ANY),
    ("/health/checks/port-listener/{amqp_port}", ANY),
    (f"/aliveness-test/{VT}", IN_VT),
    # An administrator without permissions in the vhost: RabbitMQ's channel cannot open.
    (f"/aliveness-test/{VO}", "NM NV NV NV AR 200"),
    ("/permissions", ADMIN), (f"/permissions/{VT}/{{user:mgmt}}", ADMIN),
    # runtime parameters: policymakers in their vhosts; global ones: policymakers
    ("/parameters", "NM NO 200 NO 200 NO"), ("/parameters/operator_policy", "NM NO 200 NO 200 NO"),
    (f"/parameters/operator_policy/{VT}", "NM NO 200 NO 200 NO"),
    (f"/parameters/operator_policy/{VO}", "NM NO NO NO 200 NO"),
    (f"/parameters/operator_policy/{VT}/op1", "NM NO 200 NO 200 NO"),
    ("/global-parameters", "NM NO 200 NO 200 NO"), ("/global-parameters/no-such-parameter", "NM NO 404 NO 404 NO"),
    # limits: vhost limits as the vhosts a user sees (monitoring: all), user limits for all
    ("/vhost-limits", ANY), (f"/vhost-limits/{VT}", "NM 200 200 200 200 NV"),
    (f"/vhost-limits/{VO}", "NM NV NV 200 200 200"),
    ("/user-limits", ANY), ("/user-limits/{user:mgmt}", ANY),
    ("/policies", ANY), (f"/policies/{VT}", IN_VT), (f"/policies/{VO}", IN_VO),
    (f"/policies/{VT}/p1", "NM NO 200 NO 200 NO"), (f"/policies/{VO}/p2", "NM NO NO NO 200 NO"),
    ("/operator-policies", ANY), (f"/operator-policies/{VT}", IN_VT), (f"/operator-policies/{VO}", IN_VO),
    (f"/operator-policies/{VT}/op1", ADMIN),
    ("/users", ADMIN), ("/users/without-permissions", ADMIN), ("/users/{user:mgmt}", ADMIN),
    ("/users/{user:mgmt}/permissions", ADMIN),
    ("/vhosts", ANY), (f"/vhosts/{VT}", ADMIN), (f"/vhosts/{VT}/permissions", ADMIN),
    ("/vhosts/no-such-vhost", "NM NA NA NA 404 NA"),
    # topic permissions (the mgmt user has none: 404)
    ("/topic-permissions", ADMIN), (f"/topic-permissions/{VT}/{{user:mgmt}}", "NM NA NA NA 404 NA"),
    (f"/topic-permissions/{VT}/{{user:mgmt}}/x1", "NM NA NA NA 404 NA"),
    ("/users/{user:mgmt}/topic-permissions", ADMIN), (f"/vhosts/{VT}/topic-permissions", ADMIN),
]


def fill(env, path: str) -> str:
    def one(match):
        kind, _, role = match.group(1).partition(":")
        if kind == "node":
            return q(env.node)
        if kind == "amqp_port":  # (the API's node's: on a cluster, not the proxy's)
            return CLUSTER[0].rsplit(":", 1)[1] if CLUSTER else str(env.broker.port)
        if kind == "user":
            return q(USER[role])
        return q((env.conn_names if kind == "conn" else env.channel_names)[role])
    return re.sub(r"\{([a-z_]+(?::[a-z]+)?)\}", one, path)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("path,answers", READS, ids=[r[0] for r in READS])
def test_read(env, path, answers, method):
    if method == "HEAD" and "aliveness" in path:
        pytest.skip("HEAD of the aliveness test would run it again")
    if method == "HEAD" and path.startswith(("/vhost-limits", "/user-limits")):
        answers = "405 405 405 405 405 405"  # RabbitMQ's limits resources have no HEAD
    for role, token in zip(ROLES, answers.split()):
        check(env.call(role, method, fill(env, path)), token, role, f"{method} {path}")


def test_missing_connection_or_channel(env):
    """A connection or channel that does not exist: 404. RabbitMQ crashes (500) in its access
    check for a non-monitoring user, and for everyone on a missing connection's channels."""
    for path in ("/connections/no-such-connection", "/channels/no-such-channel",
                 "/connections/no-such-connection/channels"):
        for role, token in zip(ROLES, "NM 404 404 404 404 404".split()):
            r = env.call(role, "GET", path)
            crashes = role in ("mgmt", "pol", "noperm") or path.endswith("/channels")
            if MGMT and token == "404" and crashes and r.status_code == 500:
                continue
            check(r, token, role, f"GET {path}")


def test_unknown_path_and_method_before_authentication(env):
    """As RabbitMQ (cowboy routes first): 404 for an unknown path and 405 for an unknown
    method, with or without credentials."""
    for auth in (None, (USER["none"], PASSWORD), (USER["mon"], PASSWORD)):
        r = requests.get(env.api + f"/no-such-resource-{SUFFIX}", auth=auth, timeout=10)
        assert r.status_code == 404, (auth, r.status_code, r.text)
        r = requests.delete(env.api + "/overview", auth=auth, timeout=10)
        assert r.status_code == 405, (auth, r.status_code, r.text)


def test_no_or_wrong_credentials(env):
    r = requests.get(env.api + "/overview", timeout=10)
    assert (r.status_code, r.text) == (401, "")
    r = requests.get(env.api + "/overview", auth=(USER["mgmt"], "wrong"), timeout=10)
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorized", "reason": "Login failed"}
    assert "WWW-Authenticate" in r.headers
    # Refused by tag: a reason, no new challenge.
    r = env.call("mgmt", "GET", "/users")
    assert r.status_code == 401 and "WWW-Authenticate" not in r.headers


# ------------------------------------------------------------ lists: what each user sees
# path -> (key of the item compared, what none..noperm see; "-" is a 401)
VTO = {VT, VO}
OWN_VT = {VT}
LISTS = [
    ("/queues", ("vhost",), [None, OWN_VT, OWN_VT, OWN_VT, VTO, {VO}]),
    ("/exchanges", ("vhost",), [None, OWN_VT, OWN_VT, OWN_VT, VTO, {VO}]),
    ("/bindings", ("vhost",), [None, OWN_VT, OWN_VT, OWN_VT, VTO, {VO}]),
    ("/policies", ("vhost",), [None, OWN_VT, OWN_VT, OWN_VT, VTO, {VO}]),
    ("/operator-policies", ("vhost",), [None, OWN_VT, OWN_VT, OWN_VT, VTO, {VO}]),
    ("/parameters", ("vhost",), [None, None, OWN_VT, None, VTO, None]),
    ("/vhosts", ("name",), [None, OWN_VT, OWN_VT, VTO, VTO, {VO}]),
    ("/connections", ("user",), [None, {"mgmt"}, set(), {"mgmt", "admin", "noperm"},
                                 {"mgmt", "admin", "noperm"}, {"noperm"}]),
    (f"/vhosts/{VT}/connections", ("user",), [None, {"mgmt"}, set(), {"mgmt", "admin"}, {"mgmt", "admin"}, None]),
    ("/channels", ("user",), [None, {"mgmt"}, set(), {"mgmt", "admin", "noperm"},
                              {"mgmt", "admin", "noperm"}, {"noperm"}]),
    (f"/vhosts/{VT}/channels", ("user",), [None, {"mgmt"}, set(), {"mgmt", "admin"}, {"mgmt", "admin"}, None]),
    ("/consumers", ("channel_details", "user"), [None, {"mgmt"}, set(), {"mgmt", "admin", "noperm"},
                                                 {"mgmt", "admin", "noperm"}, {"noperm"}]),
    (f"/consumers/{VT}", ("channel_details", "user"), [None, {"mgmt"}, set(), {"mgmt", "admin"},
                                                       {"mgmt", "admin"}, set()]),
    (f"/consumers/{VO}", ("channel_details", "user"), [None, set(), set(), {"noperm"}, {"noperm"}, {"noperm"}]),
]


@pytest.mark.parametrize("path,key,seen", LISTS, ids=[item[0] for item in LISTS])
def test_list_visibility(env, path, key, seen):
    for role, expected in zip(ROLES, seen):
        r = env.call(role, "GET", path)
        if expected is None:
            assert r.status_code == 401, (role, r.text)
            continue
        assert r.status_code == 200, (role, r.text)
        values = {_get(i, key) for i in Env.mine(r.json(), key)}
        if key[-1] == "user":
            values = {Env.role_of(v) for v in values}
        assert values == expected, (path, role)


def _get(item, key):
    for part in key:
        item = item.get(part) if isinstance(item, dict) else None
    return item


def test_list_pages_count_only_visible(env):
    r = env.call("mgmt", "GET", "/queues?page=1&page_size=100")
    assert r.status_code == 200
    body = r.json()
    assert {i["vhost"] for i in body["items"]} == {VT}
    assert body["total_count"] == body["filtered_count"] == len(body["items"])


def test_overview_of_users_without_monitoring(env):
    """Non-monitoring users see no node, listeners or contexts, and totals of their own
    vhosts and connections."""
    for role in ("mon", "admin"):
        body = env.call(role, "GET", "/overview").json()
        assert {"node", "listeners", "contexts"} <= set(body), role
        assert "consumers" in body["object_totals"]
    vt_queues = len(env.call("admin", "GET", f"/queues/{q(VT)}").json())
    vt_exchanges = len(env.call("admin", "GET", f"/exchanges/{q(VT)}").json())
    for role, conns in (("mgmt", 1), ("pol", 0), ("noperm", 1)):
        body = env.call(role, "GET", "/overview").json()
        assert not {"node", "listeners", "contexts"} & set(body), role
        totals = body["object_totals"]
        assert "consumers" not in totals
        assert (totals["connections"], totals["channels"]) == (conns, conns), role
        if role != "noperm":  # (noperm's vhost has as many exchanges, and one queue)
            assert (totals["queues"], totals["exchanges"]) == (vt_queues, vt_exchanges), role


def test_no_password_hash_for_others(env):
    for path in ("/users", "/users/without-permissions", f"/users/{q(USER['mgmt'])}", "/definitions",
                 f"/definitions/{VT}", f"/users/{q(USER['admin'])}"):
        for role in ("none", "mgmt", "pol", "mon", "noperm"):
            r = env.call(role, "GET", path)
            assert r.status_code == 401, (path, role)
            assert "password_hash" not in r.text and "hash" not in r.text, (path, role)
    r = env.call("admin", "GET", "/users")
    assert r.status_code == 200
    assert all("password_hash" in u for u in r.json())


# ------------------------------------------------------------ changes
# (label, set-up as admin, the request, clean-up as admin, answers of none..noperm);
# "{n}" is a name of the calling user's own.
def _changes():
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    publish = {"routing_key": "q1", "properties": {}, "payload": "x", "payload_encoding": "string"}
    user = {"password": "x", "tags": ""}
    vt = q(VT)
    queue = ("PUT", f"/queues/{vt}/{{n}}", {})
    exchange = ("PUT", f"/exchanges/{vt}/{{n}}", {"type": "fanout"})
    new_user = ("PUT", "/users/{n}", user)
    topic = {"exchange": "x1", "write": ".*", "read": ".*"}
    return [
        ("declare queue", [], ("PUT", f"/queues/{vt}/{{n}}", {}), [f"/queues/{vt}/{{n}}"], "NM 201 201 201 201 NV"),
        ("delete queue", [queue], ("DELETE", f"/queues/{vt}/{{n}}", None), [f"/queues/{vt}/{{n}}"],
         "NM 204 204 204 204 NV"),
        ("purge queue", [queue], ("DELETE", f"/queues/{vt}/{{n}}/contents", None), [f"/queues/{vt}/{{n}}"],
         "NM 204 204 204 204 NV"),
        ("get messages", [queue], ("POST", f"/queues/{vt}/{{n}}/get", get), [f"/queues/{vt}/{{n}}"],
         "NM 200 200 200 200 NV"),
        ("declare exchange", [], exchange, [f"/exchanges/{vt}/{{n}}"], "NM 201 201 201 201 NV"),
        ("delete exchange", [exchange], ("DELETE", f"/exchanges/{vt}/{{n}}", None), [f"/exchanges/{vt}/{{n}}"],
         "NM 204 204 204 204 NV"),
        ("publish", [], ("POST", f"/exchanges/{vt}/amq.default/publish", publish), [], "NM 200 200 200 200 NV"),
        ("bind", [queue], ("POST", f"/bindings/{vt}/e/x1/q/{{n}}", {"routing_key": "r"}), [f"/queues/{vt}/{{n}}"],
         "NM 201 201 201 201 NV"),
        ("unbind", [queue, ("POST", f"/bindings/{vt}/e/x1/q/{{n}}", {"routing_key": "r"})],
         ("DELETE", f"/bindings/{vt}/e/x1/q/{{n}}/r", None), [f"/queues/{vt}/{{n}}"], "NM 204 204 204 204 NV"),
        ("set policy", [], ("PUT", f"/policies/{vt}/{{n}}", POLICY), [f"/policies/{vt}/{{n}}"],
         "NM NO 201 NO 201 NO"),
        ("clear policy", [("PUT", f"/policies/{vt}/{{n}}", POLICY)], ("DELETE", f"/policies/{vt}/{{n}}", None),
         [f"/policies/{vt}/{{n}}"], "NM NO 204 NO 204 NO"),
        ("set policy, no vhost", [], ("PUT", "/policies/no-such-vhost/{n}", POLICY), [], "NM NO 404 NO 404 NO"),
        ("clear missing policy", [], ("DELETE", f"/policies/{vt}/{{n}}", None), [], "NM NO 404 NO 404 NO"),
        ("set operator policy", [], ("PUT", f"/operator-policies/{vt}/{{n}}", POLICY),
         [f"/operator-policies/{vt}/{{n}}"], "NM NA NA NA 201 NA"),
        ("clear operator policy", [("PUT", f"/operator-policies/{vt}/{{n}}", POLICY)],
         ("DELETE", f"/operator-policies/{vt}/{{n}}", None), [f"/operator-policies/{vt}/{{n}}"],
         "NM NA NA NA 204 NA"),
        ("set parameter", [], ("PUT", f"/parameters/vhost-limits/{vt}/limits", {"value": {}}),
         [f"/parameters/vhost-limits/{vt}/limits"], "NM NO 201 NO 201 NO"),
        ("clear parameter", [("PUT", f"/parameters/vhost-limits/{vt}/limits", {"value": {}})],
         ("DELETE", f"/parameters/vhost-limits/{vt}/limits", None), [f"/parameters/vhost-limits/{vt}/limits"],
         "NM NO 204 NO 204 NO"),
        ("set global parameter", [], ("PUT", "/global-parameters/{n}", {"value": 1}), ["/global-parameters/{n}"],
         "NM NO 201 NO 201 NO"),
        ("clear global parameter", [("PUT", "/global-parameters/{n}", {"value": 1})],
         ("DELETE", "/global-parameters/{n}", None), ["/global-parameters/{n}"], "NM NO 204 NO 204 NO"),
        ("set vhost limit", [], ("PUT", f"/vhost-limits/{vt}/max-queues", {"value": -1}),
         [f"/parameters/vhost-limits/{vt}/limits"], "NM NA NA NA 204 NA"),
        ("clear vhost limit", [], ("DELETE", f"/vhost-limits/{vt}/max-queues", None),
         [f"/parameters/vhost-limits/{vt}/limits"], "NM NA NA NA 204 NA"),
        ("set user limit", [new_user], ("PUT", "/user-limits/{n}/max-channels", {"value": -1}), ["/users/{n}"],
         "NM NA NA NA 204 NA"),
        ("clear user limit", [new_user], ("DELETE", "/user-limits/{n}/max-channels", None), ["/users/{n}"],
         "NM NA NA NA 204 NA"),
        ("set permission", [new_user], ("PUT", f"/permissions/{vt}/{{n}}", FULL), ["/users/{n}"],
         "NM NA NA NA 201 NA"),
        ("clear permission", [new_user, ("PUT", f"/permissions/{vt}/{{n}}", FULL)],
         ("DELETE", f"/permissions/{vt}/{{n}}", None), ["/users/{n}"], "NM NA NA NA 204 NA"),
        ("set topic permission", [new_user], ("PUT", f"/topic-permissions/{vt}/{{n}}", topic), ["/users/{n}"],
         "NM NA NA NA 201 NA"),
        ("set topic permission, exchange in path", [new_user], ("PUT", f"/topic-permissions/{vt}/{{n}}/x1", topic),
         ["/users/{n}"], "NM NA NA NA 201 NA"),
        ("clear topic permissions", [new_user, ("PUT", f"/topic-permissions/{vt}/{{n}}", topic)],
         ("DELETE", f"/topic-permissions/{vt}/{{n}}", None), ["/users/{n}"], "NM NA NA NA 204 NA"),
        ("clear a topic permission", [new_user, ("PUT", f"/topic-permissions/{vt}/{{n}}", topic)],
         ("DELETE", f"/topic-permissions/{vt}/{{n}}/x1", None), ["/users/{n}"], "NM NA NA NA 204 NA"),
        ("create user", [], new_user, ["/users/{n}"], "NM NA NA NA 201 NA"),
        ("delete user", [new_user], ("DELETE", "/users/{n}", None), ["/users/{n}"], "NM NA NA NA 204 NA"),
        ("bulk-delete users", [new_user], ("POST", "/users/bulk-delete", {"users": ["{n}"]}), ["/users/{n}"],
         "NM NA NA NA 204 NA"),
        ("create vhost", [], ("PUT", "/vhosts/{n}", {}), ["/vhosts/{n}"], "NM NA NA NA 201 NA"),
        ("delete vhost", [("PUT", "/vhosts/{n}", {})], ("DELETE", "/vhosts/{n}", None), ["/vhosts/{n}"],
         "NM NA NA NA 204 NA"),
        ("import definitions", [], ("POST", "/definitions", {"queues": [
            {"name": "{n}", "vhost": VT, "durable": True, "auto_delete": False, "arguments": {}}]}),
         [f"/queues/{vt}/{{n}}"], "NM NA NA NA 204 NA"),
        ("import vhost definitions", [], ("POST", f"/definitions/{vt}", {"queues": [
            {"name": "{n}", "durable": True, "auto_delete": False, "arguments": {}}]}),
         [f"/queues/{vt}/{{n}}"], "NM NA NA NA 204 NA"),
        ("declare queue, no vhost", [], ("PUT", "/queues/no-such-vhost/{n}", {}), [], "NM 404 404 404 404 404"),
        ("delete queue, no vhost", [], ("DELETE", "/queues/no-such-vhost/{n}", None), [],
         "NM 404 404 404 404 404"),
        ("delete missing queue", [], ("DELETE", f"/queues/{vt}/{{n}}", None), [], "NM 404 404 404 404 NV"),
        # Without a name (400 once allowed), so the node keeps its name; test_mgmt_gaps sets it.
        ("set cluster name", [], ("PUT", "/cluster-name", {}), [], "NM NA NA NA 400 NA"),
    ]


CHANGES = _changes()


def _fill_name(value, name: str):
    if isinstance(value, str):
        return value.replace("{n}", name)
    if isinstance(value, dict):
        return {k: _fill_name(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_name(v, name) for v in value]
    return value


@pytest.mark.parametrize("label,setup,request_,cleanup,answers", CHANGES, ids=[c[0] for c in CHANGES])
def test_change(env, label, setup, request_, cleanup, answers):
    for role, token in zip(ROLES, answers.split()):
        name = f"chg-{role}-{SUFFIX}"
        try:
            for method, path, body in setup:
                r = env.call("admin", method, _fill_name(path, name), json=_fill_name(body, name))
                assert r.status_code < 300, (label, path, r.status_code, r.text)
            method, path, body = request_
            check(env.call(role, method, _fill_name(path, name), json=_fill_name(body, name)), token, role, label)
        finally:
            for path in cleanup:
                env.call("admin", "DELETE", _fill_name(path, name))


def test_close_connections(env):
    """A user may close their own connections; only administrators others' (monitoring users
    may read them, not close them)."""
    victim = env.connect("mgmt", VT, "q1")
    env.conns["victim"] = victim
    path = f"/connections/{q(env.connection_name('mgmt', victim))}"
    for role, token in (("none", "NM"), ("pol", "NO"), ("mon", "NO"), ("noperm", "NO")):
        check(env.call(role, "DELETE", path), token, role, "close mgmt's connection")
    assert victim.is_open
    check(env.call("mgmt", "DELETE", path), "204", "mgmt", "close own connection")
    victim2 = env.connect("mgmt", VT, "q1")
    env.conns["victim2"] = victim2
    check(env.call("admin", "DELETE", f"/connections/{q(env.connection_name('mgmt', victim2))}"), "204", "admin",
          "close another's connection")


# ------------------------------------------------------------ AMQP permissions over HTTP
def _refused_text(text: str, what: str, kind: str, name: str) -> bool:
    """RabbitMQ 3.10 says "access to queue 'q' ..."; Warren "read access to queue 'q' ..."
    (3.11+'s wording, see test_permissions.py)."""
    return re.fullmatch(rf"(403 )?ACCESS_REFUSED - ({what} )?access to {kind} '{re.escape(name)}' in vhost "
                        rf"'{re.escape(VT)}' refused for user '{re.escape(USER['lim'])}'", text) is not None


def test_operations_check_amqp_permissions(env):
    """A management user's declare, delete, bind, unbind, purge, get and publish over HTTP are
    checked against their configure/write/read permissions, as the same operations over AMQP
    (lim may use only names starting with "lim-")."""
    vt = q(VT)
    own = f"lim-{SUFFIX}"
    lim = "lim"
    assert env.call(lim, "PUT", f"/queues/{vt}/{own}", {}).status_code == 201
    assert env.call(lim, "PUT", f"/exchanges/{vt}/{own}", {"type": "fanout"}).status_code == 201
    try:
        for method, path, body in [("PUT", f"/queues/{vt}/other-{SUFFIX}", {}),
                                   ("PUT", f"/exchanges/{vt}/other-{SUFFIX}", {"type": "fanout"}),
                                   ("DELETE", f"/queues/{vt}/q1", None), ("DELETE", f"/queues/{vt}/q1/contents", None),
                                   ("DELETE", f"/exchanges/{vt}/x1", None),
                                   ("POST", f"/bindings/{vt}/e/x1/q/{own}", {"routing_key": "r"}),
                                   ("POST", f"/bindings/{vt}/e/{own}/q/q1", {"routing_key": "r"}),
                                   ("DELETE", f"/bindings/{vt}/e/x1/q/q1/k", None)]:
            check(env.call(lim, method, path, body), "AR", lim, f"{method} {path}")
        r = env.call(lim, "POST", f"/queues/{vt}/q1/get", {"count": 1, "ackmode": "ack_requeue_true",
                                                            "encoding": "auto"})
        assert r.status_code == 401 and r.json()["error"] == "not_authorised"
        assert _refused_text(r.json()["reason"], "read", "queue", "q1"), r.text
        r = env.call(lim, "POST", f"/exchanges/{vt}/x1/publish", {"routing_key": "k", "properties": {},
                                                                  "payload": "x", "payload_encoding": "string"})
        assert r.status_code == 400 and r.json()["error"] == "bad_request"
        assert _refused_text(r.json()["reason"], "write", "exchange", "x1"), r.text
        # What the permissions allow works.
        assert env.call(lim, "POST", f"/bindings/{vt}/e/{own}/q/{own}", {"routing_key": "r"}).status_code == 201
        r = env.call(lim, "POST", f"/exchanges/{vt}/{own}/publish", {"routing_key": "r", "properties": {},
                                                                     "payload": "x", "payload_encoding": "string"})
        assert (r.status_code, r.json()) == (200, {"routed": True})
        r = env.call(lim, "POST", f"/queues/{vt}/{own}/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                              "encoding": "auto"})
        assert r.status_code == 200 and [m["payload"] for m in r.json()] == ["x"]
        assert env.call(lim, "DELETE", f"/queues/{vt}/{own}/contents").status_code == 204
        assert env.call(lim, "DELETE", f"/bindings/{vt}/e/{own}/q/{own}/r").status_code == 204
    finally:
        assert env.call(lim, "DELETE", f"/queues/{vt}/{own}").status_code == 204
        assert env.call(lim, "DELETE", f"/exchanges/{vt}/{own}").status_code == 204


def test_administrator_without_permissions(env):
    """An administrator may see a vhost they have no permissions in, but not act in it: the
    operations answer 401 "Access refused." as RabbitMQ's channel cannot open there."""
    vo = q(VO)
    for method, path, body in [
            ("PUT", f"/queues/{vo}/adm-{SUFFIX}", {}), ("DELETE", f"/queues/{vo}/q2", None),
            ("DELETE", f"/queues/{vo}/q2/contents", None),
            ("POST", f"/queues/{vo}/q2/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}),
            ("POST", f"/exchanges/{vo}/amq.default/publish",
             {"routing_key": "q2", "properties": {}, "payload": "x", "payload_encoding": "string"}),
            ("PUT", f"/exchanges/{vo}/adm-{SUFFIX}", {"type": "fanout"}),
            ("POST", f"/bindings/{vo}/e/x2/q/q2", {"routing_key": "r"})]:
        check(env.call("admin", method, path, body), "AR", "admin", f"{method} {path}")
    assert env.call("admin", "GET", f"/queues/{vo}/q2").status_code == 200


def test_warren_alarms_alias(env):
    """/api/healthchecks/alarms is Warren's alias of /api/health/checks/alarms (RabbitMQ 3.10
    has no such path): the same rule."""
    if MGMT:
        pytest.skip("Warren's own path")
    for role, token in zip(ROLES, ANY.split()):
        check(env.call(role, "GET", "/healthchecks/alarms"), token, role, "GET /healthchecks/alarms")


def test_every_route_is_in_the_matrix():
    """Every route Warren serves, with every method, is called by the tests above (so a new
    route needs its row, with RabbitMQ's answers), and declares who may call it."""
    import importlib
    import pkgutil

    from warren.mgmt import api
    from warren.mgmt.access import declared

    exercised = [(m, p) for p, _ in READS for m in ("GET", "HEAD")]
    exercised += [(c[2][0], c[2][1]) for c in CHANGES]
    exercised += [("DELETE", "/connections/{conn:mgmt}"), ("GET", "/healthchecks/alarms"),
                  ("GET", "/connections/no-such-connection/channels")]
    # Warren-only (no RabbitMQ answers to compare with): administrators only, tested in
    # test_alarm_monitors.py::test_settings_endpoints_are_for_administrators.
    exercised += [(m, f"/nodes/X/{p}") for m in ("GET", "HEAD", "PUT")
                  for p in ("vm-memory-high-watermark", "disk-free-limit")]
    # Warren-only, for warrenctl on the control socket alone (forget_cluster_node): no user over
    # TCP passes, tested in tests/cluster/test_ctl_cluster.py.
    exercised += [("DELETE", "/cluster-members/X")]
    # Warren-only, for warrenctl's `rabbitmq-queues` verbs on the control socket alone: no user over
    # TCP passes, tested in tests/cluster/test_quorum_members.py.
    exercised += [(m, "/quorum-queues/X/X/status") for m in ("GET", "HEAD")]
    exercised += [(m, "/quorum-queues/X/X/members/X") for m in ("PUT", "DELETE")]
    exercised += [("POST", "/quorum-queues/grow"), ("POST", "/quorum-queues/shrink")]
    exercised += [("POST", "/quorum-queues/rebalance")]  # (tests/cluster/test_quorum_rebalance.py)
    exercised += [(m, "/stream-replicas/X/X/X") for m in ("PUT", "DELETE")]  # (tests/cluster/test_stream_members.py)
    # The shovel management plugin's routes: tested per tag in test_shovel_move.py::test_who_may_do_what
    # (a RabbitMQ with only the management plugin has none of them).
    exercised += [(m, p) for m in ("GET", "HEAD") for p in ("/shovels", "/shovels/X", "/shovels/vhost/X/X",
                                                             "/shovels/vhost/X/X/restart")]
    exercised += [("DELETE", "/shovels/vhost/X/X"), ("DELETE", "/shovels/vhost/X/X/restart")]
    # The federation management plugin's: tested per tag in test_federation_links.py::test_who_may_see_links.
    exercised += [(m, p) for m in ("GET", "HEAD") for p in ("/federation-links", "/federation-links/X",
                                                             "/federation-links/state/down",
                                                             "/federation-links/state/down/",
                                                             "/federation-links/X/state/down")]
    exercised += [("DELETE", "/federation-links/vhost/X/X/X/restart")]
    concrete = [(m, re.sub(r"\{[^}]*\}", "X", p)) for m, p in exercised]
    missing = []
    for info in pkgutil.iter_modules(api.__path__):
        for route in importlib.import_module(f"{api.__name__}.{info.name}").routes:
            assert declared(route.handler) is not None, (route.method, route.path)
            template = re.sub(r"\\\{[a-z]+\\\}", "[^/]+", re.escape(route.path[len("/api"):]))
            template = template.replace(re.escape("{dtype:[qe]}"), "[qe]")
            if not any(m == route.method and re.fullmatch(template, p) for m, p in concrete):
                missing.append((route.method, route.path))
    assert missing == []
