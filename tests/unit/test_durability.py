"""The durability object and settlement handles: what a reply or a confirm may promise, from the
store's group commit (warren.store.settlement)."""

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.broker import Broker
from warren.store.persister import Persister
from warren.store.settlement import REJECTED, SETTLED, AllOf, StoreBatch, later


class Waiter:
    def __init__(self):
        self.synced = 0

    def store_synced(self):
        self.synced += 1


def setup(tmp_path):
    broker = Broker.with_defaults()
    fsyncs = []  # the fsync "thread": jobs run when the test says so
    broker.persister = Persister(str(tmp_path), run_in_thread=lambda job, done: fsyncs.append((job, done)))
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    ops.declare_queue(actor, "q", durable=True)
    return broker, actor, fsyncs


def publish_persistent(actor):
    body = b"persistent"
    message, queues = ops.route(actor, "", "q", shortstr("") + shortstr("q"),
                                encode_header(len(body), {"delivery_mode": 2}), body)
    return ops.enqueue(message, queues)


def test_a_persistent_publish_is_safe_after_its_fsync(tmp_path):
    broker, actor, fsyncs = setup(tmp_path)
    durability = broker.durability
    batch = publish_persistent(actor)
    assert isinstance(batch, StoreBatch) and batch.status() is None
    assert publish_persistent(actor) is batch  # one handle for every message of the batch
    waiter = Waiter()
    batch.notify(waiter)
    durability.flush()  # writes the record and starts the group commit
    assert len(fsyncs) == 1 and batch.status() is None
    assert publish_persistent(actor) is not batch  # the next batch's
    job, done = fsyncs.pop()
    job()
    done(None)
    assert waiter.synced == 1 and batch.status() is True


def test_a_failed_fsync_is_reported_for_nacks(tmp_path):
    broker, actor, fsyncs = setup(tmp_path)
    batch = publish_persistent(actor)
    broker.durability.flush()
    _job, done = fsyncs.pop()
    done("disk on fire")
    assert batch.status() is False


def test_nothing_to_wait_for_without_a_store(tmp_path):
    broker = Broker.with_defaults()
    actor = ops.Actor(broker, broker.users["guest"], broker.vhosts["/"])
    ops.declare_queue(actor, "q", durable=True)
    assert publish_persistent(actor) is SETTLED and SETTLED.status() is True
    assert broker.durability.sync_now()


def test_handles_combine_without_allocating_for_one_persister(tmp_path):
    broker, actor, fsyncs = setup(tmp_path)
    first = publish_persistent(actor)
    broker.durability.flush()
    second = publish_persistent(actor)
    assert later(first, second) is second and later(second, first) is second
    assert later(SETTLED, first) is first and later(first, SETTLED) is first
    assert later(first, REJECTED) is REJECTED and REJECTED.status() is False
    other = Persister(str(tmp_path / "other"), run_in_thread=lambda job, done: None).batch
    both = later(first, other)
    assert isinstance(both, AllOf) and both.status() is None
    job, done = fsyncs.pop()
    done(None)
    other.persister.synced = other.number
    assert both.status() is True
    other.persister.failed[other.number] = "disk on fire"
    assert both.status() is False
