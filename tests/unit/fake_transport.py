"""Session-level test kit, h11 style: client bytes in, server frames out; no socket, no loop.

- FakeTransport implements warren.broker.ports.Transport and records every call; the flushes
  a connection schedules run only when a test calls `run_scheduled()` (one loop tick).
- make_connection() builds a session Connection whichever constructor the tree has.
- Client drives one connection: its methods marshal client frames (pamqp) and feed them to
  `data_received`, one call per method, or one call for everything sent inside
  `with client.batch():`. `receive()` decodes what the server wrote into plain tuples:

      (channel, "Class.Method", *fields in pamqp's slot order[, body])

  A content-bearing method (deliver, get-ok, return) ends with its body (the content header
  and body frames are checked and folded in; the properties are on `.properties`).
  The capitalised helpers (Deliver, GetOk, Ack, ChannelClose, ...) build the expected tuples.
"""

from __future__ import annotations

import contextlib
import inspect

from pamqp import body, commands, frame, header

from warren.broker.broker import Broker
from warren.session.connection import Connection
from warren.store.definitions import DefinitionsFile
from warren.store.persister import Persister

PEER = ("127.0.0.1", 50000)
LOCAL = ("127.0.0.1", 5672)
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MAX = 131072  # what open_connection tunes


class FakeTransport:
    """The Transport port (warren/broker/ports.py), recording what the connection asks of it."""

    def __init__(self, peer=PEER, local=LOCAL, tls=None):
        self.peer = peer
        self.local = local
        self.tls = tls                   # a warren.broker.ports.TLSInfo: a connection over TLS
        self.data = bytearray()          # written and not yet read by frames()
        self.write_count = 0
        self.closed = False
        self.close_later_calls: list = []  # the delays asked for
        self.heartbeat = None            # from heartbeat_negotiated
        self.handshake_completed = False  # handshake_done called (connection.open accepted)
        self.reading_paused = False
        self.pause_reading_calls = 0
        self.resume_reading_calls = 0
        self.scheduled: list = []        # flush callables waiting for the end of the tick

    # the port ------------------------------------------------------------------
    def write(self, data) -> None:
        if not self.closed:  # as the server's transport: nothing goes out after close
            self.data += data
            self.write_count += 1

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        self.closed = True

    def close_later(self, seconds) -> None:
        self.close_later_calls.append(seconds)

    def schedule_flush(self, flush) -> None:
        # ports.Transport takes the flush callable; older trees passed the connection.
        fn = flush if callable(flush) else getattr(flush, "flush")
        self.scheduled.append(fn)

    def heartbeat_negotiated(self, seconds) -> None:
        self.heartbeat = seconds

    def handshake_done(self) -> None:
        self.handshake_completed = True

    def pause_reading(self) -> None:
        self.reading_paused = True
        self.pause_reading_calls += 1

    def resume_reading(self) -> None:
        self.reading_paused = False
        self.resume_reading_calls += 1

    # for tests -----------------------------------------------------------------
    def run_scheduled(self) -> int:
        """End the loop tick: call the flushes scheduled so far (ones they schedule wait for
        the next call, as call_soon callbacks do). Returns how many ran."""
        due, self.scheduled = self.scheduled, []
        for fn in due:
            fn()
        return len(due)

    def frames(self) -> list:
        """Decode and consume everything written so far: [(channel, pamqp frame)]."""
        out = []
        while self.data:
            used, channel, value = frame.unmarshal(bytes(self.data))
            del self.data[:used]
            out.append((channel, value))
        return out


def make_connection(broker, transport) -> Connection:
    """Connection(broker, transport), or the older Connection(broker, transport, peer)."""
    if "peer" in inspect.signature(Connection).parameters:
        return Connection(broker, transport, transport.peer)
    return Connection(broker, transport)


def open_connection(broker=None, heartbeat=0, peer=PEER):
    """A connection through the handshake to an open vhost "/": (conn, transport)."""
    transport = FakeTransport(peer=peer)
    conn = make_connection(broker if broker is not None else Broker.with_defaults(), transport)
    conn.data_received(PROTOCOL_HEADER)
    [(_, start)] = transport.frames()
    assert isinstance(start, commands.Connection.Start)
    conn.data_received(frame.marshal(commands.Connection.StartOk(
        client_properties={"capabilities": {"consumer_cancel_notify": True}},
        mechanism="PLAIN", response="\0guest\0guest"), 0))
    [(_, tune)] = transport.frames()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    conn.data_received(frame.marshal(commands.Connection.TuneOk(2047, FRAME_MAX, heartbeat), 0))
    conn.data_received(frame.marshal(commands.Connection.Open("/"), 0))
    [(_, open_ok)] = transport.frames()
    assert isinstance(open_ok, commands.Connection.OpenOk)
    assert transport.heartbeat == heartbeat
    assert transport.handshake_completed
    return conn, transport


# ------------------------------------------------------------------ server frames
class Frame(tuple):
    """(channel, name, *fields[, body]); `.properties` for content, else None."""

    properties = None


def summarize(frames) -> list:
    """Turn [(channel, pamqp frame)] into Frame tuples, folding content into its method."""
    out = []
    pending = None  # [channel, fields, header, parts] of a method still waiting for content
    for channel, value in frames:
        if pending is not None:
            assert channel == pending[0], f"content for channel {pending[0]} interleaved with channel {channel}"
            if pending[2] is None:
                assert isinstance(value, header.ContentHeader), f"expected a content header, got {value.name}"
                assert value.class_id == 60
                pending[2] = value
            else:
                assert isinstance(value, body.ContentBody), f"expected a content body, got {value.name}"
                pending[3].append(value.value)
            size = sum(len(p) for p in pending[3])
            assert size <= pending[2].body_size, "more body than the content header announced"
            if size == pending[2].body_size:
                item = Frame((*pending[1], b"".join(pending[3])))
                item.properties = pending[2].properties
                out.append(item)
                pending = None
            continue
        assert not isinstance(value, (header.ContentHeader, body.ContentBody)), "content without a method"
        fields = (channel, value.name, *(getattr(value, slot) for slot in value.__slots__))
        if isinstance(value, (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)):
            pending = [channel, fields, None, []]
        else:
            out.append(Frame(fields))
    assert pending is None, "a method's content was cut short"
    return out


def Method(ch, name, *fields):
    return (ch, name, *fields)


def Deliver(ch, consumer_tag, tag, body_, redelivered=False, exchange="", routing_key="q"):
    return (ch, "Basic.Deliver", consumer_tag, tag, redelivered, exchange, routing_key, body_)


def GetOk(ch, tag, body_, remaining, redelivered=False, exchange="", routing_key="q"):
    return (ch, "Basic.GetOk", tag, redelivered, exchange, routing_key, remaining, body_)


def GetEmpty(ch):
    return (ch, "Basic.GetEmpty", "")


def Return(ch, code, text, exchange, routing_key, body_):
    return (ch, "Basic.Return", code, text, exchange, routing_key, body_)


def Ack(ch, tag, multiple=False):
    return (ch, "Basic.Ack", tag, multiple)


def ConsumeOk(ch, consumer_tag):
    return (ch, "Basic.ConsumeOk", consumer_tag)


def ChannelClose(ch, code, text, class_id, method_id):
    return (ch, "Channel.Close", code, text, class_id, method_id)


def ConnectionClose(code, text, class_id=0, method_id=0):
    return (0, "Connection.Close", code, text, class_id, method_id)


# ------------------------------------------------------------------ the client
class Client:
    """One client connection to a session Connection, speaking in AMQP methods."""

    def __init__(self, broker=None, heartbeat=0, peer=PEER):
        self.broker = broker if broker is not None else Broker.with_defaults()
        self.conn, self.transport = open_connection(self.broker, heartbeat, peer)
        self._batch = None

    # input ---------------------------------------------------------------------
    def send_bytes(self, data: bytes) -> None:
        if self._batch is not None:
            self._batch.append(data)
        else:
            self.conn.data_received(data)

    @contextlib.contextmanager
    def batch(self):
        """Everything sent inside arrives in one data_received call (one read)."""
        assert self._batch is None, "batches do not nest"
        self._batch = []
        try:
            yield
            data = b"".join(self._batch)
        finally:
            self._batch = None
        self.conn.data_received(data)

    def send(self, ch: int, method) -> None:
        self.send_bytes(frame.marshal(method, ch))

    def publish(self, ch, exchange, routing_key, body_: bytes, mandatory=False, properties=None,
                persistent=False) -> None:
        if properties is None:
            properties = commands.Basic.Properties(delivery_mode=2 if persistent else None)
        chunk = FRAME_MAX - 8  # a frame's payload: frame_max less the header and end octet
        self.send_bytes(b"".join([
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                 mandatory=mandatory), ch),
            frame.marshal(header.ContentHeader(0, len(body_), properties), ch),
            *(frame.marshal(body.ContentBody(body_[i:i + chunk]), ch) for i in range(0, len(body_), chunk)),
        ]))

    def ack(self, ch, tag, multiple=False):
        self.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    def nack(self, ch, tag, multiple=False, requeue=True):
        self.send(ch, commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue))

    def reject(self, ch, tag, requeue=True):
        self.send(ch, commands.Basic.Reject(delivery_tag=tag, requeue=requeue))

    def get(self, ch, queue="q", no_ack=False):
        self.send(ch, commands.Basic.Get(queue=queue, no_ack=no_ack))

    def consume(self, ch, tag, queue="q", no_ack=False):
        self.send(ch, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack))

    def qos(self, ch, count, global_=False, size=0):
        self.send(ch, commands.Basic.Qos(prefetch_size=size, prefetch_count=count, global_=global_))

    # output --------------------------------------------------------------------
    def receive(self) -> list:
        """What the server wrote since the last call, as Frame tuples."""
        return summarize(self.transport.frames())

    def tick(self) -> list:
        """Run the flushes scheduled on this connection (the loop's turn), then receive()."""
        self.transport.run_scheduled()
        return self.receive()

    # round trips that set the scene (each checks its reply) -----------------------
    def call(self, ch, method) -> list:
        self.send(ch, method)
        return self.receive()

    def open_channel(self, ch=1) -> None:
        assert self.call(ch, commands.Channel.Open()) == [(ch, "Channel.OpenOk", "")]

    def close_channel(self, ch) -> None:
        assert self.call(ch, commands.Channel.Close(200, "bye", 0, 0)) == [(ch, "Channel.CloseOk")]

    def declare(self, ch=1, queue="q", durable=False, exclusive=False) -> None:
        got = self.call(ch, commands.Queue.Declare(queue=queue, durable=durable, exclusive=exclusive))
        assert [f[:3] for f in got] == [(ch, "Queue.DeclareOk", queue)], got

    def fill(self, ch, queue, bodies, persistent=False) -> None:
        """Publish each body to `queue` (default exchange) in one read; expects no reply."""
        with self.batch():
            for b in bodies:
                self.publish(ch, "", queue, b, persistent=persistent)
        got = self.receive()
        assert got == [], got

    def get_tags(self, ch, n, queue="q") -> list:
        """n basic.get (acks required) in one read: the delivery tags."""
        with self.batch():
            for _ in range(n):
                self.get(ch, queue)
        got = self.receive()
        assert [f[1] for f in got] == ["Basic.GetOk"] * n, got
        return [f[2] for f in got]

    def drain(self, ch, queue="q") -> list:
        """basic.get (no-ack) until get-empty: [(body, redelivered)]."""
        out = []
        while True:
            [got] = self.call(ch, commands.Basic.Get(queue=queue, no_ack=True))
            if got == GetEmpty(ch):
                return out
            assert got[1] == "Basic.GetOk", got
            out.append((got[-1], got[3]))

    def ready_count(self, ch, queue="q") -> int:
        [ok] = self.call(ch, commands.Queue.Declare(queue=queue, passive=True))
        return ok[3]


# ------------------------------------------------------------------ durable brokers
def durable_broker(data_dir, run_in_thread=None) -> Broker:
    """A broker with a data dir, wired as `warren server --data-dir` does on a first start:
    the message store's persister and the definitions file. With run_in_thread=None the
    persister's fsyncs run inline, in the flush that starts them."""
    data_dir = str(data_dir)
    broker = Broker()
    broker.persister = Persister(data_dir, run_in_thread=run_in_thread)
    broker.metadata.disk = DefinitionsFile.in_dir(data_dir)
    broker.create_defaults()
    broker.persister.clean_start([])
    return broker


class ManualFsync:
    """A run_in_thread for the Persister whose jobs (fsyncs) run when the test says so."""

    def __init__(self):
        self.jobs: list = []

    def __call__(self, job, done) -> None:
        self.jobs.append((job, done))

    def finish(self, error=None) -> None:
        """Let the oldest fsync finish (or fail with `error`), reporting back as the loop would."""
        job, done = self.jobs.pop(0)
        if error is None:
            job()
        done(error)


class ManualScheduler:
    """The Scheduler port (warren/broker/ports.py) on a clock the test moves: `advance(s)`
    runs the timers that fall due, in order."""

    class Timer:
        def __init__(self, at, callback):
            self.at, self.callback, self.cancelled = at, callback, False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self) -> None:
        self.clock = 1000.0
        self.timers: list = []

    def call_later(self, delay, callback):
        timer = self.Timer(self.clock + delay, callback)
        self.timers.append(timer)
        return timer

    def now(self) -> float:
        return self.clock

    def advance(self, seconds: float) -> None:
        end = self.clock + seconds
        while True:
            due = sorted((t for t in self.timers if not t.cancelled and t.at <= end), key=lambda t: t.at)
            if not due:
                break
            timer = due[0]
            self.timers.remove(timer)
            self.clock = max(self.clock, timer.at)
            timer.callback()
        self.clock = end
        self.timers = [t for t in self.timers if not t.cancelled]
