"""The topic exchange's trie against a simple reference matcher, with many bindings added and
removed in random order: after every step each routing key reaches exactly the queues whose
live bindings match it, in the order of their oldest matching binding, and the trie holds no
node a trie built from the live bindings alone would not have."""

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


def topic_matches(pattern: tuple, words: tuple) -> bool:
    """The reference: binding-key words against routing-key words, by backtracking over the
    (pattern index, word index) positions (the broker's matcher before the trie)."""
    todo = [(0, 0)]
    seen = set()
    np, nw = len(pattern), len(words)
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        p, w = state
        if p == np:
            if w == nw:
                return True
            continue
        token = pattern[p]
        if token == "#":
            todo.append((p + 1, w))       # # matches nothing more
            if w < nw:
                todo.append((p, w + 1))   # # swallows one more word
        elif w < nw and (token == "*" or token == words[w]):
            todo.append((p + 1, w + 1))
    return False


def reference(pattern: str, key: str) -> bool:
    return topic_matches(split_words(pattern), split_words(key))


WORDS = st.sampled_from(["a", "b", "ab", "", "é"])
# Patterns the issue names, then random ones: `#` at the start, in the middle and at the end,
# `#.#`, `*.#.*`, empty words and the empty pattern.
SHAPES = ["#", "#.a", "a.#", "a.#.b", "#.#", "*.#.*", "#.*.#", "a..b", "", ".", "*", "*.*", "a.*.#",
          "#.#.#.a", "a.", ".a"]
PATTERNS = st.one_of(st.sampled_from(SHAPES),
                     st.lists(st.one_of(WORDS, st.sampled_from(["*", "#"])), max_size=6).map(".".join))
KEYS = st.one_of(st.sampled_from(["", "a", "a.b", "a..b", ".", "a.b.c.b", "#", "*"]),
                 st.lists(st.one_of(WORDS, st.sampled_from(["*", "#"])), max_size=6).map(".".join))
QUEUES = 4
# ("add", pattern, queue index, argument variant) or ("remove", which live binding)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("add"), PATTERNS, st.integers(0, QUEUES - 1), st.integers(0, 1)),
    st.tuples(st.just("remove"), st.integers(0, 1000))), min_size=1, max_size=25)


def built_trie_size(bindings) -> int:
    trie = TopicTrie()
    for b in bindings:
        trie.add(b)
    return trie.node_count()


@settings(max_examples=300, deadline=None)
@given(STEPS, st.lists(KEYS, min_size=1, max_size=8))
def test_trie_routes_like_the_reference_through_adds_and_removes(steps, keys):
    vhost = VHost("/")
    x, _ = vhost.declare_exchange("t", "topic")
    queues = [vhost.declare_queue(f"q{i}")[0] for i in range(QUEUES)]
    live: list = []  # (pattern, queue, arguments) in binding order, as the broker holds them
    for step in steps:
        if step[0] == "add":
            _, pattern, qi, variant = step
            args = {"v": variant} if variant else {}
            vhost.bind(x, queues[qi], pattern, args)
            if (pattern, queues[qi], args) not in live:
                live.append((pattern, queues[qi], args))
        elif live:
            pattern, q, args = live.pop(step[1] % len(live))
            vhost.unbind(x, q, pattern, args)
        for key in keys:
            expected = list(dict.fromkeys(q.name for pattern, q, _ in live if reference(pattern, key)))
            for _ in range(2):  # the second answer may come from the cache
                assert [q.name for q in vhost.route(x, key, None)] == expected, (key, live)
        assert x._trie.node_count() == built_trie_size(x.bindings.values())
    for pattern, q, args in live:
        vhost.unbind(x, q, pattern, args)
    assert x._trie.node_count() == 1 and not x.bindings  # pruned back to the root


@settings(max_examples=300, deadline=None)
@given(st.lists(PATTERNS, min_size=1, max_size=12, unique=True), KEYS)
def test_trie_matches_the_patterns_the_reference_matches(patterns, key):
    trie = TopicTrie()
    bindings = [Binding(None, dest(f"d{i}"), p, {}) for i, p in enumerate(patterns)]
    for b in bindings:
        trie.add(b)
    found = {b.destination for table in trie.match(split_words(key)) for b in table.values()}
    assert found == {b.destination for b in bindings if reference(b.routing_key, key)}


def test_issue_shapes():
    cases = [
        ("#", "", True), ("#.#", "", True), ("*.#.*", "a", False), ("*.#.*", "a.b", True),
        ("*.#.*", "a.x.y.b", True), ("#.a", "a", True), ("#.a", "b.a", True), ("#.a", "a.b", False),
        ("a.#.b", "a.b", True), ("a.#.b", "a.x.y.b", True), ("a.#.b", "a.x.y", False),
        ("a..b", "a..b", True), ("a..b", "a.b", False), ("a.*.b", "a..b", True),
        ("", "", True), ("", "a", False), ("*", "", False), ("a.", "a.", True), ("a.", "a", False),
        ("#.#.#.a", "a", True), ("a", "*", False), ("*", "#", True),
    ]
    for pattern, key, expected in cases:
        assert reference(pattern, key) is expected, (pattern, key)
        trie = TopicTrie()
        trie.add(Binding(None, dest("q"), pattern, {}))
        assert bool(trie.match(split_words(key))) is expected, (pattern, key)


def test_many_hashes_stay_polynomial():
    trie = TopicTrie()
    for n in range(1, 40):
        trie.add(Binding(None, dest(f"d{n}"), ".".join(["#"] * n + ["a"]), {}))
    key = split_words(".".join(["b"] * 200))
    start = time.monotonic()
    assert trie.match(key) == []
    assert len(trie.match(key + ("a",))) == 39
    assert time.monotonic() - start < 2.0


def test_cost_follows_the_key_not_the_binding_count():
    """A new key costs about the same against 10,000 bindings as against one (the trie walks
    only the branches the key can follow; the scan it replaced was 10,000x slower)."""
    vhost = VHost("/")
    x, _ = vhost.declare_exchange("t", "topic")
    for i in range(10_000):
        q, _ = vhost.declare_queue(f"q{i}")
        vhost.bind(x, q, f"a.b{i}.*", {})
    assert [q.name for q in vhost.route(x, "a.b17.u1", None)] == ["q17"]
    assert vhost.route(x, "a.c17.u1", None) == []
    small = TopicTrie()
    small.add(Binding(None, dest("q"), "a.b17.*", {}))
    keys = [split_words(f"a.b{i % 10_000}.u{i}") for i in range(2000)]

    def timed(trie) -> float:
        t0 = time.perf_counter()
        for k in keys:
            trie.match(k)
        return time.perf_counter() - t0

    assert timed(x._trie) < 20 * timed(small) + 0.05
