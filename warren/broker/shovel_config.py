"""A shovel's definition as validated: plain data, below the metadata commands (a SetShovel
carries it) and the shovel that runs it. A dynamic shovel's comes from its runtime parameter
(rabbit_shovel_parameters:parse, in warren.broker.shovel), a static one's from the config
file (rabbit_shovel_config:parse, in warren.cli.static_shovels)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..amqp.spec import Method

DEFAULT_PREFETCH = 1000        # rabbit_shovel.hrl ?DEFAULT_PREFETCH
DEFAULT_RECONNECT_DELAY = 5    # ?DEFAULT_RECONNECT_DELAY (seconds)


@dataclass
class Config:
    """A validated shovel definition."""

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
    # A static shovel (the config file's): its ends are set up by its declarations alone, AMQP
    # methods run in order on each end before it consumes or publishes (rabbit_amqp091_shovel's
    # declarations; warren.broker.shovel_declarations), and src_queue "" is the last queue
    # they declared. A dynamic shovel has none and declares src-queue / dest-queue if missing.
    static: bool = False
    src_declarations: tuple[Method, ...] = ()
    dest_declarations: tuple[Method, ...] = ()

    @property
    def src_uri(self) -> str:
        return self.src_uris[0]

    @property
    def dest_uri(self) -> str:
        return self.dest_uris[0]
