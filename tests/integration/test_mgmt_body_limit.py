"""management.http.max_body_size: the management API refuses a request body over the limit
(10,000,000 bytes by default) with 400 {"error": "bad_request", "reason": "Exceeded HTTP
request body size limit"}, as RabbitMQ does since 3.11.24 and 3.12.7 (CVE-2023-46118), and
without reading it whole: a Content-Length over the limit is refused before the body is read,
a chunked body once what came passes the limit, and the broker's memory does not grow by the
body's size. Credentials are checked first: a request without valid ones gets its 401, its
body unread. Every route that reads a body is bounded, the definitions upload (JSON, form and
multipart) too; warrenctl on the control socket is not, as rabbitmqctl is not.

Warren-only, but for test_past_the_default_limit_as_rabbitmq, which also runs against RabbitMQ's
node with its management API (WARREN_TEST_MGMT: `tools/rabbitmq_node.py run --plugins
rabbitmq_management`). Debian's 3.10.8 (3.10.8-1.1+deb12u1, CI's) has the fix of 3.11.24 and
3.12.7, with its flaws: it compares the body's size in bits, and only after each of cowboy's
reads of 8,000,000 bytes, so a body of up to 8 MB always passes, whatever the limit; and its
declare routes (PUT of a queue or exchange, POST of a binding) crash with a 500 instead of
refusing. Warren counts bytes and answers 400 on every route, as RabbitMQ 4 does."""

import json
import os
import socket
import time
from types import SimpleNamespace

import pytest
import requests
from urllib3 import encode_multipart_formdata

from conftest import EXTERNAL, process_memory, start_broker
from integration.test_ctl_local import run_ctl
from integration.test_mgmt_resources import Api, bad, expect
from integration.test_warrenctl import ctl

MGMT = os.environ.get("WARREN_TEST_MGMT")

LIMIT = 1000  # the small broker's
DEFAULT = 10_000_000  # RabbitMQ's default
EXCEEDED = "Exceeded HTTP request body size limit"
MB = 1 << 20


def start(tmp_path_factory, config: str | None):
    """A Warren broker with this config (None: none)."""
    if EXTERNAL:
        pytest.skip("Warren only: RabbitMQ's limit counts bits, only past 8 MB")
    args = ("--prometheus-port", "0")
    if config is not None:
        path = tmp_path_factory.mktemp("conf") / "rabbitmq.conf"
        path.write_text(config)
        args = ("--config", str(path), *args)
    return start_broker(*args)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    b = start(tmp_path_factory, f"management.http.max_body_size = {LIMIT}\n")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    """Warren with the default limit, or RabbitMQ's node (WARREN_TEST_MGMT): what has .api."""
    if EXTERNAL:
        if not MGMT:
            pytest.skip("the comparison RabbitMQ node has no management plugin")
        yield SimpleNamespace(api=MGMT)
        return
    b = start(tmp_path_factory, None)
    yield b
    b.stop()


def padded(doc, size: int) -> bytes:
    """doc as JSON, padded with spaces to exactly `size` bytes."""
    text = json.dumps(doc).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


def chunked(data: bytes, piece: int = 64 * 1024):
    """The body as requests sends a generator: Transfer-Encoding: chunked, no Content-Length."""
    for i in range(0, len(data), piece):
        yield data[i:i + piece]


def send(broker, method, path, data, auth=("guest", "guest"), content_type="application/json"):
    return requests.request(method, broker.api + path, data=data, auth=auth, timeout=60,
                            headers={"Content-Type": content_type})


def exceeded(response) -> None:
    bad(response, EXCEEDED)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    return process_memory(pid, "VmHWM")


# ------------------------------------------------------------------ at and past the limit

@pytest.mark.parametrize("stream", [False, True], ids=["content-length", "chunked"])
def test_a_body_at_the_limit_is_read_and_one_byte_more_is_refused(small, uid, stream):
    api = Api(small)
    wrap = chunked if stream else bytes
    expect(send(small, "PUT", f"/queues/%2F/at-{uid}", wrap(padded({"durable": False}, LIMIT))), 201)
    expect(api.get(f"/queues/%2F/at-{uid}"), 200)
    exceeded(send(small, "PUT", f"/queues/%2F/past-{uid}", wrap(padded({"durable": False}, LIMIT + 1))))
    expect(api.get(f"/queues/%2F/past-{uid}"), 404)
    expect(api.delete(f"/queues/%2F/at-{uid}"), 204)


def test_a_long_chunked_body_is_refused_once_past_the_limit(small, uid):
    # 5 MB in 64 KiB chunks: refused without waiting for the end (the rest is discarded).
    exceeded(send(small, "PUT", f"/queues/%2F/long-{uid}", chunked(padded({}, 5 * MB))))
    expect(Api(small).get(f"/queues/%2F/long-{uid}"), 404)


def test_past_the_default_limit_as_rabbitmq(default, uid):
    """11,000,000 bytes are refused with RabbitMQ's 400 on the routes that decode a JSON body,
    without credentials with 401; 7,900,000 bytes are read."""
    api = Api(default)
    big = padded({"password": "pw", "tags": "", "routing_key": "x", "payload": "", "payload_encoding": "string",
                  "properties": {}}, 11_000_000)
    for method, path in [("PUT", f"/vhosts/big-{uid}"), ("PUT", f"/users/big-{uid}"),
                         ("POST", "/exchanges/%2F/amq.default/publish"), ("POST", "/definitions")]:
        exceeded(send(default, method, path, big))
        r = send(default, method, path, big, auth=None)
        assert (r.status_code, r.content) == (401, b""), (method, path)
    expect(api.get(f"/vhosts/big-{uid}"), 404)
    expect(api.get(f"/users/big-{uid}"), 404)
    expect(send(default, "PUT", f"/vhosts/big-{uid}", padded({"description": "padded"}, 7_900_000)), 201)
    assert expect(api.get(f"/vhosts/big-{uid}"), 200).json()["description"] == "padded"
    expect(api.delete(f"/vhosts/big-{uid}"), 204)


def test_the_default_limit(default):
    # Once, at RabbitMQ's default: a body of 10,000,000 bytes is read, one of 10,000,001 is not.
    if EXTERNAL:
        pytest.skip("Warren only: RabbitMQ refuses any body past 8 MB (it counts bits)")
    api = Api(default)
    expect(send(default, "PUT", "/vhosts/at-default", padded({"description": "padded"}, DEFAULT)), 201)
    assert expect(api.get("/vhosts/at-default"), 200).json()["description"] == "padded"
    exceeded(send(default, "PUT", "/vhosts/past-default", padded({}, DEFAULT + 1)))
    expect(api.get("/vhosts/past-default"), 404)


# ------------------------------------------------------------------ every route that reads a body

def _node(broker) -> str:
    return Api(broker).get("/overview").json()["node"]


BODY_ROUTES = [
    ("PUT", "/vhosts/new-vhost"),
    ("PUT", "/users/new-user"),
    ("POST", "/users/bulk-delete"),
    ("PUT", "/permissions/%2F/guest"),
    ("PUT", "/topic-permissions/%2F/guest"),
    ("PUT", "/queues/%2F/new-queue"),
    ("POST", "/queues/%2F/{queue}/get"),
    ("PUT", "/exchanges/%2F/new-exchange"),
    ("POST", "/exchanges/%2F/amq.default/publish"),
    ("POST", "/bindings/%2F/e/amq.direct/q/{queue}"),
    ("POST", "/bindings/%2F/e/amq.direct/e/amq.fanout"),
    ("PUT", "/policies/%2F/new-policy"),
    ("PUT", "/operator-policies/%2F/new-policy"),
    ("PUT", "/parameters/shovel/%2F/new-shovel"),
    ("PUT", "/global-parameters/new-parameter"),
    ("PUT", "/vhost-limits/%2F/max-queues"),
    ("PUT", "/user-limits/guest/max-connections"),
    ("PUT", "/cluster-name"),
    ("PUT", "/nodes/{node}/vm-memory-high-watermark"),
    ("PUT", "/nodes/{node}/disk-free-limit"),
    ("POST", "/definitions"),
    ("POST", "/definitions/%2F"),
]


@pytest.fixture(scope="module")
def small_queue(small):
    expect(Api(small).put("/queues/%2F/holder", {"durable": False}), 201)
    return "holder"


@pytest.mark.parametrize("stream", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("method, path", BODY_ROUTES)
def test_every_route_that_reads_a_body_is_bounded(small, small_queue, method, path, stream):
    api = Api(small)
    before = (api.get("/definitions").json(), api.get("/overview").json()["cluster_name"])
    path = path.format(queue=small_queue, node=_node(small))
    data = padded({}, LIMIT + 1)
    exceeded(send(small, method, path, chunked(data) if stream else data))
    assert (api.get("/definitions").json(), api.get("/overview").json()["cluster_name"]) == before


# ------------------------------------------------------------------ definitions near the limit

def _definitions(prefix: str, size: int) -> dict:
    """Definitions of as many queues as fit in about `size` bytes of JSON."""
    queues: list = []
    length = len(json.dumps({"queues": queues}))
    while length < size - 200:
        queues.append({"name": f"{prefix}-{len(queues)}", "vhost": "/", "durable": False,
                       "auto_delete": False, "arguments": {}})
        length += len(json.dumps(queues[-1])) + 2  # (", " after the one before)
    return {"queues": queues}


def _multipart(text: bytes, size: int) -> tuple[bytes, str]:
    """A form upload of `text` as the field "file", padded (inside the JSON) to `size` bytes."""
    body, content_type = encode_multipart_formdata({"file": ("defs.json", text, "application/json")})
    pad = size - len(body)
    assert pad >= 0
    body, content_type = encode_multipart_formdata({"file": ("defs.json", text + b" " * pad, "application/json")},
                                                   boundary=content_type.split("boundary=")[1])
    assert len(body) == size
    return body, content_type


@pytest.fixture(scope="module")
def mid(tmp_path_factory):
    b = start(tmp_path_factory, "management.http.max_body_size = 200000\n")
    yield b
    b.stop()


@pytest.mark.parametrize("vhost_path", ["", "/%2F"])
def test_definitions_at_the_limit_import_as_json(mid, uid, vhost_path):
    limit = 200_000
    defs = _definitions(f"json-{uid}", limit)
    expect(send(mid, "POST", "/definitions" + vhost_path, padded(defs, limit)), 204)
    names = {q["name"] for q in Api(mid).get("/queues/%2F?columns=name").json()}
    assert {q["name"] for q in defs["queues"]} <= names
    exceeded(send(mid, "POST", "/definitions" + vhost_path, padded(_definitions(f"over-{uid}", limit), limit + 1)))
    names = {q["name"] for q in Api(mid).get("/queues/%2F?columns=name").json()}
    assert not any(name.startswith(f"over-{uid}") for name in names)


@pytest.mark.parametrize("stream", [False, True], ids=["content-length", "chunked"])
def test_definitions_at_the_limit_import_as_a_form_upload(mid, uid, stream):
    limit = 200_000
    wrap = chunked if stream else bytes
    defs = _definitions(f"form-{uid}", limit - 500)
    body, content_type = _multipart(json.dumps(defs).encode(), limit)
    expect(send(mid, "POST", "/definitions", wrap(body), content_type=content_type), 204)
    names = {q["name"] for q in Api(mid).get("/queues/%2F?columns=name").json()}
    assert {q["name"] for q in defs["queues"]} <= names
    over = _definitions(f"over-form-{uid}", limit - 500)
    body, content_type = _multipart(json.dumps(over).encode(), limit + 1)
    exceeded(send(mid, "POST", "/definitions", wrap(body), content_type=content_type))
    # ... and an urlencoded form, as aiohttp reads those too
    exceeded(send(mid, "POST", "/definitions", wrap(b"file=" + b"x" * limit),
                  content_type="application/x-www-form-urlencoded"))
    names = {q["name"] for q in Api(mid).get("/queues/%2F?columns=name").json()}
    assert not any(name.startswith(f"over-form-{uid}") for name in names)
    assert "management.http.max_body_size" in mid.log()  # the warning says how to raise it


def test_warrenctl_on_the_control_socket_has_no_limit(small, uid, tmp_path):
    """As rabbitmqctl's import_definitions, which no HTTP limit bounds; over TCP, with a user,
    warrenctl gets the API's refusal."""
    path = tmp_path / "defs.json"
    defs = _definitions(f"ctl-{uid}", 10 * LIMIT)
    path.write_text(json.dumps(defs))
    refused = ctl(small, "import_definitions", str(path), user="guest", password="guest")
    assert (refused.returncode, refused.stderr.strip().splitlines()[-1]) == (69, EXCEEDED), refused
    local = run_ctl("import_definitions", str(path), data_dir=small.data_dir)
    assert (local.returncode, local.stderr) == (0, ""), local
    names = {q["name"] for q in Api(small).get("/queues/%2F?columns=name").json()}
    assert {q["name"] for q in defs["queues"]} <= names


# ------------------------------------------------------------------ credentials first

def test_credentials_are_checked_before_the_body(small, uid):
    data = padded({}, LIMIT + 1)
    r = send(small, "PUT", f"/queues/%2F/anon-{uid}", data, auth=None)
    assert (r.status_code, r.content, r.headers["WWW-Authenticate"]) == (401, b"", 'Basic realm="RabbitMQ Management"')
    r = send(small, "PUT", f"/queues/%2F/anon-{uid}", data, auth=("guest", "wrong"))
    expect(r, 401, {"error": "not_authorized", "reason": "Login failed"})
    api = Api(small)
    expect(api.put(f"/users/watcher-{uid}", {"password": "pw", "tags": "monitoring"}), 201)
    r = send(small, "POST", "/definitions", data, auth=(f"watcher-{uid}", "pw"))
    assert (r.status_code, r.json()["error"]) == (401, "not_authorised"), r.text
    expect(api.delete(f"/users/watcher-{uid}"), 204)


def _raw_request(broker, head: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.mgmt_port), timeout=10)
    sock.sendall(head.encode())
    return sock


def _read_head(sock) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            break
        data += more
    return data


def test_100_continue_only_once_the_body_is_read(small, uid):
    """As cowboy: a client that waits for 100 Continue (curl does, for big bodies) is told to
    send its body only when it will be read; a refusal comes first and nothing is sent."""
    auth = "Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"  # guest:guest

    def head(name, length, credentials=True):
        return (f"PUT /api/queues/%2F/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"{auth if credentials else ''}Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n")

    with _raw_request(small, head(f"big-{uid}", 50 * MB)) as sock:
        reply = _read_head(sock)
        assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n") and EXCEEDED.encode() in reply, reply
    with _raw_request(small, head(f"big-{uid}", 50 * MB, credentials=False)) as sock:
        assert _read_head(sock).startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    body = padded({"durable": False}, 100)
    with _raw_request(small, head(f"small-{uid}", len(body))) as sock:
        assert _read_head(sock) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert _read_head(sock).startswith(b"HTTP/1.1 201 Created\r\n")
    expect(Api(small).delete(f"/queues/%2F/small-{uid}"), 204)


# ------------------------------------------------------------------ memory

def _grows_by(broker, method, path, data, auth=("guest", "guest")):
    before = peak_rss(broker.proc.pid)
    response = send(broker, method, path, data, auth=auth)
    time.sleep(0.2)
    return response, peak_rss(broker.proc.pid) - before


def test_a_refused_50_mb_body_does_not_grow_the_broker(tmp_path_factory, uid):
    """The peak RSS (VmHWM) of fresh brokers (nothing else raised it before) around each
    request: a 50 MB body with a Content-Length is refused unread (with or without
    credentials); a chunked one is read up to the limit at most."""
    body = padded({}, 50 * 1000 * 1000)
    fresh = start(tmp_path_factory, None)
    fresh_small = start(tmp_path_factory, f"management.http.max_body_size = {LIMIT}\n")
    try:
        r, grown = _grows_by(fresh, "PUT", f"/queues/%2F/huge-{uid}", body)
        exceeded(r)
        assert grown < 5 * MB, grown
        r, grown = _grows_by(fresh, "PUT", f"/queues/%2F/huge-{uid}", body, auth=None)
        assert r.status_code == 401 and grown < 5 * MB, grown
        r, grown = _grows_by(fresh_small, "PUT", f"/queues/%2F/huge-{uid}", chunked(body))
        exceeded(r)
        assert grown < 5 * MB, grown
        r, grown = _grows_by(fresh, "PUT", f"/queues/%2F/huge-{uid}", chunked(body))
        exceeded(r)
        assert grown < 25 * MB, grown  # the 10 MB read, not the 50
        expect(Api(fresh).get(f"/queues/%2F/huge-{uid}"), 404)
    finally:
        fresh.stop()
        fresh_small.stop()
