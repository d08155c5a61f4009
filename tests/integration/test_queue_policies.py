"""Queue settings by policy and operator policy, as RabbitMQ 3.10 resolves them
(rabbit_amqqueue_process:process_args_policy/1, rabbit_policy, rabbit_policies): message-ttl,
expires, max-length, max-length-bytes, dead-letter-exchange/-routing-key and overflow, applied
to existing queues at once and undone when the policy is cleared; the policy with the highest
priority wins whole (definitions are not merged); against an x-argument the LOWER value wins
for expires, message-ttl, max-length and max-length-bytes, and the ARGUMENT wins for
dead-letter-exchange, dead-letter-routing-key and overflow; an operator policy caps the
numeric keys (the lower of policy and operator policy wins).

Policies are set with rabbitmqctl on RabbitMQ (WARREN_TEST_RABBITMQCTL) and with warrenctl,
the same arguments, on Warren. Each run of rabbitmqctl costs about a second, so most tests
use a catalogue of policies set once for the module (in parallel), on name prefixes: a queue
declared with a matching name gets its policy at declare, synchronously. The tests of
policies set, changed or cleared on existing queues set their own; RabbitMQ applies those
asynchronously, so their effects are polled for. Every expectation was checked on a
RabbitMQ 3.10.8 node.
"""

import json
import re
import time

import pika
import pytest

from conftest import RUN_ID, drain
from .dlx_helpers import (DLRK, DLX, EXPIRES, MAX_LENGTH, OVERFLOW, TTL, Policies, bodies, confirmed, deaths, get_n,
                          get_one, message_count, policies, queue_exists, wait_count, wait_until)

assert policies  # the fixture, imported for the tests below


def exact(name: str) -> str:
    return f"^{re.escape(name)}$"


def publish(ch, q, items) -> None:
    for i in items:
        ch.basic_publish("", q, str(i).encode())


def wait_max_length(ch, q, n, timeout=10.0):
    """Wait until the queue's max-length is (at most) n: publish marker messages until the
    queue holds no more than n (the policy arrives asynchronously on RabbitMQ)."""
    def holds():
        ch.basic_publish("", q, b"probe")
        return message_count(ch, q) <= n
    wait_until(holds, timeout, interval=0.05, what=f"{q}'s max-length to be {n}")
    drain(ch, q)


# ------------------------------------------------------------------------------ the catalogue

M = RUN_ID  # this module's prefix tag
DLQ = f"pol-dlq-{M}"      # where the catalogue's DLX policies send dead letters


def prefix(n) -> str:
    return f"p{n}-{M}-"


CATALOGUE = [
    # kind, name, pattern, definition, priority, apply-to
    ("policy", f"p1-{M}", f"^{prefix(1)}", {"max-length": 2, "message-ttl": 500}, 0, "queues"),
    ("policy", f"p2-{M}", f"^{prefix(2)}", {"message-ttl": 60000, "expires": 60000}, 0, "queues"),
    ("policy", f"p3-{M}", f"^{prefix(3)}", {"expires": 100}, 0, "queues"),
    ("policy", f"p4-{M}", f"^{prefix(4)}", {"dead-letter-exchange": "", "dead-letter-routing-key": DLQ,
                                           "max-length": 1, "overflow": "reject-publish"}, 0, "queues"),
    ("policy", f"p5-{M}", f"^{prefix(5)}", {"max-length": 3, "dead-letter-exchange": "",
                                           "dead-letter-routing-key": DLQ}, 1, "queues"),
    ("policy", f"p5-high-{M}", f"^{prefix(5)}high-", {"max-length": 1}, 5, "queues"),
    ("policy", f"p7-{M}", f"^{prefix(7)}", {"max-length": 5}, 0, "queues"),
    ("operator_policy", f"op7-{M}", f"^{prefix(7)}", {"max-length": 2}, 0, "queues"),
    ("operator_policy", f"op8-{M}", f"^{prefix(8)}", {"message-ttl": 50, "expires": 150}, 0, "queues"),
    ("operator_policy", f"op1-{M}", f"^{prefix(1)}", {"max-length": 3}, 0, "queues"),
    ("policy", f"px-{M}", f"^{prefix('x')}", {"max-length": 1}, 0, "exchanges"),
]


@pytest.fixture(scope="module")
def catalogue(broker):
    p = Policies(broker)
    p.set_all(CATALOGUE)
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare(DLQ)
    yield ch
    if conn.is_open:
        conn.channel().queue_delete(DLQ)
        conn.close()
    p.clean()


def reject_one(ch, q) -> None:
    method, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)


def test_max_length_argument_and_policy_the_lower_wins(catalogue, channel, names):
    """p1: max-length 2 (and an operator policy of 3, higher: no effect)."""
    lower_arg, higher_arg, no_arg = (names(prefix(1) + label) for label in ("a1", "a3", "none"))
    channel.queue_declare(lower_arg, arguments={MAX_LENGTH: 1})
    channel.queue_declare(higher_arg, arguments={MAX_LENGTH: 3})
    channel.queue_declare(no_arg)
    for q in (lower_arg, higher_arg, no_arg):
        publish(channel, q, range(5))
    assert [drain(channel, q) for q in (lower_arg, higher_arg, no_arg)] == [
        [b"4"], [b"3", b"4"], [b"3", b"4"]]


def test_message_ttl_argument_and_policy_the_lower_wins(catalogue, channel, names):
    dlq = names("dlq")
    channel.queue_declare(dlq)
    policy_lower = names(prefix(1) + "ttl")   # argument 60000, policy 500
    argument_lower = names(prefix(2) + "ttl")  # argument 50, policy 60000
    channel.queue_declare(policy_lower, arguments={DLX: "", DLRK: dlq, TTL: 60000})
    channel.queue_declare(argument_lower, arguments={DLX: "", DLRK: dlq, TTL: 50})
    publish(channel, policy_lower, ["a"])
    publish(channel, argument_lower, ["b"])
    got = get_n(channel, dlq, 2)
    assert sorted((b, deaths(p)[0]["reason"], deaths(p)[0]["queue"]) for _, p, b in got) == [
        (b"a", "expired", policy_lower), (b"b", "expired", argument_lower)]


def test_expires_argument_and_policy_the_lower_wins(catalogue, connection, channel, names):
    policy_lower = names(prefix(3) + "exp")   # argument 60000, policy 100
    argument_lower = names(prefix(2) + "exp")  # argument 100, policy 60000
    channel.queue_declare(policy_lower, arguments={EXPIRES: 60000})
    channel.queue_declare(argument_lower, arguments={EXPIRES: 100})
    wait_until(lambda: not queue_exists(connection, policy_lower) and not queue_exists(connection, argument_lower),
               timeout=5, interval=0.25)


def test_dead_letter_exchange_and_routing_key_the_argument_wins(catalogue, channel, names):
    """Policy p4: DLX "" with routing key DLQ. Each key is resolved on its own."""
    drain(catalogue, DLQ)
    by_arg_x, by_arg = names("by-arg-x"), names("by-arg")
    channel.exchange_declare(by_arg_x, "direct")
    channel.queue_declare(by_arg)
    channel.queue_bind(by_arg, by_arg_x, "arg-key")
    both_args, exchange_arg, no_args = (names(prefix(4) + label) for label in ("both", "x", "none"))
    channel.queue_declare(both_args, arguments={DLX: by_arg_x, DLRK: "arg-key"})
    channel.queue_declare(exchange_arg, arguments={DLX: ""})  # routing key from the policy
    channel.queue_declare(no_args)
    for q in (both_args, exchange_arg, no_args):
        publish(channel, q, [q])
        reject_one(channel, q)
    method, props, body = get_one(channel, by_arg)
    assert (method.exchange, method.routing_key, body) == (by_arg_x, "arg-key", both_args.encode())
    got = get_n(channel, DLQ, 2)
    assert sorted((m.exchange, m.routing_key, b) for m, _, b in got) == sorted(
        [("", DLQ, exchange_arg.encode()), ("", DLQ, no_args.encode())])
    assert message_count(channel, DLQ) == 0


def test_overflow_the_argument_wins(catalogue, connection, names):
    """Policy p4: max-length 1, overflow reject-publish, DLX to DLQ."""
    drain(catalogue, DLQ)
    ch = connection.channel()
    drop_head, no_arg = names(prefix(4) + "dh"), names(prefix(4) + "none")
    ch.queue_declare(drop_head, arguments={OVERFLOW: "drop-head"})
    ch.queue_declare(no_arg)
    ch.confirm_delivery()
    assert [confirmed(ch, drop_head, b) for b in (b"1", b"2")] == [True, True]
    assert [confirmed(ch, no_arg, b) for b in (b"1", b"2")] == [True, False]
    method, props, body = get_one(ch, DLQ)  # drop-head dead-letters the head through the policy's DLX
    assert (body, deaths(props)[0]["reason"], deaths(props)[0]["queue"]) == (b"1", "maxlen", drop_head)
    assert (drain(ch, drop_head), drain(ch, no_arg)) == ([b"2"], [b"1"])
    assert message_count(ch, DLQ) == 0  # reject-publish dead-letters nothing


def test_highest_priority_policy_wins_whole(catalogue, channel, names):
    """p5 (priority 1): max-length 3 with a DLX; p5-high (priority 5, also matching): only
    max-length 1. Definitions are not merged: under p5-high there is no DLX."""
    drain(catalogue, DLQ)
    high, low = names(prefix(5) + "high-q"), names(prefix(5) + "q")
    channel.queue_declare(high)
    channel.queue_declare(low)
    publish(channel, high, range(3))
    publish(channel, low, range(4))
    assert bodies(get_n(channel, DLQ, 1)) == [b"0"]  # from low
    assert (drain(channel, high), drain(channel, low)) == ([b"2"], [b"1", b"2", b"3"])
    assert message_count(channel, DLQ) == 0


def test_operator_policy_caps_policies_and_arguments(catalogue, channel, names):
    """p7: max-length 5 with operator policy op7: 2 (operator lower); p1: 2 with op1: 3
    (policy lower); an argument lower than both stays."""
    capped, arg_lower, policy_lower = names(prefix(7) + "a"), names(prefix(7) + "b"), names(prefix(1) + "op")
    channel.queue_declare(capped)
    channel.queue_declare(arg_lower, arguments={MAX_LENGTH: 1})
    channel.queue_declare(policy_lower)
    for q in (capped, arg_lower, policy_lower):
        publish(channel, q, range(5))
    assert [drain(channel, q) for q in (capped, arg_lower, policy_lower)] == [[b"3", b"4"], [b"4"], [b"3", b"4"]]


def test_operator_policy_message_ttl_and_expires(catalogue, connection, channel, names):
    dlq = names("dlq")
    channel.queue_declare(dlq)
    ttl, expiring = names(prefix(8) + "ttl"), names(prefix(8) + "exp")
    channel.queue_declare(ttl, arguments={DLX: "", DLRK: dlq, TTL: 60000})
    channel.queue_declare(expiring, arguments={EXPIRES: 60000})
    publish(channel, ttl, ["m"])
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"m", "expired")
    channel.basic_consume(ttl, lambda *a: None)  # keeps it from expiring (operator expires 150)
    wait_until(lambda: not queue_exists(connection, expiring), timeout=5, interval=0.25)
    assert queue_exists(connection, ttl)


def test_exchange_policies_do_not_apply_to_queues(catalogue, channel, names):
    q = names(prefix("x") + "q")
    channel.queue_declare(q)
    publish(channel, q, range(3))
    wait_count(channel, q, 3)


# ------------------------------------------------------------------------------ set on existing queues

def test_max_length_policy_trims_an_existing_queue_and_is_undone(policies, channel, names):
    q, dlq = names("pol-ml"), names("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(q, arguments={DLX: "", DLRK: dlq})
    publish(channel, q, range(1, 6))
    wait_count(channel, q, 5)
    policies.set(names("p"), exact(q), {"max-length": 2})
    got = get_n(channel, dlq, 3)  # applied to what is already there
    assert bodies(got) == [b"1", b"2", b"3"]
    assert {deaths(p)[0]["reason"] for _, p, _ in got} == {"maxlen"}
    assert drain(channel, q) == [b"4", b"5"]
    policies.clear(names("p"))
    publish(channel, q, range(1, 6))
    wait_count(channel, q, 5)  # unbounded again
    assert message_count(channel, dlq) == 0


def test_message_ttl_policy(policies, channel, names):
    """A message's expiry is fixed when it is enqueued: the one already queued keeps none;
    the one published under the policy expires, but only once it reaches the head."""
    q, dlq, ref, ref_dlq = names("pol-ttl"), names("dlq"), names("ref"), names("ref-dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(ref_dlq)
    channel.queue_declare(q, arguments={DLX: "", DLRK: dlq})
    channel.queue_declare(ref, arguments={DLX: "", DLRK: ref_dlq})
    publish(channel, q, ["old"])
    policies.set(names("p"), f"^({re.escape(q)}|{re.escape(ref)})$", {"message-ttl": 50})

    def in_force():  # a message published to ref now expires
        publish(channel, ref, ["probe"])
        time.sleep(0.1)
        return message_count(channel, ref_dlq) > 0

    wait_until(in_force, timeout=10, interval=0)
    publish(channel, q, ["new"])
    time.sleep(0.3)
    # "new" is long expired, but behind "old", which never expires.
    assert (message_count(channel, q), message_count(channel, dlq)) == (2, 0)
    assert channel.basic_get(q, auto_ack=True)[2] == b"old"
    method, props, body = get_one(channel, dlq)
    assert (body, deaths(props)[0]["reason"]) == (b"new", "expired")
    assert message_count(channel, q) == 0
    policies.clear(names("p"))

    def kept():
        publish(channel, q, ["after"])
        time.sleep(0.1)
        return message_count(channel, q) > 0

    wait_until(kept, timeout=10, interval=0)


def test_dead_letter_exchange_policy(policies, channel, names):
    q, dlq = names("pol-dlx"), names("dlq")
    channel.queue_declare(dlq)
    channel.queue_declare(q)

    def reject_one() -> list:
        """Reject a message of q without requeue; what the DLQ got from it, then a marker
        (the passive declare of q orders the dead-lettering before the marker)."""
        publish(channel, q, ["m"])
        method, _, _ = get_one(channel, q, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)
        message_count(channel, q)
        publish(channel, dlq, ["marker"])
        return drain(channel, dlq)

    assert reject_one() == [b"marker"]
    policies.set(names("p"), exact(q), {"dead-letter-exchange": "", "dead-letter-routing-key": dlq})
    wait_until(lambda: reject_one() == [b"m", b"marker"], timeout=10, interval=0.05)
    policies.clear(names("p"))
    wait_until(lambda: reject_one() == [b"marker"], timeout=10, interval=0.05)


def test_expires_policy_deletes_an_unused_queue(policies, connection, channel, names):
    q = names("pol-exp")
    channel.queue_declare(q)
    policies.set(names("p"), exact(q), {"expires": 100})
    wait_until(lambda: not queue_exists(connection, q), timeout=10, interval=0.25)




def test_operator_policy_caps_arguments_and_is_undone(policies, channel, names):
    q, ref = names("pol-op"), names("ref")
    channel.queue_declare(q, arguments={MAX_LENGTH: 3})
    channel.queue_declare(ref, arguments={MAX_LENGTH: 1})
    policies.set_operator(names("op"), f"^({re.escape(q)}|{re.escape(ref)})$", {"max-length": 2})
    wait_max_length(channel, q, 2)
    publish(channel, q, range(5))
    publish(channel, ref, range(5))
    wait_count(channel, q, 2)
    assert (drain(channel, q), drain(channel, ref)) == ([b"3", b"4"], [b"4"])  # the argument 1 stays lower
    policies.clear_operator(names("op"))

    def three_again():
        publish(channel, q, range(5))
        n = message_count(channel, q)
        drain(channel, q)
        return n == 3
    wait_until(three_again, timeout=10, interval=0.05)


@pytest.mark.parametrize("definition", [{"dead-letter-exchange": "x"}, {"overflow": "reject-publish"}])
def test_operator_policy_refuses_other_keys(policies, names, definition):
    r = policies.run("set_operator_policy", names("op"), "^nothing$", json.dumps(definition))
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr
