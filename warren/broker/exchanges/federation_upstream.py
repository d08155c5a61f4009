"""The federation plugin's upstream exchange type (`x-federation-upstream`,
rabbit_federation_upstream_exchange): the internal exchange a downstream's exchange link
declares on its upstream, bound to the link's queue. It routes as a fanout, except a message
that has made x-max-hops hops already, or has been through the downstream (its cluster name
and vhost are in the message's x-received-from), goes nowhere."""

from ...amqp.codec import table_type_name
from ..errors import precondition_failed
from .fanout import FanoutExchange
from ..federation_headers import should_forward

MAX_HOPS = "x-max-hops"
DOWNSTREAM_NAME = "x-downstream-name"
DOWNSTREAM_VHOST = "x-downstream-vhost"


class FederationUpstreamExchange(FanoutExchange):
    type_name = "x-federation-upstream"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        max_hops = self.arguments.get(MAX_HOPS)
        # rabbit_federation_util:validate_arg: a long, and it must be there.
        if MAX_HOPS not in self.arguments:
            raise precondition_failed(f"Argument {MAX_HOPS} missing")
        if isinstance(max_hops, bool) or not isinstance(max_hops, int) or table_type_name(max_hops) != "long":
            raise precondition_failed(f"Argument {MAX_HOPS} must be of type long")
        self.max_hops = int(max_hops)
        name, vhost = self.arguments.get(DOWNSTREAM_NAME), self.arguments.get(DOWNSTREAM_VHOST)
        self.downstream = (name if isinstance(name, str) else None, vhost if isinstance(vhost, str) else None)

    def match(self, routing_key, message):
        if should_forward(message.headers, self.max_hops, *self.downstream):
            return super().match(routing_key, message)
        return ()
