"""Exchange types, one module each."""

from .base import Binding, Exchange
from .consistent_hash import ConsistentHashExchange
from .direct import DefaultExchange, DirectExchange
from .fanout import FanoutExchange
from .federation_upstream import FederationUpstreamExchange
from .headers import HeadersExchange
from .topic import TopicExchange

TYPES = {cls.type_name: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange,
                                        ConsistentHashExchange, FederationUpstreamExchange)}

__all__ = ["Binding", "Exchange", "ConsistentHashExchange", "DefaultExchange", "DirectExchange", "FanoutExchange", "FederationUpstreamExchange",
           "HeadersExchange", "TopicExchange", "TYPES"]
