"""Dead-lettered messages and CC/BCC byte for byte as RabbitMQ 3.10.8 makes them.

Every expected header below was captured from a RabbitMQ 3.10.8 node (tools/rabbitmq_node.py)
with a raw client: the content header payload published, the one basic.get returned from the
queue, and the one returned from the dead-letter queue after a reject or an expiry. The
x-death "time" of those runs is passed as `now`.
"""

import pytest

from warren.amqp import reencode as rt
from warren.amqp.codec import shortstr
from warren.amqp.message import Message
from warren.broker.dead_letter_message import dead_letter_message, detect_cycles
from warren.broker.errors import AMQPError
from warren.broker.sender_selected import take_routing_headers

T1, T2 = 0x6B050611, 0x6B050620  # the x-death times of the two capture runs

CAPTURED = {
    "A_published": (
        "003c00000000000000000003b9c80a746578742f706c61696e00000043027a7a53000000046c61737402434341000000"
        "0c5300000002633149000000050261614c00000000000000070342434341000000075300000002623104666c61677402"
        "0203053630303030026d3100000000000004d203617070"
    ),
    "A_stored": (
        "003c00000000000000000003b9c80a746578742f706c61696e00000033027a7a53000000046c61737402434341000000"
        "0c5300000002633149000000050261616c000000000000000704666c616774010203053630303030026d310000000000"
        "0004d203617070"
    ),
    "A_dead": (
        "003c00000000000000000003b8c80a746578742f706c61696e0000012e024343410000000c5300000002633149000000"
        "050261616c000000000000000704666c6167740107782d64656174684100000092460000008d05636f756e746c000000"
        "000000000106726561736f6e530000000872656a656374656405717565756553000000037372630474696d6554000000"
        "006b0506110865786368616e67655300000002696e0c726f7574696e672d6b657973410000000e5300000002726b5300"
        "0000026331136f726967696e616c2d65787069726174696f6e5300000005363030303016782d66697273742d64656174"
        "682d65786368616e67655300000002696e13782d66697273742d64656174682d7175657565530000000373726314782d"
        "66697273742d64656174682d726561736f6e530000000872656a6563746564027a7a53000000046c6173740203026d31"
        "00000000000004d203617070"
    ),
    "B_dead": (
        "003c00000000000000000003b8c80a746578742f706c61696e0000018d0261616c000000000000000704666c61677401"
        "07782d64656174684100000105460000006e05636f756e746c00000000000000010865786368616e6765530000000364"
        "6c780571756575655300000002713206726561736f6e5300000007657870697265640c726f7574696e672d6b65797341"
        "0000000e5300000002726b530000000263310474696d6554000000006b050611460000008d05636f756e746c00000000"
        "0000000106726561736f6e530000000872656a656374656405717565756553000000037372630474696d655400000000"
        "6b0506110865786368616e67655300000002696e0c726f7574696e672d6b657973410000000e5300000002726b530000"
        "00026331136f726967696e616c2d65787069726174696f6e5300000005363030303016782d66697273742d6465617468"
        "2d65786368616e67655300000002696e13782d66697273742d64656174682d7175657565530000000373726314782d66"
        "697273742d64656174682d726561736f6e530000000872656a6563746564027a7a53000000046c6173740203026d3100"
        "000000000004d203617070"
    ),
    "C_published": (
        "003c00000000000000000001210000000008016b530000000176053530303030"
    ),
    "C_dead_1": (
        "003c000000000000000000012000000000fc016b53000000017607782d6465617468410000008c460000008705636f75"
        "6e746c000000000000000106726561736f6e530000000872656a656374656405717565756553000000046c6f6f700474"
        "696d6554000000006b0506110865786368616e676553000000000c726f7574696e672d6b657973410000000953000000"
        "046c6f6f70136f726967696e616c2d65787069726174696f6e5300000005353030303016782d66697273742d64656174"
        "682d65786368616e6765530000000013782d66697273742d64656174682d717565756553000000046c6f6f7014782d66"
        "697273742d64656174682d726561736f6e530000000872656a6563746564"
    ),
    "C_dead_2": (
        "003c000000000000000000012000000000fc016b53000000017607782d6465617468410000008c460000008705636f75"
        "6e746c00000000000000020865786368616e67655300000000136f726967696e616c2d65787069726174696f6e530000"
        "0005353030303005717565756553000000046c6f6f7006726561736f6e530000000872656a65637465640c726f757469"
        "6e672d6b657973410000000953000000046c6f6f700474696d6554000000006b05061116782d66697273742d64656174"
        "682d65786368616e6765530000000013782d66697273742d64656174682d717565756553000000046c6f6f7014782d66"
        "697273742d64656174682d726561736f6e530000000872656a6563746564"
    ),
    "C_dead_3": (
        "003c000000000000000000012000000000fc016b53000000017607782d6465617468410000008c460000008705636f75"
        "6e746c00000000000000030865786368616e67655300000000136f726967696e616c2d65787069726174696f6e530000"
        "0005353030303005717565756553000000046c6f6f7006726561736f6e530000000872656a65637465640c726f757469"
        "6e672d6b657973410000000953000000046c6f6f700474696d6554000000006b05061116782d66697273742d64656174"
        "682d65786368616e6765530000000013782d66697273742d64656174682d717565756553000000046c6f6f7014782d66"
        "697273742d64656174682d726561736f6e530000000872656a6563746564"
    ),
    "D_published": (
        "003c000000000000000000010000"
    ),
    "D_dead_3": (
        "003c000000000000000000012000000001a007782d6465617468410000013b460000006405636f756e746c0000000000"
        "0000010865786368616e676553000000000571756575655300000002683306726561736f6e5300000007657870697265"
        "640c726f7574696e672d6b6579734100000007530000000268330474696d6554000000006b050611460000006405636f"
        "756e746c000000000000000106726561736f6e530000000765787069726564057175657565530000000268310474696d"
        "6554000000006b0506110865786368616e676553000000000c726f7574696e672d6b6579734100000007530000000268"
        "31460000006405636f756e746c00000000000000010865786368616e6765530000000005717565756553000000026832"
        "06726561736f6e5300000007657870697265640c726f7574696e672d6b6579734100000007530000000268320474696d"
        "6554000000006b05061116782d66697273742d64656174682d65786368616e6765530000000013782d66697273742d64"
        "656174682d71756575655300000002683114782d66697273742d64656174682d726561736f6e53000000076578706972"
        "6564"
    ),
    "leg_published": (
        "003c000000000000000000012000000000f007782d646561746841000000e3460000005906726561736f6e5300000008"
        "72656a656374656405717565756553000000036c65670474696d655400000000000000640865786368616e6765530000"
        "000265310c726f7574696e672d6b657973410000000753000000027231460000004005636f756e746c00000000000000"
        "0406726561736f6e53000000076578706972656405717565756553000000056f746865720474696d6554000000000000"
        "00c8460000003b05717565756553000000036c656705636f756e74490000000706726561736f6e530000000872656a65"
        "637465640474696d6554000000000000012c"
    ),
    "leg_dead": (
        "003c000000000000000000012000000000bf07782d646561746841000000b2460000006805636f756e746c0000000000"
        "0000030865786368616e67655300000002653105717565756553000000036c656706726561736f6e530000000872656a"
        "65637465640c726f7574696e672d6b6579734100000007530000000272310474696d6554000000000000006446000000"
        "4005636f756e746c000000000000000406726561736f6e53000000076578706972656405717565756553000000056f74"
        "6865720474696d655400000000000000c8"
    ),
    "leg2_published": (
        "003c0000000000000000000120000000003507782d64656174684100000028460000002305717565756553000000046c"
        "65673206726561736f6e530000000872656a6563746564"
    ),
    "leg2_dead": (
        "003c0000000000000000000120000000004407782d64656174684100000037460000003205636f756e746c0000000000"
        "00000105717565756553000000046c65673206726561736f6e530000000872656a6563746564"
    ),
    "leg3_published": (
        "003c000000000000000000012000000000bc07782d646561746841000000af460000004005636f756e746c0000000000"
        "00000406726561736f6e53000000076578706972656405717565756553000000056f746865720474696d655400000000"
        "000000c8460000002005717565756553000000026f3206726561736f6e53000000076578706972656446000000400563"
        "6f756e746c000000000000000406726561736f6e53000000076578706972656405717565756553000000056f74686572"
        "0474696d655400000000000000c8"
    ),
    "leg3_dead": (
        "003c000000000000000000012000000000f307782d646561746841000000e6460000006805636f756e746c0000000000"
        "0000010865786368616e6765530000000005717565756553000000046c65673306726561736f6e530000000765787069"
        "7265640c726f7574696e672d6b657973410000000953000000046c6567330474696d6554000000006b05062046000000"
        "2f05636f756e746c000000000000000105717565756553000000026f3206726561736f6e530000000765787069726564"
        "460000004005636f756e746c000000000000000406726561736f6e530000000765787069726564057175657565530000"
        "00056f746865720474696d655400000000000000c8"
    ),
    "inv_published": (
        "003c0000000000000000000120000000001c07782d64656174685300000007676172626167650162530000000131"
    ),
    "inv_dead": (
        "003c00000000000000000001200000000081016253000000013107782d6465617468410000006c460000006705636f75"
        "6e746c000000000000000106726561736f6e530000000872656a65637465640571756575655300000003696e76047469"
        "6d6554000000006b0506200865786368616e676553000000000c726f7574696e672d6b65797341000000085300000003"
        "696e76"
    ),
    "fd_published": (
        "003c0000000000000000000120000000003914782d66697273742d64656174682d726561736f6e53000000036f6c6403"
        "647570530000000131016153000000017803647570530000000132"
    ),
    "fd_dead": (
        "003c000000000000000000012000000000ec016153000000017803647570530000000131036475705300000001320778"
        "2d6465617468410000006a460000006505636f756e746c000000000000000106726561736f6e530000000872656a6563"
        "746564057175657565530000000266640474696d6554000000006b0506200865786368616e676553000000000c726f75"
        "74696e672d6b65797341000000075300000002666416782d66697273742d64656174682d65786368616e676553000000"
        "0013782d66697273742d64656174682d71756575655300000002666414782d66697273742d64656174682d726561736f"
        "6e530000000872656a6563746564"
    ),
    "bare_published": (
        "003c000000000000000000010000"
    ),
    "bare_dead": (
        "003c000000000000000000012000000000d607782d6465617468410000006e460000006905636f756e746c0000000000"
        "00000106726561736f6e530000000872656a65637465640571756575655300000004626172650474696d655400000000"
        "6b0506200865786368616e676553000000000c726f7574696e672d6b657973410000000953000000046261726516782d"
        "66697273742d64656174682d65786368616e6765530000000013782d66697273742d64656174682d7175657565530000"
        "00046261726514782d66697273742d64656174682d726561736f6e530000000872656a6563746564"
    ),
    "emptyh_published": (
        "003c00000000000000000001200000000000"
    ),
    "emptyh_dead": (
        "003c000000000000000000012000000000dc07782d64656174684100000072460000006d05636f756e746c0000000000"
        "00000106726561736f6e530000000872656a65637465640571756575655300000006656d707479680474696d65540000"
        "00006b0506200865786368616e676553000000000c726f7574696e672d6b657973410000000b5300000006656d707479"
        "6816782d66697273742d64656174682d65786368616e6765530000000013782d66697273742d64656174682d71756575"
        "655300000006656d7074796814782d66697273742d64656174682d726561736f6e530000000872656a6563746564"
    ),
    "G1_published": (
        "003c0000000000000000000120000000001003424343410000000753000000026731"
    ),
    "G1_stored": (
        "003c00000000000000000001200000000000"
    ),
    "G2_published": (
        "003c0000000000000000000120000000001b024343410000001349000000017800000002673353000000026732"
    ),
    "G2_stored": (
        "003c0000000000000000000120000000001b024343410000001349000000017800000002673353000000026732"
    ),
    "G3_published": (
        "003c0000000000000000000120000000001e024343410000000753000000026734024343410000000753000000026735"
    ),
    "G3_stored": (
        "003c0000000000000000000120000000001e024343410000000753000000026734024343410000000753000000026735"
    ),
}


def h(name: str) -> bytes:
    return bytes.fromhex(CAPTURED[name])


def message(exchange: str, routing_key: str, header: bytes, body: bytes = b"x") -> Message:
    return Message(exchange, routing_key, shortstr(exchange) + shortstr(routing_key), header, body)


def published(exchange: str, routing_key: str, header: bytes, body: bytes = b"x") -> Message:
    """A message as the publish path stores it (BCC taken out of the header)."""
    m = message(exchange, routing_key, header, body)
    take_routing_headers(m)
    return m


# ------------------------------------------------------------------ publish: CC and BCC
def test_bcc_is_stripped_and_the_properties_encoded_again():
    # headers zz, CC [c1, I 5], aa (L 7), BCC [b1], flag (t 2): RabbitMQ drops BCC, keeps
    # the order, re-encodes 'L' as 'l' and the boolean as 1; the other properties stay.
    m = message("in", "rk", h("A_published"), b"abc")
    assert take_routing_headers(m) == ("c1", "b1")
    assert m.cc_keys == ("c1", "b1")
    assert m.header == h("A_stored")
    assert m.headers == {"zz": "last", "CC": ["c1", 5], "aa": 7, "flag": True}


def test_bcc_alone_leaves_an_empty_headers_table():
    m = message("", "nowhere", h("G1_published"))
    assert take_routing_headers(m) == ("g1",)
    assert m.header == h("G1_stored")


def test_only_longstr_elements_route_and_a_header_without_bcc_is_kept_as_sent():
    m = message("", "nowhere", h("G2_published"))  # CC [I 1, x "g3", S "g2"]
    assert take_routing_headers(m) == ("g2",)
    assert m.header == h("G2_stored") == h("G2_published")


def test_the_first_cc_header_counts():
    m = message("", "nowhere", h("G3_published"))  # CC [g4], CC [g5]
    assert take_routing_headers(m) == ("g4",)
    assert m.header == h("G3_stored")


def test_no_routing_headers():
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields([(b"xCC", rt.longstr_value(b"CC"))])})
    m = message("", "q", header)
    assert take_routing_headers(m) is None
    assert m.header == header and m.cc_keys is None
    assert take_routing_headers(message("", "q", h("D_published"))) is None


@pytest.mark.parametrize("name, value, text", [
    (b"CC", rt.longstr_value(b"q"), '{unacceptable_type_in_header,"CC",longstr}'),
    (b"BCC", rt.table_value([]), '{unacceptable_type_in_header,"BCC",table}'),
    (b"CC", b"I\x00\x00\x00\x03", '{unacceptable_type_in_header,"CC",signedint}'),
    (b"CC", b"V", '{unacceptable_type_in_header,"CC",void}'),
    (b"CC", b"x\x00\x00\x00\x01q", '{unacceptable_type_in_header,"CC",binary}'),
    (b"CC", b"L" + bytes(8), '{unacceptable_type_in_header,"CC",long}'),
])
def test_a_routing_header_that_is_not_an_array_refuses_the_publish(name, value, text):
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields([(name, value)])})
    with pytest.raises(AMQPError) as info:
        take_routing_headers(message("", "q", header))
    assert (info.value.code, info.value.text) == (406, "invalid message: " + text)


# ------------------------------------------------------------------ x-death
def test_first_death_with_cc_bcc_and_expiration():
    stored = published("in", "rk", h("A_published"), b"abc")
    dead, keys = dead_letter_message(stored, "rejected", "src", "dlx", None, T1)
    assert dead.header == h("A_dead")
    assert keys == ["rk", "c1", "b1"]  # BCC's key still routes the dead-lettered message
    assert (dead.exchange, dead.routing_key, dead.route) == ("dlx", "rk", b"\x03dlx\x02rk")
    assert dead.body is stored.body
    assert dead.cc_keys == ("c1", "b1")
    x_death = dead.headers["x-death"]
    assert [list(e) for e in x_death] == [["count", "reason", "queue", "time", "exchange", "routing-keys",
                                           "original-expiration"]]
    assert "expiration" not in dead.properties


def test_second_death_in_another_queue_with_a_routing_key_drops_cc():
    first, _ = dead_letter_message(published("in", "rk", h("A_published"), b"abc"), "rejected", "src", "dlx", None, T1)
    dead, keys = dead_letter_message(first, "expired", "q2", "dlx2", "third", T1)
    assert dead.header == h("B_dead")
    assert keys == ["third"] and dead.route == b"\x04dlx2\x05third" and dead.cc_keys is None


def test_repeated_death_in_the_same_queue_counts():
    m = published("", "loop", h("C_published"))
    for n in (1, 2, 3):
        m, keys = dead_letter_message(m, "rejected", "loop", "", "loop", T1)
        assert m.header == h(f"C_dead_{n}")
        assert keys == ["loop"]
    assert m.headers["x-death"][0]["count"] == 3


def test_deaths_in_three_queues():
    # RabbitMQ's regrouping of the older entries reverses them: h3, h1, h2.
    m = published("", "h1", h("D_published"))
    for q, nxt in (("h1", "h2"), ("h2", "h3"), ("h3", "h4")):
        m, _ = dead_letter_message(m, "expired", q, "", nxt, T1)
    assert m.header == h("D_dead_3")
    assert [e["queue"] for e in m.headers["x-death"]] == ["h3", "h1", "h2"]


@pytest.mark.parametrize("queue, reason", [
    ("leg", "rejected"),     # legacy entries of one queue+reason merged and counted
    ("leg2", "rejected"),    # a single legacy entry without a count
    ("leg3", "expired"),     # duplicates of another queue+reason merged, order reversed
    ("inv", "rejected"),     # x-death a longstr: reset, no x-first-death-*
    ("fd", "rejected"),      # a stale x-first-death-reason replaced; duplicate keys kept
    ("bare", "rejected"),    # no properties at all
    ("emptyh", "rejected"),  # an empty headers table
])
def test_captured_cases(queue, reason):
    m = published("", queue, h(f"{queue}_published"))
    dead, keys = dead_letter_message(m, reason, queue, "", "out", T2)
    assert dead.header == h(f"{queue}_dead")
    assert keys == ["out"]


def test_without_known_cc_keys_the_cc_header_gives_them():
    # A message read back from disk has no cc_keys: its CC header still names the keys.
    stored = published("in", "rk", h("A_published"), b"abc")
    restored = message("in", "rk", stored.header, b"abc")
    dead, keys = dead_letter_message(restored, "rejected", "src", "dlx", None, T1)
    assert keys == ["rk", "c1"]
    assert dead.header == h("A_dead")


def test_a_count_of_another_integer_type_is_incremented_as_a_long():
    entry = rt.table_value([(b"queue", rt.longstr_value(b"q")), (b"reason", rt.longstr_value(b"expired")),
                            (b"count", b"I\x00\x00\x00\x07")])
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields([(b"x-death", rt.array_value([entry]))])})
    dead, _ = dead_letter_message(message("", "q", header), "expired", "q", "", "out", 5)
    (fields,) = [rt.table_fields(e[1:]) for e in rt.array_items(rt.lookup(_headers(dead), b"x-death"))]
    assert fields == [(b"count", rt.long_value(8)), (b"queue", rt.longstr_value(b"q")),
                      (b"reason", rt.longstr_value(b"expired"))]


def test_non_table_entries_are_kept():
    # (RabbitMQ's queue process crashes on them and the message is lost.)
    junk = rt.longstr_value(b"junk")
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields([(b"x-death", rt.array_value([junk]))])})
    dead, _ = dead_letter_message(message("", "q", header), "rejected", "q", "", "out", 5)
    items = rt.array_items(rt.lookup(_headers(dead), b"x-death"))
    assert len(items) == 2 and items[1] == junk


def _headers(m: Message) -> list:
    return rt.table_fields(rt.split_header(m.header)[rt.FLAG_HEADERS])


# ------------------------------------------------------------------ cycles
def test_a_cycle_of_expiries_is_detected():
    # RabbitMQ logged [<<"cy1">>,<<"cy2">>,<<"cy1">>] for cy1 -> cy2 -> cy1 (TTL 0 each).
    m = published("", "cy1", h("D_published"))
    m, _ = dead_letter_message(m, "expired", "cy1", "", "cy2", T1)
    assert detect_cycles(m, "expired", ["cy2"]) == {}
    m, _ = dead_letter_message(m, "expired", "cy2", "", "cy1", T1)
    assert detect_cycles(m, "expired", ["cy1", "other"]) == {"cy1": ["cy1", "cy2", "cy1"]}
    assert detect_cycles(m, "rejected", ["cy1"]) == {}


def test_a_queue_dead_lettering_to_itself():
    # RabbitMQ logged [<<"self">>,<<"self">>].
    m, _ = dead_letter_message(published("", "self", h("D_published")), "expired", "self", "", "self", T1)
    assert detect_cycles(m, "expired", ["self"]) == {"self": ["self", "self"]}
    assert detect_cycles(m, "maxlen", ["self"]) == {"self": ["self", "self"]}


def test_a_rejection_in_the_cycle_lets_it_go_on():
    m = published("", "loop", h("C_published"))
    m, _ = dead_letter_message(m, "rejected", "loop", "", "next", T1)
    m, _ = dead_letter_message(m, "expired", "next", "", "loop", T1)
    assert detect_cycles(m, "expired", ["loop"]) == {}
    assert detect_cycles(m, "expired", ["next"]) == {"next": ["next", "next", "loop"]}


def test_something_a_client_put_in_x_death_breaks_the_cycle():
    entry = rt.table_value([(b"queue", rt.longstr_value(b"q")), (b"reason", rt.longstr_value(b"expired"))])
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields(
        [(b"x-death", rt.array_value([rt.longstr_value(b"junk"), entry]))])})
    assert detect_cycles(message("", "q", header), "expired", ["q"]) == {}
    header = rt.join_header(h("D_published"), {rt.FLAG_HEADERS: rt.encode_fields(
        [(b"x-death", rt.array_value([entry, rt.longstr_value(b"junk")]))])})
    assert detect_cycles(message("", "q", header), "expired", ["q"]) == {"q": ["q", "q"]}


def test_cycle_drops():
    m, _ = dead_letter_message(published("", "self", h("D_published")), "expired", "self", "", "self", T1)
    assert detect_cycles(m, "expired", ["self", "other"]) == {"self": ["self", "self"]}
