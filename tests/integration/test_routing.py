"""How each exchange type routes (direct, fanout, topic, headers) and mandatory returns,
exactly as RabbitMQ 3.10 does it."""

import asyncio
import datetime
import decimal
import functools

import amqp
import pika
import pytest

from conftest import Returns, channel_error, drain, queue


# --------------------------------------------------------------------- direct


def test_direct_exchange(channel, names):
    x = names("direct")
    channel.exchange_declare(x, "direct")
    qa, qb, qab = queue(channel), queue(channel), queue(channel)
    channel.queue_bind(qa, x, "a")
    channel.queue_bind(qb, x, "b")
    channel.queue_bind(qab, x, "a")
    channel.queue_bind(qab, x, "b")
    channel.queue_bind(qab, x, "a")  # binding twice is one binding
    for key in ("a", "b", "c", "A", ""):
        channel.basic_publish(x, key, key.encode() or b"-")
    assert drain(channel, qa) == [b"a"]
    assert drain(channel, qb) == [b"b"]
    assert drain(channel, qab) == [b"a", b"b"]
    q_empty = queue(channel)
    channel.queue_bind(q_empty, x, "")
    channel.basic_publish(x, "", b"empty-key")
    assert drain(channel, q_empty) == [b"empty-key"]


def test_fanout_exchange_ignores_routing_key(channel, names):
    x = names("fanout")
    channel.exchange_declare(x, "fanout")
    q1, q2 = queue(channel), queue(channel)
    channel.queue_bind(q1, x, "ignored")
    channel.queue_bind(q1, x, "also-ignored")  # two bindings, one delivery
    channel.queue_bind(q2, x)
    channel.basic_publish(x, "anything", b"1")
    channel.basic_publish(x, "", b"2")
    assert drain(channel, q1) == [b"1", b"2"]
    assert drain(channel, q2) == [b"1", b"2"]


# ---------------------------------------------------------------------- topic


@functools.lru_cache(maxsize=None)
def topic_reference(pattern: str, key: str) -> bool:
    """RabbitMQ's topic matching: words split on "."; "" has no words, "a." is ["a", ""];
    "*" is exactly one word, "#" zero or more."""
    p = pattern.split(".") if pattern else []
    w = key.split(".") if key else []

    @functools.lru_cache(maxsize=None)
    def m(i, j):
        if i == len(p):
            return j == len(w)
        if p[i] == "#":
            return m(i + 1, j) or (j < len(w) and m(i, j + 1))
        return j < len(w) and p[i] in ("*", w[j]) and m(i + 1, j + 1)

    return m(0, 0)


TOPIC_CASES = [
    ("#", "", True), ("#", "a", True), ("#", "a.b.c", True), ("#", ".", True),
    ("*", "", False), ("*", "a", True), ("*", "a.b", False), ("*", ".", False),
    ("a.#", "a", True), ("a.#", "a.b", True), ("a.#", "a.b.c", True), ("a.#", "b", False), ("a.#", "ab", False),
    ("#.a", "a", True), ("#.a", "x.y.a", True), ("#.a", "a.x", False),
    ("a.#.b", "a.b", True), ("a.#.b", "a.x.y.b", True), ("a.#.b", "a.x.c", False), ("a.#.b", "a", False),
    ("*.*", "a.b", True), ("*.*", "a", False), ("*.*", "a.b.c", False), ("*.*", ".", True), ("*.*", "a.", True),
    ("a..b", "a..b", True), ("a..b", "a.b", False), ("a.*.b", "a..b", True),
    ("a.", "a.", True), ("a.", "a", False), ("a.*", "a.", True), ("a.*", "a", False),
    ("", "", True), ("", "a", False), ("#.#", "", True), ("a.#.#", "a", True),
    ("*.#", "", False), ("*.#", "a", True), ("#.*", "a.b", True), ("#.*", "", False),
    ("a.*.#", "a", False), ("a.*.#", "a.b", True), ("#.b.#", "b", True), ("#.b.#", "a.b.c", True),
    ("a.b", "a.b", True), ("A.b", "a.b", False), ("a#", "ab", False), ("a#", "a#", True),
    ("a", "*", False), ("*", "*", True), ("é.*", "é.x", True),
]


def test_topic_reference_agrees_with_listed_cases():
    for pattern, key, expected in TOPIC_CASES:
        assert topic_reference(pattern, key) is expected, (pattern, key)


def test_topic_exchange_matrix(channel, names):
    """Every listed binding pattern against every listed routing key, on the broker."""
    x = names("topic")
    channel.exchange_declare(x, "topic")
    patterns = sorted({p for p, _, _ in TOPIC_CASES})
    keys = sorted({k for _, k, _ in TOPIC_CASES})
    queues = {}
    for p in patterns:
        queues[p] = queue(channel)
        channel.queue_bind(queues[p], x, p)
    for i, key in enumerate(keys):
        channel.basic_publish(x, key, str(i).encode())
    for p in patterns:
        got = [keys[int(b)] for b in drain(channel, queues[p])]
        assert got == [k for k in keys if topic_reference(p, k)], p


def test_topic_multiple_matching_bindings_deliver_once(channel, names):
    x = names("topic-once")
    channel.exchange_declare(x, "topic")
    q = queue(channel)
    for pattern in ("a.*", "#", "a.b", "*.b", "a.#.b"):
        channel.queue_bind(q, x, pattern)
    channel.basic_publish(x, "a.b", b"once")
    channel.basic_publish(x, "z", b"hash-only")
    assert drain(channel, q) == [b"once", b"hash-only"]
    channel.queue_unbind(q, x, "#")
    channel.basic_publish(x, "z", b"gone")
    channel.basic_publish(x, "a.b", b"still")
    assert drain(channel, q) == [b"still"]


# -------------------------------------------------------------------- headers


def amqp_connection(broker):
    conn = amqp.Connection(host=f"{broker.host}:{broker.port}", userid="guest", password="guest")
    conn.connect()
    return conn


def aiopika_bind(broker, exchange, queue_name, arguments):
    """Bind with aio-pika, whose codec (pamqp) sends integers in the smallest type that fits
    (byte, short, ...), where pika and py-amqp send signedint."""
    import aio_pika

    async def run():
        conn = await aio_pika.connect(broker.url.replace("/%2F", "/"))
        ch = await conn.channel()
        await ch.declare_queue(queue_name, auto_delete=False)
        q = await ch.get_queue(queue_name)
        await q.bind(exchange, "", arguments=arguments)
        await conn.close()

    asyncio.run(run())


TS1 = datetime.datetime.fromtimestamp(1, datetime.timezone.utc)

# (binding arguments, message headers, routed?) -- bindings sent by pika, headers by py-amqp.
HEADERS_CASES = [
    ({"x-match": "all", "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "a": 1}, {"a": 1.0}, True),          # Erlang ==: an integer equals the float
    ({"x-match": "all", "a": 1}, {"a": TS1}, True),          # ... and a timestamp (an integer too)
    ({"x-match": "all", "a": 1}, {"a": True}, False),         # but not a bool
    ({"x-match": "all", "a": 0}, {"a": False}, False),
    ({"x-match": "all", "a": 1}, {"a": "1"}, False),
    ({"x-match": "all", "a": True}, {"a": True}, True),
    ({"x-match": "all", "a": b"s"}, {"a": "s"}, True),       # a byte array equals the same longstr
    ({"x-match": "all", "a": "s"}, {"a": "S"}, False),
    ({"x-match": "all", "a": 2**40}, {"a": 2**40}, True),
    ({"a": "1"}, {"a": "1", "b": 2}, True),                   # x-match defaults to all
    ({"a": "1", "b": 2}, {"a": "1"}, False),
    ({"x-match": "any", "a": "1", "b": 2}, {"a": "1"}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 3}, False),
    ({"x-match": "all"}, {}, True),                           # nothing to check: all matches
    ({"x-match": "all"}, None, True),
    ({"x-match": "any"}, {"a": 1}, False),                    # ... any does not
    ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # a void value: presence only
    ({"x-match": "all", "a": None}, {"a": None}, True),
    ({"x-match": "all", "a": None}, {}, False),
    ({"x-match": "any", "a": None}, {"b": 1}, False),
    ({"x-match": "all", "a": "x"}, {"a": None}, False),
    ({"x-match": "all", "x-foo": "bar"}, {}, True),            # x- keys are ignored by all/any
    ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
    ({"x-match": "any", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
    ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
    ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),  # x-match itself never counts
    ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
    ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
    ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
    ({"x-match": "all-with-x"}, {}, True),
    ({"x-match": "all", "a": {"b": 1}}, {"a": {"b": 1}}, True),
    ({"x-match": "all", "a": {"b": 1}}, {"a": {"b": 1.0}}, False),  # nested values keep their types
    ({"x-match": "all", "a": [1, "x"]}, {"a": [1, "x"]}, True),
    ({"x-match": "all", "a": [1, 2]}, {"a": [1.0, 2]}, False),
    ({"x-match": "all", "a": {"b": "x", "c": "y"}}, {"a": {"c": "y", "b": "x"}}, False),  # order matters
]


@pytest.fixture
def pyamqp(broker):
    conn = amqp_connection(broker)
    ch = conn.channel()
    ch.confirm_select()
    yield ch
    conn.close()


def test_headers_exchange_cases(channel, names, pyamqp):
    xs = []
    for i, (binding, _, _) in enumerate(HEADERS_CASES):
        x = names(f"headers-{i}")
        channel.exchange_declare(x, "headers")
        q = queue(channel)
        channel.queue_bind(q, x, arguments=binding)
        xs.append((x, q))
    for i, (_, headers, _) in enumerate(HEADERS_CASES):
        pyamqp.basic_publish_confirm(amqp.Message(str(i), application_headers=headers), exchange=xs[i][0])
    results = [bool(drain(channel, q)) for _, q in xs]
    assert [(b, h, r) for (b, h, _), r in zip(HEADERS_CASES, results)] == HEADERS_CASES


def test_headers_decimal_compares_scale_and_digits(channel, names, pyamqp):
    x = names("headers-dec")
    channel.exchange_declare(x, "headers")
    q = queue(channel)
    channel.queue_bind(q, x, arguments={"d": decimal.Decimal("1.5")})
    for i, value in enumerate([decimal.Decimal("1.5"), decimal.Decimal("1.50"), 1.5]):
        pyamqp.basic_publish_confirm(amqp.Message(str(i), application_headers={"d": value}), exchange=x)
    assert drain(channel, q) == [b"0"]


def test_headers_integer_types_match_across_clients(channel, broker, names, pyamqp):
    """aio-pika binds with byte/short/unsignedshort/unsignedint values; pika and py-amqp
    publish signedint/long. Top-level integers match by value, whatever their width."""
    x = names("headers-int")
    channel.exchange_declare(x, "headers")
    q = names("headers-int-q")
    aiopika_bind(broker, x, q, {"x-match": "all", "b": 5, "s": 1000, "u": 40000, "i": 3000000000})
    aiopika_bind(broker, x, q, {"x-match": "all", "nested": [5]})
    headers = {"b": 5, "s": 1000, "u": 40000, "i": 3000000000}
    channel.basic_publish(x, "", b"pika", pika.BasicProperties(headers=headers))
    pyamqp.basic_publish_confirm(amqp.Message("py-amqp", application_headers=headers), exchange=x)
    channel.basic_publish(x, "", b"wrong", pika.BasicProperties(headers={**headers, "u": 40001}))
    # Inside an array the width is part of the value: byte 5 is not signedint 5.
    channel.basic_publish(x, "", b"nested", pika.BasicProperties(headers={"nested": [5]}))
    assert sorted(drain(channel, q)) == [b"pika", b"py-amqp"]  # (two connections: no order between them)


def test_headers_multiple_matching_bindings_deliver_once(channel, names):
    x = names("headers-once")
    channel.exchange_declare(x, "headers")
    q = queue(channel)
    channel.queue_bind(q, x, arguments={"a": 1})
    channel.queue_bind(q, x, arguments={"x-match": "any", "a": 1, "b": 2})
    channel.queue_bind(q, x, arguments={"x-match": "all"})
    channel.basic_publish(x, "", b"m", pika.BasicProperties(headers={"a": 1, "b": 2}))
    assert drain(channel, q) == [b"m"]


@pytest.mark.parametrize("value,text", [
    ("foo", 'Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x'),
    ("ALL", 'Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x'),
    ("", "Invalid x-match field value <<>>; expected all, any, all-with-x, or any-with-x"),
    ('a"b', 'Invalid x-match field value <<"a\\"b">>; expected all, any, all-with-x, or any-with-x'),
    (True, "Invalid x-match field type bool (value true); expected longstr"),
    (5, "Invalid x-match field type signedint (value 5); expected longstr"),
    (b"all", 'Invalid x-match field type binary (value <<"all">>); expected longstr'),
    (b"\x01\x02", "Invalid x-match field type binary (value <<1,2>>); expected longstr"),
    (None, "Invalid x-match field type void (value undefined); expected longstr"),
])
def test_invalid_x_match_is_406(connection, names, value, text):
    x = names("headers-bad")
    ch = connection.channel()
    ch.exchange_declare(x, "headers")
    q = queue(ch)
    channel_error(lambda: ch.queue_bind(q, x, arguments={"x-match": value}), 406, f"PRECONDITION_FAILED - {text}")
    # The same check applies to exchange-to-exchange bindings from a headers exchange.
    ch = connection.channel()
    channel_error(lambda: ch.exchange_bind("amq.direct", x, arguments={"x-match": value}), 406,
                  f"PRECONDITION_FAILED - {text}")


# ------------------------------------------------------------------ mandatory


FULL_PROPS = dict(
    content_type="application/json", content_encoding="utf-8",
    headers={"s": "v", "i": 7, "big": 2**40, "t": True, "n": None, "l": [1, "x"], "tbl": {"k": "v"}},
    delivery_mode=2, priority=5, correlation_id="corr", reply_to="reply", expiration="60000",
    message_id="mid", timestamp=1700000000, type="kind", user_id="guest", app_id="app",
)


def test_mandatory_unroutable_is_returned(connection, channel, names):
    returns = Returns(connection, channel)
    x = names("mand")
    channel.exchange_declare(x, "direct")
    body = bytes(range(256)) * 1200  # several body frames
    channel.basic_publish(x, "nowhere", body, pika.BasicProperties(**FULL_PROPS), mandatory=True)
    [(method, props, got_body)] = returns.collect(channel)
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
        312, "NO_ROUTE", x, "nowhere")
    assert got_body == body
    for field, value in FULL_PROPS.items():
        assert getattr(props, field) == value, field
    # Not mandatory: dropped silently.
    channel.basic_publish(x, "nowhere", b"drop")
    assert returns.collect(channel) == []


def test_mandatory_routable_is_not_returned(connection, channel, names):
    returns = Returns(connection, channel)
    x = names("mand-ok")
    channel.exchange_declare(x, "fanout")
    q = queue(channel)
    channel.queue_bind(q, x)
    channel.basic_publish(x, "k", b"routed", mandatory=True)
    channel.basic_publish("", q, b"default", mandatory=True)
    assert returns.collect(channel) == []
    assert drain(channel, q) == [b"routed", b"default"]


def test_mandatory_default_exchange_and_empty_fanout(connection, channel, uid, names):
    returns = Returns(connection, channel)
    x = names("mand-fan")
    channel.exchange_declare(x, "fanout")
    channel.basic_publish("", f"no-queue-{uid}", b"1", mandatory=True)
    channel.basic_publish(x, "k", b"2", mandatory=True)
    assert returns.brief(channel) == [(312, "", f"no-queue-{uid}", b"1"), (312, x, "k", b"2")]


def test_mandatory_return_in_transaction_comes_at_commit(connection, channel, uid):
    returns = Returns(connection, channel)
    channel.tx_select()
    channel.basic_publish("amq.direct", f"nowhere-{uid}", b"tx", mandatory=True)
    assert returns.collect(channel) == []
    channel.tx_commit()
    [(method, _, body)] = returns.collect(channel)
    assert (method.reply_code, method.routing_key, body) == (312, f"nowhere-{uid}", b"tx")
    channel.basic_publish("amq.direct", f"nowhere-{uid}", b"rolled-back", mandatory=True)
    channel.tx_rollback()
    assert returns.collect(channel) == []
