"""The structure the code promises: no import circles, a leaf cost model, one device loop and
one host dispatch. Read from the source (imports and calls), so a change that breaks them fails
here, by name."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "quarry"


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    """Every quarry module a file imports, at the top, in functions or under TYPE_CHECKING."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("quarry"):
                target = _resolve(name)
                if target is not None:
                    out.add(target)
    return out


GRAPH = {module: _imports(path) - {module} for module, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    assert _cycles() == []


def test_the_cost_model_is_a_leaf():
    for module, imported in GRAPH.items():
        if module.startswith("quarry.cost"):
            outside = {m for m in imported if m.startswith(("quarry.coordinator", "quarry.device"))}
            assert not outside, f"{module} imports {sorted(outside)}"


# A valid message of every class, for tests and as fuzzing seeds: built, never sent.
EXAMPLES = "quarry.protocol.examples"


def _constructed(name: str, methods_only: bool = False) -> set[str]:
    """Modules that call ``name(...)`` (or only ``something.name(...)``), examples aside."""
    users = set()
    for module, path in MODULES.items():
        if module == EXAMPLES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute):
                    called = func.attr
                elif isinstance(func, ast.Name) and not methods_only:
                    called = func.id
                else:
                    continue
                if called == name:
                    users.add(module)
    return users


def test_the_device_loop_exists_once():
    """Only the loop decides per range, announces push-back and writes the last word."""
    assert _constructed("stage_for") == {"quarry.device.loop"}
    assert _constructed("PushedBack") == {"quarry.device.loop"}
    # A storage server answers its upstream like a drive: it writes its own last word, made of
    # its drives' (it decides nothing per range itself: its drives do, its dispatch completes).
    assert _constructed("WorkDone") == {"quarry.device.loop", "quarry.server.work"}
    assert _constructed("observe") == {"quarry.device.loop"}


def test_the_host_dispatch_exists_once():
    """Only the dispatch opens work exchanges and fetches pushed-back ranges."""
    assert _constructed("SliceRequest") == {"quarry.coordinator.dispatch.dispatch"}
    assert _constructed("work", methods_only=True) == {
        "quarry.coordinator.dispatch.dispatch",
        # DeviceClient.program: one device, nothing pushed back
        "quarry.coordinator.membership.device_client",
    }


def test_every_kind_of_work_is_a_unit():
    from quarry.device.unit import lookup

    for name in ("substrait", "sample", "genes.accumulate", "capacity.count", "capacity.pagerank"):
        assert name == lookup(name).NAME


SETTINGS = "quarry.settings"
BENCH = SRC.parents[1] / "bench"


def _docstrings(tree: ast.AST) -> set[int]:
    """The string nodes that are docstrings: they document a variable, they cannot read one."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _quarry_strings(path: Path) -> list[str]:
    """Where a file names a ``QUARRY_`` variable in a string that is not a docstring."""
    tree = ast.parse(path.read_text())
    skipped = _docstrings(tree)
    return [
        f"{path.relative_to(SRC.parents[1])}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "QUARRY_" in node.value
        and id(node) not in skipped
    ]


def test_every_quarry_variable_is_read_through_the_settings_module():
    """Only quarry.settings names a QUARRY_ variable in code. A read elsewhere
    (``os.environ.get("QUARRY_...")``, ``os.getenv``, ``os.environ[...]``, a constant holding
    the name) needs the name as a string, so none may appear outside docstrings; a message
    names a variable as ``settings.X.name``, so renaming one is a change in one place. The
    benchmarks are held to the same."""
    files = [p for m, p in MODULES.items() if m != SETTINGS] + sorted(BENCH.glob("*.py"))
    offences = [found for path in files for found in _quarry_strings(path)]
    assert offences == []
    assert _quarry_strings(MODULES[SETTINGS]), "the settings module names the variables"


def _string_constants(words: set[str]) -> dict[str, set[str]]:
    """Per module, which of ``words`` it holds as a string constant (docstrings aside)."""
    found: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in words
                and id(node) not in docstrings
            ):
                found.setdefault(module, set()).add(node.value)
    return found


PUSHDOWN_MODULE = "quarry.pushdown"
# The words of the pushdown modes where they name something else, and what.
MODE_WORDS_ELSEWHERE = {
    # the role a storage server answers hello with (``SERVER_ROLE``), declared once there
    "quarry.protocol.control": {"server"},
    # a key of a storage server's own ``WorkDone.summary``: the server's name
    "quarry.server.work": {"server"},
    # a slice encoding, chosen by density (``Encoding``: auto, dense, sparse), and passed on
    "quarry.genes.layout": {"auto"},
    "quarry.genes.rank": {"auto"},
    # offload's own choices: where a program's lines run (``OFFLOADS``: auto, host, device) and
    # whether they move to the host mid-way (``MIGRATES``: auto, never, force)
    "quarry.offload.run": {"auto", "never"},
    "quarry.offload.cut": {"auto", "never"},
    "quarry.offload.cli": {"auto"},
    # matplotlib's aspect of a heat map
    "quarry.capacity.figures": {"auto"},
}


def test_the_pushdown_modes_are_declared_once():
    """``Pushdown`` is the one declaration of the modes: no other tuple, set or Literal of
    their words, and no comparison with one, anywhere else in quarry."""
    from quarry.pushdown import Pushdown

    declared = {
        module
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Pushdown"
    }
    assert declared == {PUSHDOWN_MODULE}
    found = _string_constants({mode.value for mode in Pushdown})
    assert found.pop(PUSHDOWN_MODULE) == {mode.value for mode in Pushdown}
    stray = {
        module: words - MODE_WORDS_ELSEWHERE.get(module, set()) for module, words in found.items()
    }
    stray = {module: words for module, words in stray.items() if words}
    assert stray == {}, f"a pushdown mode named by its string: use quarry.pushdown.Pushdown {stray}"


# Where the work counters are declared (``protocol.counters``, in the protocol that carries
# them) and summed for EXPLAIN ANALYZE's rows: their names may be strings there.
COUNTER_ROOMS = ("quarry.protocol", "quarry.coordinator.dispatch.report")
# Keys of records users read that share a counter's name, each a sum of that counter taken by
# attribute: what a change of the counters must not rename.
COUNTER_WORDS_ELSEWHERE = {
    # ``attrs["quarry"]`` of a ranking, printed by ``quarry de`` (docs/genes.md)
    "quarry.genes.cli": {
        "bytes_shipped",
        "bytes_read",
        "slices_executed",
        "slices_pushed_back",
        "slices_cached",
    },
    # ``uns["quarry"]`` of a pseudobulk AnnData
    "quarry.genes.pseudobulk": {"bytes_shipped", "bytes_read"},
    # ``QuarryDatasource.moved()``: what a Ray dataset's read tasks brought over
    "quarry.ray.datasource": {
        "bytes_shipped",
        "bytes_read",
        "slices_executed",
        "slices_pushed_back",
    },
    # a capacity run's columns per device (``KernelRun.per_device``, docs/capacity.md)
    "quarry.capacity.measure": {"bytes_shipped", "bytes_read"},
}


def test_the_work_counters_are_named_in_one_room():
    """No list of the work counters' names outside their declaration: every other reader takes
    them from ``WorkCounters`` (its fields, ``COUNTERS``), so adding one is one line there."""
    from quarry.protocol.counters import COUNTERS

    found = _string_constants(set(COUNTERS))
    stray = {
        module: words - COUNTER_WORDS_ELSEWHERE.get(module, set())
        for module, words in found.items()
        if not module.startswith(COUNTER_ROOMS)
    }
    stray = {module: words for module, words in stray.items() if words}
    assert stray == {}, f"a work counter named by its string: use WorkCounters {stray}"


# What a user holds is typed (STYLE §8): a record with ``to_json()``, never a loose dict read by
# string key. The handle a user gets is ``Cluster``; its bases are ``Membership`` and the
# ``LocalCluster`` of ``quarry.local(...)`` extends it.
USER_HANDLES = {
    "quarry.coordinator.cluster": "Cluster",
    "quarry.coordinator.membership.membership": "Membership",
    "quarry.coordinator.processes.local": "LocalCluster",
}


def _loose(annotation: str) -> bool:
    """A dict with ``Any`` values, or a list of dicts: a contract nobody can find."""
    compact = annotation.replace(" ", "")
    return "dict[str,Any]" in compact or "list[dict[" in compact or "Mapping[str,Any]" in compact


def test_a_user_handle_returns_typed_records():
    found = []
    for module, name in USER_HANDLES.items():
        tree = ast.parse(MODULES[module].read_text())
        (handle,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        methods = [n for n in handle.body if isinstance(n, ast.FunctionDef)]
        assert methods, f"{name} has no methods"
        for method in methods:
            if method.name.startswith("_"):
                continue
            assert method.returns is not None, f"{name}.{method.name} says nothing it returns"
            annotation = ast.unparse(method.returns)
            if _loose(annotation):
                found.append(f"{name}.{method.name} -> {annotation}")
    assert not found, "return typed records (a frozen dataclass with to_json()): " + ", ".join(
        found
    )
