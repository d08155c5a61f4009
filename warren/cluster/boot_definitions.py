"""A definitions file a cluster member is started with (--definitions): imported through the
cluster's log as an import through the API is (warren.broker.definitions.ClusterImport), before
the node serves. As RabbitMQ's load_definitions, every member started with the file imports it
(what exists already is kept: a classic queue lives on the first member that imported it); a
file that cannot be imported stops the node, as on a node alone."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Any, Callable

from ..broker.definitions import ClusterImport, DefinitionsError
from ..broker.errors import AMQPError
from ..broker.metadata.change import Change, ClusterLog

if TYPE_CHECKING:
    from ..broker.node import Node

log = logging.getLogger("warren.definitions")


class BootDefinitions:
    """One of a member's services, started after its metadata log."""

    def __init__(self, broker: Node, path: str, data: Any):
        self.broker = broker
        self.path = path
        self.data = data

    async def start(self, server=None) -> None:
        cluster_log = self.broker.metadata.log
        assert cluster_log is not None, "a cluster member's metadata log starts before its definitions file"
        try:
            importer = ClusterImport(self.broker, self.data)
            for step in importer.steps():
                await _carried_out(cluster_log, step)
        except (DefinitionsError, AMQPError) as err:
            text = err.text if isinstance(err, AMQPError) else str(err)
            print(f"warren: cannot load definitions {self.path}: {text}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        log.info("imported definitions from %s through the cluster's log: %s", self.path,
                 ", ".join(f"{count} {kind}" for kind, count in importer.counts.items() if count) or "nothing")

    async def stop(self) -> None:
        pass


async def _carried_out(cluster_log: ClusterLog, operation: Callable[[], Change[Any]]) -> Any:
    answer: asyncio.Future = asyncio.get_running_loop().create_future()

    def done(result: Any, error: BaseException | None) -> None:
        if not answer.done():
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result)
    cluster_log.submit(operation, done)
    return await answer
