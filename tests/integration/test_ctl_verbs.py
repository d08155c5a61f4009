"""warrenctl's verbs for the cluster name, topic permissions, vhost and user limits and runtime
parameters: rabbitmqctl 3.10's informational lines, output, errors and exit codes, over the
management API's paths (/api/cluster-name, /api/topic-permissions, /api/vhost-limits,
/api/user-limits, /api/parameters, /api/global-parameters).

Warren by default (a broker per module, warrenctl with --port). The same tests describe
RabbitMQ: with WARREN_TEST_BROKER and its management API in WARREN_TEST_MGMT (as
`tools/rabbitmq_node.py run --plugins rabbitmq_management` sets them) or WARREN_TEST_MGMT_PORT,
warrenctl is pointed at RabbitMQ's management plugin instead. The expected texts were taken
from rabbitmqctl 3.10.8 on such a node.
"""

import json
import os
import subprocess
import urllib.parse

import pytest

from conftest import EXTERNAL, start_broker
from warrenctl_path import WARRENCTL



def _external_mgmt_port() -> int | None:
    if os.environ.get("WARREN_TEST_MGMT_PORT"):
        return int(os.environ["WARREN_TEST_MGMT_PORT"])
    url = os.environ.get("WARREN_TEST_MGMT")
    return urllib.parse.urlsplit(url).port if url else None


@pytest.fixture(scope="module")
def port():
    if EXTERNAL:
        mgmt = _external_mgmt_port()
        if mgmt is None:
            pytest.skip("needs a management API: WARREN_TEST_MGMT or WARREN_TEST_MGMT_PORT")
        yield mgmt
        return
    b = start_broker()
    yield b.mgmt_port
    b.stop()


def ctl(port, *args):
    assert WARRENCTL, "warrenctl is not installed: run `pip install -e .`"
    return subprocess.run([WARRENCTL, "--port", str(port), *args], capture_output=True, text=True, timeout=60)


def ok(port, *args) -> str:
    r = ctl(port, *args)
    assert (r.returncode, r.stderr) == (0, ""), r
    return r.stdout


def fails(port, code, *args, out=None, err=None):
    r = ctl(port, *args)
    assert r.returncode == code, r
    if out is not None:
        assert r.stdout == out, r
    if err is not None:
        assert r.stderr == err, r
    assert "Traceback" not in r.stderr
    return r


@pytest.fixture
def vhost_user(port, uid):
    vhost, user = f"v-{uid}", f"u-{uid}"
    ok(port, "add_vhost", vhost)
    ok(port, "add_user", user, "pw")
    yield vhost, user
    ctl(port, "delete_vhost", vhost)
    ctl(port, "delete_user", user)


def test_set_cluster_name(port, uid):
    before = json.loads(ok(port, "list_global_parameters", "--formatter", "json"))
    old = [json.loads(p["value"]) for p in before if p["name"] == "cluster_name"]
    try:
        assert ok(port, "set_cluster_name", f"c {uid}") == f"Setting cluster name to c {uid} ...\n"
        assert f'cluster_name\t"c {uid}"' in ok(port, "list_global_parameters").splitlines()
        fails(port, 64, "set_cluster_name")
        fails(port, 64, "set_cluster_name", "a", "b")
    finally:
        if old:
            ok(port, "set_cluster_name", old[0])


def test_topic_permissions(port, vhost_user):
    vhost, user = vhost_user
    assert ok(port, "list_topic_permissions", "-p", vhost) == \
        f'Listing topic permissions for vhost "{vhost}" ...\n\n'
    assert ok(port, "set_topic_permissions", "-p", vhost, user, "amq.topic", "^a", "^b") == \
        f'Setting topic permissions on "amq.topic" for user "{user}" in vhost "{vhost}" ...\n'
    ok(port, "set_topic_permissions", "-p", vhost, user, "x2", ".*", ".*")
    ok(port, "set_topic_permissions", "-p", vhost, user, "x3", "w", "r")
    lines = ok(port, "list_topic_permissions", "-p", vhost).splitlines()
    # (RabbitMQ lists them in its table's order, which is no order: compare as sets.)
    assert lines[:2] == [f'Listing topic permissions for vhost "{vhost}" ...', "user\texchange\twrite\tread"]
    assert sorted(lines[2:]) == [f"{user}\tamq.topic\t^a\t^b", f"{user}\tx2\t.*\t.*", f"{user}\tx3\tw\tr"]
    listed = json.loads(ok(port, "list_topic_permissions", "-p", vhost, "--formatter", "json"))
    assert sorted(listed, key=lambda p: p["exchange"])[0] == \
        {"user": user, "exchange": "amq.topic", "write": "^a", "read": "^b"}
    # This listing has no header row in rabbitmqctl 3.10.
    lines = ok(port, "list_user_topic_permissions", user).splitlines()
    assert lines[0] == f'Listing topic permissions for user "{user}" ...'
    assert sorted(lines[1:]) == [f"{vhost}\tamq.topic\t^a\t^b", f"{vhost}\tx2\t.*\t.*", f"{vhost}\tx3\tw\tr"]
    listed = json.loads(ok(port, "list_user_topic_permissions", user, "--formatter", "json"))
    assert {"vhost": vhost, "exchange": "x3", "write": "w", "read": "r"} in listed

    # Clearing one exchange's keeps the others'.
    assert ok(port, "clear_topic_permissions", "-p", vhost, user, "x2") == \
        f'Clearing topic permissions on "x2" for user "{user}" in vhost "{vhost}" ...\n'
    assert sorted(ok(port, "-q", "list_topic_permissions", "-p", vhost).splitlines()[1:]) == \
        [f"{user}\tamq.topic\t^a\t^b", f"{user}\tx3\tw\tr"]
    ok(port, "clear_topic_permissions", "-p", vhost, user, "x2")  # already gone: no error
    assert ok(port, "clear_topic_permissions", "-p", vhost, user) == \
        f'Clearing topic permissions for user "{user}" in vhost "{vhost}" ...\n'
    assert ok(port, "-q", "list_topic_permissions", "-p", vhost) == "\n"
    ok(port, "clear_topic_permissions", "-p", vhost, user)

    # Errors, with rabbitmqctl's texts and exit codes.
    fails(port, 67, "set_topic_permissions", "-p", vhost, "nobody-x", "amq.topic", "a", "b",
          err="Error:\nUser nobody-x does not exist\n")
    fails(port, 69, "set_topic_permissions", "-p", "no-such-vhost", user, "amq.topic", "a", "b",
          err="Error:\nVirtual host no-such-vhost does not exist\n")
    fails(port, 67, "clear_topic_permissions", "-p", vhost, "nobody-x",
          err="Error:\nUser nobody-x does not exist\n")
    fails(port, 69, "clear_topic_permissions", "-p", "no-such-vhost", user,
          err="Error:\nVirtual host no-such-vhost does not exist\n")
    fails(port, 65, "list_topic_permissions", "-p", "no-such-vhost",
          err="Virtual host 'no-such-vhost' does not exist\n")
    fails(port, 69, "list_user_topic_permissions", "nobody-x",
          out='Listing topic permissions for user "nobody-x" ...\n', err='Error:\n{:no_such_user, "nobody-x"}\n')
    r = fails(port, 69, "set_topic_permissions", "-p", vhost, user, "amq.topic", "(", "b")
    assert r.stderr.startswith("Error:\n") and "invalid_regexp" in r.stderr
    fails(port, 64, "set_topic_permissions", "-p", vhost, user, "amq.topic", "a")
    fails(port, 64, "clear_topic_permissions", user, "x", "y")


def test_vhost_limits(port, vhost_user):
    vhost, _ = vhost_user
    assert ok(port, "list_vhost_limits", "-p", vhost) == f'Listing limits for vhost "{vhost}" ...\n\n'
    assert ok(port, "set_vhost_limits", "-p", vhost, '{"max-queues": 5, "max-connections": 10}') == \
        f'Setting vhost limits to "{{"max-queues": 5, "max-connections": 10}}" for vhost "{vhost}" ...\n'
    assert ok(port, "list_vhost_limits", "-p", vhost) == \
        f'Listing limits for vhost "{vhost}" ...\n{{"max-connections":10,"max-queues":5}}\n'
    assert f'{vhost}\t{{"max-connections":10,"max-queues":5}}' in ok(port, "list_vhost_limits", "--global")
    listed = json.loads(ok(port, "list_vhost_limits", "--global", "--formatter", "json"))
    assert {"vhost": vhost, "limits": '{"max-connections":10,"max-queues":5}'} in listed
    # As rabbitmqctl's, a definition replaces the vhost's limits.
    ok(port, "set_vhost_limits", "-p", vhost, '{"max-queues": 7}')
    assert ok(port, "-q", "list_vhost_limits", "-p", vhost) == '{"max-queues":7}\n'
    fails(port, 69, "set_vhost_limits", "-p", vhost, '{"max-connections": "x"}',
          out=f'Setting vhost limits to "{{"max-connections": "x"}}" for vhost "{vhost}" ...\n',
          err='Error:\nValidation failed\n\nmax-connections should be a number, actually was <<"x">>\n\n')
    fails(port, 69, "set_vhost_limits", "-p", vhost, '{"foo": 1}',
          err='Error:\nValidation failed\n\nUnrecognised terms [{<<"foo">>,1}] in limits\n\n')
    fails(port, 69, "set_vhost_limits", "-p", vhost, "notjson",
          out=f'Setting vhost limits to "notjson" for vhost "{vhost}" ...\n',
          err="Error:\nJSON decoding error. Reason: badarg\n")
    fails(port, 65, "set_vhost_limits", "-p", "no-such-vhost", '{"max-queues": 5}',
          err="Virtual host 'no-such-vhost' does not exist\n")
    fails(port, 65, "list_vhost_limits", "-p", "no-such-vhost", err="Virtual host 'no-such-vhost' does not exist\n")
    assert ok(port, "clear_vhost_limits", "-p", vhost) == f'Clearing vhost "{vhost}" limits ...\n'
    assert ok(port, "-q", "list_vhost_limits", "-p", vhost) == ""
    fails(port, 69, "clear_vhost_limits", "-p", vhost, err="Error:\nParameter does not exist\n")
    fails(port, 69, "clear_vhost_limits", "-p", "no-such-vhost", err="Error:\nParameter does not exist\n")
    # Cleared entirely: nothing left among the vhost's parameters either.
    assert ok(port, "-q", "list_parameters", "-p", vhost) == "\n"


def test_user_limits(port, vhost_user):
    _, user = vhost_user
    assert ok(port, "list_user_limits", "--user", user) == f'Listing limits for user "{user}" ...\n{{}}\n'
    assert ok(port, "list_user_limits").startswith('Listing limits for user "guest" ...\n')
    assert ok(port, "set_user_limits", user, '{"max-connections": 10}') == \
        f'Setting user limits to "{{"max-connections": 10}}" for user "{user}" ...\n'
    ok(port, "set_user_limits", user, '{"max-channels": 5}')  # added to the others, as rabbitmqctl
    assert ok(port, "list_user_limits", "--user", user) == \
        f'Listing limits for user "{user}" ...\n{{"max-channels":5,"max-connections":10}}\n'
    assert ok(port, "list_user_limits", "--user", user, "--formatter", "json") == \
        '{"message":"{\\"max-channels\\":5,\\"max-connections\\":10}"}\n'
    assert f'{user}\t{{"max-channels":5,"max-connections":10}}' in ok(port, "list_user_limits", "--global")
    fails(port, 69, "set_user_limits", user, '{"max-connections": "x"}',
          err='Error:\nmax-connections should be a number, actually was <<"x">>\n')
    fails(port, 69, "set_user_limits", user, '{"foo": 1}', err='Error:\nUnrecognised terms [{<<"foo">>,1}] in user-limits\n')
    fails(port, 69, "set_user_limits", user, "nojson", err="Error:\nJSON decoding error. Reason: badarg\n")
    fails(port, 69, "set_user_limits", "nobody-x", '{"max-channels": 5}', err='Error:\n{:no_such_user, "nobody-x"}\n')
    fails(port, 69, "list_user_limits", "--user", "nobody-x", err='Error:\n{:no_such_user, "nobody-x"}\n')
    assert ok(port, "clear_user_limits", user, "max-channels") == \
        f'Clearing "max-channels" limit for user "{user}" ...\n'
    assert ok(port, "-q", "list_user_limits", "--user", user) == '{"max-connections":10}\n'
    ok(port, "clear_user_limits", user, "max-channels")  # not set: no error
    assert ok(port, "clear_user_limits", user, "all") == f'Clearing all limits for user "{user}" ...\n'
    assert ok(port, "-q", "list_user_limits", "--user", user) == "{}\n"
    fails(port, 69, "clear_user_limits", "nobody-x", "all", err='Error:\n{:no_such_user, "nobody-x"}\n')
    fails(port, 64, "clear_user_limits", user)


def test_parameters(port, vhost_user):
    vhost, _ = vhost_user
    assert ok(port, "list_parameters", "-p", vhost) == f'Listing runtime parameters for vhost "{vhost}" ...\n\n'
    # vhost-limits is the one component every RabbitMQ node (and Warren) has.
    assert ok(port, "set_parameter", "-p", vhost, "vhost-limits", "limits", '{"max-queues":3}') == \
        (f'Setting runtime parameter "limits" for component "vhost-limits" to "{{"max-queues":3}}" '
         f'in vhost "{vhost}" ...\n')
    assert ok(port, "list_parameters", "-p", vhost) == (f'Listing runtime parameters for vhost "{vhost}" ...\n'
                                                        'component\tname\tvalue\nvhost-limits\tlimits\t{"max-queues":3}\n')
    assert json.loads(ok(port, "list_parameters", "-p", vhost, "--formatter", "json")) == \
        [{"component": "vhost-limits", "name": "limits", "value": '{"max-queues":3}'}]
    assert ok(port, "-q", "list_vhost_limits", "-p", vhost) == '{"max-queues":3}\n'
    fails(port, 69, "set_parameter", "-p", vhost, "vhost-limits", "limits", "nojson",
          err="Error:\nJSON decoding error. Reason: badarg\n")
    fails(port, 69, "set_parameter", "-p", vhost, "vhost-limits", "limits", '{"max-queues":"x"}',
          err='Error:\nValidation failed\n\nmax-queues should be a number, actually was <<"x">>\n\n')
    fails(port, 69, "set_parameter", "-p", vhost, "no-such-component", "p1", '{"a":1}',
          err="Error:\nValidation failed\n\ncomponent no-such-component not found\n\n")
    assert ok(port, "clear_parameter", "-p", vhost, "vhost-limits", "limits") == \
        f'Clearing runtime parameter "limits" for component "vhost-limits" on vhost "{vhost}" ...\n'
    fails(port, 69, "clear_parameter", "-p", vhost, "vhost-limits", "limits",
          err="Error:\nParameter does not exist\n")
    fails(port, 65, "list_parameters", "-p", "no-such-vhost", err="Virtual host 'no-such-vhost' does not exist\n")


def test_global_parameters(port, uid):
    name = f"g-{uid}"
    assert ok(port, "set_global_parameter", name, '{"a":1}') == \
        f'Setting global runtime parameter "{name}" to "{{"a":1}}" ...\n'
    ok(port, "set_global_parameter", name + "s", '"text"')
    lines = ok(port, "list_global_parameters").splitlines()
    assert lines[:2] == ["Listing global runtime parameters ...", "name\tvalue"]
    assert f'{name}\t{{"a":1}}' in lines and f'{name}s\t"text"' in lines
    assert {"name": name, "value": '{"a":1}'} in json.loads(ok(port, "list_global_parameters", "--formatter", "json"))
    fails(port, 69, "set_global_parameter", name, "notjson",
          out=f'Setting global runtime parameter "{name}" to "notjson" ...\n',
          err="Error:\nJSON decoding error. Reason: badarg\n")
    assert ok(port, "clear_global_parameter", name) == f'Clearing global runtime parameter "{name}" ...\n'
    ok(port, "clear_global_parameter", name + "s")
    fails(port, 69, "clear_global_parameter", name, err="Error:\nParameter does not exist\n")
    assert name not in ok(port, "list_global_parameters")
