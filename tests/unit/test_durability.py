"""The durability object: what a reply or a confirm may promise, from the store's group commit."""

from warren.amqp.codec import shortstr
from warren.amqp.properties import encode_header
from warren.broker import ops
from warren.broker.broker import Broker
from warren.store.persister import Persister


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
    assert batch and durability.status(batch) is None
    waiter = Waiter()
    durability.wait(waiter)
    durability.flush()  # writes the record and starts the group commit
    assert len(fsyncs) == 1 and durability.status(batch) is None
    job, done = fsyncs.pop()
    job()
    done(None)
    assert waiter.synced == 1 and durability.status(batch) is True


def test_a_failed_fsync_is_reported_for_nacks(tmp_path):
    broker, actor, fsyncs = setup(tmp_path)
    batch = publish_persistent(actor)
    broker.durability.flush()
    _job, done = fsyncs.pop()
    done("disk on fire")
    assert broker.durability.status(batch) is False


def test_nothing_to_wait_for_without_a_batch_or_a_store(tmp_path):
    assert Broker.with_defaults().durability.status(7) is True
    broker, _actor, _ = setup(tmp_path)
    assert broker.durability.status(0) is True
    assert broker.durability.sync_now()
