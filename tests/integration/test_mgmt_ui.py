"""The management web UI's serving (warren.mgmt.webui): the page at / and every file it loads
under /ui/, without authentication (as RabbitMQ serves its UI), with their content types; no
file loads anything from another origin; nothing outside the UI's files can be named; the
API still asks for credentials; the files are package data; HTTPS serves them too.

The UI's behaviour in a browser is tests/browser/'s."""

import fnmatch
import http.client
import os
import re
import socket
import time
import tomllib
from importlib import resources

import pytest
import requests

from conftest import EXTERNAL, free_port, password_hash, start_broker
from tls_certs import TestCerts

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="the comparison RabbitMQ node has no Warren UI")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UI = resources.files("warren.mgmt").joinpath("ui")
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The only absolute URL allowed in the files: the SVG namespace (a name, never fetched).
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    import json
    path = tmp_path_factory.mktemp("ui") / "definitions.json"
    path.write_text(json.dumps({"users": [
        {"name": "guest", "password_hash": password_hash("guest"), "tags": "administrator"},
        {"name": "plain", "password_hash": password_hash("plain"), "tags": ""}],
        "vhosts": [{"name": "/"}]}))
    b = start_broker("--definitions", str(path))
    b.base = f"http://127.0.0.1:{b.mgmt_port}"
    yield b
    b.stop()


def ui_files() -> dict[str, bytes]:
    """Every file under warren/mgmt/ui/, by its path there, as the installed package has it."""
    files, stack = {}, [("", UI)]
    while stack:
        prefix, folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                stack.append((f"{prefix}{entry.name}/", entry))
            else:
                files[prefix + entry.name] = entry.read_bytes()
    return files


def references(path: str, text: str) -> set[str]:
    """The /ui/ paths a file loads: src/href attributes of the page, a module's imports
    (relative to the module), url() of the style sheet."""
    found = set(re.findall(r'(?:src|href)="(/ui/[^"]+)"', text))
    base = "/ui/" + os.path.dirname(path)
    for target in re.findall(r'^import\s.*?from\s+"([^"]+)";', text, re.M | re.S):
        found.add(os.path.normpath(os.path.join(base, target)))
    found.update(re.findall(r'url\(["\']?(/ui/[^)"\']+)', text))
    return found


def raw_get(port: int, path: str) -> int:
    """The status of a GET sent with the path exactly as given (clients would normalise
    "..")."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# ---------------------------------------------------------------------------- serving
def test_the_page_and_every_file_it_loads_are_served_without_credentials(broker):
    page = requests.get(broker.base + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "Content-Security-Policy" in page.headers and "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-cache" and page.headers["X-Content-Type-Options"] == "nosniff"
    assert 'id="login-form"' in page.text

    files = ui_files()
    seen, todo = set(), references("index.html", page.text)
    while todo:
        url = todo.pop()
        seen.add(url)
        r = requests.get(broker.base + url, timeout=10)
        assert r.status_code == 200, url
        suffix = os.path.splitext(url)[1]
        assert r.headers["Content-Type"].split(";")[0] == TYPES[suffix], url
        assert r.content == files[url[len("/ui/"):]]
        if suffix in (".js", ".css"):
            todo |= references(url[len("/ui/"):], r.text) - seen
    # Every module of the UI is reached from the page (none is dead), and the page loads
    # its script, style sheet and icon.
    shipped = {"/ui/" + p for p in files if os.path.splitext(p)[1] in TYPES and p != "index.html"}
    assert seen == shipped


def test_unchanged_files_are_not_sent_again(broker):
    first = requests.get(broker.base + "/ui/style.css", timeout=10)
    again = requests.get(broker.base + "/ui/style.css", headers={"If-None-Match": first.headers["ETag"]}, timeout=10)
    assert again.status_code == 304 and again.content == b""
    assert requests.head(broker.base + "/", timeout=10).status_code == 200


def test_no_file_loads_anything_from_another_origin():
    files = ui_files()
    assert "index.html" in files and "js/app.js" in files
    for path, body in files.items():
        text = body.decode()
        absolute = [u for u in re.findall(r"\b(?:https?|wss?|ftp)://[^\s\"'`)<>]*", text, re.I) if u != SVG_NAMESPACE]
        assert absolute == [], path
        # protocol-relative URLs ("//host/x") in an attribute, a string or url()
        assert re.findall(r"""["'`(=]\s*//[^/\s"'`]""", text) == [], path
        assert "@import" not in text and "<iframe" not in text.lower(), path


@pytest.mark.parametrize("path", [
    "/ui/../webui.py", "/ui/%2e%2e/webui.py", "/ui/..%2fwebui.py", "/ui/js/../../webui.py", "/ui/%2e%2e%2fapp.py",
    "/ui/js/..%2F..%2Fwebui.py", "/ui//etc/passwd", "/ui/%2Fetc%2Fpasswd", "/ui/js", "/ui/js/", "/ui/",
    "/ui/no-such-file.js", "/ui/index.html%00.js", "/ui/../../../../etc/passwd", "/index.html/../webui.py",
])
def test_nothing_else_can_be_named(broker, path):
    assert raw_get(broker.mgmt_port, path) == 404


def test_the_api_still_asks_for_credentials(broker):
    r = requests.get(broker.base + "/api/overview", timeout=10)
    assert (r.status_code, r.content) == (401, b"")
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    # What the login form shows: the API's reasons.
    wrong = requests.get(broker.base + "/api/whoami", auth=("guest", "nope"), timeout=10)
    assert (wrong.status_code, wrong.json()) == (401, {"error": "not_authorized", "reason": "Login failed"})
    plain = requests.get(broker.base + "/api/whoami", auth=("plain", "plain"), timeout=10)
    assert (plain.status_code, plain.json()) == (401, {"error": "not_authorised", "reason": "Not management user"})
    me = requests.get(broker.base + "/api/whoami", auth=("guest", "guest"), timeout=10)
    assert me.json() == {"name": "guest", "tags": ["administrator"]}
    # The page's own methods are GET and HEAD; others are the API's 405 and 501.
    assert requests.post(broker.base + "/", timeout=10).status_code == 405
    assert requests.request("PROPFIND", broker.base + "/ui/style.css", timeout=10).status_code == 501


def test_the_api_answers_the_page_s_fetch_calls(broker):
    """What fetch() from the page sends: same origin, credentials "omit", our Authorization
    header, JSON bodies. No CORS is involved (same origin), so the answers need nothing more
    than the API's own."""
    origin = {"Origin": broker.base, "Referer": broker.base + "/", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"}
    r = requests.put(broker.base + "/api/queues/%2F/ui-fetch", json={"durable": False}, auth=("guest", "guest"),
                     headers=origin, timeout=10)
    assert r.status_code == 201
    r = requests.get(broker.base + "/api/queues?page=1&page_size=100&name=ui-fetch&use_regex=false&pagination=true"
                     "&columns=name,vhost,messages", auth=("guest", "guest"), headers=origin, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    assert r.json()["items"] == [{"name": "ui-fetch", "vhost": "/", "messages": 0}]


# ---------------------------------------------------------------------------- packaging
def test_the_files_are_package_data():
    """pyproject.toml's package-data globs take every file under warren/mgmt/ui/, so a wheel
    (an install that is not this checkout) has the whole UI."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["warren.mgmt"]
    files = ui_files()
    assert {"index.html", "style.css", "favicon.svg", "js/app.js", "js/api.js", "js/chart.js"} <= set(files)
    missing = [p for p in files if not any(fnmatch.fnmatch("ui/" + p, g) and "/" not in ("ui/" + p)[len(g.rstrip("*")):]
                                           for g in globs)]
    assert missing == []


# ---------------------------------------------------------------------------- HTTPS
def test_https_serves_the_ui(tmp_path):
    certs = TestCerts.make(str(tmp_path))
    https_port = free_port()
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(f"management.ssl.port = {https_port}\nmanagement.ssl.certfile = {certs.server_cert}\n"
                    f"management.ssl.keyfile = {certs.server_key}\n")
    b = start_broker("--config", str(conf))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", https_port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, b.log()
                time.sleep(0.05)
        base = f"https://localhost:{https_port}"
        page = requests.get(base + "/", verify=certs.ca, timeout=10)
        assert page.status_code == 200 and 'id="login-form"' in page.text
        script = requests.get(base + "/ui/js/app.js", verify=certs.ca, timeout=10)
        assert script.status_code == 200 and script.headers["Content-Type"].startswith("text/javascript")
        assert requests.get(base + "/api/overview", verify=certs.ca, timeout=10).status_code == 401
    finally:
        b.stop()
