"""The kill -9 torture harness, shared by tests/crash/test_torture.py (small scale, in CI) and
bench/torture.py (bigger runs by hand).

Two publishers with confirms (the raw test client with a window of unconfirmed publishes, and
pika's BlockingChannel, one publish at a time) send persistent messages to a durable queue; a
pika consumer with manual acks takes them. Meanwhile the broker is SIGKILLed at random moments
and restarted on the same data dir, many times; the clients reconnect, and the publishers send
again whatever was not confirmed (at least once).

Every publish attempt is a distinct message: its body names (message id, attempt) and is
padded with bytes derived from both, so a corrupt body is detected. At the end (no more
kills) the queue is drained and the run is checked:

- every confirmed attempt was consumed at least once;
- an attempt delivered more than once carries redelivered=True on every later delivery (the
  broker writes its delivered-mark before the delivery leaves, so a kill cannot lose it; the
  consumer also gives a batch back with basic.nack requeue=true now and then);
- an attempt whose ack the broker had processed before answering a later synchronous method
  on the same channel (its ack-mark is written before that reply leaves) is never delivered
  again: an ack already written must not be undone;
- nothing that was never published arrives, and no body is corrupt;
- after a clean restart the queue is empty.

The kill schedule comes from a seeded RNG (the seed is in every report); thread timing is not
reproducible, so a failure may need a few runs with the same seed to reappear.
"""

import collections
import hashlib
import logging
import random
import signal
import threading
import time
from dataclasses import dataclass, field

import pika
import pika.exceptions
from pamqp import commands

import rawamqp

QUEUE = "torture"
logging.getLogger("pika").setLevel(logging.CRITICAL)  # every refused reconnect is logged otherwise
CONNECT_ERRORS = (pika.exceptions.AMQPError, OSError, ConnectionError, AssertionError, EOFError)


def body_for(key, size: int) -> bytes:
    """The body of publish attempt key = (message id, attempt): its name, then padding derived
    from it, `size` bytes in all (more if the name is longer)."""
    head = f"{key[0]}.{key[1]}.".encode()
    n = max(0, size - len(head))
    seed = hashlib.sha256(head).digest()
    return head + (seed * (n // len(seed) + 1))[:n]


def key_of(body: bytes, size: int):
    """(message id, attempt) of a body, or None if it is not one body_for() makes."""
    try:
        ident, attempt, _ = body.split(b".", 2)
        key = (ident.decode(), int(attempt))
    except ValueError:
        return None
    return key if body_for(key, size) == body else None


@dataclass
class Settings:
    kills: int = 12
    duration: float | None = None     # stop killing after this many seconds (None: after `kills`)
    min_pause: float = 0.2            # seconds between a restart and the next kill
    max_pause: float = 1.5
    size: int = 200                   # message body size
    rate: float = 1500.0              # new messages per second per publisher (0: no limit)
    seed: int | None = None
    settle_timeout: float = 60.0      # for the final drain
    verbose: bool = False


@dataclass
class Result:
    seed: int
    kills: int = 0
    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    deliveries: int = 0
    redelivered: int = 0
    duplicates: int = 0
    across_kills: int = 0     # messages delivered before a kill and again after it
    synced_acks: int = 0
    reconnects: dict = field(default_factory=dict)
    elapsed: float = 0.0
    problems: list = field(default_factory=list)

    def summary(self) -> str:
        return (f"seed={self.seed} kills={self.kills} sent={self.sent} confirmed={self.confirmed} "
                f"nacked={self.nacked} deliveries={self.deliveries} redelivered={self.redelivered} "
                f"delivered-twice={self.duplicates} across-kills={self.across_kills} synced-acks={self.synced_acks} "
                f"reconnects={self.reconnects} elapsed={self.elapsed:.1f}s")


class Ledger:
    """What the clients did, shared by their threads."""

    def __init__(self, size: int):
        self.size = size
        self.lock = threading.Lock()
        self.attempts: dict = {}     # message id -> attempts so far
        self.sent: set = set()       # (id, attempt) handed to a socket (or about to be)
        self.confirmed: set = set()
        self.nacked: set = set()
        self.seen: dict = {}         # (id, attempt) -> [(redelivered, epoch), ...]
        self.synced_acks: set = set()  # attempts whose ack the broker surely wrote
        self.deliveries = 0
        self.redelivered = 0
        self.epoch = 0               # broker incarnation
        self.problems: list = []

    def problem(self, text: str) -> None:
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(text)

    def new_attempt(self, ident: str):
        with self.lock:
            attempt = self.attempts.get(ident, 0) + 1
            self.attempts[ident] = attempt
            key = (ident, attempt)
            self.sent.add(key)
            return key

    def confirm(self, key) -> None:
        with self.lock:
            self.confirmed.add(key)

    def nack(self, key) -> None:
        with self.lock:
            self.nacked.add(key)

    def delivered(self, body: bytes, redelivered: bool):
        """Record one delivery and check it at once; returns its key (None for a bad body)."""
        with self.lock:
            self.deliveries += 1
            self.redelivered += redelivered
            epoch = self.epoch
            key = key_of(body, self.size)
            if key is None:
                self.problems.append(f"corrupt or unknown body ({len(body)} bytes): {body[:60]!r}")
                return None
            if key not in self.sent:
                self.problems.append(f"{key} delivered but never published")
            earlier = self.seen.setdefault(key, [])
            if earlier and not redelivered:
                self.problems.append(f"{key} delivered again without redelivered=True "
                                     f"(deliveries so far: {earlier}, now epoch {epoch})")
            if key in self.synced_acks:
                self.problems.append(f"{key} delivered again after its ack was written "
                                     f"(deliveries so far: {earlier}, now epoch {epoch})")
            earlier.append((redelivered, epoch))
            return key

    def acks_synced(self, keys) -> None:
        with self.lock:
            self.synced_acks.update(k for k in keys if k is not None)


class Run:
    def __init__(self, settings: Settings, start, seed: int):
        self.s = settings
        self.start = start           # start() -> a running broker (same port and data dir each time)
        self.rng = random.Random(seed)
        self.seed = seed
        self.ledger = Ledger(settings.size)
        self.broker = None
        self.host = self.port = None
        self.stop_new = threading.Event()    # publishers: no new message ids
        self.finishing = threading.Event()   # consumer: drain and stop
        self.abort = threading.Event()       # give up (timeout)
        self.reconnects = collections.Counter()
        self.done = {}

    def log(self, *args) -> None:
        if self.s.verbose:
            print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)

    # ------------------------------------------------------------------ helpers
    def _retry_connect(self, who: str, connect, deadline=None):
        """connect() until it works (the broker may be down or starting)."""
        first = True
        while not self.abort.is_set() or (deadline and time.monotonic() < deadline):
            try:
                return connect()
            except CONNECT_ERRORS:
                if first:
                    self.reconnects[who] += 1
                    first = False
                time.sleep(0.05)
        raise RuntimeError("aborted")

    def _pace(self, started: float, count: int) -> None:
        if self.s.rate:
            ahead = count / self.s.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(min(ahead, 0.2))

    def _pika(self):
        params = pika.ConnectionParameters(self.host, self.port, credentials=pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=1, socket_timeout=2, blocked_connection_timeout=10,
                                           heartbeat=0)
        return pika.BlockingConnection(params)

    # ---------------------------------------------------------------- publishers
    def raw_publisher(self, prefix: str, seed: int) -> None:
        """The raw client: a window of unconfirmed publishes, confirms read as they come."""
        rng = random.Random(seed)
        ledger = self.ledger
        resend = collections.deque()
        next_id = 0
        started = time.monotonic()
        props = commands.Basic.Properties(delivery_mode=2)

        def connect():
            client = rawamqp.RawClient(self.host, self.port, timeout=5.0)
            try:
                client.handshake()
                client.open_channel(1)
                client.call(1, commands.Confirm.Select())
                client.call(1, commands.Queue.Declare(queue=QUEUE, durable=True))
            except BaseException:
                client.close()
                raise
            return client

        while not self.abort.is_set():
            if self.stop_new.is_set() and not resend:
                break
            client = self._retry_connect(prefix, connect)
            pending = collections.OrderedDict()  # delivery tag -> key
            seq = 0
            window = rng.choice((1, 10, 100, 500))
            try:
                while not self.abort.is_set():
                    while len(pending) < window:
                        if resend:
                            ident = resend.popleft()
                        elif not self.stop_new.is_set():
                            next_id += 1
                            ident = f"{prefix}{next_id}"
                        else:
                            break
                        key = ledger.new_attempt(ident)
                        seq += 1
                        pending[seq] = key  # first: if the publish fails, it is sent again
                        client.publish(1, "", QUEUE, body_for(key, self.s.size), properties=props)
                        self._pace(started, next_id)
                    if not pending:
                        break
                    value = client.read_frame(timeout=10).value
                    if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
                        tag = value.delivery_tag
                        tags = [t for t in pending if t <= tag] if value.multiple else [tag]
                        for t in tags:
                            key = pending.pop(t)
                            if isinstance(value, commands.Basic.Ack):
                                ledger.confirm(key)
                            else:
                                ledger.nack(key)
                                resend.append(key[0])
                    else:
                        ledger.problem(f"{prefix}: unexpected frame {value!r}")
                if not pending:
                    client.close()
                    if self.stop_new.is_set() and not resend:
                        break
            except CONNECT_ERRORS:
                pass
            finally:
                client.close()
            resend.extend(key[0] for key in pending.values())
        self.done[prefix] = next_id

    def pika_publisher(self, prefix: str, seed: int) -> None:
        """pika's BlockingChannel in confirm mode: one publish at a time."""
        ledger = self.ledger
        resend = collections.deque()
        next_id = 0
        started = time.monotonic()
        props = pika.BasicProperties(delivery_mode=2)

        def connect():
            conn = self._pika()
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(QUEUE, durable=True)
            except BaseException:
                _close(conn)
                raise
            return conn, ch

        while not self.abort.is_set():
            if self.stop_new.is_set() and not resend:
                break
            conn, ch = self._retry_connect(prefix, connect)
            try:
                while not self.abort.is_set():
                    if resend:
                        ident = resend[0]
                    elif not self.stop_new.is_set():
                        next_id += 1
                        ident = f"{prefix}{next_id}"
                        resend.append(ident)
                    else:
                        break
                    key = ledger.new_attempt(ident)
                    try:
                        ch.basic_publish("", QUEUE, body_for(key, self.s.size), props)
                    except pika.exceptions.NackError:
                        ledger.nack(key)
                        continue
                    resend.popleft()
                    ledger.confirm(key)
                    self._pace(started, next_id)
            except CONNECT_ERRORS:
                pass
            finally:
                _close(conn)
        self.done[prefix] = next_id

    # ------------------------------------------------------------------ consumer
    def consumer(self, seed: int) -> None:
        rng = random.Random(seed)

        def connect():
            conn = self._pika()
            try:
                ch = conn.channel()
                ch.queue_declare(QUEUE, durable=True)
            except BaseException:
                _close(conn)
                raise
            return conn, ch

        while not self.abort.is_set():
            conn, ch = self._retry_connect("consumer", connect)
            try:
                if self._consume(ch, rng):
                    _close(conn)
                    return
            except CONNECT_ERRORS:
                pass
            finally:
                _close(conn)

    def _consume(self, ch, rng) -> bool:
        """Consume until the connection fails (exception) or the drain is over (True)."""
        ledger = self.ledger
        prefetch = rng.choice((1, 20, 100, 300))
        ch.basic_qos(prefetch_count=prefetch)
        batch = rng.choice((1, 5, 50))
        hold = rng.choice((0.0, 0.05, 0.3))  # how long acks may wait
        unacked = []     # (tag, key) delivered, not acked
        unsynced = []    # keys acked, but no reply seen since
        last_ack = time.monotonic()
        for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.1):
            if self.abort.is_set():
                return True
            now = time.monotonic()
            if method is not None:
                unacked.append((method.delivery_tag, ledger.delivered(body, method.redelivered)))
            if unacked and (len(unacked) >= min(batch, prefetch) or now - last_ack >= hold or method is None):
                if rng.random() < 0.02 and not self.finishing.is_set():
                    # Now and then give a batch back: it must come again, redelivered.
                    ch.basic_nack(unacked[-1][0], multiple=True, requeue=True)
                    unacked = []
                    last_ack = now
                    continue
                if rng.random() < 0.5:
                    ch.basic_ack(unacked[-1][0], multiple=True)
                else:
                    for tag, _ in unacked:
                        ch.basic_ack(tag)
                unsynced.extend(key for _, key in unacked)
                unacked = []
                last_ack = now
                if rng.random() < 0.3:
                    # A synchronous round trip: the acks before it have been processed, and
                    # their marks written before the reply left.
                    ch.basic_qos(prefetch_count=prefetch)
                    ledger.acks_synced(unsynced)
                    unsynced = []
            if method is None and self.finishing.is_set() and not unacked:
                ch.cancel()  # requeues what arrived after the last ack (none expected)
                return self._drain(ch, unsynced)
        return False

    def _drain(self, ch, unsynced) -> bool:
        """The final phase: basic.get until empty and every confirmed message was seen."""
        ledger = self.ledger
        deadline = time.monotonic() + self.s.settle_timeout
        while True:
            method, _props, body = ch.basic_get(QUEUE)
            if method is not None:
                key = ledger.delivered(body, method.redelivered)
                ch.basic_ack(method.delivery_tag)
                unsynced.append(key)
                continue
            ledger.acks_synced(unsynced)  # the get-empty was the round trip
            unsynced.clear()
            with ledger.lock:
                missing = ledger.confirmed - ledger.seen.keys()
            if not missing or time.monotonic() > deadline:
                return True
            time.sleep(0.1)

    # ---------------------------------------------------------------------- run
    def _start(self):
        self.broker = self.start()
        self.host, self.port = self.broker.host, self.broker.port

    def run(self) -> Result:
        s = self.s
        began = time.monotonic()
        result = Result(self.seed)
        self._start()
        threads = {
            "raw": threading.Thread(target=self.raw_publisher, args=("r", self.rng.random()), daemon=True),
            "pika": threading.Thread(target=self.pika_publisher, args=("p", self.rng.random()), daemon=True),
            "consumer": threading.Thread(target=self.consumer, args=(self.rng.random(),), daemon=True),
        }
        for t in threads.values():
            t.start()
        try:
            kill_phase = time.monotonic()
            while True:
                if s.duration is not None and time.monotonic() - kill_phase >= s.duration:
                    break
                if s.duration is None and result.kills >= s.kills:
                    break
                if s.duration is not None and s.kills and result.kills >= s.kills:
                    break
                time.sleep(self.rng.uniform(s.min_pause, s.max_pause))
                self.broker.stop(signal.SIGKILL)
                with self.ledger.lock:
                    self.ledger.epoch += 1
                result.kills += 1
                self.log(f"kill {result.kills}: sent={len(self.ledger.sent)} confirmed={len(self.ledger.confirmed)} "
                         f"deliveries={self.ledger.deliveries}")
                self._start()
            # No more kills: publishers finish what is unconfirmed, then the consumer drains.
            time.sleep(0.3)
            self.stop_new.set()
            for name in ("raw", "pika"):
                threads[name].join(s.settle_timeout)
                if threads[name].is_alive():
                    self.ledger.problem(f"publisher {name} did not finish")
            self.finishing.set()
            threads["consumer"].join(s.settle_timeout + 5)
            if threads["consumer"].is_alive():
                self.ledger.problem("consumer did not finish")
        finally:
            self.abort.set()
            for t in threads.values():
                t.join(5)
        self._final_checks(result)
        result.elapsed = time.monotonic() - began
        return result

    def _final_checks(self, result: Result) -> None:
        ledger = self.ledger
        with ledger.lock:
            result.sent = len(ledger.sent)
            result.confirmed = len(ledger.confirmed)
            result.nacked = len(ledger.nacked)
            result.deliveries = ledger.deliveries
            result.redelivered = ledger.redelivered
            result.duplicates = sum(1 for v in ledger.seen.values() if len(v) > 1)
            result.across_kills = sum(1 for v in ledger.seen.values() if v[-1][1] > v[0][1])
            result.synced_acks = len(ledger.synced_acks)
            result.reconnects = dict(self.reconnects)
            missing = sorted(ledger.confirmed - ledger.seen.keys())
            problems = list(ledger.problems)
        if missing:
            problems.append(f"{len(missing)} confirmed messages never consumed, e.g. {missing[:10]}")
        # After a clean restart nothing may be left: every message was acked, and those acks were
        # written (the last basic.get-empty answered after them).
        self.broker.stop(signal.SIGTERM)
        self._start()
        try:
            conn = self._retry_connect("final", self._pika, deadline=time.monotonic() + 10)
            ch = conn.channel()
            left = ch.queue_declare(QUEUE, durable=True, passive=True).method.message_count
            if left:
                bodies = []
                for _ in range(min(left, 10)):
                    method, _props, body = ch.basic_get(QUEUE)
                    if method is not None:
                        bodies.append((body[:30], method.redelivered))
                problems.append(f"{left} messages still in the queue after the drain and a restart, e.g. {bodies}")
            _close(conn)
        except CONNECT_ERRORS as err:
            problems.append(f"cannot check the queue after the final restart: {err!r}")
        result.problems = problems


def _close(conn) -> None:
    try:
        if conn.is_open:
            conn.close()
    except CONNECT_ERRORS:
        pass


def run(settings: Settings, start) -> Result:
    """Run the torture with `start()` starting the broker (on the same port and data dir every
    time; the returned object has .host, .port and .stop(sig))."""
    seed = settings.seed if settings.seed is not None else random.randrange(1 << 32)
    print(f"torture seed={seed}", flush=True)
    return Run(settings, start, seed).run()
