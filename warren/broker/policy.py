"""Policies and operator policies: named (pattern, definition, priority, apply-to) rules of a
vhost, validated as RabbitMQ 3.10 validates them.

A vhost keeps them in `vhost.policies` and `vhost.operator_policies` (name -> Policy). Each
exchange and queue points at the policy that applies to it (`.policy`, and for queues also
`.operator_policy`): the matching one with the highest priority, the lowest name on a tie.
The alternate exchange reads it (Exchange.alternate_exchange); a queue resolves the other
keys with its arguments (warren.broker.queue_settings) whenever a policy changes.
"""

import re

from ..amqp.erlang import erl_json

# Keys an operator policy may set (RabbitMQ 3.10's operator_policy_validator registry).
OPERATOR_KEYS = frozenset({"expires", "message-ttl", "max-length", "max-length-bytes",
                           "max-in-memory-length", "max-in-memory-bytes", "delivery-limit"})
APPLY_TO = ("exchanges", "queues", "all")
# Keys whose operator-policy value caps the policy's (rabbit_policies:merge_policy_value): the
# lower of the two; for any other key both set, the operator policy's.
MERGED_BY_MIN = frozenset({"message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
                           "max-in-memory-bytes", "expires", "delivery-limit"})
_HA_DEPENDENT = ("ha-params", "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure",
                 "ha-sync-batch-size")


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; str() is RabbitMQ's "Validation failed" text."""

    def __init__(self, errors: list):
        self.errors = errors
        super().__init__("Validation failed\n\n" + "".join(e + "\n" for e in errors))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_at_least(minimum, what):
    def check(v):
        return None if _is_int(v) and v >= minimum else f"{erl_json(v)} is not a valid {what}"
    return check


def _binary(what):
    def check(v):
        return None if isinstance(v, str) else f"{erl_json(v)} is not a valid {what}"
    return check


def _one_of(values, text):
    def check(v):
        return None if v in values and not isinstance(v, bool) else text.format(erl_json(v))
    return check


# RabbitMQ 3.10's policy validators (key -> check returning an error text or None).
_VALIDATORS = {
    "alternate-exchange": _binary("alternate exchange name"),
    "dead-letter-exchange": _binary("dead letter exchange name"),
    "dead-letter-routing-key": _binary("dead letter routing key"),
    "dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), "{} is not a valid dead letter strategy"),
    "message-ttl": _int_at_least(0, "message TTL"),
    "expires": _int_at_least(1, "queue expiry"),
    "max-length": _int_at_least(0, "maximum length"),
    "max-length-bytes": _int_at_least(0, "maximum length in bytes"),
    "max-in-memory-length": _int_at_least(0, "maximum memory in bytes"),
    "max-in-memory-bytes": _int_at_least(0, "maximum memory in bytes"),
    "delivery-limit": _int_at_least(0, "delivery limit"),
    "queue-mode": _one_of(("default", "lazy"), "{} is not a valid queue-mode value"),
    "queue-version": _one_of((1, 2), "{} is not a valid queue-version value"),
    "overflow": _one_of(("drop-head", "reject-publish", "reject-publish-dlx"), "{} is not a valid overflow value"),
    "queue-master-locator": _one_of(("min-masters", "client-local", "random"),
                                    "{} invalid queue-master-locator value"),
    "queue-leader-locator": _one_of(("client-local", "balanced"), "{} is not a valid queue leader locator value"),
    "max-age": _binary("max age"),
    "stream-max-segment-size-bytes": _int_at_least(0, "segment size"),
    "ha-mode": _one_of(("all", "exactly", "nodes"), "{} is not a valid ha-mode value"),
    "ha-params": lambda v: None,
    "ha-sync-mode": _one_of(("manual", "automatic"), "{} is not a valid ha-sync-mode value"),
    "ha-sync-batch-size": _int_at_least(1, "ha-sync-batch-size value"),
    "ha-promote-on-shutdown": _one_of(("when-synced", "always"), "{} is not a valid ha-promote-on-shutdown value"),
    "ha-promote-on-failure": _one_of(("when-synced", "always"), "{} is not a valid ha-promote-on-failure value"),
}


def _definition_error(definition, operator: bool):
    """The first error RabbitMQ reports for a policy definition, or None."""
    if not isinstance(definition, dict):
        return f"definition must be a JSON object, not {erl_json(definition)}"
    if not definition:
        return "no policy provided"
    allowed = OPERATOR_KEYS if operator else _VALIDATORS
    # Known keys first (in key order, the first error only), then the unknown ones together.
    for key in sorted(definition):
        if key in allowed:
            err = _VALIDATORS[key](definition[key])
            if err:
                return err
    if not operator and any(k in definition for k in _HA_DEPENDENT) and "ha-mode" not in definition:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    unknown = sorted(k for k in definition if k not in allowed)
    if unknown:
        items = ",".join(f"{{{erl_json(k)},{erl_json(definition[k])}}}" for k in unknown)
        return f"[{items}] are not recognised policy settings"
    return None


class Policy:
    __slots__ = ("vhost", "name", "pattern", "definition", "priority", "apply_to", "regex")

    def __init__(self, vhost: str, name: str, pattern: str, definition: dict, priority=0, apply_to="all"):
        self.vhost = vhost
        self.name = name
        self.pattern = pattern
        self.definition = definition
        self.priority = priority
        self.apply_to = apply_to
        self.regex = re.compile(pattern)

    @classmethod
    def validated(cls, vhost: str, name: str, pattern, definition, priority=0, apply_to="all",
                  operator: bool = False) -> "Policy":
        """A policy from its JSON fields, or PolicyError with every problem RabbitMQ reports
        (in its order: definition, apply-to, pattern, priority)."""
        errors = []
        err = _definition_error(definition, operator)
        if err:
            errors.append(err)
        if apply_to not in APPLY_TO:
            shown = apply_to if isinstance(apply_to, str) else erl_json(apply_to)
            errors.append(f"apply-to '{shown}' unrecognised; should be 'queues', 'exchanges' or 'all'")
        if not isinstance(pattern, str):
            errors.append(f"pattern should be a binary but was {erl_json(pattern)}")
        else:
            try:
                re.compile(pattern)
            except re.error as e:
                errors.append(f'pattern should be regular expression but is invalid: {{"{e.msg}",{e.pos or 0}}}')
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            errors.append(f"priority should be a number, actually was {erl_json(priority)}")
        if errors:
            raise PolicyError(errors)
        return cls(vhost, name, pattern, definition, priority, apply_to)

    def applies_to(self, kind: str, name: str) -> bool:
        """kind: "exchange" or "queue"."""
        if self.apply_to != "all" and self.apply_to != kind + "s":
            return False
        return self.regex.search(name) is not None

    def to_json(self) -> dict:
        """As RabbitMQ's API and definitions show a policy."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": self.definition, "priority": self.priority}

    def to_parameter(self, component: str = "operator_policy") -> dict:
        """As RabbitMQ exports an operator policy: a runtime parameter."""
        return {"value": {"pattern": self.pattern, "definition": self.definition, "priority": self.priority,
                          "apply-to": self.apply_to},
                "vhost": self.vhost, "component": component, "name": self.name}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lower(a, b):
    """Erlang's min/2 as RabbitMQ applies it to limits: a number is below every other term."""
    if _is_number(a) and _is_number(b):
        return min(a, b)
    return a if _is_number(a) else b


def policy_value(key: str, policy, operator_policy):
    """rabbit_policy:get: a key's value from a queue's policy and operator policy (either may
    be None), the operator policy capping a limit."""
    value = policy.definition.get(key) if policy is not None else None
    op_value = operator_policy.definition.get(key) if operator_policy is not None else None
    if op_value is None:
        return value
    if value is None or key not in MERGED_BY_MIN:
        return op_value
    return lower(value, op_value)


def effective_definition(policy, operator_policy) -> dict:
    """The merged definition the management API shows as effective_policy_definition."""
    keys = {**(policy.definition if policy is not None else {}),
            **(operator_policy.definition if operator_policy is not None else {})}
    return {key: policy_value(key, policy, operator_policy) for key in keys}


def best(policies: dict, kind: str, name: str, keys: frozenset[str] | None = None):
    """The policy of `policies` (name -> Policy) that applies to an exchange or queue, or None.
    With `keys` (a queue type's policy keys, rabbit_policy:match_all's is_applicable), a policy
    with any other key does not apply at all: the next one is taken."""
    found = None
    for policy in policies.values():
        if policy.applies_to(kind, name) and (keys is None or keys.issuperset(policy.definition)):
            if found is None or policy.priority > found.priority or (
                    policy.priority == found.priority and policy.name < found.name):
                found = policy
    return found


def apply_to_exchange(vhost, exchange) -> None:
    exchange.policy = best(vhost.policies, "exchange", exchange.name) if vhost.policies else None


def apply_to_queue(vhost, queue) -> None:
    keys = queue.POLICY_KEYS
    queue.policy = best(vhost.policies, "queue", queue.name, keys) if vhost.policies else None
    queue.operator_policy = (best(vhost.operator_policies, "queue", queue.name, keys)
                             if vhost.operator_policies else None)


def apply_all(vhost) -> None:
    """Point every exchange and queue of the vhost at its policy again (after a change)."""
    for x in vhost.exchanges.values():
        apply_to_exchange(vhost, x)
    for q in list(vhost.queues.values()):  # (applying may expire or delete one)
        apply_to_queue(vhost, q)
        q.apply_settings()


def set_policy(vhost, policy: Policy, operator: bool = False) -> bool:
    """Add or replace a policy; returns True if it is new."""
    table = vhost.operator_policies if operator else vhost.policies
    created = policy.name not in table
    table[policy.name] = policy
    apply_all(vhost)
    if vhost.broker is not None:
        vhost.broker.mark_definitions_changed("operator_policy" if operator else "policy", (vhost.name, policy.name))
    return created


def clear_policy(vhost, name: str, operator: bool = False) -> bool:
    table = vhost.operator_policies if operator else vhost.policies
    if table.pop(name, None) is None:
        return False
    apply_all(vhost)
    if vhost.broker is not None:
        vhost.broker.mark_definitions_changed("operator_policy" if operator else "policy", (vhost.name, name))
    return True
