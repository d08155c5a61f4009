"""The API's changes of metadata: carried out at once on a node alone, awaited until this
node has applied them from the cluster's log on a member (warren.broker.metadata.change)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

from ..amqp.constants import INTERNAL_ERROR, NOT_IMPLEMENTED
from ..broker.errors import AMQPError
from ..broker.metadata import change
from .app import ApiError
from ..broker.metadata.commands import Command

T = TypeVar("T")


async def perform(request, operation: Callable[[], change.Change[T]]) -> T:
    store = request.app["broker"].metadata
    if store.log is None:
        return store.run(operation())
    log = store.log
    try:
        return await answer(lambda done: log.submit(operation, done))
    except AMQPError as err:
        if err.code == INTERNAL_ERROR:  # the log's failure (etcd unreachable), not the change's
            raise ApiError(503, "service_unavailable", err.text) from None
        if err.code == NOT_IMPLEMENTED:  # what a cluster does not do yet
            raise ApiError(400, "bad_request", err.text) from None
        raise


async def answer(start: Callable[[change.Done], None]) -> Any:
    """What `start` is answered, later: the cluster's log, or a queue's home node (a stand-in's
    request: warren.cluster.remote_queue)."""
    future: asyncio.Future = asyncio.get_running_loop().create_future()

    def done(result: Any, error: BaseException | None) -> None:
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
    start(done)
    return await future


async def apply(request, command: Command) -> Any:
    """One command the handler has checked; what applying it returned."""
    return await perform(request, lambda: change.command(command))
