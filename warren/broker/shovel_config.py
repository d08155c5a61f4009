"""A dynamic shovel's definition as validated (rabbit_shovel_parameters:parse): plain data,
below the metadata commands (a SetShovel carries it) and the shovel that runs it
(warren.broker.shovel, which validates it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_PREFETCH = 1000        # rabbit_shovel.hrl ?DEFAULT_PREFETCH
DEFAULT_RECONNECT_DELAY = 5    # ?DEFAULT_RECONNECT_DELAY (seconds)


@dataclass
class Config:
    """A validated shovel definition (rabbit_shovel_parameters:parse)."""

    src_uris: tuple[str, ...]   # one picked at random at each (re)connect
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: dict = field(default_factory=dict)
    src_consumer_args: dict = field(default_factory=dict)
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: dict = field(default_factory=dict)
    ack_mode: str = "on-confirm"
    delete_after: Any = "never"  # "never", "queue-length" or an int >= 0
    prefetch: int = DEFAULT_PREFETCH
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict = field(default_factory=dict)
    reconnect_delay: Any = DEFAULT_RECONNECT_DELAY

    @property
    def src_uri(self) -> str:
        return self.src_uris[0]

    @property
    def dest_uri(self) -> str:
        return self.dest_uris[0]
