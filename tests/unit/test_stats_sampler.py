"""The management statistics sampler (warren.mgmt.stats.Sampler) over a real broker model:
rates over the last interval, a queue made between rounds counting from zero, a deleted
queue forgotten, and a new queue that happens to get a dead one's id() not inheriting its
counts; connections and channels by the broker's handles of them. (Over the wire and the
HTTP API: tests/integration/test_mgmt_overview.py.)"""

from pamqp import commands

from warren.broker import ops
from warren.broker.broker import Broker
from warren.mgmt.stats import MAX_SHARE, Sampler, overview_message_stats

from .fake_transport import Client


def actor(broker):
    return ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])


def sample_at(sampler, monkeypatch, t):
    monkeypatch.setattr("warren.mgmt.stats.time.monotonic", lambda: t)
    sampler.sample()


def test_rates_over_the_last_interval(monkeypatch):
    broker = Broker.with_defaults()
    a = actor(broker)
    ops.declare_queue(a, "q")
    q = broker.vhosts["/"].queues["q"]
    sampler = Sampler(broker, 5)
    sample_at(sampler, monkeypatch, 100.0)
    assert sampler.rates(q) == {}  # one round: no interval yet
    q.stats["publish"] += 50
    sample_at(sampler, monkeypatch, 105.0)
    assert sampler.rates(q)["publish"] == 10.0
    sample_at(sampler, monkeypatch, 110.0)
    assert sampler.rates(q)["publish"] == 0.0


def test_a_queue_made_between_rounds_counts_from_zero(monkeypatch):
    broker = Broker.with_defaults()
    sampler = Sampler(broker, 5)
    sample_at(sampler, monkeypatch, 100.0)
    ops.declare_queue(actor(broker), "fresh")
    q = broker.vhosts["/"].queues["fresh"]
    q.stats["publish"] += 20
    sample_at(sampler, monkeypatch, 102.0)
    assert sampler.rates(q)["publish"] == 10.0


def test_a_deleted_queue_is_forgotten_and_its_id_not_inherited(monkeypatch):
    broker = Broker.with_defaults()
    a = actor(broker)
    ops.declare_queue(a, "old")
    old = broker.vhosts["/"].queues["old"]
    old.stats["publish"] += 1000
    sampler = Sampler(broker, 5)
    sample_at(sampler, monkeypatch, 100.0)
    key = id(old)
    assert key in sampler.entries
    ops.delete_queue(a, "old")
    del old
    sample_at(sampler, monkeypatch, 105.0)
    assert key not in sampler.entries

    # A later object given the dead one's id (CPython reuses addresses) starts afresh.
    ops.declare_queue(a, "again")
    q = broker.vhosts["/"].queues["again"]
    sample_at(sampler, monkeypatch, 110.0)
    # As if the entry were a dead object's, with its counts.
    _ref, fields, _prev, (t, counts) = sampler.entries[id(q)]
    sampler.entries[id(q)] = (lambda: None, fields, None, (t, (1000,) * len(counts)))
    q.stats["publish"] += 5
    sample_at(sampler, monkeypatch, 115.0)
    assert sampler.rates(q)["publish"] == 1.0  # counted from zero at 110, not from 1000


def test_a_long_round_stretches_the_period():
    sampler = Sampler(Broker.with_defaults(), 5)
    assert sampler.pause(0.01) == 5  # 0.2 % of the period
    assert sampler.pause(0.3) == 0.3 / MAX_SHARE  # 100,000 queues: every 15 s


def test_connections_and_channels_by_their_handles(monkeypatch):
    """A connection's and a channel's rates are kept by the broker's handle of them, from
    their counters() records; the overview's totals leave a closing channel's counters to
    broker.stats.message_totals, which already has them."""
    c = Client()
    c.open_channel(1)
    c.declare(1, "q")
    sampler = Sampler(c.broker, 5)
    sample_at(sampler, monkeypatch, 100.0)
    c.fill(1, "q", [b"m"] * 10)
    received = c.conn.counters().recv_oct
    sample_at(sampler, monkeypatch, 105.0)
    channel = c.conn.channels[1]
    assert sampler.rates(channel)["publish"] == 2.0
    assert sampler.rates(c.conn)["recv_oct"] > 0 and c.conn.counters().recv_oct == received
    assert overview_message_stats(c.broker)["publish"] == 10
    c.send(1, commands.Basic.Get(queue="missing"))  # closes the channel (404)
    assert channel.counters().closing
    assert overview_message_stats(c.broker)["publish"] == 10  # once, from message_totals
