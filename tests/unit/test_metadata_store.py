"""The metadata store (warren.broker.metadata): every command has a handler, commands are
plain data, the journal is what replaying the commands gives, and an export installed
elsewhere by commands gives the same tables."""

import dataclasses
import typing

import pytest

from warren.broker import definitions
from warren.broker.auth import User
from warren.broker.broker import Broker
from warren.broker.metadata import commands as c
from warren.broker.metadata.store import _HANDLERS
from warren.broker.policy import Policy
from warren.store.definitions import DefinitionsFile


def test_every_command_has_a_handler_and_is_frozen_data():
    kinds = typing.get_args(c.Command)
    assert set(kinds) == set(_HANDLERS)
    for kind in kinds:
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, kind  # type: ignore[attr-defined]
    cmd = c.DeleteQueue("/", "q")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.name = "other"  # type: ignore[misc]


def _commands() -> list:
    """A bit of everything a user can define, in an order that makes sense."""
    return [
        c.PutVHost("v", description="a vhost", tags=["t1"]),
        c.PutUser(User.with_password("bob", "pw", ["management"])),
        c.SetUserLimits("bob", {"max-connections": 3}),
        c.SetPermissions("bob", "v", "^bob", ".*", ".*"),
        c.SetTopicPermissions("bob", "v", "amq.topic", "^a", "^b"),
        c.DeclareExchange("v", "x", "topic"),
        c.DeclareExchange("v", "x2", "fanout", arguments={"alternate-exchange": "x"}),
        c.DeclareQueue("v", "q", durable=True, arguments={"x-max-length": 10}),
        c.DeclareQueue("v", "s", durable=True, arguments={"x-max-priority": 5}),
        c.Bind("v", "x", "queue", "q", "a.#"),
        c.Bind("v", "x", "exchange", "x2", "b.*"),
        c.SetPolicy(Policy.validated("v", "p", "^q$", {"max-length": 5}, 1, "queues")),
        c.SetPolicy(Policy.validated("v", "op", "^q", {"max-length": 9}, 0, "queues", True), operator=True),
        c.SetVHostLimits("v", {"max-queues": 50}),
        c.SetGlobalParameter("some", {"any": ["json"]}),
        c.SetGlobalParameter(c.CLUSTER_NAME, "named"),
    ]


def _tables(broker: Broker) -> dict:
    exported = definitions.export(broker)
    exported.pop("warren_version")
    return exported


def test_the_journal_replays_to_the_same_tables(tmp_path):
    """Each command's effect is journaled; a node that installs the snapshot and journal has
    the same tables as the one that applied the commands."""
    broker = Broker.with_defaults()
    broker.metadata.disk = DefinitionsFile.in_dir(str(tmp_path))
    broker.metadata.flush()  # the defaults: a snapshot
    apply = broker.metadata.apply
    for cmd in _commands():
        apply(cmd)
        broker.metadata.flush()  # one journal record per changed object
    apply(c.Unbind("v", "x", "exchange", "x2", "b.*"))
    apply(c.ClearTopicPermissions("bob", "v"))
    apply(c.ClearPolicy("v", "op", operator=True))
    apply(c.ClearGlobalParameter("some"))
    apply(c.DeleteQueue("v", "s"))
    broker.metadata.flush()
    assert broker.metadata.disk.path and (tmp_path / "definitions.journal").stat().st_size > 0
    assert broker.cluster_name == "named"

    fresh = Broker()
    fresh.metadata.disk = DefinitionsFile.in_dir(str(tmp_path))
    saved = fresh.metadata.disk.load()
    assert saved is not None
    definitions.load(fresh, saved)
    fresh.metadata.recovered(complete=True)
    assert not fresh.metadata.dirty
    assert _tables(fresh) == _tables(broker)
    assert fresh.cluster_name == "named"
    assert "s" not in fresh.vhosts["v"].queues and fresh.vhosts["v"].policies["p"].definition == {"max-length": 5}


def test_results_are_the_commands_own():
    broker = Broker.with_defaults()
    apply = broker.metadata.apply
    assert apply(c.PutVHost("v")) is True
    assert apply(c.PutVHost("v", description="again")) is False
    assert broker.vhosts["v"].description == "again"
    assert apply(c.PutVHost("v")).__class__ is bool and broker.vhosts["v"].description == "again"  # KEEP
    q, created = apply(c.DeclareQueue("v", "q"))
    assert created and apply(c.DeclareQueue("v", "q")) == (q, False)
    assert apply(c.DeleteQueue("v", "q")) == 0 and q.deleted
    assert apply(c.DeleteQueue("v", "q")) == 0  # a missing queue: no change
    assert apply(c.SetGlobalParameter("g", 1)) is True and apply(c.SetGlobalParameter("g", 2)) is False
    assert apply(c.ClearGlobalParameter("g")) is True and apply(c.ClearGlobalParameter("g")) is False
    assert broker.cluster_name == broker.config.node_name
    assert apply(c.DeleteVHost("v")) is not None and "v" not in broker.vhosts
    assert apply(c.DeleteVHost("v")) is None


def test_deleting_a_vhost_deletes_its_queues_and_permissions():
    broker = Broker.with_defaults()
    apply = broker.metadata.apply
    apply(c.PutVHost("v"))
    apply(c.SetPermissions("guest", "v", ".*", ".*", ".*"))
    apply(c.SetTopicPermissions("guest", "v", "amq.topic", ".*", ".*"))
    q, _ = apply(c.DeclareQueue("v", "q", durable=True))
    before = broker.stats.node_counters["queues_deleted"]
    apply(c.DeleteVHost("v"))
    assert q.deleted and broker.stats.node_counters["queues_deleted"] == before + 1
    assert ("guest", "v") not in broker.permissions and not broker.topic_permissions
