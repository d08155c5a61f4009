"""Federation upstreams: the "federation-upstream" and "federation-upstream-set" runtime
parameters (rabbit_federation_parameters' validation, with its texts), and which upstreams a
policy's federation keys (warren.broker.policy) give an exchange or a queue
(rabbit_federation_upstream:for, a set element's keys overriding its upstream's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..amqp.erlang import erl_json
from ..amqp.uri import FEDERATION_CALLER, Direct, UriError, parse as parse_uri
from .parameter_validation import binary, boolean, enum, invalid_uri, number, proplist

if TYPE_CHECKING:
    from .vhost import VHost

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
COMPONENTS = (UPSTREAM, UPSTREAM_SET)
FEDERATION = "federation"  # a component the plugin registers that takes no parameter
DEFAULT_PREFETCH = 1000  # rabbit_federation.hrl ?DEF_PREFETCH
DIRECT_REFUSED = "names this broker (no host): Warren's federation links need an upstream on another broker"


class UpstreamError(ValueError):
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


def _uri(key, value, node: str = "nonode@nohost"):
    """rabbit_federation_parameters:validate_uri: a URI or a list of them (amqp_uri's texts);
    Warren refuses a URI without a host (RabbitMQ's direct connection to itself)."""
    if isinstance(value, list):
        for item in value:
            error = _uri(key, item, node)
            if error:
                return error
        return None
    if not isinstance(value, str):  # (validate_uri takes a non-binary for a list)
        return f"{key} should be list, actually was {erl_json(value)}"
    try:
        endpoint = parse_uri(value, node=node)
    except UriError as err:
        return invalid_uri(value, err.reason, caller=FEDERATION_CALLER)
    if isinstance(endpoint, Direct):
        return f'"{value}" {DIRECT_REFUSED}'
    return None


_SHARED = [
    ("exchange", binary, False),
    ("queue", binary, False),
    ("consumer-tag", binary, False),
    ("prefetch-count", number, False),
    ("reconnect-delay", number, False),
    ("max-hops", number, False),
    ("expires", number, False),
    ("message-ttl", number, False),
    ("trust-user-id", boolean, False),
    ("ack-mode", enum(("no-ack", "on-publish", "on-confirm")), False),
    ("resource-cleanup-mode", enum(("default", "never")), False),
    ("ha-policy", binary, False),
    ("bind-nowait", boolean, False),
    ("channel-use-mode", enum(("multiple", "single")), False),
]


def validate(component: str, name: str, value: Any, node: str = "nonode@nohost") -> None:
    """UpstreamError with RabbitMQ's texts, in its order (`node`: this node's name, which
    some of amqp_uri's errors print)."""
    if component == UPSTREAM:
        errors = proplist(name, [("uri", lambda k, v: _uri(k, v, node), True), *_SHARED], value)
    else:
        if not isinstance(value, list):
            raise UpstreamError([f"{name} not a list {erl_json(value)}"])
        errors = [e for element in value
                  for e in proplist(name, [("upstream", binary, True), *_SHARED], element)]
    if errors:
        raise UpstreamError(errors)


@dataclass(frozen=True)
class Upstream:
    """One upstream as it applies to an exchange or queue (#upstream{})."""

    name: str
    uris: tuple[str, ...]
    exchange_name: str
    queue_name: str
    consumer_tag: str
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay: float = 5
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None
    trust_user_id: bool = False
    ack_mode: str = "on-confirm"
    ha_policy: str | None = None
    bind_nowait: bool = False
    resource_cleanup_mode: str = "default"
    channel_use_mode: str = "multiple"


def upstreams_for(vhost: VHost, definition: dict | None, name: str) -> list[Upstream]:
    """The upstreams a policy's definition federates the exchange or queue `name` with:
    one named, a set's (or "all"), or those whose names match a pattern; an upstream that
    does not exist is skipped (rabbit_federation_upstream:for)."""
    if not definition:
        return []
    params = vhost.federation
    upstreams = {n: v for (component, n), v in params.items() if component == UPSTREAM}
    if "federation-upstream" in definition:
        elements = [{"upstream": definition["federation-upstream"]}]
    elif "federation-upstream-set" in definition:
        set_name = definition["federation-upstream-set"]
        if set_name == "all":
            elements = [{"upstream": n} for n in upstreams]
        else:
            found = params.get((UPSTREAM_SET, set_name))
            elements = list(found) if isinstance(found, list) else []
    elif "federation-upstream-pattern" in definition:
        pattern = re.compile(definition["federation-upstream-pattern"])
        elements = [{"upstream": n} for n in upstreams if pattern.search(n)]
    else:
        return []
    out = []
    for element in elements:
        upstream_name = element.get("upstream") if isinstance(element, dict) else None
        value = upstreams.get(upstream_name) if isinstance(upstream_name, str) else None
        if value is None:
            continue
        assert isinstance(upstream_name, str)
        out.append(_merge(upstream_name, element, value, name))
    return out


def _merge(upstream_name: str, element: dict, value: dict, name: str) -> Upstream:
    def get(key: str, default: Any = None) -> Any:
        return element.get(key, value.get(key, default))
    uri = get("uri")
    return Upstream(
        name=upstream_name, uris=tuple(uri) if isinstance(uri, list) else (uri,),
        exchange_name=get("exchange", name), queue_name=get("queue", name),
        consumer_tag=get("consumer-tag", f"federation-link-{upstream_name}"),
        prefetch_count=get("prefetch-count", DEFAULT_PREFETCH), reconnect_delay=get("reconnect-delay", 5),
        max_hops=get("max-hops", 1), expires=get("expires"), message_ttl=get("message-ttl"),
        trust_user_id=get("trust-user-id", False), ack_mode=get("ack-mode", "on-confirm"),
        ha_policy=get("ha-policy"), bind_nowait=get("bind-nowait", False),
        resource_cleanup_mode=get("resource-cleanup-mode", "default"),
        channel_use_mode=get("channel-use-mode", "multiple"))
