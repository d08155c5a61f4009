"""An operation that changes metadata, written as a generator: it checks what it must against
the metadata as it is, yields the command it needs applied, gets back what applying it
returned (or the error, thrown in), and returns its result.

The shape lets the same operation run on a node alone and on a member of a cluster. Alone,
`run` applies each command at once. A cluster member (warren.cluster.metadata_log) sends
the command to the cluster's log guarded by the revision its checks saw, and resumes the
generator once the node has applied it from the log; if another command got into the log
first, the checks saw an older state: the operation starts again from its factory."""

from __future__ import annotations

from typing import Any, Callable, Generator, Generic, ParamSpec, Protocol, TypeVar

from .commands import Command

T = TypeVar("T")
P = ParamSpec("P")
Change = Generator[Command, Any, T]


class Applier(Protocol):
    """What carries a command out (warren.broker.metadata.store.MetadataStore)."""

    def apply(self, command: Command) -> Any: ...


def run(store: Applier, change: Change[T]) -> T:
    """Carry the operation out here and now."""
    try:
        command = next(change)
        while True:
            try:
                result = store.apply(command)
            except Exception as err:  # the operation's to handle (or not)
                command = change.throw(err)
            else:
                command = change.send(result)
    except StopIteration as stop:
        return stop.value


class Operation(Generic[P, T]):
    """An operation that changes metadata (of warren.broker.ops, parameters, limits...):
    called, it is carried out at once on the node its first argument names (an actor, or the
    node itself); `change(...)` is the operation as a generator, for a caller that can wait
    for a cluster's log (a channel, the HTTP API)."""

    def __init__(self, change: Callable[P, Change[T]]):
        self.change = change
        self.__doc__ = change.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        first: Any = args[0]
        node = first.broker if hasattr(first, "broker") else first
        return node.metadata.run(self.change(*args, **kwargs))


def command(c: Command) -> Change[Any]:
    """The operation that applies one command (the API's, already checked) and returns what
    applying it returned."""
    return (yield c)


Done = Callable[[Any, "BaseException | None"], None]


class ClusterLog(Protocol):
    """Where a cluster member's changes go (warren.cluster.metadata_log): `submit` runs the
    operation `factory` makes against the metadata as it is, sends its command to the log,
    and calls done(result, None) once this node has applied it, or done(None, error) when the
    operation or the command failed or the log could not be written."""

    def submit(self, factory: Callable[[], Change[Any]], done: Done) -> None: ...

    def when_applied(self, revision: int, then: Callable[[], None]) -> None:
        """Call `then()` once this node has applied the log up to `revision` (a change another
        node made for this one: its answer waits until this node shows it too)."""


def done(value: T) -> Change[T]:
    """An operation that changes nothing and returns `value` (a passive declare)."""
    return value
    yield  # (a generator)
