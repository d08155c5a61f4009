"""Malformed and hostile input, on raw sockets: content headers, field tables, names that are
not UTF-8, deep nesting, the legacy protocol header.

Each case was sent to RabbitMQ 3.10.8 and Warren. Where they answer alike the test runs
against both; where Warren departs on purpose (docs/compatibility.md, "Deliberate
departures from RabbitMQ 3.10.8") the test says what RabbitMQ does and checks Warren's answer only against Warren.
"""

import json
import math
import struct
import subprocess
import sys
import time
import urllib.parse

import pika
import pytest
import requests
from pamqp import commands

from conftest import EXTERNAL, RABBITMQ
from rawamqp import (FRAME_BODY, FRAME_HEADER, FRAME_METHOD, PROTOCOL_HEADER, connect, dial, frame, longstr, plain,
                     shortstr)
from warrenctl_path import WARRENCTL

MAX_NESTING = 1000  # warren.amqp.codec.MAX_NESTING: not imported, the tests may run against RabbitMQ
GUEST = ("guest", "guest")
warren_only = pytest.mark.skipif(bool(EXTERNAL), reason="a deliberate departure: RabbitMQ answers otherwise")


@pytest.fixture(autouse=True)
def deep_json():
    """Let the test's own json.loads read values MAX_NESTING deep, as warrenctl does."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, 10 * MAX_NESTING))
    yield
    sys.setrecursionlimit(before)


def header(flags: int, props: bytes = b"", size: int = 3, class_id: int = 60, weight: int = 0) -> bytes:
    """A content header payload: class, weight, body size, one flags word, the properties."""
    return struct.pack(">HHQH", class_id, weight, size, flags) + props


def table(content: bytes) -> bytes:
    return struct.pack(">I", len(content)) + content


def nested(depth: int) -> bytes:
    """The content of a field table nested `depth` levels deep (itself level 1): each level
    holds one entry "a" with the next level, the deepest one "a" = 1."""
    inner = b"I\x00\x00\x00\x01"
    for _ in range(depth - 1):
        inner = b"F" + table(b"\x01a" + inner)
    return b"\x01a" + inner


def deep_array(depth: int) -> bytes:
    """An array value nested `depth` levels (the array itself is level 1): 5 octets a level."""
    inner = b"I\x00\x00\x00\x01"
    for _ in range(depth - 1):
        inner = b"A" + table(inner)
    return b"A" + table(inner)


def method(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return struct.pack(">HH", class_id, method_id) + args


def queue_declare(name, arguments: bytes = b"\x00\x00\x00\x00", durable=False) -> bytes:
    name = name.encode() if isinstance(name, str) else name
    return method(50, 10, b"\x00\x00" + shortstr(name) + bytes((2 if durable else 0,)) + arguments)


def publish(client, routing_key, header_payload: bytes, body: bytes = b"abc", exchange=b"", mandatory=False):
    """basic.publish, then exactly the given content header and the body (raw bytes)."""
    routing_key = routing_key.encode() if isinstance(routing_key, str) else routing_key
    client.send_frame(FRAME_METHOD, 1, method(60, 40, b"\x00\x00" + shortstr(exchange) + shortstr(routing_key)
                                             + bytes((int(mandatory),))))
    client.send_frame(FRAME_HEADER, 1, header_payload)
    if body:
        client.send_frame(FRAME_BODY, 1, body)


def raw_frame(client, timeout=None):
    """The next frame as (type, channel, payload), undecoded (pamqp cannot decode names
    that are not UTF-8)."""
    deadline = time.monotonic() + (timeout or client.timeout)
    while len(client.buf) < 7:
        client._fill(deadline)
    ftype, channel, size = struct.unpack_from(">BHI", client.buf)
    while len(client.buf) < 8 + size:
        client._fill(deadline)
    payload = bytes(client.buf[7:7 + size])
    del client.buf[:8 + size]
    return ftype, channel, payload


def get_raw(client, queue: str):
    """basic.get (no-ack): the get-ok payload, the content header payload and the body."""
    client.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
    ftype, _, get_ok = raw_frame(client)
    assert (ftype, get_ok[:4]) == (FRAME_METHOD, method(60, 71)), get_ok
    _, _, hdr = raw_frame(client)
    size = struct.unpack_from(">Q", hdr, 4)[0]
    body = b""
    while len(body) < size:
        body += raw_frame(client)[2]
    return get_ok, hdr, body


@pytest.fixture
def queue(broker, uid):
    """A queue of the test's own (deleted afterwards)."""
    name = f"malformed-{uid}"
    with connect(broker) as c:
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=name))
    yield name
    with connect(broker) as c:
        c.open_channel(1)
        c.call(1, commands.Queue.Delete(queue=name))


def message_count(broker, name: str) -> int:
    with connect(broker) as c:
        c.open_channel(1)
        return c.call(1, commands.Queue.Declare(queue=name, passive=True)).message_count


def publisher(broker):
    """A raw connection with channel 1 open in confirm mode."""
    c = connect(broker)
    c.open_channel(1)
    c.call(1, commands.Confirm.Select())
    return c


# ------------------------------------------------------------------ content headers

MALFORMED_HEADERS = {
    # The flags promise a message_id; no shortstr follows (the fuzzer's poison message).
    "message_id promised, absent": header(0x0080),
    "content_type longer than the header": header(0x8000, b"\x09abc"),
    "a byte after the properties": header(0x1000, b"\x02\x00"),
    "a second flags word (bit 0 is ignored: its bytes are left over)": header(0x0001, b"\x00\x00"),
    "no flags word (12 octets)": header(0, b"")[:12],
    "half a flags word (13 octets)": header(0, b"")[:13],
    "timestamp cut": header(0x0040, b"\x00\x00\x00\x00"),
    "headers: table longer than the header": header(0x2000, table(b"\x01aV")[:-1]),
    "headers: unknown field type": header(0x2000, table(b"\x01aZ")),
    "headers: value cut inside the table": header(0x2000, table(b"\x01aI\x00\x00")),
    "headers: nested table longer than its parent": header(0x2000, table(b"\x01aF" + table(b"\x01bV")[:-1])),
    "headers: array element cut": header(0x2000, table(b"\x01aA" + table(b"I\x00"))),
    "headers: NaN": header(0x2000, table(b"\x01ad" + struct.pack(">d", math.nan))),
    "headers: infinity": header(0x2000, table(b"\x01af" + struct.pack(">f", math.inf))),
}


@pytest.mark.parametrize("case", list(MALFORMED_HEADERS))
def test_a_content_header_that_does_not_decode_is_refused_and_never_stored(broker, queue, case):
    """RabbitMQ's channel crashes decoding such properties when it handles the publish, and
    its reader closes the connection with a bare 541; nothing is confirmed or queued.
    (Warren used to confirm and queue it: a poison message for every consumer.)"""
    with publisher(broker) as c:
        publish(c, queue, MALFORMED_HEADERS[case])
        c.expect_connection_close(541, "INTERNAL_ERROR", 0, 0)
    assert message_count(broker, queue) == 0


def test_a_content_header_with_a_weight_is_unexpected(broker, queue):
    with publisher(broker) as c:
        publish(c, queue, header(0, weight=1))
        c.expect_connection_close(
            505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
            60, 40)


IGNORED_FLAG_BITS = {
    # RabbitMQ reads the 14 properties of basic from the first flags word and ignores its two
    # low bits: bit 0 (another flags word follows) and bit 1 (no property).
    "continuation bit, nothing after it": (header(0x0001), header(0)),
    "bit 1": (header(0x0002), header(0)),
    "content_type and the continuation bit": (header(0x8001, b"\x02ab"), header(0x8000, b"\x02ab")),
    "user_id (checked) and the continuation bit": (header(0x0011, shortstr("guest")), header(0x0010, shortstr("guest"))),
}


@pytest.mark.parametrize("case", list(IGNORED_FLAG_BITS))
def test_flag_bits_rabbitmq_ignores_are_accepted(broker, queue, case):
    """Truncated property flags (the continuation bit with nothing after it) are accepted,
    as RabbitMQ accepts them. RabbitMQ delivers the bits as they came, which a consumer then
    reads as the promise of another flags word (pika fails on it); Warren clears them."""
    sent, cleared = IGNORED_FLAG_BITS[case]
    with publisher(broker) as c:
        publish(c, queue, sent)
        assert c.expect(commands.Basic.Ack, 1).delivery_tag == 1
        _, hdr, body = get_raw(c, queue)
    assert body == b"abc"
    assert hdr == (sent if RABBITMQ else cleared)


@warren_only
def test_a_message_published_with_the_continuation_bit_is_readable_by_pika(broker, queue):
    with publisher(broker) as c:
        publish(c, queue, header(0x1001, b"\x02"))
        c.expect(commands.Basic.Ack, 1)
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        method_frame, props, body = conn.channel().basic_get(queue, auto_ack=True)
        assert (props.delivery_mode, body) == (2, b"abc")
    finally:
        conn.close()


def test_user_id_behind_a_continuation_bit_is_checked(broker, queue):
    """Properties after truncated flags are still decoded (Warren used to raise struct.error
    here and drop the socket)."""
    with publisher(broker) as c:
        publish(c, queue, header(0x0011, shortstr("bob")))
        c.expect_channel_close(
            1, 406, "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user was 'guest'", 60, 40)


def test_properties_and_header_keys_need_not_be_utf8(broker, queue):
    """RabbitMQ does not check the text of properties or of field-table keys in content:
    they are stored and delivered byte for byte."""
    sent = header(0xA000, shortstr(b"\xff\xfe") + table(b"\x01\xffS" + longstr(b"\xfe")))
    with publisher(broker) as c:
        publish(c, queue, sent)
        c.expect(commands.Basic.Ack, 1)
        publish(c, queue, sent)
        c.expect(commands.Basic.Ack, 1)
        assert get_raw(c, queue)[1:] == (sent, b"abc")
    if broker.mgmt_port is not None:  # Warren's management API shows it (RabbitMQ's node here has none)
        r = requests.post(f"{broker.api}/queues/%2F/{queue}/get", auth=GUEST,
                          json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert r.status_code == 200, r.text
        [msg] = r.json()
        assert msg["payload"] == "abc"


def test_a_user_id_that_is_not_utf8_is_refused_with_its_bytes(broker, queue):
    with publisher(broker) as c:
        publish(c, queue, header(0x0010, shortstr(b"\xff")))
        close = c.expect_channel_close(1, 406, None, 60, 40)
    # The close carries the bytes as sent; rawamqp shows a text that is not UTF-8 as Latin-1.
    assert close.reply_text == "PRECONDITION_FAILED - user_id property set to '\xff' but authenticated user was 'guest'"


# --------------------------------------------------------------- names not UTF-8

def test_a_routing_key_that_is_not_utf8_is_routed_as_bytes(broker, uid, queue):
    """basic.publish is the one method whose shortstrs RabbitMQ does not check for UTF-8
    (Warren refused it with 501): the routing key is matched and delivered byte for byte."""
    exchange = f"malformed-topic-{uid}"
    with publisher(broker) as c:
        c.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="topic", auto_delete=True))
        c.call(1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key="a.*.b"))
        publish(c, b"a.\xff\xfe.b", header(0), exchange=exchange.encode())
        c.expect(commands.Basic.Ack, 1)
        get_ok, _, body = get_raw(c, queue)
        assert body == b"abc"
        assert get_ok.endswith(shortstr(exchange) + shortstr(b"a.\xff\xfe.b") + b"\x00\x00\x00\x00")
        # Unroutable and mandatory: basic.return carries it back as it came.
        publish(c, b"\xff\xfe", header(0), mandatory=True)
        ftype, channel, ret = raw_frame(c)
        assert ret == method(60, 50, struct.pack(">H", 312) + shortstr("NO_ROUTE") + shortstr(b"")
                             + shortstr(b"\xff\xfe"))
        assert c.read_content()[1] == b"abc"
        c.expect(commands.Basic.Ack, 1)


def test_an_exchange_name_that_is_not_utf8_is_not_found(broker):
    with publisher(broker) as c:
        publish(c, b"x", header(0), exchange=b"\xff\xfe")
        close = c.expect_channel_close(1, 404, None, 60, 40)
    assert close.reply_text == "NOT_FOUND - no exchange '\xff\xfe' in vhost '/'"  # its bytes, read as Latin-1


def test_a_queue_name_that_is_not_utf8_is_refused(broker):
    with connect(broker) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1, queue_declare(b"\xff\xfe"))
        c.expect_connection_close(501, "FRAME_ERROR - Malformed UTF-8 in shortstr", 0, 0)


def test_a_table_key_that_is_not_utf8_in_a_method(broker, uid):
    """RabbitMQ takes any bytes as a key; Warren refuses one that is not UTF-8 in a method's
    table, with RabbitMQ's words for such a name: arguments and client properties are names
    the definitions file, the management API and warrenctl show as text."""
    name = f"malformed-key-{uid}"
    with connect(broker) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1, queue_declare(name, table(b"\x02\xff\xfeS" + longstr("v"))))
        if RABBITMQ:
            c.expect(commands.Queue.DeclareOk, 1)
            c.call(1, commands.Queue.Delete(queue=name))
        else:
            c.expect_connection_close(501, "FRAME_ERROR - Malformed UTF-8 in shortstr", 0, 0)


# ------------------------------------------------------------ method field tables

MALFORMED_TABLES = {
    "unknown field type": (b"\x01aZ\x00\x00", "unknown field type 'Z'"),
    "value cut inside the table": (b"\x01aI\x00\x00", "truncated field value"),
    "key cut": (b"\x05ab", "truncated shortstr"),
    "nested table longer than its parent": (b"\x01aF" + table(b"\x01bV")[:-1], "truncated field value"),
    "unknown type inside an array": (b"\x01aA" + table(b"Z"), "unknown field type 'Z'"),
    "NaN": (b"\x01ad" + struct.pack(">d", math.nan), "a float that is not a finite number"),
    "nested deeper than MAX_NESTING": (nested(MAX_NESTING + 1), f"field table nested deeper than {MAX_NESTING} levels"),
}


@pytest.mark.parametrize("case", list(MALFORMED_TABLES))
def test_a_method_whose_field_table_does_not_decode(broker, uid, case):
    """RabbitMQ 3.10's reader crashes on these and the socket closes without a word (it takes
    any depth, though); Warren closes the connection with 501 and says what is wrong."""
    content, reason = MALFORMED_TABLES[case]
    name = f"malformed-table-{uid}"
    with connect(broker) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1, queue_declare(name, table(content)))
        if not RABBITMQ:
            c.expect_connection_close(501, f"FRAME_ERROR - cannot decode the field table of queue.declare: {reason}",
                                      50, 10)
        elif case == "nested deeper than MAX_NESTING":
            c.expect(commands.Queue.DeclareOk, 1)
            c.call(1, commands.Queue.Delete(queue=name))
        else:
            assert c.expect_eof(3) == b""


def test_the_layout_of_the_arguments_is_checked_before_the_table(broker):
    """As RabbitMQ: arguments that do not fit their method are 501 "cannot decode", even if
    a table among them is malformed too."""
    with connect(broker) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1, queue_declare("x", table(b"\x01aZ")) + b"zz")
        c.expect_connection_close(501, "FRAME_ERROR - cannot decode <<0,0,1,120,0,0,0,0,3,1,97,90,122,122>>", 50, 10)


@pytest.mark.parametrize("ids", [(99, 10), (50, 99), (10, 99)])
def test_an_unknown_method(broker, ids):
    """RabbitMQ 3.10's reader crashes: the socket closes without a word. Warren: 540."""
    with connect(broker) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1 if ids[0] != 10 else 0, method(*ids))
        if RABBITMQ:
            assert c.expect_eof(3) == b""
        else:
            c.expect_connection_close(540, f"NOT_IMPLEMENTED - unknown method {ids[0]}.{ids[1]}", *ids)


# ---------------------------------------------------------------- protocol header

def test_the_legacy_0_9_protocol_header_speaks_0_9_1(broker):
    """AMQP\\x01\\x01\\x00\\x09 is how some old clients announce 0-9: RabbitMQ answers with
    connection.start for 0-9 and speaks 0-9-1 (Warren used to refuse it)."""
    with dial(broker) as c:
        start = c.start_handshake(b"AMQP\x01\x01\x00\x09")
        assert (start.version_major, start.version_minor) == (0, 9)
        c.login()
        tune = c.expect(commands.Connection.Tune, 0)
        c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max))
        c.send_method(0, commands.Connection.Open(virtual_host="/"))
        c.expect(commands.Connection.OpenOk, 0)
        c.open_channel(1)
        assert c.call(1, commands.Queue.Declare(queue="", exclusive=True)).queue


# ------------------------------------------------------------------- deep nesting

def _deep_client(broker, props: bytes):
    """A raw client whose start-ok carries the client-properties table `props` (content)."""
    c = dial(broker)
    c.start_handshake(PROTOCOL_HEADER)
    caps = shortstr("capabilities") + b"F" + table(shortstr("authentication_failure_close") + b"t\x01")
    payload = method(10, 11, table(caps + props) + shortstr("PLAIN") + longstr(plain("guest", "guest"))
                     + shortstr("en_US"))
    assert len(payload) <= 4096 - 8, "a start-ok must fit in the 4096-octet frames of the handshake"
    c.send(frame(FRAME_METHOD, 0, payload))
    tune = c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max))
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    c.expect(commands.Connection.OpenOk, 0)
    return c


# 400 levels (2.9 KB, the fuzzer's case: Warren raised RecursionError before authentication),
# and about the deepest that fits in the 4096-octet frames of the handshake (arrays).
@pytest.mark.parametrize("props", [b"\x04deep" + b"F" + table(nested(399)), b"\x04deep" + deep_array(789)],
                         ids=["400 levels", "790 levels"])
def test_deeply_nested_client_properties(broker, props):
    """RabbitMQ takes any depth; the handshake's frames (4096 octets) stop a start-ok at about
    800 levels, below Warren's MAX_NESTING. The connection shows over HTTP and in warrenctl."""
    with _deep_client(broker, props) as c:
        c.open_channel(1)
        assert c.call(1, commands.Queue.Declare(queue="", exclusive=True)).queue
        if broker.mgmt_port is not None:
            r = requests.get(f"{broker.api}/connections", auth=GUEST)
            assert r.status_code == 200, r.text
            assert any("deep" in (conn.get("client_properties") or {}) for conn in r.json())
            warrenctl = WARRENCTL
            if warrenctl:
                out = subprocess.run([warrenctl, "--port", str(broker.mgmt_port), "list_connections",
                                      "client_properties"], capture_output=True, text=True, timeout=60)
                assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_message_headers_nested_to_the_cap(broker, queue):
    """Headers MAX_NESTING deep are stored and delivered byte for byte (RabbitMQ takes any
    depth; Warren refuses one level more, below)."""
    sent = header(0x2000, table(b"\x04deep" + b"F" + table(nested(MAX_NESTING - 1))))
    with publisher(broker) as c:
        publish(c, queue, sent)
        c.expect(commands.Basic.Ack, 1)
        publish(c, queue, sent)
        c.expect(commands.Basic.Ack, 1)
        assert get_raw(c, queue)[1] == sent
    if broker.mgmt_port is not None:
        r = requests.post(f"{broker.api}/queues/%2F/{queue}/get", auth=GUEST,
                          json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert r.status_code == 200, r.text[:500]
        depth, value = 1, r.json()[0]["properties"]["headers"]["deep"]
        while isinstance(value, dict):
            depth, value = depth + 1, value["a"]
        assert depth == MAX_NESTING


@warren_only
def test_message_headers_nested_past_the_cap_are_refused(broker, queue):
    with publisher(broker) as c:
        publish(c, queue, header(0x2000, table(b"\x04deep" + b"F" + table(nested(MAX_NESTING)))))
        c.expect_connection_close(541, "INTERNAL_ERROR", 0, 0)
    assert message_count(broker, queue) == 0


@warren_only
def test_queue_arguments_nested_to_the_cap_survive_every_walk(make_broker, restart_broker, uid):
    """A durable queue with an argument Warren keeps (an unknown x- argument), nested
    MAX_NESTING deep: declared, listed over HTTP and by warrenctl, exported, written to the
    definitions file and recovered from it."""
    b = make_broker()
    name = f"deep-args-{uid}"
    args = table(b"\x06x-deep" + b"F" + table(nested(MAX_NESTING - 1)))
    with connect(b) as c:
        c.open_channel(1)
        c.send_frame(FRAME_METHOD, 1, queue_declare(name, args, durable=True))
        c.expect(commands.Queue.DeclareOk, 1)

    def check(broker):
        r = requests.get(f"{broker.api}/queues/%2F/{urllib.parse.quote(name)}", auth=GUEST)
        assert r.status_code == 200, r.text[:500]
        depth, value = 1, r.json()["arguments"]["x-deep"]
        while isinstance(value, dict):
            depth, value = depth + 1, value["a"]
        assert depth == MAX_NESTING
        r = requests.get(f"{broker.api}/definitions", auth=GUEST)
        assert r.status_code == 200 and name in json.dumps(r.json())
        warrenctl = WARRENCTL
        if warrenctl:
            out = subprocess.run([warrenctl, "--port", str(broker.mgmt_port), "list_queues", "name", "arguments"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0 and name in out.stdout, out.stderr[-2000:]
        with connect(broker) as c:
            c.open_channel(1)
            # Redeclaring with the same arguments is equivalent (the deep values compare).
            c.send_frame(FRAME_METHOD, 1, queue_declare(name, args, durable=True))
            c.expect(commands.Queue.DeclareOk, 1)

    check(b)
    b2 = restart_broker(b)
    check(b2)
    assert "Traceback" not in b2.log()


@warren_only
def test_a_body_size_over_the_maximum_is_refused_at_the_content_header(broker):
    """RabbitMQ 3.10 reads the whole body first and then closes the channel with this 406
    (with no body coming, it waits; the next method frame gets a connection-level 505).
    Warren answers the content header at once: it never takes in a message it will refuse."""
    with publisher(broker) as c:
        publish(c, "x", header(0, size=1 << 40), body=b"")
        c.expect_channel_close(1, 406, "PRECONDITION_FAILED - message size 1099511627776 is larger than configured "
                                       "max size 134217728", 60, 40)


@warren_only
def test_bytes_that_are_not_utf8_survive_the_disk_store_and_the_management_api(make_broker, restart_broker, uid):
    """A persistent message with a routing key, a property and a header key that are not
    UTF-8, in a durable queue: after a restart it is delivered byte for byte, and the
    management API still shows it (lone surrogates in its JSON strings)."""
    b = make_broker()
    exchange, name = f"fan-{uid}", f"raw-bytes-{uid}"
    sent = header(0xB000, shortstr(b"text/\xff") + table(b"\x02k\xffS" + longstr(b"v\xfe")) + b"\x02")
    with publisher(b) as c:
        c.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="fanout", durable=True))
        c.call(1, commands.Queue.Declare(queue=name, durable=True))
        c.call(1, commands.Queue.Bind(queue=name, exchange=exchange))
        for _ in range(2):
            publish(c, b"key-\xff", sent, exchange=exchange.encode())
            c.expect(commands.Basic.Ack, 1)
    b2 = restart_broker(b)
    r = requests.post(f"{b2.api}/queues/%2F/{name}/get", auth=GUEST,
                      json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert r.status_code == 200, r.text
    [msg] = r.json()
    assert (msg["routing_key"], msg["payload"]) == ("key-\udcff", "abc")
    assert msg["properties"]["content_type"] == "text/\udcff"
    with publisher(b2) as c:
        get_ok, hdr, body = get_raw(c, name)
    assert get_ok.endswith(shortstr(exchange) + shortstr(b"key-\xff") + b"\x00\x00\x00\x00")
    assert (hdr, body) == (sent, b"abc")
