"""The management API over requests, as the runtime-parameter tests use it: `call` answers
whatever came, `ok` asserts a 2xx (or the given status). Subclasses add their own objects
and clean them up."""

import time
from urllib.parse import quote

import requests

GUEST = ("guest", "guest")


def q(name: str) -> str:
    """A name as one path segment ("/" included)."""
    return quote(name, safe="")


def wait_for(condition, timeout: float = 10.0, what: str = "condition"):
    """condition()'s first true value, polled every 50 ms for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class HttpApi:
    def __init__(self, base: str):
        self.base = base

    def call(self, method, path, body=None, auth=GUEST):
        return requests.request(method, self.base + path, json=body, auth=auth, timeout=30)

    def ok(self, method, path, body=None, auth=GUEST, status=None):
        r = self.call(method, path, body, auth)
        assert r.status_code < 300 if status is None else r.status_code == status, (method, path, r.status_code,
                                                                                     r.text)
        return r
