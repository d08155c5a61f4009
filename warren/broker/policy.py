"""Policies and operator policies: named (pattern, definition, priority, apply-to) rules of a
vhost, validated as RabbitMQ 3.10 validates them.

A vhost keeps them in `vhost.policies` and `vhost.operator_policies` (name -> Policy). Each
exchange and queue points at the policy that applies to it (`.policy`, and for queues also
`.operator_policy`): the matching one with the highest priority, the lowest name on a tie.
The alternate exchange reads it (Exchange.alternate_exchange); a queue resolves the other
keys with its arguments (warren.broker.queue_settings) whenever a policy changes.
"""

import re
from typing import Any, Callable

from ..amqp.erlang import Atom, erl_format, erl_json, erl_string, erl_text
from .stream_offsets import max_age_ms

APPLY_TO = ("exchanges", "queues", "all")
# Keys whose operator-policy value caps the policy's (rabbit_policies:merge_policy_value): the
# lower of the two; for any other key both set, the operator policy's.
MERGED_BY_MIN = frozenset({"message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
                           "max-in-memory-bytes", "expires", "delivery-limit"})
# The largest stream-max-segment-size-bytes (RabbitMQ's ?MAX_STREAM_MAX_SEGMENT_SIZE).
MAX_SEGMENT_SIZE = 3_000_000_000


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; str() is RabbitMQ's "Validation failed" text."""

    def __init__(self, errors: list):
        self.errors = errors
        super().__init__("Validation failed\n\n" + "".join(e + "\n" for e in errors))


def _text(fmt: str, *values: Any) -> str:
    """RabbitMQ's error text: the values as ~p lays them out, as its HTTP replies show them."""
    return erl_text(erl_format(fmt, *values))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# A check takes a key's value and returns RabbitMQ's error text, or None.
Check = Callable[[Any], str | None]


def _int_in(minimum: int, maximum: float, what: str) -> Check:
    def check(v):
        return None if _is_int(v) and minimum <= v <= maximum else _text(f"~p is not a valid {what}", v)
    return check


def _binary(what: str) -> Check:
    def check(v):
        return None if isinstance(v, str) else _text(f"~p is not a valid {what}", v)
    return check


def _one_of(values: tuple, fmt: str) -> Check:
    """One of some strings or integers (not a float or a boolean equal to one)."""
    def check(v):
        valid = type(v) in (str, int) and v in values
        return None if valid else _text(fmt, v)
    return check


def _max_age(v) -> str | None:
    # RabbitMQ also takes a list of strings and bytes (Erlang iodata) here, and its streams
    # then fail on it; a value that does not start with a digit it fails on at once: both
    # refused here, with its text.
    valid = isinstance(v, str) and max_age_ms(v) is not None
    return None if valid else _text("~p is not a valid max age", v)


INFINITY = float("inf")

# rabbit_policies' validators (key -> check), the keys of rabbit_policies:register/0.
_POLICIES: dict[str, Check] = {
    "alternate-exchange": _binary("alternate exchange name"),
    "dead-letter-exchange": _binary("dead letter exchange name"),
    "dead-letter-routing-key": _binary("dead letter routing key"),
    "dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), "~p is not a valid dead letter strategy"),
    "message-ttl": _int_in(0, INFINITY, "message TTL"),
    "expires": _int_in(1, INFINITY, "queue expiry"),
    "max-length": _int_in(0, INFINITY, "maximum length"),
    "max-length-bytes": _int_in(0, INFINITY, "maximum length in bytes"),
    "max-in-memory-length": _int_in(0, INFINITY, "maximum memory in bytes"),
    "max-in-memory-bytes": _int_in(0, INFINITY, "maximum memory in bytes"),
    "queue-mode": _one_of(("default", "lazy"), "~p is not a valid queue-mode value"),
    "queue-version": _one_of((1, 2), "~p is not a valid queue-version value"),
    "overflow": _one_of(("drop-head", "reject-publish", "reject-publish-dlx"), "~p is not a valid overflow value"),
    "delivery-limit": _int_in(0, INFINITY, "delivery limit"),
    "max-age": _max_age,
    # "random" and "least-leaders" are the deprecated names of "balanced".
    "queue-leader-locator": _one_of(("client-local", "balanced", "random", "least-leaders"),
                                    "~p is not a valid queue leader locator value"),
    "initial-cluster-size": _int_in(0, INFINITY, "cluster size"),
    "stream-max-segment-size-bytes": _int_in(0, MAX_SEGMENT_SIZE, "segment size"),
}

# Keys an operator policy may set (rabbit_policies' operator_policy_validator registry).
OPERATOR_KEYS = frozenset({"expires", "message-ttl", "max-length", "max-length-bytes",
                           "max-in-memory-length", "max-in-memory-bytes", "delivery-limit"})


def _iodata(v) -> bytes | None:
    """A JSON list as Erlang's list_to_binary/1 takes it (strings and bytes, nested), or None."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if _is_int(v) and 0 <= v <= 255:
        return bytes((v,))
    if isinstance(v, list):
        parts = [_iodata(item) for item in v]
        return None if any(p is None for p in parts) else b"".join(p for p in parts if p is not None)
    return None


_MASTER_LOCATORS = (b"min-masters", b"client-local", b"random")


def _master_locator(definition: dict) -> str | None:
    """rabbit_queue_location_validator: a strategy's name, also as a list of its pieces (which
    RabbitMQ joins) or a term that names none (true, 5: invalid). A float or an object would
    never return there (it loops): refused here."""
    v = definition["queue-master-locator"]
    if isinstance(v, bool) or v is None:
        name: bytes | None = b"true" if v is True else b"false" if v is False else b"null"
    elif _is_int(v):
        name = str(v).encode()
    elif isinstance(v, (str, list)):
        name = _iodata(v)
    else:
        name = None
    return None if name in _MASTER_LOCATORS else _text("~p invalid queue-master-locator value", v)


_HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
            "ha-promote-on-failure")
_NONE = Atom("none")  # a key the definition does not have, as rabbit_mirror_queue_misc shows it


def _ha_params(mode: str, params) -> str | None:
    """The ha-params a mode takes (rabbit_mirror_queue_mode_*:validate_policy/1)."""
    if mode == "all":
        return None if params is _NONE else 'ha-mode="all" does not take parameters'
    if mode == "exactly":
        return None if _is_int(params) and params > 0 else _text('ha-mode="exactly" takes an integer, ~p given',
                                                                 params)
    if params == []:
        return 'ha-mode="nodes" list must be non-empty'
    if not isinstance(params, list):
        return _text('ha-mode="nodes" takes a list, ~p given', params)
    invalid = [node for node in params if not isinstance(node, str)]
    return _text('ha-mode="nodes" takes a list of strings, ~p was not a string', invalid) if invalid else None


def _either(allowed: tuple[str, ...], fmt: str) -> Check:
    return lambda v: None if isinstance(v, str) and v in allowed else _text(fmt, v)


# The keys rabbit_mirror_queue_misc checks after ha-mode and ha-params, in its order.
_HA_CHECKS: tuple[tuple[str, Check], ...] = (
    ("ha-sync-mode", _either(("manual", "automatic"), 'ha-sync-mode must be "manual" or "automatic", got ~p')),
    ("ha-sync-batch-size", lambda v: None if _is_int(v) and v > 0
     else _text("ha-sync-batch-size takes an integer greater than 0, ~p given", v)),
    ("ha-promote-on-shutdown", _either(("always", "when-synced"),
                                       'ha-promote-on-shutdown must be "always" or "when-synced", got ~p')),
    ("ha-promote-on-failure", _either(("always", "when-synced"),
                                      'ha-promote-on-failure must be "always" or "when-synced", got ~p')),
)


def _mirroring(definition: dict) -> str | None:
    """rabbit_mirror_queue_misc:validate_policy/1: ha-mode first (one that is not a string,
    which fails RabbitMQ's validator, is refused as an unknown mode), then its ha-params, then
    the other keys."""
    mode = definition.get("ha-mode", _NONE)
    if mode is _NONE:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    if not isinstance(mode, str) or mode not in ("all", "exactly", "nodes"):
        return _text("~p is not a valid ha-mode value", mode)
    err = _ha_params(mode, definition.get("ha-params", _NONE))
    for key, check in _HA_CHECKS:
        if err:
            break
        if key in definition:
            err = check(definition[key])
    return err


# Python's re errors as Erlang's re (PCRE 8) words them: {Message, Offset}.
_PCRE_MESSAGES = (("missing ), unterminated subpattern", "missing )", True),
                  ("unterminated character set", "missing terminating ] for character class", True),
                  ("unbalanced parenthesis", "unmatched parentheses", False),
                  ("nothing to repeat", "nothing to repeat", False))


def _pcre_error(err: re.error, pattern: str) -> str:
    for python, pcre, at_end in _PCRE_MESSAGES:
        if err.msg.startswith(python):
            offset = len(pattern.encode()) if at_end else (err.pos or 0)
            return "{" + erl_string(pcre) + f",{offset}}}"
    return "{" + erl_string(err.msg) + f",{err.pos or 0}}}"


# The federation plugin's keys (rabbit_federation_parameters): which upstreams federate an
# exchange or queue (warren.broker.federation_upstreams).
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


def _federation(definition: dict) -> str | None:
    """rabbit_federation_parameters:validate_policy: one of the keys, a string (a pattern
    that compiles)."""
    keys = [k for k in FEDERATION_KEYS if k in definition]
    if len(keys) >= 2:
        return ("cannot specify federation-upstream, federation-upstream-set "
                "or federation-upstream-pattern together")
    key = keys[0]
    value = definition[key]
    what = {"federation-upstream": "name", "federation-upstream-set": "set name",
            "federation-upstream-pattern": "pattern name"}[key]
    if not isinstance(value, str):
        return f"{erl_json(value)} is not a valid federation upstream {what}"
    if key == "federation-upstream-pattern":
        try:
            re.compile(value)
        except re.error as err:
            return (f"could not compile pattern {value} to a regular expression. "
                    f"Error: {_pcre_error(err, value)}")
    return None


def _each_key(checks: dict[str, Check]) -> Callable[[dict], str | None]:
    """rabbit_policies:validate_policy/1: its keys in order, the first error."""
    def validate(definition: dict) -> str | None:
        for key in sorted(definition):
            if key in checks:
                err = checks[key](definition[key])
                if err:
                    return err
        return None
    return validate


# The validating modules with their keys, in the order rabbit_policy:validation0/2 runs them
# (checked on RabbitMQ 3.10.8): each is given the definition's keys it registered; the first
# error stops the validation; keys none of them registered are refused together after.
_VALIDATORS: tuple[tuple[frozenset[str], Callable[[dict], str | None]], ...] = (
    (frozenset({"queue-master-locator"}), _master_locator),
    (frozenset(_POLICIES), _each_key(_POLICIES)),
    (frozenset(_HA_KEYS), _mirroring),
    (frozenset(FEDERATION_KEYS), _federation),
)
_OPERATOR_VALIDATORS = ((OPERATOR_KEYS, _each_key({k: _POLICIES[k] for k in OPERATOR_KEYS})),)


def _definition_error(definition, operator: bool) -> str | None:
    """The error RabbitMQ reports for a policy definition, or None."""
    if not isinstance(definition, dict):
        # (RabbitMQ fails on one with a 500 and no text.)
        return f"definition must be a JSON object, not {erl_json(definition)}"
    if not definition:
        return "no policy provided"
    validators = _OPERATOR_VALIDATORS if operator else _VALIDATORS
    known: set[str] = set()
    for keys, validate in validators:
        scope = {k: v for k, v in definition.items() if k in keys}
        known.update(scope)
        if scope:
            err = validate(scope)
            if err:
                return err
    unknown = [(k, definition[k]) for k in sorted(definition) if k not in known]
    if unknown:
        return _text("~p are not recognised policy settings", unknown)
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
        """As RabbitMQ exports an operator policy: a runtime parameter (its value's keys in the
        order RabbitMQ keeps them after an import or a PUT)."""
        return {"value": {"apply-to": self.apply_to, "definition": self.definition, "pattern": self.pattern,
                          "priority": self.priority},
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
    keys = queue.CAPABILITIES.policy_keys
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
