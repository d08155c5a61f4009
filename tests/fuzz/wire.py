"""The wire fuzzer's parts: valid frame sequences, a seeded mutator, a raw client that drives
one connection to a bounded end, and RabbitMQ 3.10's reading of a byte stream (to tell which
silent closes RabbitMQ would do too).

Everything is encoded here by hand (not by Warren's codec, not by pamqp's encoder, which
refuses byte arrays): the fuzzer must not share the decoder's assumptions. pamqp supplies
only the method argument lists (its `__slots__` and `amqp_type`).
"""

from __future__ import annotations

import datetime
import random
import socket
import struct
import time
from dataclasses import dataclass, field

from pamqp import commands

from rawamqp import longstr, shortstr  # the tests' own encoders, not Warren's

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_MAX = 131072
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CLOSE, CLOSE_OK = (10, 50), (10, 51)
CHANNEL_CLOSE = (20, 40)

# --------------------------------------------------------------------------- encoding


def table(entries: list) -> bytes:
    """[(key, tag, value)] -> a field table, each value encoded as its tag says."""
    raw = b"".join(shortstr(k) + value(tag, v) for k, tag, v in entries)
    return struct.pack(">I", len(raw)) + raw


def array(items: list) -> bytes:
    raw = b"".join(value(tag, v) for tag, v in items)
    return struct.pack(">I", len(raw)) + raw


_FIXED = {"t": ">B", "b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
          "L": ">q", "f": ">f", "d": ">d", "T": ">Q"}


def value(tag: str, v) -> bytes:
    t = tag.encode()
    if tag in _FIXED:
        return t + struct.pack(_FIXED[tag], v)
    if tag == "D":
        return t + struct.pack(">BI", *v)
    if tag in "Sx":
        return t + longstr(v)
    if tag == "V":
        return t
    if tag in "FA":
        return t + v  # already a table / array
    raise ValueError(tag)


def every_type_table(depth: int = 2) -> bytes:
    """A table with every type RabbitMQ's parser knows, an array of them and a nested table."""
    entries = [("bool", "t", 1), ("byte", "b", -3), ("ubyte", "B", 200), ("short", "s", -300),
               ("ushort", "u", 60000), ("int", "I", -70000), ("uint", "i", 4000000000),
               ("long", "l", -(1 << 40)), ("Long", "L", 1 << 40), ("float", "f", 1.5), ("double", "d", 2.25),
               ("decimal", "D", (2, 12345)), ("stamp", "T", 1_600_000_000), ("void", "V", None),
               ("bytes", "x", b"\x00\xff\x01"), ("text", "S", "h\u00e9llo"),
               ("list", "A", array([("I", 1), ("S", "two"), ("t", 0), ("V", None), ("F", table([("k", "b", 1)]))]))]
    if depth > 0:
        entries.append(("nested", "F", every_type_table(depth - 1)))
    return table(entries)


def nested_table(depth: int) -> bytes:
    """{"n": {"n": ... {}}} `depth` levels deep (the deep-nesting case of the issue)."""
    raw = table([])
    for _ in range(depth):
        raw = table([("n", "F", raw)])
    return raw


def method(cls, **fields) -> bytes:
    """A method frame's payload for pamqp command class `cls`, arguments encoded by hand
    (tables given as encoded bytes; the others default to pamqp's defaults)."""
    defaults = cls()
    out = [struct.pack(">I", cls.index)]
    bits, nbits = 0, 0
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        v = fields[name] if name in fields else getattr(defaults, name)
        if kind == "bit":
            bits |= (1 << nbits) if v else 0
            nbits += 1
            continue
        if nbits:
            out.append(bytes((bits,)))
            bits, nbits = 0, 0
        if kind == "shortstr":
            out.append(shortstr(v or ""))
        elif kind == "longstr":
            out.append(longstr(v or b""))
        elif kind == "table":
            out.append(v if isinstance(v, bytes) else table([]))
        else:
            out.append(struct.pack({"octet": ">B", "short": ">H", "long": ">I", "longlong": ">Q",
                                    "timestamp": ">Q"}[kind], v or 0))
    if nbits:
        out.append(bytes((bits,)))
    return b"".join(out)


def content_header(body_size: int, *, headers: bytes | None = None, persistent=False, full=False) -> bytes:
    """A basic content header payload: class 60, weight 0, body size, flags, properties."""
    props = []  # (flag bit, encoded)
    if full:
        props += [(15, shortstr("application/json")), (14, shortstr("identity"))]
    if headers is not None:
        props.append((13, headers))
    if persistent or full:
        props.append((12, bytes((2,))))
    if full:
        props += [(11, bytes((5,))), (10, shortstr("corr-1")), (9, shortstr("reply.q")), (8, shortstr("60000")),
                  (7, shortstr("msg-1")), (6, struct.pack(">Q", int(datetime.datetime(2024, 1, 1).timestamp()))),
                  (5, shortstr("fuzz.type")), (4, shortstr("guest")), (3, shortstr("fuzzer"))]
    flags = 0
    for bit, _ in props:
        flags |= 1 << bit
    return struct.pack(">HHQH", 60, 0, body_size, flags) + b"".join(p for _, p in props)


# --------------------------------------------------------------------------- frames


@dataclass
class Chunk:
    """One frame to send (possibly lying about its size or end octet), or raw bytes."""

    ftype: int = 0
    channel: int = 0
    payload: bytes = b""
    size: int | None = None  # the size field, when it does not match the payload
    end: int = FRAME_END
    raw: bytes | None = None  # garbage sent as is, instead of a frame

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        size = len(self.payload) if self.size is None else self.size
        return struct.pack(">BHI", self.ftype, self.channel, size & 0xFFFFFFFF) + self.payload + bytes((self.end,))

    def describe(self) -> str:
        if self.raw is not None:
            return f"raw {self.raw.hex()}"
        lie = "" if self.size is None else f" size-field={self.size}"
        end = "" if self.end == FRAME_END else f" end=0x{self.end:02x}"
        return f"type={self.ftype} ch={self.channel}{lie}{end} payload ({len(self.payload)} bytes)={self.payload.hex()}"


def M(ch: int, cls, **fields) -> Chunk:
    return Chunk(FRAME_METHOD, ch, method(cls, **fields))


def publish(ch: int, exchange: str, routing_key: str, body: bytes, *, mandatory=False, split=False, **header) -> list:
    chunks = [M(ch, commands.Basic.Publish, exchange=exchange, routing_key=routing_key, mandatory=mandatory),
              Chunk(FRAME_HEADER, ch, content_header(len(body), **header))]
    parts = [body[:len(body) // 2], body[len(body) // 2:]] if split else [body]
    chunks += [Chunk(FRAME_BODY, ch, p) for p in parts if p]
    return chunks


# --------------------------------------------------------------------------- scenarios
# Each is valid on its own (an unmutated connection must end in a clean close, with no
# channel error, on RabbitMQ and on Warren); `ch` is a channel of its own, `q` a name prefix.


def sc_declare(ch, q, rng):
    return [M(ch, commands.Channel.Open),
            M(ch, commands.Queue.Declare, queue=q, exclusive=True,
              arguments=table([("x-max-length", "I", 1000), ("fz", "F", every_type_table())])),
            M(ch, commands.Queue.Bind, queue=q, exchange="amq.topic", routing_key="fz.#.x",
              arguments=table([("fz", "A", array([("S", "a"), ("l", 7)]))])),
            M(ch, commands.Queue.Unbind, queue=q, exchange="amq.topic", routing_key="fz.#.x",
              arguments=table([("fz", "A", array([("S", "a"), ("l", 7)]))])),
            M(ch, commands.Queue.Purge, queue=q),
            M(ch, commands.Queue.Declare, queue=q, passive=True)]


def sc_publish_get(ch, q, rng):
    body = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 40, 300])))
    return [M(ch, commands.Channel.Open), M(ch, commands.Confirm.Select),
            M(ch, commands.Queue.Declare, queue=q, exclusive=True),
            *publish(ch, "", q, body, mandatory=True, split=True, full=True, headers=every_type_table(1)),
            *publish(ch, "amq.direct", "fz-nowhere", b"returned", mandatory=True, persistent=True),
            M(ch, commands.Basic.Get, queue=q),
            M(ch, commands.Basic.Ack, delivery_tag=1)]


def sc_consume(ch, q, rng):
    return [M(ch, commands.Channel.Open), M(ch, commands.Queue.Declare, queue=q, exclusive=True),
            M(ch, commands.Basic.Qos, prefetch_count=5),
            M(ch, commands.Basic.Consume, queue=q, consumer_tag="fz-ctag", no_ack=True,
              arguments=table([("fz", "S", "x")])),
            *publish(ch, "", q, b"one"), *publish(ch, "", q, b"two", persistent=True),
            M(ch, commands.Basic.Cancel, consumer_tag="fz-ctag"),
            M(ch, commands.Basic.Recover, requeue=True)]


def sc_exchanges(ch, q, rng):
    x, y = f"{q}-x", f"{q}-y"
    return [M(ch, commands.Channel.Open),
            M(ch, commands.Exchange.Declare, exchange=x, exchange_type="headers", auto_delete=True,
              arguments=table([("alternate-exchange", "S", "amq.fanout"), ("fz", "F", every_type_table(1))])),
            M(ch, commands.Exchange.Declare, exchange=y, exchange_type="fanout", auto_delete=True),
            M(ch, commands.Exchange.Bind, destination=y, source=x, routing_key="",
              arguments=table([("x-match", "S", "any"), ("a", "I", 1)])),
            M(ch, commands.Queue.Declare, queue=q, exclusive=True),
            M(ch, commands.Queue.Bind, queue=q, exchange=y),
            *publish(ch, x, "", b"by headers", headers=table([("a", "I", 1)])),
            M(ch, commands.Exchange.Unbind, destination=y, source=x, routing_key="",
              arguments=table([("x-match", "S", "any"), ("a", "I", 1)])),
            M(ch, commands.Exchange.Delete, exchange=x),
            M(ch, commands.Exchange.Declare, exchange="amq.direct", passive=True)]


def sc_tx(ch, q, rng):
    # tx.commit comes last: RabbitMQ answers any method that arrives on the channel while a
    # commit is in flight with 504 "unexpected command while processing 'tx.commit'".
    return [M(ch, commands.Channel.Open), M(ch, commands.Tx.Select),
            M(ch, commands.Queue.Declare, queue=q, exclusive=True),
            *publish(ch, "", q, b"rolled back"), *publish(ch, "", q, b"rolled back", persistent=True),
            M(ch, commands.Tx.Rollback), *publish(ch, "", q, b"committed"), M(ch, commands.Tx.Commit)]


def sc_channels(ch, q, rng):
    # channel.close comes last: RabbitMQ refuses a channel.open pipelined after it (504).
    return [M(ch, commands.Channel.Open), M(ch, commands.Channel.Flow, active=True),
            Chunk(FRAME_HEARTBEAT, 0, b""),
            M(ch, commands.Queue.Delete, queue=f"{q}-none"),
            M(ch, commands.Basic.Qos, prefetch_count=10, global_=True),
            M(ch, commands.Channel.Close, reply_code=200, reply_text="bye")]


def sc_deep(ch, q, rng):
    # RabbitMQ accepts a field table nested 400 levels deep.
    return [M(ch, commands.Channel.Open),
            M(ch, commands.Queue.Declare, queue=q, exclusive=True,
              arguments=table([("fz-deep", "F", nested_table(rng.choice([50, 400])))]))]


SCENARIOS = [sc_declare, sc_publish_get, sc_consume, sc_exchanges, sc_tx, sc_channels, sc_deep]
SCENARIO_WEIGHTS = [3, 4, 2, 2, 2, 1, 1]


def handshake_chunks(vhost="/") -> list:
    start_ok = (struct.pack(">HH", 10, 11)
                + table([("product", "S", "warren wire fuzz"),
                         ("capabilities", "F", table([("authentication_failure_close", "t", 1),
                                                      ("consumer_cancel_notify", "t", 1)]))])
                + shortstr("PLAIN") + longstr(b"\0guest\0guest") + shortstr("en_US"))
    return [Chunk(raw=PROTOCOL_HEADER), Chunk(FRAME_METHOD, 0, start_ok),
            M(0, commands.Connection.TuneOk, channel_max=2047, frame_max=FRAME_MAX, heartbeat=0),
            M(0, commands.Connection.Open, virtual_host=vhost)]


# --------------------------------------------------------------------------- the mutator

_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\x01", b"\x00\x00", b"\xff\xff", b"\x7f\xff", b"\x80\x00",
                b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x01",
                b"\x00\x02\x00\x00", b"\xff\xff\xff\xff\xff\xff\xff\xff"]
_TAGS = b"tbBsuIilLfdDTVxSFA" + b"UcZ\x00"  # RabbitMQ's tags and a few it does not know


def mutate(chunks: list, rng: random.Random, first: int = 0) -> list:
    """Apply one random mutation to chunks[first:]; returns its description."""
    i = rng.randrange(first, len(chunks))
    c = chunks[i]
    op = rng.choice(["bitflip", "bitflip", "byte", "interesting", "interesting", "truncate", "extend",
                     "tag", "tag", "size", "end", "ftype", "channel", "garbage", "drop", "duplicate", "swap"])
    if c.ftype == FRAME_HEADER and c.raw is None and len(c.payload) >= 14 and rng.random() < 0.5:
        op = "flags"
    if c.raw is not None and op not in ("drop", "duplicate", "swap", "garbage"):
        op = "garbage"
    p = bytearray(c.payload)
    if op in ("bitflip", "byte", "interesting", "tag", "truncate") and not p:
        op = "extend"
    if op == "bitflip":
        pos = rng.randrange(len(p))
        p[pos] ^= 1 << rng.randrange(8)
    elif op == "byte":
        p[rng.randrange(len(p))] = rng.randrange(256)
    elif op == "interesting":
        v = rng.choice(_INTERESTING)
        pos = rng.randrange(len(p))
        p[pos:pos + len(v)] = v[:max(0, len(p) - pos)] if rng.random() < 0.7 else v  # overwrite or grow
    elif op == "tag":
        spots = [k for k, b in enumerate(p) if b in _TAGS]
        pos = rng.choice(spots) if spots else rng.randrange(len(p))
        p[pos] = rng.choice(_TAGS)
    elif op == "truncate":
        del p[rng.randrange(len(p)):]
    elif op == "flags":  # a content header's property flags, and what they promise
        flags = rng.choice([rng.getrandbits(16), 0x0001, 0x0080, 0x2000, 0xFFFF, 0xFFFE])
        struct.pack_into(">H", p, 12, flags)
        if rng.random() < 0.5:
            del p[14 + rng.randrange(len(p) - 13):]
    elif op == "extend":
        p += bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 2, 4, 9])))
    elif op == "size":
        c.size = rng.choice([len(p) + rng.choice([-2, -1, 1, 2, 7]), 0, FRAME_MAX - 8, FRAME_MAX + 1, 0xFFFFFFFF])
    elif op == "end":
        c.end = rng.choice([0x00, 0xCD, 0xCF, 0xFF, rng.randrange(256)])
    elif op == "ftype":
        c.ftype = rng.choice([0, 1, 2, 3, 4, 8, 9, 0x41, 0xCE, rng.randrange(256)])
    elif op == "channel":
        c.channel = rng.choice([0, 1, 2, 7, 2047, 2048, 65535, rng.randrange(65536)])
    elif op == "garbage":
        junk = rng.choice([b"\xce", b"\x00" * 7, b"AMQP\x00\x00\x09\x01", b"GET / HTTP/1.1\r\n\r\n",
                           bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 24)))])
        chunks.insert(i + rng.randrange(2), Chunk(raw=junk))
        return f"garbage {junk.hex()} near chunk {i}"
    elif op == "drop" and len(chunks) - first > 1:
        del chunks[i]
        return f"drop chunk {i}"
    elif op == "duplicate":
        chunks.insert(i, Chunk(c.ftype, c.channel, c.payload, c.size, c.end, c.raw))
        return f"duplicate chunk {i}"
    elif op == "swap" and i + 1 < len(chunks):
        chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
        return f"swap chunks {i}, {i + 1}"
    c.payload = bytes(p)
    return f"{op} chunk {i}"


# --------------------------------------------------------------------------- RabbitMQ's reading

_KNOWN_METHODS: dict = {}
for _cls in vars(commands).values():
    if isinstance(_cls, type):
        for _m in vars(_cls).values():
            if isinstance(_m, type) and isinstance(getattr(_m, "index", None), int):
                _KNOWN_METHODS[(_m.index >> 16, _m.index & 0xFFFF)] = _m


class _Short(Exception):
    pass


def _parse_table(raw: bytes) -> bool:
    """rabbit_binary_parser:parse_table/1: False where RabbitMQ's pattern match fails (its
    reader process crashes and the socket closes without a word)."""
    try:
        _walk(raw, table_=True)
        return True
    except _Short:
        return False


def _walk(raw: bytes, table_: bool) -> None:
    # Iterative (the fuzzer's own deep tables must not stop the fuzzer).
    stack = [(raw, 0, table_)]
    while stack:
        buf, pos, is_table = stack.pop()
        while pos < len(buf):
            if is_table:
                n = buf[pos]
                pos += 1 + n
            if pos >= len(buf):
                raise _Short()
            tag = chr(buf[pos])
            pos += 1
            if tag in _FIXED:
                pos += struct.calcsize(_FIXED[tag])
            elif tag == "D":
                pos += 5
            elif tag in "SxFA":
                if pos + 4 > len(buf):
                    raise _Short()
                (n,) = struct.unpack_from(">I", buf, pos)
                if pos + 4 + n > len(buf):
                    raise _Short()
                if tag in "FA":
                    stack.append((buf[pos + 4:pos + 4 + n], 0, tag == "F"))
                pos += 4 + n
            elif tag != "V":
                raise _Short()
            if pos > len(buf):
                raise _Short()


def rabbitmq_method_fate(payload: bytes) -> str:
    """What RabbitMQ 3.10 makes of a method frame's payload, before any semantics:
    "unknown method" and "malformed table" crash its reader (silent close), "cannot decode"
    is a 501, "ok" decodes."""
    if len(payload) < 4:
        return "short frame"  # 501 unknown_frame
    cls = _KNOWN_METHODS.get(struct.unpack_from(">HH", payload))
    if cls is None:
        return "unknown method"
    pos, bits_open, tables = 4, False, []
    try:
        for name in cls.__slots__:
            kind = cls.amqp_type(name)
            if kind == "bit":
                if not bits_open:
                    pos += 1
                    bits_open = True
                continue
            bits_open = False
            if kind == "shortstr":
                if pos >= len(payload):
                    raise _Short()
                pos += 1 + payload[pos]
            elif kind in ("longstr", "table"):
                if pos + 4 > len(payload):
                    raise _Short()
                (n,) = struct.unpack_from(">I", payload, pos)
                if kind == "table":
                    tables.append(payload[pos + 4:pos + 4 + n])
                pos += 4 + n
            else:
                pos += {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}[kind]
            if pos > len(payload):
                raise _Short()
        if pos > len(payload) or pos != len(payload):
            raise _Short()
    except _Short:
        return "cannot decode"
    if not all(_parse_table(t) for t in tables):
        return "malformed table"
    return "ok"


_PROPERTY_KINDS = ["shortstr", "shortstr", "table", "octet", "octet", "shortstr", "shortstr", "shortstr",
                   "shortstr", "timestamp", "shortstr", "shortstr", "shortstr", "shortstr"]  # flag bits 15..2


def readable_content_header(payload: bytes) -> bool:
    """Whether RabbitMQ 3.10 can decode this basic content header (it ignores the two low
    flag bits; every promised property must be there, tables must parse, nothing may follow)."""
    if len(payload) < 14 or struct.unpack_from(">H", payload)[0] != 60:
        return False
    (flags,) = struct.unpack_from(">H", payload, 12)
    pos, tables = 14, []
    for bit, kind in zip(range(15, 1, -1), _PROPERTY_KINDS):
        if not flags & (1 << bit):
            continue
        if kind == "shortstr":
            if pos >= len(payload):
                return False
            pos += 1 + payload[pos]
        elif kind == "table":
            if pos + 4 > len(payload):
                return False
            (n,) = struct.unpack_from(">I", payload, pos)
            tables.append(payload[pos + 4:pos + 4 + n])
            pos += 4 + n
        else:
            pos += 1 if kind == "octet" else 8
        if pos > len(payload):
            return False
    return pos == len(payload) and all(_parse_table(t) for t in tables)


def silent_close_reason(stream: bytes) -> str | None:
    """Why RabbitMQ 3.10 would drop this post-handshake byte stream without a connection.close,
    if it would: a well-framed method frame (before any framing error) whose method is unknown
    or whose field tables it cannot parse."""
    pos = 0
    while len(stream) - pos >= 8:
        ftype, ch, size = struct.unpack_from(">BHI", stream, pos)
        if size > FRAME_MAX - 8 or pos + 8 + size > len(stream) or stream[pos + 7 + size] != FRAME_END:
            return None
        payload = stream[pos + 7:pos + 7 + size]
        pos += 8 + size
        if ftype == FRAME_METHOD:
            fate = rabbitmq_method_fate(payload)
            if fate in ("unknown method", "malformed table"):
                return f"{fate}: {payload[:48].hex()}"
    return None


# --------------------------------------------------------------------------- the client


class Reader:
    """Frames from the broker on a blocking socket, decoding only what the fuzzer needs."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def frame(self, deadline: float):
        """(ftype, channel, payload), or None at EOF; raises TimeoutError at the deadline."""
        while True:
            if len(self.buf) >= 7:
                ftype, ch, size = struct.unpack_from(">BHI", self.buf)
                if self.buf[:4] == b"AMQP" and len(self.buf) >= 8:  # the broker refusing our header
                    del self.buf[:8]
                    return (-1, 0, b"")
                if len(self.buf) >= 8 + size:
                    payload = bytes(self.buf[7:7 + size])
                    if self.buf[7 + size] != FRAME_END:
                        raise AssertionError(f"bad frame end from the broker: {bytes(self.buf[:32]).hex()}")
                    del self.buf[:8 + size]
                    return (ftype, ch, payload)
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError()
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError() from None
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.eof = True
            self.buf += data


def method_id(payload: bytes):
    return struct.unpack_from(">HH", payload) if len(payload) >= 4 else None


def close_fields(payload: bytes):
    (code,) = struct.unpack_from(">H", payload, 4)
    n = payload[6]
    return code, payload[7:7 + n].decode("utf-8", "replace")


@dataclass
class Outcome:
    kind: str  # "clean close", "connection.close", "silent close", "hang", "no eof after close-ok", "handshake failed"
    code: int | None = None
    text: str = ""
    port: int = 0
    channel_errors: list = field(default_factory=list)
    padded: bool = False
    seconds: float = 0.0
    unreadable: list = field(default_factory=list)  # content headers from the broker RabbitMQ could not read


def drive(host: str, port: int, chunks: list, *, handshake_done: bool, quiet: float, bound: float) -> Outcome:
    """Open a connection (doing the handshake first unless `chunks` carries it), send the
    chunks and a connection.close of our own, and read until the connection ends. If nothing
    ends it within `quiet` seconds (a frame whose size field promises more bytes), send
    frame_max bytes of 0xCE: they complete any frame and then make an oversized one, which
    every broker must refuse. "hang" if even that ends nothing within `bound` seconds."""
    began = time.monotonic()
    sock = socket.create_connection((host, port), timeout=bound)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    local_port = sock.getsockname()[1]
    reader = Reader(sock)
    out = Outcome("hang", port=local_port)
    try:
        if handshake_done:
            deadline = time.monotonic() + bound
            _, start_ok, tune_ok, open_ = handshake_chunks()
            for send, reply in ((PROTOCOL_HEADER, (10, 10)), (start_ok.encode(), (10, 30)),
                                (tune_ok.encode() + open_.encode(), (10, 41))):
                sock.sendall(send)
                f = reader.frame(deadline)
                if f is None or method_id(f[2]) != reply:
                    return Outcome("handshake failed", text=repr(f), port=local_port)
        data = b"".join(c.encode() for c in chunks) + Chunk(FRAME_METHOD, 0, method(
            commands.Connection.Close, reply_code=200, reply_text="fuzz done")).encode()
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker already closed: read what it said
        deadline = time.monotonic() + quiet
        while True:
            try:
                f = reader.frame(deadline)
            except TimeoutError:
                if out.padded:
                    return out
                out.padded = True
                try:
                    sock.sendall(b"\xce" * (FRAME_MAX + 16))
                except (BrokenPipeError, ConnectionResetError):
                    pass
                deadline = time.monotonic() + bound
                continue
            if f is None:
                out.kind = "silent close"
                return out
            ftype, ch, payload = f
            if ftype == -1:
                out.kind, out.text = "silent close", "protocol header refused"
                return out
            if ftype == FRAME_HEADER and not readable_content_header(payload):
                out.unreadable.append(payload)
            mid = method_id(payload) if ftype == FRAME_METHOD else None
            if mid == CHANNEL_CLOSE:
                out.channel_errors.append(close_fields(payload)[0])
            elif mid == CLOSE_OK and ch == 0:
                out.kind = "clean close"  # the client closes the socket now (RabbitMQ waits for it)
                return out
            elif mid == CLOSE and ch == 0:
                out.kind = "connection.close"
                out.code, out.text = close_fields(payload)
                try:
                    sock.sendall(Chunk(FRAME_METHOD, 0, method(commands.Connection.CloseOk)).encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass
                return _expect_eof(reader, out, bound)
    except (ConnectionResetError, BrokenPipeError):
        out.kind = "silent close" if out.kind == "hang" else out.kind
        return out
    finally:
        out.seconds = time.monotonic() - began
        sock.close()


def _expect_eof(reader: Reader, out: Outcome, bound: float) -> Outcome:
    deadline = time.monotonic() + bound
    try:
        while reader.frame(deadline) is not None:
            pass
    except TimeoutError:
        out.kind = f"no eof after {out.kind}"
    return out


# --------------------------------------------------------------------------- the campaign


@dataclass
class Case:
    index: int
    chunks: list
    handshake_done: bool  # False: the chunks start with the handshake, which is fuzzed
    mutations: list

    @property
    def frames(self) -> int:
        return len(self.chunks)

    def stream(self) -> bytes:
        return b"".join(c.encode() for c in self.chunks)


def make_cases(seed: int, connections: int, handshake_share: float = 0.08, control_share: float = 0.05) -> list:
    """The connections of one campaign, all drawn from random.Random(seed)."""
    rng = random.Random(seed)
    cases = []
    for index in range(connections):
        picked = rng.choices(SCENARIOS, SCENARIO_WEIGHTS, k=rng.choice([1, 1, 2, 3]))
        chunks: list = []
        for k, scenario in enumerate(picked):
            chunks += scenario(k + 1, f"fz-{seed}-{index}-{k}", rng)
        roll = rng.random()
        if roll < handshake_share:
            chunks = handshake_chunks() + chunks
            mutations = []
            # Mutate the handshake itself (the first four chunks, wherever mutations move them).
            for _ in range(rng.choice([1, 1, 2])):
                mutations.append(mutate(chunks, rng, first=0) if rng.random() < 0.2 else
                                 _mutate_prefix(chunks, rng, 4))
            cases.append(Case(index, chunks, False, mutations))
        elif roll < handshake_share + control_share:
            cases.append(Case(index, chunks, True, []))
        else:
            cases.append(Case(index, chunks, True, [mutate(chunks, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]))
    return cases


def _mutate_prefix(chunks: list, rng: random.Random, n: int) -> str:
    head, tail = chunks[:n], chunks[n:]
    what = mutate(head, rng)
    chunks[:] = head + tail
    return what
