"""How a queue's arguments, policy and operator policy combine (RabbitMQ 3.10's
args_policy_lookup and merge_policy_value)."""

from warren.broker.policy import Policy
from warren.broker.queue_settings import resolve


def policy(definition: dict, name="p") -> Policy:
    return Policy("/", name, ".*", definition)


def test_arguments_alone():
    s = resolve({"x-message-ttl": 5, "x-max-length": 3, "x-overflow": "reject-publish",
                 "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "k", "x-expires": 100,
                 "x-max-priority": 4, "x-single-active-consumer": True}, None, None)
    assert (s.message_ttl, s.max_length, s.overflow, s.dlx, s.dlrk, s.expires, s.max_priority,
            s.single_active_consumer) == (5, 3, "reject-publish", "dlx", "k", 100, 4, True)
    assert s.limited


def test_defaults():
    s = resolve({}, None, None)
    assert s.overflow == "drop-head" and s.dlx is None and s.message_ttl is None and not s.limited


def test_policy_alone():
    s = resolve({}, policy({"message-ttl": 7, "max-length-bytes": 10, "dead-letter-exchange": "d",
                            "overflow": "reject-publish-dlx", "expires": 9}), None)
    assert (s.message_ttl, s.max_length_bytes, s.dlx, s.overflow, s.expires) == (7, 10, "d", "reject-publish-dlx", 9)


def test_limits_take_the_lower_of_argument_and_policy():
    s = resolve({"x-message-ttl": 50, "x-max-length": 1, "x-expires": 1000},
                policy({"message-ttl": 10, "max-length": 5, "expires": 2000}), None)
    assert (s.message_ttl, s.max_length, s.expires) == (10, 1, 1000)


def test_argument_wins_for_the_others():
    s = resolve({"x-dead-letter-exchange": "arg", "x-overflow": "reject-publish", "x-dead-letter-routing-key": "a"},
                policy({"dead-letter-exchange": "pol", "overflow": "drop-head", "dead-letter-routing-key": "p"}), None)
    assert (s.dlx, s.overflow, s.dlrk) == ("arg", "reject-publish", "a")


def test_operator_policy_caps():
    op = policy({"max-length": 3, "message-ttl": 100}, "op")
    assert resolve({}, policy({"max-length": 10, "message-ttl": 50}), op).max_length == 3
    assert resolve({}, policy({"max-length": 10, "message-ttl": 50}), op).message_ttl == 50
    assert resolve({"x-max-length": 2}, None, op).max_length == 2
    assert resolve({"x-max-length": 20}, None, op).max_length == 3
    assert resolve({}, None, op).max_length == 3


def test_bytes_arguments_are_text():
    s = resolve({"x-dead-letter-exchange": b"dlx", "x-overflow": b"reject-publish"}, None, None)
    assert (s.dlx, s.overflow) == ("dlx", "reject-publish")
