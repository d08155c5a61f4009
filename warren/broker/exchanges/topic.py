"""Topic exchange: dotted words, `*` matches one word and `#` zero or more, as in RabbitMQ."""

from .base import Exchange

_CACHE_LIMIT = 4096


def split_words(key: str) -> tuple:
    # RabbitMQ: "" has no words; "a." is ["a", ""].
    return tuple(key.split(".")) if key else ()


def topic_matches(pattern: tuple, words: tuple) -> bool:
    """Whether binding-key words match routing-key words (iterative, with backtracking on #)."""
    # positions (pattern index, word index) still to try; small, so a set stops blow-ups.
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


class TopicExchange(Exchange):
    type_name = "topic"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._patterns: list = []
        self._cache: dict = {}

    def _bindings_changed(self):
        self._patterns = [(split_words(b.routing_key), b.destination) for b in self.bindings.values()]
        self._cache = {}

    def match(self, routing_key, message):
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        words = split_words(routing_key)
        dests = tuple(dict.fromkeys(d for pattern, d in self._patterns if topic_matches(pattern, words)))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[routing_key] = dests
        return dests
