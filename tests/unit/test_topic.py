"""Topic matching (warren.broker.exchanges.topic's trie, one pattern at a time) against an
independent reference: a regular expression over the routing key's words, with RabbitMQ's word
splitting. tests/unit/test_topic_trie.py checks many patterns at once, added and removed."""

import re
import time
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.exchanges.base import Binding
from warren.broker.exchanges.topic import TopicTrie, split_words
from warren.broker.vhost import VHost


class dest(NamedTuple):
    """A binding's destination, as much of one as the trie reads (its kind and name)."""

    name: str
    kind: str = "queue"

SEP = "\x00"


def reference_words(key: str) -> list:
    # rabbit_exchange_type_topic:split_topic_key/1: <<>> is no words, otherwise split on
    # every "." (so "a." is ["a", ""] and "." is ["", ""]).
    return [] if key == "" else key.split(".")


def reference_match(pattern: str, key: str) -> bool:
    """Words become SEP-prefixed chunks; "*" is one chunk, "#" any number of chunks."""
    parts = []
    for token in reference_words(pattern):
        if token == "#":
            parts.append(f"(?:{SEP}[^{SEP}]*)*")
        elif token == "*":
            parts.append(f"{SEP}[^{SEP}]*")
        else:
            parts.append(re.escape(SEP + token))
    subject = "".join(SEP + w for w in reference_words(key))
    return re.fullmatch("".join(parts), subject, re.DOTALL) is not None


def matches(pattern: str, key: str) -> bool:
    trie = TopicTrie()
    trie.add(Binding(None, dest("q"), pattern, {}))
    return bool(trie.match(split_words(key)))


WORDS = st.sampled_from(["a", "b", "ab", "", "é", "A"])
PATTERN_WORDS = st.one_of(WORDS, st.sampled_from(["*", "#"]))
KEYS = st.lists(st.one_of(WORDS, st.sampled_from(["*", "#"])), max_size=7).map(".".join)
PATTERNS = st.lists(PATTERN_WORDS, max_size=7).map(".".join)


def test_split_words_like_rabbitmq():
    assert split_words("") == ()
    assert split_words("a") == ("a",)
    assert split_words("a.") == ("a", "")
    assert split_words(".") == ("", "")
    assert split_words(".a") == ("", "a")
    assert split_words("a..b") == ("a", "", "b")


def test_known_cases():
    cases = [
        ("#", "", True), ("*", "", False), ("a.#", "a", True), ("#.a", "a", True),
        ("a.#.b", "a.b", True), ("a.#.b", "a.c.d.b", True), ("*.*", "a", False), ("*.*", "a.b", True),
        ("*.*", ".", True), ("a..b", "a..b", True), ("a.*.b", "a..b", True), ("a.", "a", False),
        ("a.*", "a.", True), ("", "", True), ("", "a", False), ("#.#", "", True), ("*.#", "", False),
        ("a", "*", False), ("*", "*", True), ("#", "#", True), ("a.#", "ab", False),
    ]
    for pattern, key, expected in cases:
        assert reference_match(pattern, key) is expected, (pattern, key)
        assert matches(pattern, key) is expected, (pattern, key)


@settings(max_examples=1500, deadline=None)
@given(PATTERNS, KEYS)
def test_topic_matches_reference(pattern, key):
    assert matches(pattern, key) == reference_match(pattern, key)


@settings(max_examples=500, deadline=None)
@given(KEYS)
def test_a_key_matches_itself_and_hash(key):
    # A routing key with no wildcard words matches itself as a binding key; "#" matches all.
    if "*" not in reference_words(key) and "#" not in reference_words(key):
        assert matches(key, key)
    assert matches("#", key)


def test_many_hashes_do_not_blow_up():
    pattern = ".".join(["#"] * 40 + ["a"])
    key = ".".join(["b"] * 200)
    start = time.monotonic()
    assert not matches(pattern, key)
    assert matches(pattern, key + ".a")
    assert time.monotonic() - start < 1.0


@settings(max_examples=150, deadline=None)
@given(st.lists(PATTERNS, min_size=1, max_size=6), KEYS)
def test_exchange_routes_each_queue_once(patterns, key):
    """The exchange (with its cache) sends a message to each queue whose bindings match, once."""
    vhost = VHost("/")
    x, _ = vhost.declare_exchange("t", "topic")
    queues = []
    for i, pattern in enumerate(patterns):
        q, _ = vhost.declare_queue(f"q{i % 3}")
        vhost.bind(x, q, pattern, {})
        queues.append((q, pattern))
    expected = list(dict.fromkeys(q for q, pattern in queues if reference_match(pattern, key)))
    for _ in range(2):  # the second lookup comes from the cache
        assert sorted(q.name for q in vhost.route(x, key, None)) == sorted(q.name for q in expected)
    # Unbinding invalidates the cache.
    q0, p0 = queues[0]
    vhost.unbind(x, q0, p0, {})
    remaining = {(q.name, pattern) for q, pattern in queues} - {(q0.name, p0)}  # bindings are a set
    still = {name for name, pattern in remaining if reference_match(pattern, key)}
    assert {q.name for q in vhost.route(x, key, None)} == still
