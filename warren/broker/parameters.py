"""Runtime parameters, as RabbitMQ 3.10's rabbit_runtime_parameters with the components its
core registers and no plugin's: per vhost, "vhost-limits" (the vhost's limits, see
warren.broker.limits) and "operator_policy" (warren.broker.policy); "policy" is listed and read
here but set through the policies only; "shovel", the shovel plugin's dynamic shovels
(warren.broker.shovel); and "federation-upstream" and "federation-upstream-set", the
federation plugin's (warren.broker.federation_upstreams). Any other component is refused as
RabbitMQ without its plugin refuses it ("component ... not found"), never stored.

Global parameters take any name and any JSON value; "cluster_name" names the broker (its
announced name is the node's own without it). "internal_cluster_id" is
the broker's permanent id (Prometheus's rabbitmq_cluster_permanent_id), made at the first
start as RabbitMQ makes it and kept with the definitions in the data dir.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from typing import TYPE_CHECKING, Any

from ..amqp.erlang import erl_json, erl_list
from .metadata.change import Change, Operation
from .limits import PARAMETER_NAME, LimitError, validate_vhost_limits, value_json
from .metadata.commands import (CLUSTER_NAME, ClearFederationParameter, ClearGlobalParameter, ClearPolicy,
                                SetFederationParameter, SetGlobalParameter, SetPolicy, SetVHostLimits)
from .policy import Policy, PolicyError
from . import federation_upstreams, shovel

if TYPE_CHECKING:
    from .auth import User
    from .node import Node
    from .vhost import VHost

VHOST_LIMITS = "vhost-limits"
OPERATOR_POLICY = "operator_policy"
POLICY = "policy"
INTERNAL_CLUSTER_ID = "internal_cluster_id"

log = logging.getLogger("warren.definitions")


class ParameterError(ValueError):
    """A parameter RabbitMQ refuses; str() is its text (before the API HTML-escapes it)."""


def _validation_failed(errors: list[str]) -> ParameterError:
    return ParameterError("Validation failed\n\n" + "".join(e + "\n" for e in errors))


def parameter_json(vhost: str, component: str, name: str, value: Any) -> dict:
    """As RabbitMQ's API and definitions show a runtime parameter."""
    return {"value": value, "vhost": vhost, "component": component, "name": name}


def _of_vhost(vhost: VHost, component: str | None) -> list[dict]:
    """The vhost's parameters of a component (None: all but policies, as RabbitMQ lists them)."""
    out = []
    if component in (None, VHOST_LIMITS) and vhost.limits is not None:
        out.append(parameter_json(vhost.name, VHOST_LIMITS, PARAMETER_NAME, value_json(vhost.limits)))
    if component in (None, OPERATOR_POLICY):
        out.extend(p.to_parameter() for p in vhost.operator_policies.values())
    if component == POLICY:
        out.extend(p.to_parameter(POLICY) for p in vhost.policies.values())
    if component in (None, shovel.COMPONENT):
        out.extend(shovel.parameters(vhost))
    for (kind, name), value in vhost.federation.items():
        if component in (None, kind):
            out.append(parameter_json(vhost.name, kind, name, value))
    return out


def listed(broker: Node, component: str | None = None, vhost: VHost | None = None) -> list[dict]:
    """GET /api/parameters[/component[/vhost]]: an unknown component has none."""
    vhosts = [vhost] if vhost is not None else list(broker.vhosts.values())
    return [p for v in vhosts for p in _of_vhost(v, component)]


def lookup(vhost: VHost, component: str, name: str) -> dict | None:
    for p in _of_vhost(vhost, component):
        if p["name"] == name:
            return p
    return None


@Operation
def set_parameter(broker: Node, vhost: VHost, component: str, name: str, value: Any, user: User | None = None) -> Change[bool]:
    """Set a runtime parameter (validated as RabbitMQ validates it); True if it is new.
    `user`: who sets it (a shovel's URIs must name vhosts it may use); None: unchecked (an
    import, the control socket), as RabbitMQ's internal user."""
    if component == POLICY:
        raise ParameterError("policies may not be set using this method")
    if component == VHOST_LIMITS:
        try:
            limits = validate_vhost_limits(value)
        except LimitError as err:
            raise _validation_failed(err.errors) from None
        if name != PARAMETER_NAME:
            # RabbitMQ stores it, then fails (500) and never reads it: refused here.
            raise _validation_failed([f"vhost limits must be named '{PARAMETER_NAME}', not '{name}'"])
        return (yield SetVHostLimits(vhost.name, limits))
    if component == OPERATOR_POLICY:
        return (yield SetPolicy(_operator_policy(vhost, name, value), operator=True))
    if component == shovel.COMPONENT:
        try:
            return (yield from shovel.set_shovel.change(broker, vhost, name, value, user))
        except shovel.ShovelError as err:
            raise _validation_failed(err.errors) from None
    if component == federation_upstreams.FEDERATION:
        # (the plugin registers it, for its status, and takes no parameter in it)
        raise _validation_failed([f'name not recognised: <<"{name}">>'])
    if component in federation_upstreams.COMPONENTS:
        try:
            federation_upstreams.validate(component, name, value, broker.config.node_name)
        except federation_upstreams.UpstreamError as err:
            raise _validation_failed(err.errors) from None
        return (yield SetFederationParameter(vhost.name, component, name, value))
    raise _validation_failed([f"component {component} not found"])


@Operation
def clear_parameter(broker: Node, vhost: VHost, component: str, name: str) -> Change[bool]:
    """Remove a runtime parameter; False if there is none."""
    if component == VHOST_LIMITS:
        if name != PARAMETER_NAME or vhost.limits is None:
            return False
        (yield SetVHostLimits(vhost.name, None))
        return True
    if component == OPERATOR_POLICY:
        return (yield ClearPolicy(vhost.name, name, operator=True))
    if component == shovel.COMPONENT:
        return (yield from shovel.clear_shovel.change(broker, vhost, name))
    if component in federation_upstreams.COMPONENTS:
        return (yield ClearFederationParameter(vhost.name, component, name))
    if component == POLICY and name in vhost.policies:
        # RabbitMQ fails with a 500 and keeps the policy; refused with a reason here.
        raise ParameterError("policies may not be cleared using this method")
    return False


# An operator policy's keys as rabbit_policy's policy_validation() lists them, reversed (the
# order its errors come in), each with a valid stand-in for checking the others alone.
_POLICY_KEYS = (("definition", True, {"max-length": 1}), ("apply-to", False, "all"), ("pattern", True, ""),
                ("priority", True, 0))


def _operator_policy(vhost: VHost, name: str, value: Any) -> Policy:
    """An operator policy from a parameter value: pattern, definition and priority mandatory,
    apply-to optional, nothing else (rabbit_parameter_validation:proplist)."""
    if isinstance(value, dict):
        rest = [(k, v) for k, v in sorted(value.items()) if k not in {key for key, _, _ in _POLICY_KEYS}]
    elif isinstance(value, list):
        rest, value = list(value), {}
    else:
        raise _validation_failed([f"{name} not a list {erl_json(value)}"])
    if rest:
        terms = [("{" + erl_json(t[0]) + "," + erl_json(t[1]) + "}") if isinstance(t, tuple) else erl_json(t)
                 for t in rest]
        raise _validation_failed([f"Unrecognised terms {erl_list(terms)} in {name}"])
    fields = {key: value.get(key, stand_in) for key, _, stand_in in _POLICY_KEYS}
    errors: list[str] = []
    for key, mandatory, stand_in in _POLICY_KEYS:
        if key not in value:
            if mandatory:
                errors.append(f'Key "{key}" not found in {name}')
            continue
        alone = {k: (fields[k] if k == key else s) for k, _, s in _POLICY_KEYS}
        try:
            Policy.validated(vhost.name, name, alone["pattern"], alone["definition"], alone["priority"],
                             alone["apply-to"], operator=True)
        except PolicyError as err:
            errors.extend(err.errors)
    if errors:
        raise _validation_failed(errors)
    return Policy(vhost.name, name, fields["pattern"], fields["definition"], fields["priority"], fields["apply-to"])


# ------------------------------------------------------------------ global parameters
def global_parameters(broker: Node) -> dict[str, Any]:
    """name -> value, cluster_name included once it is set."""
    return dict(broker.global_parameters)


@Operation
def set_global(broker: Node, name: str, value: Any) -> Change[bool]:
    """Set a global parameter; True if it is new."""
    if name == CLUSTER_NAME:
        if not isinstance(value, str):
            # RabbitMQ stores it and then accepts no more AMQP connections; refused here.
            raise ParameterError("cluster_name must be a string")
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate: it could not go out in server properties
            raise ParameterError("cluster_name must be valid unicode") from None
    return (yield SetGlobalParameter(name, value))


@Operation
def clear_global(broker: Node, name: str) -> Change[bool]:
    return (yield ClearGlobalParameter(name))


def permanent_cluster_id(broker: Node) -> str:
    """The internal_cluster_id global parameter, made if there is none (rabbit_nodes:
    persistent_cluster_id at boot and at each read): "rabbitmq-cluster-id-" and 16 random
    bytes in unpadded base64url. An import or PUT may replace it (as in RabbitMQ); a value that
    is not a string is given as its JSON."""
    if INTERNAL_CLUSTER_ID in broker.global_parameters:
        value = broker.global_parameters[INTERNAL_CLUSTER_ID]
    else:
        command = new_cluster_id_command()
        value = command.value
        log.info("Initialising internal cluster ID to '%s'", value)
        broker.metadata.submit(command)  # (a cluster member's goes through the cluster's log)
    return value if isinstance(value, str) else json.dumps(value)


def new_cluster_id_command() -> SetGlobalParameter:
    return SetGlobalParameter(INTERNAL_CLUSTER_ID, "rabbitmq-cluster-id-" + base64.urlsafe_b64encode(
        secrets.token_bytes(16)).rstrip(b"=").decode())
