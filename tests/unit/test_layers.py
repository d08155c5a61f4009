"""The package's layers import downward only, and no modules import each other in a cycle
(docs/architecture.md, Layers). Imports under `if TYPE_CHECKING:` count for both: a cycle of
types is a cycle of design (a module that must know another that knows it cannot move to
another process or node alone), broken by a Protocol or a plain data type in the lower module.
The management API reads connections and channels as records (warren.broker.records), never
the session's objects: it imports nothing of it."""

import ast
import pathlib

import warren

ROOT = pathlib.Path(warren.__file__).parent
# Lowest first: a module may import from its own layer and from the layers before it.
LAYERS = ["amqp", "store", "broker", "cluster", "session", "server", "mgmt", "cli"]


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield "warren." + ".".join(parts) if parts else "warren", path


def imports(name: str, path: pathlib.Path):
    """What `name` imports of the package: at the top, in functions, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            mod = node.module or ""
            if node.level:
                mod = f"{base}.{mod}" if mod else base
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("warren.") or target == "warren":
                yield target


def layer(name: str):
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_imports_point_downward():
    wrong = []
    for name, path in modules():
        own = layer(name)
        if own is None:
            continue
        for target in imports(name, path):
            other = layer(target)
            if other is not None and other > own:
                wrong.append(f"{name} imports {target}")
    assert not wrong


def import_graph(mods) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at run time or for types)."""
    mods = list(mods)
    known = {name for name, _ in mods}
    return {name: {t for t in imports(name, path) if t in known and t != name} for name, path in mods}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm): each is
    a set of modules that all import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert [sorted(c) for c in cycles(import_graph(modules()))] == []


def _graph_of(tmp_path, sources: dict[str, str]) -> dict[str, set[str]]:
    mods = []
    for label, source in sources.items():
        path = tmp_path / f"{label}.py"
        path.write_text(source)
        mods.append((f"warren.example.{label}", path))
    return import_graph(mods)


def test_the_cycle_check_sees_a_cycle_of_types(tmp_path):
    """A module that imports another only for its types still makes a cycle with it, and so
    does one that imports it in a function (else the check above could pass for nothing)."""
    graph = _graph_of(tmp_path, {
        "first": "from .second import Second\n",
        "second": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .first import First\n",
    })
    assert cycles(graph) == [{"warren.example.first", "warren.example.second"}]
    graph = _graph_of(tmp_path, {
        "first": "from . import third\n",
        "second": "from .first import First\n",
        "third": "def f():\n    from .second import Second\n",
    })
    assert cycles(graph) == [{"warren.example.first", "warren.example.second", "warren.example.third"}]
    graph = _graph_of(tmp_path, {
        "first": "from .second import Second\n",
        "second": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .third import Third\n",
        "third": "",
    })
    assert cycles(graph) == []


def test_the_client_side_stands_alone():
    """warren.spark (and warren.client) talk to a broker as clients: they import nothing of
    the broker's own layers, so they run where only the client extras are installed."""
    wrong = []
    for name, path in modules():
        if name.split(".")[1:2] not in (["spark"], ["client"]):
            continue
        for target in imports(name, path):
            if target.split(".")[1:2] not in (["spark"], ["client"]):
                wrong.append(f"{name} imports {target}")
    assert not wrong


def test_queue_types_stay_below_the_operations():
    """A queue type reaches the node only through its QueueHost port (warren.broker.queues.host):
    nothing under warren/broker/queues imports the operations layer, the vhost, the broker or
    dead-lettering, at run time or for types."""
    above = ("warren.broker.ops", "warren.broker.vhost", "warren.broker.broker", "warren.broker.dead_letter")
    wrong = [f"{name} imports {target}" for name, path in modules() if name.startswith("warren.broker.queues")
             for target in imports(name, path) if target.startswith(above)]
    assert not wrong


def _session_imports(name: str, path: pathlib.Path) -> list[str]:
    """Everything `name` imports of warren.session: import statements anywhere in the module
    (in functions and under TYPE_CHECKING too) and import_module / __import__ calls."""
    found = [t for t in imports(name, path) if t == "warren.session" or t.startswith("warren.session.")]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            target = node.args[0].value
            if called in ("import_module", "__import__") and isinstance(target, str) and (
                    target == "warren.session" or target.startswith("warren.session.")):
                found.append(target)
    return found


def test_mgmt_imports_nothing_of_the_session():
    """What the API, the metrics and the web UI show of a connection or channel comes from its
    records, so a connection may live in another process or node."""
    wrong = [f"{name} imports {target}" for name, path in modules() if name.split(".")[1:2] == ["mgmt"]
             for target in _session_imports(name, path)]
    assert not wrong


def test_the_session_import_check_sees_every_kind_of_import(tmp_path):
    """The check above finds an import however it is written (else it could pass for nothing)."""
    sources = {
        "top": "from warren.session import connection\n",
        "relative": "from ...session.channel import Channel\n",
        "type_only": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ...session.connection import Connection\n",
        "in_function": "def f():\n    import warren.session.records\n",
        "dynamic": "import importlib\ndef f():\n    return importlib.import_module('warren.session.x')\n",
    }
    _sees_each(_session_imports, sources, "from ..broker.records import ConnectionInfo\nfrom ...broker import x509\n",
               tmp_path)


def _sees_each(check, sources: dict[str, str], clean: str, tmp_path) -> None:
    """`check` finds something in each of `sources` (label -> module text), as a module of
    mgmt, and nothing in `clean` (else it could pass for nothing)."""
    for label, source in [*sources.items(), ("clean", clean)]:
        path = tmp_path / f"{label}.py"
        path.write_text(source)
        assert bool(check("warren.mgmt.api.example", path)) is (label != "clean"), label


# The methods that change the vhosts' tables, and the tables the store holds: only the
# metadata store (warren.broker.metadata) calls or writes them, and the vhost its own
# (a command is carried out there). A shovel's restart swaps its worker, not its parameter;
# the config file has default permissions of its own.
_VHOST_CHANGES = {"declare_exchange", "delete_exchange", "declare_queue", "remove_queue", "bind", "unbind"}
_TABLES = {"vhosts", "users", "permissions", "topic_permissions", "global_parameters", "policies",
           "operator_policies", "shovels", "limits"}
_CHANGERS = ("warren.broker.metadata", "warren.broker.vhost")
_ALLOWED = {("warren.broker.shovel", "shovels"), ("warren.cli.config", "permissions")}


def _metadata_changes(name: str, path: pathlib.Path) -> list[str]:
    """Where a module outside the store changes metadata: a vhost's changing method called
    on something named like a vhost, an item of a store table set, deleted, popped or
    cleared, a vhost's limits replaced, or the journal recorded."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            method = node.func.attr
            if method in _VHOST_CHANGES and "vhost" in receiver.lower():
                found.append(f"{name}:{node.lineno} {receiver}.{method}()")
            elif method in ("pop", "clear", "update", "setdefault") and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr in _TABLES and (name, node.func.value.attr) not in _ALLOWED:
                found.append(f"{name}:{node.lineno} {receiver}.{method}()")
            elif method == "record" and receiver.endswith("metadata"):
                found.append(f"{name}:{node.lineno} {receiver}.record()")
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        while any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):  # a, b = ...
            targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        for target in targets:
            table = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(table, ast.Attribute) and table.attr in _TABLES and (name, table.attr) not in _ALLOWED \
                    and not (isinstance(target, ast.Attribute) and ast.unparse(table.value) == "self"):
                # (an object setting its own attribute of that name is not the store's table)
                found.append(f"{name}:{node.lineno} {ast.unparse(target)}")
    return found


def test_only_the_metadata_store_changes_metadata():
    """Every change to vhosts, users, permissions, exchanges, queues, bindings, policies,
    parameters and limits is a command the store applies (docs/architecture.md)."""
    wrong = [hit for name, path in modules() if not name.startswith(_CHANGERS)
             for hit in _metadata_changes(name, path)]
    assert not wrong


def test_the_metadata_check_sees_each_kind_of_change(tmp_path):
    sources = {
        "declare": "def f(vhost):\n    vhost.declare_queue('q')\n",
        "bind": "def f(broker):\n    broker.vhosts['/'].bind(x, q, '', {})\n",
        "table": "def f(broker):\n    broker.permissions[('u', '/')] = None\n",
        "delete": "def f(broker):\n    del broker.users['u']\n",
        "pop": "def f(vhost):\n    vhost.policies.pop('p')\n",
        "limits": "def f(vhost):\n    vhost.limits = {}\n",
        "tuple": "def f(broker, vhost):\n    vhost.policies, x = {}, 1\n",
        "record": "def f(broker):\n    broker.metadata.record('user', 'u')\n",
    }
    _sees_each(_metadata_changes, sources,
               "def f(broker, sock):\n    sock.bind(('', 0))\n    ops.bind(actor, 'x', 'queue', 'q', '', {})\n"
               "    broker.metadata.apply(Bind('/', 'x', 'queue', 'q'))\n    return broker.users.get('u')\n", tmp_path)
