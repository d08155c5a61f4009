"""Queue types, one module each (x-queue-type); queue_factory picks one for a declare."""

from .classic import ClassicQueue

__all__ = ["ClassicQueue"]
