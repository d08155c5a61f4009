"""Connections, channels and consumers over a cluster of three nodes a, b, c, as RabbitMQ's
API shows them: listed through any node with every running node's (each naming its `node`),
one of another node read and closed through any node, a queue's consumers on every node in its
consumer_details, the overview's totals the cluster's; and the limits of a vhost's and a
user's connections and a user's channels counted over every running node. A node that does
not answer (SIGSTOP) is left out of a listing after a second.

The same tests run against a RabbitMQ 3.10 cluster with WARREN_TEST_RABBITMQ_CLUSTER=1
(members.py), but for the hung node's (Warren's bound)."""

from __future__ import annotations

import signal
import time
import uuid
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
import requests
from pamqp import commands

import rawamqp

from .members import AUTH, RABBITMQ, Member, wait_for

PASSWORD = "listings-pw"


def api(member: Member, method: str, path: str, auth=AUTH, **kwargs) -> requests.Response:
    return requests.request(method, member.api + path, auth=auth, timeout=10, **kwargs)


def named(member: Member, name: str, **kwargs) -> pika.BlockingConnection:
    """A connection to `member` that the API lists with user_provided_name `name`."""
    return member.connect(client_properties={"connection_name": name}, heartbeat=0, **kwargs)


def listed(member: Member, path: str, **params) -> list:
    answer = api(member, "GET", path, params=params)
    assert answer.status_code == 200, (path, answer.status_code, answer.text)
    return answer.json()


def by_provided_name(member: Member, path: str, prefix: str) -> dict[str, dict]:
    return {c["user_provided_name"]: c for c in listed(member, path)
            if str(c.get("user_provided_name", "")).startswith(prefix)}


@pytest.fixture
def tag():
    return "ls-" + uuid.uuid4().hex[:8]


@pytest.fixture
def temporary(members):
    """Users and vhosts made through a's API, deleted after the test (RabbitMQ's cluster
    lives for the session)."""
    made: list[str] = []

    def user(name: str, tags: str = "", vhost: str = "/") -> str:
        assert api(members[0], "PUT", f"/users/{name}", json={"password": PASSWORD, "tags": tags}).ok
        assert api(members[0], "PUT", f"/permissions/{quote(vhost, safe='')}/{name}",
                   json={"configure": ".*", "write": ".*", "read": ".*"}).ok
        made.append(f"/users/{name}")
        return name

    def vhost(name: str) -> str:
        assert api(members[0], "PUT", f"/vhosts/{name}").ok
        assert api(members[0], "PUT", f"/permissions/{name}/guest",
                   json={"configure": ".*", "write": ".*", "read": ".*"}).ok
        made.append(f"/vhosts/{name}")
        return name

    yield user, vhost
    for path in reversed(made):
        api(members[0], "DELETE", path)


def test_a_connection_is_listed_read_and_closed_through_any_node(members, tag):
    a, b, c = members
    on = {m.name: named(m, f"{tag}-{i}") for i, m in enumerate(members)}
    for m, connection in zip(members, on.values()):
        connection.channel()
        connection.channel()
    expected = {f"{tag}-{i}": m.name for i, m in enumerate(members)}
    for through in members:
        # (RabbitMQ's channel counts follow the connections' next statistics, within 5 s)
        found = wait_for(lambda: (records := by_provided_name(through, "/connections", tag)) and [
            r["channels"] for r in records.values()] == [2, 2, 2] and records, what=f"{through.name}'s list")
        assert {name: record["node"] for name, record in found.items()} == expected, through.name
        in_vhost = by_provided_name(through, "/vhosts/%2F/connections", tag)
        assert {name: record["node"] for name, record in in_vhost.items()} == expected
        # Paged and sorted over the merged list, as on one node.
        page = api(through, "GET", "/connections", params={"page": 1, "page_size": 500,
                                                          "sort": "user_provided_name", "sort_reverse": "true"}).json()
        assert [item["user_provided_name"] for item in page["items"]
                if item.get("user_provided_name", "").startswith(tag)] == [f"{tag}-2", f"{tag}-1", f"{tag}-0"]
        assert page["total_count"] >= 3
    records = by_provided_name(a, "/connections", tag)
    on_b_name = records[f"{tag}-1"]["name"]
    # Read through a and c: the record b shows of it.
    for through in (a, c):
        one = api(through, "GET", f"/connections/{quote(on_b_name, safe='')}")
        assert one.status_code == 200, one.text
        assert (one.json()["name"], one.json()["node"], one.json()["user_provided_name"]) == (
            on_b_name, b.name, f"{tag}-1")
        assert one.json()["channels"] == 2
        channels = listed(through, f"/connections/{quote(on_b_name, safe='')}/channels")
        assert sorted((ch["name"], ch["node"], ch["number"]) for ch in channels) == [
            (f"{on_b_name} (1)", b.name, 1), (f"{on_b_name} (2)", b.name, 2)]
        channel = api(through, "GET", f"/channels/{quote(on_b_name + ' (2)', safe='')}")
        assert channel.status_code == 200, channel.text
        assert (channel.json()["node"], channel.json()["number"], channel.json()["consumer_details"]) == (b.name, 2, [])
        everywhere = [ch for ch in listed(through, "/channels") if ch["connection_details"]["name"] in
                      {r["name"] for r in records.values()}]
        assert sorted((ch["node"], ch["number"]) for ch in everywhere) == sorted(
            (m.name, n) for m in members for n in (1, 2))
    assert api(c, "GET", "/connections/no-such-connection").status_code == 404
    # Closed through c, with the reason given.
    closed = api(c, "DELETE", f"/connections/{quote(on_b_name, safe='')}", headers={"X-Reason": "go away"})
    assert closed.status_code == 204, closed.text
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        on[b.name].process_data_events(time_limit=5)
        on[b.name].process_data_events(time_limit=5)
    assert (err.value.reply_code, err.value.reply_text) == (320, "CONNECTION_FORCED - go away")
    wait_for(lambda: set(by_provided_name(a, "/connections", tag)) == {f"{tag}-0", f"{tag}-2"},
             what="the closed connection gone from a's list")
    for connection in on.values():
        if connection.is_open:
            connection.close()


def test_consumers_of_a_queue_on_every_node(members, tag):
    a, b, c = members
    on_a = named(a, f"{tag}-a")
    on_a.channel().queue_declare("q", durable=True)
    on_b, on_c = named(b, f"{tag}-b"), named(c, f"{tag}-c")
    on_b.channel().basic_consume("q", lambda *delivery: None, consumer_tag=f"{tag}-on-b")
    via_c = on_c.channel()
    via_c.basic_qos(prefetch_count=7)
    via_c.basic_consume("q", lambda *delivery: None, consumer_tag=f"{tag}-on-c")
    wanted = [(f"{tag}-on-b", b.name, 0), (f"{tag}-on-c", c.name, 7)]

    def details(through: Member) -> list:
        queue = api(through, "GET", "/queues/%2F/q").json()
        # (RabbitMQ shows channel_details [] until the channel's first statistics)
        return sorted((d["consumer_tag"], d["channel_details"]["node"], d["prefetch_count"])
                      for d in queue["consumer_details"] if d["channel_details"])
    for through in members:
        assert wait_for(lambda: details(through) == wanted and details(through),
                        what=f"the consumers in {through.name}'s consumer_details") == wanted
        for path in ("/consumers", "/consumers/%2F"):
            mine = sorted((d["consumer_tag"], d["channel_details"]["node"], d["prefetch_count"])
                          for d in listed(through, path) if d["consumer_tag"].startswith(tag))
            assert mine == wanted, (through.name, path)
    for connection in (on_c, on_b, on_a):
        connection.close()


def test_the_overviews_totals_are_the_clusters(members, tag):
    """The overview's counts through each node are those of the cluster's listings."""
    def totals(member: Member) -> tuple:
        t = api(member, "GET", "/overview").json()["object_totals"]
        return t["connections"], t["channels"], t["consumers"]

    def listings(member: Member) -> tuple:
        return tuple(len(listed(member, path)) for path in ("/connections", "/channels", "/consumers"))
    a, b, c = members
    connections = [named(m, f"{tag}-{i}") for i, m in enumerate(members)]
    connections[0].channel().queue_declare("q", durable=True)
    for connection in connections:
        connection.channel().basic_consume("q", lambda *delivery: None)
        connection.channel()
    for member in members:
        wait_for(lambda: len(by_provided_name(member, "/connections", tag)) == 3, what=f"{member.name} lists ours")
        counted = wait_for(lambda: (seen := totals(member)) == listings(member) and seen,
                           what=f"{member.name}'s totals as its listings")
        # (with those of other tests, RabbitMQ's cluster lives for the session)
        assert all(n >= least for n, least in zip(counted, (3, 7, 3))), (member.name, counted)
    for connection in connections:
        connection.close()


def refused(member: Member, user: str, password: str, vhost: str = "/") -> tuple[int, str] | None:
    """The connection.close that refused a connection.open (pika reports it as a probable
    access denial), or None once one opens."""
    try:
        member.connect(credentials=pika.PlainCredentials(user, password), virtual_host=vhost).close()
        return None
    except pika.exceptions.ProbableAccessDeniedError as err:
        code, _, text = str(err.args[0]).partition("ConnectionClosedByBroker: (")[2].partition(") ")
        return int(code), text.strip('"')


def test_connection_limits_count_every_node(members, temporary, tag):
    a, b, c = members
    make_user, make_vhost = temporary
    user = make_user(f"{tag}-u")
    assert api(a, "PUT", f"/user-limits/{user}/max-connections", json={"value": 2}).ok
    first = a.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    second = b.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    text = f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (2) is reached"
    for member in members:
        assert wait_for(lambda: refused(member, user, PASSWORD), what="the limit") == (530, text), member.name
    first.close()
    wait_for(lambda: refused(c, user, PASSWORD) is None, what="room again once one closed")
    second.close()

    vhost = make_vhost(f"{tag}-v")
    assert api(a, "PUT", f"/vhost-limits/{vhost}/max-connections", json={"value": 1}).ok
    first = b.connect(virtual_host=vhost)
    text = f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (1) is reached"
    for member in (a, c):
        assert wait_for(lambda: refused(member, "guest", "guest", vhost), what="the limit") == (530, text)
    first.close()
    wait_for(lambda: refused(a, "guest", "guest", vhost) is None, what="room again")


def test_channel_limit_counts_every_node(members, temporary, tag):
    a, b, c = members
    make_user, _ = temporary
    user = make_user(f"{tag}-u")
    assert api(a, "PUT", f"/user-limits/{user}/max-channels", json={"value": 2}).ok
    on_a = a.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    on_b = b.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    on_c = c.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    on_a.channel()
    kept = on_b.channel()
    time.sleep(1)  # (RabbitMQ counts channels asynchronously)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        on_c.channel()
    assert (err.value.reply_code, err.value.reply_text) == (
        530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum allowed user "
             "limit of (2)")
    kept.close()
    time.sleep(1)
    on_a.channel()  # room again
    for connection in (on_a, on_b):
        connection.close()


def test_channel_opens_that_wait_for_the_counts_keep_the_frames_order(members, temporary, tag):
    """Under a max-channels limit a channel.open waits for the other nodes' counts: the frames
    sent after it in the same write are answered after its open-ok, in order."""
    a, b, c = members
    make_user, _ = temporary
    user = make_user(f"{tag}-u")
    assert api(a, "PUT", f"/user-limits/{user}/max-channels", json={"value": 3}).ok
    on_b = b.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    on_b.channel()
    time.sleep(1)  # (RabbitMQ counts channels asynchronously)
    raw = rawamqp.RawClient(a.host, a.port, timeout=10)
    raw.handshake(user, PASSWORD)
    raw.send(b"".join(rawamqp.frame(1, ch, rawamqp.method_payload(method)) for ch, method in (
        (1, commands.Channel.Open()), (1, commands.Queue.Declare(queue="", exclusive=True)),
        (2, commands.Channel.Open()), (2, commands.Basic.Qos(prefetch_count=5)),
        (3, commands.Channel.Open()))))
    answers: dict[int, list[str]] = {}
    for f in (raw.read_frame() for _ in range(5)):
        answers.setdefault(f.channel, []).append(type(f.value).__name__)
    # (in order on each channel: RabbitMQ's channels answer side by side)
    assert answers == {1: ["OpenOk", "DeclareOk"], 2: ["OpenOk", "QosOk"], 0: ["Close"]}
    raw.close()
    on_b.close()


def test_a_user_sees_its_own_connections_on_every_node(members, temporary, tag):
    a, b, c = members
    make_user, _ = temporary
    mine, other = make_user(f"{tag}-m", "management"), make_user(f"{tag}-o")
    on_a = named(a, f"{tag}-mine", credentials=pika.PlainCredentials(mine, PASSWORD))
    on_b = named(b, f"{tag}-other", credentials=pika.PlainCredentials(other, PASSWORD))
    on_b.channel()
    as_mine = (mine, PASSWORD)
    found = wait_for(lambda: len(by_provided_name(c, "/connections", tag)) == 2
                     and by_provided_name(c, "/connections", tag), what="both listed")
    seen = api(c, "GET", "/connections", auth=as_mine).json()
    assert {r["user_provided_name"] for r in seen} == {f"{tag}-mine"}
    assert api(c, "GET", "/channels", auth=as_mine).json() == []
    other_name = quote(found[f"{tag}-other"]["name"], safe="")
    for path in (f"/connections/{other_name}", f"/connections/{other_name}/channels", f"/channels/{other_name}%20(1)"):
        answer = api(c, "GET", path, auth=as_mine)
        assert (answer.status_code, answer.json()) == (
            401, {"error": "not_authorised", "reason": "User not authorised to access object"}), path
    answer = api(c, "DELETE", f"/connections/{other_name}", auth=as_mine)
    assert answer.status_code == 401
    assert on_b.is_open
    mine_name = quote(found[f"{tag}-mine"]["name"], safe="")
    assert api(c, "GET", f"/connections/{mine_name}", auth=as_mine).json()["node"] == a.name
    # Deleting the user through c closes its connection on b.
    assert api(c, "DELETE", f"/users/{other}").status_code == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        on_b.process_data_events(time_limit=5)
        on_b.process_data_events(time_limit=5)
    assert (err.value.reply_code, err.value.reply_text) == (
        320, f"CONNECTION_FORCED - user '{other}' is deleted")
    on_a.close()


@pytest.mark.skipif(RABBITMQ, reason="Warren's bound: RabbitMQ's API waits for a hung node much longer")
def test_a_hung_node_is_left_out_after_a_second(members, temporary, tag):
    a, b, c = members
    make_user, _ = temporary
    connections = [named(m, f"{tag}-{i}") for i, m in enumerate(members)]
    wait_for(lambda: len(by_provided_name(a, "/connections", tag)) == 3, what="all three listed")
    user = make_user(f"{tag}-u")
    assert api(a, "PUT", f"/user-limits/{user}/max-channels", json={"value": 5}).ok
    limited = a.connect(credentials=pika.PlainCredentials(user, PASSWORD))
    c.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        found = by_provided_name(a, "/connections", tag)
        took = time.monotonic() - started
        assert set(found) == {f"{tag}-0", f"{tag}-1"}
        assert 0.9 < took < 3, took
        started = time.monotonic()
        limited.channel()  # waits for b's count and no more than the bound for c's
        assert time.monotonic() - started < 3
    finally:
        c.signal(signal.SIGCONT)
    wait_for(lambda: len(by_provided_name(a, "/connections", tag)) == 3, what="c answers again")
    for connection in [limited, *connections]:
        connection.close()
