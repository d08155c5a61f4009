"""Queue storage: where a queue keeps the messages that are ready for delivery."""

from .interface import QueueStore
from .memory import MemoryQueueStore

__all__ = ["QueueStore", "MemoryQueueStore"]
