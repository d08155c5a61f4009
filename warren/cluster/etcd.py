"""A client of etcd's v3 API through its JSON gateway (aiohttp): the consensus a cluster of
Warren nodes rests on. What a cluster needs of it and no more: ranges, transactions (puts and
deletes guarded by revisions), leases and watches.

Keys and values are bytes (etcd's JSON carries them in base64, and its 64-bit numbers as
strings). A request goes to one endpoint; one that cannot be reached (refused, reset, timed
out) is left for the next, and a request that no endpoint answered raises Unavailable: a
member cut from its cluster's majority never answers a linearizable request, so a node on
the minority side of a partition sees Unavailable, never stale data."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp

log = logging.getLogger("warren.etcd")


class EtcdError(Exception):
    """etcd refused a request (its gRPC error and message)."""


class Unavailable(EtcdError):
    """No endpoint answered."""


class Compacted(EtcdError):
    """A watch asked for revisions etcd no longer keeps (compacted up to `revision`)."""

    def __init__(self, revision: int):
        super().__init__(f"revisions before {revision} are compacted")
        self.revision = revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class Event:
    """One change a watch reports: a put (kv holds the new value) or a delete."""

    deleted: bool
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    responses: list


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kv(d: dict) -> KeyValue:
    return KeyValue(base64.b64decode(d.get("key", "")), base64.b64decode(d.get("value", "")),
                    int(d.get("create_revision", 0)), int(d.get("mod_revision", 0)),
                    int(d.get("version", 0)), int(d.get("lease", 0)))


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a range or watch cover every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


# Compares and operations of a transaction, as the gateway's JSON takes them.
def mod_revision_is(key: bytes, revision: int) -> dict:
    """The key was last changed at `revision` (0: it does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def absent(key: bytes) -> dict:
    return {"key": _b64(key), "target": "VERSION", "result": "EQUAL", "version": "0"}


def value_is(key: bytes, value: bytes) -> dict:
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def put_op(key: bytes, value: bytes, lease: int = 0) -> dict:
    return {"request_put": {"key": _b64(key), "value": _b64(value), "lease": str(lease)}}


def delete_op(key: bytes) -> dict:
    return {"request_delete_range": {"key": _b64(key)}}


class Etcd:
    """One client for the node; `endpoints` are "host:port" or URLs."""

    def __init__(self, endpoints: list[str], timeout: float = 5.0):
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self.timeout = timeout
        self._current = 0  # the endpoint that answered last
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # A watch may stay open for as long as the node runs: no total timeout for it;
            # requests pass their own.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: dict, timeout: float | None = None) -> dict:
        """POST to each endpoint in turn, starting with the last one that answered."""
        errors = []
        for i in range(len(self.endpoints)):
            n = (self._current + i) % len(self.endpoints)
            url = self.endpoints[n] + path
            try:
                async with self._http().post(url, json=body, timeout=aiohttp.ClientTimeout(
                        total=timeout or self.timeout)) as response:
                    answer = await response.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
                errors.append(f"{url}: {err.__class__.__name__} {err}".rstrip())
                continue
            self._current = n
            if response.status != 200 or not isinstance(answer, dict):
                raise EtcdError(f"{url}: {response.status} {answer}")
            if "error" in answer and "header" not in answer:
                raise EtcdError(f"{url}: {answer.get('message') or answer['error']}")
            return answer
        raise Unavailable("no etcd endpoint answered: " + "; ".join(errors))

    # ------------------------------------------------------------------ keys
    async def get(self, key: bytes, prefix: bool = False) -> tuple[int, list[KeyValue]]:
        """(the store's revision, the keys), in key order."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        answer = await self.call("/v3/kv/range", body)
        return int(answer["header"]["revision"]), [_kv(d) for d in answer.get("kvs", ())]

    async def txn(self, compare: list[dict], success: list[dict], failure: list[dict] = ()) -> TxnResult:  # type: ignore[assignment]
        answer = await self.call("/v3/kv/txn", {"compare": compare, "success": success, "failure": list(failure)})
        return TxnResult(bool(answer.get("succeeded")), int(answer["header"]["revision"]),
                         answer.get("responses", []))

    async def delete_prefix(self, prefix: bytes) -> None:
        await self.call("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision` (a revision already compacted is no error)."""
        try:
            await self.call("/v3/kv/compaction", {"revision": str(revision)})
        except Unavailable:
            raise
        except EtcdError as err:
            if "compacted" not in str(err):
                raise

    # ---------------------------------------------------------------- leases
    async def grant(self, ttl: int) -> int:
        """A new lease's id."""
        answer = await self.call("/v3/lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"])

    async def keepalive(self, lease: int) -> int:
        """The lease's TTL from now, 0 when it has expired (its keys are gone then)."""
        answer = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    # ---------------------------------------------------------------- watches
    async def watch(self, key: bytes, start_revision: int, prefix: bool = False) -> AsyncIterator[tuple[int, list[Event]]]:
        """(revision, events) as etcd reports them, from `start_revision` on, until the
        stream ends (EtcdError: the caller watches again from where it was). hasleader: a
        member cut from its cluster's leader ends the watch rather than go silent."""
        request: dict[str, Any] = {"key": _b64(key), "start_revision": str(start_revision), "progress_notify": True}
        if prefix:
            request["range_end"] = _b64(prefix_end(key))
        errors = []
        for i in range(len(self.endpoints)):
            n = (self._current + i) % len(self.endpoints)
            url = self.endpoints[n] + "/v3/watch"
            try:
                response = await self._http().post(
                    url, json={"create_request": request}, headers={"Grpc-Metadata-hasleader": "true"},
                    timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=self.timeout))
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                errors.append(f"{url}: {err.__class__.__name__} {err}".rstrip())
                continue
            # The next watch starts at the next member: this one may have lost its leader.
            self._current = (n + 1) % len(self.endpoints)
            async with response:
                try:
                    async for line in _lines(response.content):
                        if not line.strip():
                            continue
                        message = json.loads(line)
                        result = message.get("result")
                        if result is None:
                            raise EtcdError(f"{url}: watch ended: {message.get('error', message)}")
                        compacted = int(result.get("compact_revision", 0))
                        if compacted:
                            raise Compacted(compacted)
                        if result.get("canceled"):
                            raise EtcdError(f"{url}: watch canceled: {result.get('cancel_reason', '')}")
                        events = [Event(e.get("type") == "DELETE", _kv(e["kv"])) for e in result.get("events", ())]
                        yield int(result["header"]["revision"]), events
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, RuntimeError) as err:
                    # (RuntimeError: aiohttp's "Connection closed.", the session closed under it)
                    raise EtcdError(f"{url}: watch broke: {err.__class__.__name__} {err}") from err
            raise EtcdError(f"{url}: watch stream closed")
        raise Unavailable("no etcd endpoint answered: " + "; ".join(errors))


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """A stream's lines, however long: a watch's message holds every event since its start
    revision (a node catching up gets megabytes at once), past what aiohttp's own line
    reading takes (512 KiB)."""
    pending = bytearray()
    async for chunk in content.iter_any():
        searched = len(pending)
        pending += chunk
        end = pending.find(b"\n", searched)
        while end >= 0:
            yield bytes(pending[:end])
            del pending[:end + 1]
            end = pending.find(b"\n")
    if pending:
        yield bytes(pending)
