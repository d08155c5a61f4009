"""Topic exchange: dotted words, `*` matches one word and `#` zero or more, as in RabbitMQ.

The bindings live in a trie over their words, as in RabbitMQ's rabbit_exchange_type_topic: an
edge per literal word, plus a `*` and a `#` child per node. Routing walks only the branches the
key can follow, so its cost depends on the key and on the bindings that can match it, not on
how many bindings there are; adding or removing a binding touches its own path only.
"""

from .base import Binding, Exchange, by_age

_CACHE_LIMIT = 4096


def split_words(key: str) -> tuple:
    # RabbitMQ: "" has no words; "a." is ["a", ""].
    return tuple(key.split(".")) if key else ()


class _Node:
    __slots__ = ("words", "star", "hash", "bindings", "is_hash")

    def __init__(self, is_hash: bool = False) -> None:
        self.words: dict | None = None  # literal word -> _Node
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.bindings: dict | None = None  # Binding.key -> Binding, for patterns ending here
        self.is_hash = is_hash

    def empty(self) -> bool:
        return not self.words and self.star is None and self.hash is None and not self.bindings


class TopicTrie:
    """Binding patterns by word, and the bindings a routing key matches."""

    def __init__(self) -> None:
        self.root = _Node()

    def add(self, binding: Binding) -> None:
        node = self.root
        for word in split_words(binding.routing_key):
            if word == "*":
                child = node.star
                if child is None:
                    child = node.star = _Node()
            elif word == "#":
                child = node.hash
                if child is None:
                    child = node.hash = _Node(is_hash=True)
            else:
                words = node.words
                if words is None:
                    words = node.words = {}
                child = words.get(word)
                if child is None:
                    child = words[word] = _Node()
            node = child
        if node.bindings is None:
            node.bindings = {}
        node.bindings[binding.key] = binding

    def remove(self, binding: Binding) -> None:
        """Remove a binding and the nodes its path no longer needs."""
        path = []  # (parent, word) for each step
        node = self.root
        for word in split_words(binding.routing_key):
            path.append((node, word))
            if word == "*":
                child = node.star
            elif word == "#":
                child = node.hash
            else:
                child = node.words.get(word) if node.words else None
            if child is None:
                return
            node = child
        if not node.bindings or node.bindings.pop(binding.key, None) is None:
            return
        if not node.bindings:
            node.bindings = None
        for parent, word in reversed(path):
            if not node.empty():
                break
            if word == "*":
                parent.star = None
            elif word == "#":
                parent.hash = None
            else:
                assert parent.words is not None
                del parent.words[word]
                if not parent.words:
                    parent.words = None
            node = parent

    def match(self, words: tuple) -> list:
        """The binding tables ({Binding.key: Binding}) of the patterns that match `words`."""
        n = len(words)
        found = []
        stack = [(self.root, 0)]
        seen: set | None = None  # `#` states already walked (several `#` can reach the same one)
        pop, push = stack.pop, stack.append
        while stack:
            node, i = pop()
            if node.is_hash:
                if seen is None:
                    seen = set()
                state = (id(node), i)
                if state in seen:
                    continue
                seen.add(state)
                if i < n:
                    push((node, i + 1))  # the `#` takes one more word
            if i == n:
                if node.bindings:
                    found.append(node.bindings)
                if node.hash is not None:
                    push((node.hash, i))
                continue
            if node.hash is not None:
                push((node.hash, i))
            if node.star is not None:
                push((node.star, i + 1))
            if node.words is not None:
                child = node.words.get(words[i])
                if child is not None:
                    push((child, i + 1))
        return found

    def node_count(self) -> int:
        count, todo = 0, [self.root]
        while todo:
            node = todo.pop()
            count += 1
            todo.extend(c for c in (node.star, node.hash) if c is not None)
            if node.words:
                todo.extend(node.words.values())
        return count


class TopicExchange(Exchange):
    type_name = "topic"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._trie = TopicTrie()
        # routing key -> destinations; emptied by any binding change. A repeated key then
        # costs one lookup instead of a trie walk.
        self._cache: dict = {}

    def _index_add(self, binding: Binding) -> None:
        self._trie.add(binding)
        if self._cache:
            self._cache = {}

    def _index_remove(self, binding: Binding) -> None:
        self._trie.remove(binding)
        if self._cache:
            self._cache = {}

    def _index_clear(self) -> None:
        self._trie = TopicTrie()
        self._cache = {}

    def match(self, routing_key, message):
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        found = self._trie.match(split_words(routing_key))
        if not found:
            dests: tuple = ()
        elif len(found) == 1 and len(found[0]) == 1:
            dests = (next(iter(found[0].values())).destination,)
        else:
            dests = by_age(b for table in found for b in table.values())
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache = {}
        self._cache[routing_key] = dests
        return dests
