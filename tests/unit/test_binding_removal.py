"""Removing bindings leaves routing exactly as if they had never existed.

For random topologies of direct, fanout, topic and headers exchanges (exchange-to-exchange
bindings and auto-delete exchanges included), one broker is built in full and then loses
bindings by every way there is: queue.unbind / exchange.unbind, queue.delete, the exclusive
owner's connection going away, exchange.delete, an auto-delete queue losing its last consumer,
and the auto-delete cascades those start. A second broker is built from the same definitions
without what was removed (its cascades worked out here, independently of the broker). Both
must route every probe to the same queues in the same order, list the same bindings, and
hold indexes of the same shape.
"""

import datetime
import decimal
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from warren.broker import ops
from warren.broker.broker import Broker
from warren.broker.exchanges.base import freeze
from warren.broker.exchanges.headers import headers_match
from warren.broker.vhost import VHost

from .fake_transport import Client

TYPES = ("direct", "fanout", "topic", "headers")
KEYS = {
    "direct": ["a", "b", "", "a.b"],
    "fanout": ["", "a"],
    "topic": ["a.*", "#", "a.#", "*.b", "a.b", "#.b", "a..b", "", "*.#.*", "#.#"],
    "headers": [""],
}
PROBE_KEYS = ["", "a", "b", "a.b", "a.c.b", "x.b", "a..b", "a.b.c"]
PROBE_HEADERS = [{}, {"h1": 1}, {"h1": 1, "h2": 2}, {"h2": "v", "h3": 1}, {"h1": 2, "h3": "v"},
                 {"h1": 1.0, "h2": b"v", "x-h": 1}, {"h3": None}]


class Probe:
    """What an exchange reads of a message: its headers."""

    def __init__(self, headers):
        self.headers = headers


def headers_args(rng) -> dict:
    args = {"x-match": rng.choice(["all", "any", "all-with-x", "any-with-x"])}
    for h in rng.sample(["h1", "h2", "h3", "x-h"], rng.randint(0, 3)):
        args[h] = rng.choice([1, 2, "v", None])
    return args


def random_topology(rng) -> dict:
    exchanges = [(f"x{i}", rng.choice(TYPES), rng.random() < 0.3) for i in range(rng.randint(2, 6))]
    # queue: (name, owner): None, or ("excl", client index), or ("auto", client index)
    queues = []
    for i in range(rng.randint(2, 8)):
        r = rng.random()
        owner = None if r < 0.5 else (("excl" if r < 0.8 else "auto"), rng.randint(0, 1))
        queues.append((f"q{i}", owner))
    bindings = []
    for _ in range(rng.randint(3, 30)):
        src, kind, _ = rng.choice(exchanges)
        if rng.random() < 0.25:
            dest = ("exchange", rng.choice(exchanges)[0])
        else:
            dest = ("queue", rng.choice(queues)[0])
        key = rng.choice(KEYS[kind])
        args = headers_args(rng) if kind == "headers" else ({"n": rng.randint(1, 2)} if rng.random() < 0.2 else {})
        b = (src, dest, key, args)
        if b not in bindings:
            bindings.append(b)
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


class World:
    """A broker built from a topology: exclusive and auto-delete queues belong to two session
    connections (auto-delete ones with a consumer each), the rest to nobody."""

    def __init__(self, topo: dict):
        self.broker = Broker.with_defaults()
        self.vhost = self.broker.vhosts["/"]
        self.clients = [Client(self.broker), Client(self.broker)]
        for c in self.clients:
            c.open_channel(1)
        self.owner_of: dict = {}
        self.consumer_of: dict = {}
        guest = self.broker.users["guest"]
        self.actor = ops.Actor(self.broker, guest, self.vhost, None)
        self.actors = [ops.Actor(self.broker, guest, self.vhost, c.conn.exclusive_owner()) for c in self.clients]
        for name, kind, auto_delete in topo["exchanges"]:
            ops.declare_exchange(self.actor, name, kind, auto_delete=auto_delete)
        for name, owner in topo["queues"]:
            if owner is None:
                ops.declare_queue(self.actor, name)
                continue
            how, ci = owner
            client = self.clients[ci]
            got = client.call(1, commands.Queue.Declare(queue=name, exclusive=how == "excl",
                                                        auto_delete=how == "auto"))
            assert got[0][1] == "Queue.DeclareOk", got
            self.owner_of[name] = ci
            if how == "auto":
                tag = f"c-{name}"
                assert client.call(1, commands.Basic.Consume(queue=name, consumer_tag=tag))[0][1] == \
                    "Basic.ConsumeOk"
                self.consumer_of[name] = tag
        for b in topo["bindings"]:
            self.bind(b)

    def actor_for(self, dest) -> ops.Actor:
        kind, name = dest
        ci = self.owner_of.get(name) if kind == "queue" else None
        return self.actor if ci is None else self.actors[ci]

    def bind(self, b) -> None:
        src, dest, key, args = b
        ops.bind(self.actor_for(dest), src, dest[0], dest[1], key, dict(args))

    # what the model can be asked about -------------------------------------------
    def routes(self) -> dict:
        out = {}
        for name, x in sorted(self.vhost.exchanges.items()):
            if x.is_default:
                continue
            for key in PROBE_KEYS:
                for i, headers in enumerate(PROBE_HEADERS):
                    out[(name, key, i)] = [q.name for q in self.vhost.route(x, key, Probe(headers))]
        return out

    def listing(self) -> dict:
        """Each exchange's bindings in order, and the bindings to each destination."""
        out = {}
        for name, x in self.vhost.exchanges.items():
            out[name] = [(b.destination.kind, b.destination.name, b.routing_key, b.arguments)
                         for b in x.bindings.values()]
        for dest in [*self.vhost.exchanges.values(), *self.vhost.queues.values()]:
            out[(dest.kind, dest.name)] = sorted(
                (b.source.name, b.routing_key, repr(b.arguments)) for b in self.vhost.bindings_to(dest))
        return out

    def index_shapes(self) -> dict:
        out: dict = {"bindings_to": len(self.vhost._bindings_to)}
        for name, x in self.vhost.exchanges.items():
            if x.type_name == "topic":
                out[name] = x._trie.node_count()
            elif x.type_name == "direct" and not x.is_default:
                out[name] = sorted(x._by_key)
            elif x.type_name == "headers":
                out[name] = (
                    {(h, v): sorted(bk[1] for bk in table) for h, values in x._any.items()
                     for v, table in values.items()},
                    sorted(k[1] for k in x._always),
                    sum(len(t) for values in x._all.values() for t in values.values()), len(x._all_slot))
        return out


class Reference:
    """The topology's definitions, with removals and RabbitMQ's auto-delete cascades applied
    by hand: what the second broker is built from."""

    def __init__(self, topo: dict):
        self.topo = topo
        self.exchanges = {name for name, _, _ in topo["exchanges"]}
        self.auto_delete = {name for name, _, ad in topo["exchanges"] if ad}
        self.queues = {name for name, _ in topo["queues"]}
        self.bindings = list(topo["bindings"])

    def remove_binding(self, b) -> None:
        if b not in self.bindings:
            return
        self.bindings.remove(b)
        src = b[0]
        if src in self.auto_delete and src in self.exchanges and not any(o[0] == src for o in self.bindings):
            self.delete_exchange(src)

    def delete_exchange(self, name) -> None:
        self.exchanges.discard(name)
        self.bindings = [b for b in self.bindings if b[0] != name]
        for b in [b for b in self.bindings if b[1] == ("exchange", name)]:
            self.remove_binding(b)

    def delete_queue(self, name) -> None:
        self.queues.discard(name)
        for b in [b for b in self.bindings if b[1] == ("queue", name)]:
            self.remove_binding(b)

    def remaining(self) -> dict:
        return {"exchanges": [x for x in self.topo["exchanges"] if x[0] in self.exchanges],
                "queues": [q for q in self.topo["queues"] if q[0] in self.queues],
                "bindings": list(self.bindings)}


def remove_something(rng, world: World, ref: Reference, closed: set) -> str:
    """One random removal, done to the broker and to the reference alike."""
    choices = []
    if ref.bindings:
        choices.append("unbind")
    deletable = [q for q, _ in ref.topo["queues"] if q in ref.queues and world.owner_of.get(q) not in closed]
    if deletable:
        choices.append("delete_queue")
    if ref.exchanges:
        choices.append("delete_exchange")
    if [ci for ci in (0, 1) if ci not in closed]:
        choices.append("close_owner")
    if [q for q in world.consumer_of if q in ref.queues and world.owner_of[q] not in closed]:
        choices.append("cancel_consumer")
    what = rng.choice(choices)
    if what == "unbind":
        b = rng.choice(ref.bindings)
        src, dest, key, args = b
        ops.unbind(world.actor_for(dest), src, dest[0], dest[1], key, dict(args))
        ref.remove_binding(b)
    elif what == "delete_queue":
        name = rng.choice(deletable)
        ops.delete_queue(world.actor_for(("queue", name)), name)
        ref.delete_queue(name)
    elif what == "delete_exchange":
        name = rng.choice(sorted(ref.exchanges))
        assert ops.delete_exchange(world.actor, name)
        ref.delete_exchange(name)
    elif what == "close_owner":
        ci = rng.choice([ci for ci in (0, 1) if ci not in closed])
        closed.add(ci)
        world.clients[ci].conn.connection_lost()
        for name, owner in ref.topo["queues"]:
            # exclusive queues go with their owner; auto-delete ones lose their consumer
            if owner is not None and owner[1] == ci:
                ref.delete_queue(name)
    else:
        name = rng.choice([q for q in world.consumer_of if q in ref.queues and world.owner_of[q] not in closed])
        client = world.clients[world.owner_of[name]]
        got = client.call(1, commands.Basic.Cancel(consumer_tag=world.consumer_of[name]))
        assert "Basic.CancelOk" in [f[1] for f in got], got  # after notices of earlier deletions
        ref.delete_queue(name)
    return what


@pytest.mark.parametrize("seed", range(60))
def test_removal_routes_as_if_never_bound(seed):
    rng = random.Random(seed)
    topo = random_topology(rng)
    world, ref, closed = World(topo), Reference(topo), set()
    done = []
    for _ in range(rng.randint(1, 6)):
        world.routes()  # fills whatever the exchanges cache, which the removal must correct
        done.append(remove_something(rng, world, ref, closed))
    fresh = World(ref.remaining())
    assert set(world.vhost.exchanges) == set(fresh.vhost.exchanges), done
    assert set(world.vhost.queues) == set(fresh.vhost.queues), done
    assert world.listing() == fresh.listing(), done
    assert world.routes() == fresh.routes(), done
    assert world.index_shapes() == fresh.index_shapes(), done


@pytest.mark.parametrize("kind", TYPES)
def test_every_kind_of_removal_for_each_type(kind):
    """Each exchange type through each way of losing a binding, one at a time."""
    topo = {
        "exchanges": [("src", kind, False), ("mid", kind, True), ("leaf", "fanout", True)],
        "queues": [("plain", None), ("mine", ("excl", 0)), ("auto", ("auto", 1)), ("other", None)],
        "bindings": [],
    }
    args = {"x-match": "any", "h1": 1} if kind == "headers" else {}
    key = "a.b" if kind != "fanout" else ""
    for dest in (("queue", "plain"), ("queue", "mine"), ("queue", "auto"), ("exchange", "mid"),
                 ("queue", "other")):
        topo["bindings"].append(("src", dest, key, args))
    topo["bindings"] += [("mid", ("queue", "other"), key, args), ("mid", ("exchange", "leaf"), key, args),
                         ("leaf", ("queue", "plain"), "", {}), ("src", ("queue", "plain"), key + "x", {})]

    def check(remove) -> None:
        world, ref = World(topo), Reference(topo)
        world.routes()
        remove(world, ref)
        fresh = World(ref.remaining())
        assert world.listing() == fresh.listing()
        assert world.routes() == fresh.routes()
        assert world.index_shapes() == fresh.index_shapes()

    def unbind(world, ref):
        ops.unbind(world.actor, "src", "queue", "plain", key, args)
        ref.remove_binding(("src", ("queue", "plain"), key, args))

    def delete_queue(world, ref):
        ops.delete_queue(world.actor, "plain")
        ref.delete_queue("plain")

    def owner_closes(world, ref):
        world.clients[0].conn.connection_lost()
        ref.delete_queue("mine")

    def last_consumer_goes(world, ref):
        world.clients[1].call(1, commands.Basic.Cancel(consumer_tag="c-auto"))
        ref.delete_queue("auto")

    def delete_exchange(world, ref):
        ops.delete_exchange(world.actor, "src")
        ref.delete_exchange("src")

    def cascade(world, ref):
        # "other" goes: mid loses one of its two bindings; then leaf is deleted, which removes
        # mid -> leaf, mid's last binding: mid is auto-deleted, and with it src -> mid.
        ops.delete_queue(world.actor, "other")
        ref.delete_queue("other")
        ops.delete_exchange(world.actor, "leaf")
        ref.delete_exchange("leaf")
        assert "mid" not in world.vhost.exchanges and "mid" not in ref.exchanges

    for remove in (unbind, delete_queue, owner_closes, last_consumer_goes, delete_exchange, cascade):
        check(remove)


# -- the headers exchange's index against a scan of every binding ---------------------------
HEADER_NAMES = st.sampled_from(["h1", "h2", "h3", "x-h"])
VALUES = st.sampled_from([1, 2, 1.0, 0, "v", b"v", "", True, False, None, decimal.Decimal("1.0"),
                          decimal.Decimal("1"), {"a": 1}, [1, "v"], datetime.datetime(2020, 1, 1)])
BINDING_ARGS = st.tuples(st.sampled_from(["all", "any", "all-with-x", "any-with-x"]),
                         st.dictionaries(HEADER_NAMES, VALUES, max_size=3)).map(
    lambda t: {"x-match": t[0], **t[1]})
HEADERS_STEPS = st.lists(st.one_of(
    st.tuples(st.just("add"), BINDING_ARGS, st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, 1000))), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(HEADERS_STEPS, st.lists(st.dictionaries(HEADER_NAMES, VALUES, max_size=4), min_size=1, max_size=6))
def test_headers_index_routes_like_a_scan(steps, probes):
    """Each message reaches exactly the queues a test of every live binding selects, in the
    order of their oldest matching binding, through adds and removes."""
    vhost = VHost("/")
    x, _ = vhost.declare_exchange("h", "headers")
    queues = [vhost.declare_queue(f"q{i}")[0] for i in range(4)]
    live: list = []  # (arguments, queue) in binding order
    for step in steps:
        if step[0] == "add":
            _, args, qi = step
            vhost.bind(x, queues[qi], "", args)
            if not any(q is queues[qi] and freeze(a) == freeze(args) for a, q in live):
                live.append((args, queues[qi]))
        elif live:
            args, q = live.pop(step[1] % len(live))
            vhost.unbind(x, q, "", args)
        for headers in probes:
            expected = list(dict.fromkeys(q.name for args, q in live if headers_match(args, headers)))
            assert [q.name for q in vhost.route(x, "", Probe(headers))] == expected, (headers, live)
    for args, q in live:
        vhost.unbind(x, q, "", args)
    assert not x._all and not x._any and not x._always and not x._all_slot
