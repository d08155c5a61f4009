"""The broker's definitions on disk: a snapshot in RabbitMQ's definitions format
(definitions.json) plus a journal of the changes made since (definitions.journal).

A change appends one line per changed object to the journal and fsyncs it once, so its cost
does not depend on how many definitions exist. A line is `<crc32 hex> <json>`: the JSON holds
a sequence number n, an op ("put": the object as the definitions format has it, replacing the
one with the same identity; "delete": the identity only), the collection ("queues", ...) and
the object.

A snapshot (save) writes the whole document to a temporary file in the same directory, fsyncs
it, renames it over definitions.json and fsyncs the directory, then empties the journal. The
snapshot records the last journal sequence number it includes (warren_journal_seq), so the
lines left behind by a crash between the rename and the emptying are skipped on recovery.
When the journal holds more lines than max(COMPACT_MIN, objects in the snapshot) the broker
writes a snapshot (compaction), so each change costs O(1) amortized.

Recovery loads the snapshot and replays the journal in order up to the first torn or corrupt
line, which is reported and cut off with everything after it. A snapshot that cannot be read
or parsed is moved aside (with its journal) and reported; the broker starts without it.
"""

import gc
import glob
import json
import logging
import os
import tempfile
import time
import zlib

log = logging.getLogger("warren.definitions")

FILENAME = "definitions.json"
JOURNAL = "definitions.journal"
SEQ_KEY = "warren_journal_seq"
COMPACT_MIN = 1000
KINDS = ("vhosts", "users", "permissions", "topic_permissions", "policies", "parameters", "exchanges", "queues", "bindings",
         "global_parameters", "cluster")
_TMP_PREFIX = FILENAME + "."
_TMP_SUFFIX = ".tmp"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _format(data: dict) -> str:
    """JSON with one definition per line: readable and diffable, and still written by the
    fast C encoder (an indented dump is several times slower)."""
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    parts = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            body = "[\n  " + ",\n  ".join(dumps(item) for item in value) + "\n ]"
        else:
            body = dumps(value)
        parts.append(f" {dumps(key)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _parse(raw: bytes):
    """json.loads without the cyclic collector: a big document is a tree of new containers
    that all live on, and full collections over the growing heap made parsing 100,000
    definitions ~18x the time of 10,000 (with it paused, ~10x)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return json.loads(raw)
    finally:
        if collecting:
            gc.enable()


def identity(kind: str, obj: dict):
    """What makes an object of the definitions format one object (KeyError if it lacks it)."""
    if kind in ("vhosts", "users"):
        return obj["name"]
    if kind == "permissions":
        return obj["user"], obj["vhost"]
    if kind == "topic_permissions":
        return obj["user"], obj["vhost"], obj["exchange"]
    if kind in ("policies", "exchanges", "queues"):
        return obj.get("vhost", "/"), obj["name"]
    if kind in ("global_parameters", "cluster"):
        return obj["name"]
    if kind == "parameters":
        return obj.get("vhost", "/"), obj.get("component"), obj["name"]
    if kind == "bindings":
        return (obj.get("vhost", "/"), obj["source"], obj.get("destination_type", "queue"), obj["destination"],
                obj.get("routing_key", ""), json.dumps(obj.get("arguments") or {}, sort_keys=True))
    raise KeyError(kind)


def encode_record(n: int, op: str, kind: str, obj: dict) -> bytes:
    body = json.dumps({"n": n, "op": op, "kind": kind, "obj": obj}, ensure_ascii=False,
                      separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_record(line: bytes) -> dict:
    """One journal line (with its newline) as {"n", "op", "kind", "obj"}; ValueError if it is
    torn or corrupt."""
    if not line.endswith(b"\n"):
        raise ValueError("torn line (no newline)")
    crc, sep, body = line[:-1].partition(b" ")
    if not sep or len(crc) != 8:
        raise ValueError("no checksum")
    if int(crc, 16) != zlib.crc32(body):
        raise ValueError("checksum mismatch")
    rec = json.loads(body)
    if not isinstance(rec, dict) or rec.get("op") not in ("put", "delete") or rec.get("kind") not in KINDS \
            or not isinstance(rec.get("obj"), dict) or not isinstance(rec.get("n"), int):
        raise ValueError("not a journal record")
    try:
        identity(rec["kind"], rec["obj"])
    except (KeyError, TypeError, AttributeError):
        raise ValueError("record without an identity") from None
    return rec


def replay(data: dict, records) -> dict:
    """The definitions `data` with the journal records applied in order."""
    if not records:
        return data
    index: dict[str, dict] = {}  # kind -> identity -> object
    for kind in KINDS:
        table = index[kind] = {}
        items = data.get(kind)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            try:
                key = identity(kind, item)
            except (KeyError, TypeError, AttributeError):
                key = ("unidentified", i)  # kept for load() to report
            table[key] = item
    for rec in records:
        kind, obj = rec["kind"], rec["obj"]
        key = identity(kind, obj)
        if rec["op"] == "put":
            index[kind][key] = obj
        else:
            index[kind].pop(key, None)
    for kind in KINDS:
        if kind in data or index[kind]:
            data[kind] = list(index[kind].values())
    return data


class DefinitionsFile:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.dir = os.path.dirname(self.path)
        self.journal_path = os.path.join(self.dir, JOURNAL)
        self.seq = 0  # the last journal sequence number used
        self.journal_lines = 0  # lines in the journal
        self.snapshot_size = 0  # objects in the snapshot
        self._fd: int | None = None  # the journal, open for appending
        self._size = 0  # its length after the last good append
        self._broken = False  # it may end in a torn line: append refuses until a save empties it

    @classmethod
    def in_dir(cls, data_dir: str) -> "DefinitionsFile":
        return cls(os.path.join(data_dir, FILENAME))

    def load(self) -> dict | None:
        """The stored definitions (snapshot plus journal); None when there are none or they
        cannot be used."""
        self._remove_stale_temporaries()
        self.close()
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            if os.path.exists(self.journal_path):
                log.error("definitions journal %s has no snapshot %s; starting without it",
                          self.journal_path, self.path)
                self._quarantine(self.journal_path)
            return None
        except OSError as err:
            log.error("cannot read definitions file %s: %s; starting without it", self.path, err)
            self._quarantine()
            return None
        try:
            data = _parse(raw)
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        except ValueError as err:  # includes UnicodeDecodeError and json.JSONDecodeError
            log.error("definitions file %s is corrupt (%s); starting without it", self.path, err)
            self._quarantine()
            if os.path.exists(self.journal_path):
                self._quarantine(self.journal_path)
            return None
        seq = data.pop(SEQ_KEY, 0)
        self.seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
        self.snapshot_size = sum(len(v) for k, v in data.items() if k in KINDS and isinstance(v, list))
        return replay(data, self._read_journal())

    def _read_journal(self) -> list:
        """The journal's records newer than the snapshot; a torn or corrupt line and all that
        follows it is cut off."""
        self.journal_lines = self._size = 0
        try:
            with open(self.journal_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        except OSError as err:
            log.error("cannot read definitions journal %s: %s; recovering the snapshot only", self.journal_path, err)
            self._broken = True  # the next save empties it
            return []
        records, offset, last = [], 0, self.seq
        while offset < len(raw):
            end = raw.find(b"\n", offset)
            line = raw[offset:] if end < 0 else raw[offset:end + 1]
            try:
                rec = decode_record(line)
            except ValueError as err:  # includes UnicodeDecodeError and json.JSONDecodeError
                log.error("definitions journal %s: bad record at byte %d (%s); dropped the %d bytes from there",
                          self.journal_path, offset, err, len(raw) - offset)
                self._truncate_journal(offset)
                break
            if rec["n"] > self.seq:
                if rec["n"] <= last:
                    log.error("definitions journal %s: record %d at byte %d is out of sequence; dropped the %d "
                              "bytes from there", self.journal_path, rec["n"], offset, len(raw) - offset)
                    self._truncate_journal(offset)
                    break
                records.append(rec)
                last = rec["n"]
            offset += len(line)
            self.journal_lines += 1
        self._size = offset
        self.seq = max(self.seq, last)
        return records

    def _truncate_journal(self, size: int) -> None:
        try:
            with open(self.journal_path, "r+b") as f:
                f.truncate(size)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            log.error("cannot truncate definitions journal %s: %s", self.journal_path, err)
            self._broken = True

    def needs_compaction(self) -> bool:
        return self.journal_lines >= max(COMPACT_MIN, self.snapshot_size)

    def append(self, records) -> None:
        """Make the records ((op, kind, object), see warren.broker.definitions.changes) durable:
        one write and one fsync of the journal."""
        if not records:
            return
        if self._broken:
            raise OSError(f"definitions journal {self.journal_path} needs rewriting")
        lines = []
        for op, kind, obj in records:
            self.seq += 1
            lines.append(encode_record(self.seq, op, kind, obj))
        payload = b"".join(lines)
        try:
            if self._fd is None:
                existed = os.path.exists(self.journal_path)
                self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._size = os.fstat(self._fd).st_size
                if not existed:
                    _fsync_dir(self.dir)
            view = memoryview(payload)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except BaseException:
            # Leave no torn line in front of the next records.
            try:
                if self._fd is not None:
                    os.ftruncate(self._fd, self._size)
            except OSError:
                self._broken = True
            raise
        self._size += len(payload)
        self.journal_lines += len(lines)

    def save(self, data: dict) -> None:
        """Replace the stored definitions atomically and durably (and empty the journal)."""
        payload = _format({**data, SEQ_KEY: self.seq}).encode()
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(self.dir)
        self.snapshot_size = sum(len(v) for k, v in data.items() if k in KINDS and isinstance(v, list))
        # The snapshot holds every record so far (their n <= its warren_journal_seq): a crash
        # before the journal is empty leaves lines that recovery skips.
        if self._fd is not None or os.path.exists(self.journal_path):
            try:
                if self._fd is not None:
                    os.ftruncate(self._fd, 0)
                    os.fsync(self._fd)
                else:
                    with open(self.journal_path, "r+b") as f:
                        f.truncate(0)
                        f.flush()
                        os.fsync(f.fileno())
            except OSError as err:
                self._broken = True
                log.error("cannot empty definitions journal %s: %s", self.journal_path, err)
                return
        self._broken = False
        self._size = self.journal_lines = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _quarantine(self, path: str | None = None) -> None:
        path = path or self.path
        aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        try:
            os.replace(path, aside)
            _fsync_dir(self.dir)
        except OSError as err:
            log.error("cannot move %s aside: %s", path, err)
            return
        log.error("moved the unusable definitions %s to %s", "file" if path == self.path else "journal", aside)

    def _remove_stale_temporaries(self) -> None:
        """Temporary files left by a crash in the middle of a save."""
        pattern = os.path.join(glob.escape(self.dir), glob.escape(_TMP_PREFIX) + "*" + _TMP_SUFFIX)
        for tmp in glob.glob(pattern):
            try:
                os.unlink(tmp)
            except OSError:
                pass
