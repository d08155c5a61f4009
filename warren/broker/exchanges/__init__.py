"""Exchange types, one module each."""

from .base import Binding, Exchange
from .direct import DefaultExchange, DirectExchange
from .fanout import FanoutExchange
from .headers import HeadersExchange
from .topic import TopicExchange

TYPES = {cls.type_name: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)}

__all__ = ["Binding", "Exchange", "DefaultExchange", "DirectExchange", "FanoutExchange",
           "HeadersExchange", "TopicExchange", "TYPES"]
